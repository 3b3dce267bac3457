"""What a user message must be before it is sent, and how a large one is sent by reference.

Plain functions (no server): :func:`check_message_text` refuses a message a session should
not take; :func:`message_by_reference` makes the preview that stands for a message kept in
the content store; :func:`message_update_id` names a message's Temporal update.
"""

from __future__ import annotations

import unicodedata

from hermes.content.blobs import stored_preview, value_ref
from hermes.errors import MessageRejectedError
from hermes.models import SessionConfig, StoredContent

_INVISIBLE_CATEGORIES = frozenset({"Cc", "Cf", "Zs", "Zl", "Zp"})
"""Unicode categories that show nothing: controls, format characters (U+200B zero width
space, U+200D zero width joiner, U+FEFF byte order mark), spaces and separators."""


MAX_STORED_MESSAGE_BYTES = 64 * 1024 * 1024
"""Largest user message taken at all, in UTF-8 bytes, even kept by reference (64 MB)."""


def check_message_text(text: str, *, max_message_bytes: int | None = None, can_store: bool = False) -> int:
    """Refuse a message that a session should not take, before anything is sent.

    Args:
        text: the user's message.
        max_message_bytes: the largest size taken inline, in UTF-8 bytes; None: no
            size check (other than :data:`MAX_STORED_MESSAGE_BYTES`).
        can_store: a larger message can be kept by reference (the caller has a content
            store: the durable store or Redis): then only :data:`MAX_STORED_MESSAGE_BYTES`
            applies.

    Returns:
        The message's size in UTF-8 bytes.

    Raises:
        MessageRejectedError: the message is empty (nothing but whitespace, control or
            invisible format characters), is not valid UTF-8 text (a lone surrogate, e.g.
            an undecodable byte of the command line or a terminal kept by Python's
            ``surrogateescape``), is larger than :data:`MAX_STORED_MESSAGE_BYTES`, or is
            larger than ``max_message_bytes`` and ``can_store`` is false.
    """
    if not text or all(unicodedata.category(char) in _INVISIBLE_CATEGORIES for char in text):
        raise MessageRejectedError("the message is empty")
    try:
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError as err:
        code = ord(text[err.start])
        what = f"U+{code:04X}"
        if 0xDC80 <= code <= 0xDCFF:
            # Python's surrogateescape keeps an undecodable byte b as U+DC00 + b.
            what += f", the undecodable byte 0x{code - 0xDC00:02X}"
        raise MessageRejectedError(
            f"the message is not valid UTF-8 text: it contains a lone surrogate ({what}) "
            f"at position {err.start}; check the encoding of your terminal or input"
        ) from None
    if size > MAX_STORED_MESSAGE_BYTES:
        raise MessageRejectedError(
            f"the message is {size} bytes; the largest message taken, even kept by reference, is "
            f"{MAX_STORED_MESSAGE_BYTES} bytes (64 MB); send large content as a file or a link"
        )
    if max_message_bytes is not None and size > max_message_bytes and not can_store:
        raise MessageRejectedError(
            f"the message is {size} bytes; the limit is {max_message_bytes} bytes "
            "(send large content as a file or a link, or give the client a content store (the durable store at "
            "HERMES_MEMORY_URI, or Redis at REDIS_URL) "
            "so that larger messages are kept by reference)"
        )
    return size


def message_by_reference(text: str, *, max_message_bytes: int) -> tuple[str, StoredContent]:
    """The preview text that stands for a message too large to send inline, and what
    says where the whole message is (store ``text`` under ``StoredContent.ref``).

    Args:
        text: the whole message.
        max_message_bytes: the preview's UTF-8 size is at most this.

    Raises:
        MessageRejectedError: the limit is too small for even a preview's header.
    """
    ref = value_ref(text)
    chars = 4000
    while True:
        preview = stored_preview(text, ref, "message", preview_chars=chars)
        if len(preview.encode("utf-8")) <= max_message_bytes:
            break
        if chars == 0:
            raise MessageRejectedError(
                f"the message is {len(text.encode('utf-8'))} bytes; the limit of {max_message_bytes} bytes is too "
                "small even for a preview of it kept by reference"
            )
        chars //= 2
    # (The header is one line: what follows it is the head and tail the session shows.)
    return preview, StoredContent(ref=ref, size_bytes=len(text.encode("utf-8")), preview=preview.partition("\n")[2])


def too_many_tokens(text: str, size: int, config: SessionConfig) -> bool:
    """Whether ``text`` would take more than half of the session's context budget: such
    a message is kept by reference too (the model gets a preview and reads the rest with
    ``read_stored_content``) rather than end its turn as ``context_too_large``."""
    half = int(config.context_window_tokens * (1 - config.context_reserve_ratio)) // 2
    if size <= half:  # a token is at least one byte
        return False
    from hermes.content.tokens import TokenCounter

    return TokenCounter.get().text(text) > half


def message_update_id(user_id: str, client_message_id: str) -> str:
    """The Temporal update id of message ``client_message_id`` sent by ``user_id``:
    ``'<user_id>':<client_message_id>`` (the user id quoted, so no two pairs share it).

    Temporal answers an update whose id it has seen in the run with that update's
    outcome without asking the session, so the id names the sender: another user's
    resend of a known client message id reaches the session, which refuses it, instead
    of receiving the owner's reply."""
    return f"{user_id!r}:{client_message_id}"
