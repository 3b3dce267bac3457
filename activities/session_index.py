"""The session index activity: per user, the sessions with created / last active /
status / title, in Redis, so that `hermes sessions` lists them fast."""

from __future__ import annotations

from typing import Any

from temporalio import activity

from hermes import names
from hermes.models import SessionIndexEntry
from hermes.session_index import write_entry


class SessionIndexActivities:
    def __init__(self, redis: Any):
        self.redis = redis

    @activity.defn(name=names.UPDATE_SESSION_INDEX)
    async def update_session_index(self, entry: SessionIndexEntry) -> None:
        """Upsert one session's row. Idempotent: a retry writes the same values."""
        if self.redis is not None:
            await write_entry(self.redis, entry)
