"""A session's runs get a 30 s workflow task timeout, the first and every one after a
continue-as-new (issue 12: at Temporal's 10 s a CPU-starved worker's tasks timed out again
and again, and the server held each next attempt back for minutes)."""

from __future__ import annotations

from temporalio.api.enums.v1 import EventType

from hermes import names
from hermes.models import SessionConfig

SCRIPT = {"turns": [{"steps": [{"reply": "ok"}]}] * 5}


async def test_every_run_of_a_session_has_the_sessions_workflow_task_timeout(run_worker, session_id, temporal_client):
    async with run_worker(SCRIPT) as hermes:
        config = SessionConfig(max_updates_per_run=2)
        for n in range(5):
            assert (await hermes.send_message(session_id, f"message {n}", config=config)).reply == "ok"
        assert (await hermes.get_state(session_id)).run_index >= 1  # it continued as new
    handle = temporal_client.get_workflow_handle(session_id)
    latest = await handle.describe()
    timeout = latest.raw_description.execution_config.default_workflow_task_timeout
    assert timeout.ToTimedelta().total_seconds() == names.SESSION_WORKFLOW_TASK_TIMEOUT_SECONDS == 30.0
    first_run_id = latest.raw_description.workflow_execution_info.first_run_id
    first = await temporal_client.get_workflow_handle(session_id, run_id=first_run_id).fetch_history()
    (started,) = [e for e in first.events if e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED]
    attributes = started.workflow_execution_started_event_attributes
    assert attributes.workflow_task_timeout.ToTimedelta().total_seconds() == 30.0
    assert first_run_id != latest.run_id
