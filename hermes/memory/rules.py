"""Rule-based memory extraction and write triggers (DESIGN.md "Memory"; issue 6).

The deterministic half of the memory write path: it runs inside workflow code, so it does
no I/O, reads no clock, draws no random numbers and imports only the standard library and
pydantic. The same text always gives the same :class:`Triggers` and the same
:class:`RuleCandidate` list, in the same order.

- :func:`detect_triggers` says whether a user message is worth a model extraction
  (explicit "remember"/"记住", a stated fact or preference, a correction), asks to forget
  the user, or is small talk.
- :func:`extract_by_rules` turns what the rules are sure of into candidates: name, e-mail,
  phone, birthday and deadlines, job, home city, employer, temporary location,
  preferences (answer style and language included) and explicit "remember ..." clauses,
  in English and Chinese.

Subjects (single-valued facts; a new value of the same subject supersedes the old one):
``name``, ``email``, ``phone``, ``birthday``, ``job_title``, ``home_city``, ``employer``,
``current_location`` (temporary, with ``valid_until_days``), ``answer_style``,
``preferred_language``, ``favorite_<thing>`` (``favorite_color``...). Everything else has
subject ``""`` (values that may coexist: likes jazz, likes rock).

Hostile input is cheap: at most :data:`MAX_SCAN_CHARS` characters of a message are read,
every pattern is anchored on a literal keyword with bounded repetitions (no nested
quantifiers), e-mail and phone look-ups are capped, and neither function raises.

Why this module is long: the rules are one ordered table of English and Chinese
patterns, and every rule uses the same sentence, negation, reported-speech and
third-person helpers; cut into files, each part would reach into the others' internals,
and the order of the rules (which decides which candidate wins) would no longer be
readable in one place.
"""

from __future__ import annotations

import functools
import re
import unicodedata
from typing import Callable, Literal

from pydantic import BaseModel

__all__ = ["MAX_SCAN_CHARS", "RuleCandidate", "Triggers", "detect_triggers", "extract_by_rules", "stated_subject"]

MAX_SCAN_CHARS = 4000
"""Characters of a message the rules read; the rest is ignored (a pasted log or document
is not a statement about the user)."""
MAX_CANDIDATES = 20
"""Most candidates returned for one message."""
MAX_TEXT_CHARS = 200
"""Longest candidate text (the injection limit of DESIGN.md "Memory")."""
_MAX_EMAILS = 10
_MAX_PHONES = 10


class RuleCandidate(BaseModel):
    """A memory the rules are sure of, before it gets a user, a session and a time."""

    kind: Literal["fact", "preference"]
    subject: str
    """Key of a single-valued fact (``name``, ``home_city``, ``answer_style``...), or ``""``
    when values may coexist."""
    text: str
    """Self-contained third-person statement, at most 200 characters, in the user's
    language; the stated value is kept as written (after NFKC normalisation)."""
    confidence: float
    """0.9-0.99: rules only fire on explicit wording."""
    importance: float
    """0-1: identity and contact 0.9, home/job 0.75-0.8, preferences 0.6-0.7."""
    valid_until_days: int | None = None
    """Days the statement holds from when it was said (temporary states), None: no end."""
    value: str = ""
    """The subject's value as stated (``Zurich``, ``concise``): the same value restates a
    memory, another one supersedes it. Empty without a subject."""
    explicit: bool = False
    """Said in a "remember ..." / "记住..." request: the user asked to keep it (stored with
    source ``remember``, never archived by age)."""


class Triggers(BaseModel):
    """What a user message contains, as far as the memory write path cares."""

    explicit: bool = False
    """"remember ..." / "记住..." / "don't forget that ..."."""
    preference: bool = False
    """"I prefer/like/hate ...", "我喜欢/偏好/习惯...", answer style and language wishes."""
    correction: bool = False
    """"actually ...", "no, it's ...", "不对", "其实", "I moved to", "改成"..."""
    fact: bool = False
    """Statements about the user: "I'm a ...", "my ... is", "我是/我叫/我住在"..."""
    forget_me: bool = False
    """The user asks to delete everything remembered about them."""
    small_talk: bool = False
    """Greetings, thanks, weather chit-chat: nothing to remember."""

    def needs_model(self) -> bool:
        """Whether the message is worth a model extraction.

        Returns:
            True when it is explicit, a preference, a correction or a fact.
        """
        return self.explicit or self.preference or self.correction or self.fact


# --------------------------------------------------------------------------------------
# Normalisation and splitting
# --------------------------------------------------------------------------------------

_DROP_CATEGORIES = frozenset({"Cf", "Cs", "Co", "Cn"})
_APOSTROPHES = str.maketrans({"\u2018": "'", "\u2019": "'", "\u02bc": "'", "\u201c": '"', "\u201d": '"',
                              "\u300c": '"', "\u300d": '"', "\u2014": ",", "\u2013": "-"})
_HAN = re.compile(r"[\u3400-\u9fff\uf900-\ufaff]")
_SPACES = re.compile(r"[^\S\n]+")
_SENTENCE_SPLIT = re.compile(r"(?<=[!?\u3002;\n\u2026])|(?<=\.)(?=\s|$)")


_ASCII_CONTROLS = re.compile(r"[\x00-\x09\x0b-\x1f\x7f]")
"""ASCII control characters but the newline: each becomes a space in :func:`_normalize`."""

_READ_CHARS = MAX_SCAN_CHARS * 2
"""The part of a text the rules read before NFKC (which may shorten it to
:data:`MAX_SCAN_CHARS`): also what their caches are keyed by, so that a megabyte message
is neither kept nor hashed whole."""


def _normalize(text: str) -> str:
    """NFKC (full-width to ASCII), drop control/format characters, collapse spaces.

    Pure, so kept for the last 64 texts (by their first :data:`_READ_CHARS` characters):
    a turn's message is read by the trigger check and the extraction, each more than
    once (issue 31)."""
    return _normalized(text[:_READ_CHARS])


@functools.lru_cache(maxsize=64)
def _normalized(text: str) -> str:
    """:func:`_normalize` of a text already cut. ASCII text takes a short way to the same
    result: NFKC, the quote map and the dropped categories leave it as it is, and its
    control characters (category ``Cc``) become spaces."""
    if text.isascii():
        return _SPACES.sub(" ", _ASCII_CONTROLS.sub(" ", text[:MAX_SCAN_CHARS])).strip()
    text = unicodedata.normalize("NFKC", text)[:MAX_SCAN_CHARS]
    text = text.translate(_APOSTROPHES)
    out = []
    for ch in text:
        if ch in "\n\t":
            out.append("\n" if ch == "\n" else " ")
            continue
        cat = unicodedata.category(ch)
        if cat == "Cc":
            out.append(" ")
        elif cat in _DROP_CATEGORIES:
            continue
        else:
            out.append(ch)
    return _SPACES.sub(" ", "".join(out)).strip()


def _sentences(text: str) -> list[str]:
    parts = (p.strip() for p in _SENTENCE_SPLIT.split(text))
    return [p for p in parts if p]


def _is_zh(text: str) -> bool:
    return _HAN.search(text) is not None


_EN_QUESTION_START = re.compile(
    r"^(?:(?:so|and|but|ok|okay|hey|well|um|uh)[,\s]+)?"
    r"(?:what|what's|whats|where|where's|who|who's|whom|whose|when|why|how|which|do|does|did|is|are|am|"
    r"was|were|can|could|would|will|should|shall|have|has|may|might|isn't|aren't|doesn't|didn't)\b",
    re.I,
)
_ZH_QUESTION = re.compile(r"什么|啥|哪里|哪儿|哪个|哪些|哪家|谁|怎么|为什么|是不是|是否|有没有|对不对|吗[\s!.~]*$|呢[\s!.~]*$")


def _is_question(sentence: str) -> bool:
    s = sentence.rstrip(" .!~")
    if s.endswith("?"):
        return True
    if _EN_QUESTION_START.search(s):
        return True
    return _ZH_QUESTION.search(s) is not None


# --------------------------------------------------------------------------------------
# Values: cleaning, clause windows, negation, pronouns
# --------------------------------------------------------------------------------------

_VALUE_EN = r"(?P<v>[^,;:()\[\]{}\"\n!?]{1,80})"
_VALUE_ZH = r"(?P<v>[^,.;:()\[\]{}\"\n!?\s\u3002\u3001\u300a\u300b]{1,40})"
_CUT_COMMON = ("and", "but", "because", "since", "so", "which", "who", "where", "when", "while", "though",
               "although", "whereas", "if", "unless", "until", "then", "anyway", "btw", "please", "thanks",
               "thank", "lol", "haha", "anymore", "though", "right", "now")
_CUT_PLACE = _CUT_COMMON + ("with", "for", "in", "at", "near", "last", "next", "this", "these", "from", "on",
                            "currently", "today", "ago", "already", "again", "too", "as", "by", "after",
                            "before", "nowadays", "recently", "a", "an", "about", "around", "to", "i", "i'm")
_CUT_NAME = _CUT_COMMON + ("i", "i'm", "im", "from", "in", "at", "and", "but", "by", "the", "a", "an", "is",
                           "am", "my", "or", "to", "for", "with", "not", "too", "also", "here", "nice")
_CUT_JOB = _CUT_COMMON + ("at", "for", "in", "with", "from", "of", "by", "on", "i", "i'm", "my", "working",
                          "based", "living", "who", "that", "to", "currently", "now", "here")
_CUT_ORG = _CUT_COMMON + ("as", "in", "since", "for", "now", "i", "my", "on", "at", "currently", "today",
                          "these", "this", "last", "next", "from", "where", "remotely", "part", "full")
_CUT_PREF = ("but", "because", "since", "so", "which", "when", "while", "though", "although", "whereas",
             "unless", "until", "anyway", "btw", "please", "thanks", "thank", "lol", "haha")
_ZH_TRAIL = "了啦啊呀哦喔呢吧哈嘛的~"


def _cut_words(value: str, stop: tuple[str, ...], max_words: int = 12) -> str:
    words = value.split()
    kept: list[str] = []
    for w in words[:max_words]:
        if w.lower().strip(".'") in stop:
            break
        kept.append(w)
    return " ".join(kept).strip(" .'-")


def _cut_zh(value: str, keep_de: bool = False) -> str:
    for sep in ("但是", "但", "而且", "因为", "所以", "不过", "可是", "然后", "并且"):
        i = value.find(sep)
        if i > 0:
            value = value[:i]
    trail = _ZH_TRAIL.replace("的", "") if keep_de else _ZH_TRAIL
    value = value.rstrip(trail + " ")
    return value.lstrip("了 ")


_CLAUSE_BREAK = re.compile(
    r"[,;:]|\b(?:but|and|so|now|then|though|although|however|whereas)\b|但是|但|不过|可是|而且|现在|然后", re.I
)
_EN_NEG = re.compile(
    r"\b(?:not|never|no\s+longer|nor|neither|hardly|dont|doesnt|didnt|cant|cannot|isnt|arent|wasnt|"
    r"werent|havent|hasnt|wont|used\s+to|would|if|maybe|might|could|should|want\s+to|going\s+to|wish|"
    r"planning|plan|hope|suppose|supposing|imagine|imagining|assume|assuming|pretend|pretending|let'?s\s+say|"
    r"what\s+if|in\s+case|whether|unless|someday|one\s+day|dream|dreaming|dreamt|dreamed|considering|"
    r"thinking\s+(?:of|about)|wonder|wondering)\b|n't\b",
    re.I,
)
_EN_AFTER_NEG = re.compile(r"^[^,;:]{0,40}?\b(?:anymore|any\s+more|no\s+more|no\s+longer)\b", re.I)
_ZH_NEG = re.compile(r"不|没|别|未|非|无|莫|假如|如果|要是|以前|曾经|原来|之前|打算|准备|想要|可能|假设|倘若|万一|设想|想象|假装|梦见|梦到|做梦|哪天|等我|是否")
_ZH_NOT_NEG = re.compile(r"不对|不过|不错|不久|不少|不好意思|没错|没问题")


def _clause_start(sentence: str, pos: int) -> int:
    start = 0
    for m in _CLAUSE_BREAK.finditer(sentence, 0, pos):
        start = m.end()
    return start


def _negated(sentence: str, m: re.Match[str], zh: bool) -> bool:
    """Whether the clause holding the match negates, conditions or puts it in the past."""
    window = sentence[_clause_start(sentence, m.start()) : m.start("v") if "v" in m.re.groupindex else m.end()]
    if zh:
        return _ZH_NEG.search(_ZH_NOT_NEG.sub("", window)) is not None
    if _EN_NEG.search(window):
        return True
    return _EN_AFTER_NEG.search(sentence[m.start("v") if "v" in m.re.groupindex else m.end() :]) is not None


_THIRD_PARTY_EN = re.compile(
    r"\b(?:his|her|their|your|our|its)\b|\b(?:wife|husband|boss|friend|mom|mum|mother|dad|father|sister|"
    r"brother|son|daughter|colleague|partner|manager|girlfriend|boyfriend|team|company|office|support|"
    r"customer|client|doctor|landlord|kid|child|neighbou?r|uncle|aunt|cousin)(?:'s|s)?\b",
    re.I,
)
_THIRD_PARTY_ZH = re.compile(r"他|她|它|你|老板|朋友|老婆|老公|妻子|丈夫|同事|妈|爸|公司|客服|经理|女友|男友|孩子|儿子|女儿|客户|邻居|家人|领导")
_NOT_A_PHONE_CONTEXT = re.compile(
    r"\b(?:order|invoice|tracking|account|acct|card|ref|reference|id|ticket|case|serial|iban|no\.|number\s+of|"
    r"price|cost|total|amount|usd|eur|chf|rmb|cny)\b|[#$€£¥]|订单|单号|编号|账号|帐号|卡号|快递|发票|工号|学号|身份证|价格|金额|元|块",
    re.I,
)


# Reported speech: "she said I live in Berlin", "my friend thinks I'm a doctor", "他说我住在北京"
# state what someone else claims, not what the user says about themselves. A contrast ("you
# said I live in Paris, but I live in Lyon") starts the user's own statement again.
_REPORTED_EN = re.compile(
    r"\b(?P<who>[\w']{1,20})\s+(?:(?:always|just|once|keeps|kept|apparently|probably|still)\s+)?"
    r"(?:said|says|say|told|tells|tell|thinks|think|thought|claims?|claimed|believes?|believed|assumes?|assumed|"
    r"wrote|writes|asked|asks|insists?|insisted|jokes?|joked|reckons?|swears?|swore|means?|meant|imagines?)\b",
    re.I,
)
_REPORTED_SELF = frozenset({"i", "i'd", "i've", "i'll", "as", "like", "have", "had", "you'd"})
_REPORTED_ZH = re.compile(
    r"(?<![跟和对给诉])(?:他|她|它|你|他们|她们|别人|有人|大家|人家|老板|朋友|同事|妈妈|妈|爸爸|爸|老婆|老公|领导|医生|家人)"
    r"[^,，。;；]{0,4}?(?:说|以为|觉得|认为|告诉|听说|声称|猜|还说)"
)
_CONTRAST = re.compile(r"\b(?:but|actually|however|though|in\s+fact)\b|但是|但|其实|不过|可是", re.I)


def _reported(sentence: str, pos: int) -> bool:
    """Whether the statement at ``pos`` is someone else's claim (reported speech)."""
    start = 0
    for m in _CONTRAST.finditer(sentence, 0, pos):
        start = m.end()
    window = sentence[start:pos]
    if _REPORTED_ZH.search(window):
        return True
    return any(m.group("who").lower() not in _REPORTED_SELF for m in _REPORTED_EN.finditer(window))


# A home or current place must look like a place. "I live in Slack all day", "I live in fear",
# "I moved to Jira", "我住在钉钉上", "我生活在恐惧中" use the words of a home for an app, a
# state of mind, clothes, a room or a team; taken as a home city they would supersede the
# real one. A value is refused when it starts with a determiner or possessive ("my inbox",
# "a bubble"; "the" only before a capitalised name: "the Netherlands"), names a known
# app/product, abstract state, garment, room or organisational unit, is followed by "all day"
# and the like, or is lowercase in a message whose writer capitalises proper nouns. Chinese
# values ending in a locative particle (上/里/中/内) are containers, not cities.
_NOT_A_PLACE_EN = frozenset(
    # apps, tools and products people "live in"
    "notion slack excel figma jira trello asana linear confluence vscode emacs vim neovim terminal "
    "inbox email emails e-mail gmail outlook teams zoom discord github gitlab bitbucket photoshop "
    "illustrator powerpoint word spreadsheets spreadsheet sheets docs twitter reddit youtube tiktok "
    "instagram facebook whatsapp telegram wechat chrome safari firefox browser obsidian evernote "
    "airtable salesforce hubspot intellij pycharm xcode jupyter cloud ide shell tmux kubernetes aws "
    "calendar chatgpt claude cursor zendesk miro canva blender minecraft steam roblox spotify netflix "
    "linkedin meetings meeting calls dms chat chats code codebase repo repos editor app apps "
    # states of mind and abstractions
    "fear fears terror dread hope hopes denial anxiety panic poverty luxury comfort misery sin shame "
    "guilt regret limbo peace harmony fantasy fantasyland dreamland darkness silence solitude isolation "
    "debt chaos paranoia suspense uncertainty doubt hell heaven past future present moment bubble "
    "society reality head mind imagination dream dreams memories nostalgia stress sadness grief "
    "constant perpetual fear-mode survival denial. la-la-land "
    # clothes
    "sweatpants pyjamas pajamas jeans hoodies hoodie leggings trainers sneakers slippers shorts "
    "t-shirts tshirts sweaters flannel flip-flops "
    # rooms, buildings, vehicles
    "office library gym kitchen bed car van basement garage dorm dorms classroom lab bathroom bedroom "
    "couch sofa desk headphones "
    # organisational units ("I moved to the Platform team")
    "team teams squad department dept group project org division unit role position job company "
    "startup floor building plan tier version release stack backend frontend account channel server "
    "side queue pipeline".split()
)
_NOT_A_PLACE_EN_PHRASES = ("vs code", "visual studio", "google docs", "google sheets", "google meet",
                           "microsoft teams", "la la land", "the cloud")
_PLACE_BAD_FIRST = frozenset("my your our his her their its a an this that these those some constant total "
                             "complete perpetual permanent eternal absolute pure utter such".split())
_METAPHOR_TAIL = re.compile(
    r"^\s*(?:all\s+(?:day|night|week|the\s+time)|24/7|day\s+and\s+night|most\s+(?:days|of\s+the\s+(?:day|time|week))"
    r"|every\s+(?:day|waking))\b",
    re.I,
)
_SELF_CAPS = frozenset({"i", "i'm", "i've", "i'd", "i'll", "im"})
_NOT_A_PLACE_ZH = ("钉钉", "微信", "飞书", "企业微信", "QQ", "抖音", "快手", "微博", "淘宝", "小红书", "B站", "知乎",
                   "邮箱", "网上", "线上", "电脑", "手机", "办公室", "公司", "图书馆", "宿舍", "实验室", "学校", "车里",
                   "床上", "焦虑", "恐惧", "痛苦", "过去", "回忆", "梦", "压力", "黑暗", "幻想", "阴影", "世界",
                   "社会", "游戏", "酒店", "宾馆", "朋友家", "亲戚家", "群里", "系统", "软件", "团队", "项目", "部门")
_ZH_CONTAINER_END = ("上", "里", "中", "内", "之中", "当中")


def _writer_capitalises(sentence: str, value_start: int) -> bool:
    """Whether the sentence capitalises a word other than its first, "I" and all-caps words."""
    words = re.findall(r"[^\W\d_][\w'\-]*", sentence[:value_start] + " " + sentence[value_start:][80:])
    for w in words[1:]:
        if w.lower() in _SELF_CAPS or w.isupper():
            continue
        if w[0].isupper():
            return True
    return False


def _en_place(raw: str, sentence: str, value_start: int, stop: tuple[str, ...], max_words: int = 5) -> str:
    """The place stated by ``raw`` (the text after "I live in"), or "" when it is not one."""
    place = _cut_words(raw, stop, max_words=max_words)
    if not place or not place[0].isalpha():
        return ""
    if _METAPHOR_TAIL.match(raw[len(place):].lstrip(" .'-")):
        return ""
    words = place.split()
    if words[0][0].isupper():
        # "Berlin city centre" -> "Berlin"; "Rio de Janeiro" keeps its inner lowercase word.
        while len(words) > 1 and words[-1][0].islower():
            words.pop()
        place = " ".join(words)
    low = [w.lower().strip(".'") for w in words]
    if low[0] in _PLACE_BAD_FIRST:
        return ""
    if low[0] == "the" and (len(words) < 2 or not words[1][0].isupper()):
        return ""  # "the terminal", "the moment"; "the Netherlands" is a place
    if any(w in _NOT_A_PLACE_EN for w in low) or any(p in place.lower() for p in _NOT_A_PLACE_EN_PHRASES):
        return ""
    if place.lower() in _ORG_BAD:
        return ""
    if place[0].islower() and _writer_capitalises(sentence, value_start):
        return ""  # a writer who capitalises names wrote a common noun
    return place


def _zh_place(value: str) -> str:
    """The Chinese place ``value`` names, or "" for an app, a state of mind, a room, a container."""
    if not value or value in ("这里", "那里", "这儿", "那儿", "家", "家里"):
        return ""
    if value.endswith(_ZH_CONTAINER_END) or any(w in value for w in _NOT_A_PLACE_ZH):
        return ""
    return value


_PRONOUNS_EN = re.compile(r"\b(?:i'm|i\s+am|i've|i'd|i'll|i|my|me|mine|myself|am)\b", re.I)
_PRONOUN_MAP = {"i'm": "the user is", "i am": "the user is", "i've": "the user has", "i'd": "the user would",
                "i'll": "the user will", "i": "the user", "my": "the user's", "me": "the user",
                "mine": "the user's", "myself": "themselves", "am": "is"}
_IRREGULAR = {"have": "has", "do": "does", "go": "goes", "be": "is", "am": "is", "was": "was", "can": "can",
              "will": "will", "would": "would", "should": "should", "could": "could", "must": "must",
              "may": "may", "might": "might"}
_PAST_OR_FIXED = re.compile(r"(?:ed|'t)$")


def _third_person_verb(verb: str) -> str:
    low = verb.lower()
    if low in _IRREGULAR:
        return _IRREGULAR[low]
    if _PAST_OR_FIXED.search(low) or not low.isalpha():
        return verb
    if low.endswith(("s", "sh", "ch", "x", "z", "o")):
        return verb + "es"
    if len(low) > 2 and low.endswith("y") and low[-2] not in "aeiou":
        return verb[:-1] + "ies"
    return verb + "s"


def _en_to_third_person(clause: str) -> str:
    """First person to "the user": "my sister lives in Rome" -> "the user's sister lives in Rome"."""

    def repl(m: re.Match[str]) -> str:
        return _PRONOUN_MAP[" ".join(m.group(0).lower().split())]

    out = _PRONOUNS_EN.sub(repl, clause)
    # "the user have a dog" -> "the user has a dog" (only the verb right after "the user").
    return re.sub(r"\bthe user (\w+)", lambda m: "the user " + (
        m.group(1) if m.group(1) in ("is", "has", "would", "will", "does") else _third_person_verb(m.group(1))
    ), out)


def _zh_to_third_person(clause: str) -> str:
    return re.sub(r"我(?!们)", "用户", clause)


def _sentence_text(text: str) -> str:
    text = " ".join(text.split()).strip(" ,;:")
    if not text:
        return ""
    if _is_zh(text):
        text = text.rstrip(".!。！~")
        body = text if len(text) < MAX_TEXT_CHARS else text[: MAX_TEXT_CHARS - 2]
        return body + "。"
    text = text[0].upper() + text[1:]
    text = text.rstrip(".!~ ")
    if len(text) >= MAX_TEXT_CHARS:
        text = text[: MAX_TEXT_CHARS - 4].rstrip() + "..."
    return text + "."


def _cand(kind: str, subject: str, text: str, confidence: float, importance: float,
          valid_until_days: int | None = None, value: str = "") -> RuleCandidate | None:
    text = _sentence_text(text)
    if not text:
        return None
    return RuleCandidate(kind=kind, subject=subject, text=text, confidence=round(confidence, 2),  # type: ignore[arg-type]
                         importance=round(importance, 2), valid_until_days=valid_until_days,
                         value=value.strip() if subject else "")


# --------------------------------------------------------------------------------------
# E-mail and phone
# --------------------------------------------------------------------------------------

_EMAIL_LOCAL_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789!#$%&'*+/=?^_`{|}~-.")
_EMAIL_DOMAIN_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-.")
_EMAIL = re.compile(
    r"[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]{1,64}(?:\.[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]{1,64}){0,8}"
    r"@(?:[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?\.){1,8}[A-Za-z]{2,24}"
)


def _emails(sentence: str) -> list[tuple[int, str]]:
    """E-mail addresses (RFC 5322 dot-atom local part, LDH domain labels), by position.

    Scans around each ``@`` (at most :data:`_MAX_EMAILS` of them) instead of searching the
    whole text with the pattern, which would be quadratic on long runs of address characters.
    """
    found: list[tuple[int, str]] = []
    at = sentence.find("@")
    seen = 0
    while at != -1 and seen < _MAX_EMAILS:
        seen += 1
        left = at
        while left > 0 and at - left < 64 and sentence[left - 1] in _EMAIL_LOCAL_CHARS:
            left -= 1
        right = at + 1
        while right < len(sentence) and right - at <= 253 and sentence[right] in _EMAIL_DOMAIN_CHARS:
            right += 1
        local = sentence[left:at].lstrip(".'")
        domain = sentence[at + 1 : right].rstrip(".-")
        addr = f"{local}@{domain}"
        if _EMAIL.fullmatch(addr) and ".." not in addr:
            found.append((at - len(local), addr))
        at = sentence.find("@", at + 1)
    return found


_PHONE = re.compile(r"(?<![0-9A-Za-z+\-/.])\+?\(?\d[\d ().\-]{6,22}\d(?![0-9A-Za-z]|[.\-/]\d)")
_PHONE_KEYWORD = re.compile(r"\b(?:phone|mobile|cell|tel|telephone|number|call|text|whatsapp|reach|contact)\b|电话|手机|号码|联系|致电|微信", re.I)
_US_FORMAT = re.compile(r"(?:\+?1[ .\-]?)?(?:\(\d{3}\) ?|\d{3}[ .\-])\d{3}[ .\-]\d{4}")
_CN_MOBILE = re.compile(r"(?:\+?86[ \-]?)?1[3-9]\d(?:\d{8}|[ \-]\d{4}[ \-]\d{4})")


def _phones(sentence: str) -> list[tuple[int, str]]:
    """Phone numbers by position: E.164-style with ``+``, Chinese mobiles, US formats.

    A bare run of digits is only a phone when a phone keyword is near; dates, years,
    prices, order and card numbers are not phones.
    """
    found: list[tuple[int, str]] = []
    for i, m in enumerate(_PHONE.finditer(sentence)):
        if i >= _MAX_PHONES:
            break
        raw = m.group(0).strip(" .-")
        digits = sum(c.isdigit() for c in raw)
        if raw.count("(") != raw.count(")"):
            raw = raw.lstrip("(") if raw.count("(") > raw.count(")") else raw
            if raw.count("(") != raw.count(")"):
                continue
        before = sentence[max(0, m.start() - 30) : m.start()]
        if _NOT_A_PHONE_CONTEXT.search(before):
            continue
        ok = False
        if raw.startswith("+"):
            ok = 8 <= digits <= 15
        elif _CN_MOBILE.fullmatch(raw):
            ok = True
        elif _US_FORMAT.fullmatch(raw):
            ok = True
        elif 7 <= digits <= 15 and _PHONE_KEYWORD.search(sentence[max(0, m.start() - 40) : m.start()]):
            # Bare digits or a local format right after "phone"/"电话": accept, unless it is a date.
            ok = not re.fullmatch(r"\d{4}[-./]\d{1,2}[-./]\d{1,2}|\d{1,2}[-./]\d{1,2}[-./]\d{2,4}", raw)
        if ok:
            found.append((m.start(), raw))
    return found


# --------------------------------------------------------------------------------------
# Dates
# --------------------------------------------------------------------------------------

_MONTH = (r"(?:january|february|march|april|may|june|july|august|september|october|november|december|"
          r"jan|feb|mar|apr|jun|jul|aug|sept|sep|oct|nov|dec)\b\.?")
_DATE_EN = (
    rf"(?:{_MONTH}\s{{0,2}}\d{{1,2}}(?:st|nd|rd|th)?\b(?:,?\s{{0,2}}\d{{4}})?"
    rf"|\d{{1,2}}(?:st|nd|rd|th)?\s{{0,2}}(?:of\s)?{_MONTH}(?:,?\s{{0,2}}\d{{4}})?"
    r"|\d{4}-\d{1,2}-\d{1,2}|\d{4}/\d{1,2}/\d{1,2}|\d{1,2}/\d{1,2}(?:/\d{2,4})?|\d{1,2}\.\d{1,2}\.\d{2,4})"
)
_ZH_NUM = "0-9一二三四五六七八九十〇零"
_DATE_ZH = (rf"(?:(?:\d{{4}}|[一二三四五六七八九〇零]{{4}})年)?[{_ZH_NUM}]{{1,3}}月[{_ZH_NUM}]{{1,3}}[日号]?"
            r"|\d{4}-\d{1,2}-\d{1,2}|\d{4}/\d{1,2}/\d{1,2}|\d{1,2}/\d{1,2}")

# --------------------------------------------------------------------------------------
# Patterns. Every one starts with a literal keyword; repetitions are bounded.
# --------------------------------------------------------------------------------------

_I_AM = r"\bi(?:\s?'\s?m|\s+am|m)\b"
_EN_ADV = r"(?:(?:now|currently|still|actually|also|really|just|recently|finally|already|happily|truly)\s+){0,2}"
_ZH_ADV = r"(?:现在|目前|已经|一直|还|也|其实|就|都|刚|刚刚|最近|今年|平时|长期|正|真的|确实){0,3}"

_EN_NAME = re.compile(
    rf"\b(?:my\s+(?:full\s+|first\s+|real\s+)?name\s+is|my\s+name's|{_I_AM}\s+called|i\s+go\s+by|"
    rf"(?:please\s+)?call\s+me|(?:hi|hello|hey)[,!\s]+(?:{_I_AM}|this\s+is))\s+(?P<v>[^\W\d_][\w'.\-]{{0,40}}"
    r"(?:\s[^\W\d_][\w'.\-]{0,40}){0,3})",
    re.I,
)
_ZH_NAME = re.compile(
    r"(?:我叫|我的名字(?:是|叫)|我名字(?:是|叫)|叫我|我的全名是|本人名叫|我姓名是)\s?"
    r"(?P<v>[A-Za-z][A-Za-z'\-]{0,20}(?: [A-Za-z][A-Za-z'\-]{0,20}){0,2}|[\u3400-\u9fff·]{1,6})"
)
_ZH_NAME_BAD_START = ("了", "过", "着", "什么", "啥", "一", "他", "她", "你", "车", "外卖", "人", "起")
_ZH_NAME_FOLLOW = re.compile(r"今年|在|住|来自|是|我|和|的|也|就|目前|现在|，")

_EN_JOB = re.compile(
    rf"(?:{_I_AM}\s+{_EN_ADV}|\bi\s+work\s+as\s+|\bi'?m\s+working\s+as\s+|\bi\s+am\s+working\s+as\s+)"
    r"(?P<art>an?)\s+(?P<v>[^,;:()\[\]{}\"\n!?]{1,80})",
    re.I,
)
_JOB_BAD_FIRST = frozenset("bit little lot few couple tad kind sort while fan big huge total complete real "
                           "bad good terrible mess idiot fool loser moron human person robot bot ai "
                           "member part one new quick".split())
_EN_FAN = re.compile(rf"{_I_AM}\s+(?:a\s+)?(?:big\s+|huge\s+|massive\s+)?fan\s+of\s+{_VALUE_EN}", re.I)

_EN_HOME = re.compile(
    rf"(?:\bi\s+{_EN_ADV}(?:live|reside)\s+in|{_I_AM}\s+{_EN_ADV}(?:living|based|residing)\s+in|"
    rf"\bi(?:\s?'\s?ve|\s+have)?\s+{_EN_ADV}(?:moved|relocated)(?:\s+from\s+[^,;]{{1,40}}?)?\s+to|\bmy\s+home\s+is\s+(?:now\s+)?in)\s+{_VALUE_EN}",
    re.I,
)
_ZH_HOME = re.compile(rf"我{_ZH_ADV}(?:住在|居住在|住|定居在|定居|生活在|搬到了?|搬去了?|搬家到)了?\s?{_VALUE_ZH}")

_EN_WORK = re.compile(
    rf"(?:\bi\s+{_EN_ADV}work\s+(?P<prep>at|for)|{_I_AM}\s+{_EN_ADV}(?:working|employed)\s+(?P<prep2>at|for|by)|"
    rf"\bi(?:\s?'\s?ve|\s+have)?\s+{_EN_ADV}joined)\s+{_VALUE_EN}",
    re.I,
)
_ZH_WORK = re.compile(rf"我{_ZH_ADV}在(?P<v>[^,.;:()\"\n!?\s\u3002]{{1,30}}?)(?:工作|上班|任职|就职|实习)")
_ZH_WORK2 = re.compile(rf"我{_ZH_ADV}(?:就职于|任职于|供职于)\s?{_VALUE_ZH}")
_ORG_BAD = frozenset({"home", "myself", "a living", "night", "nights", "weekends", "free", "fun", "money",
                      "the moment", "it", "this", "that", "you", "them"})

_ZH_I_AM = re.compile(rf"我{_ZH_ADV}是\s?(?P<v>[^,.;:()\"\n!?\s\u3002]{{1,24}})")
_ZH_I_AM_BAD_START = ("说", "不", "否", "在", "想", "问", "觉得", "因为", "为了", "来", "从", "真的", "要", "指",
                      "准备", "打算", "认真", "开玩笑", "谁", "什么", "哪", "故意", "随便", "刚", "这么", "那么",
                      "这样", "那样", "如何", "怎", "被", "把", "对", "错", "的", "了", "个问题", "可以", "会",
                      "能", "第一次", "想问", "看", "听", "有")
_ZH_ROLE_SUFFIX = re.compile(
    r"(?:师|员|生|家|者|工|长|经理|总监|医生|老师|学生|律师|会计|护士|司机|作家|记者|博士|教授|主管|总裁|"
    r"老板|厨师|警察|军人|画家|主播|店主|创始人|负责人|合伙人|顾问|专家|开发|运营|产品|设计|翻译|编辑|研究生|本科生|"
    r"CEO|CTO|PM|HR)$"
)
_ZH_MEASURE = re.compile(r"^(?:一名|一个|一位|一枚|个|名|位)")
_ZH_SURNAMES = frozenset(
    "王李张刘陈杨黄赵吴周徐孙马朱胡郭何高林罗郑梁谢宋唐许韩冯邓曹彭曾肖田董袁潘于蒋蔡余杜叶程苏魏吕丁任沈姚卢姜崔钟谭"
    "陆汪范金石廖贾夏韦付方白邹孟熊秦邱江尹薛闫段雷侯龙史陶黎贺顾毛郝龚邵万钱严覃武戴莫孔向汤"
)

_EN_BIRTHDAY = re.compile(
    rf"\b(?:my\s+birthday\s+(?:is|'s|falls)\s+(?:on\s+)?|my\s+birthday's\s+(?:on\s+)?|my\s+date\s+of\s+birth\s+is\s+|"
    rf"i\s+was\s+born\s+(?:on\s+)?(?:the\s+)?)(?P<v>{_DATE_EN})",
    re.I,
)
_ZH_BIRTHDAY = re.compile(
    rf"(?:我的生日(?:是|在)|我生日(?:是|在)|我的出生日期是|我出生于|我(?:是)?(?=(?:{_DATE_ZH})出生))\s?(?P<v>{_DATE_ZH})"
)
_EN_DEADLINE = re.compile(
    rf"\b(?:the|my|our)\s+deadline\s+(?:is|was\s+moved\s+to|has\s+been\s+moved\s+to|is\s+now|moved\s+to)\s+"
    rf"(?:on\s+)?(?P<v>{_DATE_EN})",
    re.I,
)
_ZH_DEADLINE = re.compile(rf"(?:截止日期|截止时间|截止日|deadline|最后期限|交付日期)(?:是|在|为|改到了?|改成了?)\s?(?P<v>{_DATE_ZH})", re.I)

_EN_TEMP_PERIOD = (r"this\s+week|this\s+weekend|this\s+month|today|tonight|tomorrow|until\s+next\s+week|"
                   r"for\s+the\s+next\s+\d{1,3}\s+days|for\s+\d{1,3}\s+days|for\s+a\s+week|for\s+two\s+weeks")
_EN_TEMP = re.compile(
    rf"(?:(?P<p1>{_EN_TEMP_PERIOD})[,\s]{{1,3}})?{_I_AM}\s+(?:staying\s+|travell?ing\s+|currently\s+)?in\s+"
    rf"(?P<v>[^\W\d_][\w'.\-]{{0,30}}(?:\s[^\W\d_][\w'.\-]{{0,30}}){{0,2}}?)(?:[,\s]{{1,3}}(?P<p2>{_EN_TEMP_PERIOD}))?"
    r"(?=\s*(?:[,.;!]|$))",
    re.I,
)
_ZH_TEMP_PERIOD = r"这周|这一周|本周|这个星期|这星期|今天|今晚|明天|这个月|本月|这个周末|周末|这几天|这两天"
_ZH_TEMP = re.compile(
    rf"(?:(?P<p1>{_ZH_TEMP_PERIOD})\s?我|我\s?(?P<p2>{_ZH_TEMP_PERIOD})){_ZH_ADV}(?:人)?在\s?"
    r"(?P<v>[^,.;:()\"\n!?\s\u3002]{1,12}?)(?=出差|旅游|旅行|度假|玩|开会|$|[,.;!~\u3002])"
)

_EN_PREF = re.compile(
    r"\bi\s+(?:(?:really|just|also|generally|usually|absolutely|totally|definitely|much|kinda|still|do|truly|"
    r"personally|rather|always)\s+){0,2}(?P<verb>prefer|like|love|enjoy|adore|hate|dislike|detest|loathe)\s+"
    + _VALUE_EN,
    re.I,
)
_EN_DISLIKE = re.compile(
    r"\bi\s+(?:(?:really|just|also|generally|absolutely|totally)\s+)?(?:(?:don't|dont|do\s+not)\s+"
    r"(?:(?:really|much|particularly)\s+)?(?:like|enjoy|love)|can't\s+stand|cant\s+stand|cannot\s+stand)\s+" + _VALUE_EN,
    re.I,
)
_EN_HABIT = re.compile(r"\bi\s+(?P<adv>always|never|usually|normally|typically|often|rarely)\s+(?P<v>[a-z][^,;:()\[\]{}\"\n!?]{1,80})", re.I)
_HABIT_BAD_VERB = frozenset("said did was were had told asked meant knew thought got went came saw wanted "
                            "understood forget forgot know remember mind".split())
_PREF_BAD_VALUE = frozenset("it that this you them these those him her what how when your the idea "
                            "to know it's that's".split())
_EN_FAVORITE = re.compile(r"\bmy\s+(?:all-time\s+)?favou?rite\s+(?P<x>[a-z][a-z ]{1,30}?)\s+(?:is|are)\s+" + _VALUE_EN, re.I)
_ZH_FAVORITE = re.compile(r"我最喜欢的(?P<x>[\u3400-\u9fff]{1,6}?)(?:是|就是)\s?" + _VALUE_ZH)
_ZH_FAVORITE_KEYS = {"颜色": "color", "食物": "food", "菜": "food", "音乐": "music", "电影": "movie", "书": "book",
                     "运动": "sport", "饮料": "drink", "水果": "fruit", "动物": "animal", "歌": "song",
                     "城市": "city", "季节": "season", "歌手": "singer", "作家": "author", "球队": "team",
                     "游戏": "game", "编程语言": "programming_language", "语言": "language", "花": "flower"}
_ZH_PREF = re.compile(
    rf"我{_ZH_ADV}(?P<verb>更喜欢|比较喜欢|很喜欢|非常喜欢|特别喜欢|超喜欢|喜欢|偏好|偏爱|热爱|爱|不太喜欢|不喜欢|很讨厌|讨厌|"
    r"受不了|习惯|通常|总是|从不|从来不)\s?" + _VALUE_ZH
)
_ZH_PREF_BAD_VALUE = ("你", "他", "她", "它", "这个", "那个", "这", "那", "吗", "上了", "问", "说")

_LANGS_EN = {"english": "English", "chinese": "Chinese", "mandarin": "Chinese", "german": "German",
             "french": "French", "spanish": "Spanish", "japanese": "Japanese", "korean": "Korean",
             "italian": "Italian", "portuguese": "Portuguese", "russian": "Russian", "arabic": "Arabic",
             "dutch": "Dutch", "swedish": "Swedish", "cantonese": "Cantonese", "hindi": "Hindi"}
_LANGS_ZH = {"中文": "中文", "汉语": "中文", "普通话": "中文", "简体中文": "中文", "繁体中文": "繁体中文",
             "英文": "英文", "英语": "英文", "德语": "德语", "德文": "德语", "法语": "法语", "法文": "法语",
             "日语": "日语", "日文": "日语", "韩语": "韩语", "西班牙语": "西班牙语", "意大利语": "意大利语",
             "俄语": "俄语", "粤语": "粤语"}
_LANG_EN_ALT = "|".join(_LANGS_EN)
_LANG_ZH_ALT = "|".join(sorted(_LANGS_ZH, key=len, reverse=True))
_EN_LANG = re.compile(
    rf"\b(?:(?:answer|reply|respond|talk|speak|communicate|chat)(?:\s+to\s+me|\s+me)?\s+(?:only\s+|always\s+)?in|"
    rf"my\s+(?:preferred|native|first|main)\s+language\s+is|i\s+prefer\s+(?:answers|replies|responses)\s+in)\s+"
    rf"(?P<lang>{_LANG_EN_ALT})\b",
    re.I,
)
_ZH_LANG = re.compile(
    rf"(?:用|说|讲|使用)(?P<lang>{_LANG_ZH_ALT})(?:来)?(?:回答|回复|答复|交流|沟通|聊天|聊|和我说话|跟我说话|和我交流|跟我交流|和我聊|跟我聊|跟我说|和我说)"
)
_EN_SHORT = re.compile(
    r"\b(?:(?:keep|make)\s+(?:your\s+|the\s+|all\s+)?(?:answers?|replies|reply|responses?|it|them|things)\s+"
    r"(?:short|brief|concise|succinct|shorter|to\s+the\s+point)|"
    r"(?:short|brief|concise|shorter|succinct|terse)\s+(?:answers?|replies|responses?)|"
    r"be\s+(?:more\s+)?(?:brief|concise|succinct|terse)|"
    r"(?:no|avoid|without|don't\s+(?:give|write)(?:\s+me)?)\s+(?:long|lengthy|verbose|wordy)\s+"
    r"(?:answers?|replies|responses?|explanations?|texts?)|"
    r"(?:answers?|replies|responses?)\s+(?:are|were)\s+(?:way\s+)?too\s+long|less\s+verbose|"
    r"keep\s+it\s+(?:short|brief))",
    re.I,
)
_EN_DETAILED = re.compile(
    r"\b(?:(?:detailed|longer|more\s+detailed|in-depth|thorough)\s+(?:answers?|replies|responses?|explanations?)|"
    r"(?:answers?|replies|responses?)\s+(?:are|were)\s+(?:way\s+)?too\s+short|"
    r"(?:keep|make)\s+(?:your\s+)?(?:answers?|replies|responses?)\s+(?:detailed|long|thorough))",
    re.I,
)
_ZH_SHORT = re.compile(
    r"(?:回答|回复|答案|说话|回应)(?:得|要|请|尽量|都|能)?(?:再)?(?:简短|简洁|简单|短|精简|简明)|"
    r"(?:简短|简洁|简明|精简)(?:一点|一些|些|点)?(?:地|的)?(?:回答|回复|答案|说)|"
    r"(?:别|不要|少)(?:太)?(?:啰嗦|废话|长篇大论)|长话短说|(?:回答|回复)(?:别|不要)(?:太)?长"
)
_ZH_DETAILED = re.compile(r"(?:回答|回复)(?:得|要|请|尽量)?(?:更)?(?:详细|具体|详尽)|(?:详细|详尽)(?:一点|一些|的)(?:回答|回复)")

_EN_REMEMBER = re.compile(
    r"(?:^|[,;:]\s?)(?:(?:please|pls|plz|and|also|ok|okay|hey|so|now|just|oh|btw|can\s+you|could\s+you|would\s+you|"
    r"will\s+you)\s+){0,3}(?:remember|memori[sz]e|keep\s+in\s+mind|make\s+a\s+note(?:\s+of)?|take\s+note(?:\s+of)?|"
    r"note\s+down|don't\s+forget|dont\s+forget|do\s+not\s+forget|never\s+forget)\b[\s:,]*(?:that\s+)?"
    r"(?P<v>[^\n]{0,300})",
    re.I,
)
_ZH_REMEMBER = re.compile(
    r"(?<!我)(?<!我会)(?<!我要)(?<!我没)(?:请你|请|帮我|你|麻烦|给我)?(?:记住|记一下|记下|记着|记好|牢记|别忘了|不要忘了|不要忘记|别忘记)"
    r"[:,\s]*(?P<v>[^\n]{0,200})"
)
_REMEMBER_EMPTY = frozenset({"", "me", "it", "this", "that", "this please", "that please", "了", "这个", "这一点",
                             "这点", "吧", "哦", "啊", "it please"})

_EN_FORGET_ME = re.compile(
    r"\b(?:forget|erase|delete|wipe|remove|clear|purge)\s+(?:(?:all|everything|all\s+of)\s+)?"
    r"(?:(?:that\s+)?(?:you\s+know|you've\s+stored|you\s+have\s+stored|you\s+have|you\s+remember|stored|saved|"
    r"you've\s+saved|you\s+saved)\s+)?"
    r"(?:about\s+me|me|my\s+(?:personal\s+)?(?:data|memories|memory|information|info|details|profile))\b"
    r"(?!\s+(?:from\s+the|to\s+the|on\s+the|in\s+the|know|when|if))",
    re.I,
)
_ZH_FORGET_ME = re.compile(
    r"(?<!我)(?<!我都)(?:忘记|忘掉|忘了|删除|删掉|清除|清空|抹去|抹掉)(?:掉)?(?:关于我的|我的|和我有关的)(?:一切|所有|全部)?(?:的)?"
    r"(?:记忆|数据|信息|资料|一切|事情|东西|内容|记录)|(?<!我)(?:忘记|忘掉|忘了)(?:关于)?我(?:吧|吧。)?(?=$|[,.!~\u3002])"
)
_FORGET_NEG = re.compile(r"\b(?:don't|dont|do\s+not|never|not|won't)\s+(?:\w+\s+){0,2}$|(?:别|不要|不会|不能|不许)\S{0,3}$", re.I)

_EN_CORRECTION = re.compile(
    r"(?:^|[,;:]\s?)(?:actually|correction|i\s+meant|to\s+correct|let\s+me\s+correct|sorry,?\s+i\s+meant|"
    r"no,\s?(?:it's|it\s+is|my|i|that's|the)|that's\s+(?:wrong|not\s+right|incorrect|outdated)|"
    r"not\s+anymore|no\s+longer|update:)\b|\bi(?:\s?'\s?ve|\s+have)?\s+(?:just\s+|recently\s+)?(?:moved|relocated|changed)\b|"
    r"\bnot\s+\w[\w ]{0,30}?,?\s+but\b|\bit's\s+now\b|\bis\s+now\b|\bchanged\s+(?:it\s+)?to\b"
    r"|\b(?:anymore|any\s+more|no\s+longer)\b",
    re.I,
)
_ZH_CORRECTION = re.compile(r"不对|其实|纠正一下|纠正|更正|搞错了|说错了|弄错了|我搬到|我搬去|搬家了|改成|改为|换成|不是[^,.]{1,20}?而是|现在是|已经不")
_EN_PREF_TRIGGER = re.compile(
    r"\bi\s+(?:(?:really|just|also|generally|usually|absolutely|totally|definitely|much|still|do|personally)\s+){0,2}"
    r"(?:prefer|like|love|enjoy|adore|hate|dislike|detest|loathe|always|never|usually)\b|"
    r"\bi\s+(?:don't|dont|do\s+not)\s+(?:really\s+)?(?:like|enjoy|love)\b|\bi\s+can'?t\s+stand\b|"
    r"\bmy\s+favou?rite\b|\bi'?d\s+rather\b|\bfan\s+of\b",
    re.I,
)
_ZH_PREF_TRIGGER = re.compile(r"我[^,.!?]{0,4}?(?:喜欢|偏好|偏爱|热爱|讨厌|习惯|受不了|爱吃|爱喝|爱看|爱听|不爱)|我最喜欢|我通常|我总是|我从不|我一般")
_EN_FACT_TRIGGER = re.compile(
    rf"{_I_AM}\s|\bmy\s+[\w' -]{{1,30}}?\s+(?:is|are|was|'s)\b|\bmy\s+\w+'s\b|\bi\s+{_EN_ADV}(?:work|live|moved|have|"
    r"was\s+born|study|studied|grew\s+up|speak|own|use|drive|teach|run|manage|lead)\b|\bi've\s+(?:got|been|moved)\b",
    re.I,
)
_EN_FACT_NOISE = re.compile(
    rf"^(?:(?:hi|hello|hey|oh|ok|okay|well|yes|yeah|no)[,!\s]+)?{_I_AM}\s+(?:(?:so|very|really|just|a\s+bit|quite|too)\s+)?"
    r"(?:fine|good|great|ok|okay|well|tired|here|back|sorry|not\s+sure|done|happy|glad|sad|bored|busy|hungry|"
    r"excited|ready|confused|lost|curious|thinking|wondering|going|trying|looking|asking|kidding|joking|"
    r"listening|in|on|afraid|sure)\b",
    re.I,
)
_ZH_FACT_TRIGGER = re.compile(
    rf"我{_ZH_ADV}(?:是(?!说|不是|否|在问|想|问|不|因为|为了)|叫(?!什么|啥|了)|姓|住|居住|定居|来自|搬|出生|毕业于|就职|任职|有一|有个|有两|养了|养)|我的[^,.!?]{{1,10}}?(?:是|叫|在)|"
    rf"我{_ZH_ADV}在[^,.!?]{{1,20}}?(?:工作|上班|读书|上学|实习)"
)
_SMALL_TALK = re.compile(
    r"^(?:(?:hi|hello|hey|yo|hiya|howdy|greetings|good\s+(?:morning|afternoon|evening|night)|morning|"
    r"thanks|thank\s+you|thank\s+you\s+so\s+much|thx|ty|cheers|ok|okay|k|kk|cool|great|nice|awesome|perfect|"
    r"sounds\s+good|got\s+it|sure|yes|yeah|yep|no|nope|lol|lmao|haha+|hehe+|bye|goodbye|see\s+you|"
    r"how\s+are\s+you|what's\s+up|how's\s+it\s+going|nice\s+weather|(?:nice|lovely|beautiful|terrible|awful|"
    r"great)\s+(?:weather|day)(?:\s+today)?|it's\s+(?:so\s+)?(?:hot|cold|sunny|rainy|raining)(?:\s+today)?|"
    r"(?:the\s+)?weather\s+is\s+(?:so\s+)?(?:nice|good|great|bad|terrible|lovely)(?:\s+today)?|"
    r"你好|您好|嗨|哈喽|早上好|早安|早|中午好|下午好|晚上好|晚安|谢谢|谢谢你|谢谢您|多谢|感谢|辛苦了|好的|好|好吧|行|可以|"
    r"没问题|嗯+|哦+|噢+|哈+|呵+|嘿+|再见|拜拜|回头见|明白了?|知道了|收到|ok了?|"
    r"今天天气(?:真|很|挺|非常|好)?(?:不错|好|热|冷|棒)(?:啊|呀|呢)?|天气(?:真|很|挺)?(?:不错|好)|你好吗|最近怎么样)"
    r"(?:\s*(?:there|again|so\s+much|a\s+lot|all|everyone|man|buddy|!|,|\.|~|啊|呀|哦|呢|了|哈|啦))*)"
    r"[\s!.,~]*$",
    re.I,
)
_HAS_WORD = re.compile(r"[^\W_]")


# --------------------------------------------------------------------------------------
# Everyday first-person facts (issue 30): moves, new jobs, things stopped, "into", allergies
# --------------------------------------------------------------------------------------

_EN_MOVE_MORE = re.compile(
    rf"\b(?:i|we)(?:\s?'\s?ve|\s+have)?\s+{_EN_ADV}(?:moved|relocated)\s+(?:back\s+)?(?:from\s+[^,;]{{1,40}}?\s+)?to\s+{_VALUE_EN}",
    re.I,
)
_EN_JOB_MORE = re.compile(
    rf"\bi\s+(?:(?:just|recently|have|'ve)\s+)?(?:started|began|begun|took|got)\s+(?:a\s+)?(?:new\s+)?(?:job|position|role)\s+"
    rf"(?:at|with)\s+{_VALUE_EN}",
    re.I,
)
_EN_JOB_SINCE = re.compile(rf"\bi(?:\s?'\s?ve|\s+have)\s+been\s+(?:working|employed)\s+(?:at|for|by)\s+{_VALUE_EN}", re.I)
_EN_STOPPED = re.compile(
    rf"\bi(?:\s?'\s?ve|\s+have)?\s+{_EN_ADV}(?P<verb>stopped|quit|given\s+up|gave\s+up)\s+(?P<v>[a-z][^,;:()\[\]{{}}\"\n!?]{{1,60}})",
    re.I,
)
_EN_NO_LONGER = re.compile(r"\bi\s+(?:now\s+)?no\s+longer\s+(?P<v>[a-z][^,;:()\[\]{}\"\n!?]{1,60})", re.I)
_EN_NOT_ANYMORE = re.compile(
    r"\bi\s+(?:don't|dont|do\s+not)\s+(?P<v>[a-z][^,;:()\[\]{}\"\n!?]{1,60}?)\s+(?:anymore|any\s+more)\b", re.I
)
_EN_INTO = re.compile(rf"{_I_AM}\s+{_EN_ADV}(?:(?:very|totally|so|big)\s+)?into\s+{_VALUE_EN}", re.I)
_EN_ALLERGIC = re.compile(
    rf"(?:{_I_AM}\s+{_EN_ADV}(?:(?:very|severely|mildly|highly|slightly|deathly|a\s+bit)\s+)?allergic|"
    rf"\bi\s+(?:have|'ve\s+got|have\s+got)\s+an?\s+(?:(?:severe|mild|bad|serious|slight)\s+)?allergy)\s+to\s+{_VALUE_EN}",
    re.I,
)
_EN_ALLERGY = re.compile(
    r"\bi\s+(?:have|'ve\s+got|have\s+got)\s+(?:an?\s+)?(?:(?:severe|mild|bad|serious|slight)\s+)?"
    r"(?P<v>[a-z][a-z-]{1,20}(?:\s[a-z][a-z-]{1,20})?)\s+allerg(?:y|ies)\b",
    re.I,
)
_EN_I_AM_NAME = re.compile(r"^[Ii](?:\s?'\s?m|\s+am)\s+(?P<v>[A-Z][a-z]{1,20})(?=\s*(?:[,.!]|$))")
_NOT_A_NAME_EN = frozenset(
    "fine good great ok okay well tired here back sorry done happy glad sad bored busy hungry ready sure new "
    "american british canadian australian indian swiss irish scottish welsh dutch danish swedish norwegian finnish "
    "polish mexican brazilian german french spanish chinese japanese korean italian russian english".split()
)
_NO_LONGER_BAD = re.compile(r"(?:know|think|understand|get|see|care|mind|remember|have\s+to|need\s+to)\b", re.I)
_INTO_BAD_FIRST = frozenset("the a an my your it this that these those his her their our".split())
_CUT_ACTIVITY = _CUT_PREF + ("in", "on", "last", "since", "ago", "this", "these", "lately", "nowadays", "recently",
                             "anymore", "now", "after", "for", "because", "and")
_ZH_MOVE_MORE = re.compile(rf"我(?P<pre>[^,.!?;\s\u3002]{{0,10}}?)(?:搬到了?|搬去了?|搬家到了?|搬回了?|搬回到)\s?{_VALUE_ZH}")
_ZH_CLAUSE_HOME = re.compile(rf"[,;]\s?(?:现在|目前|也)?(?:住在|定居在|生活在)\s?{_VALUE_ZH}")
_ZH_CLAUSE_WORK = re.compile(r"[,;]\s?(?:现在|目前|也)?在(?P<v>[^,.;:()\"\n!?\s\u3002]{1,20}?)(?:工作|上班|任职|就职)")
_ZH_JOINED = re.compile(rf"我(?P<pre>[^,.!?;\s\u3002]{{0,6}}?)(?:入职了?|加入了|跳槽到了?|跳槽去了?)\s?{_VALUE_ZH}")
_ZH_NO_LONGER = re.compile(rf"我{_ZH_ADV}不再(?P<v>[^,.;:()\"\n!?\s\u3002]{{1,20}})")
_ZH_QUIT = re.compile(rf"我{_ZH_ADV}(?P<v>戒(?:掉|了)?[^,.;:()\"\n!?\s\u3002了]{{1,10}})")
_ZH_ALLERGIC = re.compile(rf"我{_ZH_ADV}对?(?P<v>[^对,.;:()\"\n!?\s\u3002]{{1,10}}?)过敏")


def _everyday_rules(s: str, c: float, add: Callable[[int, RuleCandidate | None], None]) -> None:
    """Everyday facts the rules above miss: a move with a time or an origin between "I" and
    the place ("I've moved back to Bern", "我二月底从利兹搬到爱丁堡了"), a household's move
    ("we moved to Lisbon"), a new job, clauses that go on about "I" ("我叫小戴，住在苏州"),
    things stopped ("I've stopped ...", "I don't ... anymore", "我不再...", "我戒烟了"),
    "I'm into ...", allergies, and a message that opens with "I'm <Name>,"."""
    for m in _EN_MOVE_MORE.finditer(s):
        if not _negated(s, m, False):
            place = _en_place(m.group("v"), s, m.start("v"), _CUT_PLACE)
            if place:
                add(m.start(), _cand("fact", "home_city", f"The user lives in {place}", c, 0.8, value=place))
    for m in [*_EN_JOB_MORE.finditer(s), *_EN_JOB_SINCE.finditer(s)]:
        if _negated(s, m, False):
            continue
        org = _cut_words(m.group("v"), _CUT_ORG, max_words=6)
        if org and org.lower() not in _ORG_BAD and org[0].isalnum():
            add(m.start(), _cand("fact", "employer", f"The user works at {org}", c, 0.75, value=org))
    for m in _EN_STOPPED.finditer(s):
        v = _cut_words(m.group("v"), _CUT_ACTIVITY, max_words=8)
        if v and not _negated(s, m, False) and v.split()[0].lower() not in _PREF_BAD_VALUE:
            verb = " ".join(m.group("verb").lower().split())
            verb = {"stopped": "has stopped", "given up": "has given up"}.get(verb, verb)
            what = _en_to_third_person(v).replace("the user's", "their")
            add(m.start(), _cand("fact", "", f"The user {verb} {what}", c, 0.6))
    for rx in (_EN_NO_LONGER, _EN_NOT_ANYMORE):
        for m in rx.finditer(s):
            v = _cut_words(m.group("v"), _CUT_ACTIVITY, max_words=8)
            words = v.split()
            if not words or _NO_LONGER_BAD.match(v) or _EN_NEG.search(s[_clause_start(s, m.start()) : m.start()]):
                continue
            clause = " ".join([_third_person_verb(words[0])] + words[1:])
            add(m.start(), _cand("fact", "", f"The user no longer {_en_to_third_person(clause)}", c, 0.6))
    for m in _EN_INTO.finditer(s):
        v = _cut_words(m.group("v"), _CUT_ACTIVITY, max_words=6)
        if v and v.split()[0].lower() not in _INTO_BAD_FIRST and not _negated(s, m, False):
            add(m.start(), _cand("preference", "", f"The user is into {v}", c, 0.6))
    for m in _EN_ALLERGIC.finditer(s):
        v = _cut_words(m.group("v"), _CUT_COMMON, max_words=5)
        if v and not _negated(s, m, False):
            add(m.start(), _cand("fact", "", f"The user is allergic to {_en_to_third_person(v)}", c, 0.8))
    for m in _EN_ALLERGY.finditer(s):
        if not _negated(s, m, False) and m.group("v").split()[0].lower() not in _INTO_BAD_FIRST | {"no", "any"}:
            add(m.start(), _cand("fact", "", f"The user has a {m.group('v').lower()} allergy", c, 0.8))
    m = _EN_I_AM_NAME.search(s)
    if m is not None and m.group("v").lower() not in _NOT_A_NAME_EN:
        add(m.start(), _cand("fact", "name", f"The user's name is {m.group('v')}", c, 0.9, value=m.group("v")))
    _everyday_zh(s, c, add)


def _everyday_zh(s: str, c: float, add: Callable[[int, RuleCandidate | None], None]) -> None:
    """The Chinese half of :func:`_everyday_rules`."""
    for m in _ZH_MOVE_MORE.finditer(s):
        if _THIRD_PARTY_ZH.search(m.group("pre")) or _negated(s, m, True):
            continue
        place = _zh_place(_cut_zh(m.group("v")))
        if place:
            add(m.start(), _cand("fact", "home_city", f"用户住在{place}", c, 0.8, value=place))
    for m in _ZH_JOINED.finditer(s):
        if _THIRD_PARTY_ZH.search(m.group("pre")) or _negated(s, m, True):
            continue
        org = _cut_zh(m.group("v"), keep_de=True)
        if org:
            add(m.start(), _cand("fact", "employer", f"用户在{org}工作", c, 0.75, value=org))
    if s.startswith("我") and not s.startswith("我们"):
        # "我叫小戴，住在苏州，在一家银行上班": the later clauses are still about "我".
        for rx, subject in ((_ZH_CLAUSE_HOME, "home_city"), (_ZH_CLAUSE_WORK, "employer")):
            for m in rx.finditer(s):
                if _THIRD_PARTY_ZH.search(s[: m.start()]) or _negated(s, m, True):
                    continue
                value = _cut_zh(m.group("v"), keep_de=subject == "employer")
                value = _zh_place(value) if subject == "home_city" else value
                if value:
                    text = f"用户住在{value}" if subject == "home_city" else f"用户在{value}工作"
                    add(m.start(), _cand("fact", subject, text, c, 0.8 if subject == "home_city" else 0.75, value=value))
    for m in _ZH_NO_LONGER.finditer(s):
        v = _cut_zh(m.group("v"))
        if v and not _ZH_NEG.search(_ZH_NOT_NEG.sub("", s[_clause_start(s, m.start()) : m.start()])):
            add(m.start(), _cand("fact", "", f"用户不再{v}", c, 0.6))
    for m in _ZH_QUIT.finditer(s):
        v = _cut_zh(m.group("v"))
        if len(v) >= 2 and not _negated(s, m, True):
            add(m.start(), _cand("fact", "", f"用户已经{v}", c, 0.6))
    for m in _ZH_ALLERGIC.finditer(s):
        v = m.group("v")
        if not (_ZH_NEG.search(v) or _THIRD_PARTY_ZH.search(v) or _negated(s, m, True)):
            add(m.start(), _cand("fact", "", f"用户对{v}过敏", c, 0.8))


_STATED_HOME_EN = re.compile(
    rf"^(?:(?:the\s+)?user\s+)?(?:(?:now|currently|still)\s+)?(?:lives|resides|is\s+living|is\s+based)\s+in\s+{_VALUE_EN}", re.I
)
_STATED_WORK_EN = re.compile(rf"^(?:(?:the\s+)?user\s+)?(?:(?:now|currently|still)\s+)?works\s+(?:at|for)\s+{_VALUE_EN}", re.I)
_STATED_HOME_ZH = re.compile(rf"^(?:用户)?(?:现在|目前|一直)?(?:住在|居住在|定居在|生活在)\s?{_VALUE_ZH}")
_STATED_WORK_ZH = re.compile(r"^用户(?:现在|目前)?在(?P<v>[^,.;:()\"\n!?\s\u3002]{1,30}?)(?:工作|上班|任职|就职)")


def stated_subject(text: str) -> tuple[str, str]:
    """The single-valued subject a stored third-person statement is about, and its value:
    ``"User lives in Bern."`` -> ``("home_city", "Bern")``, ``"用户在腾讯工作。"`` ->
    ``("employer", "腾讯")``. For memories written without a subject (by a model that gave
    none, the CLI, the API): with one, a later value of the same subject ("I moved to
    Zurich last month." -> ``home_city`` Zurich) supersedes them (issue 30).

    Only a text that opens with the statement counts (the user's, or no one named:
    ``"Lives in Bern."``); anything else, someone else's home included, is ``("", "")``.

    Args:
        text: a memory text.

    Returns:
        ``(subject, value)``: ``home_city`` or ``employer`` and the value as written, or
        ``("", "")``. Never raises.
    """
    try:
        norm = _normalize(text)
        m = _STATED_HOME_EN.match(norm)
        if m is not None:
            place = _en_place(m.group("v"), norm, m.start("v"), _CUT_PLACE)
            return ("home_city", place) if place else ("", "")
        m = _STATED_WORK_EN.match(norm)
        if m is not None:
            org = _cut_words(m.group("v"), _CUT_ORG, max_words=6)
            return ("employer", org) if org and org.lower() not in _ORG_BAD and org[0].isalnum() else ("", "")
        m = _STATED_HOME_ZH.match(norm)
        if m is not None:
            place = _zh_place(_cut_zh(m.group("v")))
            return ("home_city", place) if place else ("", "")
        m = _STATED_WORK_ZH.match(norm)
        if m is not None:
            org = _cut_zh(m.group("v"), keep_de=True)
            return ("employer", org) if org else ("", "")
    except Exception:  # noqa: BLE001 - a stored text must never fail a write
        pass
    return "", ""


# --------------------------------------------------------------------------------------
# Extraction
# --------------------------------------------------------------------------------------


def _en_name(value: str, original_sentence: str, m: re.Match[str]) -> str:
    name = _cut_words(value, _CUT_NAME, max_words=4)
    if not name:
        return ""
    first = name.split()[0]
    if first.lower() in {"not", "what", "that", "this", "it", "so", "very", "really", "going", "gonna", "back",
                         "later", "tomorrow", "anytime", "when", "if", "maybe", "sometimes", "just", "actually",
                         "tonight", "soon", "again", "now", "whatever", "anything", "whenever", "someone",
                         "called", "named", "fine", "good", "here"}:
        return ""
    # "call me later", "hi, I'm tired": without "my name is" the name must be capitalised.
    keyword = m.group(0)[: m.start("v") - m.start()].lower()
    if "name" not in keyword and "called" not in keyword and "go by" not in keyword:
        if not (first[0].isupper() or not first[0].isascii()):
            return ""
        kept = [first]
        for w in name.split()[1:]:
            if not (w[0].isupper() or not w[0].isascii()):
                break
            kept.append(w)
        name = " ".join(kept)
    return name


def _zh_name(value: str) -> str:
    if value.startswith(_ZH_NAME_BAD_START):
        return ""
    if _is_zh(value):
        m = _ZH_NAME_FOLLOW.search(value, 1)
        if m:
            value = value[: m.start()]
        value = value[:4].rstrip(_ZH_TRAIL)
    return value.strip()


def _extract_sentence(s: str, out: list[tuple[int, RuleCandidate]], conf_boost: float = 0.0, everyday: bool = True) -> None:
    """Apply the statement rules to one non-question sentence; appends (position, candidate).

    The rules run in a fixed order (contacts, name, dates, home and work, jobs, temporary
    location, answer style and language, favorites, then likes and habits); a sentence that
    states an answer style, a language or a favorite gives no generic "likes" candidate.
    """
    zh = _is_zh(s)
    c = min(0.99, 0.9 + conf_boost)

    def add(pos: int, cand: RuleCandidate | None) -> None:
        if cand is not None and not _reported(s, pos):
            out.append((pos, cand))

    _contact_rules(s, zh, conf_boost, add)
    _name_rules(s, conf_boost, add)
    _date_rules(s, c, add)
    _home_and_work_rules(s, c, add)
    _job_rules(s, c, add)
    _temporary_location_rules(s, c, add)
    if everyday:
        _everyday_rules(s, c, add)
    style_found = _style_and_language_rules(s, zh, conf_boost, add)
    favorite_found = _favorite_rules(s, c, add)
    if style_found or favorite_found:
        return
    _like_rules(s, c, add)


def _contact_rules(s: str, zh: bool, conf_boost: float, add: Callable[[int, RuleCandidate | None], None]) -> None:
    """E-mail addresses and phone numbers the user gives as their own (not a third party's)."""
    before_third = _THIRD_PARTY_ZH if zh else _THIRD_PARTY_EN
    for pos, addr in _emails(s):
        if before_third.search(s[_clause_start(s, pos) : pos]):
            continue
        add(pos, _cand("fact", "email", f"用户的邮箱是{addr}" if zh else f"The user's email address is {addr}",
                       0.99, 0.9, value=addr.lower()))
    for pos, num in _phones(s):
        if before_third.search(s[_clause_start(s, pos) : pos]):
            continue
        add(pos, _cand("fact", "phone", f"用户的电话号码是{num}" if zh else f"The user's phone number is {num}",
                       min(0.99, 0.95 + conf_boost), 0.9, value=re.sub(r"[^\d+]", "", num)))


def _name_rules(s: str, conf_boost: float, add: Callable[[int, RuleCandidate | None], None]) -> None:
    """The user's name ("my name is ...", "我叫...")."""
    for m in _EN_NAME.finditer(s):
        if _negated(s, m, False):
            continue
        name = _en_name(m.group("v"), s, m)
        if name:
            add(m.start(), _cand("fact", "name", f"The user's name is {name}", min(0.99, 0.95 + conf_boost), 0.9, value=name))
    for m in _ZH_NAME.finditer(s):
        if _negated(s, m, True):
            continue
        name = _zh_name(m.group("v"))
        if name:
            add(m.start(), _cand("fact", "name", f"用户的名字是{name}", min(0.99, 0.95 + conf_boost), 0.9, value=name))


def _date_rules(s: str, c: float, add: Callable[[int, RuleCandidate | None], None]) -> None:
    """The user's birthday and deadlines."""
    for m in _EN_BIRTHDAY.finditer(s):
        if not _negated(s, m, False):
            add(m.start(), _cand("fact", "birthday", f"The user's birthday is {m.group('v').strip()}", c, 0.8, value=m.group('v')))
    for m in _ZH_BIRTHDAY.finditer(s):
        if not _negated(s, m, True):
            add(m.start(), _cand("fact", "birthday", f"用户的生日是{m.group('v')}", c, 0.8, value=m.group('v')))
    for m in _EN_DEADLINE.finditer(s):
        if not _negated(s, m, False):
            add(m.start(), _cand("fact", "", f"The user's deadline is {m.group('v').strip()}", c, 0.7))
    for m in _ZH_DEADLINE.finditer(s):
        if not _negated(s, m, True):
            add(m.start(), _cand("fact", "", f"用户的截止日期是{m.group('v')}", c, 0.7))


def _home_and_work_rules(s: str, c: float, add: Callable[[int, RuleCandidate | None], None]) -> None:
    """Where the user lives and works, and what they are a fan of."""
    for m in _EN_HOME.finditer(s):
        if _negated(s, m, False):
            continue
        place = _en_place(m.group("v"), s, m.start("v"), _CUT_PLACE)
        if place:
            add(m.start(), _cand("fact", "home_city", f"The user lives in {place}", c, 0.8, value=place))
    for m in _ZH_HOME.finditer(s):
        if _negated(s, m, True):
            continue
        place = _zh_place(_cut_zh(m.group("v")))
        if place:
            add(m.start(), _cand("fact", "home_city", f"用户住在{place}", c, 0.8, value=place))
    for m in _EN_WORK.finditer(s):
        if _negated(s, m, False):
            continue
        org = _cut_words(m.group("v"), _CUT_ORG, max_words=6)
        prep = (m.group("prep") or m.group("prep2") or "at").lower()
        if org and org.lower() not in _ORG_BAD and org[0].isalnum():
            verb = "works for" if prep == "for" else "works at"
            add(m.start(), _cand("fact", "employer", f"The user {verb} {org}", c, 0.75, value=org))
    for rx in (_ZH_WORK, _ZH_WORK2):
        for m in rx.finditer(s):
            if _negated(s, m, True):
                continue
            org = _cut_zh(m.group("v"), keep_de=True)
            if org and org not in ("家", "家里", "这里", "那里", "这儿", "外地", "国外"):
                add(m.start(), _cand("fact", "employer", f"用户在{org}工作", c, 0.75, value=org))
    for m in _EN_FAN.finditer(s):
        if _negated(s, m, False):
            continue
        v = _cut_words(m.group("v"), _CUT_PREF, max_words=8)
        if v:
            add(m.start(), _cand("preference", "", f"The user is a fan of {_en_to_third_person(v)}", c, 0.6))


def _job_rules(s: str, c: float, add: Callable[[int, RuleCandidate | None], None]) -> None:
    """The user's job title (with an employer after it), and Chinese "我是..." statements."""
    for m in _EN_JOB.finditer(s):
        if _negated(s, m, False):
            continue
        raw = m.group("v")
        job = _cut_words(raw, _CUT_JOB, max_words=5)
        if not job or job.split()[0].lower() in _JOB_BAD_FIRST:
            continue
        add(m.start(), _cand("fact", "job_title", f"The user is {m.group('art').lower()} {job}", c, 0.75, value=job))
        rest = raw[len(job):].strip()
        at = re.match(r"(?:at|for)\s+(?P<v>.{1,80})", rest, re.I)
        if at:
            org = _cut_words(at.group("v"), _CUT_ORG, max_words=6)
            if org and org.lower() not in _ORG_BAD and org[0].isalnum():
                add(m.start() + 1, _cand("fact", "employer", f"The user works at {org}", c, 0.75, value=org))
    for m in _ZH_I_AM.finditer(s):
        v = m.group("v")
        if v.startswith(_ZH_I_AM_BAD_START) or _negated(s, m, True):
            continue
        v = _cut_zh(v, keep_de=True)
        if not v:
            continue
        if _ZH_MEASURE.match(v) or _ZH_ROLE_SUFFIX.search(v) or (v.startswith("做") and v.endswith("的")):
            subject = "job_title"
        elif 2 <= len(v) <= 3 and (v[0] in _ZH_SURNAMES or v[0] in "小老阿") and all(_is_zh(ch) for ch in v):
            add(m.start(), _cand("fact", "name", f"用户的名字是{v}", c, 0.9, value=v))
            continue
        else:
            subject = ""
        add(m.start(), _cand("fact", subject, f"用户是{v}", c, 0.75 if subject else 0.6, value=v))


def _temporary_location_rules(s: str, c: float, add: Callable[[int, RuleCandidate | None], None]) -> None:
    """Where the user is for a while ("in Rome this week"): valid for that period."""
    for m in _EN_TEMP.finditer(s):
        period = m.group("p1") or m.group("p2")
        place = m.group("v")
        if not period or _negated(s, m, False) or not (place[0].isupper() or not place[0].isascii()):
            continue
        place = _en_place(place.rstrip(".'-"), s, m.start("v"), _CUT_COMMON, max_words=3)
        if not place:
            continue
        add(m.start(), _cand("fact", "current_location", f"The user is in {place} {' '.join(period.lower().split())}", c, 0.5,
                             _en_days(period), value=place))
    for m in _ZH_TEMP.finditer(s):
        period = m.group("p1") or m.group("p2")
        place = _zh_place(_cut_zh(m.group("v")))
        if not place or _negated(s, m, True):
            continue
        add(m.start(), _cand("fact", "current_location", f"用户{period}在{place}", c, 0.5, _zh_days(period), value=place))


def _style_and_language_rules(s: str, zh: bool, conf_boost: float, add: Callable[[int, RuleCandidate | None], None]) -> bool:
    """Answer style (short or detailed) and answer language; True when one was found."""
    # Preferences: answer style and language first; they win over the generic "I like".
    style_found = False
    for rx, is_zh_rx, short in ((_EN_SHORT, False, True), (_ZH_SHORT, True, True),
                                (_EN_DETAILED, False, False), (_ZH_DETAILED, True, False)):
        m = rx.search(s)
        if m is None:
            continue
        style_found = True
        if is_zh_rx or zh:
            text = "用户希望回答简短" if short else "用户希望回答详细"
        else:
            text = "The user prefers short, concise answers" if short else "The user prefers detailed answers"
        add(m.start(), _cand("preference", "answer_style", text, min(0.99, 0.92 + conf_boost), 0.7,
                             value="concise" if short else "detailed"))
        break
    for m in _EN_LANG.finditer(s):
        if _negated(s, m, False):
            continue
        style_found = True
        lang = _LANGS_EN[m.group("lang").lower()]
        add(m.start(), _cand("preference", "preferred_language", f"The user wants answers in {lang}",
                             min(0.99, 0.92 + conf_boost), 0.7, value=lang))
    for m in _ZH_LANG.finditer(s):
        if _negated(s, m, True):
            continue
        style_found = True
        add(m.start(), _cand("preference", "preferred_language", f"用户希望用{_LANGS_ZH[m.group('lang')]}交流",
                             min(0.99, 0.92 + conf_boost), 0.7, value=_LANGS_ZH[m.group('lang')]))
    return style_found

def _favorite_rules(s: str, c: float, add: Callable[[int, RuleCandidate | None], None]) -> bool:
    """"My favorite X is Y"; True when one was found."""
    favorite_found = False
    for m in _EN_FAVORITE.finditer(s):
        if _negated(s, m, False):
            continue
        x = " ".join(m.group("x").lower().split())
        v = _cut_words(m.group("v"), _CUT_PREF, max_words=8)
        if v:
            favorite_found = True
            add(m.start(), _cand("preference", "favorite_" + x.replace(" ", "_").replace("colour", "color"),
                                 f"The user's favorite {x} is {v}", c, 0.6, value=v))
    for m in _ZH_FAVORITE.finditer(s):
        v = _cut_zh(m.group("v"))
        if v:
            favorite_found = True
            key = _ZH_FAVORITE_KEYS.get(m.group("x"), "")
            add(m.start(), _cand("preference", f"favorite_{key}" if key else "",
                                 f"用户最喜欢的{m.group('x')}是{v}", c, 0.6, value=v))
    return favorite_found

def _like_rules(s: str, c: float, add: Callable[[int, RuleCandidate | None], None]) -> None:
    """Generic likes, dislikes and habits ("I love ...", "I usually ...", "我喜欢...")."""
    for m in _EN_PREF.finditer(s):
        if _negated(s, m, False):
            continue
        v = _cut_words(m.group("v"), _CUT_PREF, max_words=12)
        if not v or v.lower() in _PREF_BAD_VALUE or v.split()[0].lower() in _PREF_BAD_VALUE - {"to"}:
            continue
        verb = m.group("verb").lower()
        if verb in ("hate", "dislike", "detest", "loathe"):
            text = f"The user dislikes {_en_to_third_person(v)}"
        else:
            text = f"The user {_third_person_verb(verb)} {_en_to_third_person(v)}"
        add(m.start(), _cand("preference", "", text, c, 0.6))
    for m in _EN_DISLIKE.finditer(s):
        v = _cut_words(m.group("v"), _CUT_PREF, max_words=12)
        if not v or v.lower() in _PREF_BAD_VALUE or v.split()[0].lower() in _PREF_BAD_VALUE - {"to"}:
            continue
        if re.match(r"(?:know|think|want|need|have|remember|mind|care|get|understand|see|agree|like\s+it)\b", v, re.I):
            continue
        add(m.start(), _cand("preference", "", f"The user does not like {_en_to_third_person(v)}", c, 0.6))
    for m in _EN_HABIT.finditer(s):
        v = _cut_words(m.group("v"), _CUT_PREF, max_words=12)
        words = v.split()
        if not words or words[0].lower() in _HABIT_BAD_VERB or words[0].lower().endswith("ed"):
            continue
        clause = " ".join([_third_person_verb(words[0])] + words[1:])
        add(m.start(), _cand("preference", "", f"The user {m.group('adv').lower()} {_en_to_third_person(clause)}",
                             c, 0.6))
    for m in _ZH_PREF.finditer(s):
        verb = m.group("verb")
        v = _cut_zh(m.group("v"), keep_de=True)
        if not v or v.startswith(_ZH_PREF_BAD_VALUE):
            continue
        prefix = s[_clause_start(s, m.start()) : m.start()]
        if _ZH_NEG.search(_ZH_NOT_NEG.sub("", prefix)):
            continue
        add(m.start(), _cand("preference", "", f"用户{verb}{v}", c, 0.6))


def _en_days(period: str) -> int:
    p = " ".join(period.lower().split())
    n = re.search(r"\d{1,3}", p)
    if n:
        return max(1, int(n.group(0)))
    if p in ("today", "tonight"):
        return 1
    if p == "tomorrow":
        return 2
    if "weekend" in p:
        return 3
    if "two weeks" in p:
        return 14
    if "month" in p:
        return 31
    return 7


def _zh_days(period: str) -> int:
    if period in ("今天", "今晚"):
        return 1
    if period == "明天":
        return 2
    if period in ("这几天", "这两天", "周末", "这个周末"):
        return 3
    if period in ("这个月", "本月"):
        return 31
    return 7


def _remember_clause(s: str) -> tuple[re.Match[str] | None, bool]:
    """The "remember ..." match of a sentence (English first), and whether it is Chinese."""
    m = _EN_REMEMBER.search(s)
    if m is not None and not _FORGET_NEG.search(s[: m.start()]):
        return m, False
    m = _ZH_REMEMBER.search(s)
    if m is not None:
        return m, True
    return None, False


def _is_remember_request(s: str) -> bool:
    m, _ = _remember_clause(s)
    if m is None:
        return False
    if m.group("v").strip(" .!,。！").lower() == "me":
        return False  # "don't forget me"
    head = s[: m.start("v")].lower()
    # "do you remember ...?" is a question about memory, not a request to store something.
    return not re.search(r"\b(?:do|did|does)\s+you\b|你还记得|你记得", head)


def _forget_me(s: str) -> bool:
    for rx in (_EN_FORGET_ME, _ZH_FORGET_ME):
        for m in rx.finditer(s):
            if not _FORGET_NEG.search(s[_clause_start(s, m.start()) : m.start()]):
                return True
    return False


def _extract_all(text: str, everyday: bool = True) -> list[RuleCandidate]:
    """:func:`_extracted` of the part of ``text`` that is read (:data:`_READ_CHARS`), as
    new candidates (a caller may change its own)."""
    return [c.model_copy(deep=True) for c in _extracted(text[:_READ_CHARS], bool(everyday))]


@functools.lru_cache(maxsize=64)
def _extracted(text: str, everyday: bool) -> tuple[RuleCandidate, ...]:
    """The candidates of ``text``, kept for the last 64 texts: a turn's message is read
    by the trigger check at its start and by the extraction after its reply (issue 31)."""
    return tuple(_extract_uncached(text, everyday))


def _extract_uncached(text: str, everyday: bool) -> list[RuleCandidate]:
    norm = _normalize(text)
    found: list[tuple[int, RuleCandidate]] = []
    offset = 0
    for s in _sentences(norm):
        offset += 1
        if _forget_me(s):
            continue
        local: list[tuple[int, RuleCandidate]] = []
        m, zh = _remember_clause(s)
        if m is not None and _is_remember_request(s):
            inner = m.group("v").strip(" :,.!?。")
            if inner.lower() not in _REMEMBER_EMPTY and _HAS_WORD.search(inner):
                _extract_sentence(inner, local, conf_boost=0.05, everyday=everyday)
                if local:
                    local = [(p, c.model_copy(update={"importance": max(c.importance, 0.8), "explicit": True}))
                             for p, c in local]
                else:
                    clause = _zh_to_third_person(inner) if (zh or _is_zh(inner)) else _en_to_third_person(inner)
                    if not (zh or _is_zh(inner)) and inner.lower().startswith("to "):
                        clause = "The user wants to remember " + clause
                    cand = _cand("fact", "", clause, 0.95, 0.8)
                    if cand is not None:
                        local.append((m.start(), cand.model_copy(update={"explicit": True})))
        elif not _is_question(s):
            _extract_sentence(s, local, everyday=everyday)
        found.extend((offset * 100_000 + p, c) for p, c in local)
    found.sort(key=lambda pc: pc[0])
    # One value per single-valued subject (the last stated wins); identical texts once.
    last_for_subject: dict[str, int] = {}
    for i, (_, c) in enumerate(found):
        if c.subject:
            last_for_subject[c.subject] = i
    result: list[RuleCandidate] = []
    seen: set[tuple[str, str]] = set()
    for i, (_, c) in enumerate(found):
        if c.subject and last_for_subject[c.subject] != i:
            continue
        key = (c.kind, c.text.casefold())
        if key in seen:
            continue
        seen.add(key)
        result.append(c)
    return result[:MAX_CANDIDATES]


def extract_by_rules(text: str, *, everyday: bool = True) -> list[RuleCandidate]:
    """Memory candidates the rules are sure of, in the order they were stated.

    Questions ("what is my name?", "我叫什么?"), negated or past statements ("I don't live
    in Bern anymore"), statements about other people and small talk give none. A message
    that asks to forget the user gives none. Within one message, a single-valued subject
    keeps only its last value.

    Args:
        text: One user message; only its first :data:`MAX_SCAN_CHARS` characters are read.
        everyday: also the everyday facts of issue 30 (moves with a time or an origin,
            new jobs, things stopped, "into", allergies; :func:`_everyday_rules`). False:
            the rules as session runs recorded before the ``memory-everyday-facts`` patch
            ran them (their replay must issue the same commands).

    Returns:
        At most :data:`MAX_CANDIDATES` candidates (deterministic for a given text); an
        empty list for anything unusable, including non-strings. Never raises.
    """
    try:
        if not isinstance(text, str) or not text:
            return []
        return _extract_all(text, everyday)
    except Exception:  # noqa: BLE001 - the write path must never fail a turn
        return []


def detect_triggers(text: str, *, everyday: bool = True) -> Triggers:
    """Which memory write triggers a user message fires (DESIGN.md "Memory": write triggers).

    Args:
        text: One user message; only its first :data:`MAX_SCAN_CHARS` characters are read.
        everyday: plain-text moves and stops ("I moved ...", "I've stopped ...", "我搬到...",
            "我不再...", also with a time or an origin before the verb) are corrections,
            and the everyday facts count (see :func:`extract_by_rules`).

    Returns:
        The triggers; all False for empty or unusable input. ``small_talk`` is only set when
        nothing else fired. Never raises.
    """
    try:
        if not isinstance(text, str) or not text:
            return Triggers()
        return _detect(text, everyday)
    except Exception:  # noqa: BLE001 - the write path must never fail a turn
        return Triggers()


_EVERYDAY_CHANGE = re.compile(
    r"\b(?:i|we)(?:\s?'\s?ve|\s+have)?\s+(?:(?:just|recently|finally|already|now)\s+)?(?:moved|relocated|stopped|quit|"
    r"given\s+up|gave\s+up)\b|\bi\s+(?:don't|dont|do\s+not)\s+[^,;.]{1,40}?\s+(?:anymore|any\s+more)\b|"
    r"我[^,.!?;\s\u3002]{0,10}?(?:搬到|搬去|搬家|搬回)|我[^,.!?;\s\u3002]{0,4}?(?:不再|戒了|戒掉)",
    re.I,
)
"""A plain-text move or stop: a change of a stored fact, worth a write after the turn."""


def _detect(text: str, everyday: bool = True) -> Triggers:
    norm = _normalize(text)
    sentences = _sentences(norm)
    t = Triggers()
    small = bool(sentences)
    for s in sentences:
        if _forget_me(s):
            t.forget_me = True
        if _is_remember_request(s):
            t.explicit = True
        question = _is_question(s)
        if not question:
            if _EN_CORRECTION.search(s) or _ZH_CORRECTION.search(s) or (everyday and _EVERYDAY_CHANGE.search(s)):
                t.correction = True
            if (_EN_PREF_TRIGGER.search(s) or _ZH_PREF_TRIGGER.search(s) or _EN_SHORT.search(s)
                    or _ZH_SHORT.search(s) or _EN_LANG.search(s) or _ZH_LANG.search(s)
                    or _EN_DETAILED.search(s) or _ZH_DETAILED.search(s)):
                t.preference = True
            if (_EN_FACT_TRIGGER.search(s) and not _EN_FACT_NOISE.search(s)) or _ZH_FACT_TRIGGER.search(s):
                t.fact = True
        if not (_SMALL_TALK.match(s) or not _HAS_WORD.search(s)):
            small = False
    if not (t.fact and t.preference):
        for c in _extract_all(text, everyday):
            if c.kind == "preference":
                t.preference = True
            else:
                t.fact = True
    if t.forget_me:
        # A request to forget is not something to extract from.
        t.explicit = t.preference = t.fact = t.correction = False
    t.small_talk = small and not (t.needs_model() or t.forget_me)
    return t
