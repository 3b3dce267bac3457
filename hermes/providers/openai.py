"""Any OpenAI-compatible chat-completions endpoint with tools (OpenAI, DeepSeek,
Qwen/DashScope, Moonshot, Ollama, vLLM, llama.cpp server), through the ``openai`` package,
each in its own dialect (:mod:`hermes.providers.profiles`), streamed where it can be.

The SDK's own retries are off (``max_retries=0``): Temporal owns retries. HTTP status
maps to retryable or not as in the Temporal samples: 408, 409, 429 and 5xx are retried,
other 4xx are not; ``Retry-After`` becomes the next retry delay. An answer cut short (no
``finish_reason``, or the output limit inside a tool call's arguments: :meth:`_Reply.cut`)
is retried the same way, as a :class:`~hermes.errors.ModelUnavailableError`.
"""

from __future__ import annotations

import email.utils
import json
import math
import re
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import httpx2
import openai
from openai.types.chat import ChatCompletion

from hermes.content.events import model_text
from hermes.errors import ConfigError, ContextTooLongError, ModelRequestError, ModelUnavailableError
from hermes.models import CallModelInput, CallModelResult, Message, Usage
from hermes.providers.base import parse_tool_call, to_openai_messages
from hermes.providers.profiles import ProviderProfile, resolve_profile

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
    """A :class:`~hermes.providers.base.ModelProvider` over the chat-completions wire.

    Each call is shaped by a provider profile (:mod:`hermes.providers.profiles`): the one
    the request names (a session's ``model_profile``), else the worker's, else the one the
    base URL names. Where the profile streams and ``stream`` is on, the answer is read as
    server-sent events, ``on_chunk`` is called per chunk (the model activity heartbeats
    there), and the result is the one the same answer gives without streaming.

    Args:
        model: default model name (a request's ``model`` overrides it).
        base_url: the endpoint; None: OpenAI's.
        api_key: bearer key; None for servers that need none.
        timeout_seconds: the HTTP timeout of one call.
        profile: a profile name, or None / ``auto`` to choose from ``base_url`` and the model.
        stream: stream where the profile supports it.
        on_chunk: called once per streamed chunk (e.g. :func:`activities.heartbeat.beat`).

    Raises:
        ConfigError: ``profile`` is not a known profile.
    """

    name = "openai"

    def __init__(
        self,
        *,
        model: str,
        base_url: str | None,
        api_key: str | None,
        timeout_seconds: float = 120.0,
        profile: str | None = None,
        stream: bool = True,
        on_chunk: Callable[[], None] | None = None,
    ):
        self.model = model
        self.base_url = base_url
        self.profile = None if profile in (None, "auto") else resolve_profile(profile, base_url, model).name
        self.stream = stream
        self.on_chunk = on_chunk
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
            profile=settings.model_profile,
            stream=settings.model_stream,
        )

    def profile_for(self, request: CallModelInput) -> ProviderProfile:
        """The profile of this call: the request's, the provider's, or the base URL's.

        Raises:
            ConfigError: the request names an unknown profile.
        """
        return resolve_profile(request.profile or self.profile, self.base_url, request.model or self.model)

    def request_body(self, request: CallModelInput, profile: ProviderProfile, *, stream: bool) -> dict[str, Any]:
        """The keyword arguments of ``chat.completions.create`` for ``request``."""
        model = request.model or self.model
        kwargs: dict[str, Any] = {"model": model, "messages": to_openai_messages(request.messages, profile)}
        if request.tools:
            kwargs["tools"] = [t.to_openai() for t in request.tools]
            if profile.ask_parallel_tool_calls:
                kwargs["parallel_tool_calls"] = True
        if request.max_output_tokens:
            kwargs[profile.output_limit_parameter] = request.max_output_tokens
        if stream:
            kwargs["stream"] = True
            if profile.stream_usage_option:
                kwargs["stream_options"] = {"include_usage": True}
        return kwargs

    async def complete(self, request: CallModelInput) -> CallModelResult:
        profile = self.profile_for(request)
        stream = self.stream and profile.stream
        kwargs = self.request_body(request, profile, stream=stream)
        model = kwargs["model"]
        try:
            if stream:
                reply = await self._streamed(kwargs, profile)
            else:
                reply = _reply_of(await self.client.chat.completions.create(**kwargs), profile)
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
        except openai.APIError as err:
            # An error event inside a stream (the HTTP status was 200): worth another attempt.
            raise ModelUnavailableError(f"{model} failed mid-answer: {_short(err.message)}") from None
        if reply is None:
            raise ModelUnavailableError(f"{model} returned no choices")
        cut = reply.cut()
        if cut is not None:
            # A proxy's or server's timeout can end a stream cleanly mid-answer: kept, it
            # would be a half sentence stored as the reply or a tool call run with half
            # its arguments. It fails this attempt the way a dropped connection does.
            raise ModelUnavailableError(f"{model}'s answer was cut: {cut}; it is retried, not kept")
        return reply.result(request, self.name, model)

    async def _streamed(self, kwargs: dict[str, Any], profile: ProviderProfile) -> _Reply | None:
        """Read a streamed answer, calling ``on_chunk`` per chunk.

        An endpoint that ignores ``stream`` (some gateways and proxies in front of
        OpenAI-compatible servers) answers one JSON completion instead of server-sent
        events; that answer is read as it is, not taken for a broken stream.
        """
        raw = await self.client.chat.completions.with_raw_response.create(**kwargs)
        content_type = raw.headers.get("content-type", "").lower()
        model = kwargs["model"]
        if "json" in content_type and "event-stream" not in content_type:
            try:
                body = await raw.http_response.aread()
            except httpx2.TransportError as err:
                raise ModelUnavailableError(f"{model}'s connection dropped mid-answer: {type(err).__name__}") from None
            return _reply_of(ChatCompletion.model_validate_json(body), profile)
        stream = raw.parse()
        reply = _Reply()
        on_chunk = self.on_chunk
        try:
            async for chunk in stream:
                if on_chunk is not None:
                    on_chunk()
                model_text(reply.add_chunk(chunk, profile))
        except (openai.APIConnectionError, httpx2.TransportError) as err:
            # A reset or a closed connection before the last chunk: what arrived is not
            # the answer (the same as a stream ended cleanly too early, see _Reply.cut).
            cause = err.__cause__ if isinstance(err, openai.APIConnectionError) and err.__cause__ else err
            raise ModelUnavailableError(
                f"{model}'s connection dropped mid-answer ({type(cause).__name__}) after {reply.progress()}; "
                "it is retried, not kept"
            ) from None
        return reply if reply.choices else None


class _Reply:
    """An answer being read: from one response, or assembled from streamed chunks
    (tool-call deltas by ``index``, usage from whichever chunk carries it)."""

    __slots__ = ("choices", "content", "reasoning", "calls", "usage", "model", "finish_reason")

    def __init__(self) -> None:
        self.choices = 0
        self.finish_reason: str | None = None
        """The choice's ``finish_reason`` (``""``, as early Ollama sent mid-stream, is none)."""
        self.content: list[str] = []
        self.reasoning: list[str] = []
        self.calls: list[dict[str, Any]] = []
        self.usage: Any = None
        self.model = ""

    def add_chunk(self, chunk: Any, profile: ProviderProfile) -> str:
        """Add one streamed chunk; returns the reply text it carried ("" if none)."""
        text = ""
        if chunk.model:
            self.model = chunk.model
        if chunk.usage is not None:
            self.usage = chunk.usage
        for choice in chunk.choices or ():
            if choice.index:  # n > 1 is never asked for
                continue
            self.choices += 1
            if choice.finish_reason:
                self.finish_reason = choice.finish_reason
            extra = choice.model_extra or {}
            if extra.get("usage"):  # Moonshot: usage in the last chunk's choice
                self.usage = extra["usage"]
            delta = choice.delta
            if delta is None:
                continue
            if delta.content:
                self.content.append(delta.content)
                text += delta.content
            reasoning = _reasoning_of(delta, profile)
            if reasoning:
                self.reasoning.append(reasoning)
            for tc in delta.tool_calls or ():
                self._add_call_delta(tc)
        return text

    def _add_call_delta(self, tc: Any) -> None:
        function = tc.function
        name = (function.name if function is not None else None) or ""
        arguments = function.arguments if function is not None else None
        index = tc.index if isinstance(tc.index, int) else len(self.calls)
        slot = next((c for c in self.calls if c["index"] == index), None)
        if slot is not None and tc.id and slot["id"] and tc.id != slot["id"]:
            # A server that numbers every call 0 (each arrives whole): a new id is a new call.
            slot = None
            index = max(c["index"] for c in self.calls) + 1
        if slot is None:
            slot = {"index": index, "id": "", "name": "", "arguments": []}
            self.calls.append(slot)
        if tc.id:
            slot["id"] = tc.id
        if name and name != slot["name"]:
            slot["name"] += name
        if isinstance(arguments, dict):
            slot["arguments"] = arguments  # an object instead of a JSON string: taken as is
        elif arguments and isinstance(slot["arguments"], list):
            slot["arguments"].append(arguments)

    def add_response(self, response: Any, profile: ProviderProfile) -> None:
        self.model = response.model or ""
        self.usage = response.usage
        if not response.choices:
            return
        self.choices = 1
        self.finish_reason = response.choices[0].finish_reason or None
        message = response.choices[0].message
        if message.content:
            self.content.append(message.content)
        text = _reasoning_of(message, profile)
        if text:
            self.reasoning.append(text)
        for index, c in enumerate(message.tool_calls or ()):
            function = getattr(c, "function", None)
            if function is None:
                continue
            arguments = function.arguments
            self.calls.append(
                {
                    "index": index,
                    "id": c.id or "",
                    "name": function.name or "",
                    "arguments": arguments if isinstance(arguments, dict) else [arguments or ""],
                }
            )

    def cut(self) -> str | None:
        """What shows this answer to be cut short, or None when it is whole.

        Every profile's server ends a whole answer with a ``finish_reason`` on its choice
        (in the last chunk when streaming); ``data: [DONE]`` is not required (the SDK
        does not report it, and some llama.cpp forks never send it). Without one the
        answer is cut. With ``length`` (the output limit) it is cut only where a tool
        call's arguments are not complete JSON: plain text cut by the limit is a whole,
        truncated answer and is kept.

        Returns:
            A sentence naming what was cut (the text's length, or the tool call), or None.
        """
        if self.finish_reason and self.finish_reason != "length":
            return None  # the common case: no second parse of the arguments
        half = self._half_call()
        if not self.finish_reason:
            if half is not None:
                return f"no finish_reason, it ended inside the arguments of tool call {half}"
            if self.calls:
                return f"no finish_reason, it ended after {len(self.calls)} tool call(s)"
            return f"no finish_reason, it ended after {sum(map(len, self.content))} characters of text"
        if half is not None:
            return f"finish_reason 'length' (the output limit) inside the arguments of tool call {half}"
        return None

    def progress(self) -> str:
        """How much of the answer arrived, for an error message: characters of text and
        tool calls begun."""
        text = f"{sum(map(len, self.content))} characters of text"
        return f"{text} and {len(self.calls)} tool call(s)" if self.calls else text

    def _half_call(self) -> str | None:
        """The first tool call (name and id) whose arguments are not complete JSON."""
        for slot in sorted(self.calls, key=lambda c: c["index"]):
            arguments = slot["arguments"]
            if isinstance(arguments, dict):
                continue
            text = "".join(arguments).strip()
            try:
                json.loads(text)
            except (ValueError, RecursionError):
                return f"{slot['name']!r} ({slot['id'] or 'no id'}, {len(text)} characters)"
        return None

    def result(self, request: CallModelInput, provider: str, model: str) -> CallModelResult:
        calls = []
        for position, slot in enumerate(sorted(self.calls, key=lambda c: c["index"])):
            arguments = slot["arguments"]
            raw = arguments if isinstance(arguments, dict) else _clean("".join(arguments))
            tool_call_id = _clean(slot["id"]) or _stable_id(request, position)
            calls.append(parse_tool_call(tool_call_id, _clean(slot["name"]) or "", raw))
        return CallModelResult(
            message=Message(
                role="assistant",
                # "" and null mean the same; one form, whichever way the answer came.
                content=_clean("".join(self.content)) or None,
                tool_calls=calls,
                reasoning=_clean("".join(self.reasoning)) or None,
            ),
            usage=_usage(self.usage),
            provider=provider,
            model=self.model or model,
        )


def _reply_of(response: Any, profile: ProviderProfile) -> _Reply | None:
    reply = _Reply()
    reply.add_response(response, profile)
    return reply if reply.choices else None


def _reasoning_of(message: Any, profile: ProviderProfile) -> str | None:
    """The reasoning text a ``message`` or ``delta`` carries in the profile's fields."""
    if not profile.reasoning_fields:
        return None
    extra = message.model_extra or {}
    for field in profile.reasoning_fields:
        value = extra.get(field)
        if isinstance(value, str) and value:
            return value
    return None


def _stable_id(request: CallModelInput, position: int) -> str:
    """An id for a tool call that came without one: the same for every attempt of this
    step, distinct across steps and turns (servers such as llama.cpp may send ``""``)."""
    return f"call_{request.turn}_{request.step if request.step is not None else 0}_{position}"


def _usage(usage: Any) -> Usage:
    if usage is None:
        return Usage()
    if isinstance(usage, dict):
        return Usage(prompt_tokens=usage.get("prompt_tokens") or 0, completion_tokens=usage.get("completion_tokens") or 0)
    return Usage(prompt_tokens=usage.prompt_tokens or 0, completion_tokens=usage.completion_tokens or 0)


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
