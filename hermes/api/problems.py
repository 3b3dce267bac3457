"""Errors of the HTTP API as RFC 9457 problem documents (``application/problem+json``).

Every error response has the members ``type`` (a URI naming the kind of problem, here
``https://hermes-agent.dev/problems/<slug>``; not fetched, only compared), ``title`` (the
kind, the same for every occurrence), ``status`` (the HTTP status) and ``detail`` (this
occurrence), plus extension members where they help: ``errors`` (422: pydantic's
validation errors), ``client_message_id`` and ``may_have_been_taken`` (503 on a message).

Statuses: 400 malformed JSON or header, 401 no or unknown key, 403 another user's
memories or a decision the session refuses, 404 no such session or one the key does not
reach (the same answer: :func:`session_not_found`; or route, or tool call), 409 busy / closed / halted / exists /
already decided, 413 body too large, 422 validation or an ``Idempotency-Key`` reused with another request, 429 over a rate or the open-stream cap, 500 a failure the session did not
explain, 502 Temporal refused the request itself, 503 Temporal (or the session's worker)
unavailable.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field
from starlette.responses import JSONResponse

from hermes.errors import (
    CommandRefusedError,
    HermesError,
    MessageFailedError,
    MessageRejectedError,
    SessionBusyError,
    SessionClosedError,
    SessionConfigError,
    SessionExistsError,
    SessionForbiddenError,
    SessionHaltedError,
    SessionNotFoundError,
    SessionUnavailableError,
    TemporalRequestError,
)

__all__ = ["PROBLEM_MEDIA_TYPE", "Problem", "ProblemDocument", "problem_for", "problem_response", "session_not_found"]

PROBLEM_MEDIA_TYPE = "application/problem+json"
TYPE_BASE = "https://hermes-agent.dev/problems/"

_TITLES: dict[str, tuple[int, str]] = {
    "malformed-request": (400, "Malformed request"),
    "unauthorized": (401, "Missing or unknown API key"),
    "forbidden": (403, "Not allowed for this key"),
    "not-found": (404, "Not found"),
    "method-not-allowed": (405, "Method not allowed"),
    "session-busy": (409, "Session busy"),
    "session-closed": (409, "Session closed"),
    "session-halted": (409, "Session halted on an approval"),
    "session-exists": (409, "Session exists"),
    "already-decided": (409, "Tool call already decided"),
    "payload-too-large": (413, "Request body too large"),
    "validation-failed": (422, "Validation failed"),
    "rate-limited": (429, "Too many requests"),
    "too-many-streams": (429, "Too many open event streams"),
    "message-rejected": (422, "Message rejected"),
    "idempotency-key-reused": (422, "Idempotency-Key reused with another request"),
    "message-failed": (500, "The session failed the message"),
    "temporal-refused": (502, "Temporal refused the request"),
    "internal": (500, "Internal error"),
    "unavailable": (503, "Temporal unavailable"),
    "memory-unavailable": (503, "Memory store unavailable"),
    "events-unavailable": (503, "Turn events unavailable (Redis)"),
}


class ProblemDocument(BaseModel):
    """RFC 9457 problem details (the OpenAPI schema of every error response)."""

    type: str = Field(description="URI of the kind of problem, e.g. https://hermes-agent.dev/problems/session-busy")
    title: str = Field(description="Short summary of the kind of problem")
    status: int = Field(description="The HTTP status code")
    detail: str = Field(description="What happened this time")
    errors: list[dict[str, Any]] | None = Field(default=None, description="422: pydantic's validation errors (loc, msg, type)")
    client_message_id: str | None = Field(default=None, description="503 on a message: the id it was sent under; resend the same request (with its Idempotency-Key, if any) for its reply")
    may_have_been_taken: bool | None = Field(default=None, description="503 on a message: whether it may have run")


class Problem(Exception):
    """Raised by a handler to answer with a problem document.

    Args:
        slug: the kind (a key of the table above: ``session-busy``, ``forbidden``...),
            which fixes ``type``, ``title`` and ``status``.
        detail: what happened this time.
        headers: extra response headers (``WWW-Authenticate``, ``Retry-After``).
        **extensions: extra members of the document.
    """

    def __init__(self, slug: str, detail: str, *, headers: dict[str, str] | None = None, **extensions: Any):
        self.status, self.title = _TITLES[slug]
        self.slug = slug
        self.detail = detail
        self.headers = headers or {}
        self.extensions = {k: v for k, v in extensions.items() if v is not None}
        super().__init__(detail)

    def document(self) -> dict[str, Any]:
        return {"type": TYPE_BASE + self.slug, "title": self.title, "status": self.status, "detail": self.detail, **self.extensions}


def problem_response(problem: Problem) -> JSONResponse:
    """The HTTP response of ``problem``."""
    return JSONResponse(problem.document(), status_code=problem.status, headers=problem.headers, media_type=PROBLEM_MEDIA_TYPE)


def session_not_found(session_id: str) -> Problem:
    """The one answer (404) for a session that does not exist and for one the key does not
    reach, so no answer tells which session ids exist."""
    return Problem("not-found", f"no session {session_id!r}")


def problem_for(err: HermesError) -> Problem:
    """The problem that stands for one of :class:`~hermes.client.HermesClient`'s
    documented errors (any other :class:`HermesError`: 500)."""
    if isinstance(err, SessionNotFoundError):
        return Problem("not-found", str(err))
    if isinstance(err, SessionBusyError):
        return Problem("session-busy", f"{err}; the message was not taken", headers={"Retry-After": "1"})
    if isinstance(err, SessionClosedError):
        return Problem("session-closed", str(err))
    if isinstance(err, SessionHaltedError):
        return Problem("session-halted", str(err))
    if isinstance(err, SessionExistsError):
        return Problem("session-exists", str(err))
    if isinstance(err, CommandRefusedError):
        # The API signs every command with its command key: a refusal means this server's
        # keys are not the workers' (a deployment mistake), not that the caller may not.
        return Problem("internal", f"{err} (this API server's HERMES_COMMAND_KEYS must be the workers')")
    if isinstance(err, SessionForbiddenError):
        return Problem("forbidden", str(err))
    if isinstance(err, SessionConfigError):
        loc = ["config", *err.field.split(".")] if err.field else ["config"]
        return Problem("validation-failed", str(err), errors=[{"loc": loc, "msg": str(err), "type": "session_config"}])
    if isinstance(err, MessageRejectedError):
        return Problem("message-rejected", str(err))
    if isinstance(err, SessionUnavailableError):
        return Problem(
            "unavailable", str(err), headers={"Retry-After": "5"},
            client_message_id=err.client_message_id, may_have_been_taken=err.may_have_been_taken if err.client_message_id else None,
        )
    if isinstance(err, TemporalRequestError):
        return Problem("temporal-refused", str(err))
    if isinstance(err, MessageFailedError):
        return Problem("message-failed", str(err))
    return Problem("internal", f"{type(err).__name__}: {err}")
