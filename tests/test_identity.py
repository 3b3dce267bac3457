"""Identities held by the session workflow itself (issue 16): a session takes messages
only from its own user, and a ``write`` call is confirmed only by that user or a listed
approver. Against the real Temporal dev server and Redis of the fixtures, so the Python
client and the CLI (tests/test_cli.py) are held to the same rule.

The refusals came with the ``session-identity`` patch; a run recorded before it, in which
another user's message was taken and another user confirmed a write call, still replays
(``tests/histories/session_foreign_user_and_approver.json``).
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest
from temporalio.client import WorkflowExecutionStatus, WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter

from hermes.client import HermesClient
from hermes.errors import SessionForbiddenError
from hermes.models import ApprovalPolicy, SessionConfig, SessionState, ToolResultCode
from tests.histories.record_identity import FOREIGN_HISTORY_PATH, OTHER_USER
from tests.support import eventually
from tests.test_replay import replayer
from workflows.session import patches

SCRIPT: dict[str, Any] = {
    "turns": [
        {
            "match": "(?i)note",
            "steps": [
                {"tool_calls": [{"name": "save_note", "arguments": {"title": "Shopping", "text": "milk"}}]},
                {"reply": "code={{ last_tool_result.code }}"},
            ],
        },
        {"match": "(?i)second", "steps": [{"reply": "Second reply."}]},
        {"match": "(?i)third", "steps": [{"reply": "Third reply."}]},
        {"steps": [{"reply": "Hello!"}]},
    ]
}


@pytest.fixture
def user_id() -> str:
    return f"alice-{uuid.uuid4().hex[:8]}"


async def decisions_for(hermes: HermesClient, session_id: str, tool_call_id: str, count: int) -> list[Any]:
    async def probe() -> list[Any]:
        found = [d for d in (await hermes.get_state(session_id)).decisions if d.tool_call_id == tool_call_id]
        return found if len(found) >= count else []

    return await eventually(probe)


# ------------------------------------------------------------------ messages


async def test_a_message_from_another_user_is_refused_not_recorded_and_the_session_stays_usable(
    run_worker, session_id, user_id
):
    async with run_worker(SCRIPT) as hermes:
        first = await hermes.send_message(session_id, "hi", user_id=user_id, client_message_id="m-1")
        before = await hermes.get_transcript(session_id)

        with pytest.raises(SessionForbiddenError) as refused:
            await hermes.send_message(session_id, "second: let me in", user_id="someone-else")
        assert (refused.value.session_id, refused.value.user_id) == (session_id, "someone-else")
        assert "someone-else" in str(refused.value) and "not taken" in str(refused.value)
        # Nor does a resend of the owner's message id hand the other user its reply.
        with pytest.raises(SessionForbiddenError):
            await hermes.send_message(session_id, "hi", user_id="someone-else", client_message_id="m-1")

        state = await hermes.get_state(session_id)
        assert state.turn_count == 1 and state.user_id == user_id
        assert await hermes.get_transcript(session_id) == before
        assert not any("let me in" in (m.content or "") for m in before)

        # The owner's resend of the same id still returns the first reply, no second turn...
        again = await hermes.send_message(session_id, "hi", user_id=user_id, client_message_id="m-1")
        assert (again.turn, again.reply) == (first.turn, first.reply)
        # ...and the session goes on.
        third = await hermes.send_message(session_id, "third", user_id=user_id)
        assert (third.turn, third.reply) == (2, "Third reply.")


async def test_an_archived_session_is_not_started_again_for_another_user(run_worker, session_id, user_id):
    config = SessionConfig(idle_after_seconds=1, archive_after_seconds=2)
    async with run_worker(SCRIPT, config=config) as hermes:
        await hermes.send_message(session_id, "hi", user_id=user_id)

        async def archived() -> bool:
            return (await hermes.handle(session_id).describe()).status == WorkflowExecutionStatus.COMPLETED

        await eventually(archived, what="the session archiving itself")
        run_id = (await hermes.handle(session_id).describe()).run_id
        with pytest.raises(SessionForbiddenError, match="not started again"):
            await hermes.send_message(session_id, "second: it is mine now", user_id="someone-else")
        assert (await hermes.handle(session_id).describe()).run_id == run_id, "a run was started for another user"

        resumed = await hermes.send_message(session_id, "third", user_id=user_id)
        state = await hermes.get_state(session_id)
    assert (resumed.turn, resumed.reply) == (2, "Third reply.")
    assert state.user_id == user_id


# ------------------------------------------------------------------ approvals


async def test_a_write_call_confirmed_by_anyone_else_is_refused_audited_and_stays_pending(
    run_worker, session_id, user_id, turns
):
    async with run_worker(SCRIPT) as hermes:
        turn = turns(hermes.send_message(session_id, "note my shopping", user_id=user_id))
        pending = await hermes.wait_for_approval(session_id, timeout_seconds=20)
        assert (pending.permission, pending.action, pending.approvers) == ("write", "confirm", [])

        await hermes.approve(session_id, pending.tool_call_id, approver="anyone")
        [refused] = await decisions_for(hermes, session_id, pending.tool_call_id, 1)
        assert (refused.approver, refused.outcome) == ("anyone", "not_allowed")
        assert user_id in refused.detail

        async def audited() -> list[Any]:
            entries = await hermes.get_approval_audit(session_id=session_id)
            return [e for e in entries if e.event == "decision"]

        [entry] = await eventually(audited)
        assert (entry.approver, entry.outcome, entry.tool_call_id) == ("anyone", "not_allowed", pending.tool_call_id)

        # Still pending, nothing ran; the session's user confirms it.
        assert [p.tool_call_id for p in await hermes.get_pending_approvals(session_id)] == [pending.tool_call_id]
        assert not turn.done()
        await hermes.approve(session_id, pending.tool_call_id, approver=user_id)
        result = await asyncio.wait_for(turn, 30)

    [record] = result.tool_calls
    assert (record.approval, record.approver, record.result.code) == ("approved", user_id, ToolResultCode.OK)


async def test_a_listed_approver_may_confirm_a_write_call_and_others_may_not(run_worker, session_id, user_id, turns):
    config = SessionConfig(approval_policies={"write": ApprovalPolicy(action="confirm", approvers=["lead"])})
    async with run_worker(SCRIPT, config=config) as hermes:
        turn = turns(hermes.send_message(session_id, "note my shopping", user_id=user_id))
        pending = await hermes.wait_for_approval(session_id, timeout_seconds=20)
        assert pending.may_decide("lead") is None and pending.may_decide(user_id) is None
        assert pending.may_decide("bob") is not None

        await hermes.reject(session_id, pending.tool_call_id, approver="bob")
        await hermes.approve(session_id, pending.tool_call_id, approver="lead")
        result = await asyncio.wait_for(turn, 30)
        decisions = await decisions_for(hermes, session_id, pending.tool_call_id, 2)

    assert [(d.approver, d.outcome) for d in decisions] == [("bob", "not_allowed"), ("lead", "applied")]
    assert (result.tool_calls[0].approval, result.tool_calls[0].approver) == ("approved", "lead")


# ------------------------------------------------------------------ replay


def test_the_identity_patch_comes_just_before_command_auth():
    at = patches.ALL.index(patches.IDENTITY)  # later patches come after both
    assert patches.ALL[at:at + 2] == (patches.IDENTITY, patches.COMMAND_AUTH) == ("session-identity", "command-auth")


async def test_a_run_recorded_before_the_patch_replays_as_it_ran():
    """Recorded before ``session-identity`` (tests/histories/record_identity.py): the other
    user's message was taken and their confirmation applied; replayed without the patch,
    the session decides the same and emits the same commands."""
    history = WorkflowHistory.from_json("foreign", FOREIGN_HISTORY_PATH.read_text(encoding="utf-8"))
    payloads = FOREIGN_HISTORY_PATH.read_text(encoding="utf-8")
    assert patches.IDENTITY not in payloads
    accepted = [e for e in history.events if e.HasField("workflow_execution_update_accepted_event_attributes")]
    assert len(accepted) == 3
    [end] = [e for e in history.events if e.HasField("workflow_execution_completed_event_attributes")]
    [final] = pydantic_data_converter.payload_converter.from_payloads(
        end.workflow_execution_completed_event_attributes.result.payloads, [SessionState]
    )
    assert final.user_id == "alice" and final.turn_count == 3
    assert [(d.approver, d.outcome) for d in final.decisions] == [(OTHER_USER, "applied")]
    for sandboxed in (True, False):
        result = await replayer(sandboxed=sandboxed).replay_workflow(history)
        assert result.replay_failure is None
