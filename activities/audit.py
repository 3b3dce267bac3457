"""The approval audit log: every approval request, decision and verdict, across sessions.

Kept in the durable store (:mod:`hermes.infra.durable`, LanceDB table ``hermes_approval_audit``:
it must outlive a Redis loss) and in Redis, append-only and idempotent (an activity
retried after a crash writes the same entry again, not a second one):

- ``hermes:audit:approvals`` (sorted set): ``<session_id>|<entry_id>`` scored by time;
- ``hermes:audit:approval:<session_id>`` (hash): ``entry_id`` -> the entry as JSON, sealed
  (:func:`hermes.security.encryption.seal`) when encryption is on: an entry holds the tool call's
  arguments and the reason of its decision. An entry this process cannot open is left
  out of what is read, with a warning.

Reads take the durable store when there is one, else Redis.

The session's own state keeps its recent decisions too (``SessionState.decisions``);
this log outlives a session's bounded list and its workflow history retention.
"""

from __future__ import annotations

import logging
from typing import Any

from temporalio import activity

from hermes import names
from hermes.security import encryption
from hermes.content.events import EVENT_ARGUMENTS_CHARS, EventLog, TurnEvent, preview_json
from hermes.infra.durable import AUDIT, DurableStore, Record, composite_key
from hermes.models import ApprovalAuditBatch, ApprovalAuditEntry
from hermes.infra.redis_keys import AUDIT_INDEX_KEY, LEGACY_AUDIT_INDEX_KEY, audit_session_key, legacy_audit_session_key

log = logging.getLogger("hermes.audit")



async def write_audit(redis: Any, entry: ApprovalAuditEntry) -> None:
    """Write one entry (idempotent by ``entry.entry_id``), sealed when encryption is on."""
    async with redis.pipeline(transaction=True) as pipe:
        pipe.hset(audit_session_key(entry.session_id), entry.entry_id, encryption.seal(entry.model_dump_json()))
        pipe.zadd(AUDIT_INDEX_KEY, {f"{entry.session_id}|{entry.entry_id}": entry.at.timestamp()})
        await pipe.execute()


def _durable_record(entry: ApprovalAuditEntry) -> Record:
    # seq 0 for all: the order is the entry's time, then its key.
    return Record(
        key=composite_key(entry.session_id, entry.entry_id), owner=entry.session_id, at=entry.at, value=entry.model_dump_json()
    )


async def read_audit(
    redis: Any, *, session_id: str | None = None, limit: int = 100, durable: DurableStore | None = None
) -> list[ApprovalAuditEntry]:
    """The newest ``limit`` entries (of one session, or of all), oldest first: from the
    durable store when given, else from Redis.

    Raises:
        DurableStoreError: the durable store cannot be read.
    """
    if durable is not None:
        records = await durable.list(AUDIT, owner=session_id, limit=limit)
        entries = sorted((ApprovalAuditEntry.model_validate_json(r.value) for r in records), key=lambda e: (e.at, e.entry_id))
        return entries[-limit:]
    if session_id is not None:
        # Entries written before the keys were hash-tagged stay readable under their old name.
        raw = {**await redis.hgetall(legacy_audit_session_key(session_id)), **await redis.hgetall(audit_session_key(session_id))}
        opened = (_opened(session_id, entry_id, value) for entry_id, value in raw.items())
        entries = sorted((e for e in opened if e is not None), key=lambda e: (e.at, e.entry_id))
        return entries[-limit:]
    entries: list[ApprovalAuditEntry] = []
    for index, session_key in ((LEGACY_AUDIT_INDEX_KEY, legacy_audit_session_key), (AUDIT_INDEX_KEY, audit_session_key)):
        for member in await redis.zrange(index, -limit, -1):
            sid, _, entry_id = (member.decode() if isinstance(member, bytes) else member).partition("|")
            entry = _opened(sid, entry_id, await redis.hget(session_key(sid), entry_id))
            if entry is not None:
                entries.append(entry)
    return sorted(entries, key=lambda e: (e.at, e.entry_id))[-limit:]


def _opened(session_id: str, entry_id: Any, raw: Any) -> ApprovalAuditEntry | None:
    """A Redis audit value as an entry; None when absent or not openable here."""
    name = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
    text = encryption.open_quietly(raw, what=f"approval audit entry {session_id}/{name}")
    return ApprovalAuditEntry.model_validate_json(text) if text is not None else None


def approval_events(entries: list[ApprovalAuditEntry]) -> list[TurnEvent]:
    """The turn events of audit ``entries``: ``approval_requested`` for each request and
    ``approval_decided`` for each verdict (approved, rejected, expired, cancelled), each
    with the turn of its tool call (``ApprovalAuditEntry.turn``; None from a worker
    before it was recorded)."""
    events: list[TurnEvent] = []
    for e in entries:
        data: dict[str, Any] = {"tool_call_id": e.tool_call_id, "name": e.tool_name}
        if e.event == "requested":
            data.update(requester=e.requester, permission=e.permission, arguments=preview_json(e.arguments, EVENT_ARGUMENTS_CHARS))
            events.append(TurnEvent(type="approval_requested", session_id=e.session_id, turn=e.turn, data=data, at=e.at))
        elif e.event == "verdict":
            data.update(approved=e.approved, approver=e.approver, outcome=e.outcome, reason=e.reason)
            events.append(TurnEvent(type="approval_decided", session_id=e.session_id, turn=e.turn, data=data, at=e.at))
    return events


class AuditActivities:
    """Holds Redis and the durable store; ``record_approval_audit`` runs as a local activity.

    Args:
        redis: a ``redis.asyncio.Redis``, or None.
        durable: the durable store (the copy that must survive), or None: Redis alone.
    """

    def __init__(self, redis: Any, durable: DurableStore | None = None):
        self.redis = redis
        self.durable = durable
        self.events: EventLog | None = None
        """Where requests and verdicts are published as turn events, if anywhere."""

    @activity.defn(name=names.RECORD_APPROVAL_AUDIT)
    async def record_approval_audit(self, batch: ApprovalAuditBatch) -> bool:
        """Append entries to the audit log (idempotent: a retry rewrites the same ones).

        Returns:
            False when neither store is configured (nothing is written).

        Raises:
            DurableStoreError: the durable store did not take them; the workflow's retry
                policy retries.
            redis.RedisError: Redis unreachable and no durable store; idem.
        """
        if self.redis is None and self.durable is None:
            return False
        if self.durable is not None:
            await self.durable.insert(AUDIT, [_durable_record(e) for e in batch.entries])
        if self.redis is not None:
            try:
                for entry in batch.entries:
                    await write_audit(self.redis, entry)
            except Exception as err:  # noqa: BLE001
                if self.durable is None:
                    raise
                log.warning("approval audit kept durably but not in Redis: %s", err)
        if self.events is not None:
            await self.events.publish_quietly(approval_events(batch.entries))
        return True
