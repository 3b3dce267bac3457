"""The provider interface and the chat-completions message format."""

from __future__ import annotations

import json
from typing import Any, Protocol

from hermes.models import CallModelInput, CallModelResult, Message, ToolCall


class ModelProvider(Protocol):
    """Something that turns a context into the next assistant message."""

    name: str

    async def complete(self, request: CallModelInput) -> CallModelResult:
        """Return the next assistant message.

        Raises:
            ModelUnavailableError: a failure worth retrying.
            ModelRequestError: a request the provider refuses; retrying will not help.
        """
        ...


def to_openai_messages(messages: list[Message]) -> list[dict[str, Any]]:
    """Our messages in chat-completions format (``tool_calls`` with JSON-string arguments)."""
    out: list[dict[str, Any]] = []
    for m in messages:
        if m.role == "tool":
            out.append({"role": "tool", "tool_call_id": m.tool_call_id, "content": m.content or ""})
        elif m.role == "assistant" and m.tool_calls:
            out.append(
                {
                    "role": "assistant",
                    "content": m.content,
                    "tool_calls": [
                        {
                            "id": c.tool_call_id,
                            "type": "function",
                            "function": {"name": c.name, "arguments": json.dumps(c.arguments, ensure_ascii=False)},
                        }
                        for c in m.tool_calls
                    ],
                }
            )
        else:
            out.append({"role": m.role, "content": m.content or ""})
    return out


def parse_tool_call(tool_call_id: str, name: str, raw_arguments: str | dict[str, Any] | None) -> ToolCall:
    """A tool call from the wire; arguments that are not a JSON object are kept as an error."""
    if isinstance(raw_arguments, dict):
        return ToolCall(tool_call_id=tool_call_id, name=name, arguments=raw_arguments)
    text = (raw_arguments or "").strip() or "{}"
    try:
        value = json.loads(text)
    except (ValueError, RecursionError) as err:
        # ValueError also covers integers past Python's digit limit; RecursionError, nesting.
        reason = err.msg if isinstance(err, json.JSONDecodeError) else (str(err)[:100] or "nested too deeply")
        return ToolCall(
            tool_call_id=tool_call_id,
            name=name,
            arguments_error=f"arguments: expected a JSON object, received {text[:200]!r} ({reason})",
        )
    if not isinstance(value, dict):
        return ToolCall(
            tool_call_id=tool_call_id,
            name=name,
            arguments_error=f"arguments: expected a JSON object, received {type(value).__name__} {text[:200]!r}",
        )
    return ToolCall(tool_call_id=tool_call_id, name=name, arguments=value)
