"""Edge cases of the tool layer, of the kind reported against agent frameworks: what models
really send (duplicate ids, many calls, deep or huge arguments), what tools really return
or raise (lone surrogates, deep data, ``SystemExit``), approvals decided twice, late, for
unknown ids or cut short by a cancel, composites and fallbacks that fail, routing of huge
messages, and the CLI with bad settings.

Each test checks the same things: the session stays usable, every tool call gets exactly
one result, nothing runs twice, and the error says precisely what was wrong. Real Temporal
and Redis from the suite's fixtures; only the model is scripted.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Awaitable
from pathlib import Path
from typing import Any, TypeVar

import pytest
from temporalio.contrib.pydantic import pydantic_data_converter

from hermes.errors import ConfigError, ToolFailure, ToolRegistrationError
from hermes.models import (
    ApprovalPolicy,
    CallModelInput,
    CallModelResult,
    Message,
    RunToolInput,
    SessionConfig,
    ToolCall,
    ToolGroup,
    ToolResult,
    ToolResultCode,
    ToolSpec,
)
from hermes.providers.base import parse_tool_call
from hermes.tools.builtin import register_builtins
from hermes.tools.files import register_tool_file
from hermes.tools.registry import ToolRegistry
from hermes.tools.routing import route_groups

from activities.tools import (
    MAX_RESULT_NESTING,
    TRUNCATED_PREVIEW_CHARS,
    ToolActivities,
    cap_result,
    idempotency_key,
    to_tool_result,
)
from activities.call_lease import STARTED_LEASE_SECONDS, running_lease_key
from tests.support import eventually

T = TypeVar("T")
REPO = Path(__file__).resolve().parents[1]


# ------------------------------------------------------------------ helpers


class Calls:
    """A scripted model: the first steps of the first turn are ``steps`` (lists of ToolCall
    objects, sent verbatim, so ids can be duplicated or empty), those of later turns
    ``later`` (default: the same); then it replies with the codes of the turn's results."""

    name = "calls"

    def __init__(self, *steps: list[ToolCall], later: list[list[ToolCall]] | None = None) -> None:
        self.steps = steps
        self.later = later

    async def complete(self, request: CallModelInput) -> CallModelResult:
        last_user = max(i for i, m in enumerate(request.messages) if m.role == "user")
        index = sum(1 for m in request.messages[last_user:] if m.role == "assistant")
        steps = self.steps if self.later is None or request.turn <= 1 else self.later
        if index < len(steps):
            calls = [c.model_copy() for c in steps[index]]
            return CallModelResult(message=Message(role="assistant", tool_calls=calls), provider=self.name)
        codes = [json.loads(m.content or "{}").get("code") for m in request.messages[last_user:] if m.role == "tool"]
        return CallModelResult(
            message=Message(role="assistant", content="codes=" + ",".join(str(c) for c in codes)), provider=self.name
        )


def call(name: str, tool_call_id: str | None = None, **arguments: Any) -> ToolCall:
    return ToolCall(tool_call_id=tool_call_id or f"call_{uuid.uuid4().hex[:8]}", name=name, arguments=arguments)




async def bounded(awaitable: Awaitable[T], seconds: float = 25.0) -> T:
    """A reply within ``seconds``: a stuck workflow task fails the test instead of hanging it."""
    return await asyncio.wait_for(awaitable, timeout=seconds)


def one_result_per_call(transcript: list[Message]) -> None:
    calls = [c.tool_call_id for m in transcript for c in m.tool_calls]
    answers = [m.tool_call_id for m in transcript if m.role == "tool"]
    assert answers == calls, f"calls {calls} answered by {answers}"
    assert len(set(calls)) == len(calls), f"tool call ids are not unique: {calls}"


async def pending_count(hermes: Any, session_id: str, count: int) -> Any:
    try:
        pending = await hermes.get_pending_approvals(session_id)
    except Exception:  # noqa: BLE001 - the session may not exist yet
        return None
    return pending if len(pending) >= count else None


async def decisions(hermes: Any, session_id: str, count: int) -> Any:
    state = await hermes.get_state(session_id)
    return state if len(state.decisions) >= count else None


def admin_registry(runs: list[str]) -> ToolRegistry:
    registry = register_builtins(ToolRegistry())

    def delete_account(account_id: str) -> str:
        """Delete a customer account and all its data. Irreversible.

        Args:
            account_id: the account to delete.
        """
        runs.append(account_id)
        return f"deleted {account_id}"

    registry.register(delete_account, permission="admin", idempotency="none")
    return registry


# ------------------------------------------------------------------ what models send


async def test_duplicate_and_empty_tool_call_ids_in_one_step_each_get_their_own_result(run_worker, session_id):
    runs: list[str] = []

    def count(label: str) -> str:
        """Count a run.

        Args:
            label: what to count.
        """
        runs.append(label)
        return label

    registry = ToolRegistry()
    registry.register(count)
    model = Calls([call("count", "call_0", label="a"), call("count", "call_0", label="b"), call("count", "", label="c")])
    async with run_worker(model, registry=registry) as hermes:
        result = await bounded(hermes.send_message(session_id, "count", user_id="alice"))
        transcript = await hermes.get_transcript(session_id)
    assert result.reply == "codes=0,0,0"
    assert sorted(runs) == ["a", "b", "c"]
    assert [r.result.data for r in result.tool_calls] == ["a", "b", "c"]
    one_result_per_call(transcript)


async def test_thirty_calls_in_one_step_run_once_each_in_order(run_worker, session_id):
    runs: list[int] = []

    def square(n: int) -> int:
        """Square a number.

        Args:
            n: the number.
        """
        runs.append(n)
        return n * n

    registry = ToolRegistry()
    registry.register(square)
    model = Calls([call("square", n=str(i)) for i in range(30)])
    async with run_worker(model, registry=registry) as hermes:
        result = await bounded(hermes.send_message(session_id, "squares", user_id="alice"))
        transcript = await hermes.get_transcript(session_id)
    assert result.reply == "codes=" + ",".join(["0"] * 30)
    assert sorted(runs) == list(range(30))
    assert [r.result.data for r in result.tool_calls] == [i * i for i in range(30)]
    one_result_per_call(transcript)


async def test_arguments_nested_too_deep_are_a_code_1_result_and_the_session_stays_usable(run_worker, session_id):
    deep: Any = "bottom"
    for _ in range(250):
        deep = {"a": deep}

    def store(value: dict) -> str:
        """Store a document.

        Args:
            value: the document.
        """
        return "stored"

    registry = ToolRegistry()
    registry.register(store)
    model = Calls([call("store", value=deep)])
    async with run_worker(model, registry=registry) as hermes:
        result = await bounded(hermes.send_message(session_id, "store it", user_id="alice"))
        transcript = await hermes.get_transcript(session_id)
    assert result.tool_calls[0].result.code == ToolResultCode.BAD_ARGUMENTS
    assert "nested" in result.tool_calls[0].result.message
    one_result_per_call(transcript)


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("[1, 2]", "expected a JSON object"),
        ('"{\\"a\\": 1}"', "expected a JSON object"),  # double-encoded: a string holding JSON
        ("{'a': 1}", "expected a JSON object"),
        ('{"n": ' + "9" * 5000 + "}", "expected a JSON object"),  # past Python's int-digits limit
        ("[" * 100_000 + "]" * 100_000, "expected a JSON object"),  # past the recursion limit
    ],
    ids=["list", "double-encoded", "python-repr", "huge-integer", "deep-nesting"],
)
def test_argument_text_that_is_not_a_json_object_is_kept_as_an_arguments_error(raw, expected):
    parsed = parse_tool_call("call_1", "calculate", raw)
    assert parsed.arguments == {}
    assert parsed.arguments_error is not None and expected in parsed.arguments_error
    assert len(parsed.arguments_error) < 400


async def test_unicode_emoji_and_special_tokens_in_arguments_reach_the_tool_unchanged(run_worker, session_id):
    seen: list[str] = []
    text = "héllo 😀 <|endoftext|> \u202e ${HOME} {{x}} 你好 \x00"

    def echo(text: str) -> str:
        """Echo text.

        Args:
            text: anything.
        """
        seen.append(text)
        return text

    registry = ToolRegistry()
    registry.register(echo)
    async with run_worker(Calls([call("echo", text=text)]), registry=registry) as hermes:
        result = await bounded(hermes.send_message(session_id, "echo", user_id="alice"))
    assert seen == [text]
    assert result.tool_calls[0].result.data == text


# ------------------------------------------------------------------ what tools return or raise


def test_a_tool_result_with_lone_surrogates_becomes_one_serializable_result():
    # os.listdir / os.fsdecode give lone surrogates for file names that are not UTF-8.
    name = os.fsdecode(b"report-\xff.txt")
    result = cap_result(to_tool_result({"files": [name], name: 1}), 64_000)
    payloads = asyncio.run(pydantic_data_converter.encode([result]))
    assert payloads
    assert "report-" in result.data["files"][0]


def test_a_deeply_nested_tool_result_is_cut_to_a_preview_rather_than_failing():
    deep: Any = 1
    for _ in range(400):
        deep = [deep]
    result = cap_result(to_tool_result(deep), 64_000)
    assert asyncio.run(pydantic_data_converter.encode([result]))
    assert result.ok


async def test_a_tool_returning_an_undecodable_file_name_runs_once_and_succeeds(run_worker, session_id):
    runs: list[str] = []

    def list_files() -> list[str]:
        """The files in the inbox folder."""
        runs.append("run")
        return ["ok.txt", os.fsdecode(b"caf\xe9.txt")]

    registry = ToolRegistry()
    registry.register(list_files)
    async with run_worker(Calls([call("list_files")]), registry=registry) as hermes:
        result = await bounded(hermes.send_message(session_id, "files?", user_id="alice"))
    assert runs == ["run"], f"the tool ran {len(runs)} times"
    assert result.reply == "codes=0"
    assert result.tool_calls[0].result.data[0] == "ok.txt"


@pytest.mark.parametrize("raised", [SystemExit(2), KeyboardInterrupt(), asyncio.CancelledError()], ids=lambda e: type(e).__name__)
async def test_a_non_idempotent_tool_raising_a_base_exception_runs_once_and_the_session_stays_usable(
    run_worker, session_id, raised
):
    runs: list[str] = []

    async def send_sms(text: str) -> str:
        """Send a text message.

        Args:
            text: the message.
        """
        runs.append(text)
        raise raised

    registry = register_builtins(ToolRegistry())
    registry.register(send_sms, idempotency="none")
    config = SessionConfig(approval_policies={"read": ApprovalPolicy(action="run"), "write": ApprovalPolicy(action="run"), "admin": ApprovalPolicy(action="approve")})
    model = Calls([call("send_sms", text="hi"), call("calculate", expression="6*7")], later=[[call("calculate", expression="1")]])
    async with run_worker(model, registry=registry, config=config) as hermes:
        result = await bounded(hermes.send_message(session_id, "text", user_id="alice"))
        again = await bounded(hermes.send_message(session_id, "text again", user_id="alice"))
        transcript = await hermes.get_transcript(session_id)
    assert runs == ["hi"], f"the non-idempotent tool ran {len(runs)} times"
    first = result.tool_calls[0].result
    assert first.code in (ToolResultCode.DEPENDENCY_UNAVAILABLE, ToolResultCode.OUTCOME_UNKNOWN)
    assert result.tool_calls[1].result.ok
    assert again.status == "completed"
    one_result_per_call(transcript)


@pytest.mark.timeout(90)
async def test_a_non_idempotent_call_whose_heartbeats_were_late_finishes_once_and_its_retry_gets_its_result(
    run_worker, session_id, redis, monkeypatch
):
    """Issue 31: a busy worker (the heartbeats of the call's first attempt never leave it:
    a starved process) is not a dead one. Temporal times the attempt out and retries it;
    the retry finds the call started with a live lease, waits, and returns the result of
    the one run: never "outcome unknown" for a call that ran, never a second run."""
    from temporalio import activity

    from activities import heartbeat as heartbeat_module

    real = heartbeat_module.heartbeat_sender

    def lossy() -> Any:
        info = activity.info()
        if info.activity_type == "run_tool" and info.attempt == 1:
            return lambda: None
        return real()

    monkeypatch.setattr(heartbeat_module, "heartbeat_sender", lossy)
    runs: list[str] = []

    async def charge_card(amount: int) -> str:
        """Charge the customer's card.

        Args:
            amount: in cents.
        """
        runs.append(str(amount))
        await asyncio.sleep(3)  # three 1 s heartbeat timeouts without a heartbeat
        return f"charged {amount}"

    registry = register_builtins(ToolRegistry())
    registry.register(charge_card, idempotency="none")
    config = SessionConfig(approval_policies={"read": ApprovalPolicy(action="run"), "write": ApprovalPolicy(action="run"), "admin": ApprovalPolicy(action="run")})
    async with run_worker(Calls([call("charge_card", amount=500)]), registry=registry, config=config) as hermes:
        result = await bounded(hermes.send_message(session_id, "charge it", user_id="alice"), 60)
        again = await bounded(hermes.send_message(session_id, "and again", user_id="alice"), 60)
    assert runs == ["500", "500"], f"each turn's call must run exactly once, ran {runs}"
    for turn in (result, again):
        record = turn.tool_calls[0].result
        assert record.code == ToolResultCode.OK, record.message
        assert record.data == "charged 500"
        assert turn.reply == "codes=0"


async def test_a_huge_tool_result_is_cut_to_a_preview_and_the_model_still_gets_valid_json(run_worker, session_id):
    def dump() -> str:
        """Dump the whole database."""
        return 'x"' * 2_000_000

    registry = ToolRegistry()
    registry.register(dump)
    async with run_worker(Calls([call("dump")]), registry=registry) as hermes:
        result = await bounded(hermes.send_message(session_id, "dump", user_id="alice"))
        transcript = await hermes.get_transcript(session_id)
    record = result.tool_calls[0].result
    assert record.ok and record.data["truncated"] is True
    assert "result truncated" in record.message
    (tool_message,) = [m for m in transcript if m.role == "tool"]
    json.loads(tool_message.content or "")  # what the model reads is still one JSON object


# ------------------------------------------------------------------ approvals


async def test_second_late_and_unknown_decisions_change_nothing_and_are_audited(run_worker, session_id):
    runs: list[str] = []
    policies = SessionConfig().approval_policies | {"admin": ApprovalPolicy(action="approve", timeout_seconds=60)}
    model = Calls([call("delete_account", account_id="acc-1")])
    async with run_worker(model, registry=admin_registry(runs), config=SessionConfig(approval_policies=policies)) as hermes:
        reply = asyncio.create_task(hermes.send_message(session_id, "delete", user_id="alice"))
        pending = await hermes.wait_for_approval(session_id)
        await hermes.approve(session_id, pending.tool_call_id, approver="bob")
        await hermes.reject(session_id, pending.tool_call_id, approver="carol")  # second decision: ignored
        await hermes.approve(session_id, "call_of_another_session", approver="bob")
        result = await bounded(reply)
        await hermes.reject(session_id, pending.tool_call_id, approver="carol")  # after it ran
        state = await eventually(lambda: decisions(hermes, session_id, 4))
    assert runs == ["acc-1"]
    assert result.tool_calls[0].approval == "approved" and result.tool_calls[0].approver == "bob"
    assert [(d.approver, d.outcome) for d in state.decisions] == [
        ("bob", "applied"),
        ("carol", "already_decided"),
        ("bob", "unknown_tool_call"),
        ("carol", "already_decided"),
    ]
    assert not state.pending_approvals


async def test_a_decision_after_expiry_is_already_decided_and_runs_nothing(run_worker, session_id):
    runs: list[str] = []
    policies = SessionConfig().approval_policies | {"admin": ApprovalPolicy(action="approve", timeout_seconds=0.5)}
    model = Calls([call("delete_account", account_id="acc-2")])
    async with run_worker(model, registry=admin_registry(runs), config=SessionConfig(approval_policies=policies)) as hermes:
        result = await bounded(hermes.send_message(session_id, "delete", user_id="alice"))
        tcid = result.tool_calls[0].tool_call_id
        await hermes.approve(session_id, tcid, approver="bob")
        state = await eventually(lambda: decisions(hermes, session_id, 1))
    assert result.tool_calls[0].approval == "expired" and result.tool_calls[0].result.code == ToolResultCode.DENIED_BY_HUMAN
    assert state.decisions[-1].outcome == "already_decided"
    assert runs == []


async def _verdicts(hermes, session_id, count):
    entries = [e for e in await hermes.get_approval_audit(session_id=session_id) if e.event == "verdict"]
    return entries if len(entries) >= count else None


async def test_cancel_during_a_step_with_several_pending_approvals_settles_all_and_runs_none(run_worker, session_id):
    runs: list[str] = []
    model = Calls(
        [
            call("delete_account", account_id="acc-1"),
            call("calculate", expression="1+1"),
            call("delete_account", account_id="acc-2"),
            call("save_note", title="t", text="x"),
        ]
    )
    async with run_worker(model, registry=admin_registry(runs)) as hermes:
        reply = asyncio.create_task(hermes.send_message(session_id, "do it", user_id="alice"))
        await eventually(lambda: pending_count(hermes, session_id, 3))
        await hermes.cancel_turn(session_id)
        result = await bounded(reply)
        transcript = await hermes.get_transcript(session_id)
        state = await hermes.get_state(session_id)
        late = await hermes.list_pending_approvals()
        audit = await eventually(lambda: _verdicts(hermes, session_id, 3))
        follow = Calls([call("calculate", expression="2+2")])
    assert result.status == "cancelled"
    assert runs == []
    assert sorted(e.outcome for e in audit) == ["cancelled"] * 3  # every request has its verdict
    assert not state.pending_approvals and state.status == "active"
    assert all(p.session_id != session_id for p in late)
    assert len(result.tool_calls) == 4
    assert {r.result.code for r in result.tool_calls if r.name != "calculate"} <= {
        ToolResultCode.DENIED_BY_HUMAN,
        ToolResultCode.OUTCOME_UNKNOWN,
    }
    one_result_per_call(transcript)
    async with run_worker(follow, registry=admin_registry(runs)) as hermes:
        after = await bounded(hermes.send_message(session_id, "and now?", user_id="alice"))
    assert after.reply == "codes=0"


async def test_a_free_call_running_when_the_turn_is_cancelled_is_in_the_turn_result_with_an_unknown_outcome(
    run_worker, session_id
):
    # A loaded CI run's cancel caught `calculate` running: its result message was in the
    # transcript but the turn's result listed 3 of its 4 calls.
    runs: list[str] = []
    started = asyncio.Event()

    async def slow_lookup(key: str) -> str:
        """Look a key up, slowly.

        Args:
            key: what to look up.
        """
        started.set()
        await asyncio.sleep(8)
        return f"found {key}"

    registry = admin_registry(runs)
    registry.register(slow_lookup)
    model = Calls([call("delete_account", account_id="acc-9"), call("slow_lookup", key="k1")])
    async with run_worker(model, registry=registry) as hermes:
        reply = asyncio.create_task(hermes.send_message(session_id, "do it", user_id="alice"))
        await eventually(lambda: pending_count(hermes, session_id, 1))
        await bounded(started.wait())
        await hermes.cancel_turn(session_id)
        result = await bounded(reply)
        transcript = await hermes.get_transcript(session_id)
    assert result.status == "cancelled" and runs == []
    assert [(r.name, int(r.result.code)) for r in result.tool_calls] == [
        ("delete_account", int(ToolResultCode.DENIED_BY_HUMAN)), ("slow_lookup", int(ToolResultCode.OUTCOME_UNKNOWN)),
    ]
    assert "cancelled while this tool call ran" in result.tool_calls[1].result.message
    one_result_per_call(transcript)


async def test_close_during_a_pending_approval_denies_it_and_refuses_new_messages(run_worker, session_id):
    runs: list[str] = []
    model = Calls([call("delete_account", account_id="acc-3"), call("delete_account", account_id="acc-4")])
    async with run_worker(model, registry=admin_registry(runs)) as hermes:
        reply = asyncio.create_task(hermes.send_message(session_id, "delete", user_id="alice"))
        await eventually(lambda: pending_count(hermes, session_id, 2))
        await hermes.close(session_id)
        result = await bounded(reply)
        transcript = await hermes.get_transcript(session_id)
        with pytest.raises(Exception) as refused:
            await hermes.send_message(session_id, "hello?", user_id="alice")
    assert runs == []
    assert [r.approval for r in result.tool_calls] == ["cancelled", "cancelled"]
    assert all(r.result.code == ToolResultCode.DENIED_BY_HUMAN for r in result.tool_calls)
    assert "closed" in str(refused.value.__cause__ or refused.value)
    one_result_per_call(transcript)


async def test_close_while_a_tool_runs_stops_the_turn_before_the_next_call_and_the_next_model_step(
    run_worker, session_id
):
    ran: list[str] = []
    started = asyncio.Event()

    async def slow_report(title: str) -> str:
        """Build a report slowly.

        Args:
            title: report title.
        """
        ran.append(title)
        started.set()
        await asyncio.sleep(1.0)
        return "report ready"

    registry = ToolRegistry()
    registry.register(slow_report)
    model = Calls(
        [call("slow_report", title="first"), call("slow_report", title="second")],
        [call("slow_report", title="third")],
    )
    async with run_worker(model, registry=registry) as hermes:
        reply = asyncio.create_task(hermes.send_message(session_id, "reports", user_id="alice"))
        await bounded(started.wait())
        await hermes.close(session_id)
        result = await bounded(reply)
        transcript = await hermes.get_transcript(session_id)
    assert ran == ["first"]
    assert result.status == "closed"
    assert [(r.name, int(r.result.code)) for r in result.tool_calls] == [("slow_report", 0), ("slow_report", 5)]
    assert "closed before this tool call ran" in result.tool_calls[1].result.message
    one_result_per_call(transcript)


async def test_halt_policy_with_two_pending_calls_stays_halted_until_both_are_decided(run_worker, session_id):
    runs: list[str] = []
    policies = SessionConfig().approval_policies | {
        "admin": ApprovalPolicy(action="approve", timeout_seconds=0.5, on_expiry="halt")
    }
    model = Calls([call("delete_account", account_id="acc-5"), call("delete_account", account_id="acc-6")])
    async with run_worker(model, registry=admin_registry(runs), config=SessionConfig(approval_policies=policies)) as hermes:
        reply = asyncio.create_task(hermes.send_message(session_id, "delete", user_id="alice"))
        first, second = await eventually(lambda: pending_count(hermes, session_id, 2))
        await eventually(lambda: _status(hermes, session_id, "halted"), timeout_seconds=20)
        await hermes.approve(session_id, first.tool_call_id, approver="bob")
        # The second call expired meanwhile: the session halts on it in turn.
        state = await eventually(lambda: _halted_on(hermes, session_id, second.tool_call_id), timeout_seconds=20)
        assert [p.tool_call_id for p in state.pending_approvals] == [second.tool_call_id]
        assert runs == ["acc-5"]
        await hermes.reject(session_id, second.tool_call_id, approver="bob")
        result = await bounded(reply)
        state = await hermes.get_state(session_id)
    assert result.reply == "codes=0,5"
    assert runs == ["acc-5"]
    assert state.status == "active" and not state.pending_approvals


async def _status(hermes: Any, session_id: str, status: str) -> Any:
    state = await hermes.get_state(session_id)
    return state if state.status == status else None


async def _halted_on(hermes: Any, session_id: str, tcid: str) -> Any:
    state = await hermes.get_state(session_id)
    pending = [p for p in state.pending_approvals if p.tool_call_id == tcid and p.expired]
    return state if state.status == "halted" and pending and len(state.pending_approvals) == 1 else None


# ------------------------------------------------------------------ composites and fallbacks


def _composite_registry(runs: list[str]) -> ToolRegistry:
    registry = ToolRegistry()

    def find_order(order_id: str) -> dict[str, Any]:
        """Find an order.

        Args:
            order_id: order number.
        """
        runs.append(f"find {order_id}")
        return {"order_id": order_id, "amount_cents": 900}

    def refund(order_id: str, amount_cents: int) -> str:
        """Refund an order.

        Args:
            order_id: order number.
            amount_cents: amount.
        """
        runs.append(f"refund {order_id} {amount_cents}")
        return "refunded"

    registry.register(find_order)
    registry.register(refund, idempotency="none")
    registry.composite(
        "refund_order",
        description="Find an order and refund it.",
        parameters={"type": "object", "properties": {"order_id": {"type": "string"}}, "required": ["order_id"]},
        steps=[
            {"name": "find", "tool": "find_order", "arguments": {"order_id": "$args.order_id"}},
            {"name": "refund", "tool": "refund", "arguments": {"order_id": "$args.order_id", "amount_cents": "$steps.find.data.total"}},
        ],
    )
    registry.check_references()
    return registry


async def test_a_composite_step_referencing_a_missing_field_fails_with_the_reference_named(run_worker, session_id):
    runs: list[str] = []
    config = SessionConfig(approval_policies={"read": ApprovalPolicy(action="run"), "write": ApprovalPolicy(action="run"), "admin": ApprovalPolicy(action="approve")})
    async with run_worker(Calls([call("refund_order", order_id="O-1")]), registry=_composite_registry(runs), config=config) as hermes:
        result = await bounded(hermes.send_message(session_id, "refund O-1", user_id="alice"))
        transcript = await hermes.get_transcript(session_id)
    failure = result.tool_calls[0].result
    assert failure.code == ToolResultCode.DEPENDENCY_UNAVAILABLE
    assert "$steps.find.data.total" in failure.message and "step 2 of 2" in failure.message
    assert runs == ["find O-1"]  # the refund never ran
    one_result_per_call(transcript)


async def test_a_fallback_that_fails_too_reports_both_failures_once(run_worker, session_id):
    runs: list[str] = []

    def rates_primary(currency: str) -> float:
        """Exchange rate, primary provider.

        Args:
            currency: ISO code.
        """
        runs.append("primary")
        raise ConnectionError("primary down")

    def rates_backup(currency: str) -> float:
        """Exchange rate, backup provider.

        Args:
            currency: ISO code.
        """
        runs.append("backup")
        raise TimeoutError("backup down too")

    registry = ToolRegistry()
    registry.register(rates_primary, fallback="rates_backup")
    registry.register(rates_backup)
    async with run_worker(Calls([call("rates_primary", currency="EUR")]), registry=registry) as hermes:
        result = await bounded(hermes.send_message(session_id, "rate", user_id="alice"))
        transcript = await hermes.get_transcript(session_id)
    record = result.tool_calls[0]
    assert record.result.code == ToolResultCode.DEPENDENCY_UNAVAILABLE
    assert "primary down" in record.result.message and "backup down too" in record.result.message
    assert record.fallback == "rates_backup"
    assert runs == ["primary"] * 3 + ["backup"] * 3  # each retried 3 times (idempotent), no more
    one_result_per_call(transcript)


# ------------------------------------------------------------------ routing


def _many_groups() -> tuple[list[ToolGroup], list[ToolSpec]]:
    groups = [ToolGroup(name=f"group{i}", keywords=[f"kw{i}x{j}word" for j in range(8)]) for i in range(30)]
    specs = [
        ToolSpec(name=f"tool_{i}_{j}_thing", description="d", parameters={"type": "object"}, group=f"group{i}")
        for i in range(30)
        for j in range(2)
    ]
    return groups, specs


def test_routing_a_256_kb_message_over_30_groups_stays_far_below_the_workflow_deadlock_limit():
    # Routing runs inside the workflow task; the SDK fails a task that does not yield for 2 s.
    import random
    import string

    rng = random.Random(7)
    words = ["".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(4, 9))) for _ in range(60_000)]
    text = " ".join(words)[: 256 * 1024] + " kw3x1word"
    groups, specs = _many_groups()
    started = time.perf_counter()
    routed = route_groups(text, groups, specs)
    elapsed = time.perf_counter() - started
    assert routed == ["group3"]
    assert elapsed < 0.5, f"routing took {elapsed:.2f} s"


@pytest.mark.parametrize("text", ["😀🎉🔥", "\u200b\u200b", "。。。", "x" * 200_000], ids=["emoji", "zero-width", "cjk-punctuation", "one-long-word"])
def test_routing_a_message_that_matches_nothing_offers_every_tool(text):
    groups, specs = _many_groups()
    assert route_groups(text, groups, specs) is None
    assert route_groups(text, groups, specs, previous=["group2"]) == ["group2"]


async def test_a_huge_message_with_many_tool_groups_gets_a_reply(run_worker, session_id):
    groups, _ = _many_groups()
    registry = ToolRegistry()
    for group in groups:
        registry.add_group(group.name, keywords=group.keywords)

    def ping() -> str:
        """Ping."""
        return "pong"

    registry.register(ping, group="group0")
    import random
    import string

    rng = random.Random(3)
    text = " ".join("".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(4, 9))) for _ in range(40_000))
    text = text[: 250 * 1024]
    async with run_worker(Calls(), registry=registry) as hermes:
        result = await bounded(hermes.send_message(session_id, text, user_id="alice"), 20)
    assert result.reply == "codes="


# ------------------------------------------------------------------ tool files and registration


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def test_a_tool_file_with_yaml_anchors_and_a_literal_dollar_brace_loads(tmp_path):
    path = _write(
        tmp_path,
        "tools.yaml",
        """
tools:
  - name: weather_a
    description: Weather A.
    parameters: &common
      type: object
      properties:
        city: {type: string}
      required: [city]
    http: {method: POST, url: "http://127.0.0.1:1/a", body: {template: "$${not_env}", city: "{city}"}}
  - name: weather_b
    description: Weather B.
    parameters:
      <<: *common
      description: the same, merged
    http: {method: GET, url: "http://127.0.0.1:1/b"}
""",
    )
    registry = ToolRegistry()
    loaded = register_tool_file(registry, path)
    assert [t.name for t in loaded] == ["weather_a", "weather_b"]


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ("tools:\n  - name: t\n    description: d\n    parameters: [1, 2]\n    http: {method: GET, url: 'http://x'}\n", "parameters"),
        ("tools:\n  - name: t\n    description: d\n    parameters: {type: string}\n    http: {method: GET, url: 'http://x'}\n", "object"),
        ("tools:\n  - name: t\n    description: d\n    parameters: {type: object}\n    http: {method: POST, url: 'http://x', body: {k: '${HERMES_EDGE_UNSET_VAR}'}}\n", "HERMES_EDGE_UNSET_VAR"),
        ("tools: {name: t}\n", "tools"),
    ],
    ids=["parameters-list", "parameters-not-object", "unset-env", "tools-not-a-list"],
)
def test_a_wrong_tool_file_is_refused_naming_the_file_and_the_key(tmp_path, body, expected):
    path = _write(tmp_path, "bad.yaml", body)
    with pytest.raises((ConfigError, ToolRegistrationError)) as refused:
        register_tool_file(ToolRegistry(), path)
    message = str(refused.value)
    assert "bad.yaml" in message and expected in message


def test_a_file_tool_named_like_a_code_tool_is_refused_naming_the_file(tmp_path):
    path = _write(
        tmp_path,
        "clash.yaml",
        "tools:\n  - name: calculate\n    description: Another calculator.\n    parameters: {type: object}\n"
        "    http: {method: GET, url: 'http://127.0.0.1:1/calc'}\n",
    )
    registry = register_builtins(ToolRegistry())
    with pytest.raises(ToolRegistrationError) as refused:
        register_tool_file(registry, path)
    assert "clash.yaml" in str(refused.value) and "calculate" in str(refused.value)
    assert registry.get("calculate").source != str(path)  # not shadowed


# ------------------------------------------------------------------ CLI with bad settings


def _cli(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if not k.startswith("HERMES_")} | env
    full["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    full["COLUMNS"] = "200"
    return subprocess.run(
        [sys.executable, "-m", "hermes.cli", *args], env=full, cwd=cwd, capture_output=True, text=True, timeout=60
    )


@pytest.mark.parametrize(
    ("env", "names"),
    [
        ({"HERMES_TIER_QUERY_SECONDS": "fast"}, "HERMES_TIER_QUERY_SECONDS"),
        ({"HERMES_TIER_QUERY_SECONDS": "0"}, "HERMES_TIER_QUERY_SECONDS"),
        ({"HERMES_TIER_BATCH_SECONDS": "-5"}, "HERMES_TIER_BATCH_SECONDS"),
    ],
    ids=["not-a-number", "zero", "negative"],
)
def test_hermes_tools_with_a_bad_tier_setting_says_which_variable_in_one_line(tmp_path, env, names):
    done = _cli(["tools"], env, tmp_path)
    assert done.returncode != 0, done.stdout[-500:]
    assert "Traceback" not in done.stderr and "Traceback" not in done.stdout, done.stderr[-800:]
    assert names.lower() in (done.stderr + done.stdout).lower()


def test_hermes_tools_with_a_tool_module_that_fails_at_import_names_the_module(tmp_path):
    (tmp_path / "edge_broken_tools.py").write_text("raise RuntimeError('boom at import')\n", encoding="utf-8")
    done = _cli(["tools"], {"HERMES_TOOL_MODULES": "edge_broken_tools", "PYTHONPATH": str(tmp_path)}, tmp_path)
    assert done.returncode != 0
    assert "Traceback" not in done.stderr, done.stderr[-800:]
    assert "edge_broken_tools" in done.stderr and "boom at import" in done.stderr


def test_hermes_approvals_with_a_bad_setting_says_which_variable_in_one_line(tmp_path):
    done = _cli(["approvals"], {"HERMES_TEMPORAL_PORT": "seventy"}, tmp_path)
    assert done.returncode != 0
    assert "Traceback" not in done.stderr, done.stderr[-800:]
    assert "temporal_port" in done.stderr.lower()


# ------------------------------------------------------------------ deep results, every path


class DeepOnFirstTurn:
    """Turn 1 calls ``deep``; every turn then answers ``answer <turn>``."""

    name = "test"

    async def complete(self, request: CallModelInput) -> CallModelResult:
        last_user = max(i for i, m in enumerate(request.messages) if m.role == "user")
        if request.turn == 1 and not any(m.role == "tool" for m in request.messages[last_user:]):
            return CallModelResult(message=Message(role="assistant", tool_calls=[call("deep", "deep_1")]), provider=self.name)
        return CallModelResult(message=Message(role="assistant", content=f"answer {request.turn}"), provider=self.name)




def _nested(depth: int) -> Any:
    """``1`` inside exactly ``depth`` levels of alternating objects and lists."""
    data: Any = 1
    for level in range(depth):
        data = {"level": data} if level % 2 else [data]
    return data


def _preview_of(data: Any) -> dict[str, Any]:
    """What a result's data nested deeper than the cap becomes."""
    return {
        "truncated": True,
        "reason": f"nested deeper than {MAX_RESULT_NESTING} levels",
        "preview": json.dumps(data, ensure_ascii=False)[:TRUNCATED_PREVIEW_CHARS],
    }


async def _ledger_records(redis: Any, session_id: str) -> list[dict[str, Any]]:
    """The exactly-once records of ``session_id``'s tool calls, as stored."""
    keys = [k async for k in redis.scan_iter(match=idempotency_key(f"{session_id}:*"))]
    return [json.loads(await redis.get(k)) for k in keys]


async def _four_turns_across_continue_as_new(hermes: Any, session_id: str) -> tuple[Any, list[str], Any, Any]:
    """Turn 1 (``m1``, the deep call), turns 2-4, then ``m1`` sent again (answered from
    the state carried across continue-as-new or from the transcript)."""
    first = await bounded(hermes.send_message(session_id, "call it", client_message_id="m1"))
    later = [(await bounded(hermes.send_message(session_id, f"message {turn}"))).reply for turn in range(2, 5)]
    again = await bounded(hermes.send_message(session_id, "call it", client_message_id="m1"))
    state = await hermes.get_state(session_id)
    return first, later, again, state


@pytest.mark.parametrize("idempotency", ["idempotent", "none"])
@pytest.mark.parametrize("depth", [150, 195, 198, 220, 500])
async def test_a_tool_result_nested_deeper_than_the_cap_keeps_its_code_and_message_and_the_session_survives_continue_as_new(
    run_worker, redis, session_id, depth, idempotency
):
    data = _nested(depth)

    def deep() -> Any:
        """Return data nested very deep.

        Args: none.
        """
        return ToolResult(message="deep data ready", data=data)

    registry = register_builtins(ToolRegistry())
    registry.register(deep, idempotency=idempotency)
    async with run_worker(DeepOnFirstTurn(), registry=registry, config=SessionConfig(max_updates_per_run=2)) as hermes:
        first, later, again, state = await _four_turns_across_continue_as_new(hermes, session_id)
    assert first.reply == "answer 1"
    (record,) = first.tool_calls
    assert (record.result.code, record.result.message) == (ToolResultCode.OK, "deep data ready")
    assert record.result.data == _preview_of(data)
    assert later == ["answer 2", "answer 3", "answer 4"]
    assert state.run_index >= 1 and state.turn_count == 4
    assert again.turn == 1 and again.tool_calls[0].result == record.result
    records = await _ledger_records(redis, session_id)
    if idempotency == "none":
        (stored,) = records
        assert stored["state"] == "done"
        # Decodable by pydantic's JSON parser (the one that stops at 200 levels).
        assert ToolResult.model_validate_json(json.dumps(stored["result"])) == record.result
    else:
        assert records == []


@pytest.mark.parametrize("where", ["check", "tool"])
async def test_a_tool_failure_carrying_data_nested_500_levels_keeps_its_code_and_message_and_is_recorded_done(
    run_worker, redis, session_id, where
):
    data = _nested(500)
    runs: list[str] = []

    def refuse(arguments: Any, context: Any) -> None:
        raise ToolFailure("over the card's limit", code=ToolResultCode.PERMISSION_DENIED, data=data)

    def deep() -> str:
        """Charge a card.

        Args: none.
        """
        runs.append("deep")
        raise ToolFailure("over the card's limit", code=ToolResultCode.PERMISSION_DENIED, data=data)

    registry = register_builtins(ToolRegistry())
    registry.register(deep, idempotency="none", checks=[refuse] if where == "check" else None)
    async with run_worker(DeepOnFirstTurn(), registry=registry, config=SessionConfig(max_updates_per_run=2)) as hermes:
        first, later, again, state = await _four_turns_across_continue_as_new(hermes, session_id)
    (record,) = first.tool_calls
    assert (record.result.code, record.result.message) == (ToolResultCode.PERMISSION_DENIED, "over the card's limit")
    assert record.result.data == _preview_of(data)
    assert later == ["answer 2", "answer 3", "answer 4"] and state.turn_count == 4
    assert again.tool_calls[0].result == record.result
    records = await _ledger_records(redis, session_id)
    if where == "tool":
        # It ran once and its failure was recorded (not left "started": outcome unknown).
        assert runs == ["deep"]
        (stored,) = records
        assert stored["state"] == "done"
        assert ToolResult.model_validate_json(json.dumps(stored["result"])) == record.result
    else:
        assert runs == [] and records == []


@pytest.mark.parametrize("via", ["composite", "fallback"])
async def test_data_nested_500_levels_from_a_composite_step_or_a_fallback_reaches_the_session_as_a_preview(
    run_worker, session_id, via
):
    data = _nested(500)

    def deep_step() -> Any:
        """Return data nested very deep.

        Args: none.
        """
        return data

    def primary_down() -> Any:
        """The primary source, which is down.

        Args: none.
        """
        raise ConnectionError("primary down")

    registry = register_builtins(ToolRegistry())
    if via == "composite":
        registry.register(deep_step)
        registry.composite(
            "deep",
            description="Fetch the deep data twice.",
            parameters={"type": "object", "properties": {}},
            steps=[{"name": "one", "tool": "deep_step"}, {"name": "two", "tool": "deep_step"}],
        )
    else:
        registry.register(deep_step)
        registry.register(primary_down, name="deep", fallback="deep_step")
    registry.check_references()
    async with run_worker(DeepOnFirstTurn(), registry=registry, config=SessionConfig(max_updates_per_run=2)) as hermes:
        first, later, again, state = await _four_turns_across_continue_as_new(hermes, session_id)
    (record,) = first.tool_calls
    assert record.result.ok, record.result
    if via == "composite":
        assert record.result.message == "all 2 steps completed"
        assert record.result.data["result"] == _preview_of(data)
    else:
        assert record.fallback == "deep_step"
        assert record.result.data == _preview_of(data)
    assert later == ["answer 2", "answer 3", "answer 4"] and state.run_index >= 1
    assert again.tool_calls[0].result == record.result


async def test_an_exactly_once_record_nested_too_deep_is_returned_as_a_preview_without_running_the_tool(
    redis, settings
):
    runs: list[str] = []

    def charge() -> str:
        """Charge a card.

        Args: none.
        """
        runs.append("charge")
        return "charged again"

    registry = ToolRegistry()
    registry.register(charge, idempotency="none")
    tools = ToolActivities(registry, redis, tier_seconds=settings.tier_seconds)
    request = RunToolInput(
        session_id=f"session-{uuid.uuid4()}", user_id="u", turn=1, tool_call=call("charge", "c1"), idempotent=False
    )
    data = _nested(220)
    # A record written by a worker from before results were capped.
    done = {"state": "done", "result": {"code": 0, "message": "charged", "data": data}}
    await redis.set(idempotency_key(request.call_key), json.dumps(done))
    result = await tools.run_tool(request)
    assert runs == []
    assert (result.code, result.message, result.data) == (ToolResultCode.OK, "charged", _preview_of(data))
    assert ToolResult.model_validate_json(result.model_dump_json()) == result


def _charging_tools(redis: Any, tmp_path: Path) -> tuple[ToolActivities, RunToolInput, list[int]]:
    """Tool activities over a real Redis and a durable ledger with one non-idempotent
    tool, ``charge``; a call of it; the amounts it ran with."""
    from hermes.infra.durable import DurableStore

    runs: list[int] = []

    def charge(amount: int) -> str:
        """Charge the card.

        Args:
            amount: in cents.
        """
        runs.append(amount)
        return f"charged {amount}"

    registry = ToolRegistry()
    registry.register(charge, idempotency="none")
    tools = ToolActivities(registry, redis, tier_seconds=lambda tier: 30.0, durable=DurableStore(tmp_path))
    request = RunToolInput(
        session_id=f"s-{uuid.uuid4()}", user_id="alice", turn=1, idempotent=False,
        tool_call=ToolCall(tool_call_id="c1", name="charge", arguments={"amount": 500}),
    )
    return tools, request, runs


def _pipelines(monkeypatch: Any, fail: list[str] | None = None) -> list[list[str]]:
    """The commands of every Redis pipeline sent from now on; one made of ``fail`` raises."""
    from redis.asyncio.client import Pipeline

    sent: list[list[str]] = []
    original = Pipeline.execute

    async def execute(self: Any, *args: Any, **kwargs: Any) -> Any:
        commands = [str(command[0][0]).upper() for command in self.command_stack]
        sent.append(commands)
        if commands == fail:
            raise ConnectionError("Redis went away mid-write")
        return await original(self, *args, **kwargs)

    monkeypatch.setattr(Pipeline, "execute", execute)
    return sent


@pytest.mark.timeout(60)
async def test_a_non_idempotent_calls_record_and_the_end_of_its_lease_share_a_round_trip(redis, monkeypatch, tmp_path):
    """Issue 31: a claimed call's "done" record and the drop of its running lease went to
    Redis in two round trips; they go in one, record first. The record holds the result,
    the lease is gone and stays gone (no renewal after it), and a later attempt returns
    the record without running the tool again."""
    import dataclasses
    from datetime import datetime, timedelta, timezone

    from temporalio.testing import ActivityEnvironment

    sent = _pipelines(monkeypatch)
    tools, request, runs = _charging_tools(redis, tmp_path)

    def attempt(number: int) -> ActivityEnvironment:
        env = ActivityEnvironment()
        env.info = dataclasses.replace(
            env.info, attempt=number, started_time=datetime.now(timezone.utc),
            start_to_close_timeout=timedelta(seconds=30), heartbeat_timeout=timedelta(seconds=5),
        )
        return env

    first = await attempt(1).run(tools.run_tool, request)
    assert first.ok and first.data == "charged 500"
    key = idempotency_key(request.call_key)
    assert ["SET", "EVAL"] in sent, sent
    assert json.loads(await redis.get(key))["state"] == "done"
    await asyncio.sleep(0.3)
    assert not await redis.exists(running_lease_key(key)), "the lease outlived its call"
    again = await attempt(2).run(tools.run_tool, request)
    assert (again.data, runs) == ("charged 500", [500])


@pytest.mark.timeout(60)
async def test_a_non_idempotent_calls_lease_is_dropped_even_when_its_record_write_fails_and_a_retry_gets_its_result(
    redis, monkeypatch, tmp_path
):
    """The record and the lease's drop share a round trip; when that write fails, the
    call still answers with its result and its lease is dropped (a later attempt must
    not wait on the lease of a call that ended), and a retry gets the result."""
    _pipelines(monkeypatch, fail=["SET", "EVAL"])
    tools, request, runs = _charging_tools(redis, tmp_path)
    result = await tools.run_tool(request)
    assert result.ok and result.data == "charged 500"
    assert not await redis.exists(running_lease_key(idempotency_key(request.call_key)))
    # Redis kept the claim only ("started"); the durable ledger has the result its holder
    # wrote: a retry answers with it, not "outcome unknown" (issue 31: a retried tool was
    # reported "outcome unknown" though it ran; found by a break-it helper).
    again = await tools.run_tool(request)
    assert (again.code, again.data, runs) == (ToolResultCode.OK, "charged 500", [500])


@pytest.mark.timeout(20)
async def test_an_attempt_refused_the_claim_with_no_lease_held_reports_the_outcome_unknown_at_once(redis, tmp_path):
    """A later attempt whose claim is refused, with no earlier attempt holding the lease
    (its worker died), never waits on a lease (STARTED_LEASE_SECONDS), leaves none behind,
    and does not run the tool again (a break-it review of a claim-and-lease pipeline, not
    kept, found one that waited on its own lease)."""
    tools, request, runs = _charging_tools(redis, tmp_path)
    key = idempotency_key(request.call_key)
    await redis.set(key, json.dumps({"state": "started", "attempt": 1, "tool": "charge"}))
    started = time.monotonic()
    result = await tools.run_tool(request)
    waited = time.monotonic() - started
    assert (result.code, runs) == (ToolResultCode.OUTCOME_UNKNOWN, [])
    assert waited < STARTED_LEASE_SECONDS / 2, f"waited {waited:.1f} s on a lease it set itself"
    assert not await redis.exists(running_lease_key(key))
