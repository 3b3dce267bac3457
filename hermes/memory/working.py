"""Working memory: facts of the current task, kept in the session (seed 004 §7.2).

A query tool's result is not written to long-term memory; its identifiers (order numbers,
ticket ids: tokens with both letters and digits) are kept in the session as working items.
Each later turn whose user message or reply names one counts a reference; at 3 references
the item is promoted to long-term memory. Pure functions: they run in workflow code.
"""

from __future__ import annotations

import json
import re
from typing import Any

from hermes.memory.models import WorkingItem

MAX_ITEMS = 20
"""Working items a session keeps (the oldest go first)."""
MAX_KEYS_PER_RESULT = 3
_KEY = re.compile(r"(?<![\w-])(?=[\w-]*\d)(?=[\w-]*[A-Za-z])[A-Za-z0-9][A-Za-z0-9_-]{3,39}(?![\w-])")


def _preview(data: Any, limit: int = 160) -> str:
    try:
        text = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False, default=str)
    except (TypeError, ValueError, RecursionError):
        text = str(data)
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def items_from_tool_result(tool: str, data: Any, turn: int) -> list[WorkingItem]:
    """Working items for a successful tool result: one per identifier in it (at most 3)."""
    text = _preview(data, 4000)
    keys: list[str] = []
    for match in _KEY.finditer(text):
        key = match.group(0)
        if key.casefold() not in {k.casefold() for k in keys} and not re.fullmatch(r"\d{4}-\d{2}(-\d{2})?", key):
            keys.append(key)
        if len(keys) >= MAX_KEYS_PER_RESULT:
            break
    return [WorkingItem(key=k, text=f"{tool} result: {_preview(data)}", tool=tool, turn=turn) for k in keys]


def add_items(items: list[WorkingItem], new: list[WorkingItem]) -> list[WorkingItem]:
    """``items`` with ``new`` added (a key already held is kept, not repeated), capped."""
    known = {i.key.casefold() for i in items}
    out = list(items) + [n for n in new if n.key.casefold() not in known]
    return out[-MAX_ITEMS:]


REFERENCE_SCAN_CHARS = 16_384
"""Only the first this-many characters of each text are searched for references: this
runs in workflow code, whose work must not grow with a message's size (issue 12)."""


def note_references(
    items: list[WorkingItem],
    texts: list[str],
    turn: int,
    promote_at: int = 3,
    scan_chars: int | None = REFERENCE_SCAN_CHARS,
) -> list[WorkingItem]:
    """Count one reference per item named in ``texts`` this ``turn`` (not the turn that
    made it; in the first ``scan_chars`` characters of each text, None: all); returns
    the items that reach ``promote_at`` now (marked promoted)."""
    joined = "\n".join(t[:scan_chars] if scan_chars is not None else t for t in texts).casefold()
    promoted = []
    for item in items:
        if item.promoted or item.turn >= turn or item.last_ref_turn == turn:
            continue
        if re.search(r"(?<![\w-])" + re.escape(item.key.casefold()) + r"(?![\w-])", joined):
            item.refs += 1
            item.last_ref_turn = turn
            if item.refs >= promote_at:
                item.promoted = True
                promoted.append(item)
    return promoted
