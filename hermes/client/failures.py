"""What a failed Temporal call means: retry it, or raise which documented error.

Plain functions (no server): :func:`classify_failure` sorts what the Temporal SDK raised
into the kinds the retry policy (:mod:`hermes.client.retry`) acts on, and
:func:`documented_error` maps a failure not worth retrying to the error of
:mod:`hermes.errors` a caller catches (never a raw ``RPCError``).
"""

from __future__ import annotations

from typing import Literal

from temporalio.client import (
    RPCTimeoutOrCancelledError,
    WorkflowQueryFailedError,
    WorkflowUpdateFailedError,
)
from temporalio.exceptions import ApplicationError, WorkflowAlreadyStartedError
from temporalio.service import RPCError, RPCStatusCode

from hermes.errors import (
    CommandRefusedError,
    HermesError,
    MessageFailedError,
    MessageRejectedError,
    SessionClosedError,
    SessionForbiddenError,
    SessionHaltedError,
    SessionNotFoundError,
    TemporalRequestError,
    failed_to_replay,
)

_TRANSIENT_STATUSES = frozenset(
    {
        RPCStatusCode.UNAVAILABLE,  # "tcp connect error", "workflow update was aborted", a shard moving
        RPCStatusCode.UNKNOWN,  # "transport error": the connection broke mid-call
        RPCStatusCode.DEADLINE_EXCEEDED,
        RPCStatusCode.CANCELLED,  # by the transport, not by the caller (checked apart)
        RPCStatusCode.RESOURCE_EXHAUSTED,  # 10 updates in flight, a busy workflow, rate limits, closing
        RPCStatusCode.ABORTED,
        RPCStatusCode.INTERNAL,
    }
)
"""gRPC statuses worth retrying: the server was down, overloaded or mid-restart."""

FailureKind = Literal["busy", "transient", "exists", "closed", "fatal"]


def classify_failure(err: BaseException, *, admitted: bool = False, starts: bool = False) -> FailureKind:
    """What one failed Temporal call means for retrying it.

    Args:
        err: what the call raised.
        admitted: for a message, whether the server answered the update-with-start at
            least once in this attempt (the update was then admitted: it may be taken).
        starts: the call starts the workflow if needed (update-with-start, a start):
            a run that ended under it is found again (or its successor started) by the
            resend. False: the call addresses the workflow's current run (a signal, a
            query, a plain update), and "already completed" means it has ended for good.

    Returns:
        ``busy``: refused before it could be taken (the session's validator said busy,
        or Temporal refused to admit the update: 10 in flight, the run closing); retry,
        and the message was not taken by this attempt. ``transient``: the server was
        unreachable, restarting or failed mid-call; retry with the same id, the message
        may have been taken. ``exists``: update-with-start found a closed session.
        ``closed``: a signal or update reached a session whose workflow has ended
        (closed, archived, terminated): resending cannot change that
        (:class:`SessionClosedError`). ``fatal``: not worth retrying (see
        :func:`documented_error`).
    """
    if isinstance(err, WorkflowAlreadyStartedError):
        return "exists"
    if isinstance(err, WorkflowUpdateFailedError):
        kind = err.cause.type if isinstance(err.cause, ApplicationError) else None
        # UnprocessedUpdate: the server rejected an update its worker never handled
        # (e.g. the run ended in the same task); it was not taken.
        return "busy" if kind in ("SessionBusyError", "UnprocessedUpdate") else "fatal"
    if isinstance(err, RPCTimeoutOrCancelledError):
        return "transient"
    if isinstance(err, WorkflowQueryFailedError) and failed_to_replay(err.message):
        return "transient"
    if not isinstance(err, RPCError):
        return "fatal"
    if err.status == RPCStatusCode.ALREADY_EXISTS:
        # A bare ALREADY_EXISTS: a server that sends it without the details the SDK needs
        # to say so (the time-skipping test server).
        return "exists"
    if err.status == RPCStatusCode.RESOURCE_EXHAUSTED and not admitted:
        # Refused before admission (the registry's limit, a busy workflow lock, a rate
        # limit, or the run closing: an admitted update of a closing run is aborted).
        return "busy"
    if err.status in _TRANSIENT_STATUSES:
        return "transient"
    message = err.message.lower()
    if err.status == RPCStatusCode.FAILED_PRECONDITION and "workflow task in failed state" in message:
        # The session's workflow task is failing (e.g. during a server restart). An
        # update admitted earlier may still be taken once it recovers: not "busy".
        return "transient"
    if err.status == RPCStatusCode.NOT_FOUND and "already completed" in message and not starts:
        # "workflow execution already completed": a signal or update without a run id goes
        # to the workflow's current run, which a continue-as-new replaces atomically, so
        # this run is the last one. Retrying it for the whole window only delayed the
        # same answer (issue 16's review: a second close hung 120 s, then said 503).
        return "closed"
    if err.status == RPCStatusCode.NOT_FOUND and ("update" in message or "already completed" in message):
        # "workflow update was aborted by closing workflow", an update the restarted
        # server forgot, a run that ended under an update-with-start: the resend finds
        # the session (or its closed state) again.
        return "transient"
    return "fatal"


def documented_error(err: BaseException, session_id: str, *, user_id: str = "") -> HermesError | None:
    """The documented error that stands for a non-retryable Temporal failure ``err``, or
    None when ``err`` is not a Temporal failure (raise it unchanged). ``user_id``: for a
    message, who sent it (named by :class:`SessionForbiddenError`)."""
    if isinstance(err, WorkflowUpdateFailedError):
        cause = err.cause
        kind = cause.type if isinstance(cause, ApplicationError) else type(cause).__name__
        message = cause.message if isinstance(cause, ApplicationError) else str(cause)
        if kind == "MessageRejectedError":
            return MessageRejectedError(message)
        if kind == "SessionClosedError":
            return SessionClosedError(f"session {session_id!r} is closed")
        if kind == "SessionHaltedError":
            return SessionHaltedError(message)
        if kind == "SessionForbiddenError":
            return SessionForbiddenError(message, session_id=session_id, user_id=user_id)
        if kind == "CommandRefusedError":
            return CommandRefusedError(message, session_id=session_id, user_id=user_id)
        return MessageFailedError(
            f"session {session_id!r} failed the message ({kind}: {message})", reason=f"{kind}: {message}"
        )
    if isinstance(err, WorkflowQueryFailedError):
        return TemporalRequestError(f"session {session_id!r} failed the query: {err.message}", status="QUERY_FAILED")
    if isinstance(err, RPCError):
        if err.status == RPCStatusCode.NOT_FOUND:
            return SessionNotFoundError(f"no session {session_id!r} ({err.message})")
        return TemporalRequestError(
            f"Temporal refused the request ({err.status.name}): {err.message}", status=err.status.name
        )
    return None


def describe(err: BaseException) -> str:
    """``err`` in one line, for error messages: ``STATUS: message`` of an RPC error."""
    if isinstance(err, RPCError):
        return f"{err.status.name}: {err.message}"
    if isinstance(err, WorkflowUpdateFailedError):
        return str(err.cause)
    return f"{type(err).__name__}: {err}"
