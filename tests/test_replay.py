"""Replay tests: SessionWorkflow must keep replaying the histories it produced.

``tests/histories/session_with_tools_and_approval.json`` stands for a session already
running in production (recorded before the ``tool-layer-v2`` patch;
``session_tool_layer_v2.json`` is the same conversation after it, and
``session_bounded_context.json`` after the ``bounded-context`` patch) (tool calls, an approved and a rejected write, a system-prompt
signal, close); ``tests/histories/record.py`` regenerates it. A change to the workflow
that alters the commands it emits for that history fails here with a
nondeterminism error: such a change needs ``workflow.patched()``, not a new recording.
"""

from __future__ import annotations

import uuid
from collections import Counter
from datetime import timedelta
from typing import Any

import pytest
from temporalio import workflow
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer, UnsandboxedWorkflowRunner

from hermes import names
from hermes.models import SessionConfig, SessionInput, SessionState, ToolSpec
from tests.histories.record import HISTORY_PATH, SCRIPT, record
from tests.support import run_histories
from workflows.session import SessionWorkflow


def replayer(*workflows: type, sandboxed: bool = True) -> Replayer:
    runner = {} if sandboxed else {"workflow_runner": UnsandboxedWorkflowRunner()}
    return Replayer(workflows=list(workflows) or [SessionWorkflow], data_converter=pydantic_data_converter, **runner)


@pytest.mark.parametrize("path", sorted(HISTORY_PATH.parent.glob("*.json")), ids=lambda p: p.stem)
async def test_every_committed_history_replays_outside_the_sandbox_too(path):
    # HERMES_WORKFLOW_SANDBOX=false runs workflow code unsandboxed: these histories are
    # then what holds it to determinism.
    history = WorkflowHistory.from_json(path.stem, path.read_text(encoding="utf-8"))
    result = await replayer(sandboxed=False).replay_workflow(history)
    assert result.replay_failure is None


def committed_history() -> WorkflowHistory:
    return WorkflowHistory.from_json("session-recorded", HISTORY_PATH.read_text(encoding="utf-8"))


def event_counts(history: WorkflowHistory) -> Counter[str]:
    return Counter(EventType.Name(e.event_type).removeprefix("EVENT_TYPE_") for e in history.events)


@workflow.defn(name=names.SESSION_WORKFLOW, sandboxed=False)
class SessionWorkflowThatSkipsToolListing(SessionWorkflow):
    """An incompatible change: tools no longer listed by a local activity each turn."""

    @workflow.run
    async def run(self, inp: SessionInput) -> SessionState:
        return await super().run(inp)

    async def _list_tools(self, turn: int, text: str) -> tuple[dict[str, ToolSpec], list[Any]]:
        return {}, []


@workflow.defn(name=names.SESSION_WORKFLOW, sandboxed=False)
class SessionWorkflowWithLongerModelTimeout(SessionWorkflow):
    """A compatible change: only an activity option differs, the commands are the same."""

    @workflow.run
    async def run(self, inp: SessionInput) -> SessionState:
        self._cfg = self._cfg.model_copy(update={"model_timeout_seconds": 300.0})
        return await super().run(inp)


def test_the_committed_history_records_tool_calls_approvals_signals_and_close():
    history = committed_history()
    counts = event_counts(history)
    # Six user turns, each an accepted and completed update; two approval decisions, a
    # prompt change and the close as signals; local activities (tool listing, index) as markers.
    assert counts["WORKFLOW_EXECUTION_UPDATE_ACCEPTED"] == 6
    assert counts["WORKFLOW_EXECUTION_UPDATE_COMPLETED"] == 6
    assert counts["WORKFLOW_EXECUTION_SIGNALED"] == 4
    assert counts["MARKER_RECORDED"] >= 6
    assert counts["WORKFLOW_EXECUTION_COMPLETED"] == 1
    scheduled = Counter(
        e.activity_task_scheduled_event_attributes.activity_type.name
        for e in history.events
        if e.HasField("activity_task_scheduled_event_attributes")
    )
    # 11 model calls; 5 tool runs (the rejected save_note never runs).
    assert scheduled == {names.CALL_MODEL: 11, names.RUN_TOOL: 5}


async def test_the_committed_session_history_replays_without_nondeterminism():
    result = await replayer().replay_workflow(committed_history())
    assert result.replay_failure is None


V2_HISTORY_PATH = HISTORY_PATH.with_name("session_tool_layer_v2.json")


async def test_the_history_recorded_under_the_current_tool_layer_replays():
    """The same conversation recorded under the current tool layer's patches
    (``tool-layer-v2``: a check before each approval, a step's approvals requested at
    once; ``approval-audit-log``; ``stop-turn-on-close``), decided in the first task."""
    history = WorkflowHistory.from_json("session-recorded-v2", V2_HISTORY_PATH.read_text(encoding="utf-8"))
    markers = [e for e in history.events if e.HasField("marker_recorded_event_attributes")]
    assert sum(m.marker_recorded_event_attributes.marker_name == "core_patch" for m in markers) == 3
    result = await replayer().replay_workflow(history)
    assert result.replay_failure is None


BOUNDED_HISTORY_PATH = HISTORY_PATH.with_name("session_bounded_context.json")


async def test_the_history_recorded_with_bounded_context_replays():
    """The same conversation recorded under ``bounded-context`` (model calls by content
    reference, the tool list by reference when unchanged, idle timers): a later change to
    the commands of that layer needs its own patch."""
    history = WorkflowHistory.from_json("session-recorded-v3", BOUNDED_HISTORY_PATH.read_text(encoding="utf-8"))
    markers = [e for e in history.events if e.HasField("marker_recorded_event_attributes")]
    assert sum(m.marker_recorded_event_attributes.marker_name == "core_patch" for m in markers) == 4
    timers = [e for e in history.events if e.HasField("timer_started_event_attributes")]
    assert any(t.timer_started_event_attributes.start_to_fire_timeout.seconds == 1800 for t in timers)
    result = await replayer().replay_workflow(history)
    assert result.replay_failure is None


async def test_replaying_the_committed_history_fails_when_the_workflow_emits_different_commands():
    with pytest.raises(workflow.NondeterminismError):
        await replayer(SessionWorkflowThatSkipsToolListing).replay_workflow(committed_history())


async def test_replaying_the_committed_history_passes_when_only_activity_options_change():
    result = await replayer(SessionWorkflowWithLongerModelTimeout).replay_workflow(committed_history())
    assert result.replay_failure is None


async def test_a_freshly_recorded_session_history_replays_without_nondeterminism(run_worker, session_id):
    async with run_worker(SCRIPT) as hermes:
        history, results = await record(hermes, session_id, f"alice-{uuid.uuid4().hex[:8]}")
    assert [r.status for r in results] == ["completed"] * 6
    assert results[2].tool_calls[0].approval == "approved"
    assert results[3].tool_calls[0].approval == "rejected"
    assert results[4].reply == "You have 1 note(s)."
    assert results[5].reply == "1024 and 2048."

    # Through JSON, as the committed file is stored.
    roundtrip = WorkflowHistory.from_json(session_id, history.to_json())
    assert event_counts(roundtrip) == event_counts(history)
    result = await replayer().replay_workflow(roundtrip)
    assert result.replay_failure is None


async def test_a_worker_outside_the_sandbox_records_the_same_turns_and_a_history_the_sandbox_replays(
    temporal_client: Client, settings, redis, session_id
):
    from hermes.client import HermesClient
    from hermes.providers.scripted import ScriptedModel
    from hermes.tools.builtin import register_builtins
    from hermes.tools.registry import ToolRegistry
    from worker import build_worker

    unsandboxed = settings.model_copy(update={"workflow_sandbox": False})
    registry = ToolRegistry()
    register_builtins(registry)
    worker = build_worker(temporal_client, unsandboxed, provider=ScriptedModel.from_dict(SCRIPT), registry=registry, redis=redis)
    assert isinstance(worker.config()["workflow_runner"], UnsandboxedWorkflowRunner)
    async with worker:
        hermes = HermesClient(temporal_client, task_queue=settings.task_queue, redis=redis)
        history, results = await record(hermes, session_id, f"carol-{uuid.uuid4().hex[:8]}")
    assert [r.status for r in results] == ["completed"] * 6
    assert results[4].reply == "You have 1 note(s)." and results[5].reply == "1024 and 2048."
    for sandboxed in (True, False):
        result = await replayer(sandboxed=sandboxed).replay_workflow(history)
        assert result.replay_failure is None


async def test_every_run_of_a_session_that_continued_as_new_replays(run_worker, session_id, temporal_client: Client):
    config = SessionConfig(max_updates_per_run=2)
    async with run_worker(SCRIPT, config=config) as hermes:
        await hermes.send_message(session_id, "hi", user_id="bob")
        first_run_id = (await temporal_client.get_workflow_handle(session_id).describe()).run_id
        await hermes.send_message(session_id, "what time is it?", user_id="bob")
        await hermes.send_message(session_id, "what are 2 ** 10 and 2 ** 11?", user_id="bob")
        await hermes.send_message(session_id, "list my notes", user_id="bob")
        await hermes.close(session_id)
        final = await temporal_client.get_workflow_handle(session_id, result_type=SessionState).result(
            rpc_timeout=timedelta(seconds=30)
        )
        assert final.turn_count == 4 and final.status == "closed"

        histories = await run_histories(temporal_client, session_id, first_run_id)
    assert len(histories) == final.run_index + 1 >= 2
    for history in histories:
        result = await replayer().replay_workflow(history)
        assert result.replay_failure is None
