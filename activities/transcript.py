"""The transcript archive and session snapshots: kept durably, with a copy in Redis.

The transcript archive holds the oldest messages of a long session, so that the state
carried across continue-as-new stays under Temporal's payload limit; it has no other copy.
A snapshot is the final state of a session archived after a long idle time (its first copy
is the final run's result, gone after the namespace's retention). Both are written to the
durable store (:mod:`hermes.infra.durable`, LanceDB: tables ``hermes_transcript`` and
``hermes_snapshots``) first, so they outlive a Redis loss, and to Redis too:

- ``hermes:transcript_archive:{session_id}:{chain_id}``: a hash from message index (its
  position in the whole transcript) to the message's JSON;
- ``hermes:snapshot:{session_id}``: the snapshot's JSON.

With a durable store, Redis' copies expire ``content_ttl_seconds`` after their last write
(``HERMES_REDIS_CONTENT_TTL_SECONDS``; the durable copy answers after that), and archiving
a session drops from Redis the content blobs its snapshot and the durable store hold
(:meth:`hermes.content.blobs.BlobStore.evict_kept`). Without one, Redis' copies are the only ones
and never expire.

Redis' copies are sealed (:func:`hermes.security.encryption.seal`) when encryption is on: they hold
messages. One this process cannot open is read as missing, with a warning (the durable
copy answers if there is one).

Writes by index (archive) and by session (snapshot) are idempotent, so a retried activity
never duplicates a message. Reads join both copies (the durable one wins), so archives
written before the durable store existed are still read.
"""

from __future__ import annotations

import logging
import re
from typing import Any

from temporalio import activity

from hermes import names
from hermes.security import encryption
from hermes.content.blobs import BlobStore, message_ref
from hermes.infra.durable import SNAPSHOTS, TRANSCRIPT, DurableStore, DurableStoreError, Record, composite_key
from hermes.models import ArchiveMessagesInput, Message, SessionCarry, SnapshotInput

log = logging.getLogger("hermes.transcript")

ARCHIVE_KEY = "hermes:transcript_archive:{session_id}:{chain_id}"
SNAPSHOT_KEY = "hermes:snapshot:{session_id}"
"""The final snapshot of an archived session (its state, as carried across continue-as-new)."""
_CONTENT_REF = re.compile(r"\bb:[0-9a-f]{32}\b")
"""A content reference (:func:`hermes.content.blobs.value_ref`) anywhere in a snapshot's JSON: in a
stand-in's header, ``arguments_ref``, ``tools_ref``."""


class TranscriptActivities:
    """Holds Redis and the durable store; registers ``archive_messages`` and ``save_snapshot``.

    Args:
        redis: a ``redis.asyncio.Redis`` (the fast copy), or None.
        durable: the durable store (the copy that must survive), or None: Redis alone.
        content_ttl_seconds: how long Redis' copies live after their last write when a
            durable copy exists; None: forever.
    """

    def __init__(self, redis: Any, durable: DurableStore | None = None, *, content_ttl_seconds: int | None = None):
        self.redis = redis
        self.durable = durable
        self.ttl_seconds = content_ttl_seconds if durable is not None else None

    async def _redis_copy(self, what: str, write: Any) -> None:
        """Write Redis' copy; with a durable copy written, a Redis failure is only logged."""
        try:
            await write()
        except Exception as err:  # noqa: BLE001
            if self.durable is None:
                raise
            log.warning("%s kept durably but not in Redis: %s", what, err)

    @activity.defn(name=names.ARCHIVE_MESSAGES)
    async def archive_messages(self, request: ArchiveMessagesInput) -> int:
        """Store messages ``first_index ..`` of the transcript.

        Returns:
            How many messages were written.

        Raises:
            RuntimeError: neither Redis nor the durable store is configured (retried; the
                session keeps its state).
            DurableStoreError: the durable store did not take them (retried, idem).
        """
        if self.redis is None and self.durable is None:
            raise RuntimeError("the transcript archive needs the durable store or Redis")
        if not request.messages:
            return 0
        texts = {request.first_index + i: m.model_dump_json() for i, m in enumerate(request.messages)}
        if self.durable is not None:
            owner = composite_key(request.session_id, request.chain_id)
            await self.durable.upsert(
                TRANSCRIPT,
                [
                    Record(key=composite_key(request.session_id, request.chain_id, index), owner=owner, seq=index, value=text)
                    for index, text in texts.items()
                ],
            )
        if self.redis is not None:
            key = ARCHIVE_KEY.format(session_id=request.session_id, chain_id=request.chain_id)
            mapping = {str(index): encryption.seal(text) for index, text in texts.items()}
            await self._redis_copy("transcript archive", lambda: self._hset(key, mapping))
        return len(texts)

    @activity.defn(name=names.SAVE_SNAPSHOT)
    async def save_snapshot(self, request: SnapshotInput) -> None:
        """Keep the final snapshot of a session that is being archived.

        Raises:
            RuntimeError: neither Redis nor the durable store is configured (retried; the
                session stays open).
            DurableStoreError: the durable store did not take it (idem).
        """
        if self.redis is None and self.durable is None:
            raise RuntimeError("the session snapshot needs the durable store or Redis")
        text = request.carry.model_dump_json()
        if self.durable is not None:
            await self.durable.upsert(SNAPSHOTS, [Record(key=request.session_id, owner=request.session_id, value=text)])
        if self.redis is not None:
            key = SNAPSHOT_KEY.format(session_id=request.session_id)
            await self._redis_copy("session snapshot", lambda: self.redis.set(key, encryption.seal(text), ex=self.ttl_seconds))
        if self.durable is not None and self.redis is not None:
            await self._evict_content(request.carry, text)

    async def _hset(self, key: str, mapping: dict[str, str]) -> None:
        pipe = self.redis.pipeline(transaction=False)
        pipe.hset(key, mapping=mapping)
        if self.ttl_seconds is not None:
            pipe.expire(key, self.ttl_seconds)
        await pipe.execute()

    async def _evict_content(self, carry: SessionCarry, text: str) -> None:
        """Drop the archived session's blobs from Redis: its messages' bodies (the snapshot
        just written durably holds them) and the content kept by reference that it names,
        if the durable store confirms it. Best effort: what stays expires with the TTL."""
        try:
            evicted = await BlobStore(self.redis, durable=self.durable).evict_kept(
                [message_ref(m) for m in carry.messages], _CONTENT_REF.findall(text)
            )
        except Exception as err:  # noqa: BLE001 - the snapshot is kept; eviction only saves memory
            log.warning("archived session's content left in Redis (it expires with the TTL): %s", err)
            return
        log.debug("archived session: %d content blob(s) dropped from Redis", evicted)


async def read_snapshot(redis: Any, session_id: str, durable: DurableStore | None = None) -> SessionCarry | None:
    """The snapshot an archived session left: from Redis, else the durable store; or None.

    Raises:
        DurableStoreError: Redis has none and the durable store cannot be read.
    """
    raw = None
    if redis is not None:
        try:
            raw = encryption.open_quietly(await redis.get(SNAPSHOT_KEY.format(session_id=session_id)),
                                          what=f"session snapshot {session_id}")
        except Exception as err:  # noqa: BLE001 - Redis down: the durable copy answers
            if durable is None:
                raise
            log.warning("session snapshot: Redis unavailable (%s); reading the durable store", err)
    if not raw and durable is not None:
        found = (await durable.get(SNAPSHOTS, [session_id])).get(session_id)
        raw = found.value if found is not None else None
    return SessionCarry.model_validate_json(raw) if raw else None


async def read_archive(redis: Any, session_id: str, chain_id: str, durable: DurableStore | None = None) -> list[Message]:
    """The archived messages of a session (``chain_id``: its state's ``chain_id``), in order:
    the durable store's and Redis' copies joined by index (an archive written before the
    durable store existed is only in Redis; one written since survives Redis).

    Raises:
        DurableStoreError: the durable store cannot be read and there is no Redis.
        redis.RedisError: Redis cannot be read and there is no durable store.
    """
    texts: dict[int, Any] = {}
    durable_error: DurableStoreError | None = None
    if durable is not None:
        try:
            records = await durable.list(TRANSCRIPT, owner=composite_key(session_id, chain_id))
            texts = {r.seq: r.value for r in records}
        except DurableStoreError as err:
            if redis is None:
                raise
            durable_error = err
            log.warning("transcript archive: %s; reading Redis", err)
    if redis is not None:
        try:
            raw = await redis.hgetall(ARCHIVE_KEY.format(session_id=session_id, chain_id=chain_id))
        except Exception as err:  # noqa: BLE001 - Redis down: the durable copy answers
            if durable is None or durable_error is not None:
                raise
            log.warning("transcript archive: Redis unavailable (%s); the durable copy alone", err)
            raw = {}
        for index, value in raw.items():
            if int(index) not in texts:
                text = encryption.open_quietly(value, what=f"archived message {session_id}/{int(index)}")
                if text is not None:
                    texts[int(index)] = text
    return [Message.model_validate_json(texts[i]) for i in sorted(texts)]
