"""Sizes of what a session holds and returns, against Temporal's payload limits.

Plain functions over pydantic models; nothing here knows of Temporal. The limits come
from Temporal's 2 MB payload limit (an update's result, a continue-as-new input) and
from what a cached session may hold in a worker's memory (issue 12).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from hermes.models import Message, ToolCall, TurnResult

MAX_TRACE = 100
"""Trace steps a run holds (and carries): the newest, about 30 turns of them. Every cached
session holds its state in the worker's memory (issue 12: resident state, not history, is
what a worker's memory grows with), so what it keeps for inspection stays small."""
MAX_DECISIONS = 200
MAX_SETTLED = 1000
MAX_UNKNOWN = 200
MAX_RESULT_CHARS = 16_000
"""Largest tool-result text handed back to the model (the full result stays in the record)."""
ARCHIVE_CHUNK_BYTES = 1_000_000
MAX_CARRY_PAYLOAD_BYTES = 1_800_000
"""Continue-as-new is not attempted with a larger state: Temporal refuses inputs over 2 MB."""
MAX_CACHED_RESULT_BYTES = 64_000
MAX_CACHE_BYTES = 128_000
"""Byte budget of the replies kept for resends (with ``SessionConfig.max_completed_ids``):
held in memory by every cached session and carried across continue-as-new."""
MAX_TURN_RESULT_BYTES = 1_000_000
"""A reply is an update result: under Temporal's 2 MB payload limit whatever the turn did."""


def json_bytes(value: Any) -> int:
    """Bytes of ``value`` as JSON (UTF-8, non-ASCII kept, lone surrogates allowed)."""
    return len(json.dumps(value, ensure_ascii=False).encode("utf-8", "surrogatepass"))


def message_bytes(m: Message) -> int:
    """Serialized size of a message in bytes, as JSON with its escapes (a control
    character takes 6 bytes), since payload limits apply to the JSON."""
    size = 160 + json_bytes(m.content or "") + (json_bytes(m.reasoning) if m.reasoning else 0)
    for call in m.tool_calls:
        size += 160 + json_bytes(call.name) + json_bytes(call.arguments) + json_bytes(call.tool_call_id)
    return size


def slim(result: TurnResult, limit: int, *, cut_reply: bool = True) -> TurnResult:
    """``result`` within ``limit`` bytes of JSON: first the tool calls' arguments and
    data are left out (their code and message stay; the transcript has them), then the
    messages are cut, then (``cut_reply``) the reply."""
    if len(result.model_dump_json()) <= limit:
        return result
    note = "tool-call arguments and data were left out of this reply for its size; the transcript has them"
    slimmed = result.model_copy(
        update={
            "tool_calls": [
                r.model_copy(update={"arguments": {}, "result": r.result.model_copy(update={"data": None})})
                for r in result.tool_calls
            ],
            "warnings": [*result.warnings, note],
        }
    )
    if len(slimmed.model_dump_json()) <= limit:
        return slimmed
    slimmed.tool_calls = [
        r.model_copy(update={"result": r.result.model_copy(update={"message": r.result.message[:200]})})
        for r in slimmed.tool_calls
    ]
    slimmed.warnings = [w[:2000] for w in slimmed.warnings[-20:]]
    if cut_reply and len(slimmed.model_dump_json()) > limit:
        slimmed.reply = slimmed.reply[: limit // 8] + " [reply cut for its size; the transcript has it whole]"
    return slimmed


def fingerprint(call: ToolCall) -> str:
    """Identity of a call by tool and arguments, to recognise the same call again
    (32 hex characters of a SHA-256)."""
    identity = [call.name, call.arguments] + ([call.arguments_ref] if call.arguments_ref else [])
    text = json.dumps(identity, sort_keys=True, ensure_ascii=False, default=str)
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:32]
