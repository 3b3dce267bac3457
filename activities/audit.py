"""The approval audit log: every approval request, decision and verdict, across sessions.

Kept in Redis, append-only and idempotent (an activity retried after a crash writes
the same entry again, not a second one):

- ``hermes:audit:approvals`` (sorted set): ``<session_id>|<entry_id>`` scored by time;
- ``hermes:audit:approval:<session_id>`` (hash): ``entry_id`` -> the entry as JSON.

The session's own state keeps its recent decisions too (``SessionState.decisions``);
this log outlives a session's bounded list and its workflow history retention.
"""

from __future__ import annotations

import logging
from typing import Any

from temporalio import activity

from hermes import names
from hermes.models import ApprovalAuditBatch, ApprovalAuditEntry

log = logging.getLogger("hermes.audit")

AUDIT_INDEX_KEY = "hermes:audit:approvals"


def audit_session_key(session_id: str) -> str:
    return f"hermes:audit:approval:{session_id}"


async def write_audit(redis: Any, entry: ApprovalAuditEntry) -> None:
    """Write one entry (idempotent by ``entry.entry_id``)."""
    async with redis.pipeline(transaction=True) as pipe:
        pipe.hset(audit_session_key(entry.session_id), entry.entry_id, entry.model_dump_json())
        pipe.zadd(AUDIT_INDEX_KEY, {f"{entry.session_id}|{entry.entry_id}": entry.at.timestamp()})
        await pipe.execute()


async def read_audit(redis: Any, *, session_id: str | None = None, limit: int = 100) -> list[ApprovalAuditEntry]:
    """The newest ``limit`` entries (of one session, or of all), oldest first."""
    if session_id is not None:
        raw = await redis.hvals(audit_session_key(session_id))
        entries = sorted((ApprovalAuditEntry.model_validate_json(r) for r in raw), key=lambda e: (e.at, e.entry_id))
        return entries[-limit:]
    members = await redis.zrange(AUDIT_INDEX_KEY, -limit, -1)
    entries: list[ApprovalAuditEntry] = []
    for member in members:
        sid, _, entry_id = (member.decode() if isinstance(member, bytes) else member).partition("|")
        raw = await redis.hget(audit_session_key(sid), entry_id)
        if raw is not None:
            entries.append(ApprovalAuditEntry.model_validate_json(raw))
    return entries


class AuditActivities:
    """Holds the Redis client; ``record_approval_audit`` runs as a local activity."""

    def __init__(self, redis: Any):
        self.redis = redis

    @activity.defn(name=names.RECORD_APPROVAL_AUDIT)
    async def record_approval_audit(self, batch: ApprovalAuditBatch) -> bool:
        """Append entries to the audit log (idempotent: a retry rewrites the same ones).

        Returns:
            False when no Redis is configured (nothing is written).

        Raises:
            redis.RedisError: Redis unreachable; the workflow's retry policy retries.
        """
        if self.redis is None:
            return False
        for entry in batch.entries:
            await write_audit(self.redis, entry)
        return True
