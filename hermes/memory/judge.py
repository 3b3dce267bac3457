"""The memory judge: is a new memory the same as an older one, a change of it, or another fact?

Issue 15 (DESIGN.md "Memory", dedupe and conflict). Sandbox-safe (standard library and
pydantic only): the writer and consolidation workflows import its payloads.

A pair is an older active row and a newer text, close in meaning (a neighbour in the band
under the embedding model's merge threshold, or the same topic with a change word). Its
verdict is one of:

- ``same``: the newer says the same thing (in other words, another language, another case
  or punctuation): one row holds both (the older absorbs the newer; its id joins the
  older's ``sources``).
- ``update``: the newer replaces the older (the office moved, the release slipped): the
  older stays, ``superseded`` and linked (``superseded_by``), with half its confidence.
- ``contradicts``: the newer says the older is not so (a negation of it): as ``update``.
- ``different``: two facts; both stay.

:func:`assess` decides by rules. It is *certain* only where wording alone settles it: the
same text once case, width, punctuation and whitespace are gone (``same``), or one
statement and its negation (``contradicts``). Where the rules see that the two can never
be one row (both state numbers and they differ, one word replaced by another, the negation
flipped) a ``same`` is ruled out, whoever answers. Everything else is a question for the
model (the extraction model; :func:`judge_messages`, :func:`parse_verdict`), and the rules'
own answer (``fallback``) holds without a model (the offline default) or past the run's
budget of model calls.
"""

from __future__ import annotations

import difflib
import json
import re
import unicodedata
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, Field

Verdict = Literal["same", "update", "different", "contradicts"]
VERDICTS: tuple[str, ...] = ("same", "update", "different", "contradicts")

JUDGE_INSTRUCTION = """You compare two memories about the same user: an OLDER one, stored earlier, and a NEWER one.
Answer with JSON only: {"verdict": "same" | "update" | "different" | "contradicts"}
- "same": the newer says the same thing as the older (other words, another language, more or less detail).
- "update": the newer replaces the older: the same fact with a new value (moved, switched, rescheduled, a correction).
- "contradicts": the newer says the older is not (or no longer) true.
- "different": they are about different things; both stay true."""


class JudgePair(BaseModel):
    """A pair put before the judge: an older row and a newer one, both stored and active
    (the newer was inserted; the verdict then merges or supersedes)."""

    older_id: str
    newer_id: str
    similarity: float
    """Cosine similarity of the two texts (both embedded as passages)."""
    fallback: Verdict = "different"
    """The rules' verdict: applied without a model or past the run's budget."""
    never_same: bool = False
    """The rules rule ``same`` out (numbers, a substituted word, a flipped negation): a
    model's ``same`` is applied as ``update`` (unless ``two_things``)."""
    reason: str = ""
    two_things: bool = False
    """The rules see two things, not two values of one (other ids, other people, a
    statement about the past): a model's ``same`` is applied as ``different``, both stay."""


class JudgeMemoriesInput(BaseModel):
    """The pairs one write batch (or one user's consolidation) left to the judge."""

    user_id: str
    pairs: list[JudgePair] = Field(default_factory=list)
    max_calls: int = Field(default=20, ge=0)
    """Model calls at most for these pairs; the rest get their rules' verdict."""
    model: str | None = None
    """The model to ask (None: the provider's default, as extraction)."""


class JudgeReport(BaseModel):
    """What the judge decided and applied."""

    asked: int = 0
    """Model calls made."""
    by_rules: int = 0
    """Pairs decided by their rules' verdict (no model, the budget spent, or a failed call)."""
    merged: list[str] = Field(default_factory=list)
    """Newer rows folded into their older twin (moved to the archive as ``merged``)."""
    superseded: list[str] = Field(default_factory=list)
    kept: int = 0
    """Pairs judged ``different`` (both stay), or no longer both active."""
    errors: list[str] = Field(default_factory=list)

    def merge(self, other: JudgeReport) -> JudgeReport:
        return JudgeReport(
            asked=self.asked + other.asked,
            by_rules=self.by_rules + other.by_rules,
            merged=self.merged + other.merged,
            superseded=self.superseded + other.superseded,
            kept=self.kept + other.kept,
            errors=(self.errors + other.errors)[:20],
        )


# ------------------------------------------------------------------ wording


def normalise(text: str) -> str:
    """``text`` as compared for an exact restatement: NFKC (full-width to half-width),
    case-folded, without punctuation, symbols' spacing or whitespace. ``Likes green tea!``
    and ``likes green tea`` give the same string; so do ``不能吃辣。`` and ``不能吃辣！``."""
    text = unicodedata.normalize("NFKC", text).casefold()
    return "".join(c for c in text if not (unicodedata.category(c)[0] in "PZC" or c.isspace()))


_CJK = r"\u3400-\u9fff"
_TOKEN = re.compile(rf"[{_CJK}]|[^\W_]+", re.UNICODE)


def tokens(text: str) -> list[str]:
    """Words (Latin and other alphabets) and single CJK characters, case-folded."""
    return _TOKEN.findall(unicodedata.normalize("NFKC", text).casefold())


def has_cjk(text: str) -> bool:
    return re.search(f"[{_CJK}]", text) is not None


_NUMBER_WORDS = {
    w: str(i)
    for i, group in enumerate(
        [("zero",), ("one", "first", "once"), ("two", "second", "twice"), ("three", "third", "thrice"), ("four", "fourth"),
         ("five", "fifth"), ("six", "sixth"), ("seven", "seventh"), ("eight", "eighth"), ("nine", "ninth"),
         ("ten", "tenth"), ("eleven", "eleventh"), ("twelve", "twelfth")]
    )
    for w in group
}
_NUMBER = re.compile(r"\d+(?:[.,]\d+)?[a-z]*|[a-z]+", re.I)
_CJK_DIGITS = {c: i for i, c in enumerate("零一二三四五六七八九")} | {"〇": 0, "两": 2}
_CJK_NUMBER = re.compile(r"[零〇一二两三四五六七八九十百]{2,}|[二两三四五六七八九十]")
"""Chinese numerals: a run of two or more (``十五``, ``一百``), or one digit other than
``一`` (which is mostly "a"/"one" inside words: ``一般``, ``一起``, ``一杯``)."""


def _cjk_value(run: str) -> int:
    total, digit = 0, 0
    for c in run:
        if c == "百":
            total, digit = total + (digit or 1) * 100, 0
        elif c == "十":
            total, digit = total + (digit or 1) * 10, 0
        else:
            digit = digit * 10 + _CJK_DIGITS[c] if digit else _CJK_DIGITS[c]
    return total + digit


def numbers(text: str) -> frozenset[str]:
    """The numbers, dates and ids ``text`` states, canonical: ``10am``, ``10 am`` and
    ``10:00`` are ``10``; ``three``, ``third`` and ``三`` are ``3``; ``十五`` is ``15``;
    ``4B`` stays ``4b``. Minutes ``:00`` and the ``am``/``pm``/``st``/``th`` suffixes are
    dropped. (``周三`` / ``周四``, ``三年级`` / ``四年级`` differ like ``3`` / ``4``.)"""
    found: set[str] = set()
    text = re.sub(r"(\d{1,2}):00\b", r"\1", unicodedata.normalize("NFKC", text).casefold())
    for m in _NUMBER.finditer(text):
        token = m.group(0)
        if token[0].isdigit():
            token = re.sub(r"(am|pm|st|nd|rd|th|h)$", "", token)
            token = token.lstrip("0") or "0"
            found.add(token)
        elif token in _NUMBER_WORDS:
            found.add(_NUMBER_WORDS[token])
    found.update(str(_cjk_value(m.group(0))) for m in _CJK_NUMBER.finditer(text))
    return frozenset(found)


_NEGATION = re.compile(
    r"\b(?:not|no|never|none|nothing|cannot|can't|cant|don't|dont|doesn't|doesnt|didn't|isn't|aren't|wasn't|won't|"
    r"neither|nor|without)\b|n't\b|[不没別别无非勿未]"
)
_CHANGE = re.compile(
    r"\b(?:moved|moving|relocated|switched|switching|changed|changing|no longer|not anymore|any ?more|slipped|"
    r"rescheduled|postponed|delayed|pushed (?:back|out)|brought forward|moved up|correction|actually|now|nowadays|"
    r"these days|instead|replaced|cancell?ed|quit|stopped|gave up|sold|left|from now on)\b"
    r"|搬到|搬去|搬家|改用|改成|改为|改到|改在|改坐|改学|改去|改吃|改喝|改了|换成|换到|换了|推迟|延期|延后|提前|"
    r"更正|纠正|不再|现在|如今|已经不|取消|辞职|离职|其实|以后都"
)


def has_negation(text: str) -> bool:
    return _NEGATION.search(unicodedata.normalize("NFKC", text).casefold()) is not None


_BEFORE = re.compile(r"\b(?:before|until|till|prior to|ahead of)\s+(?:[\w'’]+\s+){0,2}$")
"""A change word in a "before ..." clause (``before I quit``) names a time, not a change."""
_BEFORE_ZH = re.compile(r"[^，。,.!！?？;；:：\s]{0,6}?(?:之前|以前|前)(?![天年面台])")
"""... and in Chinese, a change word whose clause ends in 前 (``离职前``, ``搬家之前``,
``搬到苏黎世前``; not ``前天``, ``前面``)."""
_PAST = re.compile(r"\b(?:formerly|previously|used to|back when|in the past)\b|曾经|以前|过去|原先|之前")
"""Words that put a statement in the past (``formerly``, ``以前``): with no change word, it
tells what was and replaces nothing current, whatever value it holds."""


def change_marker(text: str) -> str | None:
    """The change word ``text`` holds (``moved``, ``slipped``, ``改用``, ``推迟``...), or
    None: said about an older memory of the same topic, it announces a new value.

    A change word that only dates something (``离职前``, ``before I quit``) is none: it
    announces no change (issue 30).
    """
    text = unicodedata.normalize("NFKC", text).casefold()
    for m in _CHANGE.finditer(text):
        if not (_BEFORE.search(text[: m.start()]) or _BEFORE_ZH.match(text, m.end())):
            return m.group(0)
    return None


_SINGLE_VALUED = re.compile(
    r"\b(?:live[sd]?|living|based|home|hometown|city|address|works? (?:at|for|as)|working (?:at|for|as)|employer|"
    r"employed|job|title|position|role|salary|name[ds]?|called|age|aged|birthday|born|phone|mobile|e-?mail|"
    r"password|pin|code|room|office|desk|deadline|due|date|appointment|scheduled|planned|gate|seat|reports to|"
    r"manager|boss)\b"
    r"|住在|住址|家在|城市|地址|在.{1,8}工作|上班|单位|职位|职务|职称|头衔|工资|薪水|名字|年龄|生日|电话|手机|邮箱|密码|"
    r"房间|教室|办公室|截止|日期|定在|安排在|预约|几点|老板|上司|领导|年级|班主任"
)
"""Words naming an attribute that holds one value at a time: where one lives, works, the
job title, a name, a birthday, a phone number, a password, the room or the date of
something. A new number in such a sentence is a new value; anywhere else (``policy
INV-495950 (item 50)`` / ``INV-495951 (item 51)``) it names another thing."""


_ID = re.compile(
    r"(?<![\w-])(?:[a-z]+-?\d[\w-]*|\d+-[\w-]*[a-z][\w-]*|#\d+|\d{5,})(?![\w-])"
    r"|\b(?:item|order|ticket|invoice|policy|case|issue|account|no\.?|number)\s*#?\d+\b"
    r"|(?:订单|工单|编号|单号|保单)\s*\d+"
)
"""Ids: letters and digits in one token (``INV-495950``, ``L-1007``), ``#42``, five digits or
more, or a number after a noun that counts things (``item 50``, ``order 1234``, ``订单 88``)."""
_CODE_ATTRIBUTE = re.compile(
    r"\b(?:phone|mobile|password|passcode|pin|code|account|e-?mail|address|plate|username|id)\b"
    r"|电话|手机|号码|密码|账号|邮箱|地址|车牌|用户名"
)
"""Attributes whose value is itself an id (a password, an account): another id is a new value."""


def _ids(text: str) -> frozenset[str]:
    return frozenset(m.group(0) for m in _ID.finditer(unicodedata.normalize("NFKC", text).casefold()))


def single_valued(older: str, newer: str) -> bool:
    """Whether ``older`` and ``newer`` both state a single-valued attribute
    (:data:`_SINGLE_VALUED`) of one thing: then differing numbers in the same sentence are
    a change of its value, else two facts. Differing ids (:data:`_ID`) name another thing,
    unless the attribute's value is an id itself (:data:`_CODE_ATTRIBUTE`)."""
    texts = [unicodedata.normalize("NFKC", t).casefold() for t in (older, newer)]
    if _ids(older) != _ids(newer) and not all(_CODE_ATTRIBUTE.search(t) for t in texts):
        return False  # "Order 1234 is due on May 3." / "Order 1235 ...": another order, not a new date
    return all(_SINGLE_VALUED.search(t) for t in texts)


def _strip_negation(text: str) -> list[str]:
    """The words of ``text`` without its negation, lightly stemmed (``likes`` / ``like``)."""
    words = tokens(_NEGATION.sub(" ", unicodedata.normalize("NFKC", text).casefold()))
    return [re.sub(r"(?<=\w{3})s$", "", w) if w.isascii() else w for w in words]


def _substitution(a: list[str], b: list[str]) -> bool:
    """One word (or a run of CJK characters) replaced by another and the rest identical,
    nothing added or dropped (``wife's birthday`` / ``son's birthday``; ``苏州`` / ``无锡``)."""
    matcher = difflib.SequenceMatcher(a=a, b=b, autojunk=False)
    changed = [op for op in matcher.get_opcodes() if op[0] != "equal"]
    # Only the one replacement: a restatement that also drops or adds words ("儿子在读小学
    # 三年级" / "儿子今年读三年级") is a rewording, not one value swapped for another.
    return len(changed) == 1 and changed[0][0] == "replace" and matcher.ratio() >= 0.6


_STOP = frozenset(
    """the and for are was were what when where which who how you your this that these those with from have has
    had not but can could would should will may might must did does any all some our their they them she her his
    him its about into over then than there here just also very much more most such only own same too please
    user users always usually mostly really honestly actually definitely every each
    like likes liked prefer prefers preferred want wants wanted use uses used using keep keeps
    take takes get gets got goes make makes need needs please
    day days week weeks weekly month months year years time times today yesterday tomorrow
    last next ago""".split()
)
"""Besides grammar words: verbs that frame a preference (``likes``, ``uses``, ``wants``)
and time words (``week``, ``year``): two memories sharing only these are not about the same
thing ("Uses a Pixel 7 phone" / "Uses metric units"; "... last week" / "... a week")."""
_STOP_BIGRAMS = frozenset(
    "用户 我的 你的 他的 她的 我们 一个 这个 那个 的是 喜欢 每天 每周 每年 今年 明年 去年 现在 以后 上周 下周 时候".split()
)
_STOP_CHARS = frozenset("的了是我你他她它们在和与也都就还很把被给对用户这那个一有要会吗呢吧啊呀着过不没别无非勿未")
"""CJK characters that carry no topic (particles, pronouns, ``用户``, and the negation,
which :func:`has_negation` weighs), left out of :func:`lexical_overlap`."""


def topic_words(text: str) -> frozenset[str]:
    """What ``text`` is about, for "the same topic": English words of 3+ letters without
    stop words, lightly stemmed, and CJK character bigrams, without the change words."""
    found: set[str] = set()
    for word in re.findall(rf"[a-z]{{3,}}|[{_CJK}]+", _CHANGE.sub(" ", unicodedata.normalize("NFKC", text).casefold())):
        if word.isascii():
            if word in _STOP:
                continue
            for suffix in ("ing", "ies", "ed", "es", "s"):
                if word.endswith(suffix) and len(word) - len(suffix) >= 3:
                    word = word[: -len(suffix)]
                    break
            found.add(word)
        else:
            found.update(b for b in (word[i : i + 2] for i in range(len(word) - 1)) if b not in _STOP_BIGRAMS)
    return frozenset(found)


def _share_topic(a: frozenset[str], b: frozenset[str]) -> bool:
    """``a`` and ``b`` share a topic word, a compound counting for its head (``iphone``
    shares ``phone``, ``smartwatch`` shares ``watch``; four letters at least)."""
    if a & b:
        return True
    return any(len(y) >= 4 and len(x) > len(y) and x.endswith(y) for x in a for y in b if x.isascii() and y.isascii()) \
        or any(len(x) >= 4 and len(y) > len(x) and y.endswith(x) for x in a for y in b if x.isascii() and y.isascii())


def _content_chars(text: str) -> frozenset[str]:
    return frozenset(c for c in unicodedata.normalize("NFKC", text) if re.match(f"[{_CJK}]", c) and c not in _STOP_CHARS)


def lexical_overlap(older: str, newer: str) -> float:
    """How much of the shorter text's topic the longer one repeats, 0-1: the overlap
    coefficient of their topic words (English, stemmed, without framing verbs and time
    words) and content characters (CJK), ``|A & B| / min(|A|, |B|)``; 0 when the shorter
    has fewer than two (one shared word says little). ``Takes notes in Obsidian.`` /
    ``Uses Obsidian for all of her notes.``: 1.0; ``prefers concise answers`` / ``prefers
    answers in Chinese``: 0.5."""
    a = {w for w in topic_words(older) if w.isascii()} | _content_chars(older)
    b = {w for w in topic_words(newer) if w.isascii()} | _content_chars(newer)
    if min(len(a), len(b)) < 2:
        return 0.0
    return len(a & b) / min(len(a), len(b))


_PERSONS = {
    "mother": "mother mom mum mama 妈妈 母亲 老妈 我妈",
    "father": "father dad papa 爸爸 父亲 老爸 我爸",
    "parents": "parents parent 父母 爸妈",
    "sister": "sister sisters 姐姐 妹妹 姐妹 表妹 表姐 堂妹 堂姐",
    "brother": "brother brothers 哥哥 弟弟 兄弟 表哥 表弟 堂哥 堂弟",
    "husband": "husband 丈夫 老公 先生",
    "wife": "wife 妻子 老婆 太太 爱人",
    "partner": "partner boyfriend girlfriend 男朋友 女朋友 伴侣 对象",
    "son": "son sons 儿子",
    "daughter": "daughter daughters 女儿",
    "children": "kid kids child children 孩子 小孩",
    "grandparent": "grandmother grandfather grandma grandpa 奶奶 爷爷 外婆 外公 姥姥 姥爷",
    "friend": "friend friends 朋友",
    "colleague": "colleague colleagues coworker coworkers 同事",
    "boss": "boss manager 老板 上司 领导 经理",
    "cousin": "cousin cousins",
    "aunt": "aunt uncle 阿姨 叔叔 舅舅 姑姑",
}
_PERSON_OF = {w: k for k, words in _PERSONS.items() for w in words.split()}
_PERSON_EN = re.compile(r"\b(" + "|".join(sorted((w for w in _PERSON_OF if w.isascii()), key=len, reverse=True)) + r")\b")
_PERSON_ZH = re.compile("|".join(sorted((w for w in _PERSON_OF if not w.isascii()), key=len, reverse=True)))
_POSSESSIVE_NAME = re.compile(r"\b([A-Z][a-z]+)(?:'s|’s|s')(?=\s)")
_NOT_NAMES = frozenset("what that it here there who where when how let he she this today tomorrow yesterday everyone".split())
"""Capitalised words before ``'s`` that are contractions or times, not people (``What's my
blood type?`` is about no one else)."""


def persons(text: str) -> frozenset[str]:
    """The other people ``text`` is about, canonical across English and Chinese: kinship
    and other relations (``sister`` and ``妹妹`` are ``sister``; ``husband``, ``丈夫``,
    ``老公`` are ``husband``) and names in the possessive (``Jonas's`` is ``jonas``). Two
    memories of different people are never the same memory, and a question about
    someone's birthday is not answered by the user's own."""
    text = unicodedata.normalize("NFKC", text).replace("’", "'")
    found = {_PERSON_OF[m.group(1)] for m in _PERSON_EN.finditer(text.casefold())}
    found |= {_PERSON_OF[m.group(0)] for m in _PERSON_ZH.finditer(text)}
    found |= {m.group(1).casefold() for m in _POSSESSIVE_NAME.finditer(text)} - _NOT_NAMES
    return frozenset(found)


@dataclass(frozen=True)
class JudgeBands:
    """The similarities at which the judge looks, on the embedding model's own scale."""

    floor: float
    """Neighbours at or above it (and under the merge threshold) are put before the judge."""
    marker_floor: float
    """A newer text with a change word is compared with neighbours from this lower floor."""
    rules_same: float
    """Without a model, a pair at or above it with nothing that rules ``same`` out is merged."""
    change: float
    """A change word and a pair at or above it, sharing no topic word, go before the model
    (without one, both are kept); with shared topic words, from ``marker_floor`` they supersede."""
    lexical_same: float = 1.01
    """Without a model, a pair in one language at or above it whose shorter text's topic the
    longer repeats (:func:`lexical_overlap` at least :data:`LEXICAL_SAME_OVERLAP`, or
    :data:`LEXICAL_SAME_OVERLAP_CJK` in Chinese) is merged."""
    cross_language_same: float = 1.01
    """Without a model, a pair in two languages (one with CJK, one without) at or above it is merged."""
    cross_language_lexical_same: float = 1.01
    """Without a model, a pair in two languages at or above it is merged when the English
    repeats the Chinese word for word (:func:`hermes.memory.crosslingual.overlap` at
    least :data:`LEXICAL_SAME_OVERLAP`)."""


LEXICAL_SAME_OVERLAP = 0.66
"""Share of the shorter text's topic words the longer must repeat (two of three) ..."""
LEXICAL_SAME_OVERLAP_CJK = 0.8
"""... and of its content characters, when both texts are Chinese: a character says less
than a word ("学校的年会在苏州开" / "学校今年的年会在无锡开", a change of place, share 5 of 7)."""


@dataclass(frozen=True)
class Assessment:
    verdict: Verdict
    certain: bool
    """The model is not asked (and its answer would not be applied)."""
    never_same: bool
    reason: str
    two_things: bool = False
    """Other ids, other people or a statement about the past: see :attr:`JudgePair.two_things`."""


def assess(older: str, newer: str, similarity: float, bands: JudgeBands) -> Assessment:
    """The rules' verdict on ``older`` (stored first) and ``newer``.

    Args:
        older: the text of the older memory.
        newer: the text of the newer one.
        similarity: their cosine similarity (both as passages).
        bands: the model's judge bands (:class:`JudgeBands`).

    Returns:
        The verdict, whether it is certain, and whether ``same`` is ruled out.
    """
    if normalise(older) == normalise(newer):
        return Assessment("same", True, False, "the same text once case, width and punctuation are ignored")
    marker = change_marker(newer)
    if marker and change_marker(older) == marker:
        marker = None  # both say "now ...": no change announced between them
    elif marker and change_marker(older) and has_cjk(older) != has_cjk(newer):
        from hermes.memory import crosslingual  # the dictionary: activities only

        english, chinese = (newer, older) if has_cjk(older) else (older, newer)
        if crosslingual.overlap(english, chinese) >= LEXICAL_SAME_OVERLAP:
            marker = None  # "Now prefers answers in Chinese." / "现在希望用中文回答。": one statement
    na, nb = numbers(older), numbers(newer)
    numbers_differ = bool(na) and bool(nb) and na != nb
    ta, tb = tokens(older), tokens(newer)
    flipped = has_negation(older) != has_negation(newer)
    if flipped and not marker:
        sa, sb = _strip_negation(older), _strip_negation(newer)
        if difflib.SequenceMatcher(a=sa, b=sb, autojunk=False).ratio() >= 0.8:
            return Assessment("contradicts", True, True, "one statement and its negation")
    substituted = _substitution(ta, tb)
    others = persons(older) != persons(newer)
    # "Formerly worked at Acme." is neither "Works at Acme." again nor, by itself, its end.
    past = bool(_PAST.search(older.casefold())) != bool(_PAST.search(newer.casefold()))
    never_same = numbers_differ or substituted or (flipped and bool(marker)) or others or past
    shared = _share_topic(topic_words(older), topic_words(newer))
    if not shared and marker and has_cjk(older) != has_cjk(newer):
        from hermes.memory import crosslingual

        shared = crosslingual.share_word(older, newer)
    if marker and shared and similarity >= bands.marker_floor:
        return Assessment("update", False, True, f"change word {marker!r} about the same topic")
    if marker and similarity >= bands.change and not numbers_differ and not others:
        # A change word alone never supersedes (issue 30): close, but with no topic word in
        # common ("Moved the meeting." / "Lives in Bern."), it is the model's to decide; the
        # rules' own answer, without one, keeps both.
        return Assessment("different", False, True, f"change word {marker!r}, no topic word shared")
    reason = ("numbers differ" if numbers_differ else "one word replaced" if substituted
              else "about other people" if others else "one said of the past" if past else "")
    if (numbers_differ or substituted) and not others and not flipped and not past and similarity >= bands.lexical_same \
            and lexical_overlap(older, newer) >= LEXICAL_SAME_OVERLAP:
        # The same sentence with another value ("... in room 4B" / "... in room 2A"; "年会在
        # 苏州开" / "今年的年会在无锡开"): people also state a change without a change word.
        # Other numbers or ids are another value only of a single-valued attribute: "policy
        # INV-495950 (item 50)" / "policy INV-495951 (item 51)" are two policies (issue 30).
        if not numbers_differ or single_valued(older, newer):
            return Assessment("update", False, True, f"{reason}, the rest restated")
        return Assessment("different", False, True, "numbers or ids differ, not a single-valued attribute", True)
    if never_same:
        two_things = others or past or (numbers_differ and not single_valued(older, newer))
        return Assessment("different", False, True, reason or "negation flipped", two_things)
    if marker:
        return Assessment("different", False, False, f"change word {marker!r}, topic not shared")
    if flipped:
        return Assessment("different", False, False, "")
    if similarity >= bands.rules_same:
        return Assessment("same", False, False, "close restatement")
    if has_cjk(older) != has_cjk(newer):
        if similarity >= bands.cross_language_same:
            return Assessment("same", False, False, "close restatement in another language")
        if similarity >= bands.cross_language_lexical_same:
            from hermes.memory import crosslingual  # the dictionary: activities only

            english, chinese = (newer, older) if has_cjk(older) else (older, newer)
            if crosslingual.overlap(english, chinese) >= LEXICAL_SAME_OVERLAP:
                return Assessment("same", False, False, "restatement in another language, word for word")
    elif similarity >= bands.lexical_same and lexical_overlap(older, newer) >= (
            LEXICAL_SAME_OVERLAP_CJK if has_cjk(older) else LEXICAL_SAME_OVERLAP):
        return Assessment("same", False, False, "restatement of the same words")
    return Assessment("different", False, False, "")


# ------------------------------------------------------------------ the model


def judge_prompt(older: str, newer: str) -> str:
    return f"OLDER: {older}\nNEWER: {newer}"


_VERDICT_RE = re.compile(r'"verdict"\s*:\s*"(same|update|different|contradicts)"', re.I)


def parse_verdict(answer: str) -> Verdict | None:
    """The verdict in a model's answer (JSON ``{"verdict": ...}``, fenced or not), or None
    when it holds none (the pair then gets its rules' verdict)."""
    text = answer.strip()
    start = text.find("{")
    if start >= 0:
        try:
            value, _ = json.JSONDecoder().raw_decode(text[start:])
        except ValueError:
            value = None
        if isinstance(value, dict) and str(value.get("verdict", "")).lower() in VERDICTS:
            return str(value["verdict"]).lower()  # type: ignore[return-value]
    m = _VERDICT_RE.search(text)
    return m.group(1).lower() if m else None  # type: ignore[return-value]


def applied_verdict(pair: JudgePair, verdict: Verdict | None) -> Verdict:
    """What is applied for ``pair`` given the model's ``verdict`` (None: the rules')."""
    if verdict is None:
        return pair.fallback
    if verdict == "same" and pair.never_same:
        # Supersede only when certain (issue 30): a "same" the rules disprove is a new
        # value of one thing, or two things (another policy id, another person's birthday).
        return "different" if pair.two_things else "update"
    return verdict
