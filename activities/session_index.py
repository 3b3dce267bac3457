"""The session index activity: per user, the sessions with created / last active /
status / title, in Redis, so that `hermes sessions` lists them fast."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from temporalio import activity

from hermes import names
from hermes.content.events import PUBLISH_TIMEOUT_SECONDS, EventLog, TurnEvent
from hermes.infra.redis_keys import is_cluster
from hermes.infra.redis_writes import report_skipped, write_or_report
from hermes.models import SessionIndexEntry
from hermes.sessions.index import queue_entry, write_entry

log = logging.getLogger("hermes.session_index")


class SessionIndexActivities:
    """Writes index rows; while Redis is unreachable it skips writes for a while, and
    reports each skipped one.

    The index is a cache (Temporal is the source of truth and `hermes sessions` rebuilds
    it), and the write runs as a local activity before a reply is delivered: so an outage
    must cost a reply at most ``timeout_seconds`` once per ``backoff_seconds``, not a
    wait on every turn, and never a failed session. A row not written (failed, or skipped
    during the backoff) is reported (:func:`hermes.infra.redis_writes.report_skipped`: a
    warning naming the session, the ``hermes.redis.writes_skipped`` metric) and the
    activity returns False (issue 27). A wait for a free pool connection is not an
    outage: it fails only this write (retried once), and starts no backoff.

    Args:
        redis: a ``redis.asyncio.Redis``, or None to keep no index.
        timeout_seconds: longest wait for one write (both tries, and any wait for a free
            pool connection).
        backoff_seconds: how long writes are skipped after a failure.
    """

    def __init__(self, redis: Any, *, timeout_seconds: float = 1.0, backoff_seconds: float = 15.0):
        self.redis = redis
        self.timeout_seconds = timeout_seconds
        self.backoff_seconds = backoff_seconds
        self._skip_until = 0.0
        self.events: EventLog | None = None
        """Where a turn's end is published as ``turn_finished``, if anywhere."""

    @activity.defn(name=names.UPDATE_SESSION_INDEX)
    async def update_session_index(self, entry: SessionIndexEntry) -> bool:
        """:meth:`write` as a local activity: the runs recorded before the session wrote
        its row through the worker's sink (``workflows.session.patches.INDEX_SINK``)."""
        return await self.write(entry)

    async def write(self, entry: SessionIndexEntry) -> bool:
        """Upsert one session's row and, when the row follows a turn's end, publish
        ``turn_finished``, both at once (together within ``timeout_seconds``, which the
        sink's wait covers: :data:`hermes.infra.sinks.SINK_WAIT_SECONDS`). Idempotent: a
        retry writes the same values. The session's sink (:mod:`hermes.infra.sinks`,
        ``SESSION_INDEX_SINK``) and the local activity of older runs both call it.

        Returns:
            True if the row was written; False if not (Redis unreachable, or skipped
            during the backoff after a failure), which is reported, never silent.
        """
        if self.events is None or entry.finished_turn is None:
            return await self._write_row(entry)
        finished = TurnEvent(
            type="turn_finished", session_id=entry.session_id, turn=entry.finished_turn,
            data={"status": entry.finished_status, "turn_count": entry.turn_count},
        )
        if (
            self.redis is not None and self.events.redis is self.redis and not is_cluster(self.redis)
            and self._skip_until <= time.monotonic()
        ):
            return await self._write_together(entry, [finished])
        # Both report their own failures; one that raised anyway must not stop the other.
        _, written = await asyncio.gather(self.events.publish_quietly([finished]), self._write_row(entry), return_exceptions=True)
        if isinstance(written, BaseException):
            log.warning("the session index row of session %r not written: %s", entry.session_id, written)
            return False
        return written

    async def _write_together(self, entry: SessionIndexEntry, events: list[TurnEvent]) -> bool:
        """The row and ``events`` in one Redis round trip (issue 31: they were two, each
        with a task of its own, at every turn's end); not on a Redis Cluster, where the
        stream's node is not the row's, and one node's failure would take the other's
        answer with it. The events are tried once (``XADD``
        is not idempotent) and reported if they did not land (or may not have); the row,
        if its part failed, is written again on its own within what is left of
        ``timeout_seconds`` (:meth:`_write_row`: reported, and the outage backoff)."""
        assert self.events is not None
        deadline, wait = time.monotonic() + self.timeout_seconds, min(self.timeout_seconds, PUBLISH_TIMEOUT_SECONDS)
        pipe = self.redis.pipeline(transaction=False)
        rows = queue_entry(pipe, entry)
        self.events.queue(pipe, events)
        try:
            async with asyncio.timeout(wait):
                answers = await pipe.execute(raise_on_error=False)
        except Exception as err:  # noqa: BLE001 - a timeout, a lost connection: each part as said above
            if isinstance(err, TimeoutError) and not str(err):
                err = TimeoutError(f"timed out after {wait:g} s")
            EventLog.report_unpublished(events, err)
            return await self._write_row(entry, timeout_seconds=deadline - time.monotonic(), earlier=err)
        failed = next((a for a in answers[rows:] if isinstance(a, Exception)), None)
        if failed is not None:
            EventLog.report_unpublished(events, failed)
        row_failed = next((a for a in answers[:rows] if isinstance(a, Exception)), None)
        if row_failed is not None:
            return await self._write_row(entry, timeout_seconds=deadline - time.monotonic(), earlier=row_failed)
        return True

    async def _write_row(
        self, entry: SessionIndexEntry, *, timeout_seconds: float | None = None, earlier: BaseException | None = None
    ) -> bool:
        """Write the row (tried twice within ``timeout_seconds``, default the index's);
        ``earlier``: how a first try with other writes failed (:meth:`_write_together`),
        reported as the reason when no time is left for another."""
        if self.redis is None:
            return False
        what = f"the session index row of session {entry.session_id!r} (turn {entry.turn_count})"
        left = self._skip_until - time.monotonic()
        if left > 0:
            report_skipped(
                "session_index", what, f"Redis failed a moment ago; writes resume in {left:.0f} s", session_id=entry.session_id
            )
            return False
        failure: list[BaseException] = [] if earlier is None else [earlier]

        async def write() -> None:
            try:
                await write_entry(self.redis, entry)
            except Exception as err:
                failure.append(err)
                raise

        timeout = self.timeout_seconds if timeout_seconds is None else timeout_seconds
        if timeout <= 0:
            report_skipped("session_index", what, earlier or "timed out", session_id=entry.session_id)
        elif await write_or_report("session_index", what, write, timeout_seconds=timeout, session_id=entry.session_id):
            return True
        if not (any(_pool_busy(err) for err in failure) or _pool_full(self.redis)):
            self._skip_until = time.monotonic() + self.backoff_seconds
            log.warning("session index: Redis failed; skipping writes for %.0f s (each one reported)", self.backoff_seconds)
        return False


def _pool_busy(err: BaseException) -> bool:
    """Whether ``err`` is redis-py's "every pool connection is in use" (a busy worker,
    not an unreachable Redis); a cluster node's full pool raises ``MaxConnectionsError``."""
    from redis.exceptions import MaxConnectionsError

    return isinstance(err, MaxConnectionsError) or "No connection available" in str(err) or "Too many connections" in str(err)


def _pool_full(redis: Any) -> bool:
    """Whether every connection of ``redis``'s pool is in use now (a write that timed out
    was waiting for one, not for Redis)."""
    pool = getattr(redis, "connection_pool", None)
    can_get = getattr(pool, "can_get_connection", None)
    try:
        return callable(can_get) and not can_get()
    except Exception:  # noqa: BLE001 - another client type: assume Redis itself failed
        return False
