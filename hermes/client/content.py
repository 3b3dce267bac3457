"""Content kept by reference: a large message stored before it is sent, and reading back
what a session kept (the durable store, with Redis as the fast path; :mod:`hermes.content.blobs`)."""

from __future__ import annotations

from typing import Any

from hermes.client.messages import message_by_reference
from hermes.content.blobs import BlobStore
from hermes.errors import MessageRejectedError
from hermes.infra.durable import DurableStore
from hermes.models import StoredContent


def content_store(redis: Any, durable: DurableStore | None, ttl_seconds: int) -> BlobStore:
    """The content store of a client with ``redis`` and ``durable`` (either may be None:
    then :attr:`BlobStore.can_keep` says whether anything can be kept)."""
    return BlobStore(redis, durable=durable, ttl_seconds=ttl_seconds)


async def store_message(store: BlobStore, text: str, max_message_bytes: int) -> tuple[str, StoredContent]:
    """Keep ``text`` in ``store``; the preview to send instead, and its reference.

    Raises:
        MessageRejectedError: the store could not take it (nothing was sent).
    """
    preview, stored = message_by_reference(text, max_message_bytes=max_message_bytes)
    try:
        await store.keep_many({stored.ref: text})
    except Exception as err:  # noqa: BLE001 - any store failure: the message is not sent
        raise MessageRejectedError(
            f"the message is {stored.size_bytes} bytes, over the {max_message_bytes}-byte limit of inline "
            f"messages, and could not be kept by reference ({type(err).__name__}: {err}); nothing was sent"
        ) from None
    return preview, stored


async def read_stored(store: BlobStore, ref: str) -> str | None:
    """The whole text kept under ``ref``, or ``None`` when ``store`` can keep nothing or
    nothing is stored under it (Redis first, then the durable store).

    Raises:
        DurableStoreError: not in Redis, and the durable store cannot be read.
    """
    if not store.can_keep:
        return None
    return (await store.read_many([ref])).get(ref)
