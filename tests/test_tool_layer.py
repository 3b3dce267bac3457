"""The tool layer inside a session, on the real Temporal server and Redis of the suite:
idempotency classes, checks and result codes, approvals as durable objects (policy per
permission, an approver other than the requester, expiry that halts), mixed steps,
argument repair, routing by tool group, composite tools and fallbacks.

The model is a small scripted stand-in defined here; it also records which tools each
model call was offered.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from temporalio.client import Client

from hermes.errors import SessionHaltedError, SessionNotFoundError, ToolFailure
from hermes.models import (
    ApprovalPolicy,
    CallModelInput,
    CallModelResult,
    Message,
    SessionConfig,
    ToolCall,
    ToolResultCode,
)
from hermes.tools.builtin import register_builtins
from hermes.tools.registry import ToolContext, ToolRegistry
from tests.support import eventually



class Steps:
    """Answers every user message with the same steps: each step is a list of
    ``(tool name, arguments)`` calls, or a final reply (a string, or a function of the
    request). Records the names of the tools offered to each model call."""

    name = "steps"

    def __init__(self, *steps: list[tuple[str, dict[str, Any]]] | str | Callable[[CallModelInput], str]) -> None:
        self.steps = steps
        self.offered: list[list[str]] = []

    async def complete(self, request: CallModelInput) -> CallModelResult:
        self.offered.append([t.name for t in request.tools])
        last_user = max(i for i, m in enumerate(request.messages) if m.role == "user")
        index = sum(1 for m in request.messages[last_user:] if m.role == "assistant")
        step = self.steps[min(index, len(self.steps) - 1)]
        if isinstance(step, list):
            calls = [
                ToolCall(tool_call_id=f"call_{uuid.uuid4().hex[:8]}", name=name, arguments=arguments)
                for name, arguments in step
            ]
            return CallModelResult(message=Message(role="assistant", tool_calls=calls), provider=self.name)
        text = step(request) if callable(step) else step
        return CallModelResult(message=Message(role="assistant", content=text), provider=self.name)


def tool_results(request: CallModelInput) -> str:
    """A reply listing the codes of this turn's tool results, in order."""
    last_user = max(i for i, m in enumerate(request.messages) if m.role == "user")
    codes = [json.loads(m.content or "{}").get("code") for m in request.messages[last_user:] if m.role == "tool"]
    return "codes=" + ",".join(str(c) for c in codes)




# ------------------------------------------------------------ idempotency classes


async def test_a_keyed_tool_receives_the_same_key_on_every_attempt_and_is_retried(run_worker, session_id):
    seen: list[tuple[int, str]] = []

    async def charge(amount_cents: int, context: ToolContext) -> dict[str, Any]:
        """Charge the customer's card.

        Args:
            amount_cents: amount in cents.
        """
        seen.append((context.attempt, context.idempotency_key))
        if context.attempt < 3:
            raise ConnectionError("payment gateway reset the connection")
        return {"charged": amount_cents, "key": context.idempotency_key}

    registry = ToolRegistry()
    registry.register(charge, idempotency="keyed", tier="external")
    model = Steps([("charge", {"amount_cents": "1250"})], tool_results)
    async with run_worker(model, registry=registry) as hermes:
        result = await hermes.send_message(session_id, "charge me", user_id="alice")
    assert result.reply == "codes=0"
    assert [attempt for attempt, _ in seen] == [1, 2, 3]
    keys = {key for _, key in seen}
    assert len(keys) == 1
    (key,) = keys
    assert key.startswith(f"{session_id}:") and key.endswith(f":{result.tool_calls[0].tool_call_id}")
    assert result.tool_calls[0].result.data == {"charged": 1250, "key": key}


async def test_a_tool_failure_picks_its_code_and_checks_stop_a_call_before_it_runs(run_worker, session_id):
    ran: list[str] = []

    def no_weekend(arguments: Any, context: ToolContext) -> None:
        if arguments.day in ("saturday", "sunday"):
            raise ValueError(f"day: the office is closed on {arguments.day}; expected a weekday")

    def only_alice(arguments: Any, context: ToolContext) -> None:
        if context.user_id != "alice":
            raise PermissionError(f"user {context.user_id!r} may not book rooms")

    def book_room(day: str) -> str:
        """Book the meeting room.

        Args:
            day: weekday name in lower case.
        """
        ran.append(day)
        return "booked"

    def flaky_inventory() -> str:
        """Stock level of the warehouse."""
        raise ToolFailure("warehouse API refused our credentials", code=ToolResultCode.PERMISSION_DENIED)

    registry = ToolRegistry()
    registry.register(book_room, checks=[no_weekend, only_alice])
    registry.register(flaky_inventory)
    model = Steps(
        [("book_room", {"day": "sunday"}), ("book_room", {"day": "monday"}), ("flaky_inventory", {})], tool_results
    )
    async with run_worker(model, registry=registry) as hermes:
        as_alice = await hermes.send_message(session_id, "book", user_id="alice")
        as_bob = await hermes.send_message(f"{session_id}-bob", "book", user_id="bob")
    assert as_alice.reply == "codes=1,0,3"
    assert "closed on sunday" in as_alice.tool_calls[0].result.message
    assert as_alice.tool_calls[2].result.message == "warehouse API refused our credentials"
    assert as_bob.reply == "codes=1,3,3"
    assert ran == ["monday"]


# ------------------------------------------------------------ approvals


def _registry_with_admin_tool(runs: list[str]) -> ToolRegistry:
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


async def test_an_admin_call_needs_an_approver_other_than_the_requester(run_worker, session_id):
    runs: list[str] = []
    model = Steps([("delete_account", {"account_id": "acc-42"})], tool_results)
    async with run_worker(model, registry=_registry_with_admin_tool(runs)) as hermes:
        reply = asyncio.create_task(hermes.send_message(session_id, "delete my account", user_id="alice"))
        pending = await hermes.wait_for_approval(session_id)
        assert (pending.action, pending.requester, pending.permission) == ("approve", "alice", "admin")
        await hermes.approve(session_id, pending.tool_call_id, approver="alice")
        state = await eventually(lambda: _state_with_decisions(hermes, session_id, 1))
        assert state.decisions[-1].outcome == "not_allowed"
        assert "someone else" in state.decisions[-1].detail
        assert [p.tool_call_id for p in state.pending_approvals] == [pending.tool_call_id]
        assert runs == []
        await hermes.approve(session_id, pending.tool_call_id, approver="bob", reason="verified by phone")
        result = await reply
        state = await hermes.get_state(session_id)
    assert result.reply == "codes=0"
    assert runs == ["acc-42"]
    assert result.tool_calls[0].approval == "approved" and result.tool_calls[0].approver == "bob"
    assert [(d.approver, d.outcome) for d in state.decisions] == [("alice", "not_allowed"), ("bob", "applied")]
    # The audit log (Redis) keeps who asked for what, who decided, when, and the verdict.
    audit = await eventually(lambda: _audit_entries(hermes, session_id, 4))
    assert [(e.event, e.approver, e.outcome) for e in audit] == [
        ("requested", None, ""),
        ("decision", "alice", "not_allowed"),
        ("decision", "bob", "applied"),
        ("verdict", "bob", "approved"),
    ]
    assert audit[0].arguments == {"account_id": "acc-42"} and audit[0].requester == "alice"
    assert audit[2].reason == "verified by phone"
    assert all(e.tool_call_id == pending.tool_call_id for e in audit)
    assert [e.at for e in audit] == sorted(e.at for e in audit)


async def _audit_entries(hermes, session_id: str, count: int):
    entries = await hermes.get_approval_audit(session_id=session_id)
    return entries if len(entries) >= count else None


async def _state_with_decisions(hermes, session_id: str, count: int):
    state = await hermes.get_state(session_id)
    return state if len(state.decisions) >= count else None


async def test_an_expired_approval_with_halt_policy_halts_the_session_until_a_human_acts(run_worker, session_id):
    runs: list[str] = []
    policies = SessionConfig().approval_policies | {
        "admin": ApprovalPolicy(action="approve", timeout_seconds=1.0, on_expiry="halt")
    }
    config = SessionConfig(approval_policies=policies)
    model = Steps([("delete_account", {"account_id": "acc-7"})], tool_results)
    async with run_worker(model, registry=_registry_with_admin_tool(runs), config=config) as hermes:
        reply = asyncio.create_task(hermes.send_message(session_id, "delete", user_id="alice"))
        pending = await hermes.wait_for_approval(session_id)
        state = await eventually(lambda: _halted(hermes, session_id), timeout_seconds=20)
        assert state.pending_approvals[0].expired
        with pytest.raises(SessionHaltedError, match="halted"):
            await hermes.send_message(session_id, "hello?", user_id="alice")
        listed = await eventually(lambda: _listed(hermes, session_id))
        assert listed[0].tool_call_id == pending.tool_call_id and listed[0].expired
        await hermes.reject(session_id, pending.tool_call_id, approver="carol", reason="not today")
        result = await reply
        state = await hermes.get_state(session_id)
        # The session takes messages again (this one asks for the same call: reject it too).
        follow_up = asyncio.create_task(hermes.send_message(session_id, "and now?", user_id="alice"))
        again = await eventually(lambda: _pending_count(hermes, session_id, 1))
        await hermes.reject(session_id, again[0].tool_call_id, approver="carol")
        follow_up_result = await follow_up
    assert result.reply == "codes=5" and "not today" in result.tool_calls[0].result.message
    assert state.status == "active" and not state.pending_approvals
    assert follow_up_result.status == "completed"
    assert runs == []


async def _halted(hermes, session_id):
    state = await hermes.get_state(session_id)
    return state if state.status == "halted" else None


async def _listed(hermes, session_id):
    return [p for p in await hermes.list_pending_approvals() if p.session_id == session_id]


async def test_an_expired_approval_is_denied_by_default(run_worker, session_id):
    runs: list[str] = []
    policies = SessionConfig().approval_policies | {"admin": ApprovalPolicy(action="approve", timeout_seconds=0.5)}
    model = Steps([("delete_account", {"account_id": "acc-8"})], tool_results)
    async with run_worker(model, registry=_registry_with_admin_tool(runs), config=SessionConfig(approval_policies=policies)) as hermes:
        result = await hermes.send_message(session_id, "delete", user_id="alice")
    assert result.reply == "codes=5"
    assert result.tool_calls[0].approval == "expired"
    assert runs == []


async def test_a_denied_permission_is_code_3_without_asking_anyone(run_worker, session_id):
    runs: list[str] = []
    policies = SessionConfig().approval_policies | {"admin": ApprovalPolicy(action="deny")}
    model = Steps([("delete_account", {"account_id": "acc-9"})], tool_results)
    async with run_worker(model, registry=_registry_with_admin_tool(runs), config=SessionConfig(approval_policies=policies)) as hermes:
        result = await hermes.send_message(session_id, "delete", user_id="alice")
    assert result.reply == "codes=3"
    assert runs == []


async def test_a_step_mixing_gated_and_ungated_calls_gets_exactly_one_result_per_call(run_worker, session_id, redis):
    runs: list[str] = []
    model = Steps(
        [
            ("current_time", {"timezone": "UTC"}),
            ("delete_account", {"account_id": "acc-1"}),
            ("calculate", {"expression": "6*7"}),
            ("save_note", {"title": "t", "text": "x"}),
            ("delete_account", {"account_id": "acc-2"}),
        ],
        tool_results,
    )
    async with run_worker(model, registry=_registry_with_admin_tool(runs)) as hermes:
        reply = asyncio.create_task(hermes.send_message(session_id, "do it all", user_id="alice"))
        # Every gated call of the step is put up for decision at once.
        pending = await eventually(lambda: _pending_count(hermes, session_id, 3))
        by_args = {json.dumps(p.arguments, sort_keys=True): p for p in pending}
        await hermes.approve(session_id, by_args['{"account_id": "acc-2"}'].tool_call_id, approver="bob")
        await hermes.reject(session_id, by_args['{"account_id": "acc-1"}'].tool_call_id, approver="bob")
        await hermes.approve(session_id, by_args['{"text": "x", "title": "t"}'].tool_call_id, approver="alice")
        result = await reply
        transcript = await hermes.get_transcript(session_id)
    assert result.reply == "codes=0,5,0,0,0"
    assert [r.name for r in result.tool_calls] == ["current_time", "delete_account", "calculate", "save_note", "delete_account"]
    assert runs == ["acc-2"]
    calls = [c.tool_call_id for m in transcript for c in m.tool_calls]
    answers = [m.tool_call_id for m in transcript if m.role == "tool"]
    assert answers == calls  # one result per call, none missing, none twice, in order


async def _pending_count(hermes, session_id, count):
    try:
        pending = await hermes.get_pending_approvals(session_id)
    except SessionNotFoundError:  # the first message may still be creating the session
        return None
    return pending if len(pending) >= count else None


async def test_a_pending_approval_survives_a_worker_restart_and_a_continue_as_new(
    run_worker, session_id, temporal_client: Client
):
    runs: list[str] = []
    registry = _registry_with_admin_tool(runs)
    config = SessionConfig(max_updates_per_run=1)  # roll over right after this turn
    model = Steps([("delete_account", {"account_id": "acc-5"})], tool_results)
    async with run_worker(model, registry=registry, config=config) as hermes:
        reply = asyncio.create_task(hermes.send_message(session_id, "delete", user_id="alice"))
        pending = await hermes.wait_for_approval(session_id)
        await hermes.approve(session_id, pending.tool_call_id, approver="alice")  # refused: requester
        await eventually(lambda: _state_with_decisions(hermes, session_id, 1))
    # The worker is gone (a deploy): the approval waits in the workflow, not in a process.
    async with run_worker(model, registry=_registry_with_admin_tool(runs), config=config) as hermes:
        still = await hermes.get_pending_approvals(session_id)
        assert [p.tool_call_id for p in still] == [pending.tool_call_id]
        await hermes.approve(session_id, pending.tool_call_id, approver="bob")
        result = await reply
        state = await eventually(lambda: _rolled_over(hermes, session_id))
    assert result.reply == "codes=0" and runs == ["acc-5"]
    assert [(d.approver, d.outcome) for d in state.decisions] == [("alice", "not_allowed"), ("bob", "applied")]


async def _rolled_over(hermes, session_id):
    state = await hermes.get_state(session_id)
    return state if state.run_index >= 1 else None


async def test_a_call_whose_outcome_is_unknown_is_not_run_again_without_a_human(run_worker, session_id, redis):
    attempts: list[str] = []

    async def send_wire(amount: int) -> str:
        """Send a wire transfer.

        Args:
            amount: in euros.
        """
        attempts.append("run")
        if len(attempts) == 1:
            await asyncio.sleep(30)  # the bank never answers the first time
        return "sent"

    registry = ToolRegistry()
    # 5 s: on a loaded machine a 1 s timeout could pass before the function even started.
    registry.register(send_wire, idempotency="none", timeout_seconds=5.0)
    model = Steps([("send_wire", {"amount": 100})], tool_results)
    async with run_worker(model, registry=registry) as hermes:
        first = await hermes.send_message(session_id, "wire 100", user_id="alice")
        assert first.reply == "codes=4" and attempts == ["run"]
        assert any("may or may not have run" in w for w in first.warnings), first.warnings  # (memory may warn too)
        keys = [k async for k in redis.scan_iter(match=f"hermes:toolcall:{session_id}:*")]
        assert len(keys) == 1 and keys[0].decode().endswith(first.tool_calls[0].tool_call_id)
        record = json.loads(await redis.get(keys[0]))
        assert record["state"] == "unknown"
        again = asyncio.create_task(hermes.send_message(session_id, "wire 100 again", user_id="alice"))
        pending = await hermes.wait_for_approval(session_id)
        assert "unknown outcome" in pending.reason
        assert attempts == ["run"]
        await hermes.approve(session_id, pending.tool_call_id, approver="alice")
        second = await again
    assert second.reply == "codes=0" and attempts == ["run", "run"]


# ------------------------------------------------------------ arguments


async def test_bad_arguments_go_back_to_the_model_three_times_then_the_user_is_told(run_worker, session_id):
    model = Steps([("calculate", {"expresion": "1+1"})])
    async with run_worker(model) as hermes:
        result = await hermes.send_message(session_id, "add", user_id="alice")
    assert result.status == "invalid_arguments"
    assert len(result.tool_calls) == 4
    assert all(r.result.code == ToolResultCode.BAD_ARGUMENTS for r in result.tool_calls)
    assert "expresion" in result.tool_calls[0].result.message
    assert "calculate" in result.reply


async def test_a_missing_required_argument_makes_the_agent_ask_the_user(run_worker, session_id):
    registry = ToolRegistry()

    def lookup_order(order_id: str, verbose: bool = False) -> str:
        """Find an order.

        Args:
            order_id: the 18-digit order number from the confirmation e-mail.
            verbose: include the line items.
        """
        return order_id

    registry.register(lookup_order)
    model = Steps([("lookup_order", {"order_id": None, "verbose": "yes"})])
    async with run_worker(model, registry=registry) as hermes:
        result = await hermes.send_message(session_id, "where is my order", user_id="alice")
    first = result.tool_calls[0].result
    assert first.code == ToolResultCode.BAD_ARGUMENTS
    assert first.data["missing"] == ["order_id"] and first.data["ask_user"] is True
    assert "ask the user" in first.message
    assert result.status == "invalid_arguments"
    assert "18-digit order number" in result.reply and "Please tell me" in result.reply


# ------------------------------------------------------------ routing, composite, fallback


def _grouped_registry() -> ToolRegistry:
    registry = register_builtins(ToolRegistry())
    registry.add_group("weather", description="Weather", keywords=["weather", "forecast", "天气", "rain"])
    registry.add_group("orders", description="Orders", keywords=["order", "refund", "订单", "退款"])

    def weather_now(city: str) -> str:
        """Current weather in a city.

        Args:
            city: city name.
        """
        return f"sunny in {city}"

    def weather_forecast(city: str, days: int = 3) -> str:
        """Forecast for a city.

        Args:
            city: city name.
            days: 1 to 7.
        """
        return "rain later"

    def find_order(order_id: str) -> dict[str, Any]:
        """Find an order.

        Args:
            order_id: order number.
        """
        return {"order_id": order_id, "amount": 1999}

    def track_parcel(order_id: str) -> str:
        """Where the parcel of an order is.

        Args:
            order_id: order number.
        """
        return "in transit"

    for fn in (weather_now, weather_forecast):
        registry.register(fn, group="weather")
    registry.register(find_order, group="orders", next_possible_tools=["track_parcel"])
    registry.register(track_parcel, group="billing")
    return registry


async def test_routing_offers_only_the_groups_a_message_is_about(run_worker, session_id):
    model = Steps([("find_order", {"order_id": "A1"})], "done")
    builtins = {"current_time", "calculate", "save_note", "list_notes", "read_stored_content"}
    async with run_worker(model, registry=_grouped_registry(), memory=False) as hermes:  # reads every model request: no memory extraction calls
        weather = await hermes.send_message(session_id, "Will it rain in Paris tomorrow?", user_id="alice")
        follow_up = await hermes.send_message(session_id, "那上海呢?", user_id="alice")
        orders = await hermes.send_message(session_id, "我的订单 A1 到哪了", user_id="alice")
        anything = await hermes.send_message(f"{session_id}-2", "hello there", user_id="alice")
    assert weather.tool_groups == ["weather"]
    assert set(model.offered[0]) == builtins | {"weather_now", "weather_forecast"}
    assert follow_up.tool_groups == ["weather"]
    assert orders.tool_groups == ["orders"]
    # After find_order ran, its next_possible_tools are offered too (track_parcel is in another group).
    offered_after_find = model.offered[5]
    assert "track_parcel" in offered_after_find and "weather_now" not in offered_after_find
    assert anything.tool_groups is None and len(model.offered[-2]) == 9  # nothing matched: every tool


async def test_a_composite_tool_runs_its_steps_in_a_child_workflow(run_worker, session_id, temporal_client: Client, redis):
    calls: list[tuple[str, Any]] = []
    registry = ToolRegistry()

    def cancel_order(order_id: str) -> dict[str, Any]:
        """Cancel an order.

        Args:
            order_id: order number.
        """
        calls.append(("cancel", order_id))
        return {"order_id": order_id, "amount_cents": 4200}

    def refund_payment(order_id: str, amount_cents: int, context: ToolContext) -> dict[str, Any]:
        """Refund a payment.

        Args:
            order_id: order number.
            amount_cents: amount.
        """
        calls.append(("refund", amount_cents))
        return {"refund_id": f"r-{order_id}"}

    def notify_user(text: str) -> str:
        """Tell the user.

        Args:
            text: message.
        """
        calls.append(("notify", text))
        if "FAIL" in text:
            raise ToolFailure("mail server down")
        return "sent"

    registry.register(cancel_order, permission="write")
    registry.register(refund_payment, idempotency="none", permission="write")
    registry.register(notify_user)
    registry.composite(
        "cancel_and_refund",
        description="Cancel an order, refund it and tell the user. Use it when the user wants their money back.",
        parameters={
            "type": "object",
            "properties": {"order_id": {"type": "string"}, "note": {"type": "string"}},
            "required": ["order_id"],
        },
        steps=[
            {"name": "cancel", "tool": "cancel_order", "arguments": {"order_id": "$args.order_id"}},
            {
                "name": "refund",
                "tool": "refund_payment",
                "arguments": {"order_id": "$args.order_id", "amount_cents": "$steps.cancel.data.amount_cents"},
            },
            {"name": "notify", "tool": "notify_user", "arguments": {"text": "$args.note"}},
        ],
    )
    model = Steps([("cancel_and_refund", {"order_id": "O-9", "note": "refunded"})], tool_results)
    async with run_worker(model, registry=registry) as hermes:
        reply = asyncio.create_task(hermes.send_message(session_id, "cancel O-9", user_id="alice"))
        pending = await hermes.wait_for_approval(session_id)
        assert pending.tool_name == "cancel_and_refund" and pending.permission == "write"
        await hermes.approve(session_id, pending.tool_call_id, approver="alice")
        result = await reply
        failing = Steps([("cancel_and_refund", {"order_id": "O-10", "note": "FAIL"})], tool_results)
    async with run_worker(failing, registry=registry, config=SessionConfig(approval_policies={"read": ApprovalPolicy(action="run"), "write": ApprovalPolicy(action="run"), "admin": ApprovalPolicy(action="approve")})) as hermes:
        failed = await hermes.send_message(f"{session_id}-b", "cancel O-10", user_id="alice")
    assert result.reply == "codes=0"
    data = result.tool_calls[0].result.data
    assert [s["step"] for s in data["steps"]] == ["cancel", "refund", "notify"]
    assert data["result"] == "sent"
    assert calls[:3] == [("cancel", "O-9"), ("refund", 4200), ("notify", "refunded")]
    key = f"{session_id}/tool/"
    children = [w async for w in temporal_client.list_workflows(f"WorkflowType = 'CompositeToolWorkflow' AND WorkflowId STARTS_WITH '{key}'")]
    assert len(children) == 1
    failure = failed.tool_calls[0].result
    assert failure.code == ToolResultCode.DEPENDENCY_UNAVAILABLE
    assert "step 3 of 3 (notify: notify_user) failed: mail server down" in failure.message
    assert "cancel, refund" in failure.message


async def test_a_fallback_answers_when_the_primary_is_unavailable(run_worker, session_id):
    registry = ToolRegistry()

    def rates_primary(currency: str) -> float:
        """Exchange rate from the primary provider.

        Args:
            currency: ISO code.
        """
        raise ConnectionError("primary rates API is down")

    def rates_backup(currency: str) -> float:
        """Exchange rate from the backup provider.

        Args:
            currency: ISO code.
        """
        return 7.1

    registry.register(rates_primary, fallback="rates_backup")
    registry.register(rates_backup)
    model = Steps([("rates_primary", {"currency": "cny"})], tool_results)
    async with run_worker(model, registry=registry) as hermes:
        result = await hermes.send_message(session_id, "rate?", user_id="alice")
    record = result.tool_calls[0]
    assert result.reply == "codes=0"
    assert record.fallback == "rates_backup" and record.result.data == 7.1
    assert "primary rates API is down" in record.result.message


def test_an_approval_policy_given_for_one_permission_keeps_the_defaults_of_the_others():
    config = SessionConfig(approval_policies={"admin": ApprovalPolicy(action="deny")})
    assert {p: policy.action for p, policy in config.approval_policies.items()} == {
        "read": "run",
        "write": "confirm",
        "admin": "deny",
    }


async def test_approval_flows_are_deterministic_when_every_workflow_task_replays_from_history(run_worker, session_id):
    """With no workflow cache every task replays the whole history: approvals requested
    together, refused and applied decisions, audit writes, a cancel with approvals still
    pending, and a following turn must emit the same commands as the first time."""
    runs: list[str] = []
    model = Steps(
        [
            ("delete_account", {"account_id": "acc-1"}),
            ("calculate", {"expression": "1+1"}),
            ("save_note", {"title": "t", "text": "x"}),
            ("delete_account", {"account_id": "acc-2"}),
        ],
        tool_results,
    )
    async with run_worker(model, registry=_registry_with_admin_tool(runs), max_cached_workflows=0) as hermes:
        first = asyncio.create_task(hermes.send_message(session_id, "do it", user_id="alice"))
        pending = await eventually(lambda: _pending_count(hermes, session_id, 3))
        by_args = {json.dumps(p.arguments, sort_keys=True): p.tool_call_id for p in pending}
        await hermes.approve(session_id, by_args['{"account_id": "acc-1"}'], approver="alice")  # refused
        await hermes.approve(session_id, by_args['{"account_id": "acc-1"}'], approver="bob")
        await hermes.approve(session_id, "no-such-call", approver="bob")
        await eventually(lambda: _state_with_decisions(hermes, session_id, 3))

        async def approved_call_ran() -> bool:
            return runs == ["acc-1"]

        # The cancel comes after the approved call ran (on a loaded machine it may still
        # be on its way when the decisions are recorded).
        await eventually(approved_call_ran, what="the approved call to run")
        await hermes.cancel_turn(session_id)
        cancelled = await first
        second = asyncio.create_task(hermes.send_message(session_id, "again", user_id="alice"))
        again = await eventually(lambda: _pending_count(hermes, session_id, 3))
        for p in again:  # a confirm is the session's user's; an admin call someone else's
            await hermes.reject(session_id, p.tool_call_id, approver="alice" if p.action == "confirm" else "bob")
        rejected = await second
        audit = await eventually(lambda: _audit_entries(hermes, session_id, 14))
    assert cancelled.status == "cancelled" and runs == ["acc-1"]
    assert rejected.reply == "codes=5,0,5,5"
    assert sum(e.event == "requested" for e in audit) == 6
    assert sum(e.event == "verdict" for e in audit) == 6


@pytest.mark.parametrize("max_cached_workflows", [1000, 0], ids=["cached", "replayed"])
async def test_free_calls_after_a_gated_call_run_while_it_waits_and_results_keep_the_models_order(
    run_worker, session_id, max_cached_workflows
):
    runs: list[str] = []
    registry = _registry_with_marks(runs)
    seen: list[tuple[list[str], list[str]]] = []

    def order(request: CallModelInput) -> str:
        asked = next(m for m in reversed(request.messages) if m.role == "assistant" and m.tool_calls)
        answered = [m.tool_call_id for m in request.messages if m.role == "tool"]
        seen.append(([c.tool_call_id for c in asked.tool_calls], answered))
        return tool_results(request)

    model = Steps([("mark", {"label": "A"}), ("delete_account", {"account_id": "acc-7"}), ("mark", {"label": "B"})], order)
    # With no workflow cache every workflow task replays the history, the concurrent
    # free calls and approval wait included.
    async with run_worker(model, registry=registry, max_cached_workflows=max_cached_workflows) as hermes:
        reply = asyncio.create_task(hermes.send_message(session_id, "mark and delete", user_id="alice"))
        pending = await hermes.wait_for_approval(session_id)
        # B, after the gated call in the step, runs before anyone decides on it.
        await eventually(lambda: _ran(runs, ["A", "B"]), what="B ran", timeout_seconds=20)
        assert not reply.done()
        await hermes.approve(session_id, pending.tool_call_id, approver="bob")
        result = await reply
    assert runs == ["A", "B", "acc-7"]
    assert result.reply == "codes=0,0,0"
    [(asked, answered)] = seen
    assert answered == asked  # tool messages in the order of the assistant's tool_calls: A, G, B
    assert [r.tool_call_id for r in result.tool_calls] == asked


def _registry_with_marks(runs: list[str]) -> ToolRegistry:
    """The admin tool of :func:`_registry_with_admin_tool` and ``mark``, a free tool
    that appends its label to ``runs``."""
    registry = _registry_with_admin_tool(runs)

    def mark(label: str) -> str:
        """Record that this call ran.

        Args:
            label: what to record.
        """
        runs.append(label)
        return label

    registry.register(mark)
    return registry


async def _ran(runs: list[str], expected: list[str]) -> bool | None:
    return True if runs == expected else None


async def test_a_turn_cancelled_while_a_gated_call_waits_answers_every_call_in_the_models_order(run_worker, session_id):
    runs: list[str] = []
    registry = _registry_with_marks(runs)
    model = Steps([("mark", {"label": "A"}), ("delete_account", {"account_id": "acc-8"}), ("mark", {"label": "B"})], tool_results)
    async with run_worker(model, registry=registry) as hermes:
        reply = asyncio.create_task(hermes.send_message(session_id, "mark and delete", user_id="alice"))
        await hermes.wait_for_approval(session_id)
        await eventually(lambda: _ran(runs, ["A", "B"]), what="B ran", timeout_seconds=20)
        await hermes.cancel_turn(session_id, sender="alice")
        result = await reply
        transcript = await hermes.get_transcript(session_id)
    assert result.status == "cancelled" and runs == ["A", "B"]
    [asked] = [m for m in transcript if m.tool_calls]
    answers = [m for m in transcript if m.role == "tool"]
    assert [m.tool_call_id for m in answers] == [c.tool_call_id for c in asked.tool_calls]
    assert "was not run" in (answers[1].content or "")
