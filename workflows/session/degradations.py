"""Degradations a session records in its state's ``notices`` (issue 27: "degraded without
a word"): tokens counted with a fallback encoding, memories not searched, turn events not
published, an MCP server unavailable.

One notice per kind, kept current: the same degradation turn after turn is one line
whose count and latest time go up (moved to the end, the newest notice), never a flood
that pushes the refusals of :class:`workflows.session.commands.CommandGate` out of the
``MAX_NOTICES`` kept. The count lives in the line itself, so nothing new is carried
across continue-as-new.

Plain Python; nothing here knows of Temporal.
"""

from __future__ import annotations

import re
from datetime import datetime

from workflows.session.commands import MAX_NOTICES

__all__ = ["note_degradation"]

_COUNTED = re.compile(r" \((\d+) times since (\S+)\)$")


def _prefix(kind: str) -> str:
    return f"degraded ({kind}): "


def note_degradation(notices: list[str], kind: str, detail: str, now: datetime) -> int:
    """Record degradation ``kind`` in ``notices`` (one line per kind; the newest
    ``MAX_NOTICES`` notices kept).

    Args:
        notices: the session's notice list, changed in place.
        kind: ``tokenizer``, ``memory``, ``events``, ``mcp``...
        detail: what happened this time (replaces the previous detail of the kind).
        now: the workflow's time.

    Returns:
        How many times the kind has been recorded, this time included (1: a new notice).

    Example line: ``2026-12-03T16:40:00+00:00: degraded (memory): memories were not
    searched: ... (3 times since 2026-12-03T16:30:00+00:00)``.
    """
    stamp = now.isoformat(timespec="seconds")
    marker = _prefix(kind)
    count, since = 1, stamp
    for i, line in enumerate(notices):
        if marker in line:
            counted = _COUNTED.search(line)
            count, since = (int(counted.group(1)) + 1, counted.group(2)) if counted else (2, line.split(": ", 1)[0])
            del notices[i]
            break
    suffix = f" ({count} times since {since})" if count > 1 else ""
    notices.append(f"{stamp}: {marker}{detail}{suffix}")
    del notices[:-MAX_NOTICES]
    return count
