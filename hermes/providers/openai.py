"""Any OpenAI-compatible chat-completions endpoint with tools (OpenAI, DeepSeek,
Qwen/DashScope, Moonshot, Ollama, vLLM, llama.cpp server), through the ``openai`` package.

The SDK's own retries are off (``max_retries=0``): Temporal owns retries. HTTP status
maps to retryable or not as in the Temporal samples: 408, 409, 429 and 5xx are retried,
other 4xx are not; ``Retry-After`` becomes the next retry delay.
"""

from __future__ import annotations

import email.utils
import math
import re
import time
from typing import TYPE_CHECKING, Any

import openai

from hermes.errors import ConfigError, ContextTooLongError, ModelRequestError, ModelUnavailableError
from hermes.models import CallModelInput, CallModelResult, Message, Usage
from hermes.providers.base import parse_tool_call, to_openai_messages

if TYPE_CHECKING:
    from hermes.settings import Settings

RETRYABLE_STATUS = frozenset({408, 409, 429})


MAX_RETRY_AFTER_SECONDS = 60.0
"""Longer hints are ignored and the retry policy's backoff applies (the openai SDK does
the same): a bogus header must not park a session for hours."""


def retry_after_seconds(headers: Any) -> float | None:
    """Seconds to wait from ``retry-after-ms`` / ``Retry-After`` (seconds or HTTP date).

    Returns:
        The delay in seconds (at least 0), or None when there is no usable hint: absent,
        unparsable, not finite, or above ``MAX_RETRY_AFTER_SECONDS``.
    """
    seconds = _raw_retry_after_seconds(headers)
    if seconds is None or not math.isfinite(seconds) or seconds > MAX_RETRY_AFTER_SECONDS:
        return None
    return max(seconds, 0.0)


def _raw_retry_after_seconds(headers: Any) -> float | None:
    if headers is None:
        return None
    ms = headers.get("retry-after-ms")
    if ms:
        try:
            return max(float(ms) / 1000, 0.0)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if not value:
        return None
    try:
        return max(float(value), 0.0)
    except ValueError:
        try:
            parsed = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        return max(parsed.timestamp() - time.time(), 0.0)


def is_retryable_status(status: int) -> bool:
    return status in RETRYABLE_STATUS or status >= 500


class OpenAIProvider:
    """A :class:`~hermes.providers.base.ModelProvider` over the chat-completions wire."""

    name = "openai"

    def __init__(self, *, model: str, base_url: str | None, api_key: str | None, timeout_seconds: float = 120.0):
        self.model = model
        self.client = openai.AsyncOpenAI(
            base_url=base_url,
            api_key=api_key or "not-needed",
            max_retries=0,
            timeout=timeout_seconds,
        )

    @classmethod
    def from_settings(cls, settings: Settings) -> OpenAIProvider:
        key = settings.openai_api_key.get_secret_value() if settings.openai_api_key else None
        if not key and not settings.openai_base_url:
            raise ConfigError(
                "the openai provider needs an API key (HERMES_OPENAI_API_KEY or OPENAI_API_KEY), "
                "or HERMES_OPENAI_BASE_URL pointing at a server that needs none",
                source="settings",
                key="openai_api_key",
            )
        return cls(
            model=settings.model,
            base_url=settings.openai_base_url,
            api_key=key,
            timeout_seconds=settings.model_timeout_seconds,
        )

    async def complete(self, request: CallModelInput) -> CallModelResult:
        model = request.model or self.model
        kwargs: dict[str, Any] = {"model": model, "messages": to_openai_messages(request.messages)}
        if request.tools:
            kwargs["tools"] = [t.to_openai() for t in request.tools]
        if request.max_output_tokens:
            kwargs["max_tokens"] = request.max_output_tokens
        try:
            response = await self.client.chat.completions.create(**kwargs)
        except openai.APIStatusError as err:
            detail = f"{err.status_code} from {model}: {_short(err.message)}"
            if is_retryable_status(err.status_code):
                raise ModelUnavailableError(
                    detail, status_code=err.status_code, retry_after_seconds=retry_after_seconds(err.response.headers)
                ) from None
            if _is_context_too_long(err):
                raise ContextTooLongError(detail, status_code=err.status_code) from None
            raise ModelRequestError(detail, status_code=err.status_code) from None
        except (openai.APIConnectionError, openai.APITimeoutError) as err:
            raise ModelUnavailableError(f"cannot reach the model endpoint: {err}") from None
        if not response.choices:
            raise ModelUnavailableError(f"{model} returned no choices")
        choice = response.choices[0].message
        calls = [
            parse_tool_call(c.id or "", _clean(c.function.name) or "", _clean(c.function.arguments))
            for c in (choice.tool_calls or [])
            if getattr(c, "function", None) is not None
        ]
        usage = Usage()
        if response.usage is not None:
            usage = Usage(
                prompt_tokens=response.usage.prompt_tokens or 0,
                completion_tokens=response.usage.completion_tokens or 0,
            )
        return CallModelResult(
            message=Message(role="assistant", content=_clean(choice.content), tool_calls=calls),
            usage=usage,
            provider=self.name,
            model=response.model or model,
        )


_CONTEXT_TOO_LONG_RE = re.compile(
    r"context[_ ]length[_ ]exceeded|maximum context length|context window|prompt is too long|too many tokens"
    r"|reduce the length of the messages|input is too long",
    re.IGNORECASE,
)


def _is_context_too_long(err: openai.APIStatusError) -> bool:
    """Whether the provider refused the request for the size of its context."""
    if err.status_code == 413:
        return True
    if err.status_code != 400:
        return False
    body = err.body if isinstance(err.body, dict) else {}
    error = body.get("error", body) if isinstance(body, dict) else {}
    code = error.get("code") if isinstance(error, dict) else None
    return code == "context_length_exceeded" or bool(_CONTEXT_TOO_LONG_RE.search(err.message or ""))


def _clean(text: str | None) -> str | None:
    """``text`` with lone surrogates (invalid in UTF-8, so unstorable) replaced by U+FFFD.

    Some servers send them in broken escapes; left in, every retry of the call would
    fail the same way when the result is serialized."""
    if text is None:
        return None
    return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


def _short(text: str, limit: int = 500) -> str:
    return text if len(text) <= limit else text[:limit] + "..."
