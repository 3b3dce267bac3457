"""The content store: message bodies (and other large values) kept once, by content hash.

A model call does not carry its context in workflow history: it carries the content
hashes of the context's messages (DESIGN.md, "How history stays small"). Each body
enters history once, in the update or activity result that produced it; the bodies are
cached here, in Redis, under ``hermes:blob:<ref>``, written by the session before the
model call that reads them (``store_message_bodies``, a local activity); a body Redis lost
is written again by the session (runs recorded before that patch ask the session with the
``get_message_bodies`` query). Redis is a cache for the bodies of live sessions (losing
it costs speed, never a message).

Large inputs kept by reference (a user message, a tool result or a reply too large for
history) have no other copy: :meth:`BlobStore.keep_many` writes them to the durable store
(:mod:`hermes.infra.durable`, LanceDB) first and to Redis as the fast path, and
:meth:`BlobStore.read_many` reads Redis first and the durable store on a miss, so they
outlive a ``FLUSHALL``.

A reference is ``"m:"`` (a message body) or ``"b:"`` (any other value) followed by the
first 32 hex digits (128 bits) of the SHA-256 of the canonical JSON of the value.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any, Generic, TypeVar

from hermes.content.previews import head_and_tail
from hermes.infra.durable import CONTENT, DurableStore, Record
from hermes.infra.redis_keys import mget
from hermes.infra.redis_writes import write_or_report
from hermes.models import Message, ToolCall, ToolSpec
from hermes.security import encryption

log = logging.getLogger("hermes.blobs")

BLOB_KEY = "hermes:blob:{ref}"
MAX_INLINE_ARGUMENTS_BYTES = 64 * 1024
"""Tool-call arguments larger than this (as JSON, UTF-8) are kept by reference in the
content store (``ToolCall.arguments_ref``), like tool results over 64 KB and replies over
256 KB: a workflow task that decoded megabytes of arguments on a busy machine passed the
SDK's 2 s deadlock detector (issue 12)."""
ARGUMENTS_PREVIEW_CHARS = 1000
CACHE_WRITE_TIMEOUT_SECONDS = 5.0
"""Longest time a Redis copy of content takes, both tries and any wait for a free pool
connection included (:meth:`BlobStore.cache_or_report`): one socket timeout, as a single
try took before, so a hung Redis delays a model call no longer than it did."""
CONTENT_TTL_SECONDS = 7 * 24 * 3600
"""How long a blob lives in Redis after its last write or read unless told otherwise (the
default of ``HERMES_REDIS_CONTENT_TTL_SECONDS``): a bound on Redis per session; an expired
blob is read from where it is kept for good (README "What Redis holds")."""
_REFRESH = "if redis.call('TTL', KEYS[1]) > 0 then return redis.call('EXPIRE', KEYS[1], ARGV[1]) end return 0"
"""A read's TTL refresh of one key: only a key that has a TTL gets it again; content kept
with none (the only copy, without a durable store) keeps none. (``EXPIRE ... XX`` does
this from Redis 7 on; the script works on Redis 6 too. One key: any Cluster slot.)"""
REFRESH_FRACTION = 1 / 8
"""A body read again is given its whole TTL again once this fraction of it has passed
since this process last did so (7 days: at most every 21 hours), not on every read."""
REFRESHED_MAX = 200_000
"""How many refs a store remembers refreshing (the oldest forgotten first: refreshed again
on their next read)."""
BODY_FIELDS = ("role", "content", "tool_calls", "tool_call_id", "name")
"""What a model sees of a message; the rest (turn, time, ids) is session bookkeeping."""


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:32]


def body_json(message: Message) -> str:
    """The body of ``message`` as canonical JSON (what its reference hashes): its
    :data:`BODY_FIELDS` as ``model_dump(mode="json")`` gives them, read field by field for
    a plain validated message (a turn hashes several, issue 31), by pydantic otherwise."""
    body: dict[str, Any] = {field: getattr(message, field) for field in BODY_FIELDS}
    calls = body.pop("tool_calls")
    if type(message) is Message and type(calls) is list and all(type(c) is ToolCall for c in calls) and all(
        value is None or type(value) is str for value in body.values()
    ):
        body["tool_calls"] = [call.model_dump(mode="json") for call in calls]
    else:  # anything a validated Message would not hold: pydantic's own JSON of it, as always
        body = message.model_dump(mode="json", include=set(BODY_FIELDS))
    if message.reasoning is not None:
        # Only when set: bodies without reasoning keep the references they always had.
        body["reasoning"] = message.reasoning
    return json.dumps(body, ensure_ascii=False, sort_keys=True, separators=(",", ":"))


def message_ref(message: Message) -> str:
    """The content reference of ``message``'s body: equal bodies, equal references."""
    return "m:" + _digest(body_json(message))


def value_ref(value: Any) -> str:
    """The content reference of any JSON value (e.g. a tool list)."""
    return "b:" + _digest(json.dumps(value, ensure_ascii=False, sort_keys=True, separators=(",", ":"), default=str))


def stored_preview(text: str, ref: str, what: str, *, preview_chars: int = 4000) -> str:
    """The text that stands for a large input kept by reference (a user message, a tool
    result, a model reply): a header line with its size, its reference and how to read the
    rest, then a preview of at most ``preview_chars`` characters: its head and its tail
    around a marker line saying how much was cut and the ``read_stored_content`` call that
    reads it (:func:`hermes.content.previews.head_and_tail`).

    Args:
        text: the whole input (stored under ``ref``).
        ref: its reference (:func:`value_ref`).
        what: what it is, e.g. ``"message"``, ``"reply"``.
        preview_chars: the preview's most characters (code points), marker included; 0:
            the header alone.
    """
    size = len(text.encode("utf-8", "surrogatepass"))
    if preview_chars <= 0:
        return f"[{what} of {size} bytes, kept by reference as {ref}; the tool read_stored_content reads it]\n"
    preview = head_and_tail(
        text, preview_chars, how_to_read=f'read them with read_stored_content(ref="{ref}", offset={{start}}, length=8000)'
    )
    if not preview.cut:
        shown = f"all {len(text)} characters follow"
    else:
        shown = (
            f"its first {preview.cut_start} and last {len(text) - preview.cut_end} characters follow, around a marker "
            "saying what was cut; the tool read_stored_content reads the rest"
        )
    return f"[{what} of {size} bytes, kept by reference as {ref}; {shown}]\n{preview.text}"


def arguments_stand_in(ref: str, text: str) -> dict[str, Any]:
    """What ``ToolCall.arguments`` holds while the arguments ``text`` (JSON) are kept by
    reference under ``ref``: enough for a transcript or an approver to see what they are.

    Returns:
        ``{"kept_by_reference": ref, "size_bytes": int, "preview": str}``; the preview is
        the JSON's head and tail around a marker saying what was cut
        (:func:`hermes.content.previews.head_and_tail`).
    """
    return {
        "kept_by_reference": ref,
        "size_bytes": len(text.encode("utf-8", "surrogatepass")),
        "preview": head_and_tail(
            text,
            ARGUMENTS_PREVIEW_CHARS,
            json_text=True,
            how_to_read=f'read them with read_stored_content(ref="{ref}", offset={{start}})',
        ).text,
    }


def message_from_body(text: str) -> Message:
    """A message rebuilt from :func:`body_json`."""
    return Message.model_validate_json(text)


PROCESS_CACHE_BYTES = 64 * 1024 * 1024
"""Most characters of content this process keeps in memory (:data:`BODIES`)."""
DECODED_CACHE_CHARS = 32 * 1024 * 1024
"""Most characters of body text whose decoded messages this process keeps (:data:`DECODED`)."""

V = TypeVar("V")


class BodyCache(Generic[V]):
    """Values by reference, kept in this process (least recently used first out, at most
    ``max_chars`` characters in all, ``size`` telling a value's; one over
    ``max_item_chars``, default a quarter of the cache, is not kept). A reference is the
    hash of its text (:func:`message_ref`, :func:`value_ref`), so a cached value is never
    stale: the model activities read a body they stored or read before from memory, not
    Redis, and decode it once (issue 31: a model call read and decoded its whole context
    from Redis every step). Thread-safe."""

    def __init__(
        self, max_chars: int, *, max_item_chars: int | None = None, size: Callable[[V], int] = len  # type: ignore[assignment]
    ) -> None:
        self.max_chars = max_chars
        self.max_item_chars = max_chars // 4 if max_item_chars is None else max_item_chars
        self._size = size
        self._values: OrderedDict[str, V] = OrderedDict()
        self._chars = 0
        self._lock = threading.Lock()

    @property
    def chars(self) -> int:
        """Characters held now."""
        return self._chars

    def get(self, refs: list[str]) -> dict[str, V]:
        """The cached values of ``refs`` (missing ones are left out)."""
        found: dict[str, V] = {}
        with self._lock:
            for ref in refs:
                value = self._values.get(ref)
                if value is not None:
                    self._values.move_to_end(ref)
                    found[ref] = value
        return found

    def put(self, items: dict[str, V]) -> None:
        """Keep ``ref -> value``."""
        with self._lock:
            for ref, value in items.items():
                size = self._size(value)
                if size > self.max_item_chars or ref in self._values:
                    continue
                self._values[ref] = value
                self._chars += size
            while self._chars > self.max_chars and self._values:
                _, dropped = self._values.popitem(last=False)
                self._chars -= self._size(dropped)

    def clear(self) -> None:
        """Forget everything (what a fresh worker process has)."""
        with self._lock:
            self._values.clear()
            self._chars = 0


BODIES: BodyCache[str] = BodyCache(PROCESS_CACHE_BYTES)
"""This process's body texts read by model calls (``activities.model``)."""

DECODED: BodyCache[tuple[Message, int]] = BodyCache(
    DECODED_CACHE_CHARS, max_item_chars=DECODED_CACHE_CHARS // 64, size=lambda held: held[1]
)
"""This process's decoded context messages, with the characters of their bodies (:func:`message_of_ref`)."""


TOOL_LISTS: BodyCache[tuple[list[ToolSpec], int]] = BodyCache(
    4 * 1024 * 1024, max_item_chars=1024 * 1024, size=lambda held: held[1]
)
"""This process's decoded tool lists, with the characters of their bodies (:func:`tools_of_ref`)."""


def tools_of_ref(ref: str, text: str) -> list[ToolSpec]:
    """The tool list whose body (a JSON array of :class:`ToolSpec`) is ``text``, decoded
    once per process while :data:`TOOL_LISTS` keeps it (a session offers the same list at
    every step). A new list each call; its specs are shared, read-only."""
    return list(_decoded_once(TOOL_LISTS, ref, text, lambda t: [ToolSpec.model_validate(s) for s in json.loads(t)]))


def message_of_ref(ref: str, text: str) -> Message:
    """:func:`message_from_body` of ``text``, the body of ``ref``, decoded once per process
    while :data:`DECODED` keeps it (a model call decodes its whole context every step).

    The message is shared by every call that reads ``ref`` in this process: read-only.
    What changes one works on a copy (``model_copy(update=...)``, as the model activity's
    tool-call arguments do); a copy per call cost more than the rest of resolving a
    context (issue 31: about 0.7 ms of CPU a turn, most of it deep copies of tool calls).
    """
    return messages_of_refs([ref], {ref: text})[0]


def messages_of_refs(refs: list[str], texts: Mapping[str, str]) -> list[Message]:
    """:func:`message_of_ref` of each of ``refs`` (bodies in ``texts``), in order, with one
    look into :data:`DECODED` for them all (a context is tens of messages a step)."""
    held = DECODED.get(refs)
    decoded = {ref: (message_from_body(texts[ref]), len(texts[ref])) for ref in dict.fromkeys(refs) if ref not in held}
    if decoded:
        DECODED.put(decoded)
        held.update(decoded)
    return [held[ref][0] for ref in refs]


def _decoded_once(cache: BodyCache[tuple[V, int]], ref: str, text: str, decode: Callable[[str], V]) -> V:
    """``decode(text)``, the body of ``ref``, from ``cache`` when it holds it, else decoded
    and kept there with the body's size in characters."""
    held = cache.get([ref]).get(ref)
    if held is None:
        held = (decode(text), len(text))
        cache.put({ref: held})
    return held[0]


class BlobStore:
    """Bodies by reference in Redis (a ``redis.asyncio.Redis``; bytes or str replies), and
    content kept by reference in the durable store too.

    Args:
        redis: the client; ``None`` makes every Redis read a miss and every write a no-op.
        ttl_seconds: how long an entry lives after its last write or read (seconds);
            ``None``: forever. Content that only Redis holds (:meth:`keep_many` with no
            durable store) never expires.
        durable: where content kept by reference survives Redis (:meth:`keep_many`,
            :meth:`read_many`); ``None``: Redis alone.
    """

    def __init__(
        self, redis: Any, *, ttl_seconds: int | None = CONTENT_TTL_SECONDS, durable: DurableStore | None = None
    ):
        self.redis = redis
        self.ttl_seconds = ttl_seconds
        self.durable = durable
        self._refreshed: OrderedDict[str, float] = OrderedDict()
        """ref -> when this store last refreshed its TTL on a read (monotonic seconds)."""

    @property
    def can_keep(self) -> bool:
        """Whether :meth:`keep_many` stores anything (a durable store or a Redis)."""
        return self.durable is not None or self.redis is not None

    async def keep_many(self, items: dict[str, str]) -> None:
        """Keep ``ref -> text`` for good: in the durable store (when configured), then in
        Redis. Idempotent (a reference names its content).

        Raises:
            DurableStoreError: the durable store did not take it (nothing is confirmed;
                Redis is not written either, so a reference is never handed out that
                only Redis holds).
            redis.RedisError: no durable store, and Redis did not take it.
            RuntimeError: neither is configured.
        """
        if not items:
            return
        if not self.can_keep:
            raise RuntimeError("no content store (durable store or Redis) is configured")
        if self.durable is None:
            await self.put_many(items, expire=False)  # the only copy: it must not expire
            return
        await self.durable.insert(CONTENT, [Record(key=ref, value=text) for ref, text in items.items()])
        # The durable copy is written; Redis is the fast path: retried once, then reported.
        await self.cache_or_report(items, "kept by reference (the durable copy is written)")

    async def cache_or_report(
        self, items: dict[str, str], what: str, *, timeout_seconds: float = CACHE_WRITE_TIMEOUT_SECONDS
    ) -> bool:
        """:meth:`put_many`, tried twice within ``timeout_seconds``; if it does not land,
        reported (:func:`hermes.infra.redis_writes.report_skipped`), never raised.

        Args:
            items: ``ref -> text``.
            what: what they are, for the report (e.g. ``"message bodies"``).
            timeout_seconds: the longest all tries take together.

        Returns:
            True if cached (or nothing to cache); False if skipped and reported.
        """
        if self.redis is None or not items:
            return True
        return await write_or_report(
            "content_store", f"Redis copy of {len(items)} value(s) {what}: {', '.join(list(items)[:3])}",
            lambda: self.put_many(items), timeout_seconds=timeout_seconds, items=len(items),
        )

    async def read_many(self, refs: list[str]) -> dict[str, str]:
        """The texts of ``refs``: from Redis, then the durable store for the misses (which
        are cached in Redis again). Missing ones are left out.

        Raises:
            DurableStoreError: a Redis miss, and the durable store cannot be read.
        """
        try:
            found = await self.get_many(refs)
        except Exception as err:  # noqa: BLE001 - Redis down: the durable store answers
            if self.durable is None:
                raise
            log.warning("content store (Redis) unavailable (%s); reading the durable store", err)
            found = {}
        missing = [r for r in dict.fromkeys(refs) if r not in found]
        if missing and self.durable is not None:
            kept = {ref: record.value for ref, record in (await self.durable.get(CONTENT, missing)).items()}
            if kept:
                found.update(kept)
                try:
                    await self.put_many(kept)
                except Exception as err:  # noqa: BLE001 - a cache refill only
                    log.debug("content not cached again in Redis: %s", err)
        return found

    async def put_many(self, items: dict[str, str], *, expire: bool = True) -> None:
        """Store ``ref -> text``; writing the same reference twice is harmless.

        Args:
            items: ``ref -> text``.
            expire: False: no TTL (the only copy of content kept by reference).
        """
        if self.redis is None or not items:
            return
        pipe = self.redis.pipeline(transaction=False)
        self.queue_puts(pipe, items, expire=expire)
        await pipe.execute()
        self.put_done(items, expire=expire)

    def queue_puts(self, pipe: Any, items: dict[str, str], *, expire: bool = True) -> None:
        """Add :meth:`put_many`'s writes of ``items`` to ``pipe`` (a non-transactional
        pipeline of :attr:`redis`, sent by the caller with its other commands; one answer
        per item); once they all landed, call :meth:`put_done`."""
        ttl = self.ttl_seconds if expire else None
        for ref, text in items.items():
            # With encryption on, Redis holds the bodies sealed like history does (issue 17).
            pipe.set(BLOB_KEY.format(ref=ref), encryption.seal(text), ex=ttl)

    def put_done(self, items: dict[str, str], *, expire: bool = True) -> None:
        """Note that ``items`` were just written (:meth:`queue_puts`)."""
        if expire:
            # Written with the whole TTL just now: the next read need not refresh it.
            self._refreshed_now(list(items))

    async def get_many(self, refs: list[str]) -> dict[str, str]:
        """The stored texts of ``refs`` (missing ones are left out)."""
        if self.redis is None or not refs:
            return {}
        unique = list(dict.fromkeys(refs))
        values = await mget(self.redis, [BLOB_KEY.format(ref=r) for r in unique])
        found = {
            ref: value.decode("utf-8", "surrogatepass") if isinstance(value, bytes) else value
            for ref, value in zip(unique, values)
            if value is not None
        }
        await self.touch(list(found))
        if any(v.startswith(encryption.SEALED_PREFIX) for v in found.values()):
            found = _opened(found)
        return found

    async def touch(self, refs: list[str]) -> None:
        """Refresh the TTL of ``refs`` (read just now, from Redis or from this process's
        :data:`BODIES`) where this store has not within :data:`REFRESH_FRACTION` of it."""
        stale = self._stale(refs) if self.redis is not None else []
        if stale:
            # A read of a hot blob keeps it: an active session never loses it to the TTL.
            pipe = self.redis.pipeline(transaction=False)
            for ref in stale:
                pipe.eval(_REFRESH, 1, BLOB_KEY.format(ref=ref), self.ttl_seconds)
            await pipe.execute()
            self._refreshed_now(stale)

    def _refreshed_now(self, refs: list[str]) -> None:
        now = time.monotonic()
        for ref in refs:
            self._refreshed[ref] = now
            self._refreshed.move_to_end(ref)
        while len(self._refreshed) > REFRESHED_MAX:
            self._refreshed.popitem(last=False)

    def _stale(self, refs: list[str]) -> list[str]:
        """The ``refs`` whose TTL this store has not refreshed within the last
        :data:`REFRESH_FRACTION` of it: each model call reads its whole context, and
        refreshing every body each time was one Redis command per message per call."""
        if not refs or self.ttl_seconds is None:
            return []
        since = time.monotonic() - self.ttl_seconds * REFRESH_FRACTION
        return [ref for ref in refs if self._refreshed.get(ref, -math.inf) < since]

    async def evict_kept(self, message_refs: list[str], content_refs: list[str]) -> int:
        """Drop from Redis the blobs of a session that has just been archived, but only
        those with a confirmed copy elsewhere: ``message_refs`` (bodies of messages the
        caller has written durably, e.g. in the session's snapshot) and the ``content_refs``
        the durable store confirms it holds. A blob whose durable copy is not confirmed
        stays (the TTL bounds it). Another session sharing a body reads it from its own
        history or the durable store on its next miss: a cost in speed, never a message.

        Args:
            message_refs: ``m:`` references whose bodies the caller has kept durably.
            content_refs: ``b:`` references to drop if the durable store has them.

        Returns:
            How many Redis keys were deleted.

        Raises:
            DurableStoreError: the durable store cannot be read (nothing is deleted).
            redis.RedisError: Redis did not take the deletion.
        """
        if self.redis is None or self.durable is None:
            return 0
        confirmed = list((await self.durable.get(CONTENT, list(dict.fromkeys(content_refs)))).keys()) if content_refs else []
        keys = [BLOB_KEY.format(ref=r) for r in dict.fromkeys([*message_refs, *confirmed])]
        if not keys:
            return 0
        pipe = self.redis.pipeline(transaction=False)
        for key in keys:
            # One key per command: no multi-key operation (Redis Cluster slots).
            pipe.delete(key)
        return sum(int(n) for n in await pipe.execute())


def _opened(values: dict[str, str]) -> dict[str, str]:
    """``values`` with the sealed ones opened; one this process cannot open (no key ring,
    a key no longer configured, altered data) is a miss: the caller reads the body from
    where it is kept for good (the session's history, the durable store)."""
    out: dict[str, str] = {}
    for ref, value in values.items():
        text = encryption.open_quietly(value, what=f"content store entry {ref}")
        if text is not None:
            out[ref] = text
    return out
