"""The session index activity: per user, the sessions with created / last active /
status / title, in Redis, so that `hermes sessions` lists them fast."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from temporalio import activity

from hermes import names
from hermes.events import EventLog, TurnEvent
from hermes.models import SessionIndexEntry
from hermes.session_index import write_entry

log = logging.getLogger("hermes.session_index")


class SessionIndexActivities:
    """Writes index rows; while Redis is unreachable it skips writes for a while.

    The index is a cache (Temporal is the source of truth and `hermes sessions` rebuilds
    it), and the write runs as a local activity before a reply is delivered: so an outage
    must cost a reply at most ``timeout_seconds`` once per ``backoff_seconds``, not a
    wait on every turn, and never a failed session.

    Args:
        redis: a ``redis.asyncio.Redis``, or None to keep no index.
        timeout_seconds: longest wait for one write.
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
        """Upsert one session's row. Idempotent: a retry writes the same values.

        Returns:
            True if written, False if skipped or failed (Redis unreachable).
        """
        if self.events is not None and entry.finished_turn is not None:
            finished = TurnEvent(
                type="turn_finished", session_id=entry.session_id, turn=entry.finished_turn,
                data={"status": entry.finished_status, "turn_count": entry.turn_count},
            )
            await self.events.publish_quietly([finished])
        if self.redis is None or time.monotonic() < self._skip_until:
            return False
        try:
            await asyncio.wait_for(write_entry(self.redis, entry), self.timeout_seconds)
        except Exception as err:  # noqa: BLE001 - any Redis failure: skip, the index is rebuilt later
            self._skip_until = time.monotonic() + self.backoff_seconds
            log.warning("session index not updated (%s: %s); skipping writes for %.0f s", type(err).__name__, err, self.backoff_seconds)
            return False
        return True
