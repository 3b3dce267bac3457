"""Redis writes the README promises, retried once and reported when they do not land.

Three kinds of Redis write are promised somewhere in the README, though none is the only
copy of anything: the content store's copies (message bodies, content kept by reference),
turn-event publication (``hermes:events:<session id>``) and the session index row. Each is
best effort (the work never fails for it), but never skipped silently (issue 27: 889
"Too many connections" were swallowed with only a log line each, or none): a write that
fails is tried once more while its time allows, and a write that still does not land is

* a ``WARNING`` log line of ``hermes.redis_writes`` naming the kind, what was skipped and
  why;
* one count per item in the ``hermes.redis.writes_skipped`` metric (attribute
  ``hermes.redis.write``: the kind), see :func:`hermes.infra.telemetry.count_skipped_redis_write`;
* one count in this process's tally (:func:`skipped_writes`) and, when the write served
  one session, in that session's (:func:`take_skipped`: the hook for a session's
  degradation notices: an activity serving the session can take it into its result);
* ``False`` from :func:`write_or_report`, so the caller can pass it on (the session index
  activity returns it).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter, OrderedDict
from collections.abc import Awaitable, Callable
from typing import Literal

from hermes.infra import telemetry

__all__ = ["RedisWrite", "report_skipped", "skipped_writes", "take_skipped", "write_or_report"]

log = logging.getLogger("hermes.redis_writes")

RedisWrite = Literal["content_store", "turn_events", "session_index"]
"""The kinds of promised Redis write (the metric's ``hermes.redis.write`` attribute)."""

_skipped: Counter[str] = Counter()
_by_session: OrderedDict[str, Counter[str]] = OrderedDict()
MAX_SESSIONS_TALLIED = 10_000
"""Sessions whose skipped writes are held for :func:`take_skipped`; the oldest go first."""


def skipped_writes() -> dict[str, int]:
    """Items of each kind of promised Redis write this process skipped since it started
    (a kind with none is absent), e.g. ``{"turn_events": 3}``."""
    return dict(_skipped)


def take_skipped(session_id: str) -> dict[str, int]:
    """Items of each kind of promised Redis write skipped for ``session_id`` since the last
    call (they are forgotten here), e.g. ``{"turn_events": 2}``; ``{}`` when none."""
    found = _by_session.pop(session_id, None)
    return dict(found) if found else {}


def report_skipped(
    kind: RedisWrite, what: str, err: BaseException | str, *, items: int = 1, session_id: str | None = None
) -> None:
    """Report a promised Redis write that did not land: a warning log line, the metric
    and the tally (see the module docstring).

    Args:
        kind: which kind of write.
        what: what was not written, for the log (e.g. ``"3 turn events of session s1"``).
        err: why (an exception, or a sentence).
        items: how many items (events, values, rows) it held; at least 1 is counted.
        session_id: the session it served, if one (see :func:`take_skipped`).
    """
    items = max(int(items), 1)
    _skipped[kind] += items
    if session_id is not None:
        _by_session.setdefault(session_id, Counter())[kind] += items
        _by_session.move_to_end(session_id)
        while len(_by_session) > MAX_SESSIONS_TALLIED:
            _by_session.popitem(last=False)
    telemetry.count_skipped_redis_write(kind, items)
    why = f"{type(err).__name__}: {err}" if isinstance(err, BaseException) else err
    log.warning("Redis write skipped (%s): %s not written (%s)", kind, what, why)


async def write_or_report(
    kind: RedisWrite,
    what: str,
    write: Callable[[], Awaitable[object]],
    *,
    timeout_seconds: float,
    attempts: int = 2,
    items: int = 1,
    session_id: str | None = None,
) -> bool:
    """Run ``write`` (an idempotent Redis write); if it fails, run it again while
    ``attempts`` and ``timeout_seconds`` allow; if it never lands, :func:`report_skipped`.

    Args:
        kind: which kind of write.
        what: what it writes, for the report.
        write: makes the write's awaitable (called once per attempt).
        timeout_seconds: the longest time all attempts together take (a wait for a pool
            connection included).
        attempts: at most this many tries.
        items: how many items it writes (counted when skipped).
        session_id: the session it serves, if one (see :func:`take_skipped`).

    Returns:
        True if it landed; False if it was skipped (and reported). Never raises for a
        failed write (``asyncio.CancelledError`` still propagates).
    """
    deadline = time.monotonic() + timeout_seconds
    error: BaseException | str = "no attempt made"
    for _ in range(max(attempts, 1)):
        left = deadline - time.monotonic()
        if left <= 0:
            break
        try:
            # asyncio.timeout, not wait_for: on Python 3.11 wait_for runs the write as a
            # task of its own, and every turn makes dozens of these writes.
            async with asyncio.timeout(left):
                await write()
            return True
        except TimeoutError as err:
            error = err if str(err) else f"timed out after {timeout_seconds:g} s"
            break
        except Exception as err:  # noqa: BLE001 - reported below, never raised: best effort by contract
            error = err
    report_skipped(kind, what, error, items=items, session_id=session_id)
    return False
