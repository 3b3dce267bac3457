"""Token budgets (issue 17): per session and per user per UTC day, enforced in the session
workflow from the usage every model activity returns. The turn that crosses a budget ends
``budget_exceeded`` with a reply that says so; the next day (time-skipping server) the
daily budget allows calls again; usage is in ``get_state`` and ``hermes show``. Real
Temporal (dev server, and the time-skipping one for the day), real Redis for the day's
count."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from hermes.client import HermesClient
from hermes.content.usage import USAGE_KEY, day_total, record
from hermes.models import SessionConfig
from hermes.providers.scripted import ScriptedModel
from hermes.settings import Settings
from hermes.tools.builtin import register_builtins
from hermes.tools.registry import ToolRegistry
from worker import build_worker
from workflows.session.turn import budget_stop

# Every turn: a calculation, then a reply naming its result (two model calls a turn).
SCRIPT = {
    "turns": [
        {
            "match": ".*",
            "steps": [
                {"tool_calls": [{"name": "calculate", "arguments": {"expression": "6*7"}}]},
                {"reply": "The answer is {{ last_tool_result.data }}."},
            ],
        }
    ]
}


@pytest.mark.parametrize(
    ("budget", "used", "day", "day_tokens", "today", "expected"),
    [
        (dict(token_budget=100), 99, "", 0, "2026-12-03", None),
        (dict(token_budget=100), 100, "", 0, "2026-12-03", ("budget_exceeded", False)),
        (dict(user_daily_token_budget=50), 0, "2026-12-03", 50, "2026-12-03", ("budget_exceeded", True)),
        (dict(user_daily_token_budget=50), 0, "2026-12-02", 500, "2026-12-03", None),  # yesterday's count
        (dict(user_daily_token_budget=50), 0, "2026-12-03", 49, "2026-12-03", None),
        ({}, 10**9, "2026-12-03", 10**9, "2026-12-03", None),  # no budget, no limit
    ],
)
def test_budget_stop_names_the_budget_that_is_used(budget: dict[str, int], used: int, day: str, day_tokens: int,
                                                   today: str, expected: tuple[str, bool] | None) -> None:
    stop = budget_stop(SessionConfig(**budget), tokens_used=used, user_day=day, user_day_tokens=day_tokens, today=today)
    assert (None if stop is None else (stop.status, stop.daily)) == expected
    if stop is not None:
        text = stop.reply(SessionConfig())
        assert f"{stop.used:,} of {stop.budget:,} tokens" in text
        assert ("00:00 UTC" in text) == stop.daily


async def test_a_days_count_adds_each_call_once_however_often_it_is_recorded(redis: Any) -> None:
    user = f"u-{uuid.uuid4().hex[:8]}"
    assert await record(redis, user, "2026-12-03", "run-1:1", 30) == 30
    assert await record(redis, user, "2026-12-03", "run-1:1", 30) == 30  # a retried activity
    assert await record(redis, user, "2026-12-03", "run-1:2", 12) == 42
    assert await record(redis, user, "2026-12-04", "run-1:3", 5) == 5
    assert await day_total(redis, user, "2026-12-03") == 42
    assert 0 < await redis.ttl(USAGE_KEY.format(user=user, day="2026-12-03")) <= 3 * 24 * 3600


async def test_the_turn_that_crosses_the_session_budget_ends_with_the_budget_status_and_the_next_is_refused(
        run_worker: Any, session_id: str) -> None:
    config = SessionConfig(token_budget=1)
    async with run_worker(SCRIPT, registry=register_builtins(ToolRegistry()), config=config, memory=False) as hermes:
        first = await hermes.send_message(session_id, "what is 6*7?", user_id="alice")
        state = await hermes.get_state(session_id)
        second = await hermes.send_message(session_id, "and again?", user_id="alice")
        after = await hermes.get_state(session_id)

    # The first model call ran (nothing was used before it) and crossed the budget: its
    # tool call ran, the second call of the turn was not started.
    assert first.status == "budget_exceeded" and [r.name for r in first.tool_calls] == ["calculate"]
    assert "This session has used its token budget" in first.reply
    assert state.token_budget == 1 and state.tokens_used > 1
    assert second.status == "budget_exceeded" and second.tool_calls == []
    assert after.tokens_used == state.tokens_used  # no call was made for the second turn


REPLY_ONLY = {"turns": [{"match": ".*", "steps": [{"reply": "Noted."}]}]}


async def test_the_daily_budget_spans_the_users_sessions_and_allows_calls_again_the_next_day(
        time_skipping_env: Any, redis_url: str, redis: Any, task_queue: str) -> None:
    env = time_skipping_env
    user = f"u-{uuid.uuid4().hex[:8]}"
    settings = Settings(redis_url=redis_url, task_queue=task_queue, temporal_address="unused:0")
    worker = build_worker(env.client, settings, provider=ScriptedModel.from_dict(REPLY_ONLY),
                          registry=register_builtins(ToolRegistry()), redis=redis, memory=False)
    config = SessionConfig(user_daily_token_budget=1)
    s1, s2 = f"s1-{user}", f"s2-{user}"
    async with worker:
        hermes = HermesClient(env.client, task_queue=task_queue, redis=redis, config=config)
        first = await hermes.send_message(s1, "remember the milk", user_id=user)  # crosses it: the reply is kept
        used = await hermes.get_state(s1)
        refused = await hermes.send_message(s1, "and the bread", user_id=user)
        after_refusal = await hermes.get_state(s1)
        # Another session of the user: it knows no count yet, so its one call runs and
        # reports the day's total, both sessions' calls in it.
        other = await hermes.send_message(s2, "hello", user_id=user)
        other_state = await hermes.get_state(s2)
        await env.sleep(24 * 3600)  # skipped: the test server moves its clock a day on
        next_day = await hermes.send_message(s1, "and the bread", user_id=user)
        next_state = await hermes.get_state(s1)

    assert first.status == "completed" and first.reply == "Noted."
    assert used.user_daily_token_budget == 1 and used.user_day_tokens == used.tokens_used > 1
    assert refused.status == "budget_exceeded" and "today's token budget" in refused.reply
    assert after_refusal.tokens_used == used.tokens_used  # no model call was started
    assert other.status == "completed" and other_state.user_day_tokens == used.tokens_used + other_state.tokens_used
    assert next_day.status == "completed" and next_day.reply == "Noted."
    assert next_state.user_day > used.user_day and next_state.user_day_tokens == next_state.tokens_used - used.tokens_used
    assert await day_total(redis, user, used.user_day) == other_state.user_day_tokens


def test_hermes_show_prints_the_usage_against_the_budgets() -> None:
    from hermes.cli.sessions import token_usage
    from hermes.models import SessionState

    state = SessionState.model_construct(tokens_used=1234, token_budget=50_000, user_daily_token_budget=None)
    assert token_usage(state) == "1,234 of 50,000 (session budget)"
    state = SessionState.model_construct(tokens_used=5, token_budget=None, user_daily_token_budget=100, user_day="1999-01-01",
                                         user_day_tokens=99)
    assert token_usage(state) == "5; user today 0 of 100 (daily budget, UTC)"


async def test_a_memory_extractions_model_call_counts_against_the_budgets(run_worker: Any, session_id: str) -> None:
    from tests.support import eventually

    config = SessionConfig(token_budget=10**6, user_daily_token_budget=10**6)
    async with run_worker(REPLY_ONLY, registry=register_builtins(ToolRegistry()), config=config) as hermes:
        result = await hermes.send_message(session_id, "Remember that my favourite colour is green.", user_id="alice")
        trace = await hermes.get_trace(session_id)
        model_tokens = sum(t.tokens for t in trace if t.action_type == "model")

        async def counted() -> Any:
            state = await hermes.get_state(session_id)
            return state if state.tokens_used > model_tokens else None

        state = await eventually(counted, what="the extraction's tokens to be counted", timeout_seconds=120)
    assert result.status == "completed" and model_tokens > 0
    assert state.user_day_tokens >= state.tokens_used  # the day counts the same calls (and any other session's)
