"""Sinks (:mod:`hermes.infra.sinks`, :func:`hermes.infra.activation.sink_runner`): calls
from workflow code to its worker, made when the activation that asked for them ends and
before its completion goes back to the server; never on replay, never for an activation
that failed; a slow or failing sink holds or fails no workflow task. The session writes
its index row and ``turn_finished`` through one (issue 31: a local activity less a turn)."""

from __future__ import annotations

import asyncio
import logging
import uuid
from typing import Any

import pytest
from temporalio import workflow
from temporalio.worker import Replayer, UnsandboxedWorkflowRunner, Worker

with workflow.unsafe.imports_passed_through():
    from hermes import names
    from hermes.client import HermesClient
    from hermes.content.events import START
    from hermes.infra import sinks
    from hermes.infra.activation import sink_runner
    from hermes.providers.scripted import ScriptedModel
    from hermes.sessions.index import list_entries
    from hermes.tools.builtin import register_builtins
    from hermes.tools.registry import ToolRegistry
    from tests.test_memory_session import local_activities
    from worker import build_worker

FAILURES_LEFT = {"SinkProbe": 0}
"""Workflow tasks the probe fails on purpose before it goes on (read by unsandboxed runs)."""


@workflow.defn(name="SinkProbe")
class SinkProbe:
    @workflow.run
    async def run(self, value: str) -> bool:
        taken = sinks.emit("probe", value)
        if FAILURES_LEFT["SinkProbe"] > 0:
            FAILURES_LEFT["SinkProbe"] -= 1
            raise RuntimeError("this workflow task fails once, on purpose")
        await workflow.sleep(0.01)  # a second activation, which calls no sink
        return taken


class _Recorder:
    """A ``probe`` sink: records each value it is called with, once done (after ``delay``)."""

    def __init__(self, delay: float = 0.0, fail: bool = False):
        self.delay, self.fail = delay, fail
        self.values: list[str] = []

    async def __call__(self, value: str) -> None:
        await asyncio.sleep(self.delay)
        if self.fail:
            raise ConnectionError("the sink's store is down")
        self.values.append(value)


async def _run_probe(client: Any, queue: str, runner: Any, value: str) -> bool:
    async with Worker(client, task_queue=queue, workflows=[SinkProbe], workflow_runner=runner):
        return await client.execute_workflow("SinkProbe", value, id=f"probe-{uuid.uuid4().hex[:8]}", task_queue=queue,
                                             result_type=bool)


@pytest.mark.parametrize("sandboxed", [True, False])
async def test_a_sink_call_is_made_once_when_its_activation_ends_before_the_workflow_goes_on(
    temporal_client, task_queue, sandboxed
):
    recorder = _Recorder(delay=0.3)
    taken = await _run_probe(temporal_client, task_queue, sink_runner({"probe": recorder}, sandboxed=sandboxed), "v1")
    # The handler took 0.3 s; the workflow's next task came only after it: it is done.
    assert (taken, recorder.values) == (True, ["v1"])


async def test_a_replay_makes_no_sink_call(temporal_client, task_queue):
    recorder = _Recorder()
    runner = sink_runner({"probe": recorder})
    async with Worker(temporal_client, task_queue=task_queue, workflows=[SinkProbe], workflow_runner=runner):
        handle = await temporal_client.start_workflow("SinkProbe", "live", id=f"probe-{uuid.uuid4().hex[:8]}",
                                                      task_queue=task_queue)
        assert await handle.result() is True
    history = await handle.fetch_history()
    await Replayer(workflows=[SinkProbe], workflow_runner=runner).replay_workflow(history)
    assert recorder.values == ["live"]


async def test_a_failed_activation_makes_no_sink_call_and_its_retry_makes_one(temporal_client, task_queue):
    recorder = _Recorder()
    FAILURES_LEFT["SinkProbe"] = 1
    try:
        taken = await _run_probe(temporal_client, task_queue, sink_runner({"probe": recorder}, sandboxed=False), "v2")
    finally:
        FAILURES_LEFT["SinkProbe"] = 0
    assert (taken, recorder.values) == (True, ["v2"])


async def test_a_runner_without_sinks_tells_the_workflow_and_writes_nothing(temporal_client, task_queue):
    assert await _run_probe(temporal_client, task_queue, UnsandboxedWorkflowRunner(), "nowhere") is False


async def test_a_slow_sink_holds_its_activation_only_up_to_the_bound_and_still_finishes(
    temporal_client, task_queue, monkeypatch
):
    monkeypatch.setattr(sinks, "SINK_WAIT_SECONDS", 0.2)
    recorder = _Recorder(delay=1.5)
    runner = sink_runner({"probe": recorder})
    loop = asyncio.get_running_loop()
    began = loop.time()
    taken = await _run_probe(temporal_client, task_queue, runner, "late")
    assert taken is True and loop.time() - began < 1.5 + 5, "the workflow waited for the slow sink"
    assert runner.sink_calls.late == 1
    for _ in range(100):
        if recorder.values:
            break
        await asyncio.sleep(0.05)
    assert recorder.values == ["late"], "the slow sink call did not finish"


async def test_a_failing_sink_fails_no_workflow_task_and_is_logged(temporal_client, task_queue, caplog):
    caplog.set_level(logging.ERROR, logger="hermes.activation")
    recorder = _Recorder(fail=True)
    assert await _run_probe(temporal_client, task_queue, sink_runner({"probe": recorder}), "lost") is True
    assert any("sink 'probe' failed" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("sandboxed", [True, False])
async def test_a_turn_writes_its_index_row_and_turn_finished_through_the_sink_before_its_reply(
    temporal_client, settings, redis, session_id, sandboxed
):
    user = f"u-{uuid.uuid4().hex[:8]}"
    worker = build_worker(
        temporal_client, settings.model_copy(update={"workflow_sandbox": sandboxed}),
        provider=ScriptedModel.demo(), registry=register_builtins(ToolRegistry()), redis=redis, memory=False,
    )
    async with worker:
        hermes = HermesClient(temporal_client, task_queue=settings.task_queue, redis=redis)
        for turn in (1, 2):
            result = await hermes.send_message(session_id, "What is (17 + 25) * 3?", user_id=user)
            # Read at once: the row and the event were written before the reply was sent.
            rows = await list_entries(redis, user)
            finished = [e for e in await hermes.events.read(session_id, START) if e.type == "turn_finished"]
            assert (result.turn, result.status) == (turn, "completed")
            assert [(r.session_id, r.turn_count) for r in rows] == [(session_id, turn)]
            assert [(e.turn, e.data["status"]) for e in finished][-1] == (turn, "completed")
    history = await temporal_client.get_workflow_handle(session_id).fetch_history()
    assert names.UPDATE_SESSION_INDEX not in local_activities(history)
    patches = [
        b"".join(p.data for v in e.marker_recorded_event_attributes.details.values() for p in v.payloads)
        for e in history.events
        if e.HasField("marker_recorded_event_attributes") and e.marker_recorded_event_attributes.marker_name == "core_patch"
    ]
    assert any(b"index-through-sink" in p for p in patches)


def test_sink_calls_meeting_a_loop_closed_meanwhile_are_dropped_with_a_warning_not_raised(caplog):
    from hermes.infra.activation import SinkCalls

    caplog.set_level(logging.WARNING, logger="hermes.activation")
    recorder = _Recorder()
    calls = SinkCalls({"probe": recorder})
    loop = asyncio.new_event_loop()
    loop.close()
    loop.is_closed = lambda: False  # type: ignore[method-assign]  # closed after the check: the worker stopping
    calls.loop = loop
    try:
        calls.run([("probe", "gone")])
    finally:
        del loop.is_closed
    assert recorder.values == []
    assert any("sink calls ['probe'] dropped" in r.getMessage() for r in caplog.records)


@workflow.defn(name="UnsandboxedSinkProbe", sandboxed=False)
class UnsandboxedSinkProbe:
    @workflow.run
    async def run(self, value: str) -> bool:
        return sinks.emit("probe", value)


async def test_a_workflow_defined_unsandboxed_on_a_sandboxed_worker_reaches_the_same_sinks(temporal_client, task_queue):
    recorder = _Recorder()
    runner = sink_runner({"probe": recorder})
    async with Worker(temporal_client, task_queue=task_queue, workflows=[UnsandboxedSinkProbe], workflow_runner=runner,
                      unsandboxed_workflow_runner=runner.unsandboxed()):
        taken = await temporal_client.execute_workflow(
            "UnsandboxedSinkProbe", "plain", id=f"probe-{uuid.uuid4().hex[:8]}", task_queue=task_queue, result_type=bool
        )
    assert (taken, recorder.values) == (True, ["plain"])


def _loop_in_thread() -> tuple[asyncio.AbstractEventLoop, Any]:
    import threading

    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    return loop, thread


def test_a_sink_wait_ends_before_the_activations_deadlock_bound_and_the_call_still_finishes(caplog):
    import time

    from hermes.infra.activation import DEADLOCK_MARGIN_SECONDS, SinkCalls

    caplog.set_level(logging.WARNING, logger="hermes.activation")
    recorder = _Recorder(delay=1.0)
    calls = SinkCalls({"probe": recorder}, deadlock_seconds=1.0)
    loop, thread = _loop_in_thread()
    try:
        calls.loop, calls.loop_thread = loop, thread.ident  # as bind() on that loop does
        began = time.monotonic()
        calls.run([("probe", "near the bound")], activation_seconds=1.0 - DEADLOCK_MARGIN_SECONDS - 0.1)
        assert time.monotonic() - began < 0.6, "the wait ran past what the activation left of its deadlock bound"
        assert calls.late == 1 and len(calls.unfinished) == 1
        time.sleep(1.5)
        assert recorder.values == ["near the bound"] and not calls.unfinished
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
        loop.close()


async def test_an_activation_on_the_loops_own_thread_never_waits_for_its_sink_calls():
    import time

    from hermes.infra.activation import SinkCalls

    recorder = _Recorder(delay=0.5)
    calls = SinkCalls({"probe": recorder}, deadlock_seconds=10.0)
    calls.bind()  # on this loop's thread, as the SDK's debug mode activates
    began = time.monotonic()
    calls.run([("probe", "debug")])
    assert time.monotonic() - began < 0.2 and recorder.values == []
    await asyncio.sleep(0.8)
    assert recorder.values == ["debug"]
