"""Per-turn tool routing: offer the model only the tool groups a message is about.

Seed 000 §2.3: with 40 tools the model picks the wrong one more often; a coarse
routing step by intent that exposes only the relevant groups brought it to 5 tools
and a clearly better choice. This is that step, lexical and deterministic (it runs
inside the workflow, so the same message always routes the same way on replay):

- a group's words are its declared ``keywords``, its name, and the names of its
  tools (split on ``_``/``-``); Latin words match whole words, case-insensitively,
  and CJK keywords match as substrings (Chinese has no spaces);
- the groups with the most matches win, at most ``max_groups``;
- a message that matches nothing keeps the previous turn's groups (a follow-up such
  as "那上海呢?" stays on the weather tools), and with none of those, every tool is
  offered: routing narrows choices, it never leaves the model without a tool.

Ungrouped tools are always offered; so are the ``next_possible_tools`` of a tool
called in the turn (the workflow adds them).
"""

from __future__ import annotations

import bisect
import functools
import re
from collections.abc import Iterable

from hermes.models import ToolGroup, ToolSpec

_WORD_RE = re.compile(r"[0-9A-Za-z]+")
_CJK_RE = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff]")
_STOP = frozenset({"get", "set", "the", "a", "an", "of", "to", "list", "do", "and", "or", "for", "by", "in", "on"})


def _words(text: str) -> set[str]:
    return {w.lower() for w in _WORD_RE.findall(text)}


def group_terms(group: ToolGroup, specs: Iterable[ToolSpec]) -> set[str]:
    """The words that route a message to ``group``."""
    terms = {k.strip().lower() for k in group.keywords if k.strip()}
    terms |= {w for w in _words(group.name) if w not in _STOP and len(w) > 2}
    for spec in specs:
        if spec.group == group.name:
            terms |= {w for w in re.split(r"[_\-\s]+", spec.name.lower()) if w and w not in _STOP and len(w) > 2}
    return terms


@functools.lru_cache(maxsize=4)
def _index(text: str) -> tuple[frozenset[str], tuple[str, ...], str]:
    # Once per message, not per group: routing runs inside a workflow task, which the SDK
    # fails as deadlocked after 2 s (a 256 KB message over 30 groups took about 3 s).
    words = _words(text)
    return frozenset(words), tuple(sorted(words)), text.lower()


def score(text: str, terms: set[str]) -> int:
    """How many of ``terms`` occur in ``text`` (CJK terms as substrings, others as words)."""
    words, ordered, lowered = _index(text)
    hits = 0
    for term in terms:
        if _CJK_RE.search(term) or not _WORD_RE.fullmatch(term):
            hits += term in lowered
        elif term in words:
            hits += 1
        elif len(term) > 3:
            # A word starting with the term sorts right at or after it.
            at = bisect.bisect_left(ordered, term)
            hits += at < len(ordered) and ordered[at].startswith(term)
    return hits


def route_groups(
    text: str,
    groups: list[ToolGroup],
    specs: Iterable[ToolSpec],
    *,
    max_groups: int = 2,
    previous: list[str] | None = None,
) -> list[str] | None:
    """The groups to offer for a user message.

    Args:
        text: the user's message.
        groups: every declared group (a group named by a tool but not declared counts).
        specs: every tool.
        max_groups: at most this many groups are returned.
        previous: the groups routed last turn, kept when nothing matches.

    Returns:
        Group names, best first; ``None`` when every tool should be offered (no
        groups exist, or nothing matched and there was no previous routing).
    """
    specs = list(specs)
    names = {g.name: g for g in groups}
    for spec in specs:
        if spec.group and spec.group not in names:
            names[spec.group] = ToolGroup(name=spec.group)
    if not names:
        return None
    scored = sorted(
        ((score(text, group_terms(g, specs)), name) for name, g in names.items()),
        key=lambda pair: (-pair[0], pair[1]),
    )
    chosen = [name for hits, name in scored if hits > 0][: max(max_groups, 1)]
    if chosen:
        return chosen
    kept = [g for g in (previous or []) if g in names]
    return kept or None


def offered_tools(specs: dict[str, ToolSpec], groups: list[str] | None, extra: Iterable[str] = ()) -> list[ToolSpec]:
    """Tools offered to the model: ungrouped ones, those of ``groups`` (every tool when
    ``groups`` is None), and ``extra`` names; in registry order."""
    wanted = set(extra)
    return [
        spec
        for name, spec in specs.items()
        if groups is None or spec.group is None or spec.group in groups or name in wanted
    ]
