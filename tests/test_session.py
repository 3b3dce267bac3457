"""SessionWorkflow end to end: a real Temporal dev server, a real Redis, a real worker.

Only the LLM is a stand-in: a :class:`ScriptedModel` script, or :class:`EchoModel`
below, which answers every user message with ``echo: <text>`` and records what it was
asked (system prompt, how many calls ran at once). Waits are bounded polls of a
condition, never fixed sleeps.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Callable
from typing import Any

import pytest
import redis.asyncio as aioredis
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowUpdateFailedError
from temporalio.exceptions import ApplicationError

from hermes import names
from hermes.client import HermesClient, message_update_id
from hermes.errors import MessageRejectedError, SessionClosedError
from hermes.models import (
    CallModelInput,
    CallModelResult,
    Message,
    SendMessageInput,
    SessionConfig,
    SessionState,
    ToolResult,
    ToolResultCode,
    TurnResult,
    Usage,
)
from hermes.infra.stack import free_port
from hermes.content.tokens import count_message_tokens, count_text_tokens
from hermes.tools.builtin import register_builtins
from hermes.tools.registry import ToolRegistry
from worker import build_worker
from tests.support import eventually, signed



# ---------------------------------------------------------------- helpers




class EchoModel:
    """An LLM stand-in that echoes the last user message.

    Args:
        delay_seconds: simulated model latency per call.

    Messages containing ``"slow"`` block until :attr:`release` is set, so a test can
    act (cancel, close) while a model call is in flight.
    """

    name = "echo"

    def __init__(self, *, delay_seconds: float = 0.0):
        self.delay_seconds = delay_seconds
        self.calls = 0
        self.active = 0
        self.max_active = 0
        self.system_prompts: list[str | None] = []
        self.slow_started = asyncio.Event()
        self.release = asyncio.Event()

    async def complete(self, request: CallModelInput) -> CallModelResult:
        self.calls += 1
        first = request.messages[0]
        self.system_prompts.append(first.content if first.role == "system" else None)
        text = next(m.content for m in reversed(request.messages) if m.role == "user") or ""
        self.active += 1
        self.max_active = max(self.max_active, self.active)
        try:
            if self.delay_seconds:
                await asyncio.sleep(self.delay_seconds)
            if "slow" in text:
                self.slow_started.set()
                await asyncio.wait_for(self.release.wait(), 30)
        finally:
            self.active -= 1
        reply = f"echo: {text}"
        return CallModelResult(
            message=Message(role="assistant", content=reply),
            usage=Usage(
                prompt_tokens=count_message_tokens(request.messages), completion_tokens=count_text_tokens(reply)
            ),
            provider=self.name,
            model="echo-1",
        )


def assert_turns_never_interleave(transcript: list[Message]) -> None:
    """Every user message is followed by its own turn's messages only, ending in a final
    assistant reply (no tool calls), before the next user message; turns go 1, 2, 3, ..."""
    expected_turn = 0
    for i, m in enumerate(transcript):
        if m.role == "user":
            if i > 0:
                previous = transcript[i - 1]
                final = previous.role == "assistant" and not previous.tool_calls
                assert final, f"turn {expected_turn} has no final reply"
            expected_turn += 1
            assert m.turn == expected_turn, f"message {i} belongs to turn {m.turn}, expected {expected_turn}"
            nxt = transcript[i + 1] if i + 1 < len(transcript) else None
            assert nxt is not None and nxt.role == "assistant", f"user message {i} is not answered next"
        else:
            assert m.turn == expected_turn, f"message {i} ({m.role}) of turn {m.turn} inside turn {expected_turn}"
    assert transcript and transcript[-1].role == "assistant" and not transcript[-1].tool_calls


def echo_pairs(transcript: list[Message]) -> list[tuple[str, str]]:
    return [
        (transcript[i].content or "", transcript[i + 1].content or "")
        for i in range(0, len(transcript), 2)
    ]


async def accepted_update_ids(client: Client, session_id: str) -> list[str]:
    """Update ids of the session's current run, in the order the workflow accepted them."""
    history = await client.get_workflow_handle(session_id).fetch_history()
    return [
        event.workflow_execution_update_accepted_event_attributes.accepted_request.meta.update_id
        for event in history.events
        if event.HasField("workflow_execution_update_accepted_event_attributes")
    ]


async def _state_if(hermes: Any, session_id: str, predicate: Callable[[SessionState], bool]) -> SessionState | None:
    """The session's state if ``predicate`` holds for it, else None (for :func:`eventually`)."""
    state = await hermes.get_state(session_id)
    return state if predicate(state) else None


def tool_message_results(transcript: list[Message]) -> list[ToolResult]:
    return [ToolResult.model_validate_json(m.content or "") for m in transcript if m.role == "tool"]


# ------------------------------------------------------------ conversation

CONVERSATION = {
    "turns": [
        {"match": "(?i)time", "steps": [
            {"tool_calls": [{"name": "current_time", "arguments": {"timezone": "Asia/Shanghai"}}]},
            {"reply": "It is {{ last_tool_result.data.time }} in Shanghai."},
        ]},
        {"match": r"\d+ \* \d+", "steps": [
            {"tool_calls": [{"name": "calculate", "arguments": {"expression": "6 * 7"}}]},
            {"reply": "6 * 7 = {{ last_tool_result.data.value }}."},
        ]},
        {"steps": [{"reply": "Hello! How can I help?"}]},
        {"steps": [{"reply": "You're welcome."}]},
    ]
}


@pytest.mark.parametrize("max_cached_workflows", [1000, 0], ids=["cached", "replaying_every_task"])
async def test_a_multi_turn_conversation_keeps_replies_transcript_state_and_trace_in_order(
    run_worker, session_id, max_cached_workflows
):
    async with run_worker(CONVERSATION, max_cached_workflows=max_cached_workflows, memory_ready=True) as hermes:
        texts = ["hi", "what time is it in Shanghai?", "what is 6 * 7?", "thanks"]
        results = [await hermes.send_message(session_id, t, user_id="alice", channel="web") for t in texts]

        assert results[0].reply == "Hello! How can I help?"
        assert results[1].reply.startswith("It is ") and results[1].reply.endswith(" in Shanghai.")
        assert "not available" not in results[1].reply
        assert results[2].reply == "6 * 7 = 42."
        assert results[3].reply == "You're welcome."
        assert [r.turn for r in results] == [1, 2, 3, 4]
        assert [[c.name for c in r.tool_calls] for r in results] == [[], ["current_time"], ["calculate"], []]
        assert all(c.result.code == ToolResultCode.OK for r in results for c in r.tool_calls)

        transcript = await hermes.get_transcript(session_id)
        assert [m.role for m in transcript] == [
            "user", "assistant",
            "user", "assistant", "tool", "assistant",
            "user", "assistant", "tool", "assistant",
            "user", "assistant",
        ]
        assert [m.content for m in transcript if m.role == "user"] == texts
        assert_turns_never_interleave(transcript)
        for i, m in enumerate(transcript):
            if m.role == "tool":
                call_message = transcript[i - 1]
                assert call_message.role == "assistant" and len(call_message.tool_calls) == 1
                assert m.tool_call_id == call_message.tool_calls[0].tool_call_id
                assert m.name == call_message.tool_calls[0].name
        assert tool_message_results(transcript)[1].data == {"expression": "6 * 7", "value": 42}

        state = await hermes.get_state(session_id)
        assert state.turn_count == 4
        assert state.token_estimate > 0
        assert (state.user_id, state.channel, state.status) == ("alice", "web", "active")
        assert state.title == "hi"
        assert not state.busy and state.queued_messages == 0

        trace = await hermes.get_trace(session_id)
        assert [s.step for s in trace] == list(range(1, len(trace) + 1))
        assert [(s.turn, s.action_type, s.tool_name) for s in trace] == [
            (1, "model", None),
            (2, "model", None), (2, "tool", "current_time"), (2, "model", None),
            (3, "model", None), (3, "tool", "calculate"), (3, "model", None),
            (4, "model", None),
        ]
        assert all(s.status == "ok" and s.latency_ms > 0 for s in trace)
        assert all(s.provider == "scripted" and s.tokens > 0 for s in trace if s.action_type == "model")
        assert all(s.session_id == session_id for s in trace)


# ------------------------------------------------------------- resends


async def test_a_resend_with_the_same_client_message_id_returns_the_first_reply_and_runs_no_second_turn(
    run_worker, session_id
):
    model = EchoModel()
    async with run_worker(model) as hermes:
        first = await hermes.send_message(session_id, "book a table", client_message_id="m-1")
        transcript = await hermes.get_transcript(session_id)
        again = await hermes.send_message(session_id, "book a table", client_message_id="m-1")
        assert again == first
        assert again.client_message_id == "m-1"
        assert model.calls == 1
        assert (await hermes.get_state(session_id)).turn_count == 1
        assert await hermes.get_transcript(session_id) == transcript

        # A resend through a plain update with a fresh update id reaches the workflow's
        # own de-duplication (not only the server's per-update-id one).
        via_update = await hermes.handle(session_id).execute_update(
            names.SEND_MESSAGE,
            signed(names.SEND_MESSAGE, session_id, SendMessageInput(text="book a table", client_message_id="m-1")),
            id=f"other-{uuid.uuid4()}",
            result_type=TurnResult,
        )
        assert via_update == first
        assert model.calls == 1
        assert await hermes.get_transcript(session_id) == transcript


async def test_a_resend_while_the_first_is_still_running_waits_for_it_and_runs_no_second_turn(run_worker, session_id):
    model = EchoModel()
    async with run_worker(model) as hermes:
        try:
            first = asyncio.create_task(hermes.send_message(session_id, "a slow one", client_message_id="m-1"))
            await asyncio.wait_for(model.slow_started.wait(), 15)
            resends = [
                asyncio.create_task(hermes.send_message(session_id, "a slow one", client_message_id="m-1")),
                asyncio.create_task(
                    hermes.handle(session_id).execute_update(
                        names.SEND_MESSAGE,
                        signed(names.SEND_MESSAGE, session_id, SendMessageInput(text="a slow one", client_message_id="m-1")),
                        id=f"other-{uuid.uuid4()}",
                        result_type=TurnResult,
                    )
                ),
            ]
            await eventually(
                lambda: _state_if(hermes, session_id, lambda s: s.updates_this_run >= 2), what="the resend to arrive"
            )
        finally:
            model.release.set()
        results = await asyncio.wait_for(asyncio.gather(first, *resends), 15)
        assert results[0].reply == "echo: a slow one"
        assert results[1] == results[0] and results[2] == results[0]
        assert model.calls == 1
        assert (await hermes.get_state(session_id)).turn_count == 1
        assert len(await hermes.get_transcript(session_id)) == 2


async def test_a_resend_after_continue_as_new_returns_the_first_reply_and_runs_no_second_turn(run_worker, session_id):
    model = EchoModel()
    config = SessionConfig(max_updates_per_run=2)
    async with run_worker(model, config=config) as hermes:
        first = await hermes.send_message(session_id, "one", client_message_id="m-1")
        await hermes.send_message(session_id, "two", client_message_id="m-2")
        await hermes.send_message(session_id, "three", client_message_id="m-3")
        state = await eventually(
            lambda: _state_if(hermes, session_id, lambda s: s.run_index >= 1), what="a continue-as-new"
        )
        transcript = await hermes.get_transcript(session_id)
        calls = model.calls

        again = await hermes.send_message(session_id, "one", client_message_id="m-1")
        assert again == first
        assert model.calls == calls
        after = await hermes.get_state(session_id)
        assert after.turn_count == state.turn_count == 3
        assert await hermes.get_transcript(session_id) == transcript


# ---------------------------------------------------------- concurrency


async def test_concurrent_messages_run_one_at_a_time_in_arrival_order_without_interleaving(
    run_worker, session_id, temporal_client
):
    model = EchoModel(delay_seconds=0.1)
    async with run_worker(model) as hermes:
        texts = [f"message {i}" for i in range(5)]
        results = await asyncio.gather(
            *(hermes.send_message(session_id, t, client_message_id=f"c-{i}") for i, t in enumerate(texts))
        )
        for text, result in zip(texts, results):
            assert result.reply == f"echo: {text}"
        assert sorted(r.turn for r in results) == [1, 2, 3, 4, 5]
        assert model.max_active == 1, "two model calls of one session ran at the same time"

        transcript = await hermes.get_transcript(session_id)
        assert len(transcript) == 10
        assert_turns_never_interleave(transcript)
        assert all(reply == f"echo: {user}" for user, reply in echo_pairs(transcript))

        # Arrival order is the order in which the server handed the updates to the
        # workflow (their "accepted" events); turns must follow it.
        arrival = await accepted_update_ids(temporal_client, session_id)
        turn_of = {message_update_id("anonymous", f"c-{i}"): r.turn for i, r in enumerate(results)}
        assert sorted(arrival) == sorted(turn_of)
        assert [turn_of[cid] for cid in arrival] == [1, 2, 3, 4, 5]


async def test_more_messages_than_temporals_ten_in_flight_updates_are_all_answered_exactly_once(
    run_worker, session_id
):
    model = EchoModel(delay_seconds=0.2)
    async with run_worker(model, memory=False) as hermes:  # reads every model request: no memory extraction calls
        texts = [f"burst {i:02d}" for i in range(18)]
        results = await asyncio.gather(*(hermes.send_message(session_id, t) for t in texts))
        assert [r.reply for r in results] == [f"echo: {t}" for t in texts]
        assert sorted(r.turn for r in results) == list(range(1, 19))
        assert model.max_active == 1

        transcript = await hermes.get_transcript(session_id)
        users = [m.content for m in transcript if m.role == "user"]
        assert sorted(users) == texts  # every message, each exactly once
        assert len(transcript) == 36
        assert_turns_never_interleave(transcript)
        assert all(reply == f"echo: {user}" for user, reply in echo_pairs(transcript))
        assert (await hermes.get_state(session_id)).turn_count == 18


# ------------------------------------------------------- continue-as-new


async def test_continue_as_new_carries_the_transcript_and_system_prompt_and_loses_no_message(
    run_worker, session_id, temporal_client
):
    model = EchoModel(delay_seconds=0.05)
    prompt = "You are a terse assistant. Answer in one line."
    async with run_worker(model, config=SessionConfig(max_updates_per_run=3), memory=False) as hermes:  # reads every model request: no memory extraction calls
        replies = [await hermes.send_message(session_id, "s0", user_id="carol")]
        first_run_id = (await temporal_client.get_workflow_handle(session_id).describe()).run_id
        await hermes.set_system_prompt(session_id, prompt)
        replies += [await hermes.send_message(session_id, f"s{i}", user_id="carol") for i in range(1, 4)]
        replies += await asyncio.gather(*(hermes.send_message(session_id, f"c{i}", user_id="carol") for i in range(4)))
        replies += [await hermes.send_message(session_id, f"s{i}", user_id="carol") for i in range(4, 6)]

        assert len(replies) == 10
        sent = ["s0", "s1", "s2", "s3", "c0", "c1", "c2", "c3", "s4", "s5"]
        assert [r.reply for r in replies] == [f"echo: {t}" for t in sent]
        state = await hermes.get_state(session_id)
        assert state.run_index >= 2, state
        assert state.turn_count == 10
        assert (state.user_id, state.title, state.system_prompt) == ("carol", "s0", prompt)

        transcript = await hermes.get_transcript(session_id)
        users = [m.content for m in transcript if m.role == "user"]
        assert users[:4] == ["s0", "s1", "s2", "s3"]
        assert sorted(users[4:8]) == ["c0", "c1", "c2", "c3"]
        assert users[8:] == ["s4", "s5"]
        assert_turns_never_interleave(transcript)
        assert all(reply == f"echo: {user}" for user, reply in echo_pairs(transcript))

        # The prompt set by signal in the first run is the one every later call used.
        assert model.system_prompts[0] == SessionConfig().system_prompt
        assert model.system_prompts[1:] == [prompt] * 9

        description = await temporal_client.get_workflow_handle(session_id).describe()
        assert description.status == WorkflowExecutionStatus.RUNNING
        assert description.run_id != first_run_id
        first_run = await temporal_client.get_workflow_handle(session_id, run_id=first_run_id).describe()
        assert first_run.status == WorkflowExecutionStatus.CONTINUED_AS_NEW


# -------------------------------------------------------- max iterations

LOOPING = {
    "turns": [
        {"match": "loop", "steps": [
            {"tool_calls": [{"name": "calculate", "arguments": {"expression": f"{i} + 1"}}]} for i in range(3)
        ]},
        {"steps": [{"reply": "Back to normal."}]},
    ]
}


async def test_a_turn_that_keeps_calling_tools_stops_at_max_iterations_and_the_session_goes_on(run_worker, session_id):
    async with run_worker(LOOPING, config=SessionConfig(max_iterations=3)) as hermes:
        result = await hermes.send_message(session_id, "loop forever please")
        assert result.status == "max_iterations"
        assert "stopped after 3" in result.reply
        assert len(result.tool_calls) == 3 and all(c.result.ok for c in result.tool_calls)

        transcript = await hermes.get_transcript(session_id)
        assert [m.role for m in transcript] == ["user"] + ["assistant", "tool"] * 3 + ["assistant"]
        assert transcript[-1].content == result.reply

        after = await hermes.send_message(session_id, "hello again")
        assert (after.status, after.reply) == ("completed", "Back to normal.")
        assert (await hermes.get_state(session_id)).turn_count == 2


# --------------------------------------------------------------- signals


async def test_set_system_prompt_applies_from_the_next_model_call(run_worker, session_id):
    model = EchoModel()
    async with run_worker(model) as hermes:
        await hermes.send_message(session_id, "before")
        await hermes.set_system_prompt(session_id, "Always answer like a pirate.")
        await hermes.send_message(session_id, "after")
        assert model.system_prompts == [SessionConfig().system_prompt, "Always answer like a pirate."]
        assert (await hermes.get_state(session_id)).system_prompt == "Always answer like a pirate."


async def test_cancel_turn_during_a_slow_model_call_ends_the_turn_as_cancelled_and_the_next_message_works(
    run_worker, session_id
):
    model = EchoModel()
    async with run_worker(model) as hermes:
        try:
            turn = asyncio.create_task(hermes.send_message(session_id, "a slow question"))
            await asyncio.wait_for(model.slow_started.wait(), 15)
            await hermes.cancel_turn(session_id)
            result = await asyncio.wait_for(turn, 15)
        finally:
            model.release.set()
        assert result.status == "cancelled"
        assert result.reply == "This turn was cancelled."

        after = await hermes.send_message(session_id, "a quick one")
        assert (after.status, after.reply) == ("completed", "echo: a quick one")
        transcript = await hermes.get_transcript(session_id)
        assert [(m.role, m.content) for m in transcript] == [
            ("user", "a slow question"),
            ("assistant", "This turn was cancelled."),
            ("user", "a quick one"),
            ("assistant", "echo: a quick one"),
        ]
        trace = await hermes.get_trace(session_id)
        assert [(s.turn, s.action_type, s.status) for s in trace] == [(1, "model", "cancelled"), (2, "model", "ok")]


async def test_a_closed_session_refuses_messages_completes_and_still_answers_queries(
    run_worker, session_id, temporal_client
):
    async with run_worker(EchoModel()) as hermes:
        await hermes.send_message(session_id, "hello", user_id="dave")
        await hermes.close(session_id)
        handle = temporal_client.get_workflow_handle(session_id, result_type=SessionState)
        final = await asyncio.wait_for(handle.result(), 15)
        assert final.status == "closed"
        assert (await handle.describe()).status == WorkflowExecutionStatus.COMPLETED

        with pytest.raises(SessionClosedError):
            await hermes.send_message(session_id, "are you there?", user_id="dave")

        state = await hermes.get_state(session_id)  # a query on a completed workflow
        assert (state.status, state.turn_count, state.user_id) == ("closed", 1, "dave")
        assert [m.content for m in await hermes.get_transcript(session_id)] == ["hello", "echo: hello"]


async def test_messages_sent_while_a_session_is_closing_are_refused_as_closed(run_worker, session_id):
    model = EchoModel()
    async with run_worker(model) as hermes:
        try:
            slow = asyncio.create_task(hermes.send_message(session_id, "slow goodbye", user_id="dave"))
            await asyncio.wait_for(model.slow_started.wait(), 15)
            await hermes.close(session_id)
            with pytest.raises(SessionClosedError):
                await hermes.send_message(session_id, "one more thing", user_id="dave")
        finally:
            model.release.set()
        # The turn that was running when the close arrived still finishes.
        assert (await asyncio.wait_for(slow, 15)).reply == "echo: slow goodbye"
        await eventually(
            lambda: _state_if(hermes, session_id, lambda s: s.status == "closed"), what="the session to close"
        )


# ------------------------------------------------------------- bad input


async def test_an_empty_message_is_rejected_by_the_client_and_by_the_workflow_and_the_session_stays_usable(
    run_worker, session_id, temporal_client
):
    async with run_worker(EchoModel()) as hermes:
        await hermes.send_message(session_id, "first")
        with pytest.raises(MessageRejectedError):
            await hermes.send_message(session_id, "   \n\t")

        # Past the client's check, the workflow's update validator refuses it too.
        with pytest.raises(WorkflowUpdateFailedError) as failure:
            await temporal_client.get_workflow_handle(session_id).execute_update(
                names.SEND_MESSAGE, signed(names.SEND_MESSAGE, session_id, SendMessageInput(text="  "))
            )
        assert isinstance(failure.value.cause, ApplicationError)
        assert failure.value.cause.type == "MessageRejectedError"

        assert (await hermes.send_message(session_id, "second")).reply == "echo: second"
        state = await hermes.get_state(session_id)
        assert state.turn_count == 2
        assert [m.content for m in await hermes.get_transcript(session_id) if m.role == "user"] == ["first", "second"]


async def test_an_oversized_message_is_rejected_and_nothing_is_recorded(run_worker, session_id, temporal_client):
    async with run_worker(EchoModel()) as hermes:
        await hermes.send_message(session_id, "first")
        # (A client with Redis keeps it by reference instead: tests/test_large_inputs.py.)
        without_redis = HermesClient(temporal_client, task_queue=hermes.task_queue)
        with pytest.raises(MessageRejectedError, match="bytes"):
            await without_redis.send_message(session_id, "x" * (3 * 1024 * 1024))

        # Past the client's check, the workflow's validator applies the same limit.
        too_big = "y" * (SessionConfig().max_message_bytes + 1)
        with pytest.raises(WorkflowUpdateFailedError) as failure:
            await temporal_client.get_workflow_handle(session_id).execute_update(
                names.SEND_MESSAGE, signed(names.SEND_MESSAGE, session_id, SendMessageInput(text=too_big))
            )
        assert isinstance(failure.value.cause, ApplicationError)
        assert failure.value.cause.type == "MessageRejectedError"

        assert [m.content for m in await hermes.get_transcript(session_id)] == ["first", "echo: first"]
        assert (await hermes.send_message(session_id, "second")).reply == "echo: second"
        assert (await hermes.get_state(session_id)).turn_count == 2


def _one_tool_call_then_report(call: dict[str, Any]) -> dict[str, Any]:
    return {
        "turns": [
            {"match": "go", "steps": [
                {"tool_calls": [call]},
                {"reply": "Tool said: {{ last_tool_result.message }}"},
            ]},
            {"steps": [{"reply": "Still here."}]},
        ]
    }


async def _run_one_tool_call(run_worker: Any, session_id: str, call: dict[str, Any]) -> Any:
    async with run_worker(_one_tool_call_then_report(call)) as hermes:
        result = await hermes.send_message(session_id, "go")
        assert result.status == "completed"
        assert len(result.tool_calls) == 1
        record = result.tool_calls[0]
        # The model saw the same result and answered in its next step.
        assert result.reply == f"Tool said: {record.result.message}"
        transcript = await hermes.get_transcript(session_id)
        assert [m.role for m in transcript] == ["user", "assistant", "tool", "assistant"]
        assert ToolResult.model_validate_json(transcript[2].content or "") == record.result
        assert (await hermes.send_message(session_id, "anything else")).reply == "Still here."
        return record


@pytest.mark.parametrize(
    ("call", "field"),
    [
        ({"name": "calculate", "arguments": {"expression": ["1", "+", "2"]}}, "expression"),
        ({"name": "list_notes", "arguments": {"limit": "abc"}}, "limit"),
        ({"name": "current_time", "arguments": {"zone": "UTC"}}, "zone"),
    ],
    ids=["list_for_a_string", "word_for_an_int", "unexpected_field"],
)
async def test_tool_arguments_of_the_wrong_type_return_code_1_naming_the_field(run_worker, session_id, call, field):
    record = await _run_one_tool_call(run_worker, session_id, call)
    assert record.result.code == ToolResultCode.BAD_ARGUMENTS
    assert field in record.result.message
    assert [p["field"] for p in record.result.data["problems"]] == [field]


async def test_a_string_number_for_an_int_argument_is_coerced_and_the_tool_runs(run_worker, session_id, redis):
    record = await _run_one_tool_call(run_worker, session_id, {"name": "list_notes", "arguments": {"limit": "5"}})
    assert record.result.code == ToolResultCode.OK
    assert record.result.data == {"count": 0, "notes": []}


async def test_an_unknown_tool_name_returns_code_1_naming_the_available_tools(run_worker, session_id):
    record = await _run_one_tool_call(run_worker, session_id, {"name": "get_weather", "arguments": {"city": "Oslo"}})
    assert record.result.code == ToolResultCode.BAD_ARGUMENTS
    assert "get_weather" in record.result.message
    assert "calculate, current_time, list_notes, read_stored_content, save_note" in record.result.message


async def test_malformed_json_arguments_return_code_1_and_the_tool_does_not_run(run_worker, session_id):
    record = await _run_one_tool_call(run_worker, session_id, {"name": "current_time", "arguments": '{"timezone": '})
    assert record.result.code == ToolResultCode.BAD_ARGUMENTS
    assert "expected a JSON object" in record.result.message
    assert record.result.data is None


# ---------------------------------------------------------- session index


async def test_list_sessions_shows_a_users_sessions_with_titles_and_survives_a_redis_flush(run_worker, redis):
    user = f"u1-{uuid.uuid4().hex[:8]}"
    sessions = {f"session-{uuid.uuid4()}": "plan a trip to Oslo", f"session-{uuid.uuid4()}": "weekly groceries"}
    async with run_worker(EchoModel()) as hermes:
        for sid, text in sessions.items():
            await hermes.send_message(sid, text, user_id=user)

        async def listed_with_titles() -> dict[str, str] | None:
            found = {e.session_id: e.title for e in await hermes.list_sessions(user)}
            return found if found == sessions else None

        await eventually(listed_with_titles, what="both sessions with their titles in the index")

        await redis.flushdb()
        assert await redis.dbsize() == 0

        async def listed_after_flush() -> dict[str, str] | None:
            # The first call rebuilds on its own (the index is empty); later polls ask for
            # it, since visibility may have shown only one session the first time.
            entries = await hermes.list_sessions(user, rebuild=True)
            found = {e.session_id: e.title for e in entries}
            return found if set(found) == set(sessions) else None

        # Rebuilt from Temporal visibility (eventually consistent, hence the poll).
        rebuilt = await eventually(listed_after_flush, what="the index rebuilt from Temporal visibility")
        assert rebuilt == sessions
        entries = await hermes.list_sessions(user)
        assert all(e.user_id == user and e.status == "active" for e in entries)
        # Running sessions answer for themselves: turns and last activity are not lost.
        assert all(e.turn_count == 1 and e.last_active_at > e.created_at for e in entries)


async def test_a_rebuild_of_the_session_index_keeps_rows_that_are_fresher_than_visibility(run_worker, redis):
    user = f"u2-{uuid.uuid4().hex[:8]}"
    sid = f"session-{uuid.uuid4()}"
    async with run_worker(EchoModel()) as hermes:
        for text in ("one", "two", "three"):
            await hermes.send_message(sid, text, user_id=user)
        before = await hermes.list_sessions(user)
        assert [(e.session_id, e.turn_count) for e in before] == [(sid, 3)]
        after = await hermes.list_sessions(user, rebuild=True)
        assert after == before


# ------------------------------------------------------------ failing tools


async def test_a_tool_that_keeps_raising_is_retried_three_times_then_reported_as_code_2_and_the_session_goes_on(
    run_worker, session_id
):
    attempts: list[int] = []

    def fetch_quote(symbol: str) -> dict[str, Any]:
        """Latest price of a stock.

        Args:
            symbol: ticker symbol, e.g. "ACME".
        """
        attempts.append(len(attempts) + 1)
        raise RuntimeError(f"quote backend down for {symbol}")

    registry = register_builtins(ToolRegistry())
    registry.register(fetch_quote, idempotent=True, permission="read")
    script = _one_tool_call_then_report({"name": "fetch_quote", "arguments": {"symbol": "ACME"}})
    async with run_worker(script, registry=registry) as hermes:
        result = await hermes.send_message(session_id, "go")
        assert attempts == [1, 2, 3]
        record = result.tool_calls[0]
        assert record.result.code == ToolResultCode.DEPENDENCY_UNAVAILABLE
        assert "quote backend down for ACME" in record.result.message
        assert result.status == "completed"
        assert result.reply == f"Tool said: {record.result.message}"
        trace = await hermes.get_trace(session_id)
        assert [(s.action_type, s.status) for s in trace] == [("model", "ok"), ("tool", "code_2"), ("model", "ok")]

        assert (await hermes.send_message(session_id, "and now?")).reply == "Still here."


async def test_a_tool_that_fails_twice_then_works_is_retried_to_success(run_worker, session_id):
    attempts: list[int] = []

    def flaky_lookup(key: str) -> dict[str, Any]:
        """Look a key up in a flaky store.

        Args:
            key: the key to look up.
        """
        attempts.append(len(attempts) + 1)
        if len(attempts) < 3:
            raise ConnectionError("store not reachable")
        return {"key": key, "value": "found"}

    registry = register_builtins(ToolRegistry())
    registry.register(flaky_lookup, idempotent=True, permission="read")
    script = _one_tool_call_then_report({"name": "flaky_lookup", "arguments": {"key": "k1"}})
    async with run_worker(script, registry=registry) as hermes:
        result = await hermes.send_message(session_id, "go")
        assert attempts == [1, 2, 3]
        assert result.tool_calls[0].result.code == ToolResultCode.OK
        assert result.tool_calls[0].result.data == {"key": "k1", "value": "found"}
        assert json.loads((await hermes.get_transcript(session_id))[2].content or "")["data"]["value"] == "found"


# ------------------------------------------------------------ Redis outage


class HungRedis:
    """A TCP server that accepts connections and never answers (a hung Redis) until
    :meth:`go_down`, which drops every connection and refuses new ones."""

    def __init__(self) -> None:
        self.writers: list[asyncio.StreamWriter] = []
        self.server: asyncio.Server | None = None

    async def start(self) -> str:
        async def hold(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            self.writers.append(writer)
            await reader.read()
            writer.close()

        self.server = await asyncio.start_server(hold, "127.0.0.1", 0)
        return f"redis://127.0.0.1:{self.server.sockets[0].getsockname()[1]}/0"

    def go_down(self) -> None:
        if self.server is not None:
            self.server.close()
        for writer in self.writers:
            writer.close()


async def test_a_session_keeps_answering_and_closes_while_redis_is_down(temporal_client, settings, session_id):
    down = aioredis.Redis.from_url(f"redis://127.0.0.1:{free_port()}/0")
    worker = build_worker(
        temporal_client, settings, provider=EchoModel(), registry=register_builtins(ToolRegistry()), redis=down
    )
    try:
        async with worker:
            hermes = HermesClient(temporal_client, task_queue=settings.task_queue)
            assert (await hermes.send_message(session_id, "hello", user_id="erin")).reply == "echo: hello"
            await hermes.close(session_id)
            handle = temporal_client.get_workflow_handle(session_id, result_type=SessionState)
            final = await asyncio.wait_for(handle.result(), 20)
            assert (final.status, final.turn_count) == ("closed", 1)
            assert (await handle.describe()).status == WorkflowExecutionStatus.COMPLETED
    finally:
        await down.aclose()


async def test_a_close_that_arrives_while_the_session_continues_as_new_still_closes_it(
    temporal_client, settings, session_id
):
    # With a hung Redis the index write that ends a turn hangs, and a run that continues
    # as new waits for it first; the reply comes back with the workflow task's heartbeat
    # (~8 s), so the close signal lands in that wait. Then Redis fails fast.
    hung_redis = HungRedis()
    hung = aioredis.Redis.from_url(await hung_redis.start())
    worker = build_worker(
        temporal_client, settings, provider=EchoModel(), registry=register_builtins(ToolRegistry()), redis=hung
    )
    try:
        async with worker:
            config = SessionConfig(max_updates_per_run=1)
            hermes = HermesClient(temporal_client, task_queue=settings.task_queue, config=config)
            await hermes.send_message(session_id, "one")  # this run now continues as new
            await hermes.close(session_id)
            hung_redis.go_down()
            handle = temporal_client.get_workflow_handle(session_id, result_type=SessionState)
            final = await asyncio.wait_for(handle.result(), 30)
            assert (final.status, final.turn_count) == ("closed", 1)
            with pytest.raises(SessionClosedError):
                await hermes.send_message(session_id, "two")
    finally:
        hung_redis.go_down()
        await hung.aclose()
