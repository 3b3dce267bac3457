"""Who a question and a memory are about, for the read path (issue 30).

A question about someone else ("my sister's birthday") is not answered by the user's own
memory ("Her birthday is on October 2."): :func:`hermes.memory.relevance.admit` drops a
memory that names none of the question's people. This module says who those people are,
so that the check drops what it should and only that:

- **The question's people** (:func:`query_persons`) are the kinship and role words the
  question *owns* ("my manager", "Jonas's mother", "my parents' house", and every Chinese
  kinship word: "我妈妈"), and names in the possessive. A role word used as a common
  noun is no one ("Which Python dependency manager do I use?" is not about a boss).
- **A memory's people** (:func:`memory_persons`) are its kinship and role words, the role
  phrases :func:`hermes.memory.judge.persons` does not list ("team lead", "reports to",
  "主管"), and the relations of the names it holds: the user's other memories say who a
  name is ("Has two kids, Leo (8) and Ada (5)." makes ``Ada`` one of the ``children``;
  "Now reports to Tom Brooks." makes ``Tom`` and ``Brooks`` the ``boss``), see
  :func:`name_relations`.
- **Kin words meet their family** (:func:`persons_match`): a son and a daughter are
  children, and children are a son or a daughter.

Rules only, no model: the read path stays fast (a few regular expressions per candidate).
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable, Mapping

from hermes.memory.judge import persons

__all__ = ["memory_persons", "name_relations", "named_otherwise", "persons_match", "query_persons"]

_EXTRA_ROLES: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"\b(?:team\s+lead|tech\s+lead|line\s+manager|supervisor|reports?\s+to|reporting\s+to)\b|主管|上级|上司", re.I),
     "boss"),
)
"""Role phrases beyond :func:`persons`'s words, and the relation each names."""
_FAMILY: Mapping[str, frozenset[str]] = {
    "son": frozenset({"children"}),
    "daughter": frozenset({"children"}),
    "children": frozenset({"son", "daughter"}),
}
"""Relations a kin word also meets (a son is one of the children)."""
_OWNER = re.compile(
    r"(?:\b(?:my|our|your|his|her|their)|(?<!what)(?<!that)(?<!it)(?<!who)(?<!where)(?<!here)(?<!there)(?<!how)'s|s')"
    r"\s+(?:[a-z][\w-]*\s+){0,2}$"
)
"""Text before a role word that makes it someone's: "my ", "Jonas's ", "my two little "."""
_EN_WORD = re.compile(r"[a-z][a-z-]*")
_LATIN = re.compile(r"[A-Za-z']+")
_CAPITALISED = re.compile(r"\b[A-Z][a-z]{1,20}\b")
_NOT_A_NAME = frozenset(
    "january february march april may june july august september october november december "
    "monday tuesday wednesday thursday friday saturday sunday the and has her his their our "
    "now new".split()
)


_NAME_WINDOW_CHARS = 40
"""How far after a relation word a name is looked for."""
_PLACE_WORD = re.compile(r"\b(?:in|at|to|from|near|by|on|of)\b|[.;]")


def _norm(text: str) -> str:
    return unicodedata.normalize("NFKC", text).replace("\u2019", "'")


def _extra_roles(text: str) -> set[str]:
    return {relation for rx, relation in _EXTRA_ROLES if rx.search(text)}


def query_persons(query: str) -> frozenset[str]:
    """The people a question is about, other than the user.

    Args:
        query: the question, any language.

    Returns:
        Canonical relations (``mother``, ``boss``, ``children``...) the question owns and
        casefolded names in the possessive; empty for a question about the user alone.
    """
    text = _norm(query)
    low = text.casefold()
    names = persons(text) - persons(low)  # possessive names need their capital
    found = set(names) | set(persons(_LATIN.sub(" ", text)))  # Chinese kinship words
    for m in _EN_WORD.finditer(low):
        related = persons(m.group(0))
        if related and (_OWNER.search(low[: m.start()]) or low.startswith(("'s", "s'"), m.end())):
            found |= related
    for rx, relation in _EXTRA_ROLES:
        for m in rx.finditer(low):
            if not m.group(0).isascii() or _OWNER.search(low[: m.start()]):
                found.add(relation)
    return frozenset(found)


def name_relations(texts: Iterable[str]) -> dict[str, frozenset[str]]:
    """Who the names in a user's memories are, as those memories say.

    A capitalised word (not a month, a weekday or a function word) that follows a relation
    word closely, before any place preposition ("in", "at", "to"...), is taken to be that
    relation: "Her partner Jonas is a nurse." gives ``jonas -> {partner}``, "Has two kids,
    Leo (8) and Ada (5)." ``leo`` and ``ada -> {children}``; the ``Bern`` of "lives with her
    partner and commutes to Bern" is no one.

    Args:
        texts: the user's memory texts.

    Returns:
        Casefolded name -> the relations it is named with.
    """
    out: dict[str, set[str]] = {}
    for raw in texts:
        text = _norm(raw)
        low = text.casefold()
        found = [(m.end(), persons(m.group(0))) for m in _EN_WORD.finditer(low)]
        found += [(m.end(), frozenset({relation})) for rx, relation in _EXTRA_ROLES for m in rx.finditer(low)]
        for end, relations in found:
            if not relations:
                continue
            window = text[end : end + _NAME_WINDOW_CHARS]
            cut = _PLACE_WORD.search(window)
            for m in _CAPITALISED.finditer(window[: cut.start()] if cut else window):
                word = m.group(0).casefold()
                if word not in _NOT_A_NAME:
                    out.setdefault(word, set()).update(relations)
    return {name: frozenset(relations) for name, relations in out.items()}


def memory_persons(text: str, relations_of: Mapping[str, frozenset[str]] | None = None) -> frozenset[str]:
    """The people a memory names.

    Args:
        text: the memory's text.
        relations_of: :func:`name_relations` of the user's memories (None: names count
            only as themselves).

    Returns:
        Its relations (:func:`persons`, plus role phrases), its names in the possessive,
        and the relations of the names it holds.
    """
    text = _norm(text)
    found = set(persons(text)) | _extra_roles(text)
    if relations_of:
        for m in _CAPITALISED.finditer(text):
            found |= relations_of.get(m.group(0).casefold(), frozenset())
    return frozenset(found)


def persons_match(asked: frozenset[str], named: frozenset[str]) -> bool:
    """Whether a memory naming ``named`` may answer a question about ``asked``.

    Args:
        asked: :func:`query_persons` of the question.
        named: :func:`memory_persons` of the memory.

    Returns:
        True when the question is about no one else, or the memory names one of its
        people or their family (a question about a son meets a memory about the children).
    """
    if not asked:
        return True
    wider = set(asked)
    for relation in asked:
        wider |= _FAMILY.get(relation, frozenset())
    return bool(wider & named)


def named_otherwise(asked: frozenset[str], text: str, named: frozenset[str]) -> bool:
    """Whether a memory names the question's people only in other terms than its own
    relation words: a role phrase ("my manager" / "Now reports to Tom Brooks."), the family
    ("my son" / "Has two kids, ..."), a name the user's memories relate ("my daughter" /
    "Ada starts ballet ..."). The read path takes that as a shared word; a memory naming
    the relation itself ("我先生" / "丈夫叫周航，生日是3月14日。") is not thereby about the
    question's topic.

    Args:
        asked: :func:`query_persons` of the question.
        text: the memory's text.
        named: :func:`memory_persons` of the memory.

    Returns:
        True when ``named`` meets ``asked`` and the memory's own relation words do not.
    """
    return bool(asked) and persons_match(asked, named) and not (asked & persons(_norm(text)))
