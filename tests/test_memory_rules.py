"""Rule-based memory extraction and write triggers (hermes/memory/rules.py; issue 6).

Pure functions: no Temporal, no store. Each case names the message, the subject (and kind)
it must give, and a fragment of the value that must survive verbatim.
"""

from __future__ import annotations

import ast
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hermes.memory import rules
from hermes.memory.rules import MAX_SCAN_CHARS, RuleCandidate, Triggers, detect_triggers, extract_by_rules


def _by_subject(text: str) -> dict[str, RuleCandidate]:
    return {c.subject: c for c in extract_by_rules(text)}


# (message, kind, subject, fragment the candidate text must contain)
STATEMENTS = [
    # names
    ("My name is Wang Wei.", "fact", "name", "Wang Wei"),
    ("I'm called Anna Müller and I live in Bern.", "fact", "name", "Anna Müller"),
    ("Call me Bob, please.", "fact", "name", "Bob"),
    ("Hi, I'm Anna.", "fact", "name", "Anna"),
    ("我叫小王。", "fact", "name", "小王"),
    ("我的名字是王伟，我住在北京。", "fact", "name", "王伟"),
    ("ＭＹ ＮＡＭＥ ＩＳ　Ｌｉｎ．", "fact", "name", "Lin"),  # full-width letters and space
    ("my   name    is\tKarl ,thanks", "fact", "name", "Karl"),
    # e-mail
    ("My email is wang.wei+test@example.co.uk.", "fact", "email", "wang.wei+test@example.co.uk"),
    ("我的邮箱是 wang@example.com 谢谢", "fact", "email", "wang@example.com"),
    ("mail me at o'neil_j@mail-server.example.org, thanks", "fact", "email", "o'neil_j@mail-server.example.org"),
    # phones
    ("My phone is +41 79 123 45 67.", "fact", "phone", "+41 79 123 45 67"),
    ("我的手机是138-1234-5678", "fact", "phone", "138-1234-5678"),
    ("我的手机号13812345678", "fact", "phone", "13812345678"),
    ("You can reach me at (415) 555-0100.", "fact", "phone", "(415) 555-0100"),
    ("Tel 079 123 45 67", "fact", "phone", "079 123 45 67"),
    # dates
    ("My birthday is March 3.", "fact", "birthday", "March 3"),
    ("I was born on 1990-03-03.", "fact", "birthday", "1990-03-03"),
    ("我的生日是3月3日", "fact", "birthday", "3月3日"),
    ("The deadline is 2026-12-15.", "fact", "", "2026-12-15"),
    ("项目的截止日期是2026年12月15日。", "fact", "", "2026年12月15日"),
    # job, employer
    ("I am an architect.", "fact", "job_title", "an architect"),
    ("I'm a software engineer at Google.", "fact", "job_title", "software engineer"),
    ("I'm a software engineer at Google.", "fact", "employer", "Google"),
    ("I work for the Red Cross.", "fact", "employer", "the Red Cross"),
    ("我在腾讯工作", "fact", "employer", "腾讯"),
    ("我是一名医生", "fact", "job_title", "医生"),
    ("我是程序员，在字节跳动上班", "fact", "job_title", "程序员"),
    ("我是小王", "fact", "name", "小王"),
    # home
    ("I live in New York City with my wife.", "fact", "home_city", "New York City"),
    ("I moved to Zurich last month.", "fact", "home_city", "Zurich"),
    ("I used to live in Bern but now I live in Zurich.", "fact", "home_city", "Zurich"),
    ("我住在北京", "fact", "home_city", "北京"),
    ("我搬到苏黎世了", "fact", "home_city", "苏黎世"),
    ("不对，我住在苏黎世。", "fact", "home_city", "苏黎世"),
    # preferences
    ("I prefer tea over coffee.", "preference", "", "tea over coffee"),
    ("I like jazz and rock.", "preference", "", "jazz and rock"),
    ("I don't like cilantro.", "preference", "", "not like cilantro"),
    ("I always take the train to work.", "preference", "", "always takes the train"),
    ("我喜欢爵士乐", "preference", "", "爵士乐"),
    ("我更喜欢安静的地方", "preference", "", "安静的地方"),
    ("My favourite colour is blue.", "preference", "favorite_color", "blue"),
    ("我最喜欢的颜色是蓝色", "preference", "favorite_color", "蓝色"),
    ("Please answer in Chinese.", "preference", "preferred_language", "Chinese"),
    ("以后请用中文回答", "preference", "preferred_language", "中文"),
    ("请回答得详细一些", "preference", "answer_style", "详细"),
    # explicit remember
    ("Remember that my wife's name is Lisa.", "fact", "", "The user's wife's name is Lisa"),
    ("记住我的车牌号是京A12345", "fact", "", "用户的车牌号是京A12345"),
    ("Remember that I live in Geneva.", "fact", "home_city", "Geneva"),
    ("please remember: my dog is called Rex", "fact", "", "The user's dog is called Rex"),
    ("记一下：明天下午三点开会", "fact", "", "明天下午三点开会"),
]


@pytest.mark.parametrize(("message", "kind", "subject", "fragment"), STATEMENTS)
def test_a_stated_fact_or_preference_gives_a_candidate_with_its_subject_and_value(message, kind, subject, fragment):
    found = [c for c in extract_by_rules(message) if c.subject == subject and c.kind == kind]
    assert found, extract_by_rules(message)
    assert any(fragment in c.text for c in found), found
    for c in found:
        assert 0.9 <= c.confidence <= 0.99
        assert 0.0 <= c.importance <= 1.0
        assert len(c.text) <= 200


SAME_PREFERENCE = [
    "Please keep your answers short.",
    "I prefer short answers.",
    "Keep it brief, please.",
    "I like concise replies.",
    "回答简短一点",
    "请简洁回答",
    "Be concise.",
    "Don't give me long answers.",
    "我喜欢简短的回答",
    "Your answers are too long.",
]


@pytest.mark.parametrize("message", SAME_PREFERENCE)
def test_eight_ways_of_asking_for_short_answers_give_one_answer_style_preference(message):
    candidates = extract_by_rules(message)
    assert [(c.kind, c.subject) for c in candidates] == [("preference", "answer_style")]
    assert detect_triggers(message).preference


def test_the_same_short_answer_wish_gives_one_text_per_language():
    texts = {c.text for m in SAME_PREFERENCE for c in extract_by_rules(m)}
    assert len(texts) == 2  # one English, one Chinese statement: the store's dedupe sees equals


@pytest.mark.parametrize("message", [
    "what is my name?",
    "我叫什么?",
    "我叫什么",
    "do I live in Bern?",
    "Where do I work?",
    "我住在哪里？",
    "is my email wang@example.com?",
    "do you remember my name",
    "hi",
    "thanks!",
    "今天天气不错",
    "哈哈",
    "ok",
    "Good morning! Nice weather today.",
    "",
    "   ",
])
def test_questions_and_small_talk_give_no_candidate(message):
    assert extract_by_rules(message) == []


@pytest.mark.parametrize("message", ["hi", "thanks!", "今天天气不错", "哈哈", "ok", "Good morning! Nice weather today.",
                                     "谢谢你！", "👍"])
def test_small_talk_is_flagged_and_needs_no_model(message):
    t = detect_triggers(message)
    assert t.small_talk and not t.needs_model()


@pytest.mark.parametrize(("message", "subject"), [
    ("I don't live in Bern anymore.", "home_city"),
    ("I no longer work at Google.", "employer"),
    ("I used to live in Bern.", "home_city"),
    ("我不住在北京了", "home_city"),
    ("我已经不住在伯尔尼了", "home_city"),
    ("我以前住在伯尔尼", "home_city"),
    ("my name is not Bob", "name"),
    ("I'm not a doctor.", "job_title"),
    ("I might move to Zurich next year.", "home_city"),
    ("If I lived in Bern I would walk to work.", "home_city"),
    ("It's not true that I live in Bern.", "home_city"),
    ("If I live in Bern next year, I'll buy a bike.", "home_city"),
    ("I live in Bern no more.", "home_city"),
    ("如果我住在北京就好了", "home_city"),
    ("假如我在谷歌工作，我会很开心", "employer"),
    ("Not that I work at Google.", "employer"),
])
def test_negated_past_or_hypothetical_statements_give_no_candidate_for_the_subject(message, subject):
    assert subject not in _by_subject(message)


@pytest.mark.parametrize(("message", "subject"), [
    ("我是说我们应该早点走", None),
    ("我是不是应该早点走", None),
    ("我是在问你", None),
    ("我叫了外卖", None),
    ("call me later", None),
    ("Call me back tomorrow.", None),
    ("I'm a bit tired.", None),
    ("I'd like a coffee.", None),
    ("I love it!", None),
    ("I hate you.", None),
    ("My wife's email is lisa@example.com", None),
    ("我的朋友住在上海", None),
])
def test_look_alike_phrases_give_no_candidate(message, subject):
    assert extract_by_rules(message) == []


def test_lives_in_bern_then_moved_to_zurich_share_the_home_city_subject():
    bern = _by_subject("I live in Bern.")["home_city"]
    zurich = _by_subject("I moved to Zurich.")["home_city"]
    assert "Bern" in bern.text and "Zurich" in zurich.text
    assert bern.text != zurich.text
    zh_bern = _by_subject("我住在伯尔尼")["home_city"]
    zh_zurich = _by_subject("我搬到苏黎世了")["home_city"]
    assert "伯尔尼" in zh_bern.text and "苏黎世" in zh_zurich.text


def test_the_last_value_of_a_subject_in_one_message_wins():
    found = [c for c in extract_by_rules("I lived in Bern for years. Now I live in Zurich.") if c.subject == "home_city"]
    assert [c.text for c in found] == ["The user lives in Zurich."]


@pytest.mark.parametrize("message", [
    "My order number is 13812345678.",
    "The price is 1,234,567 dollars and it happened in 2024.",
    "The meeting is at 3pm on 2024-05-06, order #12345678901.",
    "Call 911 or 110.",
    "My credit card is 4111 1111 1111 1111.",
    "It costs $1,299.99 and ships in 2025.",
    "ID: 2024-01-15",
    "订单号13812345678已发货",
    "I was born in 1987 and paid 12345678 yen.",
    "version 3.11.7, build 20240115123",
])
def test_order_numbers_years_prices_and_dates_are_not_phone_numbers(message):
    assert "phone" not in _by_subject(message)


def test_a_temporary_location_expires():
    tokyo = _by_subject("This week I'm in Tokyo.")["current_location"]
    assert "Tokyo" in tokyo.text and tokyo.valid_until_days == 7
    zh = _by_subject("我这周在东京出差")["current_location"]
    assert "东京" in zh.text and zh.valid_until_days == 7
    assert _by_subject("I live in Tokyo.")["home_city"].valid_until_days is None


@pytest.mark.parametrize(("message", "flags"), [
    ("Remember that I'm allergic to nuts.", {"explicit", "fact"}),
    ("记住，我对花生过敏", {"explicit", "fact"}),
    ("Don't forget that my flight is on Friday.", {"explicit", "fact"}),
    ("I prefer dark mode.", {"preference"}),
    ("我不喜欢香菜", {"preference"}),
    ("Actually, it's Zurich now.", {"correction"}),
    ("不对，是周五", {"correction"}),
    ("I moved to Zurich.", {"correction", "fact"}),
    ("我搬到苏黎世了", {"correction", "fact"}),
    ("I work at Acme.", {"fact"}),
    ("我在腾讯工作", {"fact"}),
    ("forget me", {"forget_me"}),
    ("Please forget everything you know about me.", {"forget_me"}),
    ("delete all my data", {"forget_me"}),
    ("忘记我", {"forget_me"}),
    ("忘掉关于我的一切", {"forget_me"}),
    ("删除我的所有记忆", {"forget_me"}),
    ("don't forget me", set()),
    ("我忘了我的密码", set()),
    ("what is my name?", set()),
    ("hi", {"small_talk"}),
])
def test_triggers_fire_exactly_for_what_the_message_says(message, flags):
    t = detect_triggers(message)
    fired = {name for name, on in t.model_dump().items() if on}
    assert fired == flags


def test_a_forget_me_request_gives_no_candidate_and_no_model_call():
    message = "My name is Bob. Forget everything about me."
    assert detect_triggers(message).forget_me
    assert not detect_triggers(message).needs_model()
    assert all(c.subject != "email" for c in extract_by_rules(message))


def test_needs_model_follows_the_four_content_triggers():
    assert not Triggers(small_talk=True, forget_me=True).needs_model()
    for name in ("explicit", "preference", "correction", "fact"):
        assert Triggers(**{name: True}).needs_model()


def test_only_the_first_scanned_characters_are_read():
    assert extract_by_rules("x" * MAX_SCAN_CHARS + " My name is Bob.") == []
    assert _by_subject("My name is Bob. " + "x" * 100_000)["name"].text == "The user's name is Bob."


def test_control_characters_and_bidi_marks_do_not_hide_a_statement():
    message = "\u202eMy\u200b name\x00 is \u200fBob\x1b."
    assert _by_subject(message)["name"].text == "The user's name is Bob."


def test_extraction_is_deterministic():
    message = "I'm a nurse at St. Mary's. 我住在上海，我喜欢猫。Remember that my cat is called Mimi."
    first = extract_by_rules(message)
    assert first and all(extract_by_rules(message) == first for _ in range(3))


def test_the_module_imports_only_the_standard_library_and_pydantic():
    tree = ast.parse(Path(rules.__file__).read_text(encoding="utf-8"))
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            imported.add((node.module or "").split(".")[0])
    assert imported <= {"__future__", "functools", "re", "unicodedata", "typing", "pydantic"}


def test_ascii_text_is_normalized_as_the_general_way_would():
    import random
    import unicodedata

    def general(text: str) -> str:  # the way every text took before ASCII had its own
        text = unicodedata.normalize("NFKC", text[: rules.MAX_SCAN_CHARS * 2])[: rules.MAX_SCAN_CHARS]
        kept = []
        for ch in text.translate(rules._APOSTROPHES):
            cat = unicodedata.category(ch)
            if ch in "\n\t":
                kept.append("\n" if ch == "\n" else " ")
            elif cat == "Cc":
                kept.append(" ")
            elif cat not in rules._DROP_CATEGORIES:
                kept.append(ch)
        return rules._SPACES.sub(" ", "".join(kept)).strip()

    pick = random.Random(31)
    ascii_chars = [chr(i) for i in range(128)]
    n = rules.MAX_SCAN_CHARS
    texts = ["  hi\tthere \r\n\x0bx\x7f ", "I'm fine.", "\n\n", " \x00 ", "a" * (n + 7), " " * (n + 1000) + "x",
             "\x00" * n + "x", "a " * n, "b" * (n - 1) + " c" + "é" * 10, "é" + "a " * n]
    texts += ["".join(pick.choice(ascii_chars) for _ in range(pick.choice((1, 12, 80, 400)))) for _ in range(1500)]
    for text in texts:
        assert rules._normalize(text) == general(text), repr(text[:60])
    assert rules._normalize("Ｉ’m here\u200b") == general("Ｉ’m here\u200b") == "I'm here"


def test_candidates_kept_for_a_text_read_again_are_new_each_time():
    text = "I prefer dark mode and my name is Ana, I work at Acme as a data engineer."
    first = extract_by_rules(text)
    assert first and detect_triggers(text).preference
    first[0].text, first[0].subject = "changed by a caller", "x"
    again = extract_by_rules(text)
    assert again == extract_by_rules(text) and again[0].text != "changed by a caller" and again[0].subject != "x"
    assert again[0] is not first[0]


HOSTILE = [
    "a" * 100_000, "@" * 100_000, "a@" * 50_000, "1" * 100_000, "1 " * 50_000, "+1 " * 30_000,
    "my name is " * 10_000, "I live in " * 10_000, "我是" * 50_000, "记住" * 50_000, "(" * 100_000,
    "a.a" * 30_000 + "@", "x" * 3_000 + "@" + "b." * 500, "\u202e\u200f" * 30_000 + "my name is Bob",
    "😀" * 50_000, "I " + "really " * 10_000 + "like jazz", "\x00\x01\x1b" * 30_000, "not " * 20_000 + "but",
    "!" * 100_000, "1-" * 50_000, "我在" * 30_000 + "工作", "forget " * 20_000, "\ud800abc", "ﷺ" * 100_000,
]


@pytest.mark.parametrize("message", HOSTILE, ids=range(len(HOSTILE)))
def test_hostile_input_returns_quickly_without_raising(message):
    # CPU time of this thread, not wall time: a loaded machine (the suite runs in two
    # processes, often beside a CPU hog) stretches the wall clock, not the work.
    started = time.thread_time()
    assert isinstance(extract_by_rules(message), list)
    assert isinstance(detect_triggers(message), Triggers)
    assert time.thread_time() - started < 2.0  # loose: every pattern is linear on 4,000 characters


_ALPHABET = st.sampled_from(list("aeimnorstIM @.+-()0123456789,.!?'\"\n\t我是叫住在喜欢记忆忘不了的，。？！")
                            + ["my name is ", "I live in ", "remember ", "记住", "\u202e", "\x00", "😀", "+41 "])


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(st.text(max_size=4_000), st.lists(_ALPHABET, max_size=1_200).map("".join)))
def test_random_text_never_raises_and_finishes_in_time(message):
    started = time.thread_time()  # CPU time, as above
    candidates = extract_by_rules(message)
    triggers = detect_triggers(message)
    assert time.thread_time() - started < 1.0 + 1.0  # 1 s per call for 4 KB, two calls
    assert isinstance(triggers, Triggers)
    for c in candidates:
        assert c.text and len(c.text) <= 200
        assert 0.9 <= c.confidence <= 0.99


# ---------------------------------------------------------- everyday facts (issue 30)

# (message, subject or "", value held by the candidate's value, or text held by its text)
EVERYDAY = [
    ("我二月底从利兹搬到爱丁堡了", "home_city", "爱丁堡"),
    ("我上个月搬到了杭州。", "home_city", "杭州"),
    ("I've moved back to Bern.", "home_city", "Bern"),
    ("By the way, we moved to Lisbon in the spring.", "home_city", "Lisbon"),
    ("我叫小戴，住在苏州，在一家银行上班。", "home_city", "苏州"),
    ("我叫小戴，住在苏州，在一家银行上班。", "employer", "一家银行"),
    ("I started a new job at Shopify last week.", "employer", "Shopify"),
    ("I've been working for Deloitte since 2021.", "employer", "Deloitte"),
    ("我去年入职了字节跳动。", "employer", "字节跳动"),
    ("I'm Tom, I live in Oslo.", "name", "Tom"),
    ("I've stopped drinking coffee.", "", "The user has stopped drinking coffee."),
    ("I quit my job at Google.", "", "The user quit their job at Google."),
    ("I don't drink alcohol anymore.", "", "The user no longer drinks alcohol."),
    ("我不再喝咖啡了。", "", "用户不再喝咖啡。"),
    ("我已经戒烟了。", "", "用户已经戒烟。"),
    ("I'm really into bouldering these days.", "", "The user is into bouldering."),
    ("I'm allergic to peanuts.", "", "The user is allergic to peanuts."),
    ("I have a severe shellfish allergy.", "", "The user has a shellfish allergy."),
    ("我海鲜过敏，点菜时注意一下。", "", "用户对海鲜过敏。"),
]


@pytest.mark.parametrize(("message", "subject", "want"), EVERYDAY)
def test_everyday_first_person_facts_are_extracted_without_a_model(message, subject, want):
    got = extract_by_rules(message)
    if subject:
        assert any(c.subject == subject and c.value == want for c in got), got
    else:
        assert want in [c.text for c in got], got


@pytest.mark.parametrize(
    "message",
    [
        "我妈妈去年搬到了上海。",  # someone else's move
        "我们公司搬到了浦东。",  # the company's
        "He said I moved to Paris.",  # reported
        "If I quit smoking I will be happy.",  # hypothetical
        "I haven't stopped drinking coffee.",
        "I'm not allergic to anything.",
        "我儿子对花生过敏。",  # the son's allergy
        "我不对花生过敏。",
        "I'm German.",  # a nationality, not a name
        "I'm into it.",
        "I don't know anymore.",
        "Have you stopped drinking?",
    ],
)
def test_everyday_rules_give_no_fact_about_someone_else_or_one_not_stated(message):
    assert extract_by_rules(message) == [], extract_by_rules(message)


@pytest.mark.parametrize("message", ["我二月底从利兹搬到爱丁堡了", "I've stopped drinking coffee.", "我不再喝咖啡了。",
                                     "I gave up sugar last year.", "我们去年从北京搬到了成都。"])
def test_a_plain_text_move_or_stop_is_a_correction_worth_a_write_after_the_turn(message):
    assert detect_triggers(message).correction and detect_triggers(message).needs_model()
    # Runs recorded before the everyday rules (patch memory-everyday-facts) read it as before.
    assert not detect_triggers(message, everyday=False).correction


def test_without_everyday_the_rules_give_what_they_gave_before():
    assert extract_by_rules("我二月底从利兹搬到爱丁堡了", everyday=False) == []
    assert extract_by_rules("I'm allergic to peanuts.", everyday=False) == []
    assert [c.value for c in extract_by_rules("I moved to Zurich last month.", everyday=False)] == ["Zurich"]


@pytest.mark.parametrize(
    ("text", "stated"),
    [
        ("User lives in Bern.", ("home_city", "Bern")),
        ("Lives in Bern with her husband.", ("home_city", "Bern")),
        ("用户住在利兹。", ("home_city", "利兹")),
        ("用户在腾讯工作。", ("employer", "腾讯")),
        ("The user works at Kestrel Labs as product lead.", ("employer", "Kestrel Labs")),
        ("Her sister lives in Rome.", ("", "")),
        ("Works from home on Fridays.", ("", "")),
        ("User lives in Slack all day.", ("", "")),
        ("Lives in fear.", ("", "")),
    ],
)
def test_a_stored_statement_of_the_users_home_or_employer_names_its_subject(text, stated):
    assert rules.stated_subject(text) == stated
