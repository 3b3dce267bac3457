"""The client hides outages, and "busy" means not taken.

* Unit level, with a fake Temporal client: which failures are retried, that a message
  is resent under the same client message id, that the deadlines raise the documented
  errors, that "busy" is never said once an attempt may have been taken, and that the
  update-with-start's start future never goes unretrieved.
* A session's validator takes a resend of a message it already answered while the run
  drains for continue-as-new, instead of calling it busy (the real cause of a "busy"
  said of a message that was processed).
* A Temporal dev server of this test's own, SIGKILLed and restarted mid-turn: the
  caller gets its reply and no error.
* A busy verdict from Temporal alone is settled with the session first: a message an
  attempt hidden from the client delivered is answered, not called busy.
* A flood of messages to one session with a short busy deadline: every refused message
  is absent from the transcript, every accepted one present exactly once.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import signal
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from temporalio.client import (
    Client,
    WorkflowQueryFailedError,
    WorkflowUpdateFailedError,
    WorkflowUpdateRPCTimeoutOrCancelledError,
    WorkflowUpdateStage,
)
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError, RPCStatusCode

from hermes import names
from hermes.client import HermesClient, backoff_seconds, classify_failure, message_update_id
from hermes.errors import (
    HermesError,
    MessageFailedError,
    SessionBusyError,
    SessionClosedError,
    SessionHaltedError,
    SessionNotFoundError,
    SessionUnavailableError,
    TemporalRequestError,
)
from hermes.models import CallModelInput, CallModelResult, Message, SendMessageInput, SessionConfig, TurnResult
from hermes.settings import Settings
from hermes.infra.stack import EmbeddedStack, free_port
from hermes.tools.builtin import register_builtins
from hermes.tools.registry import ToolRegistry
from tests.support import eventually, signed
from worker import build_worker


def rpc(status: RPCStatusCode, message: str = "boom") -> RPCError:
    return RPCError(message, status, b"")


def refused(kind: str, message: str = "refused") -> WorkflowUpdateFailedError:
    """What the SDK raises when the session's update validator refuses a message."""
    return WorkflowUpdateFailedError(ApplicationError(message, type=kind))


# --------------------------------------------------------------------------- classification


@pytest.mark.parametrize(
    "err, admitted, kind",
    [
        (rpc(RPCStatusCode.UNAVAILABLE, "tcp connect error"), False, "transient"),
        (rpc(RPCStatusCode.UNKNOWN, "transport error"), True, "transient"),
        (rpc(RPCStatusCode.UNAVAILABLE, "workflow update was aborted"), True, "transient"),
        (rpc(RPCStatusCode.DEADLINE_EXCEEDED), False, "transient"),
        (rpc(RPCStatusCode.CANCELLED), True, "transient"),
        (WorkflowUpdateRPCTimeoutOrCancelledError(), True, "transient"),
        (rpc(RPCStatusCode.FAILED_PRECONDITION, "Unable to query workflow due to Workflow Task in failed state."), False, "transient"),
        (rpc(RPCStatusCode.NOT_FOUND, "workflow update was aborted by closing workflow"), True, "transient"),
        # Refused before admission: not taken. After admission: it may have been taken.
        (rpc(RPCStatusCode.RESOURCE_EXHAUSTED, "limit on number of concurrent in-flight updates has been reached (10)"), False, "busy"),
        (rpc(RPCStatusCode.RESOURCE_EXHAUSTED, "Workflow is busy."), True, "transient"),
        (refused("SessionBusyError"), True, "busy"),
        (refused("UnprocessedUpdate"), True, "busy"),
        (refused("SessionClosedError"), True, "fatal"),
        (refused("SessionHaltedError"), True, "fatal"),
        (rpc(RPCStatusCode.ALREADY_EXISTS), False, "exists"),
        (rpc(RPCStatusCode.INVALID_ARGUMENT, "Blob data size exceeds limit."), False, "fatal"),
        (rpc(RPCStatusCode.NOT_FOUND, "workflow not found for ID: s-1"), False, "fatal"),
        (rpc(RPCStatusCode.FAILED_PRECONDITION, "something else"), False, "fatal"),
        (ValueError("a bug"), False, "fatal"),
        # A query a worker failed to answer while replaying the session (issue 12's soak).
        (WorkflowQueryFailedError("[TMPRL1100] Nondeterminism error: Update machine does not handle this event"), False, "transient"),
        (WorkflowQueryFailedError("no query handler named get_nothing"), False, "fatal"),
    ],
)
def test_failures_are_classified_as_transient_busy_or_fatal(err, admitted, kind):
    assert classify_failure(err, admitted=admitted) == kind


def test_a_completed_workflow_is_closed_for_a_signal_but_transient_for_an_update_with_start():
    completed = rpc(RPCStatusCode.NOT_FOUND, "workflow execution already completed")
    assert classify_failure(completed) == "closed"
    # An update-with-start's resend finds the run that replaced it, or the closed session.
    assert classify_failure(completed, admitted=True, starts=True) == "transient"


def test_backoff_doubles_up_to_its_cap_with_jitter():
    for attempt in range(12):
        nominal = min(2.0, 0.05 * 2**attempt)
        delays = [backoff_seconds(attempt) for _ in range(50)]
        assert all(nominal / 2 <= d <= nominal for d in delays)
    assert len({backoff_seconds(10) for _ in range(20)}) > 1  # jittered


def test_a_non_positive_retry_timeout_is_refused_with_its_name():
    with pytest.raises(ValueError, match="retry_timeout_seconds must be positive"):
        HermesClient(object(), retry_timeout_seconds=0)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- a fake Temporal client


class Admitted:
    """An outcome of one update-with-start attempt whose start half was answered (the
    server admitted the update) before ``error`` was raised."""

    def __init__(self, error: BaseException):
        self.error = error


class FakeTemporal:
    """Stands in for ``temporalio.client.Client``: each update-with-start attempt takes
    the next scripted outcome (a result, an exception raised before admission, or an
    :class:`Admitted`), and settles the start operation's future as the SDK does."""

    def __init__(self, *outcomes: Any, queries: list[Any] | None = None, settlements: list[Any] | None = None):
        self.outcomes = list(outcomes)
        self.queries = list(queries or [])
        self.settlements = list(settlements or [])
        """Answers to the client's settle_message updates: True, an exception, or a
        callable giving either (default: the session's refusal, "not taken")."""
        self.attempts: list[tuple[str, str | None]] = []
        """(update id, client message id) of every attempt."""
        self.signals: list[str] = []
        self.settled: list[str] = []
        """Client message ids the client asked the session about."""

    async def execute_update_with_start_workflow(self, update: str, arg: SendMessageInput, **kwargs: Any) -> Any:
        start = kwargs["start_workflow_operation"]
        self.attempts.append((kwargs["id"], arg.client_message_id))
        await asyncio.sleep(0)
        outcome = self.outcomes.pop(0)
        if isinstance(outcome, Admitted):
            start._workflow_handle.set_result(self.get_workflow_handle(start._start_workflow_input.id))
            raise outcome.error
        if isinstance(outcome, BaseException):
            start._workflow_handle.set_exception(outcome)
            raise outcome
        start._workflow_handle.set_result(self.get_workflow_handle(start._start_workflow_input.id))
        return outcome

    def get_workflow_handle(self, workflow_id: str, **_: Any) -> Any:
        fake = self

        class Handle:
            id = workflow_id

            async def query(self, name: str, **_: Any) -> Any:
                outcome = fake.queries.pop(0)
                if isinstance(outcome, BaseException):
                    raise outcome
                return outcome

            async def execute_update(self, name: str, arg: Any, **_: Any) -> Any:
                assert name == names.SETTLE_MESSAGE
                fake.settled.append(arg)
                outcome = fake.settlements.pop(0) if fake.settlements else refused("MessageNotTaken")
                if callable(outcome):
                    outcome = outcome()
                if isinstance(outcome, BaseException):
                    raise outcome
                return outcome

            async def describe(self) -> Any:
                # The session's user, whom a close / cancel / prompt change is signed as.
                from types import SimpleNamespace

                from temporalio.common import TypedSearchAttributes

                return SimpleNamespace(typed_search_attributes=TypedSearchAttributes.empty)

            async def signal(self, name: str, *args: Any, **kwargs: Any) -> None:
                fake.signals.append(name)
                outcome = fake.queries.pop(0)
                if isinstance(outcome, BaseException):
                    raise outcome

        return Handle()


def reply(text: str = "hi") -> TurnResult:
    return TurnResult(session_id="s-1", turn=1, reply=text)


@contextlib.contextmanager
def unretrieved_futures() -> Iterator[list[str]]:
    """Collects asyncio's "exception was never retrieved" reports made in the block."""
    loop = asyncio.get_running_loop()
    previous = loop.get_exception_handler()
    seen: list[str] = []

    def handler(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        seen.append(str(context.get("message")))

    loop.set_exception_handler(handler)
    try:
        yield seen
        gc.collect()  # an unretrieved future reports when it is collected
    finally:
        loop.set_exception_handler(previous)


async def test_a_message_rides_out_transient_failures_under_the_same_message_id():
    fake = FakeTemporal(
        rpc(RPCStatusCode.UNAVAILABLE, "tcp connect error"),
        Admitted(rpc(RPCStatusCode.UNKNOWN, "transport error")),
        rpc(RPCStatusCode.UNAVAILABLE, "workflow update was aborted"),
        rpc(RPCStatusCode.FAILED_PRECONDITION, "Unable to perform workflow execution update due to Workflow Task in failed state."),
        Admitted(WorkflowUpdateRPCTimeoutOrCancelledError()),
        reply("made it"),
    )
    hermes = HermesClient(fake, retry_timeout_seconds=30)  # type: ignore[arg-type]
    with unretrieved_futures() as unretrieved:
        result = await hermes.send_message("s-1", "hello", client_message_id="m-1")
    assert result.reply == "made it"
    assert fake.attempts == [(message_update_id("anonymous", "m-1"), "m-1")] * 6
    assert unretrieved == []


async def test_a_generated_message_id_is_kept_for_every_resend():
    fake = FakeTemporal(rpc(RPCStatusCode.UNAVAILABLE), rpc(RPCStatusCode.UNAVAILABLE), reply())
    await HermesClient(fake).send_message("s-1", "hello")  # type: ignore[arg-type]
    [cid] = {cid for _, cid in fake.attempts}
    assert cid is not None and cid.startswith("msg-") and len(fake.attempts) == 3


async def test_busy_refusals_past_the_busy_deadline_raise_busy_and_leave_no_unretrieved_future():
    fake = FakeTemporal(*[rpc(RPCStatusCode.RESOURCE_EXHAUSTED, "limit on number of concurrent in-flight updates")] * 3, *[refused("SessionBusyError", "the session is continuing as new")] * 100)
    hermes = HermesClient(fake)  # type: ignore[arg-type]
    with unretrieved_futures() as unretrieved:
        with pytest.raises(SessionBusyError, match="not taken"):
            await hermes.send_message("s-1", "hello", busy_timeout_seconds=0.3)
    assert len(fake.attempts) >= 2  # retried (how often depends on the jitter)
    assert unretrieved == []


IN_FLIGHT = "limit on number of concurrent in-flight updates has been reached (10)"


async def test_a_busy_verdict_from_temporal_alone_is_settled_with_the_session_before_it_is_said():
    # Every attempt the client saw was refused by Temporal (10 updates in flight), yet an
    # attempt hidden from it (admitted, aborted by the server, delivered again) was taken:
    # the session says so, and the client resends under the same id for the reply.
    fake = FakeTemporal(*[rpc(RPCStatusCode.RESOURCE_EXHAUSTED, IN_FLIGHT)] * 500)

    def taken() -> bool:
        fake.outcomes = [refused("SessionBusyError"), reply("taken after all")]
        return True

    fake.settlements = [taken]
    hermes = HermesClient(fake, retry_timeout_seconds=30)  # type: ignore[arg-type]
    result = await hermes.send_message("s-1", "hello", client_message_id="m-3", busy_timeout_seconds=0.2)
    assert result.reply == "taken after all"
    assert fake.settled == ["m-3"] and {cid for _, cid in fake.attempts} == {"m-3"}


async def test_a_busy_verdict_is_said_when_the_session_refused_or_says_it_did_not_take_it():
    # The session's own refusal settles it (it came after every earlier attempt); a
    # refusal from Temporal alone is settled by asking.
    by_session = FakeTemporal(*[rpc(RPCStatusCode.RESOURCE_EXHAUSTED, IN_FLIGHT)] * 2, *[refused("SessionBusyError")] * 500)
    with pytest.raises(SessionBusyError, match="not taken"):
        await HermesClient(by_session).send_message("s-1", "hi", busy_timeout_seconds=0.2)  # type: ignore[arg-type]
    assert by_session.settled == []
    by_temporal = FakeTemporal(*[refused("SessionBusyError")] * 2, *[rpc(RPCStatusCode.RESOURCE_EXHAUSTED, IN_FLIGHT)] * 500)
    with pytest.raises(SessionBusyError, match="not taken"):
        # 2 s, not 0.2: on a loaded machine the first two attempts alone can take 0.2 s,
        # and then the verdict would rest on the session's refusals.
        await HermesClient(by_temporal).send_message("s-1", "hi", client_message_id="m-5", busy_timeout_seconds=2.0)  # type: ignore[arg-type]
    assert by_temporal.settled == ["m-5"]


async def test_a_busy_verdict_the_session_cannot_settle_is_reported_as_unknown():
    fake = FakeTemporal(
        *[rpc(RPCStatusCode.RESOURCE_EXHAUSTED, IN_FLIGHT)] * 500,
        settlements=[rpc(RPCStatusCode.NOT_FOUND, "workflow not found for ID: s-1")],
    )
    hermes = HermesClient(fake, retry_timeout_seconds=30)  # type: ignore[arg-type]
    with pytest.raises(SessionUnavailableError) as raised:
        await hermes.send_message("s-1", "hello", client_message_id="m-4", busy_timeout_seconds=0.2)
    assert raised.value.may_have_been_taken and raised.value.client_message_id == "m-4"
    assert "did not say whether it took the message" in str(raised.value)


async def test_a_client_keeps_at_most_its_limit_of_one_sessions_messages_in_flight():
    # Temporal admits 10 updates per workflow; past that, its refusals abort the admitted
    # ones. The client keeps below: the rest wait for a slot, and those that get none in
    # time are busy for certain: never sent.
    release = asyncio.Event()

    class Slow(FakeTemporal):
        in_flight = peak = 0

        async def execute_update_with_start_workflow(self, update: str, arg: Any, **kwargs: Any) -> Any:
            self.attempts.append((kwargs["id"], arg.client_message_id))
            Slow.in_flight += 1
            Slow.peak = max(Slow.peak, Slow.in_flight)
            try:
                await release.wait()
            finally:
                Slow.in_flight -= 1
            kwargs["start_workflow_operation"]._workflow_handle.set_result(None)
            return reply(arg.client_message_id)

    fake = Slow()
    hermes = HermesClient(fake, max_in_flight_per_session=3)  # type: ignore[arg-type]
    sends = [
        asyncio.ensure_future(hermes.send_message("s-1", "hi", client_message_id=f"m-{i}", busy_timeout_seconds=0.3))
        for i in range(8)
    ]
    other = asyncio.ensure_future(hermes.send_message("s-2", "hi", client_message_id="other"))
    await asyncio.sleep(0.6)
    release.set()
    outcomes = await asyncio.gather(*sends, return_exceptions=True)
    assert (await other).reply == "other"  # another session has slots of its own
    taken = [o.reply for o in outcomes if isinstance(o, TurnResult)]
    busy = [o for o in outcomes if isinstance(o, SessionBusyError)]
    assert len(taken) == 3 and len(busy) == 5 and Slow.peak == 4  # 3 of s-1, 1 of s-2
    assert all("was not sent" in str(b) for b in busy)
    assert sorted(cid for _, cid in fake.attempts if cid != "other") == sorted(taken)  # the busy ones never went out
    assert hermes._slots._held == {}  # nothing kept for sessions with nothing in flight
    with pytest.raises(ValueError, match="max_in_flight_per_session"):
        HermesClient(fake, max_in_flight_per_session=0)  # type: ignore[arg-type]


async def test_busy_is_never_said_once_an_attempt_may_have_been_taken():
    # The first attempt was admitted, then the result's poll failed: the message may be
    # running. Later attempts are refused as busy, but the client cannot know that the
    # first one was not taken, so it says the outcome is unknown, with the id to resend.
    fake = FakeTemporal(
        Admitted(rpc(RPCStatusCode.RESOURCE_EXHAUSTED, "Workflow is busy.")),
        *[refused("SessionBusyError")] * 200,
    )
    hermes = HermesClient(fake, retry_timeout_seconds=0.5)  # type: ignore[arg-type]
    with pytest.raises(SessionUnavailableError) as raised:
        await hermes.send_message("s-1", "hello", client_message_id="m-7", busy_timeout_seconds=0.1)
    assert raised.value.may_have_been_taken and raised.value.client_message_id == "m-7"
    assert "resend it with the same client message id 'm-7'" in str(raised.value)
    assert {cid for _, cid in fake.attempts} == {"m-7"}


async def test_an_outage_past_the_retry_deadline_raises_unavailable_naming_the_last_error():
    fake = FakeTemporal(*[rpc(RPCStatusCode.UNAVAILABLE, "tcp connect error")] * 200)
    hermes = HermesClient(fake, retry_timeout_seconds=0.4)  # type: ignore[arg-type]
    loop = asyncio.get_running_loop()
    began = loop.time()
    with pytest.raises(SessionUnavailableError, match="tcp connect error") as raised:
        await hermes.send_message("s-1", "hello", client_message_id="m-2")
    # The whole window: the last attempt is made at its end (the client used to give up
    # when the next pause would pass it, after 0.19 s once).
    assert 0.4 <= loop.time() - began < 5
    assert raised.value.may_have_been_taken and raised.value.last_error == "UNAVAILABLE: tcp connect error"


@pytest.mark.parametrize(
    "error, documented",
    [
        (refused("SessionClosedError"), SessionClosedError),
        (refused("SessionHaltedError", "the session is halted until a human approves"), SessionHaltedError),
        (WorkflowUpdateFailedError(ApplicationError("kaput", type="KeyError")), MessageFailedError),
        (rpc(RPCStatusCode.INVALID_ARGUMENT, "Blob data size exceeds limit."), TemporalRequestError),
        (rpc(RPCStatusCode.PERMISSION_DENIED, "no"), TemporalRequestError),
    ],
)
async def test_a_refusal_that_retrying_cannot_change_raises_its_documented_error_at_once(error, documented):
    fake = FakeTemporal(error, reply())
    with pytest.raises(documented) as raised:
        await HermesClient(fake).send_message("s-1", "hello")  # type: ignore[arg-type]
    assert isinstance(raised.value, HermesError) and len(fake.attempts) == 1


async def test_the_callers_cancellation_is_not_retried():
    class Hanging(FakeTemporal):
        async def execute_update_with_start_workflow(self, update: str, arg: Any, **kwargs: Any) -> Any:
            self.attempts.append((kwargs["id"], arg.client_message_id))
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError as err:
                # As the SDK does: a cancelled update call becomes this error.
                kwargs["start_workflow_operation"]._workflow_handle.set_exception(err)
                raise WorkflowUpdateRPCTimeoutOrCancelledError() from err

    fake = Hanging()
    task = asyncio.ensure_future(HermesClient(fake).send_message("s-1", "hello"))  # type: ignore[arg-type]
    await eventually(lambda: _true(bool(fake.attempts)), what="the first attempt")
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert len(fake.attempts) == 1


async def _true(value: bool) -> bool:
    return value


async def test_queries_and_signals_retry_transient_failures_and_name_a_missing_session():
    state = object()  # whatever the query answers
    fake = FakeTemporal(
        queries=[
            rpc(RPCStatusCode.UNAVAILABLE, "tcp connect error"),
            rpc(RPCStatusCode.FAILED_PRECONDITION, "Unable to query workflow due to Workflow Task in failed state."),
            state,
            rpc(RPCStatusCode.UNKNOWN, "transport error"),
            None,  # the approve signal's second attempt
            rpc(RPCStatusCode.NOT_FOUND, "workflow not found for ID: s-2"),
        ]
    )
    hermes = HermesClient(fake, retry_timeout_seconds=30)  # type: ignore[arg-type]
    assert await hermes.get_state("s-1") == state
    await hermes.approve("s-1", "call-1", approver="bob")
    assert fake.signals == [names.APPROVE_TOOL_CALL] * 2
    with pytest.raises(SessionNotFoundError, match="s-2"):
        await hermes.get_transcript("s-2")


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "call",
    [
        lambda h: h.close("s-1"),
        lambda h: h.approve("s-1", "call-1", approver="alice"),
        lambda h: h.reject("s-1", "call-1", approver="alice"),
        lambda h: h.cancel_turn("s-1"),
        lambda h: h.set_system_prompt("s-1", "be brief"),
    ],
    ids=["close", "approve", "reject", "cancel_turn", "set_system_prompt"],
)
async def test_a_signal_to_a_closed_session_raises_closed_at_once_instead_of_retrying(call):
    completed = rpc(RPCStatusCode.NOT_FOUND, "workflow execution already completed")
    fake = FakeTemporal(queries=[completed] * 50)
    hermes = HermesClient(fake, retry_timeout_seconds=120)  # type: ignore[arg-type]
    with pytest.raises(SessionClosedError, match="'s-1' is closed"):
        await call(hermes)
    assert len(fake.signals) == 1  # not resent: it used to be retried for the whole 120 s


async def test_a_session_that_closes_while_asked_whether_it_took_a_message_says_so():
    completed = rpc(RPCStatusCode.NOT_FOUND, "workflow execution already completed")
    fake = FakeTemporal(
        *[rpc(RPCStatusCode.RESOURCE_EXHAUSTED, "limit on number of concurrent in-flight updates has been reached (10)")] * 50,
        settlements=[completed] * 5,
    )
    hermes = HermesClient(fake, retry_timeout_seconds=120)  # type: ignore[arg-type]
    with pytest.raises(SessionClosedError, match="may have been taken before it closed"):
        await hermes.send_message("s-1", "hello", client_message_id="m-9", busy_timeout_seconds=0.1)
    assert fake.settled == ["m-9"]


# --------------------------------------------------------------------------- a model to hold turns


class GatedEcho:
    """Echoes the last user message. The first call for a message containing "slow"
    waits until :attr:`release` is set (a retried call does not wait)."""

    name = "gated-echo"

    def __init__(self) -> None:
        self.started = asyncio.Event()
        self.release = asyncio.Event()
        self.calls: list[str] = []

    async def complete(self, request: CallModelInput) -> CallModelResult:
        text = next(m.content for m in reversed(request.messages) if m.role == "user") or ""
        first = text not in self.calls
        self.calls.append(text)
        if "slow" in text and first:
            self.started.set()
            await asyncio.wait_for(self.release.wait(), 240)
        return CallModelResult(message=Message(role="assistant", content=f"echo: {text}"), provider=self.name)


async def refused_as_busy(temporal_client: Client, session_id: str, text: str) -> bool:
    """Send one message once, bypassing the client's retries; True if the session's
    validator refused it as busy (else it was taken, and waits for its turn)."""
    handle = await temporal_client.get_workflow_handle(session_id).start_update(
        names.SEND_MESSAGE,
        signed(names.SEND_MESSAGE, session_id, SendMessageInput(text=text, client_message_id=f"probe-{uuid.uuid4()}")),
        wait_for_stage=WorkflowUpdateStage.ACCEPTED,
    )
    try:
        # A refusal is known at once (the stage is COMPLETED); a taken message would
        # wait for the held turn.
        await asyncio.wait_for(handle.result(), 0.5)
    except WorkflowUpdateFailedError as err:
        return isinstance(err.cause, ApplicationError) and err.cause.type == "SessionBusyError"
    except (asyncio.TimeoutError, WorkflowUpdateRPCTimeoutOrCancelledError):
        pass  # the SDK turns wait_for's cancellation into the latter
    return False


class HiddenAttempts:
    """A Temporal client whose update-with-start attempts the caller sees refused by
    Temporal (10 updates in flight) until :attr:`refuse_until` (the loop's clock), then
    passed through. With ``deliver``, the first attempt's message reaches the session
    anyway: what a caller sees when the server admitted an attempt, aborted it ("workflow
    update was aborted") and delivered it again, and the SDK's own retry of the abort met
    the in-flight limit."""

    def __init__(self, client: Client, *, deliver: bool, refuse_for: float = 3600.0):
        self._client = client
        self.deliver = deliver
        self.refuse_until = asyncio.get_running_loop().time() + refuse_for
        self.hidden: list[asyncio.Task[Any]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)

    def refusing(self) -> bool:
        return asyncio.get_running_loop().time() < self.refuse_until

    def refused(self, session_id: str, update: str, arg: Any) -> Exception:
        """The refusal of one attempt (its message delivered behind the caller's back first,
        with ``deliver``, once)."""
        if self.deliver and not self.hidden:
            handle = self._client.get_workflow_handle(session_id)
            self.hidden.append(
                asyncio.ensure_future(handle.execute_update(update, arg, id=f"hidden-{uuid.uuid4()}", result_type=TurnResult))
            )
        return rpc(RPCStatusCode.RESOURCE_EXHAUSTED, "limit on number of concurrent in-flight updates has been reached (10)")

    async def execute_update_with_start_workflow(self, update: str, arg: SendMessageInput, **kwargs: Any) -> Any:
        if not self.refusing():
            return await self._client.execute_update_with_start_workflow(update, arg, **kwargs)
        start = kwargs["start_workflow_operation"]
        error = self.refused(start._start_workflow_input.id, update, arg)
        start._workflow_handle.set_exception(error)
        raise error

    def get_workflow_handle(self, workflow_id: str, **kwargs: Any) -> Any:
        """A handle whose plain message updates (a client's message to a session it saw
        running) are refused alike."""
        return _RefusedMessages(self._client.get_workflow_handle(workflow_id, **kwargs), self, workflow_id)


class _RefusedMessages:
    """A workflow handle whose ``send_message`` updates :class:`HiddenAttempts` refuses."""

    def __init__(self, handle: Any, attempts: HiddenAttempts, workflow_id: str) -> None:
        self._handle, self._attempts, self._id = handle, attempts, workflow_id

    def __getattr__(self, name: str) -> Any:
        return getattr(self._handle, name)

    async def execute_update(self, update: str, arg: Any = None, **kwargs: Any) -> Any:
        if update == names.SEND_MESSAGE and self._attempts.refusing():
            raise self._attempts.refused(self._id, update, arg)
        return await self._handle.execute_update(update, arg, **kwargs)


def _user_ids(transcript: list[Message]) -> list[str | None]:
    return [m.client_message_id for m in transcript if m.role == "user"]


@pytest.mark.timeout(300)
async def test_a_message_taken_by_an_attempt_hidden_from_the_client_is_answered_not_called_busy(
    run_worker, session_id, temporal_client
):
    async with run_worker(GatedEcho()) as hermes:
        await hermes.send_message(session_id, "hello", client_message_id="m-0")
        spy = HiddenAttempts(temporal_client, deliver=True, refuse_for=1.0)
        hermes.client = spy  # type: ignore[assignment]
        result = await hermes.send_message(session_id, "taken", client_message_id="m-1", busy_timeout_seconds=0.3)
        await asyncio.gather(*spy.hidden)
        transcript = await hermes.get_transcript(session_id)
    assert result.reply == "echo: taken"
    assert _user_ids(transcript) == ["m-0", "m-1"]  # once: the resend only waited for it


@pytest.mark.timeout(300)
async def test_a_message_reported_busy_is_absent_and_can_be_sent_again_under_its_id(
    run_worker, session_id, temporal_client
):
    async with run_worker(GatedEcho()) as hermes:
        await hermes.send_message(session_id, "hello", client_message_id="m-0")
        hermes.client = HiddenAttempts(temporal_client, deliver=False)  # type: ignore[assignment]
        with pytest.raises(SessionBusyError, match="not taken"):
            await hermes.send_message(session_id, "refused", client_message_id="m-1", busy_timeout_seconds=0.3)
        assert _user_ids(await hermes.get_transcript(session_id)) == ["m-0"]

        hermes.client = temporal_client  # the caller sends it again, under the same id
        again = await hermes.send_message(session_id, "refused", client_message_id="m-1")
        transcript = await hermes.get_transcript(session_id)
        history = await temporal_client.get_workflow_handle(session_id).fetch_history()
    assert again.reply == "echo: refused"
    assert _user_ids(transcript) == ["m-0", "m-1"]
    # The session's "not taken" is its validator's refusal: nothing written to history.
    accepted = [e.workflow_execution_update_accepted_event_attributes for e in history.events]
    assert [a.accepted_request.input.name for a in accepted if a.HasField("accepted_request")] == [
        names.SEND_MESSAGE
    ] * 2


@pytest.mark.timeout(600)
async def test_a_resend_of_an_answered_message_during_a_roll_over_is_answered_not_refused_as_busy(
    run_worker, session_id, temporal_client
):
    """The real cause of "busy" said of a processed message: a message answered in an
    earlier run, whose reply left the resend cache, resent while the next run drained
    for continue-as-new, was refused as busy by the validator (it checked only the
    cache). A caller trusting that resends under a new id and gets the turn twice."""
    model = GatedEcho()
    config = SessionConfig(max_completed_ids=1, max_updates_per_run=2)
    async with run_worker(model, config=config) as hermes:
        first = await hermes.send_message(session_id, "first", client_message_id="m-first")
        await hermes.send_message(session_id, "second", client_message_id="m-second")
        # Two messages: the run continues as new when idle; "m-first" left the cache.
        await eventually(lambda: _run_index_at_least(hermes, session_id, 1), what="the first continue-as-new")

        # Hold a turn and queue more messages than the run may take: it drains.
        held = [asyncio.ensure_future(hermes.send_message(session_id, "slow one"))]
        await asyncio.wait_for(model.started.wait(), 30)
        held += [asyncio.ensure_future(hermes.send_message(session_id, f"queued {i}")) for i in range(6)]
        await eventually(
            lambda: refused_as_busy(temporal_client, session_id, "new"), what="the run to drain", timeout_seconds=60
        )

        # One attempt, no busy retries: the session must answer it, not refuse it.
        again = await hermes.send_message(session_id, "first", client_message_id="m-first", busy_timeout_seconds=0)
        assert (again.turn, again.reply) == (first.turn, "echo: first")

        model.release.set()
        await asyncio.gather(*held)
        transcript = await hermes.get_transcript(session_id)
    ids = [m.client_message_id for m in transcript if m.role == "user"]
    assert ids.count("m-first") == 1
    assert model.calls.count("first") == 1


async def _run_index_at_least(hermes: HermesClient, session_id: str, index: int) -> bool:
    return (await hermes.get_state(session_id)).run_index >= index


# --------------------------------------------------------------------------- a server restart


@contextlib.asynccontextmanager
async def own_temporal(data_dir: Any, port: int) -> AsyncIterator[EmbeddedStack]:
    stack = EmbeddedStack(
        data_dir, temporal_port=port, start_redis=False, ui=False, search_attributes=names.SEARCH_ATTRIBUTES
    )
    await stack.start_async()
    try:
        yield stack
    finally:
        await stack.stop_async()


class FailureSpy:
    """A Temporal client that records the failures its update-with-start calls raise
    (what a caller without the client's retries would have seen)."""

    def __init__(self, client: Client):
        self._client = client
        self.failures: list[BaseException] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)

    async def execute_update_with_start_workflow(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return await self._client.execute_update_with_start_workflow(*args, **kwargs)
        except Exception as err:
            self.failures.append(err)
            raise


@pytest.mark.timeout(600)
async def test_a_temporal_server_killed_and_restarted_mid_turn_costs_the_caller_nothing(
    tmp_path, redis, redis_url, session_id
):
    port = free_port()
    task_queue = f"tq-{uuid.uuid4()}"
    model = GatedEcho()
    async with own_temporal(tmp_path / "temporal", port) as stack:
        client = await Client.connect(stack.temporal_address, data_converter=pydantic_data_converter)
        settings = Settings(redis_url=redis_url, task_queue=task_queue, temporal_address=stack.temporal_address)
        worker = build_worker(
            client, settings, provider=model, registry=register_builtins(ToolRegistry()), redis=redis, memory=False
        )
        async with worker:
            spy = FailureSpy(client)
            hermes = HermesClient(spy, task_queue=task_queue, redis=redis)  # type: ignore[arg-type]
            assert (await hermes.send_message(session_id, "before")).reply == "echo: before"
            turn = asyncio.ensure_future(hermes.send_message(session_id, "slow, across the restart"))
            await asyncio.wait_for(model.started.wait(), 60)

            os.killpg(stack.pids["temporal"], signal.SIGKILL)
            await stack.stop_async()  # reaps it; the database file stays
            # Down until the SDK's own retries gave up and the call failed (about 10 s):
            # from here on only HermesClient's retries stand between the caller and it.
            await eventually(lambda: _true(bool(spy.failures)), what="a failed call", timeout_seconds=120)
            assert not turn.done()
            await stack.start_async()  # same port, same database
            model.release.set()

            result = await asyncio.wait_for(turn, 240)
            assert result.reply == "echo: slow, across the restart"
            # The worker reconnected too: the next turn runs as usual.
            assert (await hermes.send_message(session_id, "after")).reply == "echo: after"
            transcript = await hermes.get_transcript(session_id)
    assert any(isinstance(f, RPCError | WorkflowUpdateRPCTimeoutOrCancelledError) for f in spy.failures)
    users = [m.content for m in transcript if m.role == "user"]
    assert users == ["before", "slow, across the restart", "after"]


# --------------------------------------------------------------------------- a flood


@pytest.mark.timeout(900)
async def test_in_a_flood_every_refused_message_is_absent_and_every_accepted_one_present_once(
    run_worker, session_id
):
    """Waves of 100 messages at once (until the session rolled over twice, at most 8 waves)
    from two clients (two API processes: 16 in flight, past Temporal's 10 per workflow)
    to one session that rolls over every 30 messages, with a 1 s busy deadline. A message
    is taken (its reply), refused as busy (never processed), or, when an attempt failed
    after the update was admitted (the server aborts the admitted updates of a run that
    continues as new: "workflow update was aborted") and the session stayed busy past the
    retry deadline, of unknown outcome: then a resend with the same id must return its
    reply, and it runs once. (Issue 12's case: 1 of 1,842 refusals was processed.)"""
    at_once, max_waves = 100, 8
    config = SessionConfig(max_updates_per_run=30, max_completed_ids=16)
    model = GatedEcho()
    async with run_worker(model, config=config) as hermes:
        hermes.retry_timeout_seconds = 20.0
        other = HermesClient(
            hermes.client, task_queue=hermes.task_queue, redis=hermes.redis, config=config, retry_timeout_seconds=20.0
        )
        await hermes.send_message(session_id, "hello")
        outcomes: dict[str, Any] = {}

        async def one(i: int) -> None:
            cid = f"flood-{i}"
            try:
                outcomes[cid] = await (hermes if i % 2 else other).send_message(
                    session_id, f"message {i}", client_message_id=cid, busy_timeout_seconds=1.0
                )
            except (SessionBusyError, SessionUnavailableError) as err:
                outcomes[cid] = err

        # How many a wave gets taken depends on the machine's speed (a loaded one refuses
        # more as busy), so the flood goes on until it made the session roll over twice.
        total = 0
        with unretrieved_futures() as unretrieved:
            for _ in range(max_waves):
                await asyncio.gather(*(one(i) for i in range(total, total + at_once)))
                total += at_once
                if (await hermes.get_state(session_id)).run_index >= 2:
                    break
        unknown = [cid for cid, o in outcomes.items() if isinstance(o, SessionUnavailableError)]
        assert all(outcomes[cid].may_have_been_taken for cid in unknown)
        hermes.retry_timeout_seconds = 120.0
        for cid in unknown:  # the documented way out: resend under the same id
            outcomes[cid] = await hermes.send_message(
                session_id, f"message {cid.split('-')[1]}", client_message_id=cid, busy_timeout_seconds=60
            )
        transcript = await hermes.get_transcript(session_id)
        state = await hermes.get_state(session_id)

    taken = [cid for cid, o in outcomes.items() if isinstance(o, TurnResult)]
    busy = [cid for cid, o in outcomes.items() if isinstance(o, SessionBusyError)]
    assert len(taken) + len(busy) == total
    assert busy, "no message was refused: the flood did not reach the busy limit"
    counts: dict[str, int] = {}
    for m in transcript:
        if m.role == "user" and m.client_message_id:
            counts[m.client_message_id] = counts.get(m.client_message_id, 0) + 1
    assert [cid for cid in busy if cid in counts] == []  # refused, yet processed
    assert [cid for cid in taken if counts.get(cid) != 1] == []  # taken, but missing or twice
    assert all(outcomes[cid].reply == f"echo: message {cid.split('-')[1]}" for cid in taken)
    assert state.run_index >= 2  # the flood rolled over, so refusals while draining were exercised
    assert not [u for u in unretrieved if "never retrieved" in u]


class CountingStarts:
    """A Temporal client that counts update-with-start calls and passes everything through."""

    def __init__(self, client: Client) -> None:
        self._client = client
        self.starts = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)

    async def execute_update_with_start_workflow(self, *args: Any, **kwargs: Any) -> Any:
        self.starts += 1
        return await self._client.execute_update_with_start_workflow(*args, **kwargs)


@pytest.mark.timeout(300)
async def test_a_message_to_a_session_the_client_saw_running_is_a_plain_update_and_an_ended_one_starts_again(
    run_worker, session_id, temporal_client
):
    """Issue 31: every message was an update-with-start (about 2 ms more client CPU a turn
    than an update); to a session this client saw take a message it is a plain update.
    A session that ended meanwhile (terminated here) is then found by the update-with-
    start under the same id, as for a first message: the message is taken once."""
    async with run_worker(GatedEcho()) as hermes:
        spy = CountingStarts(temporal_client)
        hermes.client = spy  # type: ignore[assignment]
        await hermes.send_message(session_id, "one", client_message_id="m-0")
        second = await hermes.send_message(session_id, "two", client_message_id="m-1")
        assert (spy.starts, second.reply) == (1, "echo: two")
        again = await hermes.send_message(session_id, "two", client_message_id="m-1")  # a resend: its first reply
        assert (again.turn, again.reply) == (second.turn, "echo: two")
        await temporal_client.get_workflow_handle(session_id).terminate("ended behind the client's back")
        third = await hermes.send_message(session_id, "three", client_message_id="m-2")
        transcript = await hermes.get_transcript(session_id)
    assert (spy.starts, third.reply) == (2, "echo: three")
    assert _user_ids(transcript) == ["m-2"]  # a terminated session starts anew, with this message once


class PlainFake(FakeTemporal):
    """:class:`FakeTemporal` whose handles also answer the client's plain message
    updates, each taking the next outcome of ``plain``."""

    def __init__(self, *outcomes: Any, plain: list[Any]) -> None:
        super().__init__(*outcomes)
        self.plain = plain
        self.plain_calls = 0

    def get_workflow_handle(self, workflow_id: str, **kw: Any) -> Any:
        handle = super().get_workflow_handle(workflow_id, **kw)
        fake, settle = self, handle.execute_update

        async def execute_update(name: str, arg: Any, **kwargs: Any) -> Any:
            if name != names.SEND_MESSAGE:
                return await settle(name, arg, **kwargs)
            fake.plain_calls += 1
            outcome = fake.plain.pop(0)
            if isinstance(outcome, BaseException):
                raise outcome
            return outcome

        handle.execute_update = execute_update
        return handle


async def _seen_running(fake: PlainFake) -> HermesClient:
    hermes = HermesClient(fake, retry_timeout_seconds=0.5)  # type: ignore[arg-type]
    await hermes.send_message("s-1", "first", client_message_id="m-0")
    return hermes


@pytest.mark.timeout(30)
async def test_a_plain_update_that_may_have_been_taken_is_never_followed_by_busy() -> None:
    # A transport error after the plain update was sent: it may have been taken, so the
    # session's later "busy" refusals (an earlier message still running) cannot mean "not
    # taken"; the caller is told to resend under the same id (a new id could run it twice).
    fake = PlainFake(reply(), *[refused("SessionBusyError")] * 200, plain=[rpc(RPCStatusCode.UNKNOWN, "transport error")])
    hermes = await _seen_running(fake)
    with pytest.raises(SessionUnavailableError) as raised:
        await hermes.send_message("s-1", "hello", client_message_id="m-7", busy_timeout_seconds=0.1)
    assert fake.plain_calls == 1 and raised.value.may_have_been_taken


@pytest.mark.timeout(30)
async def test_a_plain_update_that_may_have_been_taken_then_a_closed_session_says_it_may_have_been_taken() -> None:
    fake = PlainFake(reply(), rpc(RPCStatusCode.ALREADY_EXISTS), plain=[rpc(RPCStatusCode.UNKNOWN, "transport error")])
    hermes = await _seen_running(fake)
    with pytest.raises(SessionClosedError, match="may have been taken before it closed"):
        await hermes.send_message("s-1", "hello", client_message_id="m-9")


@pytest.mark.timeout(30)
async def test_a_plain_update_the_session_refused_or_failed_raises_its_error_without_a_resend() -> None:
    fake = PlainFake(reply(), plain=[refused("SessionHaltedError", "waiting for a decision")])
    hermes = await _seen_running(fake)
    with pytest.raises(SessionHaltedError, match="waiting for a decision"):
        await hermes.send_message("s-1", "hello", client_message_id="m-8")
    assert len(fake.attempts) == 1  # the first message's start only: the refusal is the session's answer
