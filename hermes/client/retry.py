"""The retry-on-outage policy: how long to retry a Temporal call, and when to give up.

* :func:`call_with_retries` runs a query, signal, describe or start, retrying transient
  failures for ``retry_timeout_seconds`` after the first, and raises only the errors of
  :mod:`hermes.errors`.
* :class:`MessageRetryPolicy` decides, after each failed attempt to send a message,
  whether to resend it (after which pause), to ask the session whether it took it, or to
  give up as busy or unavailable. A plain object (the caller passes the loop time), so its
  decisions are tested without a server.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from temporalio.client import WithStartWorkflowOperation

from hermes.client.failures import (
    FailureKind,
    classify_failure,
    describe,
    documented_error,
)
from hermes.errors import SessionClosedError, SessionUnavailableError

T = TypeVar("T")

DEFAULT_RETRY_TIMEOUT_SECONDS = 120.0
"""How long a call keeps retrying transient failures by default: long enough to ride
out a restart of the Temporal server (a dev server restarts in seconds, a cluster's
rolling restart in about a minute)."""

_FIRST_DELAY_SECONDS = 0.05
_MAX_DELAY_SECONDS = 2.0


def backoff_seconds(attempt: int, *, first: float = _FIRST_DELAY_SECONDS, cap: float = _MAX_DELAY_SECONDS) -> float:
    """The pause before retry number ``attempt`` (0-based): ``first`` doubling up to
    ``cap``, with "equal jitter" (half fixed, half random) so that many callers refused
    at the same moment do not come back at the same moment."""
    delay = min(cap, first * (2 ** min(attempt, 30)))
    return delay / 2 + random.uniform(0, delay / 2)


def being_cancelled() -> bool:
    """Whether the caller cancelled this task: the SDK turns a cancellation into
    ``WorkflowUpdateRPCTimeoutOrCancelledError``, which must not be retried."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


def start_answered(start: WithStartWorkflowOperation[Any, Any]) -> bool:
    """Whether the start half of an update-with-start was answered (so the server had
    admitted the update at least once). Reads the start's own future either way, so
    that asyncio does not print "Future exception was never retrieved" for it."""
    future = getattr(start, "_workflow_handle", None)
    if not isinstance(future, asyncio.Future):
        return True  # cannot tell: assume the worst (it may have been taken)
    if not future.done():
        return False
    if future.cancelled():
        return False
    return future.exception() is None


async def call_with_retries(
    session_id: str,
    what: str,
    call: Callable[[], Awaitable[T]],
    *,
    retry_timeout_seconds: float,
    starts: bool = False,
) -> T:
    """Run one query, signal, describe or start, retrying transient failures.

    Args:
        session_id: the session it is about (for the errors).
        what: what is done, for the errors (e.g. ``"get_state"``).
        call: makes and awaits one attempt.
        retry_timeout_seconds: how long to retry, in seconds from the first failure.
        starts: ``call`` starts the workflow if needed (see :func:`classify_failure`).

    Raises:
        SessionNotFoundError: no such session.
        SessionClosedError: a signal or update reached a session whose workflow has
            ended (closed, archived or terminated); nothing was delivered.
        SessionUnavailableError: still failing ``retry_timeout_seconds`` after the
            first failure.
        TemporalRequestError: Temporal refused the request itself.
    """
    loop = asyncio.get_running_loop()
    first_failure: float | None = None
    attempt = 0
    while True:
        try:
            return await call()
        except asyncio.CancelledError:
            raise
        except Exception as err:  # noqa: BLE001 - sorted below; unknown ones re-raised
            if being_cancelled():
                raise asyncio.CancelledError from err
            kind = classify_failure(err, starts=starts)
            if kind == "closed":
                raise SessionClosedError(
                    f"session {session_id!r} is closed (its workflow has ended): {what} was not delivered"
                ) from err
            if kind == "fatal" or kind == "exists":
                documented = documented_error(err, session_id)
                if documented is None:
                    raise
                raise documented from err
            now = loop.time()
            first_failure = now if first_failure is None else first_failure
            delay = backoff_seconds(attempt)
            if now + delay > first_failure + retry_timeout_seconds:
                raise SessionUnavailableError(
                    f"{what} on session {session_id!r}: Temporal did not answer within "
                    f"{retry_timeout_seconds:g} s ({describe(err)})",
                    session_id=session_id,
                    last_error=describe(err),
                ) from err
            await asyncio.sleep(delay)
            attempt += 1


@dataclass(frozen=True)
class NextStep:
    """What to do after a failed attempt to send a message.

    ``action``: ``resend`` after ``delay_seconds``; ``ask`` the session whether it took
    the message (the busy deadline passed after refusals from Temporal alone), then, if it
    did, resend after ``delay_seconds`` (:meth:`MessageRetryPolicy.taken_after_all`);
    ``busy``: give up, the message was not taken; ``unavailable``: give up, it may have been.
    """

    action: Literal["resend", "ask", "busy", "unavailable"]
    delay_seconds: float = 0.0


class MessageRetryPolicy:
    """The resend decisions of one message, attempt by attempt.

    "Busy" is said only when no attempt may have been taken: once one may have been (a
    transient failure), busy refusals are retried to the outage deadline, since only the
    session's answer to the same id can settle what happened to the message.

    Args:
        retry_timeout_seconds: how long transient failures are retried, in seconds from
            the start of the current outage (the last attempt the session answered).
        busy_deadline: loop time (seconds) after which busy refusals end the retries.
    """

    def __init__(self, *, retry_timeout_seconds: float, busy_deadline: float):
        self.retry_timeout_seconds = retry_timeout_seconds
        self.busy_deadline = busy_deadline
        self.outage_since: float | None = None
        """When the current run of transient failures began (None: none since the
        session last answered)."""
        self.may_have_been_taken = False
        """Whether any attempt failed after the message could have been recorded: then
        "busy" would be a guess, and the client never says it."""
        self.attempt = 0

    def after_failure(self, kind: FailureKind, *, admitted: bool, refused_by_session: bool, now: float) -> NextStep:
        """The step after an attempt that failed with ``kind`` ``busy`` or ``transient``.

        Args:
            kind: :func:`classify_failure` of the attempt's error.
            admitted: the server answered the attempt's start (the session was reached).
            refused_by_session: the refusal came from the session's own validator, not
                from Temporal alone (updates in flight, a closing run).
            now: the loop time, in seconds.
        """
        delay = backoff_seconds(self.attempt)
        self.attempt += 1
        if kind == "transient":
            self.may_have_been_taken = True
            if admitted or self.outage_since is None:
                # The session answered this attempt: an outage starts from here.
                self.outage_since = now
        if self.may_have_been_taken:
            assert self.outage_since is not None
            # The whole window is used: the last pause ends at the deadline, where one
            # more attempt is made (giving up when a pause would pass it gave up early,
            # after half the window when the jitter drew a long pause).
            retry_deadline = self.outage_since + self.retry_timeout_seconds
            if now >= retry_deadline:
                return NextStep("unavailable")
            return NextStep("resend", min(delay, max(retry_deadline - now, 0.0)))
        if now >= self.busy_deadline:
            # The session's own refusal came after every earlier attempt reached it (in
            # the order Temporal admitted them): it settles the message as not taken.
            # A refusal from Temporal alone does not; then the session is asked.
            return NextStep("busy") if refused_by_session else NextStep("ask", delay)
        return NextStep("resend", min(delay, self.busy_deadline - now))  # a last attempt at the deadline

    def taken_after_all(self, now: float) -> None:
        """The session said it took the message (an attempt hidden from this client was
        admitted, aborted, delivered again): from now on resend under the same id, which
        only waits for its reply, to the outage deadline."""
        self.may_have_been_taken = True
        self.outage_since = now
