"""Human approval of `write` tool calls, end to end on a real Temporal server and Redis.

The built-in ``save_note`` tool (permission ``write``, not idempotent) is the tool under
approval: its side effect is a row in the durable store's notes table (LanceDB, this test's
``HERMES_MEMORY_URI``), so "it ran" and "it ran once" are read from there, not inferred
from the reply.

Expiry uses the time-skipping test server (``temporal-test-server``): the approval waits
600 s of workflow time, and the test skips that time instead of sleeping. That server
supports updates and update-with-start (checked: both work, and ``env.sleep`` releases
an update that waits on a workflow timer); it has no ``ListSearchAttributes``, so the
search attributes are registered with ``AddSearchAttributes`` directly.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Awaitable, Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import WorkflowExecutionStatus

from hermes import names
from hermes.client import HermesClient
from hermes.infra.durable import NOTES, DurableStore
from hermes.errors import SessionClosedError
from hermes.models import SessionConfig, SessionState, ToolResultCode
from hermes.providers.scripted import ScriptedModel
from hermes.settings import Settings
from hermes.tools.builtin import register_builtins
from hermes.tools.registry import ToolRegistry
from worker import build_worker
from tests.support import eventually


NOTE_SCRIPT: dict[str, Any] = {
    "turns": [
        {
            "match": "(?i)note",
            "steps": [
                {"tool_calls": [{"name": "save_note", "arguments": {"title": "Shopping", "text": "milk, 豆腐, 🍞"}}]},
                # The model's next step renders what it was given: proof that it saw the result.
                {"reply": "code={{ last_tool_result.code }} message={{ last_tool_result.message }}"},
            ],
        }
    ]
}

NOTE_ARGUMENTS = {"title": "Shopping", "text": "milk, 豆腐, 🍞"}




@pytest.fixture
def user_id() -> str:
    return f"user-{uuid.uuid4()}"


@pytest.fixture
def saved_notes(user_id: str, _memory_store_per_test: Path) -> Callable[[], Awaitable[list[dict[str, Any]]]]:
    """The user's saved notes, oldest first, as the workers' durable store holds them
    (at this test's ``HERMES_MEMORY_URI``)."""
    store = DurableStore(_memory_store_per_test)

    async def read() -> list[dict[str, Any]]:
        return [json.loads(r.value) for r in await store.list(NOTES, owner=user_id)]

    return read


async def decisions_for(hermes: HermesClient, session_id: str, tool_call_id: str, count: int) -> list[Any]:
    async def probe() -> list[Any]:
        state = await hermes.get_state(session_id)
        found = [d for d in state.decisions if d.tool_call_id == tool_call_id]
        return found if len(found) >= count else []

    return await eventually(probe)


# --------------------------------------------------------------- decisions


@pytest.mark.parametrize("max_cached_workflows", [1000, 0], ids=["cached", "replayed"])
async def test_an_approved_write_tool_call_runs_exactly_once_and_records_the_approver(
    run_worker, session_id, user_id, saved_notes, redis, turns, max_cached_workflows
):
    # With no workflow cache every workflow task replays the history: the approval wait,
    # the decision and the tool call must replay deterministically.
    async with run_worker(NOTE_SCRIPT, max_cached_workflows=max_cached_workflows) as hermes:
        turn = turns(hermes.send_message(session_id, "Please note my shopping list", user_id=user_id))
        pending = await hermes.wait_for_approval(session_id, timeout_seconds=20)
        assert not turn.done()
        assert len(await saved_notes()) == 0, "a write tool ran before it was approved"

        await hermes.approve(session_id, pending.tool_call_id, approver=user_id, reason="fine by me")
        result = await asyncio.wait_for(turn, 30)

        state = await hermes.get_state(session_id)

    assert result.status == "completed"
    assert len(result.tool_calls) == 1
    record = result.tool_calls[0]
    assert record.tool_call_id == pending.tool_call_id
    assert record.name == "save_note"
    assert record.approval == "approved"
    assert record.approver == user_id
    assert record.result.code == ToolResultCode.OK
    assert result.reply == "code=0 message=note saved"

    notes = await saved_notes()
    assert len(notes) == 1
    # The idempotency key: session id, session chain (first run id), turn, tool-call id.
    key = notes[0]["note_id"]
    assert key.startswith(f"{session_id}:") and key.endswith(f":1:{pending.tool_call_id}")
    assert len(key.split(":")) == 4
    assert (notes[0]["title"], notes[0]["text"]) == (NOTE_ARGUMENTS["title"], NOTE_ARGUMENTS["text"])

    [decision] = [d for d in state.decisions if d.tool_call_id == pending.tool_call_id]
    assert (decision.approved, decision.approver, decision.reason, decision.outcome) == (True, user_id, "fine by me", "applied")


async def test_a_rejected_write_tool_call_is_not_run_and_the_model_sees_the_denial(
    run_worker, session_id, user_id, saved_notes, redis, turns
):
    async with run_worker(NOTE_SCRIPT) as hermes:
        turn = turns(hermes.send_message(session_id, "note this down", user_id=user_id))
        pending = await hermes.wait_for_approval(session_id, timeout_seconds=20)
        await hermes.reject(session_id, pending.tool_call_id, approver=user_id, reason="not today")
        result = await asyncio.wait_for(turn, 30)
        transcript = await hermes.get_transcript(session_id)

    record = result.tool_calls[0]
    assert record.approval == "rejected"
    assert record.approver == user_id
    assert record.result.code == ToolResultCode.DENIED_BY_HUMAN
    assert "rejected" in record.result.message and "not today" in record.result.message
    assert len(await saved_notes()) == 0, "a rejected tool call ran"

    # The model's next step was given the denial (the scripted reply renders the tool result).
    assert result.status == "completed"
    assert result.reply.startswith("code=5 message=the user rejected this tool call: not today")
    tool_messages = [m for m in transcript if m.role == "tool"]
    assert [m.tool_call_id for m in tool_messages] == [pending.tool_call_id]
    assert json.loads(tool_messages[0].content or "{}")["code"] == ToolResultCode.DENIED_BY_HUMAN


async def test_approving_an_unknown_tool_call_id_changes_nothing_and_is_audited(
    run_worker, session_id, user_id, saved_notes, redis, turns
):
    async with run_worker(NOTE_SCRIPT) as hermes:
        turn = turns(hermes.send_message(session_id, "note it", user_id=user_id))
        pending = await hermes.wait_for_approval(session_id, timeout_seconds=20)

        await hermes.approve(session_id, "call_that_does_not_exist", approver="mallory")
        [decision] = await decisions_for(hermes, session_id, "call_that_does_not_exist", 1)
        assert decision.outcome == "unknown_tool_call"
        assert decision.approver == "mallory"

        # No effect: the real call still waits, and nothing ran.
        still = await hermes.get_pending_approvals(session_id)
        assert [p.tool_call_id for p in still] == [pending.tool_call_id]
        assert not turn.done()
        assert len(await saved_notes()) == 0

        await hermes.reject(session_id, pending.tool_call_id, approver=user_id)
        result = await asyncio.wait_for(turn, 30)

    assert result.tool_calls[0].approval == "rejected"
    assert len(await saved_notes()) == 0


async def test_a_second_approval_of_the_same_call_has_no_effect(run_worker, session_id, user_id, saved_notes, redis, turns):
    async with run_worker(NOTE_SCRIPT) as hermes:
        turn = turns(hermes.send_message(session_id, "note it", user_id=user_id))
        pending = await hermes.wait_for_approval(session_id, timeout_seconds=20)
        tcid = pending.tool_call_id

        await hermes.approve(session_id, tcid, approver=user_id)
        await hermes.approve(session_id, tcid, approver="second")  # while the first is being applied
        result = await asyncio.wait_for(turn, 30)
        await hermes.approve(session_id, tcid, approver="third")  # after the call has run
        await hermes.reject(session_id, tcid, approver="fourth")  # a late change of mind
        decisions = await decisions_for(hermes, session_id, tcid, 4)

    assert result.tool_calls[0].approval == "approved"
    assert result.tool_calls[0].approver == user_id
    assert [(d.approver, d.outcome) for d in decisions] == [
        (user_id, "applied"),
        ("second", "already_decided"),
        ("third", "already_decided"),
        ("fourth", "already_decided"),
    ]
    assert len(await saved_notes()) == 1, "the note must be saved exactly once"


# ------------------------------------------------------- visibility of pending


async def test_pending_approvals_list_the_call_while_waiting_and_are_empty_after(
    run_worker, session_id, user_id, turns
):
    config = SessionConfig(approval_timeout_seconds=300)
    async with run_worker(NOTE_SCRIPT, config=config) as hermes:
        turn = turns(hermes.send_message(session_id, "note it", user_id=user_id))
        await hermes.wait_for_approval(session_id, timeout_seconds=20)
        [pending] = await hermes.get_pending_approvals(session_id)
        state = await hermes.get_state(session_id)

        assert pending.tool_name == "save_note"
        assert pending.arguments == NOTE_ARGUMENTS
        assert pending.permission == "write"
        assert pending.turn == 1
        assert pending.expires_at - pending.requested_at == timedelta(seconds=300)
        assert pending.expires_at.tzinfo is not None
        assert [p.tool_call_id for p in state.pending_approvals] == [pending.tool_call_id]
        assert state.busy

        await hermes.approve(session_id, pending.tool_call_id, approver=user_id)
        await asyncio.wait_for(turn, 30)

        assert await hermes.get_pending_approvals(session_id) == []
        after = await hermes.get_state(session_id)
        assert after.pending_approvals == [] and not after.busy


async def test_the_pending_approvals_search_attribute_is_1_while_waiting_and_0_after(
    run_worker, session_id, user_id, turns
):
    async with run_worker(NOTE_SCRIPT) as hermes:
        turn = turns(hermes.send_message(session_id, "note it", user_id=user_id))
        pending = await hermes.wait_for_approval(session_id, timeout_seconds=20)
        handle = hermes.handle(session_id)

        async def pending_count() -> int | None:
            description = await handle.describe()
            return description.typed_search_attributes.get(names.SA_PENDING_APPROVALS)

        async def is_value(expected: int) -> bool:
            return await pending_count() == expected

        await eventually(lambda: is_value(1))
        description = await handle.describe()
        assert description.typed_search_attributes.get(names.SA_USER_ID) == user_id

        await hermes.approve(session_id, pending.tool_call_id, approver=user_id)
        await asyncio.wait_for(turn, 30)
        await eventually(lambda: is_value(0))


async def test_closing_the_session_denies_a_pending_approval(run_worker, session_id, user_id, saved_notes, redis, turns):
    async with run_worker(NOTE_SCRIPT) as hermes:
        turn = turns(hermes.send_message(session_id, "note it", user_id=user_id))
        pending = await hermes.wait_for_approval(session_id, timeout_seconds=20)

        await hermes.close(session_id)
        result = await asyncio.wait_for(turn, 30)
        final = await asyncio.wait_for(
            hermes.client.get_workflow_handle(session_id, result_type=SessionState).result(), 30
        )
        description = await hermes.handle(session_id).describe()
        with pytest.raises(SessionClosedError):
            await hermes.send_message(session_id, "note something else", user_id=user_id)

    record = result.tool_calls[0]
    assert record.tool_call_id == pending.tool_call_id
    assert record.approval == "cancelled"
    assert record.approver is None
    assert record.result.code == ToolResultCode.DENIED_BY_HUMAN
    assert "closed" in record.result.message
    # The close also stops the turn: no further model step runs after it.
    assert result.status == "closed" and "closed" in result.reply
    assert len(await saved_notes()) == 0
    assert final.status == "closed" and final.pending_approvals == []
    assert description.status == WorkflowExecutionStatus.COMPLETED
    assert description.typed_search_attributes.get(names.SA_PENDING_APPROVALS) == 0


# ------------------------------------------------------------------ expiry


async def test_an_unapproved_tool_call_is_denied_after_expiry_and_not_run(
    time_skipping_env, redis_url, redis, task_queue, session_id, user_id, saved_notes, turns
):
    env = time_skipping_env
    settings = Settings(redis_url=redis_url, task_queue=task_queue, temporal_address="unused:0")
    worker = build_worker(
        env.client,
        settings,
        provider=ScriptedModel.from_dict(NOTE_SCRIPT),
        registry=register_builtins(ToolRegistry()),
        redis=redis,
    )
    config = SessionConfig(approval_timeout_seconds=600)
    async with worker:
        hermes = HermesClient(env.client, task_queue=task_queue, redis=redis, config=config)
        turn = turns(hermes.send_message(session_id, "note it", user_id=user_id))
        pending = await hermes.wait_for_approval(session_id, timeout_seconds=20)
        assert pending.expires_at - pending.requested_at == timedelta(seconds=600)
        assert not turn.done()

        await env.sleep(601)  # skipped, not slept: the test server jumps its clock
        result = await asyncio.wait_for(turn, 30)
        trace = await hermes.get_trace(session_id)
        pending_after = await hermes.get_pending_approvals(session_id)

    record = result.tool_calls[0]
    assert record.approval == "expired"
    assert record.approver is None
    assert record.result.code == ToolResultCode.DENIED_BY_HUMAN
    assert "in time" in record.result.message and "not run" in record.result.message
    assert result.reply.startswith("code=5 message=nobody approved this tool call in time")
    assert len(await saved_notes()) == 0, "an expired tool call ran"
    assert pending_after == []
    [approval_step] = [s for s in trace if s.action_type == "approval"]
    assert approval_step.status == "expired"
    assert approval_step.latency_ms >= 600_000  # the workflow really waited 600 s of its time
