"""Long sessions (issue 5): history that stays bounded over 1,000 turns and a 100-step turn,
summaries that never lose a message, forced compaction, replay across continue-as-new,
the idle/archive lifecycle and the dynamic system prompt.

A real Temporal dev server (the time-skipping test server for the lifecycle) and a real
Redis; only the LLM is a stand-in (provider classes below, or a ScriptedModel). Waits are
bounded polls of a condition, never fixed sleeps. Figures (history bytes and events per
run, bytes per turn early vs late, model call counts, run time) are printed: run with
``-s`` to see them.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from datetime import timedelta
from typing import Any

import pytest
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Replayer

from activities.transcript import SNAPSHOT_KEY, read_snapshot
from hermes.infra.durable import NOTES
from hermes import names
from hermes.client import HermesClient
from hermes.content.context import SUMMARY_TEMPLATE, ContextPolicy
from hermes.errors import ModelRequestError
from hermes.models import (
    ArchiveMessagesInput,
    CallModelInput,
    CallModelResult,
    Message,
    SendMessageInput,
    SessionConfig,
    SessionState,
    ToolCall,
    ToolResult,
    ToolResultCode,
    TraceStep,
    Usage,
)
from hermes.providers.scripted import ScriptedModel
from hermes.settings import Settings
from hermes.content.tokens import count_message_tokens, count_text_tokens
from hermes.tools.builtin import register_builtins
from hermes.tools.registry import ToolRegistry
from worker import build_worker
from workflows.session import SessionWorkflow
from tests.support import eventually, run_histories


_SUMMARIZER = ScriptedModel.from_dict({"turns": []})
"""The scripted model's stand-in summary ("The user said: ..." lines), for providers below."""


# ---------------------------------------------------------------- helpers




def reply_result(text: str, request: CallModelInput, provider: str = "test") -> CallModelResult:
    return CallModelResult(
        message=Message(role="assistant", content=text),
        usage=Usage(prompt_tokens=count_message_tokens(request.messages), completion_tokens=count_text_tokens(text)),
        provider=provider,
    )


def call_result(tcid: str, name: str, arguments: dict[str, Any], request: CallModelInput) -> CallModelResult:
    return CallModelResult(
        message=Message(role="assistant", tool_calls=[ToolCall(tool_call_id=tcid, name=name, arguments=arguments)]),
        usage=Usage(prompt_tokens=count_message_tokens(request.messages), completion_tokens=10),
        provider="test",
    )


def summary_result(request: CallModelInput) -> CallModelResult:
    return reply_result(_SUMMARIZER.summary_message(request).content or "", request)




async def listed_run_ids(client: Client, session_id: str) -> set[str]:
    """Run ids of the session that visibility lists (it may lag a moment behind)."""
    return {execution.run_id async for execution in client.list_workflows(f'WorkflowId = "{session_id}"')}


def history_bytes(history: WorkflowHistory) -> int:
    return sum(event.ByteSize() for event in history.events)


def bytes_at_each_message(history: WorkflowHistory) -> dict[str, int]:
    """History bytes written before each accepted ``send_message`` update, by its text."""
    offsets: dict[str, int] = {}
    total = 0
    for event in history.events:
        if event.HasField("workflow_execution_update_accepted_event_attributes"):
            payloads = event.workflow_execution_update_accepted_event_attributes.accepted_request.input.args.payloads
            [message] = pydantic_data_converter.payload_converter.from_payloads(list(payloads), [SendMessageInput])
            offsets[message.text] = total
        total += event.ByteSize()
    return offsets


def summary_steps(trace: list[TraceStep]) -> list[TraceStep]:
    return [s for s in trace if s.action_type == "summary"]


# ------------------------------------------------------------- 1,000 turns


def page_text(n: int) -> str:
    """About 5 KB of deterministic text, different for every ``n``."""
    parts: list[str] = []
    seed = f"page {n}".encode()
    while sum(len(p) + 1 for p in parts) < 5_000:
        seed = hashlib.sha256(seed).digest()
        parts.append(f"{seed.hex()} row{len(parts)}-of-{n}")
    return "\n".join(parts)


def page_reply(turn: int, text: str) -> str:
    return f"turn {turn}: read {len(text)} chars, sha {hashlib.sha256(text.encode()).hexdigest()[:16]}"


def user_text(n: int) -> str:
    return f"message {n}: please read page {n} and tell me its digest"


def page_registry() -> ToolRegistry:
    registry = register_builtins(ToolRegistry())

    def read_page(n: int) -> dict[str, Any]:
        """Read page ``n`` of the archive (about 5 KB of text).

        Args:
            n: the page number.
        """
        return {"n": n, "text": page_text(n)}

    registry.register(read_page)
    return registry


class PageReader:
    """Calls ``read_page`` with the turn number, then answers with the page's length and
    digest (computed from the tool result it was given: proof that it saw the result)."""

    name = "test"

    def __init__(self) -> None:
        self.reply_calls = 0
        self.reply_steps: set[tuple[int, int]] = set()
        """(turn, step) of every reply call: an attempt retried after a heartbeat timeout
        (a loaded machine) calls again for the same step."""
        self.summary_calls = 0
        self.last_reply_request: CallModelInput | None = None
        self.extraction_calls = 0

    async def complete(self, request: CallModelInput) -> CallModelResult:
        if request.purpose == "summary":
            self.summary_calls += 1
            return summary_result(request)
        if request.purpose == "memory_extraction":
            # Long-term memory stays on: the session asks for an extraction every 8 turns.
            self.extraction_calls += 1
            return CallModelResult(message=Message(role="assistant", content='{"memories": []}'), provider="test")
        self.reply_calls += 1
        self.reply_steps.add((request.turn, request.step))
        self.last_reply_request = request
        if request.step == 0:
            return call_result(f"page_{request.turn}", "read_page", {"n": request.turn}, request)
        last = request.messages[-1]
        assert last.role == "tool", "the model's second step must see its tool result"
        data = ToolResult.model_validate_json(last.content or "").data
        return reply_result(page_reply(request.turn, data["text"]), request)


@pytest.mark.timeout(1500)
async def test_a_thousand_turns_with_5_kb_tool_results_keep_every_run_small_and_every_message_retrievable(
    run_worker, session_id, temporal_client
):
    turns = 1000
    model = PageReader()
    config = SessionConfig()
    started = time.monotonic()
    async with run_worker(model, registry=page_registry(), config=config) as hermes:
        for n in range(1, turns + 1):
            result = await hermes.send_message(session_id, user_text(n))
            assert (result.status, result.reply) == ("completed", page_reply(n, page_text(n)))
        elapsed = time.monotonic() - started
        # The session may continue as new right after its last turn (the replay budget):
        # read the state and the histories again until they agree.
        while True:
            state = await hermes.get_state(session_id)
            histories = await run_histories(temporal_client, session_id, state.chain_id)
            if len(histories) == state.run_index + 1 == (await hermes.get_state(session_id)).run_index + 1:
                break
        transcript = await hermes.get_transcript(session_id, include_archived=True)
    print(f"\n1,000 turns: {elapsed:.1f} s ({elapsed / turns * 1000:.0f} ms per turn), {len(histories)} runs")

    # Every run of the chain stays far from Temporal's limits.
    assert len(histories) == state.run_index + 1 >= 2
    chain = {state.chain_id} | {
        h.events[-1].workflow_execution_continued_as_new_event_attributes.new_execution_run_id for h in histories[:-1]
    }
    await eventually(
        lambda: _equal(listed_run_ids(temporal_client, session_id), chain), what="visibility listing every run"
    )
    for i, history in enumerate(histories):
        size, events = history_bytes(history), len(history.events)
        print(f"  run {i}: {size / 1e6:.2f} MB, {events} events")
        assert size < 10_000_000 and events < 10_000

    # History grows with the new content (a 5 KB result per turn), not with the context.
    offsets: dict[str, int] = {}
    run_of: dict[str, int] = {}
    for i, history in enumerate(histories):
        for text, at in bytes_at_each_message(history).items():
            offsets[text], run_of[text] = at, i

    def bytes_per_turn(first: int, last: int) -> float:
        a, b = user_text(first), user_text(last)
        return (offsets[b] - offsets[a]) / (last - first)

    def window(starts: range) -> tuple[int, int]:
        """The first 10-turn window from ``starts`` that lies in one run (runs continue
        as new every few dozen turns on the replay budget)."""
        return next((n, n + 10) for n in starts if run_of[user_text(n)] == run_of[user_text(n + 10)])

    (e1, e2), (l1, l2) = window(range(5, 60)), window(range(985, 930, -1))
    early, late = bytes_per_turn(e1, e2), bytes_per_turn(l1, l2)
    print(f"  history bytes per turn: turns {e1}-{e2} {early:.0f}, turns {l1}-{l2} {late:.0f}, ratio {late / early:.2f}")
    assert late < 2 * early

    # Every message is retrievable, in order, byte-identical.
    assert [m.content for m in transcript if m.role == "user"] == [user_text(n) for n in range(1, turns + 1)]
    by_turn: dict[int, list[Message]] = {}
    for m in transcript:
        by_turn.setdefault(m.turn, []).append(m)
    assert sorted(by_turn) == list(range(1, turns + 1))
    for n, messages in by_turn.items():
        user, call, tool, answer = messages
        assert (user.role, user.content) == ("user", user_text(n))
        assert [(c.name, c.arguments) for c in call.tool_calls] == [("read_page", {"n": n})]
        assert tool.role == "tool" and tool.tool_call_id == call.tool_calls[0].tool_call_id
        assert ToolResult.model_validate_json(tool.content or "").data == {"n": n, "text": page_text(n)}
        assert (answer.role, answer.content, answer.tool_calls) == ("assistant", page_reply(n, page_text(n)), [])

    # The last model call's context respects the token budget.
    budget = ContextPolicy.from_config(config).budget
    last = model.last_reply_request
    assert last is not None and last.turn == turns
    provider_tokens = count_message_tokens(last.messages)
    print(
        f"  model calls: {model.reply_calls} replies, {model.summary_calls} summaries; last context "
        f"{state.context_tokens} tokens (session estimate), {provider_tokens} (provider count), budget {budget}"
    )
    # Every step of every turn was called; a step called again is an attempt retried after
    # its heartbeat timed out (beside a soak, 5 of 2,000), never a second turn.
    assert model.reply_steps == {(n, step) for n in range(1, turns + 1) for step in (0, 1)}
    assert model.reply_calls - 2 * turns <= turns // 50, f"{model.reply_calls - 2 * turns} steps called again"
    assert 0 < state.context_tokens <= budget and provider_tokens <= budget
    assert state.summary is not None and model.summary_calls >= 1
    assert model.extraction_calls >= turns // 8 - 1, "memory extractions ran every 8 turns"


# ------------------------------------------- 100 tool calls in one turn, mid-turn events


def chapter(k: int) -> str:
    """About 20k tokens (45 KB) of deterministic text, under the 256 KB message limit."""
    words: list[str] = [f"chapter {k}:"]
    seed = f"chapter {k}".encode()
    while len(words) < 2500:
        seed = hashlib.sha256(seed).digest()
        words.append(f"{seed.hex()[:8]} word{len(words)}")
    return " ".join(words)


def stepping_registry() -> ToolRegistry:
    registry = register_builtins(ToolRegistry())

    def job_step(i: int) -> dict[str, int]:
        """Run step ``i`` of the batch job.

        Args:
            i: the step number.
        """
        return {"step": i, "square": i * i}

    registry.register(job_step)
    return registry


class BatchJob:
    """Turns 1-5 ("chapter ..."): acknowledged. The job turn: 100 sequential tool-call steps
    (``job_step``, except ``save_note`` at step 50, which needs the user's confirmation),
    then an answer. Any other message: ``second: <text>``."""

    name = "test"
    steps = 100
    note_step = 50

    def __init__(self) -> None:
        self.job_turn: int | None = None
        self.job_context_tokens: list[int] = []
        self.reply_calls = 0
        self.reply_steps: set[tuple[int, int]] = set()
        """(turn, step) of every reply call: an attempt retried after a heartbeat timeout
        (a loaded machine) calls again for the same step."""
        self.summary_calls = 0
        self.reached = {20: asyncio.Event()}

    async def complete(self, request: CallModelInput) -> CallModelResult:
        if request.purpose == "summary":
            self.summary_calls += 1
            return summary_result(request)
        self.reply_calls += 1
        text = next(m.content for m in reversed(request.messages) if m.role == "user") or ""
        if text.startswith("chapter"):
            return reply_result(f"read {text.split(':')[0]}", request)
        if text != "run the batch job":
            return reply_result(f"second: {text}", request)
        self.job_turn = request.turn
        step = request.step or 0
        self.job_context_tokens.append(count_message_tokens(request.messages))
        if step in self.reached:
            self.reached[step].set()
        if step < self.steps:
            if step > 0:
                last = request.messages[-1]
                assert last.role == "tool" and last.tool_call_id == f"job_{step - 1}", "each step sees the last result"
            if step == self.note_step:
                return call_result(f"job_{step}", "save_note", {"title": "batch", "text": "halfway 半分 🧮"}, request)
            return call_result(f"job_{step}", "job_step", {"i": step}, request)
        squares = [ToolResult.model_validate_json(m.content or "").data for m in request.messages if m.role == "tool"]
        return reply_result(f"done: {len(squares)} steps", request)


async def test_a_turn_of_100_sequential_tool_calls_over_a_100k_token_conversation_keeps_history_small_and_loses_nothing(
    run_worker, session_id, temporal_client, redis
):
    user_id = f"user-{uuid.uuid4()}"
    model = BatchJob()
    # A window wide enough that every step of the job is sent the whole 100k-token conversation.
    config = SessionConfig(max_iterations=120, context_window_tokens=200_000)
    started = time.monotonic()
    async with run_worker(model, registry=stepping_registry(), config=config) as hermes:
        for k in range(1, 6):
            result = await hermes.send_message(session_id, chapter(k), user_id=user_id)
            assert result.reply == f"read chapter {k}"
        prior_tokens = sum(count_text_tokens(chapter(k)) for k in range(1, 6))
        job = asyncio.create_task(hermes.send_message(session_id, "run the batch job", user_id=user_id))
        tasks = [job]
        try:
            await asyncio.wait_for(model.reached[20].wait(), 60)
            second = asyncio.create_task(hermes.send_message(session_id, "and one more thing", user_id=user_id))
            tasks.append(second)
            queued = await eventually(
                lambda: _state_if(hermes, session_id, lambda s: s.queued_messages == 1 and s.busy),
                what="the second message queued behind the running turn",
            )
            assert not job.done()
            pending = await hermes.wait_for_approval(session_id, timeout_seconds=60)
            assert (pending.tool_name, pending.turn) == ("save_note", 6)
            assert not second.done(), "the queued message must wait for the running turn"
            await hermes.approve(session_id, pending.tool_call_id, approver=user_id)
            result = await asyncio.wait_for(job, 120)
            after = await asyncio.wait_for(second, 60)
        finally:
            for task in tasks:
                task.cancel()  # a no-op for a finished task
        elapsed = time.monotonic() - started
        state = await hermes.get_state(session_id)
        transcript = await hermes.get_transcript(session_id, include_archived=True)
        histories = await run_histories(temporal_client, session_id, state.chain_id)
        notes = await hermes.durable.list(NOTES, owner=user_id)

    assert queued.turn_count == 6
    assert result.status == "completed" and result.reply == f"done: {BatchJob.steps} steps"
    assert len(result.tool_calls) == BatchJob.steps
    assert [r.name for r in result.tool_calls] == ["job_step"] * 50 + ["save_note"] + ["job_step"] * 49
    assert all(r.result.code == ToolResultCode.OK for r in result.tool_calls)
    note = result.tool_calls[BatchJob.note_step]
    assert (note.approval, note.approver) == ("approved", user_id)
    assert [d.outcome for d in state.decisions] == ["applied"] and len(notes) == 1
    assert (after.turn, after.status, after.reply) == (7, "completed", "second: and one more thing")

    # Every step was sent the whole conversation (over 100k tokens), yet history stayed small.
    assert prior_tokens >= 100_000
    assert len(model.job_context_tokens) == BatchJob.steps + 1 and min(model.job_context_tokens) >= 100_000
    for i, history in enumerate(histories):
        size, events = history_bytes(history), len(history.events)
        print(
            f"\n100-step turn: run {i}: {size / 1e6:.2f} MB, {events} events; {elapsed:.1f} s; "
            f"{model.reply_calls} model calls ({len(model.job_context_tokens)} in the job turn, each sent "
            f"{min(model.job_context_tokens)}-{max(model.job_context_tokens)} tokens)"
        )
        assert size < 5_000_000 and events < 10_000

    # The transcript has everything, in order.
    assert [m.turn for m in transcript if m.role == "user"] == list(range(1, 8))
    job_messages = [m for m in transcript if m.turn == 6]
    assert len(job_messages) == 1 + 2 * BatchJob.steps + 1
    calls = [c.tool_call_id for m in job_messages for c in m.tool_calls]
    results = [m.tool_call_id for m in job_messages if m.role == "tool"]
    assert calls == results == [f"job_{i}" for i in range(BatchJob.steps)]
    assert [(m.role, m.content) for m in transcript if m.turn == 7] == [
        ("user", "and one more thing"),
        ("assistant", "second: and one more thing"),
    ]
    assert [m.content for m in transcript if m.role == "user"][:5] == [chapter(k) for k in range(1, 6)]


async def _equal(value: Awaitable[Any], expected: Any) -> bool:
    return await value == expected


async def _state_if(hermes: HermesClient, session_id: str, predicate: Callable[[SessionState], bool]) -> SessionState | None:
    state = await hermes.get_state(session_id)
    return state if predicate(state) else None


# -------------------------------------------------------------------- summaries


SMALL_SUMMARY_CONFIG = SessionConfig(context_history_turns=5, summary_every_turns=3, context_recent_messages=4)


def fact(turn: int) -> str:
    return "my name is Ada" if turn == 1 else f"fact {turn}: the number of the day is {turn * 7}"


class FactModel:
    """Answers ``ok <turn>`` and records every request. Summary requests get the scripted
    model's summary, except: ``hold`` (the first one waits for :attr:`release`), ``error``
    (the first one is refused) and ``empty`` (the first one is blank)."""

    name = "test"

    def __init__(self, first_summary: str = "normal") -> None:
        self.first_summary = first_summary
        self.requests: list[CallModelInput] = []
        self.summary_uptos: list[int] = []
        self.summary_started = asyncio.Event()
        self.release = asyncio.Event()

    @property
    def reply_requests(self) -> list[CallModelInput]:
        return [r for r in self.requests if r.purpose == "reply"]

    async def complete(self, request: CallModelInput) -> CallModelResult:
        self.requests.append(request)
        if request.purpose != "summary":
            return reply_result(f"ok {request.turn}", request)
        first = not self.summary_started.is_set()
        self.summary_started.set()
        self.summary_uptos.append(request.turn)
        if first and self.first_summary == "hold":
            await asyncio.wait_for(self.release.wait(), 60)
        if first and self.first_summary == "error":
            raise ModelRequestError("400 from test: the summary was refused", status_code=400)
        if first and self.first_summary == "empty":
            return reply_result("   ", request)
        return summary_result(request)


def user_texts(request: CallModelInput) -> list[str]:
    return [m.content or "" for m in request.messages if m.role == "user"]


def summary_messages(request: CallModelInput) -> list[str]:
    return [m.content or "" for m in request.messages[1:] if m.role == "system" and (m.content or "").startswith("Summary")]


async def test_summaries_fold_old_turns_at_most_every_few_turns_without_delaying_the_reply(run_worker, session_id):
    cfg = SMALL_SUMMARY_CONFIG
    model = FactModel(first_summary="hold")
    async with run_worker(model, config=cfg) as hermes:
        for turn in range(1, 9):
            result = await asyncio.wait_for(hermes.send_message(session_id, fact(turn)), 90)
            assert result.reply == f"ok {turn}"
        # Turn 8 is the first with 3 turns older than the 5 kept: its summary (of turns 1-3)
        # runs after the reply, and the next turn is answered while it still runs.
        await asyncio.wait_for(model.summary_started.wait(), 90)
        assert (await hermes.get_state(session_id)).summary is None
        # Bounded (90 s: a turn on a machine with four CPU hogs took over 30): a reply that
        # waited for the held summary would never come.
        result = await asyncio.wait_for(hermes.send_message(session_id, fact(9)), 90)
        assert result.reply == "ok 9" and not model.release.is_set()
        assert "my name is Ada" in user_texts(model.reply_requests[-1]), "nothing is dropped before the summary is made"
        model.release.set()
        first = await eventually(
            lambda: _state_if(hermes, session_id, lambda s: s.summary is not None), what="the first summary"
        )
        assert first.summary is not None and first.summary.upto_turn == 3
        assert first.summary.text.startswith("The user said: my name is Ada")
        for turn in range(10, 46):
            assert (await hermes.send_message(session_id, fact(turn))).reply == f"ok {turn}"
        # The newest summary due by turn 45 covers at least turn 45 - 5 - 3 + 1 = 38; wait
        # until it and every summary asked of the model are recorded.
        async def settled() -> bool:
            state = await hermes.get_state(session_id)
            done = summary_steps(await hermes.get_trace(session_id))
            return state.summary is not None and state.summary.upto_turn >= 38 and len(done) == len(model.summary_uptos)

        await eventually(settled, what="the last summary", timeout_seconds=180)  # 60 s ran out under four CPU hogs
        state = await hermes.get_state(session_id)
        trace = await hermes.get_trace(session_id)
        assert (await hermes.send_message(session_id, fact(46))).reply == "ok 46"

    steps = summary_steps(trace)
    made_at = [s.turn for s in steps]
    print(f"\nsummaries: made after turns {made_at}, covering up to {model.summary_uptos}; {len(model.reply_requests)} reply calls")
    assert all(s.status == "ok" for s in steps) and len(steps) >= 10
    assert all(b - a >= cfg.summary_every_turns for a, b in zip(made_at, made_at[1:]))
    assert model.summary_uptos == [t - cfg.context_history_turns for t in made_at]
    assert state.summary is not None and state.summary.upto_turn == made_at[-1] - cfg.context_history_turns

    # A model call made after the summary: the summary message with the early fact, none of
    # the covered turns, every turn since (nothing lost between summary and recent turns).
    last = model.reply_requests[-1]
    upto = state.summary.upto_turn
    assert last.turn == 46 and upto >= 38
    [summary] = summary_messages(last)
    assert summary.startswith(SUMMARY_TEMPLATE.format(next_turn=upto + 1, text="The user said: my name is Ada"))
    assert summary.endswith(f"The user said: {fact(upto)}")
    assert user_texts(last) == [fact(t) for t in range(upto + 1, 47)]
    assert last.messages[1].content == summary  # right after the system prompt


async def test_turns_the_summary_covers_leave_the_state_at_continue_as_new_and_stay_in_the_transcript(run_worker, session_id):
    # Issue 12: every cached session holds its state in the worker's memory. Tiny messages
    # never approach max_carry_bytes, so before, a run carried every turn ever said.
    cfg = SMALL_SUMMARY_CONFIG.model_copy(update={"max_updates_per_run": 10})
    model = FactModel()
    async with run_worker(model, config=cfg) as hermes:
        for turn in range(1, 31):
            # Generous: continue-as-new every 10 messages on a loaded machine.
            assert (await asyncio.wait_for(hermes.send_message(session_id, fact(turn)), 120)).reply == f"ok {turn}"
        state = await hermes.get_state(session_id)
        held = await hermes.get_transcript(session_id, include_archived=False)
        everything = await hermes.get_transcript(session_id)

    assert state.run_index >= 2 and state.summary is not None
    assert state.archived_messages > 0, "summarized turns stayed in the state: only the byte budget archives"
    first_held = min(m.turn for m in held)
    assert first_held > 10, f"turns 1-{first_held - 1} left the state; the summary covers up to {state.summary.upto_turn}"
    assert [m.content for m in everything if m.role == "user"] == [fact(t) for t in range(1, 31)]
    assert [m.content for m in everything if m.role == "assistant"] == [f"ok {t}" for t in range(1, 31)]
    # The model still saw the summary and every turn after it.
    last = model.reply_requests[-1]
    assert summary_messages(last) and user_texts(last)[-1] == fact(30)


@pytest.mark.parametrize("failure", ["error", "empty"])
async def test_a_failed_or_empty_summary_keeps_every_message_and_is_retried_after_the_cooldown(
    run_worker, session_id, failure
):
    cfg = SMALL_SUMMARY_CONFIG.model_copy(update={"summary_retry_turns": 2})
    model = FactModel(first_summary=failure)
    async with run_worker(model, config=cfg) as hermes:

        async def summary_trace(count: int) -> list[TraceStep]:
            steps = summary_steps(await hermes.get_trace(session_id))
            return steps if len(steps) >= count else []

        for turn in range(1, 9):
            await hermes.send_message(session_id, fact(turn))
        [failed] = await eventually(lambda: summary_trace(1), what="the first summary attempt")
        assert (failed.turn, failed.status) == (8, failure)
        assert (await hermes.get_state(session_id)).summary is None
        await hermes.send_message(session_id, fact(9))
        # Nothing was dropped: the whole conversation is still sent, with no summary.
        assert user_texts(model.reply_requests[-1]) == [fact(t) for t in range(1, 10)]
        assert summary_messages(model.reply_requests[-1]) == []
        assert len(model.summary_uptos) == 1, "no retry before summary_retry_turns turns"
        await hermes.send_message(session_id, fact(10))
        steps = await eventually(lambda: summary_trace(2), what="the retried summary")
        state = await hermes.get_state(session_id)
        await hermes.send_message(session_id, fact(11))

    assert [(s.turn, s.status) for s in steps] == [(8, failure), (10, "ok")]
    assert model.summary_uptos == [3, 5]
    assert state.summary is not None and state.summary.upto_turn == 5
    assert "The user said: my name is Ada" in state.summary.text
    assert user_texts(model.reply_requests[-1]) == [fact(t) for t in range(6, 12)]


# -------------------------------------------------------- context too long (provider)


class Counting:
    """Wraps a provider; records ``(turn, step, purpose, outcome)`` of every call."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.name = inner, inner.name
        self.calls: list[tuple[int, int | None, str, str]] = []

    async def complete(self, request: CallModelInput) -> CallModelResult:
        try:
            result = await self.inner.complete(request)
        except Exception as err:
            self.calls.append((request.turn, request.step, request.purpose, type(err).__name__))
            raise
        self.calls.append((request.turn, request.step, request.purpose, "ok"))
        return result

    def of_turn(self, turn: int) -> list[tuple[int | None, str]]:
        return [(step, outcome) for t, step, purpose, outcome in self.calls if t == turn and purpose == "reply"]


def note(k: int) -> str:
    """About 300 tokens."""
    return f"note {k}: " + " ".join(hashlib.sha256(f"{k}/{i}".encode()).hexdigest()[:6] for i in range(66))


def big_page_registry() -> ToolRegistry:
    registry = register_builtins(ToolRegistry())

    def big_page() -> str:
        """Read the big page (about 4,000 tokens).

        Args: none.
        """
        return " ".join(hashlib.sha256(f"page/{i}".encode()).hexdigest()[:10] for i in range(600))

    registry.register(big_page)
    return registry


def activity_summaries(history: WorkflowHistory, activity_type: str) -> list[str]:
    found = []
    for e in history.events:
        if e.HasField("activity_task_scheduled_event_attributes"):
            if e.activity_task_scheduled_event_attributes.activity_type.name == activity_type:
                [text] = pydantic_data_converter.payload_converter.from_payloads([e.user_metadata.summary], [str])
                found.append(text)
    return found


async def test_a_context_the_provider_refuses_is_compacted_once_and_retried_once_never_in_a_loop(
    run_worker, session_id, temporal_client
):
    script = {
        "turns": [{"match": "(?i)big page", "steps": [{"tool_calls": [{"name": "big_page"}]}, {"reply": "read it"}]}],
        "fallback": "noted",
        "max_context_tokens": 1500,
    }
    model = Counting(ScriptedModel.from_dict(script))
    config = SessionConfig(summary_max_tokens=100)
    async with run_worker(model, registry=big_page_registry(), config=config) as hermes:
        for k in range(1, 5):
            assert (await hermes.send_message(session_id, note(k))).reply == "noted"
        assert all(outcome == "ok" for *_, outcome in model.calls)

        # Turn 5 pushes the context past the provider's 1,500 tokens: one compaction, one retry.
        fifth = await hermes.send_message(session_id, note(5))
        state = await hermes.get_state(session_id)
        trace = [(s.action_type, s.status) for s in await hermes.get_trace(session_id) if s.turn == 5]
        assert (fifth.status, fifth.reply) == ("completed", "noted")
        assert model.of_turn(5) == [(0, "ContextTooLongError"), (0, "ok")]
        assert [c for c in model.calls if c[2] == "summary"] == [(4, None, "summary", "ok")]
        assert trace == [("model", "context_too_long"), ("summary", "ok"), ("model", "ok")]
        assert state.summary is not None and state.summary.upto_turn == 4

        # Turn 6's own tool result is over the limit: compaction cannot help; the turn ends
        # clearly after one retry.
        sixth = await hermes.send_message(session_id, "read the big page")
        assert sixth.status == "context_too_large"
        assert sixth.reply.startswith("I cannot send this to the model: the model refused the context as too long")
        assert "1500 tokens" in sixth.reply
        assert model.of_turn(6) == [(0, "ok"), (1, "ContextTooLongError"), (1, "ContextTooLongError")]

        # The session takes the next message (its compaction folds the oversized turn away).
        seventh = await hermes.send_message(session_id, "hello again")
        assert (seventh.status, seventh.reply) == ("completed", "noted")
        assert model.of_turn(7) == [(0, "ContextTooLongError"), (0, "ok")]
        state = await hermes.get_state(session_id)
        history = await temporal_client.get_workflow_handle(session_id).fetch_history()
        transcript = await hermes.get_transcript(session_id)

    summaries = [(t, outcome) for t, _, purpose, outcome in model.calls if purpose == "summary"]
    print(f"\ncontext too long: {len(model.calls)} model calls ({len(summaries)} summaries): {model.calls}")
    assert summaries == [(4, "ok"), (5, "ok"), (6, "ok")]
    assert activity_summaries(history, names.SUMMARIZE_CONTEXT) == [
        "summary of turns 1-4 (forced)",
        "summary of turns 5-5 (forced)",
        "summary of turns 6-6 (forced)",
    ]
    assert state.summary is not None and state.summary.upto_turn == 6
    # Nothing was lost from the transcript, only folded out of the context.
    assert [m.content for m in transcript if m.role == "user"] == [note(k) for k in range(1, 6)] + [
        "read the big page",
        "hello again",
    ]


# ------------------------------------------------------ replay across continue-as-new


class ToolEveryTurn:
    """Calls ``calculate`` each turn, then answers with its value; scripted summaries."""

    name = "test"

    async def complete(self, request: CallModelInput) -> CallModelResult:
        if request.purpose == "summary":
            return summary_result(request)
        if request.step == 0:
            return call_result(f"calc_{request.turn}", "calculate", {"expression": f"{request.turn} * 11"}, request)
        data = ToolResult.model_validate_json(request.messages[-1].content or "").data
        return reply_result(f"{request.turn} * 11 = {data['value']}", request)


@pytest.mark.parametrize("max_cached_workflows", [1000, 0], ids=["cached", "no-cache"])
async def test_every_run_of_a_session_with_tools_and_summaries_replays_across_continue_as_new(
    run_worker, session_id, temporal_client, max_cached_workflows
):
    config = SessionConfig(
        max_updates_per_run=3, context_history_turns=2, summary_every_turns=2, context_recent_messages=2
    )
    async with run_worker(ToolEveryTurn(), config=config, max_cached_workflows=max_cached_workflows) as hermes:
        for turn in range(1, 9):
            result = await hermes.send_message(session_id, f"what is {turn} times 11?")
            assert result.reply == f"{turn} * 11 = {turn * 11}"
        state = await hermes.get_state(session_id)
        await hermes.close(session_id)
        final = await temporal_client.get_workflow_handle(session_id, result_type=SessionState).result(
            rpc_timeout=timedelta(seconds=30)
        )
        histories = await run_histories(temporal_client, session_id, state.chain_id)

    assert final.status == "closed" and final.turn_count == 8
    assert final.summary is not None and final.summary.upto_turn >= 4
    assert len(histories) == final.run_index + 1 >= 3
    summarized = [h for h in histories if activity_summaries(h, names.SUMMARIZE_CONTEXT)]
    assert len(summarized) >= 2, "summaries ran in more than one run"
    replayer = Replayer(workflows=[SessionWorkflow], data_converter=pydantic_data_converter)
    for i, history in enumerate(histories):
        replayed = await replayer.replay_workflow(history, raise_on_replay_failure=False)
        assert replayed.replay_failure is None, f"run {i} of {len(histories)}: {replayed.replay_failure}"
    print(f"\nreplay: {len(histories)} runs, events per run {[len(h.events) for h in histories]}")


ROLLING = SessionConfig(  # no memory: no extraction runs beside the turns
    max_updates_per_run=4, context_history_turns=1, summary_every_turns=2, context_recent_messages=2, memory_enabled=False
)
"""A run of four messages with a summary every two turns: each roll-over has summarized turns to archive."""


async def _tool_turns(hermes: HermesClient, session_id: str, turns: int) -> tuple[SessionState, list[Message]]:
    """``turns`` messages one after another, each answer checked; the state and transcript after them."""
    for turn in range(1, turns + 1):
        result = await hermes.send_message(session_id, f"what is {turn} times 11?")
        assert result.reply == f"{turn} * 11 = {turn * 11}"
    return await hermes.get_state(session_id), await hermes.get_transcript(session_id)


async def test_the_turn_before_a_roll_over_archives_before_its_reply_so_the_next_message_lands_on_the_new_run(
    run_worker, session_id, temporal_client
):
    """With nothing running beside it, the turn after which the run continues as new
    archives the summarized turns before its reply (the ``archive-at-reply`` patch): the
    run continues as new in the workflow task that completes that message, so a message
    sent right after it goes to the new run, not to a closing one that refuses it as busy
    (issue 31). Every run replays."""
    async with run_worker(ToolEveryTurn(), config=ROLLING) as hermes:
        state, _ = await _tool_turns(hermes, session_id, 9)
        histories = await run_histories(temporal_client, session_id, state.chain_id)

    assert len(histories) == 3, [len(h.events) for h in histories]
    for i, history in enumerate(histories[:-1]):
        kinds = [e.WhichOneof("attributes") for e in history.events]
        task = max(k for k, kind in enumerate(kinds) if kind == "workflow_task_completed_event_attributes")
        after = [kind for kind in kinds[task + 1:] if kind != "timer_canceled_event_attributes"]  # the idle timer's
        assert after == [
            "workflow_execution_update_completed_event_attributes", "workflow_execution_continued_as_new_event_attributes"
        ], f"run {i}: the roll-over is not in the task that completed the last message: {kinds[-8:]}"
        last_update = task + 1
        archived = [
            k for k, e in enumerate(history.events)
            if e.HasField("activity_task_scheduled_event_attributes")
            and e.activity_task_scheduled_event_attributes.activity_type.name == names.ARCHIVE_MESSAGES
        ]
        previous_update = max(k for k, kind in enumerate(kinds[:last_update]) if kind == kinds[last_update])
        assert archived and previous_update < archived[-1] < last_update, (
            f"run {i}: the summarized turns were not archived during the last turn ({archived}, {previous_update}, {last_update})"
        )
    replayer = Replayer(workflows=[SessionWorkflow], data_converter=pydantic_data_converter)
    for i, history in enumerate(histories):
        replayed = await replayer.replay_workflow(history, raise_on_replay_failure=False)
        assert replayed.replay_failure is None, f"run {i}: {replayed.replay_failure}"


async def test_an_archive_that_fails_before_a_reply_is_tried_once_and_made_again_after_it_with_retries(
    run_worker, session_id, temporal_client, monkeypatch
):
    """The archive before a roll-over's reply has one short attempt (a failing store must
    not hold the reply through the retries); when it fails, the run archives after the
    reply as before, with retries, and continues as new; no message is lost."""
    from temporalio import activity

    from activities.transcript import TranscriptActivities

    real = TranscriptActivities.archive_messages
    attempts: list[int] = []

    @activity.defn(name=names.ARCHIVE_MESSAGES)
    async def failing_first(self, request: ArchiveMessagesInput) -> int:  # noqa: ANN001 - the SDK skips an unannotated self
        attempts.append(activity.info().attempt)
        if len(attempts) == 1:
            raise RuntimeError("the archive store is down (once)")
        return await real(self, request)

    monkeypatch.setattr(TranscriptActivities, "archive_messages", failing_first)
    async with run_worker(ToolEveryTurn(), config=ROLLING) as hermes:
        state, transcript = await _tool_turns(hermes, session_id, 5)
        histories = await run_histories(temporal_client, session_id, state.chain_id)

    assert len(histories) == 2 and state.turn_count == 5
    archives = [
        e.activity_task_scheduled_event_attributes.retry_policy.maximum_attempts
        for e in histories[0].events
        if e.HasField("activity_task_scheduled_event_attributes")
        and e.activity_task_scheduled_event_attributes.activity_type.name == names.ARCHIVE_MESSAGES
    ]
    assert archives == [1, 5], f"the early archive once, then the run's own with retries: {archives}"
    assert attempts == [1, 1], attempts
    assert [m.content for m in transcript if m.role == "user"] == [f"what is {k} times 11?" for k in range(1, 6)]
    replayer = Replayer(workflows=[SessionWorkflow], data_converter=pydantic_data_converter)
    for i, history in enumerate(histories):
        replayed = await replayer.replay_workflow(history, raise_on_replay_failure=False)
        assert replayed.replay_failure is None, f"run {i}: {replayed.replay_failure}"


# ------------------------------------------------- lifecycle (time-skipping server)


class Echo:
    name = "test"

    async def complete(self, request: CallModelInput) -> CallModelResult:
        if request.purpose == "summary":
            return summary_result(request)
        return reply_result(f"echo: {user_texts(request)[-1]}", request)


async def _status_is(hermes: HermesClient, session_id: str, status: str) -> bool:
    state = await hermes.get_state(session_id)
    attribute = (await hermes.handle(session_id).describe()).typed_search_attributes.get(names.SA_STATUS)
    return state.status == status and attribute == status


async def _archive_a_session(env: WorkflowEnvironment, hermes: HermesClient, session_id: str, redis: Any) -> SessionState:
    """Two messages with 31 min of quiet between them, then 7 days of quiet: the session
    goes idle, active again, idle, and is archived. Returns its final state."""
    assert (await hermes.send_message(session_id, "hello")).reply == "echo: hello"
    assert await _status_is(hermes, session_id, "active")
    await env.sleep(31 * 60)  # skipped, not slept: the test server jumps its clock
    await eventually(lambda: _status_is(hermes, session_id, "idle"), what="the session turning idle")

    assert (await hermes.send_message(session_id, "still there?")).reply == "echo: still there?"
    await eventually(lambda: _status_is(hermes, session_id, "active"), what="the session active again")

    await env.sleep(7 * 86400 + 3600)

    async def completed() -> bool:
        return (await hermes.handle(session_id).describe()).status == WorkflowExecutionStatus.COMPLETED

    await eventually(completed, what="the archived session's run completing")
    description = await hermes.handle(session_id).describe()
    assert description.typed_search_attributes.get(names.SA_STATUS) == "archived"
    return await env.client.get_workflow_handle(session_id, result_type=SessionState).result()


@asynccontextmanager
async def _echo_session(
    env: WorkflowEnvironment, redis_url: str, redis: Any, task_queue: str
) -> AsyncIterator[HermesClient]:
    """A worker with the :class:`Echo` model on ``env`` (the time-skipping server), and a client."""
    settings = Settings(redis_url=redis_url, task_queue=task_queue, temporal_address="unused:0")
    async with build_worker(env.client, settings, provider=Echo(), registry=register_builtins(ToolRegistry()), redis=redis):
        yield HermesClient(env.client, task_queue=task_queue, redis=redis)


async def test_a_quiet_session_turns_idle_wakes_on_a_message_and_is_archived_with_a_snapshot_after_seven_days(
    time_skipping_env, redis_url, redis, task_queue, session_id
):
    async with _echo_session(time_skipping_env, redis_url, redis, task_queue) as hermes:
        final = await _archive_a_session(time_skipping_env, hermes, session_id, redis)

    assert final.status == "archived" and final.turn_count == 2
    assert final.snapshot is not None and final.snapshot.status == "archived"
    # Days later the content store may have let the bodies go: no planner state in a snapshot.
    assert final.snapshot.context is None
    assert [m.content for m in final.snapshot.messages] == ["hello", "echo: hello", "still there?", "echo: still there?"]
    assert await redis.exists(SNAPSHOT_KEY.format(session_id=session_id))
    stored = await read_snapshot(redis, session_id)
    assert stored is not None and stored.messages == final.snapshot.messages


async def _resumes_with_its_transcript(hermes: HermesClient, session_id: str, final: SessionState) -> None:
    """A message to the archived session is answered as turn 3, after turns 1-2 of its
    snapshot, in the same chain."""
    resumed = await hermes.send_message(session_id, "I am back")
    transcript = await hermes.get_transcript(session_id, include_archived=True)
    state = await hermes.get_state(session_id)
    assert (resumed.status, resumed.reply, resumed.turn) == ("completed", "echo: I am back", 3)
    assert [(m.turn, m.content) for m in transcript] == [
        (1, "hello"),
        (1, "echo: hello"),
        (2, "still there?"),
        (2, "echo: still there?"),
        (3, "I am back"),
        (3, "echo: I am back"),
    ]
    assert state.status == "active" and state.chain_id == final.chain_id


async def test_a_message_to_an_archived_session_resumes_it_with_the_transcript_intact(
    time_skipping_env, redis_url, redis, task_queue, session_id
):
    async with _echo_session(time_skipping_env, redis_url, redis, task_queue) as hermes:
        final = await _archive_a_session(time_skipping_env, hermes, session_id, redis)
        assert final.status == "archived"

        await _resumes_with_its_transcript(hermes, session_id, final)


# ------------------------------------------------------------ dynamic system prompt


class PromptRecorder:
    """Turn 2 calls ``wait_for_go`` (which blocks until the test sets :attr:`go`); every
    call's system message is recorded with its turn and step."""

    name = "test"

    def __init__(self) -> None:
        self.system: list[tuple[int, int | None, str]] = []

    async def complete(self, request: CallModelInput) -> CallModelResult:
        first = request.messages[0]
        assert first.role == "system"
        self.system.append((request.turn, request.step, first.content or ""))
        if request.turn == 2 and request.step == 0:
            return call_result("wait_1", "wait_for_go", {}, request)
        return reply_result(f"ok {request.turn}", request)


NEW_PROMPT = "  Réponds comme un pirate 🏴‍☠️.\n\tKeep\u00a0these  spaces, and <|endoftext|> as text.  \n"


async def test_a_system_prompt_signal_during_a_tool_call_applies_from_the_next_model_call_byte_for_byte(
    run_worker, session_id
):
    entered, go = asyncio.Event(), asyncio.Event()
    registry = register_builtins(ToolRegistry())

    async def wait_for_go() -> str:
        """Wait until the operator says go.

        Args: none.
        """
        entered.set()
        await asyncio.wait_for(go.wait(), 30)
        return "go"

    registry.register(wait_for_go)
    model = PromptRecorder()
    config = SessionConfig()
    async with run_worker(model, registry=registry, config=config, memory=False) as hermes:  # reads every model request: no memory extraction calls
        assert (await hermes.send_message(session_id, "first")).reply == "ok 1"
        turn = asyncio.create_task(hermes.send_message(session_id, "second"))
        try:
            await asyncio.wait_for(entered.wait(), 30)
            await hermes.set_system_prompt(session_id, NEW_PROMPT)
            await eventually(
                lambda: _state_if(hermes, session_id, lambda s: s.system_prompt == NEW_PROMPT), what="the new prompt"
            )
            assert not turn.done()
        finally:
            go.set()
        second = await asyncio.wait_for(turn, 30)
        third = await hermes.send_message(session_id, "third")

    assert (second.reply, third.reply) == ("ok 2", "ok 3")
    old = config.system_prompt
    assert model.system == [(1, 0, old), (2, 0, old), (2, 1, NEW_PROMPT), (3, 0, NEW_PROMPT)]
    assert {p.encode() for *_, p in model.system[:2]} == {old.encode()}
    assert all(p.encode() == NEW_PROMPT.encode() for *_, p in model.system[2:])


@pytest.mark.parametrize("redis_copy", [True, False], ids=["snapshot-in-redis", "snapshot-only-in-the-result"])
async def test_a_session_archived_after_a_short_idle_time_resumes_on_the_next_message_with_its_transcript(
    run_worker, session_id, temporal_client, redis, redis_copy
):
    # The same lifecycle on the real dev server, with timers short enough to pass in
    # seconds of wall time (waited for by polling, never slept). Without the Redis copy
    # the snapshot comes from the final run's result.
    config = SessionConfig(idle_after_seconds=1, archive_after_seconds=2)
    async with run_worker(Echo(), config=config) as hermes:
        assert (await hermes.send_message(session_id, "hello")).reply == "echo: hello"
        assert (await hermes.send_message(session_id, "still there?")).reply == "echo: still there?"

        async def archived() -> bool:
            return (await hermes.handle(session_id).describe()).status == WorkflowExecutionStatus.COMPLETED

        await eventually(archived, what="the session archiving itself")
        final = await temporal_client.get_workflow_handle(session_id, result_type=SessionState).result()
        assert final.status == "archived" and final.snapshot is not None
        assert await redis.exists(SNAPSHOT_KEY.format(session_id=session_id))
        if not redis_copy:
            await redis.delete(SNAPSHOT_KEY.format(session_id=session_id))

        await _resumes_with_its_transcript(hermes, session_id, final)


async def test_one_message_larger_than_the_providers_window_does_not_stop_the_session_answering(run_worker, session_id):
    """The configured window is larger than the provider's real one: the oversized turn
    ends ``context_too_large``; the next turn's refusal folds it into a summary built from
    a request under the refused size (each message cut), and the session answers again."""
    model = Counting(ScriptedModel.from_dict({"turns": [], "fallback": "noted", "max_context_tokens": 1500}))
    async with run_worker(model, config=SessionConfig(summary_max_tokens=100)) as hermes:
        for k in range(1, 3):
            assert (await hermes.send_message(session_id, note(k))).status == "completed"
        huge = " ".join(note(k) for k in range(10, 17))  # about 2,100 tokens
        assert (await hermes.send_message(session_id, huge)).status == "context_too_large"
        for k in range(3):
            result = await hermes.send_message(session_id, f"hello {k}")
            assert (result.status, result.reply) == ("completed", "noted")
        summaries = [c for c in model.calls if c[2] == "summary"]
        assert summaries and all(c[3] == "ok" for c in summaries)
        assert len(model.calls) < 14  # one compaction and one retry per refusal, no loop
        transcript = await hermes.get_transcript(session_id)
        assert huge in [m.content for m in transcript]  # kept in the session, only summarised for the model


class SlowSummaries:
    """Answers at once; a summary request waits until :attr:`release` is set."""

    name = "test"

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.summaries_started = 0

    async def complete(self, request: CallModelInput) -> CallModelResult:
        if request.purpose == "summary":
            self.summaries_started += 1
            await asyncio.wait_for(self.release.wait(), 60)
            return summary_result(request)
        return reply_result(f"ok {request.turn}", request)


async def test_a_slow_summary_never_holds_up_a_continue_as_new_or_the_messages_behind_it(run_worker, session_id):
    config = SessionConfig(
        context_history_turns=1, summary_every_turns=1, context_recent_messages=2, max_updates_per_run=4
    )
    model = SlowSummaries()
    async with run_worker(model, config=config) as hermes:
        for n in range(1, 5):
            assert (await hermes.send_message(session_id, f"m{n}")).reply == f"ok {n}"
        assert model.summaries_started >= 1
        # The run is due to continue as new while a summary is still running: after a
        # 5 s grace it is cancelled (the next run summarises again) and the message taken.
        started = time.monotonic()
        fifth = await hermes.send_message(session_id, "m5", busy_timeout_seconds=30)
        assert fifth.reply == "ok 5" and time.monotonic() - started < 12
        state = await hermes.get_state(session_id)
        assert state.run_index >= 1 and state.turn_count == 5
        model.release.set()
        transcript = await hermes.get_transcript(session_id)
        assert [m.content for m in transcript if m.role == "user"] == [f"m{n}" for n in range(1, 6)]
