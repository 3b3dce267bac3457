"""A live worker is never taken for a dead one, and a model step asks its provider once.

With a real Temporal dev server and a real Redis, an in-process worker and a provider
double (the remote LLM is the one part faked):

- heartbeats leave the worker from a plain thread, so a model call whose provider holds
  the worker's event loop (as CPU work on the loop would) is not timed out;
- an attempt whose heartbeats are lost on the way while its worker lives is timed out and
  retried, and the retry waits on the first attempt's lease for the result that attempt
  records: one provider request, and the turn gets its reply;
- a stopping worker (a deploy) whose call the server retried on the new worker meanwhile
  finishes it, and the new worker's attempt uses its answer;
- an attempt cancelled by its heartbeat timeout finishes its provider request, one the
  session cancelled (or a shutdown's spent grace) stops it;
- the step's records are named so that a new step never reuses an old result.

A killed worker's call is still retried elsewhere within seconds
(tests/test_model_recovery.py: the lease of a dead worker lapses with its heartbeat timeout).
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from temporalio import activity
from temporalio.api.enums.v1 import EventType, TimeoutType
from temporalio.client import Client

from activities import heartbeat as heartbeat_module
from activities.heartbeat import Ticker
from activities.model_steps import step_key
from hermes import names
from hermes.models import CallModelInput, CallModelResult, Message, SessionConfig
from tests.test_model_recovery import model_call_started_events


async def timeouts(client: Client, session_id: str) -> list[Any]:
    history = await client.get_workflow_handle(session_id).fetch_history()
    return [e for e in history.events if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_TIMED_OUT]


class LoopHoldingModel:
    """A provider whose calls hold the worker's event loop for ``hold_seconds`` (a
    blocking sleep, as CPU work on the loop would)."""

    name = "loop-holding"

    def __init__(self, hold_seconds: float) -> None:
        self.hold_seconds = hold_seconds
        self.calls = 0

    async def complete(self, request: CallModelInput) -> CallModelResult:
        self.calls += 1
        time.sleep(self.hold_seconds)  # noqa: ASYNC251 - the point: the worker's loop is held
        return CallModelResult(message=Message(role="assistant", content=f"answered on call {self.calls}"))


@pytest.mark.timeout(120)
async def test_a_model_call_that_holds_the_event_loop_keeps_heartbeating_and_asks_the_provider_once(
    run_worker, session_id, temporal_client
):
    # Three heartbeat timeouts with the loop held: beats sent from the loop stopped, the
    # attempt timed out, and the retry asked the provider again (issue 31).
    cfg = SessionConfig()
    model = LoopHoldingModel(hold_seconds=3 * cfg.model_heartbeat_seconds)
    async with run_worker(model) as hermes:
        result = await hermes.send_message(session_id, "hello")
    assert result.status == "completed", result
    assert result.reply == "answered on call 1"
    assert model.calls == 1
    assert await timeouts(temporal_client, session_id) == []
    [started] = await model_call_started_events(temporal_client, session_id)
    assert started.attempt == 1


class LostBeatsModel:
    """A provider that answers the first attempt of a step only once Temporal has started
    the step's second attempt (after the first one's heartbeat timeout) and the worker has
    cancelled the first (its own timer of that timeout, 5 s later), and at once otherwise;
    it counts its requests."""

    name = "lost-beats"

    def __init__(self, client: Client, session_id: str) -> None:
        self.client = client
        self.session_id = session_id
        self.calls = 0

    async def retried(self) -> bool:
        pending = (await self.client.get_workflow_handle(self.session_id).describe()).raw_description.pending_activities
        return any(a.activity_type.name == names.CALL_MODEL and a.attempt >= 2 for a in pending)

    async def complete(self, request: CallModelInput) -> CallModelResult:
        self.calls += 1
        if activity.info().attempt == 1:
            while not (activity.is_cancelled() and await self.retried()):
                await asyncio.sleep(0.05)
        return CallModelResult(message=Message(role="assistant", content=f"reply to step {request.step}"))


@pytest.fixture
def first_attempts_lose_heartbeats(monkeypatch: pytest.MonkeyPatch) -> None:
    """The heartbeats of each model call's first attempt never reach Temporal, as when a
    starved machine or a busy server delays them past the timeout; the worker lives."""
    real = heartbeat_module.heartbeat_sender

    def lossy() -> Callable[[], None]:
        info = activity.info()
        if info.activity_type == names.CALL_MODEL and info.attempt == 1:
            return lambda: None
        return real()

    monkeypatch.setattr(heartbeat_module, "heartbeat_sender", lossy)


@pytest.mark.timeout(180)
async def test_a_model_call_timed_out_while_its_worker_lives_asks_the_provider_once_and_the_turn_is_answered(
    run_worker, session_id, temporal_client, first_attempts_lose_heartbeats
):
    model = LostBeatsModel(temporal_client, session_id)
    async with run_worker(model) as hermes:
        result = await hermes.send_message(session_id, "hello")
    assert result.status == "completed", result
    assert result.reply == "reply to step 0"
    assert model.calls == 1, "the retry used the first attempt's result"
    [started] = await model_call_started_events(temporal_client, session_id)
    assert started.attempt == 2, "the first attempt was timed out and retried"
    assert started.last_failure.timeout_failure_info.timeout_type == TimeoutType.TIMEOUT_TYPE_HEARTBEAT


@pytest.mark.timeout(180)
async def test_a_stopping_worker_finishes_a_model_call_the_server_retried_elsewhere_and_the_retry_uses_its_answer(
    run_worker, session_id, temporal_client, settings, redis, first_attempts_lose_heartbeats
):
    from tests.conftest import builtin_registry
    from worker import build_worker

    # A deploy on a starved machine: the stopping worker's heartbeats are late, the
    # server retries the call on the new worker, and the stopping one is still asking.
    model = LostBeatsModel(temporal_client, session_id)
    model.asked = asyncio.Event()
    complete = model.complete

    async def noting(request: CallModelInput) -> CallModelResult:
        model.asked.set()
        return await complete(request)

    model.complete = noting  # type: ignore[method-assign]
    stopping_worker = run_worker(model)
    hermes = await stopping_worker.__aenter__()
    turn = asyncio.ensure_future(hermes.send_message(session_id, "hello during a deploy"))
    stopped = None
    try:
        await asyncio.wait_for(model.asked.wait(), 60)
        # A second worker in this process needs a client of its own (the SDK allows one
        # worker per task queue and client connection).
        other = await Client.connect(
            temporal_client.service_client.config.target_host,
            namespace=temporal_client.namespace,
            data_converter=temporal_client.data_converter,
        )
        async with build_worker(other, settings, provider=model, registry=builtin_registry(), redis=redis):
            stopped = asyncio.ensure_future(stopping_worker.__aexit__(None, None, None))  # graceful: the call finishes
            result = await asyncio.wait_for(asyncio.shield(turn), 120)
            await asyncio.wait_for(stopped, 60)
    finally:
        if stopped is None:
            await stopping_worker.__aexit__(None, None, None)
        turn.cancel()
    assert result.status == "completed", result
    assert result.reply == "reply to step 0"
    assert model.calls == 1, "the new worker's attempt used the stopping worker's answer"
    [started] = await model_call_started_events(temporal_client, session_id)
    assert started.attempt == 2


def test_a_new_step_never_shares_the_records_of_another():
    base = CallModelInput(session_id="s", turn=3, step=1, context_ref="c" * 64)
    key = step_key(base, "run-1")
    assert step_key(base, "run-1") == key, "the same step of the same run: the same records"
    others = [
        step_key(base, "run-2"),
        step_key(base.model_copy(update={"turn": 4}), "run-1"),
        step_key(base.model_copy(update={"step": 2}), "run-1"),
        step_key(base.model_copy(update={"purpose": "summary"}), "run-1"),
        step_key(base.model_copy(update={"context_ref": "d" * 64}), "run-1"),
        step_key(base.model_copy(update={"session_id": "t"}), "run-1"),
    ]
    assert len({key, *others}) == 7
    assert key.count("{") == 1 and key.count("}") == 1, "one Redis Cluster hash tag"


def test_a_ticker_keeps_calling_while_the_calling_thread_is_busy_and_stops_when_removed():
    ticker = Ticker("test-ticker")
    calls: list[float] = []
    enough = threading.Event()

    def tick() -> None:
        calls.append(time.monotonic())
        if len(calls) >= 3:
            enough.set()

    key = ticker.add(tick, 0.01)
    assert enough.wait(10), "the ticker's thread calls on its own"
    ticker.remove(key)
    seen = len(calls)
    done = threading.Event()
    ticker.add(done.set, 0.01)  # the thread has passed the removal once this runs
    assert done.wait(10)
    assert len(calls) <= seen + 1


def test_a_ticker_entry_first_runs_after_its_delay_and_one_due_now_runs_at_once():
    ticker = Ticker("test-ticker-delays")
    started = time.monotonic()
    ran: dict[str, float] = {}
    events = {name: threading.Event() for name in ("delayed", "now")}

    def note(name: str) -> Callable[[], None]:
        def call() -> None:
            ran.setdefault(name, time.monotonic() - started)
            events[name].set()

        return call

    far = ticker.add(lambda: None, 60.0, first_after_seconds=60.0)  # the thread sleeps until then
    delayed = ticker.add(note("delayed"), 60.0, first_after_seconds=2.0)
    now = ticker.add(note("now"), 60.0)

    assert events["now"].wait(10) and events["delayed"].wait(10)
    assert ran["now"] < 2.0 <= ran["delayed"]
    for key in (far, delayed, now):
        ticker.remove(key)


def test_a_sleeping_ticker_is_woken_only_by_an_entry_due_well_before_it_wakes_on_its_own():
    """Each activity adds an entry whose first beat is a sixth of its heartbeat timeout
    away: that must not wake the ticker's thread (a thread switch and a wait for the GIL
    per tool call, issue 31). The thread never sleeps longer than
    ``Ticker.MAX_SLEEP_SECONDS``; a new entry waits for that wake-up when it is due at most
    half its interval before it, and wakes the thread when due sooner."""
    ticker = Ticker("test-ticker-wakes")
    notified: list[float] = []
    real_notify = ticker._cond.notify

    def counting_notify(n: int = 1) -> None:
        notified.append(time.monotonic())
        real_notify(n)

    ticker._cond.notify = counting_notify  # type: ignore[method-assign]

    def asleep_for(seconds: float) -> None:
        """Wait until the thread sleeps with at least ``seconds`` to go."""
        deadline = time.monotonic() + 10
        while ticker._wake_at - time.monotonic() < seconds:
            assert time.monotonic() < deadline, "the ticker's thread never slept"
            time.sleep(0.005)

    first = ticker.add(lambda: None, 60.0, first_after_seconds=60.0)  # starts the thread
    asleep_for(0.15)
    assert ticker._wake_at <= time.monotonic() + Ticker.MAX_SLEEP_SECONDS, "it sleeps at most MAX_SLEEP_SECONDS"
    beat = threading.Event()
    added = time.monotonic()
    beats = ticker.add(beat.set, 1.0 / 6, first_after_seconds=1.0 / 6)  # a 1 s heartbeat timeout's beats
    assert notified == [], "a heartbeat's first beat woke the sleeping thread"
    assert beat.wait(10) and time.monotonic() - added < 1.0, "its first beat came later than the heartbeat timeout"
    ticker.remove(beats)
    asleep_for(0.15)
    soon = threading.Event()
    now = ticker.add(soon.set, 0.02)  # due now, a short interval: it cannot wait for the thread
    assert len(notified) == 1 and soon.wait(10)
    for key in (first, now):
        ticker.remove(key)


class GatedModel:
    """A provider that answers once :attr:`gate` is set, noting when it was asked
    (:attr:`asked`) and whether its request was cancelled (:attr:`cancelled`)."""

    name = "gated"

    def __init__(self) -> None:
        self.asked = asyncio.Event()
        self.gate = asyncio.Event()
        self.calls = 0
        self.cancelled = False

    async def complete(self, request: CallModelInput) -> CallModelResult:
        self.calls += 1
        self.asked.set()
        try:
            await self.gate.wait()
        except asyncio.CancelledError:
            self.cancelled = True
            raise
        return CallModelResult(message=Message(role="assistant", content="the paid answer"))


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("details", "finished"),
    [
        (activity.ActivityCancellationDetails(timed_out=True, not_found=True), True),
        (activity.ActivityCancellationDetails(not_found=True), True),
        (activity.ActivityCancellationDetails(cancel_requested=True), False),
        (activity.ActivityCancellationDetails(worker_shutdown=True), False),
    ],
    ids=["heartbeat timed out", "attempt not found", "cancel requested", "shutdown grace spent"],
)
async def test_an_attempt_timed_out_finishes_its_provider_request_for_the_retry_and_one_cancelled_stops(
    redis, details, finished
):
    from temporalio.testing import ActivityEnvironment

    from activities.model import ModelActivities
    from hermes.content.blobs import BlobStore

    model = GatedModel()
    activities = ModelActivities(model, store=BlobStore(redis))
    request = CallModelInput(
        session_id=f"s-{time.monotonic_ns()}", turn=1, step=0, messages=[Message(role="user", content="hi")]
    )
    def environment(attempt: int) -> ActivityEnvironment:
        env = ActivityEnvironment()
        env.info = dataclasses.replace(
            env.info, attempt=attempt, started_time=datetime.now(timezone.utc), start_to_close_timeout=timedelta(seconds=60)
        )
        return env

    first = environment(1)
    attempt = asyncio.ensure_future(first.run(activities.call_model, request))
    await asyncio.wait_for(model.asked.wait(), 30)
    first.cancel(details)
    if finished:
        model.gate.set()
        assert (await asyncio.wait_for(attempt, 30)).message.content == "the paid answer"
    else:
        with pytest.raises(BaseException):  # noqa: B017 - the SDK's or asyncio's cancellation
            await asyncio.wait_for(attempt, 30)
        assert model.cancelled
    # The retry (same step, same run): the recorded answer, or a provider request of its own.
    model.gate.set()
    result = await asyncio.wait_for(environment(2).run(activities.call_model, request), 30)
    assert result.message.content == "the paid answer"
    assert model.calls == (1 if finished else 2)


@pytest.mark.timeout(60)
async def test_a_summary_attempt_timed_out_finishes_its_provider_request_and_the_retry_uses_it(redis):
    """A summary is a paid provider request too: its retry after a late heartbeat gets the
    first attempt's answer instead of asking again (issue 31)."""
    from temporalio.testing import ActivityEnvironment

    from activities.model import ModelActivities
    from hermes.content.blobs import BlobStore
    from hermes.models import SummarizeInput

    model = GatedModel()
    activities = ModelActivities(model, store=BlobStore(redis))
    body = Message(role="user", content="I live in Lisbon and work on payments.").model_dump_json()
    request = SummarizeInput(
        session_id=f"s-{time.monotonic_ns()}", message_refs=["m1"], message_turns=[1], upto_turn=1,
        bodies={"m1": body}, bodies_stored=True,
    )

    def environment(attempt: int) -> ActivityEnvironment:
        env = ActivityEnvironment()
        env.info = dataclasses.replace(
            env.info, attempt=attempt, started_time=datetime.now(timezone.utc), start_to_close_timeout=timedelta(seconds=60)
        )
        return env

    first = environment(1)
    attempt = asyncio.ensure_future(first.run(activities.summarize_context, request))
    await asyncio.wait_for(model.asked.wait(), 30)
    first.cancel(activity.ActivityCancellationDetails(timed_out=True, not_found=True))
    model.gate.set()
    assert (await asyncio.wait_for(attempt, 30)).text == "the paid answer"
    again = await asyncio.wait_for(environment(2).run(activities.summarize_context, request), 30)
    assert again.text == "the paid answer"
    assert model.calls == 1, "the retry used the first attempt's summary"


def _attempt_environment(attempt: int) -> Any:
    from temporalio.testing import ActivityEnvironment

    env = ActivityEnvironment()
    env.info = dataclasses.replace(
        env.info, attempt=attempt, activity_id="1", started_time=datetime.now(timezone.utc),
        start_to_close_timeout=timedelta(seconds=60), heartbeat_timeout=timedelta(seconds=2),
    )
    return env


@pytest.mark.timeout(120)
async def test_an_attempt_that_met_an_unreadable_result_still_uses_the_one_the_lease_holder_records(redis):
    """A result this worker cannot open (sealed with another key ring) is as if none; but
    while another attempt holds the step, each poll must read the result again, or the
    holder's answer is missed and the provider is paid a second time (found by a helper
    trying to break the one-round-trip lease script)."""
    from activities.model_steps import ModelSteps
    from hermes.security import encryption

    calls: list[int] = []

    async def call() -> CallModelResult:
        calls.append(1)
        return CallModelResult(message=Message(role="assistant", content="second attempt's own call"))

    request = CallModelInput(session_id=f"s-{time.monotonic_ns()}", turn=1, step=0, messages=[Message(role="user", content="hi")])
    key = step_key(request, _attempt_environment(1).info.workflow_run_id)
    other = encryption.KeyRing(keys={"other": b"k" * 32}, current="other")
    await redis.set(f"{key}:result", other.seal("{}"))
    await redis.set(f"{key}:lease", "another-host:1/1/2", px=10_000)
    attempt = asyncio.ensure_future(_attempt_environment(3).run(ModelSteps(redis).once, request, call))
    await asyncio.sleep(0.5)
    assert not attempt.done(), "it waits on the live lease"
    answer = CallModelResult(message=Message(role="assistant", content="the holder's answer"))
    await redis.set(f"{key}:result", encryption.seal(answer.model_dump_json()))
    await redis.delete(f"{key}:lease")
    result = await asyncio.wait_for(attempt, 30)
    assert (calls, result.message.content) == ([], "the holder's answer")


@pytest.mark.timeout(120)
async def test_a_finished_answer_is_recorded_when_the_timeout_lands_while_its_record_is_on_its_way(redis, monkeypatch):
    """Temporal timed the attempt out for a late heartbeat just as its answer was being
    recorded: the record must land all the same (the retry reads it, no second provider
    request). A record written with an await that the cancellation cut before it was
    sent lost the paid answer (found by a helper trying to break the lease path)."""
    from activities.model_steps import ModelSteps

    steps = ModelSteps(redis)
    twin = steps.client()
    real_async, real_sync = redis.eval, twin.eval

    async def slow_async(script: str, *args: Any) -> Any:
        if "DEL" in script:
            await asyncio.sleep(0.5)  # the record is slow before it is sent
        return await real_async(script, *args)

    def slow_sync(script: str, *args: Any) -> Any:
        if "DEL" in script:
            time.sleep(0.5)
        return real_sync(script, *args)

    monkeypatch.setattr(redis, "eval", slow_async)
    monkeypatch.setattr(twin, "eval", slow_sync)
    request = CallModelInput(session_id=f"s-{time.monotonic_ns()}", turn=1, step=0, messages=[Message(role="user", content="hi")])
    calls: list[int] = []

    async def call() -> CallModelResult:
        calls.append(1)
        return CallModelResult(message=Message(role="assistant", content="the paid answer"))

    first = _attempt_environment(1)
    task = asyncio.ensure_future(first.run(steps.once, request, call))
    await asyncio.sleep(0.2)
    first.cancel(activity.ActivityCancellationDetails(timed_out=True, not_found=True))
    try:
        await asyncio.wait_for(task, 10)
    except BaseException:  # noqa: BLE001 - cancelled or not: the record is what counts
        pass
    await asyncio.sleep(1.0)
    retry = await asyncio.wait_for(_attempt_environment(2).run(steps.once, request, call), 20)
    assert retry.message.content == "the paid answer"
    assert len(calls) == 1, f"the provider was asked {len(calls)} times"
