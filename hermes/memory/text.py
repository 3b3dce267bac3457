"""Memory texts: cleaning them, and the words and identifiers that tell them apart (the
lexical half of the search, the dedupe's guard against near-identical sentences)."""

from __future__ import annotations

import re

_CONTROL = re.compile(r"[\x00-\x08\x0e-\x1f\x7f-\x84\x86-\x9f]")
"""Control characters that are not whitespace (C0 and C1): terminal escapes, NUL, bells.
Whitespace ones (tab, newline, U+0085...) are collapsed by ``split``."""


def clean_text(text: str, limit: int) -> str:
    """``text`` on one line, whitespace collapsed, lone surrogates replaced, other control
    characters removed (a stored ``ESC[2J`` must not reach a terminal or a context), at
    most ``limit`` characters (cut with an ellipsis)."""
    text = " ".join(_CONTROL.sub("", text.encode("utf-8", "replace").decode("utf-8")).split())
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


_WORD = re.compile(r"[a-z]{3,}|[\u3400-\u9fff]+")
_STOP_WORDS = frozenset(
    """the and for are was were what when where which who whom whose why how you your yours
    user users this that these those with from have has had not but can could would should
    will shall may might must did does doing done any all some our ours their theirs they them
    she her his him its it's i'm i've about into over under again then than there here just
    also very much more most such only own same too please tell know remember said says
    my me mine do is am be been being of to in on at by an or as if so no yes
    day week month year time times many left get got thing things kind way still now""".split()
)
_STOP_BIGRAMS = frozenset(
    "用户 我的 你的 他的 她的 我们 你们 什么 怎么 哪里 哪儿 是不 不是 一个 这个 那个 记得 告诉 知道 一下 可以 的是 是什 "
    "时候 么时 多少 是多 哪个 在哪 哪天 现在 今年 每天 一般".split()
)
"""Besides grammar: the words of any question about a date, an amount or a place ("how many
days", "什么时候", "多少"), which a memory sharing them is not therefore about."""


def content_words(text: str) -> frozenset[str]:
    """The words of ``text`` that carry meaning, for the lexical half of the search:
    English words of 3+ letters without stop words, lightly stemmed (``lives`` -> ``live``,
    ``works`` -> ``work``); Chinese as character bigrams, without the common ones (``用户``,
    ``我的``). ``Where do I live?`` meets ``The user lives in Bern.``; ``我住在哪里`` meets
    ``用户住在苏黎世``."""
    found: set[str] = set()
    for token in _WORD.findall(text.casefold()):
        if token.isascii():
            if token in _STOP_WORDS:
                continue
            for suffix in ("ing", "ies", "ed", "s"):
                if token.endswith(suffix) and len(token) - len(suffix) >= 3:
                    token = token[: -len(suffix)] + ("y" if suffix == "ies" else "")
                    break
            if token not in _STOP_WORDS:  # "days" is "day"
                found.add(token)
        else:
            found.update(b for b in (token[i : i + 2] for i in range(len(token) - 1)) if b not in _STOP_BIGRAMS)
    return frozenset(found)


_IDENTIFIER = re.compile(r"[A-Za-z0-9-]*\d[A-Za-z0-9-]*")


def identifiers(text: str) -> frozenset[str]:
    """The tokens of ``text`` that hold a digit (numbers, dates, ids like ``L-1007``): two
    texts whose identifiers differ are never the same memory, whatever their similarity."""
    return frozenset(m.group(0).casefold().strip("-") for m in _IDENTIFIER.finditer(text))


def _norm_key(subject: str) -> str:
    return re.sub(r"[^a-z0-9_]+", "_", subject.strip().lower()).strip("_")[:64]


def _norm_value(value: str) -> str:
    return " ".join(_CONTROL.sub("", value.casefold().encode("utf-8", "replace").decode("utf-8")).split())[:200]
