"""The plain parts of the client (issue 29), without a server.

:class:`hermes.client.HermesClient` is a facade over parts with one concern each; the
parts that need no server are checked here on their own: the message retry policy's
decisions, the retried call, the error mapping, message ids and checks, the per-session
slots, the start options, the settings wiring, content kept by reference, and that a part
reads the facade's live settings. The behaviour through a (fake or real) Temporal is in
tests/test_client_outages.py.
"""

from __future__ import annotations

from typing import Any

import pytest
from temporalio.client import WorkflowQueryFailedError, WorkflowUpdateFailedError
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError, RPCStatusCode

from hermes import names
from hermes.client import HermesClient
from hermes.client.connect import session_config
from hermes.client.content import read_stored, store_message
from hermes.client.failures import describe, documented_error
from hermes.client.messages import check_message_text, message_update_id, too_many_tokens
from hermes.client.retry import MessageRetryPolicy, call_with_retries
from hermes.client.sending import SessionSlots, session_start_options
from hermes.errors import (
    CommandRefusedError,
    MessageFailedError,
    MessageRejectedError,
    SessionClosedError,
    SessionForbiddenError,
    SessionHaltedError,
    SessionNotFoundError,
    SessionUnavailableError,
    TemporalRequestError,
)
from hermes.models import SessionConfig
from hermes.settings import Settings

pytestmark = pytest.mark.timeout(30)


def rpc(status: RPCStatusCode, message: str = "boom") -> RPCError:
    return RPCError(message, status, b"")


# --------------------------------------------------------------------------- the message retry policy


def test_busy_refusals_by_the_session_are_resent_until_the_busy_deadline_then_said_busy():
    policy = MessageRetryPolicy(retry_timeout_seconds=120.0, busy_deadline=10.0)
    step = policy.after_failure("busy", admitted=True, refused_by_session=True, now=9.99)
    assert step.action == "resend" and step.delay_seconds <= 0.01 + 1e-9  # the last pause ends at the deadline
    assert policy.after_failure("busy", admitted=True, refused_by_session=True, now=10.0).action == "busy"
    assert not policy.may_have_been_taken


def test_a_busy_verdict_from_temporal_alone_asks_the_session_before_it_is_said():
    policy = MessageRetryPolicy(retry_timeout_seconds=120.0, busy_deadline=10.0)
    step = policy.after_failure("busy", admitted=False, refused_by_session=False, now=11.0)
    assert step.action == "ask" and step.delay_seconds > 0


def test_once_an_attempt_may_have_been_taken_busy_is_never_said_only_unavailable_at_the_outage_deadline():
    policy = MessageRetryPolicy(retry_timeout_seconds=30.0, busy_deadline=10.0)
    assert policy.after_failure("transient", admitted=False, refused_by_session=False, now=1.0).action == "resend"
    assert policy.may_have_been_taken and policy.outage_since == 1.0
    # Past the busy deadline, the session's own refusal does not settle it: resend to the outage deadline.
    step = policy.after_failure("busy", admitted=True, refused_by_session=True, now=20.0)
    assert step.action == "resend"
    last = policy.after_failure("busy", admitted=True, refused_by_session=True, now=30.99)
    assert last.action == "resend" and last.delay_seconds <= 0.01 + 1e-9
    assert policy.after_failure("busy", admitted=True, refused_by_session=True, now=31.0).action == "unavailable"


def test_an_outage_is_timed_from_the_last_attempt_the_session_answered():
    policy = MessageRetryPolicy(retry_timeout_seconds=30.0, busy_deadline=100.0)
    policy.after_failure("transient", admitted=False, refused_by_session=False, now=1.0)
    policy.after_failure("transient", admitted=False, refused_by_session=False, now=5.0)
    assert policy.outage_since == 1.0  # the server has not answered since
    policy.after_failure("transient", admitted=True, refused_by_session=False, now=25.0)
    assert policy.outage_since == 25.0  # it answered this attempt: a new outage starts
    assert policy.after_failure("transient", admitted=False, refused_by_session=False, now=40.0).action == "resend"


def test_a_message_the_session_says_it_took_is_resent_to_a_fresh_outage_deadline():
    policy = MessageRetryPolicy(retry_timeout_seconds=30.0, busy_deadline=10.0)
    assert policy.after_failure("busy", admitted=False, refused_by_session=False, now=10.0).action == "ask"
    policy.taken_after_all(12.0)
    assert policy.after_failure("busy", admitted=True, refused_by_session=True, now=41.0).action == "resend"
    assert policy.after_failure("busy", admitted=True, refused_by_session=True, now=42.0).action == "unavailable"


def test_the_pauses_between_resends_grow():
    policy = MessageRetryPolicy(retry_timeout_seconds=1000.0, busy_deadline=1000.0)
    delays = [policy.after_failure("busy", admitted=True, refused_by_session=True, now=0.0).delay_seconds for _ in range(8)]
    assert delays[0] <= 0.05 and delays[-1] >= 1.0


# --------------------------------------------------------------------------- the retried call


class Flaky:
    """A call that raises ``errors`` in turn, then returns ``"ok"``."""

    def __init__(self, *errors: BaseException):
        self.errors = list(errors)
        self.calls = 0

    async def __call__(self) -> str:
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        return "ok"


async def test_a_call_rides_out_transient_failures_and_returns_the_answer():
    call = Flaky(rpc(RPCStatusCode.UNAVAILABLE, "tcp connect error"), rpc(RPCStatusCode.UNKNOWN, "transport error"))
    assert await call_with_retries("s-1", "get_state", call, retry_timeout_seconds=10.0) == "ok"
    assert call.calls == 3


async def test_a_call_still_failing_past_the_retry_timeout_is_unavailable_naming_the_last_error():
    call = Flaky(*[rpc(RPCStatusCode.UNAVAILABLE, "tcp connect error")] * 50)
    with pytest.raises(SessionUnavailableError) as raised:
        await call_with_retries("s-1", "get_state", call, retry_timeout_seconds=0.2)
    assert raised.value.last_error == "UNAVAILABLE: tcp connect error" and "get_state on session 's-1'" in str(raised.value)
    assert 1 < call.calls < 50


@pytest.mark.parametrize(
    "err, documented",
    [
        (rpc(RPCStatusCode.NOT_FOUND, "workflow execution already completed"), SessionClosedError),
        (rpc(RPCStatusCode.NOT_FOUND, "workflow not found"), SessionNotFoundError),
        (rpc(RPCStatusCode.INVALID_ARGUMENT, "bad"), TemporalRequestError),
    ],
)
async def test_a_call_that_retrying_cannot_change_raises_its_documented_error_after_one_attempt(err, documented):
    call = Flaky(err)
    with pytest.raises(documented):
        await call_with_retries("s-1", "close_session", call, retry_timeout_seconds=10.0)
    assert call.calls == 1


async def test_an_error_that_is_not_temporals_is_raised_unchanged():
    with pytest.raises(ZeroDivisionError):
        await call_with_retries("s-1", "x", Flaky(ZeroDivisionError()), retry_timeout_seconds=10.0)


# --------------------------------------------------------------------------- the error mapping


def refused(kind: str, message: str = "refused") -> WorkflowUpdateFailedError:
    return WorkflowUpdateFailedError(ApplicationError(message, type=kind))


@pytest.mark.parametrize(
    "kind, documented",
    [
        ("MessageRejectedError", MessageRejectedError),
        ("SessionClosedError", SessionClosedError),
        ("SessionHaltedError", SessionHaltedError),
        ("SessionForbiddenError", SessionForbiddenError),
        ("CommandRefusedError", CommandRefusedError),
        ("SomethingElse", MessageFailedError),
    ],
)
def test_a_sessions_refusal_maps_to_the_documented_error_of_its_type(kind, documented):
    error = documented_error(refused(kind, "why"), "s-1", user_id="bob")
    assert type(error) is documented
    if isinstance(error, (SessionForbiddenError, CommandRefusedError)):
        assert (error.session_id, error.user_id) == ("s-1", "bob")
    if isinstance(error, MessageFailedError):
        assert error.reason == "SomethingElse: why"


def test_a_failed_query_and_a_refused_request_map_to_request_errors_and_other_errors_to_none():
    query = documented_error(WorkflowQueryFailedError("no handler"), "s-1")
    assert isinstance(query, TemporalRequestError) and query.status == "QUERY_FAILED"
    refused_rpc = documented_error(rpc(RPCStatusCode.PERMISSION_DENIED, "no"), "s-1")
    assert isinstance(refused_rpc, TemporalRequestError) and refused_rpc.status == "PERMISSION_DENIED"
    assert documented_error(ValueError("x"), "s-1") is None


def test_a_failure_is_described_in_one_line():
    assert describe(rpc(RPCStatusCode.UNAVAILABLE, "down")) == "UNAVAILABLE: down"
    assert describe(refused("SessionBusyError", "busy now")) == "SessionBusyError: busy now"
    assert describe(ValueError("bad")) == "ValueError: bad"


# --------------------------------------------------------------------------- messages


def test_message_update_ids_of_different_senders_and_ids_never_collide():
    assert message_update_id("a:b", "c") != message_update_id("a", "b:c")
    assert message_update_id("alice", "m-1") == "'alice':m-1"


def test_an_undecodable_byte_is_named_in_the_refusal():
    with pytest.raises(MessageRejectedError, match="undecodable byte 0xFF"):
        check_message_text("a\udcffb")


def test_a_short_message_never_counts_as_too_many_tokens():
    assert not too_many_tokens("hello", 5, SessionConfig())


# --------------------------------------------------------------------------- slots and start options


async def test_a_sessions_slots_are_bounded_and_forgotten_when_free():
    slots = SessionSlots(1)
    async with slots.hold("s-1", 1.0) as first:
        assert first
        async with slots.hold("s-1", 0.0) as second:
            assert not second  # the one slot is held
        async with slots.hold("s-2", 0.0) as other:
            assert other  # another session has its own
    assert slots._held == {}


def test_a_session_starts_with_its_user_channel_and_active_status_searchable():
    options = session_start_options("alice", "api")
    attributes = options["search_attributes"]
    assert attributes.get(names.SA_USER_ID) == "alice"
    assert attributes.get(names.SA_CHANNEL) == "api"
    assert attributes.get(names.SA_STATUS) == "active"
    assert options["static_summary"] == "session of alice (api)"


def test_a_connected_client_gives_new_sessions_the_settings_model_and_budget_values():
    settings = Settings(model_timeout_seconds=42.0, session_token_budget=12345)
    config = session_config(settings)
    assert config.model_timeout_seconds == 42.0 and config.token_budget == 12345


# --------------------------------------------------------------------------- content


class Store:
    def __init__(self, *, can_keep: bool = True, fails: bool = False):
        self.can_keep = can_keep
        self.fails = fails
        self.kept: dict[str, str] = {}

    async def keep_many(self, values: dict[str, str]) -> None:
        if self.fails:
            raise ConnectionError("store down")
        self.kept.update(values)

    async def read_many(self, refs: list[str]) -> dict[str, str]:
        return {ref: self.kept[ref] for ref in refs if ref in self.kept}


async def test_a_message_kept_by_reference_is_read_back_whole():
    store: Any = Store()
    text = "x" * 10_000
    preview, stored = await store_message(store, text, 2000)
    assert len(preview.encode()) <= 2000 and stored.ref in preview
    assert await read_stored(store, stored.ref) == text


async def test_a_store_that_fails_refuses_the_message_naming_why_and_one_that_keeps_nothing_reads_none():
    with pytest.raises(MessageRejectedError, match="ConnectionError: store down"):
        await store_message(Store(fails=True), "x" * 10_000, 2000)  # type: ignore[arg-type]
    assert await read_stored(Store(can_keep=False), "anything") is None  # type: ignore[arg-type]


# --------------------------------------------------------------------------- the facade's live settings


class FakeTemporal:
    def __init__(self, name: str):
        self.name = name

    def get_workflow_handle(self, workflow_id: str) -> tuple[str, str]:
        return (self.name, workflow_id)


async def test_the_parts_read_the_facades_settings_when_called_not_when_built():
    hermes = HermesClient(FakeTemporal("first"), retry_timeout_seconds=5.0)  # type: ignore[arg-type]
    hermes.client = FakeTemporal("second")  # type: ignore[assignment]
    assert hermes._queries.handle("s-1") == ("second", "s-1")
    hermes.retry_timeout_seconds = 0.1
    with pytest.raises(SessionUnavailableError, match="within 0.1 s"):
        await hermes._queries.call("s-1", "x", Flaky(*[rpc(RPCStatusCode.UNAVAILABLE)] * 100))
    assert hermes.max_in_flight_per_session == hermes._slots.limit == 8
