"""Limits that keep a session usable: tool-call ids a model reuses, payload budgets,
the transcript archive that keeps continue-as-new under Temporal's 2 MB payload limit."""

from __future__ import annotations

import json
from typing import Any

from activities.transcript import read_archive
from hermes.infra.durable import NOTES
from hermes.models import (
    CallModelInput,
    CallModelResult,
    Message,
    SessionConfig,
    ToolCall,
    ToolResultCode,
)
from hermes.tools.builtin import register_builtins
from hermes.tools.registry import ToolRegistry


class ReusesIds:
    """A model like some OpenAI-compatible servers: every tool call is `call_0`."""

    name = "test"

    def __init__(self, tool: str, arguments: dict[str, Any], calls_per_step: int = 1) -> None:
        self.tool, self.arguments, self.calls_per_step = tool, arguments, calls_per_step

    async def complete(self, request: CallModelInput) -> CallModelResult:
        if request.messages[-1].role == "user":
            calls = [ToolCall(tool_call_id="call_0", name=self.tool, arguments=self.arguments)] * self.calls_per_step
            return CallModelResult(message=Message(role="assistant", tool_calls=calls), provider=self.name)
        results = [json.loads(m.content or "{}") for m in request.messages if m.role == "tool"]
        return CallModelResult(message=Message(role="assistant", content=json.dumps(results[-1])), provider=self.name)


def counting_registry(runs: list[int]) -> ToolRegistry:
    registry = register_builtins(ToolRegistry())

    def bump() -> dict[str, int]:
        """Count a side effect.

        Args: none.
        """
        runs.append(1)
        return {"n": len(runs)}

    registry.register(bump, idempotent=False, permission="read")
    return registry


async def test_a_tool_call_id_the_model_reuses_across_turns_still_runs_the_call_again(run_worker, session_id):
    runs: list[int] = []
    async with run_worker(ReusesIds("bump", {}), registry=counting_registry(runs)) as hermes:
        first = await hermes.send_message(session_id, "bump")
        second = await hermes.send_message(session_id, "bump again")
        assert [r.result.data for r in first.tool_calls + second.tool_calls] == [{"n": 1}, {"n": 2}]
        assert len(runs) == 2
        ids = [c.tool_call_id for m in await hermes.get_transcript(session_id) for c in m.tool_calls]
        assert len(ids) == len(set(ids)) == 2


async def test_duplicate_tool_call_ids_in_one_step_each_run_and_each_get_one_result(run_worker, session_id):
    runs: list[int] = []
    async with run_worker(ReusesIds("bump", {}, calls_per_step=3), registry=counting_registry(runs)) as hermes:
        result = await hermes.send_message(session_id, "bump thrice")
        assert [r.result.data for r in result.tool_calls] == [{"n": 1}, {"n": 2}, {"n": 3}]
        transcript = await hermes.get_transcript(session_id)
        call_ids = [c.tool_call_id for m in transcript for c in m.tool_calls]
        result_ids = [m.tool_call_id for m in transcript if m.role == "tool"]
        assert call_ids == result_ids and len(set(call_ids)) == 3


async def test_a_write_call_with_a_reused_id_can_be_approved_in_every_turn(run_worker, session_id, redis):
    import asyncio

    model = ReusesIds("save_note", {"title": "t", "text": "x"})
    async with run_worker(model) as hermes:
        for n in (1, 2):
            turn = asyncio.create_task(hermes.send_message(session_id, f"note {n}", user_id="reuser"))
            pending = await hermes.wait_for_approval(session_id)
            await hermes.approve(session_id, pending.tool_call_id, approver="reuser")
            result = await turn
            assert result.tool_calls[0].approval == "approved"
            assert result.tool_calls[0].result.code == ToolResultCode.OK
        state = await hermes.get_state(session_id)
        assert [d.outcome for d in state.decisions] == ["applied", "applied"]
        assert len(await hermes.durable.list(NOTES, owner="reuser")) == 2


class BigResults:
    """Calls `fetch_page` (300 KB result) once per turn, then answers with a short text."""

    name = "test"

    def __init__(self) -> None:
        self.largest_request_bytes = 0

    async def complete(self, request: CallModelInput) -> CallModelResult:
        self.largest_request_bytes = max(self.largest_request_bytes, len(request.model_dump_json()))
        if request.messages[-1].role == "user":
            call = ToolCall(tool_call_id=f"f{request.turn}", name="fetch_page", arguments={})
            return CallModelResult(message=Message(role="assistant", tool_calls=[call]), provider=self.name)
        return CallModelResult(message=Message(role="assistant", content=f"read page {request.turn}"), provider=self.name)


def page_registry() -> ToolRegistry:
    registry = register_builtins(ToolRegistry())

    def fetch_page() -> dict[str, str]:
        """Fetch a large web page.

        Args: none.
        """
        return {"html": "<p>网页 🌏</p>" * 20_000}

    registry.register(fetch_page)
    return registry


async def test_large_tool_results_are_cut_to_a_preview_and_the_session_keeps_continuing_as_new(
    run_worker, session_id, redis, temporal_client
):
    model = BigResults()
    # (Kept by reference, each result leaves a ~7 KB preview in the transcript.)
    config = SessionConfig(max_updates_per_run=2, max_carry_bytes=20_000)
    async with run_worker(model, registry=page_registry(), config=config) as hermes:
        for n in range(1, 9):
            result = await hermes.send_message(session_id, f"read page {n}")
            assert result.reply == f"read page {n}"
            data = result.tool_calls[0].result
            assert data.data["truncated"] is True and "truncated" in data.message
        state = await hermes.get_state(session_id)
        assert state.run_index >= 3 and state.turn_count == 8
        assert state.archived_messages > 0
        archived = await read_archive(redis, session_id, state.chain_id)
        live = await hermes.get_transcript(session_id, include_archived=False)
        # Whole turns are archived, so turn numbers join the two without overlap (the
        # archive may run ahead of a state read just before a continue-as-new).
        assert len(archived) >= state.archived_messages
        whole = [m for m in archived if m.turn < live[0].turn] + live
        assert [m.content for m in whole if m.role == "user"] == [f"read page {n}" for n in range(1, 9)]
        assert await hermes.get_transcript(session_id, include_archived=True) == whole
        assert model.largest_request_bytes < 1_000_000


class Echo:
    name = "test"

    def __init__(self) -> None:
        self.largest_request_bytes = 0

    async def complete(self, request: CallModelInput) -> CallModelResult:
        self.largest_request_bytes = max(self.largest_request_bytes, len(request.model_dump_json().encode()))
        text = request.messages[-1].content or ""
        return CallModelResult(message=Message(role="assistant", content=f"got {len(text)} chars"), provider=self.name)


async def test_many_large_messages_never_make_a_model_call_exceed_the_payload_limit(run_worker, session_id):
    model = Echo()
    # A window that takes each message whole (~80k tokens), so they are sent inline.
    async with run_worker(model, config=SessionConfig(context_window_tokens=1_000_000)) as hermes:
        for n in range(9):
            text = f"{n}" + "长" * 80_000  # 240 KB of UTF-8, under the 256 KB message limit
            result = await hermes.send_message(session_id, text)
            assert result.reply == f"got {len(text)} chars"
        assert model.largest_request_bytes < 2_000_000
        assert (await hermes.get_state(session_id)).turn_count == 9


async def test_a_turn_too_large_for_the_context_window_ends_clearly_and_the_session_goes_on(run_worker, session_id):
    config = SessionConfig(context_window_tokens=5_000)
    async with run_worker(Echo(), config=config) as hermes:
        hermes.redis = hermes.durable = None  # a client without a content store sends it inline
        too_big = await hermes.send_message(session_id, "x " * 30_000)
        assert too_big.status == "context_too_large"
        assert "4000 tokens" in too_big.reply  # the budget: the window less the 20% reserve
        ok = await hermes.send_message(session_id, "small")
        assert (ok.status, ok.reply) == ("completed", "got 5 chars")


async def test_a_tool_returning_data_json_cannot_carry_is_reported_as_done_and_runs_once(run_worker, session_id):
    import datetime

    runs: list[int] = []
    registry = register_builtins(ToolRegistry())

    class Receipt:
        def __str__(self) -> str:
            return "receipt #7"

    def pay() -> dict[str, Any]:
        """Pay an invoice.

        Args: none.
        """
        runs.append(1)
        return {"at": datetime.datetime(2026, 1, 2, 3, 4, 5), "ids": {7}, "raw": b"\xff", "receipt": Receipt()}

    registry.register(pay, idempotent=False, permission="read")
    async with run_worker(ReusesIds("pay", {}), registry=registry) as hermes:
        result = await hermes.send_message(session_id, "pay it")
        record = result.tool_calls[0].result
        assert record.code == ToolResultCode.OK
        assert record.data == {"at": "2026-01-02T03:04:05", "ids": [7], "raw": "_w==", "receipt": "receipt #7"}
        assert runs == [1]


class ArgsOnce:
    """Turn 2 calls `bump` with ~1.3 MB of arguments; otherwise answers plainly."""

    name = "test"

    async def complete(self, request: CallModelInput) -> CallModelResult:
        last = request.messages[-1]
        if last.role == "user" and last.content == "big":
            call = ToolCall(tool_call_id="big_1", name="echo_size", arguments={"blob": "x" * 1_300_000})
            return CallModelResult(message=Message(role="assistant", tool_calls=[call]), provider=self.name)
        return CallModelResult(message=Message(role="assistant", content=f"ok {request.turn}"), provider=self.name)


async def test_a_turn_with_huge_tool_arguments_does_not_wedge_the_next_continue_as_new(run_worker, session_id):
    registry = register_builtins(ToolRegistry())

    def echo_size(blob: str) -> int:
        """Size of a blob.

        Args:
            blob: any text.
        """
        return len(blob)

    registry.register(echo_size)
    async with run_worker(ArgsOnce(), registry=registry, config=SessionConfig(max_updates_per_run=2)) as hermes:
        await hermes.send_message(session_id, "one")
        big = await hermes.send_message(session_id, "big")
        for n in range(3, 7):
            assert (await hermes.send_message(session_id, f"msg {n}")).reply == f"ok {n}"
        state = await hermes.get_state(session_id)
        assert state.run_index >= 2
        # The tool got the whole 1.3 MB; the session (and every state it carried across
        # continue-as-new) held only a stand-in of 64 KB at most.
        assert big.tool_calls[0].result.data == 1_300_000
        stand_in = big.tool_calls[0].arguments
        assert stand_in["kept_by_reference"].startswith("b:") and stand_in["size_bytes"] > 1_300_000
        assert len(json.dumps(stand_in)) < 64 * 1024


async def test_messages_whose_json_escapes_are_six_times_larger_never_wedge_the_session(run_worker, session_id):
    text = "colored build log:\n" + "\x1b[0m" * 62_000  # 248 KB raw, ~560 KB as JSON
    # ~190k tokens each: a window that takes them, so that only the byte sizes are tested.
    async with run_worker(Echo(), config=SessionConfig(context_window_tokens=2_000_000)) as hermes:
        for _ in range(5):
            result = await hermes.send_message(session_id, text)
            assert result.reply == f"got {len(text)} chars"
        assert (await hermes.get_state(session_id)).turn_count == 5


async def test_a_tool_call_id_reused_after_its_turn_was_archived_still_runs(run_worker, session_id):
    runs: list[int] = []
    config = SessionConfig(max_updates_per_run=2, max_carry_bytes=3000)
    async with run_worker(ReusesIds("bump", {}), registry=counting_registry(runs), config=config) as hermes:
        for n in range(1, 8):
            result = await hermes.send_message(session_id, f"bump {n}")
            assert result.tool_calls[0].result.data == {"n": n}
        assert len(runs) == 7


async def test_a_session_id_reused_after_a_termination_does_not_inherit_exactly_once_records(
    run_worker, session_id, temporal_client
):
    runs: list[int] = []
    async with run_worker(ReusesIds("bump", {}), registry=counting_registry(runs)) as hermes:
        assert (await hermes.send_message(session_id, "bump")).tool_calls[0].result.data == {"n": 1}
        await temporal_client.get_workflow_handle(session_id).terminate("operator reset")
        again = await hermes.send_message(session_id, "bump again")
        assert again.turn == 1 and again.tool_calls[0].result.data == {"n": 2}
        assert len(runs) == 2


class LongReplies:
    name = "test"

    async def complete(self, request: CallModelInput) -> CallModelResult:
        return CallModelResult(message=Message(role="assistant", content=f"{request.turn}:" + "r" * 100_000), provider=self.name)


async def test_a_resend_after_its_cached_reply_was_evicted_is_answered_from_the_transcript(run_worker, session_id):
    # 100 KB replies: the resend cache (512 KB) keeps ~5 of them; the transcript keeps all 8.
    config = SessionConfig(max_updates_per_run=2, max_carry_bytes=1_500_000)
    async with run_worker(LongReplies(), config=config) as hermes:
        first = await hermes.send_message(session_id, "m0", client_message_id="m0")
        for n in range(1, 8):
            await hermes.send_message(session_id, f"m{n}", client_message_id=f"m{n}")
        again = await hermes.send_message(session_id, "m0", client_message_id="m0")
        assert (again.turn, again.reply) == (first.turn, first.reply)
        assert (await hermes.get_state(session_id)).turn_count == 8


async def test_a_system_prompt_over_the_limit_is_refused_and_said_so_in_the_state(run_worker, session_id):
    async with run_worker(Echo()) as hermes:
        await hermes.send_message(session_id, "hi")
        await hermes.set_system_prompt(session_id, "p" * 200_000)
        await hermes.set_system_prompt(session_id, "be brief")
        state = await hermes.get_state(session_id)
        assert state.system_prompt == "be brief"
        refused = [n for n in state.notices if "degraded (" not in n]  # a fallback tokenizer is a notice too
        assert len(refused) == 1 and "200000 bytes refused" in refused[0]


async def test_a_run_whose_transcript_outgrows_the_budget_continues_as_new_and_archives(run_worker, session_id):
    config = SessionConfig(max_carry_bytes=300_000)  # rolls over past 450 KB of transcript
    async with run_worker(LongReplies(), config=config) as hermes:
        for n in range(1, 8):
            await hermes.send_message(session_id, f"m{n}")
        state = await hermes.get_state(session_id)
        assert state.run_index >= 1 and state.archived_messages > 0
        whole = await hermes.get_transcript(session_id, include_archived=True)
        assert [m.content for m in whole if m.role == "user"] == [f"m{n}" for n in range(1, 8)]


async def test_a_message_over_half_the_context_budget_is_kept_by_reference_and_answered(run_worker, session_id):
    import re

    text = "x " * 30_000  # 30k tokens; the budget is 4,000
    async with run_worker(Echo(), config=SessionConfig(context_window_tokens=5_000)) as hermes:
        result = await hermes.send_message(session_id, text)
        assert result.status == "completed"
        first = (await hermes.get_transcript(session_id))[0].content or ""
        assert "kept by reference as b:" in first and len(first) < 5_000
        ref = re.search(r"b:[0-9a-f]{32}", first).group(0)
        assert await hermes.get_stored_content(ref) == text
        assert (await hermes.send_message(session_id, "small")).reply == "got 5 chars"


async def test_a_resend_whose_reply_and_turn_have_left_the_session_is_not_run_again(run_worker, session_id, redis):
    """The reply left the resend cache (one reply kept) and the turn left the state for
    the transcript archive (a tiny carry budget): the session still knows the message id
    across continue-as-new and says it was answered, instead of running it twice."""
    model = Echo()
    config = SessionConfig(max_updates_per_run=2, max_carry_bytes=3000, max_completed_ids=1)
    async with run_worker(model, config=config) as hermes:
        first = await hermes.send_message(session_id, "the first message " + "x" * 1500, client_message_id="m-1")
        for n in range(2, 7):
            await hermes.send_message(session_id, f"message {n} " + "y" * 1500, client_message_id=f"m-{n}")
        state = await hermes.get_state(session_id)
        live = await hermes.get_transcript(session_id, include_archived=False)
        assert state.run_index >= 2 and state.archived_messages > 0
        assert all(m.client_message_id != "m-1" for m in live), "the first turn is still held: nothing to test"
        again = await hermes.send_message(session_id, "the first message " + "x" * 1500, client_message_id="m-1")
        assert again.turn == first.turn and again.reply == ""
        assert any("already answered in turn" in w for w in again.warnings), again.warnings
        transcript = await hermes.get_transcript(session_id)
        assert [m.client_message_id for m in transcript if m.role == "user"].count("m-1") == 1
        assert (await hermes.get_state(session_id)).turn_count == 6  # no seventh turn ran
