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
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from pydantic import BaseModel, ValidationError
from pydantic.json_schema import models_json_schema
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from hermes.api.keys import Identity, KeyRing
from hermes.api.problems import PROBLEM_MEDIA_TYPE, Problem, ProblemDocument, problem_for, problem_response
from hermes.api.schemas import (
    ApprovalList,
    CreateSessionRequest,
    DecisionRequest,
    Health,
    MemoryList,
    MemorySearchResult,
    SendMessageRequest,
    SessionCreated,
    SessionList,
    Transcript,
)
from hermes.client import HermesClient
from hermes.errors import HermesError, SessionNotFoundError
from hermes.memory.models import ForgetReport
from hermes.models import DecisionRecord, SessionState, TurnResult
from hermes.settings import Settings

__all__ = ["OPERATIONS", "Backend", "create_app", "openapi_document"]

log = logging.getLogger("hermes.api")

MAX_IDEMPOTENCY_KEY_CHARS = 200
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

        Raises:
            Problem: 404 no such session, 403 not the key's (and not admin, nor an
                approver when ``deciding``), 503 no answer.
        """
        hermes = await self.client()
        try:
            state = await hermes.get_state(session_id)
        except SessionNotFoundError:
            raise Problem("not-found", f"no session {session_id!r}") from None
        if deciding and not identity.may_decide(state.user_id):
            raise Problem("forbidden", f"deciding approvals of session {session_id!r} needs its own user or the approver role")
        if not deciding and not identity.may_use(state.user_id):
            raise Problem("forbidden", f"session {session_id!r} belongs to another user")
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

            redis = own = connect_redis(self.settings.resolved_redis_url)
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
    """The identity of the request's ``Authorization: Bearer <key>``.

    Raises:
        Problem: 401 when the header is missing, not Bearer, or the key is unknown.
    """
    keys: KeyRing = request.app.state.keys
    challenge = {"WWW-Authenticate": 'Bearer realm="hermes"'}
    header = request.headers.get("authorization", "")
    scheme, _, key = header.partition(" ")
    if scheme.lower() != "bearer" or not key.strip():
        raise Problem("unauthorized", "send an API key as 'Authorization: Bearer <key>' (see `hermes keys add`)", headers=challenge)
    identity = keys.identify(key.strip())
    if identity is None:
        raise Problem("unauthorized", "unknown API key", headers=challenge)
    return identity


async def _body(request: Request, model: type[BaseModel], *, optional: bool = False) -> Any:
    """The request body as ``model``.

    Raises:
        Problem: 413 over ``api_max_body_bytes``; 400 not JSON (or not an object); 422
            fields that fail validation (pydantic's errors listed in ``errors``).
    """
    limit: int = request.app.state.max_body_bytes
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise Problem("payload-too-large", f"the body is {declared} bytes; the limit is {limit} bytes")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise Problem("payload-too-large", f"the body is over {limit} bytes, the limit")
        chunks.append(chunk)
    raw = b"".join(chunks)
    if not raw.strip():
        if optional:
            return model()
        raise Problem("malformed-request", "the request needs a JSON body")
    try:
        data = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise Problem("malformed-request", f"the body is not JSON: {err}") from None
    if not isinstance(data, dict):
        raise Problem("malformed-request", f"the body must be a JSON object, not {type(data).__name__}")
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
    key = request.headers.get("idempotency-key")
    if key is not None and not (0 < len(key) <= MAX_IDEMPOTENCY_KEY_CHARS and key.isprintable() and key.isascii()):
        raise Problem("malformed-request", f"Idempotency-Key must be 1-{MAX_IDEMPOTENCY_KEY_CHARS} printable ASCII characters")
    body: SendMessageRequest = await _body(request, SendMessageRequest)
    backend = _backend(request)
    state = await backend.owned_session(identity, session_id)
    hermes = await backend.client()
    result = await hermes.send_message(
        session_id, body.text, user_id=state.user_id, channel=state.channel,
        client_message_id=f"api-{key}" if key else None,
    )
    return _json(result)


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
    await (await backend.client()).close(session_id)
    return Response(status_code=204)


async def list_approvals(request: Request) -> Response:
    identity = _identity(request)
    hermes = await _backend(request).client()
    pending = await hermes.list_pending_approvals(user_id=None if identity.is_approver else identity.user_id)
    return _json(ApprovalList(approvals=pending))


async def _decide(request: Request, approved: bool) -> Response:
    from hermes.demo import decide

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


_SESSION_ERRORS = (401, 403, 404, 503)
OPERATIONS: tuple[Operation, ...] = (
    Operation("GET", "/health", health, "Whether Temporal and Redis answer (503 when either does not)", Health, auth=False, errors=(503,)),
    Operation("GET", "/openapi.json", openapi, "This document", None, auth=False),
    Operation("POST", "/v1/sessions", create_session, "Start a session owned by the key's user", SessionCreated, 201,
              CreateSessionRequest, (400, 401, 409, 413, 422, 503)),
    Operation("GET", "/v1/sessions", list_sessions, "The key's user's sessions, newest activity first", SessionList,
              errors=(401, 403, 422, 503), query=(("limit", "at most this many (1-500, default 50)", False),
                                                   ("user_id", "admin only: another user's", False))),
    Operation("GET", "/v1/sessions/{session_id}", get_session, "The session's state", SessionState, errors=_SESSION_ERRORS),
    Operation("POST", "/v1/sessions/{session_id}/messages", send_message,
              "Send a message and wait for the turn's result (a write tool call waits for its approval)", TurnResult, 200,
              SendMessageRequest, (400, 401, 403, 404, 409, 413, 422, 500, 502, 503),
              headers=(("Idempotency-Key", "the client message id: a resend with the same key returns the first reply and runs no second turn"),)),
    Operation("GET", "/v1/sessions/{session_id}/transcript", get_transcript, "The session's messages in order", Transcript,
              errors=_SESSION_ERRORS),
    Operation("POST", "/v1/sessions/{session_id}/close", close_session,
              "Close the session: pending approvals denied, new messages refused (409)", None, 204, errors=_SESSION_ERRORS),
    Operation("GET", "/v1/approvals", list_approvals,
              "Pending approvals the key may decide: its user's sessions', or every session's with the approver or admin role",
              ApprovalList, errors=(401, 503)),
    Operation("POST", "/v1/sessions/{session_id}/approvals/{tool_call_id}/approve", approve,
              "Approve a pending tool call as the key's user", DecisionRecord, 200, DecisionRequest, (400, 401, 403, 404, 409, 422, 503)),
    Operation("POST", "/v1/sessions/{session_id}/approvals/{tool_call_id}/reject", reject,
              "Reject a pending tool call as the key's user (the model is told)", DecisionRecord, 200, DecisionRequest,
              (400, 401, 403, 404, 409, 422, 503)),
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


def openapi_document() -> dict[str, Any]:
    """The OpenAPI 3.1 document of :data:`OPERATIONS`, schemas from the pydantic models."""
    models = {m for op in OPERATIONS for m in (op.body, op.response) if m is not None} | {ProblemDocument}
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
        item["responses"][str(op.status)] = ok
        for status in op.errors:
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
    400: "Malformed JSON, body or header", 401: "No or unknown API key", 403: "Not the key's session, or no role for it",
    404: "No such session or tool call", 409: "Session busy, closed, halted, existing; or decision already made",
    413: "Body too large", 422: "Validation failed", 500: "The session failed the message", 502: "Temporal refused the request",
    503: "Temporal, Redis or the session's worker unavailable",
}


def _path_params(path: str) -> list[str]:
    return [part[1:-1] for part in path.split("/") if part.startswith("{")]


# ------------------------------------------------------------------ the app


async def _on_problem(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, Problem)
    return problem_response(exc)


async def _on_hermes_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HermesError)
    return problem_response(problem_for(exc))


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
    )
    app.state.keys = keys if keys is not None else KeyRing(settings.resolved_api_keys_file)
    app.state.backend = Backend(settings, hermes)
    app.state.max_body_bytes = settings.api_max_body_bytes
    app.state.openapi = openapi_document()
    return app
