"""Turn events (hermes.content.events): the Redis Stream contract and a real turn's events.

The log against the fixtures' real Redis: offsets in order, reading after an offset gives
no gap and no repeat, a truncated offset is said, ``turn_started`` once per turn, a step's
earlier attempt discarded. Then a real worker (scripted model streaming word by word, the
built-in tools): ``stream_message`` yields the turn's events in order, the text deltas add
up to the reply, and the session's history is the same length with events on and off.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import pytest

from hermes.client import HermesClient
from hermes.content.events import (
    PUBLISH_TIMEOUT_SECONDS,
    START,
    EventLog,
    TurnEvent,
    check_offset,
    model_call_events,
    stream_key,
)
from hermes.models import TurnResult
from hermes.providers.scripted import ScriptedModel
from hermes.tools.builtin import register_builtins
from hermes.tools.registry import ToolRegistry
from tests.support import eventually
from worker import build_worker

STREAMING_SCRIPT: dict[str, Any] = {
    "stream_chunk_seconds": 0.02,
    "turns": [
        {
            "match": "add",
            "steps": [
                {"tool_calls": [{"name": "calculate", "arguments": {"expression": "19+23"}}]},
                {"reply": "The sum of nineteen and twenty-three is 42, as the calculator says."},
            ],
        },
        {"steps": [{"reply": "Plain words streamed one by one to the caller."}]},
    ],
}


def _event(session_id: str, kind: str = "warning", **data: Any) -> TurnEvent:
    return TurnEvent(type=kind, session_id=session_id, turn=1, data=data)  # type: ignore[arg-type]


async def test_reading_after_any_offset_gives_the_rest_in_order_without_gap_or_repeat(redis, session_id):
    log = EventLog(redis)
    offsets = await log.publish([_event(session_id, text=str(i)) for i in range(30)])
    assert offsets == sorted(offsets, key=lambda o: tuple(int(x) for x in o.split("-")))
    everything = await log.read(session_id, START)
    assert [e.data["text"] for e in everything] == [str(i) for i in range(30)]
    assert [e.offset for e in everything] == offsets
    for cut in (0, 7, 29):
        rest = await log.read(session_id, offsets[cut])
        assert [e.data["text"] for e in rest] == [str(i) for i in range(cut + 1, 30)]
    assert await log.last_offset(session_id) == offsets[-1]
    assert await log.last_offset(f"{session_id}-none") == START


async def test_events_of_several_sessions_in_one_write_land_in_order_and_every_stream_expires(redis, session_id):
    log = EventLog(redis, ttl_seconds=600)
    other = f"{session_id}-other"
    events = [_event(session_id, text="a1"), _event(other, text="b1"), _event(session_id, text="a2")]
    offsets = await log.publish(events)
    assert len(offsets) == 3
    assert [e.offset for e in await log.read(session_id, START)] == [offsets[0], offsets[2]]
    assert [e.data["text"] for e in await log.read(other, START)] == ["b1"]
    for sid in (session_id, other):
        assert 0 < await redis.ttl(stream_key(sid)) <= 600  # never a stream kept forever


async def test_a_reader_behind_the_truncated_events_is_told_first(redis, session_id):
    log = EventLog(redis, max_events=100)
    first = await log.publish([_event(session_id, text="first")])
    for start in range(0, 1000, 100):  # MAXLEN ~ trims whole nodes: publish well past it
        await log.publish([_event(session_id, text=str(i)) for i in range(start, start + 100)])
    events = await log.read(session_id, first[0], count=5)
    assert events[0].type == "truncated" and events[0].data["oldest"] == events[1].offset
    assert int(events[1].data["text"]) > 0
    assert await redis.xlen(f"hermes:events:{session_id}") < 1001


async def test_an_offset_that_is_not_one_is_refused_by_name(redis, session_id):
    with pytest.raises(ValueError, match="'abc' is not an event offset"):
        check_offset("abc")
    with pytest.raises(ValueError, match="is not an event offset"):
        await EventLog(redis).read(session_id, "12")


async def test_turn_started_is_published_once_and_a_step_started_again_discards_the_old_attempt(redis, session_id):
    log = EventLog(redis)
    for _ in range(3):  # the recall and the first model call both say it; retries too
        await log.begin_turn(session_id, 4)
    async with model_call_events(log, session_id, 4, 0, "0.a.1") as text:
        assert text is not None
        text.add("Hello ")
        text.add("wor")
    async with model_call_events(log, session_id, 4, 0, "0.a.2") as text:
        text.add("Hello world")
    events = await log.read(session_id, START)
    kinds = [(e.type, e.attempt) for e in events]
    assert kinds == [
        ("turn_started", None), ("text_delta", "0.a.1"), ("attempt_discarded", "0.a.1"), ("text_delta", "0.a.2"),
    ]
    assert events[1].data["text"] == "Hello wor" and events[3].data["text"] == "Hello world"


async def test_an_unsent_first_call_announces_its_turn_and_leaves_no_attempt_to_discard(redis, session_id):
    """A turn's first model call publishes ``turn_started`` when it starts (before its
    memory search), then what it recalled; one that comes back unsent (the session
    calls again) is forgotten, so the step's next call announces no discarded attempt."""
    log = EventLog(redis)
    recalled = TurnEvent(type="memories_recalled", session_id=session_id, turn=2, data={"memories": []})
    events = model_call_events(log, session_id, 2, 0, "0.a.1")
    async with events:
        assert [e.type for e in await log.read(session_id, START)] == ["turn_started"], "before the search"
        await events.publish([recalled])
        await events.unsent()
    async with model_call_events(log, session_id, 2, 0, "0.b.1") as text:
        assert text is not None
        text.add("Hi")
    kinds = [e.type for e in await log.read(session_id, START)]
    assert kinds == ["turn_started", "memories_recalled", "text_delta"], kinds


async def test_a_first_step_alone_starts_its_turn_once_in_one_write_of_markers(redis, session_id):
    log = EventLog(redis)
    async with model_call_events(log, session_id, 2, 0, "0.a.1") as text:
        text.add("Hi")
    async with model_call_events(log, session_id, 2, 0, "0.a.1") as text:  # the same attempt again: nothing to drop
        pass
    async with model_call_events(log, session_id, 2, 1, "1.b.1") as text:  # a later step never starts the turn
        text.add("There")
    async with model_call_events(log, session_id, 2, 0, "0.a.2") as text:
        text.add("Hi again")
    kinds = [(e.type, e.step, e.attempt) for e in await log.read(session_id, START)]
    assert kinds == [
        ("turn_started", None, None), ("text_delta", 0, "0.a.1"), ("text_delta", 1, "1.b.1"),
        ("attempt_discarded", 0, "0.a.1"), ("text_delta", 0, "0.a.2"),
    ]


async def test_a_failed_step_marker_write_does_not_lose_turn_started(redis, session_id):
    # The turn marker and the step marker go in one pipeline: the turn marker taken while
    # the step marker failed must still publish turn_started (no later call would; found
    # by a helper trying to break the one-write start).
    log = EventLog(redis)
    marker = f"{stream_key(session_id)}:step:1.0"
    await redis.rpush(marker, "x")  # the step marker's write will fail (WRONGTYPE)
    async with model_call_events(log, session_id, 1, 0, "0.a.1") as text:
        assert text is not None
        text.add("Hi")
    assert text.unpublished == 1  # said, never silent
    await redis.delete(marker)
    async with model_call_events(log, session_id, 1, 0, "0.a.2") as text:
        text.add("Hi")
    await log.begin_turn(session_id, 1)
    assert [e.type for e in await log.read(session_id, START)] == ["turn_started", "text_delta", "text_delta"]


async def test_an_unreachable_redis_costs_the_work_nothing(session_id):
    import redis.asyncio as aioredis

    dead = aioredis.Redis(host="127.0.0.1", port=1, socket_connect_timeout=0.2)
    log = EventLog(dead)
    await log.publish_quietly([_event(session_id)])
    await log.begin_turn(session_id, 1)
    async with model_call_events(log, session_id, 1, 0, "0.x.1") as text:
        text.add("still fine")
    await dead.aclose()


async def _stream(hermes: Any, session_id: str, text: str, **kwargs: Any) -> tuple[list[TurnEvent], TurnResult]:
    items = [item async for item in hermes.stream_message(session_id, text, user_id="u1", **kwargs)]
    *events, result = items
    assert isinstance(result, TurnResult) and all(isinstance(e, TurnEvent) for e in events)
    return events, result


async def test_a_streamed_turn_yields_its_events_in_order_and_then_its_result(run_worker, session_id):
    async with run_worker(STREAMING_SCRIPT) as hermes:
        events, result = await _stream(hermes, session_id, "please add these")
    kinds = [e.type for e in events]
    assert kinds[0] == "turn_started" and kinds[-1] == "turn_finished"
    assert kinds.index("tool_call_started") < kinds.index("tool_call_finished") < kinds.index("text_delta")
    assert all(e.turn == result.turn for e in events)
    started = next(e for e in events if e.type == "tool_call_started")
    finished = next(e for e in events if e.type == "tool_call_finished")
    assert (started.data["name"], '"19+23"' in started.data["arguments"]) == ("calculate", True)
    assert (finished.data["code"], finished.data["ok"]) == (0, True)
    deltas = [e for e in events if e.type == "text_delta"]
    assert len(deltas) > 1, "the reply came in one piece: nothing streamed"
    assert "".join(d.data["text"] for d in deltas) == result.reply
    assert events[-1].data["status"] == result.status == "completed"
    offsets = [e.offset for e in events]
    assert len(set(offsets)) == len(offsets)


async def test_events_add_nothing_to_the_sessions_history(temporal_client, settings, redis, session_id):
    lengths = {}
    for enabled in (True, False):
        sid = f"{session_id}-{enabled}"
        worker = build_worker(
            temporal_client, settings.model_copy(update={"events_enabled": enabled}),
            provider=ScriptedModel.from_dict(STREAMING_SCRIPT), registry=register_builtins(ToolRegistry()),
            redis=redis, memory=False,
        )
        async with worker:
            hermes = HermesClient(temporal_client, task_queue=settings.task_queue, redis=redis)
            await hermes.send_message(sid, "please add these", user_id="u1")
            await hermes.send_message(sid, "and now talk", user_id="u1")
            published = await hermes.events.read(sid, START)
        history = await temporal_client.get_workflow_handle(sid).fetch_history()
        lengths[enabled] = (len(history.events), history.to_json().count('"'), len(published))
    assert lengths[True][:2] == lengths[False][:2]
    assert lengths[True][2] > 0 and lengths[False][2] == 0


async def test_a_second_message_streams_only_its_own_turn_after_the_first(run_worker, session_id):
    async with run_worker(STREAMING_SCRIPT) as hermes:
        first_events, first = await _stream(hermes, session_id, "please add these")
        second_events, second = await _stream(hermes, session_id, "now just talk")
    assert {e.turn for e in second_events} == {second.turn} != {first.turn}
    assert "".join(e.data["text"] for e in second_events if e.type == "text_delta") == second.reply
    assert not {e.offset for e in first_events} & {e.offset for e in second_events}


async def test_a_refused_message_streams_nothing_and_raises(run_worker, session_id):
    from hermes.errors import MessageRejectedError

    async with run_worker(STREAMING_SCRIPT) as hermes:
        with pytest.raises(MessageRejectedError):
            await asyncio.wait_for(_stream(hermes, session_id, "   "), 30)


async def _until_queued(hermes: Any, session_id: str, queued: int) -> None:
    while (await hermes.get_state(session_id)).queued_messages < queued:
        await asyncio.sleep(0.05)  # polling a condition, as wait_for_approval does


@pytest.mark.timeout(600)
async def test_a_message_queued_behind_a_running_turn_streams_only_its_own_turn(run_worker, session_id):
    from hermes.providers.scripted import ScriptedModel

    async with run_worker(ScriptedModel.demo(), memory=False) as hermes:
        first = asyncio.create_task(hermes.send_message(session_id, "Save a note: buy milk", user_id="u1"))
        pending = await hermes.wait_for_approval(session_id, timeout_seconds=120)
        second = asyncio.create_task(_stream(hermes, session_id, "What is 2 ** 10?"))
        await asyncio.wait_for(_until_queued(hermes, session_id, 1), 60)
        # Decided now, the first turn publishes its approval, tool call, text and end while
        # the queued message's stream reads the session: none of them is the second's.
        await hermes.approve(session_id, pending.tool_call_id, approver="u1")
        events, result = await asyncio.wait_for(second, 120)
        assert (await first).turn == 1
    assert result.turn == 2
    assert {e.turn for e in events} == {2}, [(e.type, e.turn) for e in events]
    kinds = [e.type for e in events]
    assert kinds[0] == "turn_started" and kinds[-1] == "turn_finished"
    assert "".join(e.data["text"] for e in events if e.type == "text_delta") == result.reply


async def test_a_listener_that_leaves_before_the_session_has_the_message_loses_nothing(run_worker, session_id):
    # A page reloaded right after Enter: the request's listener went away while the
    # message was still on its way, and the send was cancelled with it (issue 32).
    async with run_worker(STREAMING_SCRIPT) as hermes:
        listener = asyncio.ensure_future(anext(hermes.stream_message(session_id, "plain words please", user_id="u1")))
        await asyncio.sleep(0)
        listener.cancel()
        with pytest.raises(asyncio.CancelledError):
            await listener
        state = await eventually(lambda: _turns_done(hermes, session_id, 1), timeout_seconds=60)
    assert state.turn_count == 1 and not state.busy


async def _turns_done(hermes: Any, session_id: str, count: int) -> Any:
    try:
        state = await hermes.get_state(session_id)
    except Exception:  # noqa: BLE001 - not started yet
        return None
    return state if state.turn_count >= count and not state.busy else None


async def test_a_slow_tool_call_shows_as_started_while_it_runs_and_a_fast_ones_events_come_in_order(redis, session_id):
    from temporalio.testing import ActivityEnvironment

    from activities.tools import STARTED_EVENT_DELAY_SECONDS, ToolActivities
    from hermes.models import RunToolInput, ToolCall

    release = asyncio.Event()

    async def slow_lookup(order_id: int) -> dict[str, int]:
        """Look up an order slowly."""
        await release.wait()
        return {"order_id": order_id}

    def fast_lookup(order_id: int) -> dict[str, int]:
        """Look up an order."""
        return {"order_id": order_id}

    registry = ToolRegistry()
    registry.register(slow_lookup, idempotency="idempotent", permission="read")
    registry.register(fast_lookup, idempotency="idempotent", permission="read")
    tools = ToolActivities(registry, redis, tier_seconds=lambda tier: 15.0)
    tools.events = log = EventLog(redis)

    def call(name: str, call_id: str) -> RunToolInput:
        return RunToolInput(session_id=session_id, user_id="u", turn=1, tool_call=ToolCall(tool_call_id=call_id, name=name, arguments={"order_id": 7}))

    async def kinds(call_id: str) -> list[str]:
        return [e.type for e in await log.read(session_id) if e.data.get("tool_call_id") == call_id]

    slow = asyncio.create_task(ActivityEnvironment().run(tools.run_tool, call("slow_lookup", "slow")))
    async def started_shown() -> bool:
        return await kinds("slow") == ["tool_call_started"]

    await eventually(started_shown, what="the slow call's started event", timeout_seconds=STARTED_EVENT_DELAY_SECONDS + 10)
    release.set()
    assert (await slow).code == 0
    fast = await ActivityEnvironment().run(tools.run_tool, call("fast_lookup", "fast"))

    assert await kinds("slow") == ["tool_call_started", "tool_call_finished"]
    assert fast.code == 0 and await kinds("fast") == ["tool_call_started", "tool_call_finished"]



async def test_a_synchronous_tool_publishes_its_end_from_its_thread_in_order_with_its_attempt(redis, session_id):
    # Issue 31: a synchronous idempotent tool's two events go out from its thread (no round
    # trip of the event loop's); a slow one still shows as started while it runs, the
    # started event never twice, and the events carry the activity's attempt.
    import threading

    from temporalio.testing import ActivityEnvironment

    from activities.tools import STARTED_EVENT_DELAY_SECONDS, ToolActivities
    from hermes.models import RunToolInput, ToolCall

    release = threading.Event()
    threads: dict[str, str] = {}

    def lookup(order_id: int) -> dict[str, int]:
        """Look up an order."""
        threads[str(order_id)] = threading.current_thread().name
        if order_id == 1:
            release.wait(30)
        return {"order_id": order_id}

    registry = ToolRegistry()
    registry.register(lookup, idempotency="idempotent", permission="read")
    tools = ToolActivities(registry, redis, tier_seconds=lambda tier: 15.0)
    tools.events = log = EventLog(redis)
    assert log.blocking is not None

    def run(order_id: int, attempt: int) -> Any:
        request = RunToolInput(
            session_id=session_id, user_id="u", turn=1,
            tool_call=ToolCall(tool_call_id=f"c{order_id}", name="lookup", arguments={"order_id": order_id}),
        )
        env = ActivityEnvironment()
        env.info = dataclasses.replace(env.info, attempt=attempt)
        return env.run(tools.run_tool, request)

    async def events_of(call_id: str) -> list[tuple[str, int]]:
        return [(e.type, e.data["attempt"]) for e in await log.read(session_id) if e.data.get("tool_call_id") == call_id]

    slow = asyncio.create_task(run(1, 2))

    async def started_shown() -> bool:
        return await events_of("c1") == [("tool_call_started", 2)]

    await eventually(started_shown, what="the slow call's started event", timeout_seconds=STARTED_EVENT_DELAY_SECONDS + 10)
    release.set()
    assert (await slow).code == 0
    fast = await run(2, 3)
    assert fast.code == 0 and fast.data == {"order_id": 2}
    assert await events_of("c1") == [("tool_call_started", 2), ("tool_call_finished", 2)]
    assert await events_of("c2") == [("tool_call_started", 3), ("tool_call_finished", 3)]
    assert threads["2"].startswith("hermes-tool")


async def test_a_synchronous_tools_end_events_that_do_not_land_are_reported_and_the_result_kept(redis, session_id):
    # Events from the tool's thread are best effort like every turn event: a Redis that
    # does not answer costs the events (reported: warning, metric, tally), never the result.
    import redis as sync_redis
    from temporalio.testing import ActivityEnvironment

    from activities.tools import ToolActivities
    from hermes.infra.redis_writes import take_skipped
    from hermes.models import RunToolInput, ToolCall

    def lookup(order_id: int) -> dict[str, int]:
        """Look up an order."""
        return {"order_id": order_id}

    registry = ToolRegistry()
    registry.register(lookup, idempotency="idempotent", permission="read")
    tools = ToolActivities(registry, redis, tier_seconds=lambda tier: 15.0)
    tools.events = log = EventLog(redis)
    log.blocking = sync_redis.Redis(port=_closed_port(), socket_connect_timeout=0.5, socket_timeout=0.5)
    request = RunToolInput(
        session_id=session_id, user_id="u", turn=1, tool_call=ToolCall(tool_call_id="c1", name="lookup", arguments={"order_id": 5})
    )
    take_skipped(session_id)
    result = await ActivityEnvironment().run(tools.run_tool, request)
    assert result.code == 0 and result.data == {"order_id": 5}
    assert take_skipped(session_id) == {"turn_events": 2}
    assert await log.read(session_id) == []


async def test_a_cancelled_attempts_thread_publishes_nothing_and_an_unshowable_result_is_kept(redis, session_id):
    # Found by a break-it review: the thread of an attempt cancelled before its started
    # event was due still published started + finished(ok); and an event that could not be
    # made (an integer JSON refuses) failed the call that ran, which was then retried.
    import threading
    import time

    from temporalio.testing import ActivityEnvironment

    from activities.tools import ToolActivities
    from hermes.models import RunToolInput, ToolCall

    done = threading.Event()
    runs: list[int] = []

    def lookup(order_id: int) -> dict[str, int]:
        """Look up an order."""
        runs.append(order_id)
        if order_id == 1:
            time.sleep(0.5)
            done.set()
        return {"order_id": order_id, "n": 10**5000}

    registry = ToolRegistry()
    registry.register(lookup, idempotency="idempotent", permission="read")
    tools = ToolActivities(registry, redis, tier_seconds=lambda tier: 15.0)
    tools.events = log = EventLog(redis)

    def request(order_id: int) -> RunToolInput:
        call = ToolCall(tool_call_id=f"c{order_id}", name="lookup", arguments={"order_id": order_id})
        return RunToolInput(session_id=session_id, user_id="u", turn=1, tool_call=call)

    env = ActivityEnvironment()
    cancelled = asyncio.create_task(env.run(tools.run_tool, request(1)))
    await asyncio.sleep(0.05)  # its started event is not due yet
    env.cancel()
    with pytest.raises(BaseException):
        await cancelled
    await asyncio.to_thread(done.wait, 5)
    await asyncio.sleep(0.3)
    assert [e for e in await log.read(session_id) if e.data.get("tool_call_id") == "c1"] == []

    result = await ActivityEnvironment().run(tools.run_tool, request(2))
    assert result.code == 0 and runs == [1, 2]
    finished = [e for e in await log.read(session_id) if e.type == "tool_call_finished"]
    assert len(finished) == 1 and "not shown" in finished[0].data["data"]

def test_a_delayed_event_taken_by_a_thread_is_never_sent_and_one_being_sent_cannot_be_taken() -> None:
    from hermes.content.events import DelayedEvent

    async def scenario() -> list[bool]:
        sent: list[str] = []

        async def publish() -> None:
            sent.append("started")

        taken = DelayedEvent(publish, 0.01)
        first = await asyncio.to_thread(taken.take)
        again = taken.take()
        due = DelayedEvent(publish, 0.01)
        await asyncio.sleep(0.05)
        late = await asyncio.to_thread(due.take)
        await due.settle()
        return [first, again, late, sent == ["started"], await taken.settle()]

    assert asyncio.run(scenario()) == [True, False, False, True, False]


def _closed_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _inline_call(session_id: str, text: str) -> Any:
    """A session's first model call whose context (one user message) rides inline."""
    import json

    from hermes.content.blobs import body_json, message_ref, value_ref
    from hermes.models import CallModelInput, Message

    user = Message(role="user", content=text, turn=1)
    refs = [message_ref(user)]
    context = value_ref(refs)
    return CallModelInput(
        session_id=session_id, turn=1, step=0, context_ref=context, bodies_stored=True,
        bodies={context: json.dumps(refs), refs[0]: body_json(user)},
    )


def _pipelines(monkeypatch: Any, *, slow: float = 0.0) -> list[list[str]]:
    """The commands of every Redis pipeline sent from now on; with ``slow``, the first one
    that holds a step marker answers only after ``slow`` seconds (its writes land)."""
    from redis.asyncio.client import Pipeline

    sent: list[list[str]] = []
    original = Pipeline.execute

    async def execute(self: Any, *args: Any, **kwargs: Any) -> Any:
        commands = [str(c[0][0]).upper() for c in self.command_stack]
        sent.append(commands)
        answers = await original(self, *args, **kwargs)
        if slow and "GETSET" in commands and sum("GETSET" in c for c in sent) == 1:
            await asyncio.sleep(slow)
        return answers

    monkeypatch.setattr(Pipeline, "execute", execute)
    return sent


async def test_a_model_calls_inline_bodies_and_its_step_markers_share_a_round_trip(redis, session_id, monkeypatch):
    """Issue 31: a model call wrote the bodies it carried inline and its attempt's step
    markers in two round trips; they go in one, and the events and bodies are as before."""
    from activities.model import ModelActivities
    from hermes.content.blobs import BODIES
    from hermes.content.blobs import BlobStore

    sent = _pipelines(monkeypatch)
    activities = ModelActivities(ScriptedModel.from_dict({"turns": [{"match": ".", "steps": [{"reply": "Hi."}]}]}), store=BlobStore(redis))
    log = activities.events = EventLog(redis)
    request = _inline_call(session_id, "hello")
    BODIES.clear()
    result = await activities.call_model(request)
    assert result.message.content == "Hi." and result.degraded == []
    assert ["SET", "GETSET", "EXPIRE", "SET", "SET"] in sent, sent
    assert await BlobStore(redis).get_many(list(request.bodies)) == request.bodies
    assert [e.type for e in await log.read(session_id, START)] == ["turn_started", "text_delta"]


async def test_step_markers_whose_round_trip_answered_late_are_reported_not_written_again(redis, session_id, monkeypatch):
    """The shared round trip answered after its bound: its writes landed, so writing the
    markers again would find them taken and publish nothing, silently. The events are
    reported as not published instead (the result says so), and the bodies are written
    again on their own."""
    from activities.model import ModelActivities
    from hermes.content.blobs import BODIES
    from hermes.content.blobs import BlobStore

    sent = _pipelines(monkeypatch, slow=PUBLISH_TIMEOUT_SECONDS + 0.5)
    activities = ModelActivities(ScriptedModel.from_dict({"turns": [{"match": ".", "steps": [{"reply": "Hi."}]}]}), store=BlobStore(redis))
    activities.events = EventLog(redis)
    request = _inline_call(session_id, "hello")
    BODIES.clear()
    result = await activities.call_model(request)
    assert result.message.content == "Hi."
    [degraded] = result.degraded
    assert degraded.kind == "events" and "were not published" in degraded.detail
    assert sum("GETSET" in c for c in sent) == 1, "the markers were written again"
    assert await BlobStore(redis).get_many(list(request.bodies)) == request.bodies


@pytest.mark.timeout(30)
async def test_a_delayed_event_being_sent_is_sent_whole_when_its_settle_is_cancelled() -> None:
    """Cancelling the wait in ``DelayedEvent.settle`` (the attempt cancelled while its
    started event is on its way) used to cancel the publishing itself: an event half sent
    (found by a break-it review)."""
    from hermes.content.events import DelayedEvent

    sent: list[str] = []
    release = asyncio.Event()

    async def publish() -> None:
        await release.wait()
        sent.append("tool_call_started")

    event = DelayedEvent(publish, 0.01)
    await asyncio.sleep(0.05)  # due: being sent
    waiter = asyncio.ensure_future(event.settle())
    await asyncio.sleep(0.01)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    release.set()
    await asyncio.sleep(0.05)
    assert sent == ["tool_call_started"]
