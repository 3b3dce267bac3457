"""The provider interface and the chat-completions message format."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, Protocol

from hermes.models import CallModelInput, CallModelResult, Message, ToolCall

if TYPE_CHECKING:
    from hermes.providers.profiles import ProviderProfile


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


def to_openai_messages(messages: list[Message], profile: ProviderProfile | None = None) -> list[dict[str, Any]]:
    """Our messages in chat-completions format (``tool_calls`` with JSON-string arguments).

    Args:
        messages: the context, in order.
        profile: the provider's dialect (default: OpenAI's). It decides whether an
            assistant message with tool calls may have ``"content": null`` (Ollama: no,
            ``""`` is sent) and whether its reasoning goes back with it (DeepSeek and Kimi
            thinking models require it there; everywhere else reasoning stays out).
    """
    null_content = profile.null_content if profile is not None else True
    send_back = profile.reasoning_sent_back if profile is not None else None
    out: list[dict[str, Any]] = []
    for m in messages:
        if m.role == "tool":
            out.append({"role": "tool", "tool_call_id": m.tool_call_id, "content": m.content or ""})
        elif m.role == "assistant" and m.tool_calls:
            wire: dict[str, Any] = {
                "role": "assistant",
                "content": m.content if (m.content is not None or null_content) else "",
                "tool_calls": [
                    {
                        "id": c.tool_call_id,
                        "type": "function",
                        "function": {"name": c.name, "arguments": json.dumps(c.arguments, ensure_ascii=False)},
                    }
                    for c in m.tool_calls
                ],
            }
            if send_back:
                # "" when the transcript has none (a step recorded before, or by another
                # provider): the field must be there, its text is the model's own.
                wire[send_back] = m.reasoning or ""
            out.append(wire)
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
