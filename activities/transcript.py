"""The transcript archive: the oldest messages of a long session, kept in Redis so that
the state carried across continue-as-new stays under Temporal's payload limit.

Layout: ``hermes:transcript_archive:{session_id}:{chain_id}`` is a hash from message index (its
position in the whole transcript) to the message's JSON; writes by index are idempotent,
so a retried activity never duplicates a message. Run Redis with AOF (as `hermes dev`
and `docker-compose.yml` do) so the archive survives a restart.
"""

from __future__ import annotations

from typing import Any

from temporalio import activity

from hermes import names
from hermes.models import ArchiveMessagesInput, Message, SessionCarry, SnapshotInput

ARCHIVE_KEY = "hermes:transcript_archive:{session_id}:{chain_id}"
SNAPSHOT_KEY = "hermes:snapshot:{session_id}"
"""The final snapshot of an archived session (its state, as carried across continue-as-new)."""


class TranscriptActivities:
    def __init__(self, redis: Any):
        self.redis = redis

    @activity.defn(name=names.ARCHIVE_MESSAGES)
    async def archive_messages(self, request: ArchiveMessagesInput) -> int:
        """Store messages ``first_index ..`` of the transcript.

        Returns:
            How many messages were written.

        Raises:
            RuntimeError: no Redis is configured (retried; the session keeps its state).
        """
        if self.redis is None:
            raise RuntimeError("the transcript archive needs Redis")
        if not request.messages:
            return 0
        mapping = {str(request.first_index + i): m.model_dump_json() for i, m in enumerate(request.messages)}
        key = ARCHIVE_KEY.format(session_id=request.session_id, chain_id=request.chain_id)
        await self.redis.hset(key, mapping=mapping)
        return len(mapping)


    @activity.defn(name=names.SAVE_SNAPSHOT)
    async def save_snapshot(self, request: SnapshotInput) -> None:
        """Keep the final snapshot of a session that is being archived.

        Raises:
            RuntimeError: no Redis is configured (retried; the session stays open).
        """
        if self.redis is None:
            raise RuntimeError("the session snapshot needs Redis")
        await self.redis.set(SNAPSHOT_KEY.format(session_id=request.session_id), request.carry.model_dump_json())


async def read_snapshot(redis: Any, session_id: str) -> SessionCarry | None:
    """The snapshot an archived session left in Redis, or None."""
    raw = await redis.get(SNAPSHOT_KEY.format(session_id=session_id))
    return SessionCarry.model_validate_json(raw) if raw else None


async def read_archive(redis: Any, session_id: str, chain_id: str) -> list[Message]:
    """The archived messages of a session (``chain_id``: its state's ``chain_id``), in order."""
    raw = await redis.hgetall(ARCHIVE_KEY.format(session_id=session_id, chain_id=chain_id))
    items = sorted((int(k), v) for k, v in raw.items())
    return [Message.model_validate_json(v) for _, v in items]
