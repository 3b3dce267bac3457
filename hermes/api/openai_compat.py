"""An OpenAI-compatible endpoint over durable sessions: ``POST /v1/chat/completions``
(streamed and not) and ``GET /v1/models``, so an OpenAI SDK or a chat UI that speaks that
wire talks to a Hermes session.

What differs from OpenAI's API (the wire is OpenAI's "Create chat completion", the
``chat.completion`` object and, streamed, ``chat.completion.chunk`` objects as
server-sent events ending with ``data: [DONE]``):

* **The session holds the history.** The session id comes from the ``X-Hermes-Session-Id``
  header, else from the request's ``user`` field, bound to the key's user
  (:func:`openai_session_id`: ``openai-<16 hex of the key's user>-<user>``), so two users
  sending the same ``user`` never share, take or pre-create each other's session. Only
  the newest message is taken, and it must be the user's. Earlier messages of the request
  are ignored: the session already has them (or has its own). A session that does not
  exist is started, owned by the key's user; another user's is answered 404, as one that
  does not exist.
* **Tools are Hermes'.** They run inside the session (with its approvals); a request's own
  ``tools`` (and ``functions``) are refused (422). A streamed answer's ``content`` is the
  reply's text only. Tool progress (each tool call as ``> tool calculate {...}`` then
  ``> calculate: code 0``; a call waiting for a human's approval as ``> waiting for approval
  of save_note (...)``, the stream going on once someone decides, ``POST
  /v1/sessions/{id}/approvals/{tool_call_id}/approve``; warnings) comes only when the
  request asks for it with the ``X-Hermes-Tool-Progress`` header (:data:`TOOL_PROGRESS_HEADER`):
  ``reasoning`` puts the lines in ``delta.reasoning_content``, the field DeepSeek's API
  streams its reasoning in and that Open WebUI, LiteLLM and vLLM clients show apart from
  the answer (Open WebUI as a collapsible "Thinking" block); ``content`` mixes them into
  the text as before; ``none`` (the default) leaves them out.
* ``model`` is echoed; the session's configured model answers. The request is checked
  strictly (:class:`ChatCompletionRequest`): sampling and length parameters
  (``temperature``, ``max_tokens``... :data:`IGNORED_FIELDS`) are accepted and ignored;
  what would change the contract (``tools``, ``functions``, ``tool_choice``,
  ``function_call``, ``response_format`` other than text, ``n`` > 1, ``logprobs``, audio)
  and unknown fields are refused (422, naming the field). ``usage`` is zero.
* **A retry runs nothing again.** The OpenAI SDK resends a request that timed out or got a
  5xx (twice by default, with no ``Idempotency-Key``): a resend of a request still running
  waits for its turn, and one of a request answered within ``api_retry_window_seconds``
  gets its answer, streamed or not as asked (:mod:`hermes.api.retries`). The same body
  sent again on purpose within the window needs a distinct ``Idempotency-Key``.
* Errors are problem documents (RFC 9457) that also carry OpenAI's ``error`` member, so
  an OpenAI SDK raises them with their message. Inside a stream, an error is a
  ``data: {"error": {...}}`` event (what the OpenAI SDK raises from).
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from collections.abc import AsyncIterator
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from hermes.api.keys import Identity
from hermes.api.limits import stream_slot
from hermes.api.problems import Problem, problem_for, session_not_found
from hermes.api.retries import REPLAYED_HEADER, idempotency_key, message_name, request_fingerprint
from hermes.api.schemas import SESSION_ID_PATTERN
from hermes.api.sse import event_stream
from hermes.client import HermesClient
from hermes.client.streaming import first_possible_turn
from hermes.errors import HermesError, SessionNotFoundError
from hermes.content.events import TurnEvent
from hermes.models import TurnResult

__all__ = [
    "IGNORED_FIELDS", "MODELS", "MODEL_ID", "REFUSED_FIELDS", "ChatCompletionRequest", "chat_completions", "openai_session_id",
]

MODEL_ID = "hermes"
"""The model id ``GET /v1/models`` lists (any ``model`` is accepted and echoed)."""
SESSION_HEADER = "x-hermes-session-id"
_SESSION_ID = re.compile(SESSION_ID_PATTERN)


class ChatMessageIn(BaseModel):
    """One message of the request. Only the last one is read (its ``content``); the others
    are the caller's copy of the history, which the session already holds, so their other
    members (``name``, ``tool_calls``...) are accepted as they are."""

    model_config = ConfigDict(extra="allow", strict=True)

    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | list[dict[str, Any]] | None = None


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    include_usage: bool | None = None
    """Honoured: a last chunk with ``usage`` (zero)."""
    include_obfuscation: bool | None = None
    """Ignored (no obfuscation padding is sent)."""


REFUSED_FIELDS: dict[str, str] = {
    "tools": "the session's own tools run inside Hermes (with its approvals); a request cannot bring tools",
    "tool_choice": "the session's model chooses among the session's own tools",
    "functions": "the session's own tools run inside Hermes; a request cannot bring functions",
    "function_call": "the session's model chooses among the session's own tools",
    "audio": "replies are text only",
    "web_search_options": "the session has no web search of OpenAI's",
    "top_logprobs": "log probabilities are not available",
}
"""Fields that would change what the caller gets back: refused (422) when set, naming the
field and why. An empty ``tools`` or ``functions`` list asks for nothing and is taken."""

IGNORED_FIELDS = (
    "temperature", "top_p", "frequency_penalty", "presence_penalty", "max_tokens", "max_completion_tokens",
    "stop", "seed", "logit_bias", "metadata", "store", "service_tier", "parallel_tool_calls", "reasoning_effort",
    "verbosity", "prompt_cache_key", "safety_identifier", "prediction",
)
"""Fields accepted (type-checked) and ignored: the session's configured model and its
settings decide sampling, length and storage (README, "OpenAI-compatible endpoint")."""


class ChatCompletionRequest(BaseModel):
    """OpenAI's "Create chat completion" body, strictly: an unknown field, a value of the
    wrong type (``"stream": "yes"``), or a field that would change the contract
    (:data:`REFUSED_FIELDS`; ``n`` other than 1; ``response_format`` other than text;
    ``logprobs``; ``modalities`` other than text) is a 422 naming the field. Honoured:
    ``model`` (echoed), ``messages`` (the last, the user's), ``stream``,
    ``stream_options.include_usage``, ``user`` (names the key's user's session when
    there is no ``X-Hermes-Session-Id``: :func:`openai_session_id`). Accepted and ignored: :data:`IGNORED_FIELDS`."""

    model_config = ConfigDict(extra="forbid", strict=True)

    model: str = Field(default=MODEL_ID, max_length=200)
    messages: list[ChatMessageIn] = Field(min_length=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = Field(default=None, max_length=200)
    n: int | None = None
    response_format: dict[str, Any] | None = None
    logprobs: bool | None = None
    modalities: list[str] | None = None
    # Refused when set (REFUSED_FIELDS).
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    functions: list[dict[str, Any]] | None = None
    function_call: str | dict[str, Any] | None = None
    audio: dict[str, Any] | None = None
    web_search_options: dict[str, Any] | None = None
    top_logprobs: int | None = None
    # Accepted and ignored (IGNORED_FIELDS).
    temperature: float | None = None
    top_p: float | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    stop: str | list[str] | None = None
    seed: int | None = None
    logit_bias: dict[str, float] | None = None
    metadata: dict[str, str] | None = None
    store: bool | None = None
    service_tier: str | None = None
    parallel_tool_calls: bool | None = None
    reasoning_effort: str | None = None
    verbosity: str | None = None
    prompt_cache_key: str | None = None
    safety_identifier: str | None = None
    prediction: dict[str, Any] | None = None

    @field_validator(*REFUSED_FIELDS)
    @classmethod
    def _refused(cls, value: Any, info: ValidationInfo) -> Any:
        if value is None or (info.field_name in ("tools", "functions") and value == []):
            return value
        raise ValueError(f"`{info.field_name}` is not taken: {REFUSED_FIELDS[str(info.field_name)]}")

    @field_validator("n")
    @classmethod
    def _one_choice(cls, value: int | None) -> int | None:
        if value not in (None, 1):
            raise ValueError(f"`n` is {value}: a session gives one reply per message, so `n` must be 1")
        return value

    @field_validator("response_format")
    @classmethod
    def _text_only(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        if value is not None and value.get("type") != "text":
            raise ValueError(
                f"`response_format` type {value.get('type')!r} is not taken: the session's model answers in "
                "plain text (only {'type': 'text'})"
            )
        return value

    @field_validator("logprobs")
    @classmethod
    def _no_logprobs(cls, value: bool | None) -> bool | None:
        if value:
            raise ValueError("`logprobs` is not taken: log probabilities are not available")
        return value

    @field_validator("modalities")
    @classmethod
    def _text_modality(cls, value: list[str] | None) -> list[str] | None:
        if value is not None and value != ["text"]:
            raise ValueError(f"`modalities` {value} is not taken: replies are text only (['text'])")
        return value


def _text_of(message: ChatMessageIn) -> str:
    content = message.content
    if isinstance(content, str):
        return content
    parts = [p.get("text", "") for p in content or [] if isinstance(p, dict) and p.get("type") == "text"]
    if content and len(parts) != len(content):
        raise Problem("validation-failed", "only text content parts are taken (no images or audio)")
    return "".join(parts)


def check_request(body: ChatCompletionRequest) -> None:
    """Refuse a last message that is not the user's (422); the model refused the rest."""
    if body.messages[-1].role != "user":
        last = len(body.messages) - 1
        raise Problem(
            "validation-failed", f"the last message must be the user's (got {body.messages[-1].role!r})",
            errors=[{"loc": ["messages", last, "role"], "msg": "the last message must be the user's", "type": "value_error"}],
        )


def openai_session_id(user_id: str, user: str) -> str:
    """The session a request's ``user`` field names for a key of ``user_id``.

    The id is bound to the key's user, so users never collide: the same ``user`` sent
    with keys of two users names two sessions, and no one can take, or start ahead of
    time, the session another user's requests will land in.

    Args:
        user_id: the key's user (any string).
        user: the request's ``user`` (a valid session id, 1-200 of ``[A-Za-z0-9._:@-]``).

    Returns:
        ``openai-<first 16 hex of SHA-256(user_id)>-<user>``; when that is over 200
        characters, ``user`` is replaced by the first 32 hex of its SHA-256.
    """
    owner = hashlib.sha256(user_id.encode("utf-8")).hexdigest()[:16]
    session_id = f"openai-{owner}-{user}"
    if len(session_id) > 200:
        session_id = f"openai-{owner}-{hashlib.sha256(user.encode('utf-8')).hexdigest()[:32]}"
    return session_id


def _session_id(request: Request, body: ChatCompletionRequest, identity: Identity) -> str:
    explicit = request.headers.get(SESSION_HEADER)
    named = explicit or body.user
    if not named:
        raise Problem(
            "malformed-request",
            "which session? send the X-Hermes-Session-Id header (or the `user` field): the session holds the history",
        )
    if not _SESSION_ID.match(named):
        raise Problem("malformed-request", f"session id {named[:80]!r} must be 1-200 letters, digits or ._:@-")
    return explicit or openai_session_id(identity.user_id, named)


async def chat_completions(request: Request, identity: Identity, body: ChatCompletionRequest, hermes: HermesClient) -> Response:
    """``POST /v1/chat/completions`` (the app's handler reads the key and the body): the
    newest user message to the session; the reply as a ``chat.completion``, or streamed
    as ``chat.completion.chunk`` events."""
    check_request(body)
    progress = tool_progress(request)
    text = _text_of(body.messages[-1])
    session_id = _session_id(request, body, identity)
    user_id = identity.user_id
    try:
        state = await hermes.get_state(session_id)
    except SessionNotFoundError:
        state = None
    if state is not None:
        if not identity.may_use(state.user_id):
            raise session_not_found(session_id)
        user_id = state.user_id
    fingerprint = request_fingerprint(identity.user_id, session_id, body.model_dump(mode="json", exclude_unset=True))
    name = await message_name(
        hermes, session_id, fingerprint=fingerprint, key=idempotency_key(request.headers),
        window_seconds=request.app.state.retry_window_seconds, session_exists=state is not None,
    )
    send = dict(user_id=user_id, channel="openai", client_message_id=name.client_message_id)
    completion_id = f"chatcmpl-{session_id}-{int(time.time() * 1000)}"
    if body.stream:
        usage = bool(body.stream_options and body.stream_options.include_usage)
        chunks = _chunks(
            hermes, session_id, text, send, completion_id, body.model, usage, retry=name.retry, progress=progress,
            first_turn=first_possible_turn(state),  # the state read above: no second query
        )
        # With keepalive comments, which the OpenAI SDK skips.
        response = event_stream(chunks, on_close=stream_slot(request, identity))
    else:
        result = await hermes.send_message(session_id, text, **send)  # type: ignore[arg-type]
        response = JSONResponse(_completion(result, completion_id, body.model))
    if name.retry:
        response.headers[REPLAYED_HEADER] = "true"
    return response


def _completion(result: TurnResult, completion_id: str, model: str) -> dict[str, Any]:
    return {
        "id": completion_id,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": result.reply}, "finish_reason": _finish(result)}
        ],
        "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0},
        "hermes": {"session_id": result.session_id, "turn": result.turn, "status": result.status},
    }


def _finish(result: TurnResult) -> str:
    return "length" if result.status == "max_iterations" else "stop"


def _data(value: Any) -> str:
    return f"data: {json.dumps(value, ensure_ascii=False)}\n\n"


async def _chunks(
    hermes: HermesClient, session_id: str, text: str, send: dict[str, Any], completion_id: str, model: str, usage: bool,
    *, retry: bool = False, progress: str = "none", first_turn: int | None = None,
) -> AsyncIterator[str]:
    """The chunks of a streamed completion; a ``retry`` of a message the session took
    already gets its whole reply in one chunk (the turn's earlier events went to the
    first request). ``progress``: where tool progress goes (:data:`TOOL_PROGRESS_MODES`);
    ``first_turn``: see :func:`hermes.client.streaming.stream_message`."""
    created = int(time.time())

    def chunk(delta: dict[str, Any], finish: str | None = None) -> str:
        return _data({
            "id": completion_id, "object": "chat.completion.chunk", "created": created, "model": model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        })

    yield chunk({"role": "assistant", "content": ""})
    try:
        items = (
            _whole_reply(hermes, session_id, text, send) if retry
            else hermes.stream_message(session_id, text, first_turn=first_turn, **send)
        )
        async for item in items:
            if isinstance(item, TurnEvent):
                shown = answer_text(item)
                if shown:
                    yield chunk({"content": shown})
                elif progress != "none" and (shown := progress_text(item)):
                    yield chunk({"content" if progress == "content" else "reasoning_content": shown})
                continue
            yield chunk({}, _finish(item))
            if usage:
                yield _data({
                    "id": completion_id, "object": "chat.completion.chunk", "created": created, "model": model,
                    "choices": [], "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0},
                })
    except HermesError as err:
        problem = problem_for(err)
        yield _data({"error": {"message": problem.detail, "type": problem.slug, "code": problem.status}})
    yield "data: [DONE]\n\n"


async def _whole_reply(hermes: HermesClient, session_id: str, text: str, send: dict[str, Any]) -> AsyncIterator[TurnEvent | TurnResult]:
    result = await hermes.send_message(session_id, text, **send)
    if result.reply:
        yield TurnEvent(session_id=session_id, turn=result.turn, type="text_delta", data={"text": result.reply})
    yield result


def answer_text(event: TurnEvent) -> str:
    """What a turn event adds to the answer's text ("" for nothing): the reply's text,
    and the note that a cut-off attempt starts again (the text already sent stays)."""
    if event.type == "text_delta":
        return str(event.data.get("text", ""))
    if event.type == "attempt_discarded":
        return "\n\n> (the answer was cut off; it starts again)\n\n"
    return ""


def progress_text(event: TurnEvent) -> str:
    """The tool-progress line of a turn event ("" for nothing): tool calls, approvals,
    warnings, sent only where the request asked (:data:`TOOL_PROGRESS_HEADER`)."""
    d = event.data
    if event.type == "tool_call_started":
        return f"\n\n> tool {d.get('name')} {d.get('arguments', '')}\n"
    if event.type == "tool_call_finished" and not d.get("retrying"):
        return f"> {d.get('name')}: code {d.get('code')}\n\n"
    if event.type == "approval_requested":
        return (
            f"\n\n> waiting for approval of {d.get('name')} (tool_call_id {d.get('tool_call_id')}): "
            f"POST /v1/sessions/{event.session_id}/approvals/{d.get('tool_call_id')}/approve (or /reject)\n\n"
        )
    if event.type == "approval_decided":
        word = "approved" if d.get("approved") else (d.get("outcome") or "rejected")
        return f"> {d.get('name')}: {word}" + (f" by {d.get('approver')}" if d.get("approver") else "") + "\n\n"
    if event.type == "warning":
        return f"\n\n> warning: {d.get('text')}\n\n"
    return ""


TOOL_PROGRESS_HEADER = "X-Hermes-Tool-Progress"
"""The request header that asks a streamed completion for tool progress (see the module
docstring): one of :data:`TOOL_PROGRESS_MODES`; absent: ``none``."""
TOOL_PROGRESS_MODES = ("none", "reasoning", "content")
"""``none``: the answer's text only; ``reasoning``: progress lines as
``delta.reasoning_content``; ``content``: progress lines inside the answer's text."""


def tool_progress(request: Request) -> str:
    """The tool-progress mode the request asks for (:data:`TOOL_PROGRESS_HEADER`).

    Raises:
        Problem: ``malformed-request`` (400) for a value not in :data:`TOOL_PROGRESS_MODES`.
    """
    mode = request.headers.get(TOOL_PROGRESS_HEADER, "none").strip().lower() or "none"
    if mode not in TOOL_PROGRESS_MODES:
        raise Problem(
            "malformed-request", f"{TOOL_PROGRESS_HEADER} must be one of {', '.join(TOOL_PROGRESS_MODES)}, not {mode[:40]!r}"
        )
    return mode


MODELS = {"object": "list", "data": [{"id": MODEL_ID, "object": "model", "created": 0, "owned_by": "hermes"}]}
"""``GET /v1/models``: the one model id, ``hermes``."""
