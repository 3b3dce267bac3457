"""A session stuck on an update accepted out of replay order is found and mended (issue 31).

``tests/histories/poisoned/overload_stuck_session.json`` is the history of the session that
``bench/overload.py`` left stuck: its workflow task failed again and again, first with
"received *update.Acceptance message while in state Accepted". It is kept out of
``tests/histories/*.json`` on purpose: no workflow code replays it (see
:mod:`hermes.sessions.repair` for how it came about).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from temporalio import workflow
from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer

from hermes import names
from hermes.models import SessionInput, SessionState
from hermes.sessions.repair import ResetPoint, find_update_order_split, repair_session
from tests.histories.record import HISTORY_PATH
from tests.test_session import EchoModel
from workflows.session import SessionWorkflow

STUCK_PATH = Path(__file__).parent / "histories" / "poisoned" / "overload_stuck_session.json"


@workflow.defn(name=names.SESSION_WORKFLOW, sandboxed=False)
class SessionWorkflowTrustingItsStart(SessionWorkflow):
    """The session workflow; the start proof of the recorded run was signed by the bench's
    command key, which this repository does not hold, so it is taken as valid."""

    @workflow.init
    def __init__(self, inp: SessionInput) -> None:
        super().__init__(inp)
        self._start_refused = None

    @workflow.run
    async def run(self, inp: SessionInput) -> SessionState:
        return await super().run(inp)


def stuck_history() -> WorkflowHistory:
    return WorkflowHistory.from_json("overload-s-11-a3d979", STUCK_PATH.read_text(encoding="utf-8"))


def test_the_stuck_history_accepted_the_second_message_after_the_restarted_model_call_in_one_task():
    events = {e.event_id: EventType.Name(e.event_type).removeprefix("EVENT_TYPE_") for e in stuck_history().events}
    assert [events[i] for i in (48, 49, 50)] == [
        "WORKFLOW_TASK_COMPLETED", "ACTIVITY_TASK_SCHEDULED", "WORKFLOW_EXECUTION_UPDATE_ACCEPTED",
    ]
    assert events[55] == "WORKFLOW_TASK_FAILED"


@pytest.mark.timeout(120)
async def test_the_stuck_history_does_not_replay_where_the_update_was_accepted():
    replayer = Replayer(workflows=[SessionWorkflowTrustingItsStart], data_converter=pydantic_data_converter)
    result = await replayer.replay_workflow(stuck_history(), raise_on_replay_failure=False)
    assert result.replay_failure is not None
    assert "Update machine does not handle this event: HistoryEvent(id: 49, ActivityTaskScheduled)" in str(result.replay_failure)


@pytest.mark.timeout(120)
async def test_the_stuck_history_is_mended_by_a_reset_to_the_task_that_started_the_model_call_again():
    point = await find_update_order_split(stuck_history(), [SessionWorkflowTrustingItsStart])
    assert point is not None
    assert (point.workflow_task_completed_event_id, point.failing_event_id) == (48, 49)


@pytest.mark.timeout(120)
async def test_a_history_that_replays_has_no_reset_point():
    history = WorkflowHistory.from_json("session-recorded", HISTORY_PATH.read_text(encoding="utf-8"))
    assert await find_update_order_split(history, [SessionWorkflow]) is None


@pytest.mark.timeout(180)
async def test_repair_leaves_a_healthy_session_alone(run_worker, session_id, temporal_client):
    async with run_worker(EchoModel()) as hermes:
        await hermes.send_message(session_id, "hello", client_message_id="m-1")
        result = await repair_session(temporal_client, session_id, [SessionWorkflow])
        assert not result.reset and result.new_run_id is None
        assert (await hermes.get_state(session_id)).turn_count == 1


@pytest.mark.timeout(240)
async def test_a_reset_session_takes_its_later_message_again_and_answers_its_resend_once(
    run_worker, session_id, temporal_client
):
    model = EchoModel()
    async with run_worker(model) as hermes:
        await hermes.send_message(session_id, "one", client_message_id="m-1")
        await hermes.send_message(session_id, "two", client_message_id="m-2")
        old = await hermes.handle(session_id).fetch_history()
        # The task that accepted the second message stands for a task whose commands do not
        # replay: the repair resets to it, as it would to event 48 of the stuck history.
        accepted = [e.event_id for e in old.events if e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED]
        task = max(e.event_id for e in old.events
                   if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED and e.event_id < accepted[1])

        async def poisoned_at_the_second_message(history, workflows, *, data_converter):
            return ResetPoint(workflow_task_completed_event_id=task, failing_event_id=task + 1, replay_error="test")

        result = await repair_session(temporal_client, session_id, [SessionWorkflow], find=poisoned_at_the_second_message)
        assert result.reset and result.new_run_id

        again = await hermes.send_message(session_id, "two", client_message_id="m-2")
        assert again.reply.endswith("two") and again.turn == 2
        state = await hermes.get_state(session_id)
        assert state.turn_count == 2
        new = await temporal_client.get_workflow_handle(session_id, run_id=result.new_run_id).fetch_history()
        assert any(e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ADMITTED for e in new.events)
        replayed = await Replayer(workflows=[SessionWorkflow], data_converter=pydantic_data_converter).replay_workflow(
            new, raise_on_replay_failure=False
        )
        assert replayed.replay_failure is None
