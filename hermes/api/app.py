"""The Starlette app of ``hermes serve``: sessions, messages, approvals, transcript and
memory over :class:`hermes.client.HermesClient`, for callers with an API key.

Every route is declared once in :data:`OPERATIONS`, from which both the router and the
OpenAPI 3.1 document (``GET /openapi.json``) are built, so the document describes every
route. Bodies are JSON; errors are problem documents (:mod:`hermes.api.problems`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError
from pydantic.json_schema import models_json_schema
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import FileResponse, JSONResponse, Response
from starlette.routing import Route

from hermes.api.keys import Identity, KeyRing
from hermes.api import openai_compat
from hermes.api.limits import AuthFailures, RateLimit, StreamSlots, stream_slot
from hermes.api.openai_compat import ChatCompletionRequest
from hermes.api.problems import PROBLEM_MEDIA_TYPE, Problem, ProblemDocument, problem_for, problem_response, session_not_found
from hermes.api.retries import (
    REPLAYED_HEADER,
    SESSION_ROUTE_ANSWERED_WINDOW_SECONDS,
    idempotency_key,
    message_name,
    request_fingerprint,
)
from hermes.api.sse import event_stream, sse
from hermes.api.schemas import (
    ApprovalList,
    CreateSessionRequest,
    DecisionRequest,
    Health,
    MemoryList,
    MemorySearchResult,
    SendMessageRequest,
    ServerInfo,
    SessionCreated,
    SessionList,
    Transcript,
)
from hermes.client import HermesClient
from hermes.client.streaming import first_possible_turn
from hermes.security.codec_server import nested_deeper_than
from hermes.errors import HermesError, SessionNotFoundError
from hermes.content.events import TurnEvent, check_offset
from hermes.security.http_security import PAGE_CSP, SecurityHeaders, bearer_token
from hermes.memory.models import ForgetReport
from hermes.models import DecisionRecord, SessionState, TurnResult
from hermes.settings import Settings

__all__ = ["OPERATIONS", "Backend", "create_app", "openapi_document"]

log = logging.getLogger("hermes.api")

DECISION_WAIT_SECONDS = 15.0
"""How long approve/reject waits for the session to record the decision (a worker must run)."""
HEALTH_TIMEOUT_SECONDS = 2.0


class Backend:
    """The :class:`HermesClient` behind the app, connected on first use, and again after
    a failed connection (so the server starts while Temporal is down and serves once it
    is up).

    Args:
        settings: Temporal address, namespace, task queue, Redis, retry timeout.
        hermes: an already connected client to use instead (tests, embedding).
    """

    def __init__(self, settings: Settings, hermes: HermesClient | None = None):
        self.settings = settings
        self._hermes = hermes
        self._lock = asyncio.Lock()

    async def client(self) -> HermesClient:
        """The client.

        Raises:
            Problem: 503 when Temporal cannot be reached.
        """
        if self._hermes is not None:
            return self._hermes
        async with self._lock:
            if self._hermes is None:
                try:
                    self._hermes = await asyncio.wait_for(HermesClient.connect(self.settings), 10.0)
                except (OSError, RuntimeError, asyncio.TimeoutError) as err:
                    raise Problem(
                        "unavailable",
                        f"cannot connect to Temporal at {self.settings.resolved_temporal_address}: {type(err).__name__}: {err}",
                        headers={"Retry-After": "5"},
                    ) from None
        return self._hermes

    async def owned_session(self, identity: Identity, session_id: str, *, deciding: bool = False) -> SessionState:
        """The state of ``session_id`` if ``identity`` reaches it (``deciding``: may decide
        its approvals, which the approver role also gives).

        A session the key does not reach is answered exactly as one that does not exist,
        so the answer never tells which ids exist.

        Raises:
            Problem: 404 no such session, or not one the key reaches (not its user's, not
                admin, nor an approver when ``deciding``); 503 no answer.
        """
        hermes = await self.client()
        try:
            state = await hermes.get_state(session_id)
        except SessionNotFoundError:
            state = None
        if state is None or not (identity.may_decide(state.user_id) if deciding else identity.may_use(state.user_id)):
            raise session_not_found(session_id)
        return state

    async def health(self) -> Health:
        """Whether Temporal and Redis answer (each within 2 s)."""
        temporal = redis_ok = False
        try:
            hermes = await self.client()
        except Problem:
            hermes = None
        if hermes is not None:
            try:
                temporal = await hermes.client.service_client.check_health(timeout=timedelta(seconds=HEALTH_TIMEOUT_SECONDS))
            except Exception as err:  # noqa: BLE001 - any failure is "does not answer"
                log.debug("temporal health check failed: %s", err)
        redis = hermes.redis if hermes is not None else None
        own = None
        if redis is None:
            from worker import connect_redis

            redis = own = connect_redis(self.settings.resolved_redis_url, self.settings)
        try:
            redis_ok = bool(await asyncio.wait_for(redis.ping(), HEALTH_TIMEOUT_SECONDS))
        except Exception as err:  # noqa: BLE001 - any failure is "does not answer"
            log.debug("redis health check failed: %s", err)
        finally:
            if own is not None:
                await own.aclose()
        return Health(status="ok" if temporal and redis_ok else "unavailable", temporal=temporal, redis=redis_ok)


# ------------------------------------------------------------------ request helpers


def _identity(request: Request) -> Identity:
    """The identity of the request's ``Authorization: Bearer <key>``, counted against its
    user's request rate; a missing or unknown key is counted against the client address
    (:mod:`hermes.api.limits`).

    Raises:
        Problem: 429 when the client address is over its failed authentications (before
            the key is looked at) or the user over its rate; 401 when the header is
            missing, not Bearer, or the key is unknown.
    """
    keys: KeyRing = request.app.state.keys
    failures: AuthFailures = request.app.state.auth_failures
    address = request.client.host if request.client is not None else ""
    failures.check(address)
    challenge = {"WWW-Authenticate": 'Bearer realm="hermes"'}
    key = bearer_token(request.headers.get("authorization"))
    if key is None:
        failures.add(address)
        raise Problem("unauthorized", "send an API key as 'Authorization: Bearer <key>' (see `hermes keys add`)", headers=challenge)
    identity = keys.identify(key)
    if identity is None:
        failures.add(address)
        raise Problem("unauthorized", "unknown API key", headers=challenge)
    request.app.state.rate.take(identity.user_id)
    return identity




MAX_BODY_DEPTH = 32
"""JSON objects and arrays nested deeper than this in a request body are refused (400):
no body of this API needs more than a few levels, and Python's parser (and pydantic's
validation after it) fails with a RecursionError, a 500, near a thousand."""


async def _body(request: Request, model: type[BaseModel], *, optional: bool = False) -> Any:
    """The request body as ``model`` (every route's body, the OpenAI-compatible one too).

    Raises:
        Problem: 413 over ``api_max_body_bytes``; 400 not JSON (not UTF-8, malformed, a
            number past Python's 4,300 digits, nested more than :data:`MAX_BODY_DEPTH`
            levels) or not an object; 422 fields that fail validation (pydantic's errors
            listed in ``errors``).
    """
    limit: int = request.app.state.max_body_bytes
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise Problem("payload-too-large", f"the body is {declared} bytes; the limit is {limit} bytes")
    chunks: list[bytes] = []
    size = 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise Problem("payload-too-large", f"the body is over {limit} bytes, the limit")
            chunks.append(chunk)
    except ClientDisconnect:  # gone, or cut off by the body timeout: nobody reads the answer
        raise Problem("malformed-request", "the client went away before sending the whole body") from None
    raw = b"".join(chunks)
    if not raw.strip():
        if optional:
            return model()
        raise Problem("malformed-request", "the request needs a JSON body")
    too_deep = f"the body is nested more than {MAX_BODY_DEPTH} levels deep (JSON objects and arrays); send a flatter body"
    try:
        data = json.loads(raw)
    except RecursionError:
        raise Problem("malformed-request", too_deep) from None
    except ValueError as err:  # JSONDecodeError, UnicodeDecodeError, an integer over 4,300 digits
        raise Problem("malformed-request", f"the body is not JSON: {err}") from None
    if not isinstance(data, dict):
        raise Problem("malformed-request", f"the body must be a JSON object, not {type(data).__name__}")
    if nested_deeper_than(data, MAX_BODY_DEPTH):
        raise Problem("malformed-request", too_deep)
    try:
        return model.model_validate(data)
    except ValidationError as err:
        errors = [{"loc": list(e["loc"]), "msg": e["msg"], "type": e["type"]} for e in err.errors()]
        raise Problem("validation-failed", "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in errors), errors=errors) from None


def _json(model: BaseModel, status: int = 200) -> Response:
    return Response(model.model_dump_json(), status_code=status, media_type="application/json")


def _backend(request: Request) -> Backend:
    return request.app.state.backend


# ------------------------------------------------------------------ handlers


async def health(request: Request) -> Response:
    report = await _backend(request).health()
    return _json(report, 200 if report.status == "ok" else 503)


async def chat_completions(request: Request) -> Response:
    """OpenAI-compatible chat completion (:mod:`hermes.api.openai_compat`)."""
    identity = _identity(request)
    body: ChatCompletionRequest = await _body(request, ChatCompletionRequest)
    hermes = await _backend(request).client()
    return await openai_compat.chat_completions(request, identity, body, hermes)


async def list_models(request: Request) -> Response:
    _identity(request)
    return JSONResponse(openai_compat.MODELS)


STATIC = Path(__file__).with_name("static")
_STATIC_TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8", ".css": "text/css; charset=utf-8"}


async def web_page(request: Request) -> Response:
    """The web chat (``static/index.html``; it signs in with an API key in the browser)."""
    return FileResponse(STATIC / "index.html", media_type=_STATIC_TYPES[".html"], headers={"Cache-Control": "no-cache"})


async def static_file(request: Request) -> Response:
    """One of the web chat's own files (no directory, nothing fetched from elsewhere)."""
    name = request.path_params["name"]
    path = STATIC / name
    if "/" in name or name.startswith(".") or path.suffix not in _STATIC_TYPES or not path.is_file():
        raise Problem("not-found", f"no file {name!r}")
    return FileResponse(path, media_type=_STATIC_TYPES[path.suffix], headers={"Cache-Control": "no-cache"})


async def info(request: Request) -> Response:
    """Who the key is and where the Temporal Web UI is (what the web chat shows)."""
    identity = _identity(request)
    settings = _backend(request).settings
    return _json(ServerInfo(
        user_id=identity.user_id, roles=sorted(identity.roles), namespace=settings.temporal_namespace,
        temporal_ui_url=settings.resolved_temporal_ui_url,
    ))


async def openapi(request: Request) -> Response:
    return JSONResponse(request.app.state.openapi)


async def create_session(request: Request) -> Response:
    identity = _identity(request)
    body: CreateSessionRequest = await _body(request, CreateSessionRequest, optional=True)
    hermes = await _backend(request).client()
    patch = body.config.model_dump(exclude_none=True) if body.config else {}
    config = hermes.config.model_copy(update=patch)
    session_id = body.session_id or f"api-{uuid.uuid4()}"
    await hermes.create_session(session_id, user_id=identity.user_id, channel=body.channel, config=config)
    return _json(SessionCreated(session_id=session_id, user_id=identity.user_id, channel=body.channel), 201)


async def list_sessions(request: Request) -> Response:
    identity = _identity(request)
    limit = _int_param(request, "limit", 50, 1, 500)
    user = request.query_params.get("user_id", identity.user_id)
    if not identity.may_use(user):
        raise Problem("forbidden", "only an admin key lists another user's sessions")
    hermes = await _backend(request).client()
    return _json(SessionList(sessions=await hermes.list_sessions(user, limit=limit)))


async def get_session(request: Request) -> Response:
    identity = _identity(request)
    state = await _backend(request).owned_session(identity, request.path_params["session_id"])
    return _json(state)


async def send_message(request: Request) -> Response:
    identity = _identity(request)
    session_id = request.path_params["session_id"]
    key = idempotency_key(request.headers)
    body: SendMessageRequest = await _body(request, SendMessageRequest)
    backend = _backend(request)
    state = await backend.owned_session(identity, session_id)
    hermes = await backend.client()
    # A retry of this request attaches to its turn (hermes.api.retries).
    fingerprint = request_fingerprint(identity.user_id, session_id, body.model_dump(mode="json", exclude_unset=True))
    window = request.app.state.retry_window_seconds
    name = await message_name(
        hermes, session_id, fingerprint=fingerprint, key=key,
        window_seconds=min(window, SESSION_ROUTE_ANSWERED_WINDOW_SECONDS) if window > 0 else 0,
    )
    replayed = {REPLAYED_HEADER: "true"} if name.retry else {}
    # The session's user is its owner; the sender is the key's user (an admin posting into
    # another's session is recorded as the admin and never decides what it caused).
    send = dict(
        user_id=state.user_id, channel=state.channel, client_message_id=name.client_message_id,
        sender=identity.user_id, roles=sorted(identity.roles),
    )
    if _wants_events(request):
        # Keepalives too: a message that comes while a turn awaits a human's approval is
        # held by the session (up to the approval timeout) before its own turn starts.
        # The state read above bounds the message's turn from below (its stream shows only that turn).
        send["first_turn"] = first_possible_turn(state)
        response = event_stream(_turn_events(hermes, session_id, body.text, send), on_close=stream_slot(request, identity))
        response.headers.update(replayed)
        return response
    result = await hermes.send_message(session_id, body.text, **send)  # type: ignore[arg-type]
    response = _json(result)
    response.headers.update(replayed)
    return response


def _wants_events(request: Request) -> bool:
    return "text/event-stream" in request.headers.get("accept", "")


async def _turn_events(hermes: HermesClient, session_id: str, text: str, send: dict[str, Any]) -> AsyncIterator[str]:
    """The SSE of one message: its own turn's events (``id`` = offset), then ``result`` (the
    TurnResult), or ``error`` (a problem document) if the message failed. A warning sent
    as a ``warning`` event is left out of the result's ``warnings``: each is sent once."""
    warned: set[str] = set()
    try:
        async for item in hermes.stream_message(session_id, text, **send):
            if isinstance(item, TurnEvent):
                if item.type == "warning":
                    warned.add(str(item.data.get("text", "")))
                yield sse(item.type, item.model_dump_json(), item.offset or None)
            else:
                unsent = [w for w in item.warnings if w not in warned]
                yield sse("result", item.model_copy(update={"warnings": unsent}).model_dump_json())
    except HermesError as err:
        yield sse("error", json.dumps(problem_for(err).document(), ensure_ascii=False, default=str))


async def session_events(request: Request) -> Response:
    """The session's turn events as they come (SSE, each ``id`` its offset), after the
    ``Last-Event-ID`` header's offset, else the ``after`` parameter's (``0-0``: every
    retained event), else only new ones; until the client disconnects. An offset that is
    malformed or after the session's newest event is a 400 (``EventLog.check_resume``)."""
    identity = _identity(request)
    session_id = request.path_params["session_id"]
    after = request.headers.get("last-event-id") or request.query_params.get("after")
    if after is not None:
        try:
            check_offset(after)
        except ValueError as err:
            raise Problem("malformed-request", str(err)) from None
    backend = _backend(request)
    await backend.owned_session(identity, session_id)
    hermes = await backend.client()
    events = hermes.events
    if events is None:
        raise Problem("events-unavailable", "turn events need Redis, which this server is not configured with")
    try:
        if after is None:
            after = await asyncio.wait_for(events.last_offset(session_id), HEALTH_TIMEOUT_SECONDS)
        else:
            await asyncio.wait_for(events.check_resume(session_id, after), HEALTH_TIMEOUT_SECONDS)
    except ValueError as err:
        raise Problem("malformed-request", str(err)) from None
    except Exception as err:  # noqa: BLE001
        raise Problem("events-unavailable", f"Redis did not answer: {err}") from None

    async def stream() -> AsyncIterator[str]:
        async for batch in events.follow(session_id, after, poll_ms=1_000):
            if await request.is_disconnected():
                return
            for event in batch:
                yield sse(event.type, event.model_dump_json(), event.offset)

    return event_stream(stream(), on_close=stream_slot(request, identity))


async def get_transcript(request: Request) -> Response:
    identity = _identity(request)
    session_id = request.path_params["session_id"]
    backend = _backend(request)
    await backend.owned_session(identity, session_id)
    messages = await (await backend.client()).get_transcript(session_id)
    return _json(Transcript(session_id=session_id, messages=messages))


async def close_session(request: Request) -> Response:
    identity = _identity(request)
    session_id = request.path_params["session_id"]
    backend = _backend(request)
    await backend.owned_session(identity, session_id)
    await (await backend.client()).close(session_id, sender=identity.user_id, roles=sorted(identity.roles))
    return Response(status_code=204)


async def list_approvals(request: Request) -> Response:
    identity = _identity(request)
    hermes = await _backend(request).client()
    pending = await hermes.list_pending_approvals(user_id=None if identity.is_approver else identity.user_id)
    # Only what this key may decide: the session itself refuses a confirmation by anyone but
    # its user or a listed approver, and an approval by the requester (PendingApproval.may_decide).
    return _json(ApprovalList(approvals=[p for p in pending if p.may_decide(identity.user_id) is None]))


async def _decide(request: Request, approved: bool) -> Response:
    from hermes.sessions.approvals import decide

    identity = _identity(request)
    session_id, tool_call_id = request.path_params["session_id"], request.path_params["tool_call_id"]
    body: DecisionRequest = await _body(request, DecisionRequest, optional=True)
    backend = _backend(request)
    hermes = await backend.client()
    await backend.owned_session(identity, session_id, deciding=True)
    try:
        record: DecisionRecord = await decide(
            hermes, session_id, tool_call_id, approved=approved, approver=identity.user_id, reason=body.reason,
            timeout_seconds=DECISION_WAIT_SECONDS,
        )
    except asyncio.TimeoutError:
        raise Problem("unavailable", f"session {session_id!r} did not record the decision within {DECISION_WAIT_SECONDS:g} s (is a worker running?)") from None
    if record.outcome == "unknown_tool_call":
        raise Problem("not-found", f"session {session_id!r} has no pending tool call {tool_call_id!r}")
    if record.outcome == "already_decided":
        raise Problem("already-decided", f"tool call {tool_call_id!r} was already decided; nothing changed")
    if record.outcome == "not_allowed":
        raise Problem("forbidden", f"{record.detail}; tool call {tool_call_id!r} is still pending")
    return _json(record)


async def approve(request: Request) -> Response:
    return await _decide(request, True)


async def reject(request: Request) -> Response:
    return await _decide(request, False)


def _memory_user(request: Request, identity: Identity) -> str:
    user = request.query_params.get("user_id", identity.user_id)
    if not identity.may_use(user):
        raise Problem("forbidden", "only an admin key reads another user's memories")
    return user


def _int_param(request: Request, name: str, default: int, low: int, high: int) -> int:
    raw = request.query_params.get(name)
    if raw is None:
        return default
    if not raw.isdigit() or not low <= int(raw) <= high:
        raise Problem("validation-failed", f"{name} must be an integer from {low} to {high}", errors=[{"loc": ["query", name], "msg": f"an integer from {low} to {high}", "type": "int_range"}])
    return int(raw)


async def _memory_call(call: Callable[[], Awaitable[Any]]) -> Any:
    from hermes.memory.store import MemoryStoreError

    try:
        return await call()
    except MemoryStoreError as err:
        raise Problem("memory-unavailable", f"the memory store cannot be read: {err}") from None
    except RuntimeError as err:
        raise Problem("memory-unavailable", str(err)) from None


async def search_memory(request: Request) -> Response:
    identity = _identity(request)
    user = _memory_user(request, identity)
    query = request.query_params.get("q", "")
    if not query.strip():
        raise Problem("validation-failed", "q (what to look for) is required", errors=[{"loc": ["query", "q"], "msg": "required", "type": "missing"}])
    limit = _int_param(request, "limit", 5, 1, 5)
    hermes = await _backend(request).client()
    found = await _memory_call(lambda: hermes.search_memories(user, query, limit=limit))
    return _json(MemorySearchResult(user_id=user, memories=found))


async def list_memory(request: Request) -> Response:
    identity = _identity(request)
    user = _memory_user(request, identity)
    limit = _int_param(request, "limit", 100, 1, 1000)
    archived = request.query_params.get("archived", "false").lower() in ("1", "true", "yes")
    hermes = await _backend(request).client()
    rows = await _memory_call(lambda: hermes.list_memories(user, archived=archived, limit=limit))
    return _json(MemoryList(user_id=user, memories=rows))


async def forget_memory(request: Request) -> Response:
    identity = _identity(request)
    user = _memory_user(request, identity)
    hermes = await _backend(request).client()
    report = await hermes.forget_user(user)
    return _json(report)


# ------------------------------------------------------------------ route table and OpenAPI


@dataclass(frozen=True)
class Operation:
    """One route: what the router calls and what the OpenAPI document says of it."""

    method: str
    path: str
    handler: Callable[[Request], Awaitable[Response]]
    summary: str
    response: type[BaseModel] | None
    status: int = 200
    body: type[BaseModel] | None = None
    errors: tuple[int, ...] = ()
    auth: bool = True
    query: tuple[tuple[str, str, bool], ...] = ()
    """(name, description, required) of query parameters."""
    headers: tuple[tuple[str, str], ...] = field(default_factory=tuple)
    event_stream: bool = False
    """Answers ``text/event-stream`` (each event's ``data`` a :class:`TurnEvent`)."""


_SESSION_ERRORS = (401, 404, 503)
OPERATIONS: tuple[Operation, ...] = (
    Operation("GET", "/health", health, "Whether Temporal and Redis answer (503 when either does not)", Health, auth=False, errors=(503,)),
    Operation("GET", "/openapi.json", openapi, "This document", None, auth=False),
    Operation("GET", "/", web_page, "The web chat page (HTML; sign in with an API key)", None, auth=False),
    Operation("GET", "/static/{name}", static_file, "A file of the web chat page", None, auth=False, errors=(404,)),
    Operation("GET", "/v1/info", info, "The key's identity and the Temporal Web UI's address", ServerInfo, errors=(401,)),
    Operation("POST", "/v1/sessions", create_session, "Start a session owned by the key's user", SessionCreated, 201,
              CreateSessionRequest, (400, 401, 409, 413, 422, 503)),
    Operation("GET", "/v1/sessions", list_sessions, "The key's user's sessions, newest activity first", SessionList,
              errors=(401, 403, 422, 503), query=(("limit", "at most this many (1-500, default 50)", False),
                                                   ("user_id", "admin only: another user's", False))),
    Operation("GET", "/v1/sessions/{session_id}", get_session, "The session's state", SessionState, errors=_SESSION_ERRORS),
    Operation("POST", "/v1/sessions/{session_id}/messages", send_message,
              "Send a message and wait for the turn's result (a write tool call waits for its approval); with "
              "Accept: text/event-stream, this message's own turn's events as they happen, then `result` (or `error`)", TurnResult, 200,
              SendMessageRequest, (400, 401, 403, 404, 409, 413, 422, 500, 502, 503),
              headers=(("Idempotency-Key", "names the message: a resend with the same key and body returns the first reply "
                        "and runs no second turn (another body: 422). Without it, the same body within "
                        "api_retry_window_seconds of the answer is taken as a retry"),),
              event_stream=True),
    Operation("GET", "/v1/sessions/{session_id}/events", session_events,
              "The session's turn events as server-sent events (text/event-stream; each id is the event's offset), "
              "after Last-Event-ID or `after`, else only new ones (400: an offset that is malformed or after the "
              "session's newest event)", None, errors=(400, 401, 404, 503),
              query=(("after", "an event offset ('<ms>-<seq>'); '0-0': every retained event", False),),
              headers=(("Last-Event-ID", "resume after this offset (what an EventSource sends on reconnect)"),),
              event_stream=True),
    Operation("GET", "/v1/sessions/{session_id}/transcript", get_transcript, "The session's messages in order", Transcript,
              errors=_SESSION_ERRORS),
    Operation("POST", "/v1/sessions/{session_id}/close", close_session,
              "Close the session: pending approvals denied, new messages refused (409); 409 when it is closed already",
              None, 204, errors=(*_SESSION_ERRORS, 409)),
    Operation("GET", "/v1/approvals", list_approvals,
              "Pending approvals the key may decide: of its user's sessions, and with the approver or admin role of any "
              "session, each only if the session would take the key's user's decision (a write call: its user or a "
              "listed approver; an admin call: a listed approver, anyone but the requester when none is listed)",
              ApprovalList, errors=(401, 503)),
    Operation("POST", "/v1/sessions/{session_id}/approvals/{tool_call_id}/approve", approve,
              "Approve a pending tool call as the key's user", DecisionRecord, 200, DecisionRequest, (400, 401, 403, 404, 409, 422, 503)),
    Operation("POST", "/v1/sessions/{session_id}/approvals/{tool_call_id}/reject", reject,
              "Reject a pending tool call as the key's user (the model is told)", DecisionRecord, 200, DecisionRequest,
              (400, 401, 403, 404, 409, 422, 503)),
    Operation("POST", "/v1/chat/completions", chat_completions,
              "OpenAI-compatible chat completion on a durable session (X-Hermes-Session-Id header or `user`): only the "
              "newest user message is taken, the session holds the history; `stream: true` answers chat.completion.chunk "
              "server-sent events", None, 200, ChatCompletionRequest, (400, 401, 403, 409, 413, 422, 503),
              headers=(("X-Hermes-Session-Id", "the session (else the body's `user`)"),
                       ("Idempotency-Key", "names the message (as on /v1/sessions/{id}/messages): a retry attaches to "
                        "its turn; without it, the same body within api_retry_window_seconds of the answer does"),
                       ("X-Hermes-Tool-Progress", "streamed: `none` (default, the answer's text only), `reasoning` (tool "
                        "calls, approvals and warnings as `delta.reasoning_content` lines) or `content` (those lines in "
                        "the text)")),
              event_stream=True),
    Operation("GET", "/v1/models", list_models, "OpenAI-compatible model list: `hermes`", None, errors=(401,)),
    Operation("GET", "/v1/memory", search_memory, "Search the key's user's long-term memories", MemorySearchResult,
              errors=(401, 403, 422, 503), query=(("q", "what to look for, any language", True),
                                                  ("limit", "at most this many (1-5, default 5)", False),
                                                  ("user_id", "admin only: another user's", False))),
    Operation("GET", "/v1/memory/list", list_memory, "The key's user's memories, newest first", MemoryList,
              errors=(401, 403, 422, 503), query=(("limit", "at most this many (1-1000, default 100)", False),
                                                  ("archived", "true: the archive's rows", False),
                                                  ("user_id", "admin only: another user's", False))),
    Operation("DELETE", "/v1/memory", forget_memory, "Forget every long-term memory of the key's user", ForgetReport,
              errors=(401, 403, 503), query=(("user_id", "admin only: another user's", False),)),
)


OPENAI_PATHS = frozenset({"/v1/chat/completions", "/v1/models"})


def openapi_document() -> dict[str, Any]:
    """The OpenAPI 3.1 document of :data:`OPERATIONS`, schemas from the pydantic models."""
    models = {m for op in OPERATIONS for m in (op.body, op.response) if m is not None} | {ProblemDocument, TurnEvent}
    _, defs = models_json_schema(
        [(m, "serialization") for m in sorted(models, key=lambda m: m.__name__)],
        ref_template="#/components/schemas/{model}",
    )
    schemas = defs.get("$defs", {})
    for model in models:  # request bodies in their validation form
        if model in {op.body for op in OPERATIONS}:
            schemas[model.__name__] = model.model_json_schema(ref_template="#/components/schemas/{model}", mode="validation")
            schemas.update(schemas[model.__name__].pop("$defs", {}))
    paths: dict[str, dict[str, Any]] = {}
    for op in OPERATIONS:
        item: dict[str, Any] = {"summary": op.summary, "operationId": op.handler.__name__, "responses": {}}
        params = [{"name": name, "in": "path", "required": True, "schema": {"type": "string"}}
                  for name in _path_params(op.path)]
        params += [{"name": n, "in": "query", "required": req, "description": d, "schema": {"type": "string"}} for n, d, req in op.query]
        params += [{"name": n, "in": "header", "required": False, "description": d, "schema": {"type": "string"}} for n, d in op.headers]
        if params:
            item["parameters"] = params
        if op.body is not None:
            item["requestBody"] = {
                "required": op.method == "POST" and op.handler not in (approve, reject, create_session),
                "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{op.body.__name__}"}}},
            }
        ok: dict[str, Any] = {"description": "OK" if op.status != 201 else "Created"}
        if op.response is not None:
            ok["content"] = {"application/json": {"schema": {"$ref": f"#/components/schemas/{op.response.__name__}"}}}
        elif op.handler is openapi:
            ok["content"] = {"application/json": {"schema": {"type": "object"}}}
        if op.event_stream:
            ok.setdefault("content", {})["text/event-stream"] = {
                "schema": {"type": "string", "description": "server-sent events; each `data` is a TurnEvent "
                           "(`#/components/schemas/TurnEvent`), `result` a TurnResult, `error` a problem document"},
            }
        item["responses"][str(op.status)] = ok
        for status in sorted({*op.errors, *((401, 429) if op.auth else ())}):
            item["responses"][str(status)] = {
                "description": _STATUS_TEXT[status],
                "content": {PROBLEM_MEDIA_TYPE: {"schema": {"$ref": "#/components/schemas/ProblemDocument"}}},
            }
        if op.auth:
            item["security"] = [{"bearerKey": []}]
        paths.setdefault(op.path, {})[op.method.lower()] = item
    return {
        "openapi": "3.1.0",
        "info": {"title": "Hermes Agent API", "version": "1",
                 "description": "Durable agent sessions on Temporal. Errors are RFC 9457 problem documents."},
        "paths": paths,
        "components": {"schemas": schemas, "securitySchemes": {"bearerKey": {"type": "http", "scheme": "bearer"}}},
    }


_STATUS_TEXT = {
    400: "Malformed JSON, body or header", 401: "No or unknown API key", 403: "Another user's memories, or a decision the session refuses",
    404: "No such session (or not the key's: the same answer) or tool call", 409: "Session busy, closed, halted, existing; or decision already made",
    413: "Body too large", 422: "Validation failed", 429: "Too many requests by this user, failed keys from this address, or open event streams (Retry-After)", 500: "The session failed the message", 502: "Temporal refused the request",
    503: "Temporal, Redis or the session's worker unavailable",
}


def _path_params(path: str) -> list[str]:
    return [part[1:-1] for part in path.split("/") if part.startswith("{")]


# ------------------------------------------------------------------ the app


def _answer(request: Request, problem: Problem) -> Response:
    if request.url.path in OPENAI_PATHS:
        # The OpenAI SDK reads an error's message from an `error` member; `param` names the
        # (first) field at fault, as OpenAI's own errors do.
        errors = problem.extensions.get("errors") or [{}]
        param = ".".join(str(part) for part in errors[0].get("loc", ())) or None
        problem.extensions.setdefault(
            "error", {"message": problem.detail, "type": problem.slug, "param": param, "code": problem.status}
        )
    return problem_response(problem)


async def _on_problem(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, Problem)
    return _answer(request, exc)


async def _on_hermes_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HermesError)
    return _answer(request, problem_for(exc))


async def _on_http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    slug = {404: "not-found", 405: "method-not-allowed"}.get(exc.status_code, "malformed-request")
    problem = Problem(slug, str(exc.detail))
    return problem_response(problem)


async def _on_unexpected(request: Request, exc: Exception) -> Response:
    log.exception("unexpected failure of %s %s", request.method, request.url.path, exc_info=exc)
    return problem_response(Problem("internal", f"{type(exc).__name__}: {exc}"))


def create_app(
    settings: Settings,
    *,
    keys: KeyRing | None = None,
    hermes: HermesClient | None = None,
) -> Starlette:
    """The API app.

    Args:
        settings: where Temporal and Redis are, ``api_keys_file``, ``api_max_body_bytes``.
        keys: the key ring; default: ``KeyRing(settings.resolved_api_keys_file)``.
        hermes: a connected client to use; default: connect with ``settings`` on the
            first request that needs Temporal (again after a failure: 503 until then).

    Raises:
        ConfigError: the key file is malformed.
    """
    app = Starlette(
        routes=[Route(op.path, op.handler, methods=[op.method]) for op in OPERATIONS],
        exception_handlers={Problem: _on_problem, HermesError: _on_hermes_error, HTTPException: _on_http_error,
                            Exception: _on_unexpected},
        middleware=[Middleware(SecurityHeaders, csp=PAGE_CSP)],
    )
    app.state.keys = keys if keys is not None else KeyRing(settings.resolved_api_keys_file)
    app.state.backend = Backend(settings, hermes)
    app.state.max_body_bytes = settings.api_max_body_bytes
    app.state.rate = RateLimit(settings.api_rate_per_minute)
    app.state.auth_failures = AuthFailures(settings.api_auth_failures_per_minute)
    app.state.streams = StreamSlots(settings.api_max_streams_per_user)
    app.state.retry_window_seconds = settings.api_retry_window_seconds
    app.state.openapi = openapi_document()
    return app
