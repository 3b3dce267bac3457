"""The content store: message bodies (and other large values) kept once, by content hash.

A model call does not carry its context in workflow history: it carries the content
hashes of the context's messages (DESIGN.md, "How history stays small"). Each body
enters history once, in the update or activity result that produced it; the bodies are
cached here, in Redis, under ``hermes:blob:<ref>``, and an activity that misses one
asks the session workflow for it with the ``get_message_bodies`` query. Redis is a
cache for the bodies of live sessions (losing it costs speed, never a message), and the
store of large inputs kept by reference (run it with AOF, as ``docker-compose.yml`` and
``hermes dev`` do).

A reference is ``"m:"`` (a message body) or ``"b:"`` (any other value) followed by the
first 32 hex digits (128 bits) of the SHA-256 of the canonical JSON of the value.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from hermes.models import Message

BLOB_KEY = "hermes:blob:{ref}"
MAX_INLINE_ARGUMENTS_BYTES = 64 * 1024
"""Tool-call arguments larger than this (as JSON, UTF-8) are kept by reference in the
content store (``ToolCall.arguments_ref``), like tool results over 64 KB and replies over
256 KB: a workflow task that decoded megabytes of arguments on a busy machine passed the
SDK's 2 s deadlock detector (issue 12)."""
ARGUMENTS_PREVIEW_CHARS = 1000
BODY_FIELDS = ("role", "content", "tool_calls", "tool_call_id", "name")
"""What a model sees of a message; the rest (turn, time, ids) is session bookkeeping."""


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:32]


def body_json(message: Message) -> str:
    """The body of ``message`` as canonical JSON (what its reference hashes)."""
    body = message.model_dump(mode="json", include=set(BODY_FIELDS))
    return json.dumps(body, ensure_ascii=False, sort_keys=True, separators=(",", ":"))


def message_ref(message: Message) -> str:
    """The content reference of ``message``'s body: equal bodies, equal references."""
    return "m:" + _digest(body_json(message))


def value_ref(value: Any) -> str:
    """The content reference of any JSON value (e.g. a tool list)."""
    return "b:" + _digest(json.dumps(value, ensure_ascii=False, sort_keys=True, separators=(",", ":"), default=str))


def stored_preview(text: str, ref: str, what: str, *, preview_chars: int = 4000) -> str:
    """The text that stands for a large input kept by reference (a user message, a tool
    result, a model reply): its size, its reference, how to read the rest, and its first
    ``preview_chars`` characters.

    Args:
        text: the whole input (stored under ``ref``).
        ref: its reference (:func:`value_ref`).
        what: what it is, e.g. ``"message"``, ``"reply"``.
        preview_chars: how many of its first characters (code points) to show.
    """
    size = len(text.encode("utf-8", "surrogatepass"))
    return (
        f"[{what} of {size} bytes, kept by reference as {ref}; the first {min(preview_chars, len(text))} "
        f"characters follow; the tool read_stored_content reads the rest]\n{text[:preview_chars]}"
    )


def arguments_stand_in(ref: str, text: str) -> dict[str, Any]:
    """What ``ToolCall.arguments`` holds while the arguments ``text`` (JSON) are kept by
    reference under ``ref``: enough for a transcript or an approver to see what they are.

    Returns:
        ``{"kept_by_reference": ref, "size_bytes": int, "preview": str}``.
    """
    return {
        "kept_by_reference": ref,
        "size_bytes": len(text.encode("utf-8", "surrogatepass")),
        "preview": text[:ARGUMENTS_PREVIEW_CHARS],
    }


def message_from_body(text: str) -> Message:
    """A message rebuilt from :func:`body_json`."""
    return Message.model_validate_json(text)


class BlobStore:
    """Bodies by reference in Redis (a ``redis.asyncio.Redis``; bytes or str replies).

    Args:
        redis: the client; ``None`` makes every read a miss and every write a no-op.
        ttl_seconds: how long an entry lives after its last write; ``None``: forever.
    """

    def __init__(self, redis: Any, *, ttl_seconds: int | None = None):
        self.redis = redis
        self.ttl_seconds = ttl_seconds

    async def put_many(self, items: dict[str, str]) -> None:
        """Store ``ref -> text``; writing the same reference twice is harmless."""
        if self.redis is None or not items:
            return
        pipe = self.redis.pipeline(transaction=False)
        for ref, text in items.items():
            pipe.set(BLOB_KEY.format(ref=ref), text, ex=self.ttl_seconds)
        await pipe.execute()

    async def get_many(self, refs: list[str]) -> dict[str, str]:
        """The stored texts of ``refs`` (missing ones are left out)."""
        if self.redis is None or not refs:
            return {}
        unique = list(dict.fromkeys(refs))
        values = await self.redis.mget([BLOB_KEY.format(ref=r) for r in unique])
        return {
            ref: value.decode("utf-8", "surrogatepass") if isinstance(value, bytes) else value
            for ref, value in zip(unique, values)
            if value is not None
        }
