"""A turn's start inside its first model call (issue 31, ``CallModelInput.turn_start``):
the worker's listing checked, the memories searched and put into the context exactly as
the session's own context build puts them, and the provider not asked when the tools
changed, the search failed or the memories do not fit.

The real tool layer and the session's context build; the memory search is a stand-in
here (its real path runs through sessions in ``tests/test_memory_session.py``)."""

from __future__ import annotations

import asyncio
from datetime import datetime, timezone
from typing import Any

import pytest

from activities.model import ModelActivities
from activities.tools import ToolActivities
from activities.turn_start import TurnStartActivities
from hermes.content.context import ContextPolicy, build_context
from hermes.content.tokens import BoundedCounter, TokenCounter
from hermes.memory.models import RetrievedMemory, SearchMemoriesInput, SearchMemoriesResult
from hermes.models import CallModelInput, ListToolsInput, Message, TurnStartRequest
from hermes.providers.scripted import ScriptedModel
from hermes.tools.builtin import register_builtins
from hermes.tools.registry import ToolRegistry
from tests.test_memory_session import RecordingModel, _said_bern

ENCODING = "cl100k_base"


class Memory:
    """The memory activities' search as ``TurnStartActivities`` uses it: a fixed result,
    or an error; what it was asked and what it published."""

    def __init__(self, found: list[str] | None = None, error: Exception | None = None, delay: float = 0.0) -> None:
        now = datetime(2026, 12, 1, tzinfo=timezone.utc)
        self.result = SearchMemoriesResult(memories=[
            RetrievedMemory(memory_id=f"m{i}", kind="fact", text=t, updated_at=now, similarity=0.9, score=0.8)
            for i, t in enumerate(found or [])
        ])
        self.error, self.delay = error, delay
        self.searched: list[tuple[SearchMemoriesInput, bool]] = []
        self.published: list[SearchMemoriesResult] = []
        self.events = None

    async def search_quietly(self, inp: SearchMemoriesInput, *, announce: bool = True) -> SearchMemoriesResult:
        self.searched.append((inp, announce))
        await asyncio.sleep(self.delay)
        if self.error is not None:
            raise self.error
        return self.result

    def recall_events(self, inp: SearchMemoriesInput, result: SearchMemoriesResult) -> list[Any]:
        return [result]


def _tools() -> ToolActivities:
    return ToolActivities(register_builtins(ToolRegistry()), None, tier_seconds=lambda tier: 60.0)


def _transcript() -> list[Message]:
    return [
        Message(role="user", content="Hello, I am planning a trip.", turn=1),
        Message(role="assistant", content="Where to?", turn=1),
        Message(role="user", content="Where do I live?", turn=2),
    ]


def _policy(budget: int) -> ContextPolicy:
    """A policy whose budget is ``budget`` tokens."""
    policy = ContextPolicy(window_tokens=budget * 2, reserve_ratio=0.5)
    assert policy.budget == budget
    return policy


def _built(memories: list[str], budget: int) -> tuple[list[Message], int]:
    built = build_context(
        _transcript(), turn=2, system_prompt="You are helpful.", policy=_policy(budget),
        counter=BoundedCounter(TokenCounter.get(ENCODING)), memories=memories,
    )
    return built.messages, built.tokens


async def _call(tools: ToolActivities, memory: Memory | None, *, budget: int = 4000, known: str | None = None) -> Any:
    listing = await tools.list_tools(ListToolsInput(encoding=ENCODING))
    messages, tokens = _built([], budget)
    search = SearchMemoriesInput(user_id="u", query="Where do I live?", session_id="s", turn=2)
    request = CallModelInput(
        session_id="s", turn=2, step=0, messages=messages, context_tokens=tokens, encoding=ENCODING,
        turn_start=TurnStartRequest(
            listing=ListToolsInput(known_ref=known or listing.ref, encoding=ENCODING),
            recall=search if memory is not None else None, budget=budget,
        ),
    )
    starter = TurnStartActivities(tools, memory)  # type: ignore[arg-type]
    sent, outcome = await starter.prepare(request, request)
    memory.published.extend(e for e in starter.recall_events(request, outcome))
    return sent, outcome


async def test_found_memories_go_into_the_context_where_and_as_the_sessions_own_build_puts_them():
    memory = Memory(["The user lives in Bern."])
    sent, outcome = await _call(_tools(), memory)
    assert outcome.sent and outcome.listing.unchanged and outcome.recall == memory.result
    lines = [m.line() for m in memory.result.memories]
    expected, expected_tokens = _built(lines, 4000)
    assert [m.model_dump() for m in sent.messages] == [m.model_dump() for m in expected]
    assert sent.context_tokens + outcome.memories_tokens == expected_tokens, "the session's count of the memories, not another"
    assert memory.published == [memory.result], "memories_recalled is published once"
    assert memory.searched[0][1] is False, "the model call published turn_started; the search does not again"


async def test_no_memories_found_sends_the_context_as_it_was():
    sent, outcome = await _call(_tools(), Memory([]))
    assert outcome.sent and outcome.memories_tokens == 0
    assert [m.content for m in sent.messages] == [m.content for m in _built([], 4000)[0]]


async def test_changed_tools_are_not_offered_stale_the_call_is_not_sent_and_the_new_listing_comes_back():
    tools = _tools()
    sent, outcome = await _call(tools, Memory(["The user lives in Bern."]), known="listing-of-an-older-build")
    assert not outcome.sent and "tools changed" in outcome.why
    assert not outcome.listing.unchanged and {t.name for t in outcome.listing.tools} >= {"calculate"}
    assert outcome.recall is not None and outcome.recall.memories, "the recall found is kept: the session does not search again"


async def test_a_failed_search_is_not_answered_from_nothing_the_call_is_not_sent():
    memory = Memory(error=RuntimeError("lancedb said no"))
    sent, outcome = await _call(_tools(), memory)
    assert not outcome.sent and outcome.recall is None
    assert "lancedb said no" in (outcome.recall_failed or "") and "memory search failed" in outcome.why
    assert memory.published == []


async def test_memories_that_do_not_fit_beside_the_context_as_built_send_nothing():
    _, tokens = _built([], 4000)
    memory = Memory(["The user lives in Bern. " * 20])
    sent, outcome = await _call(_tools(), memory, budget=tokens + 30)
    assert not outcome.sent and "do not fit" in outcome.why
    assert outcome.recall == memory.result, "the session rebuilds its context with them and calls again"


async def test_a_listing_that_fails_cancels_the_search_and_publishes_nothing():
    tools, memory = _tools(), Memory(["The user lives in Bern."], delay=0.5)

    async def failing(request: Any = None) -> Any:
        raise RuntimeError("the listing failed")

    tools.list_tools = failing  # type: ignore[method-assign]
    messages, tokens = _built([], 4000)
    request = CallModelInput(
        session_id="s", turn=2, step=0, messages=messages, context_tokens=tokens, encoding=ENCODING,
        turn_start=TurnStartRequest(listing=ListToolsInput(known_ref="x"), recall=SearchMemoriesInput(user_id="u", query="q"), budget=4000),
    )
    _, outcome = await TurnStartActivities(tools, memory).prepare(request, request)  # type: ignore[arg-type]
    assert not outcome.sent and outcome.listing is None and "the listing failed" in outcome.why
    await asyncio.sleep(0.6)
    assert memory.published == []


async def test_a_model_call_that_is_not_sent_never_reaches_the_provider_and_counts_nothing():
    provider = ScriptedModel.from_dict({"turns": [], "fallback": "Noted."})
    asked: list[Any] = []
    real = provider.complete

    async def complete(request: CallModelInput) -> Any:
        asked.append(request)
        return await real(request)

    provider.complete = complete  # type: ignore[method-assign]
    model = ModelActivities(provider)
    model.turn_start = TurnStartActivities(_tools(), Memory(error=RuntimeError("down")))  # type: ignore[arg-type]
    messages, tokens = _built([], 4000)
    request = CallModelInput(
        session_id="s", turn=2, step=0, messages=messages, context_tokens=tokens, encoding=ENCODING,
        turn_start=TurnStartRequest(
            listing=ListToolsInput(known_ref=(await _tools().list_tools(ListToolsInput(encoding=ENCODING))).ref, encoding=ENCODING),
            recall=SearchMemoriesInput(user_id="u", query="q"), budget=4000,
        ),
    )
    result = await model.call_model(request)
    assert asked == [] and result.turn_start is not None and not result.turn_start.sent
    assert result.usage.prompt_tokens == 0 and result.message.content == ""

    model.turn_start = TurnStartActivities(_tools(), Memory(["The user lives in Bern."]))  # type: ignore[arg-type]
    result = await model.call_model(request)
    assert len(asked) == 1 and result.turn_start is not None and result.turn_start.sent
    assert any("The user lives in Bern." in (m.content or "") for m in asked[0].messages)


async def test_a_worker_that_does_not_start_turns_sends_nothing_and_says_why():
    model = ModelActivities(ScriptedModel.from_dict({"turns": [], "fallback": "Noted."}))
    request = CallModelInput(
        session_id="s", turn=2, step=0, messages=[Message(role="user", content="hi", turn=2)],
        turn_start=TurnStartRequest(listing=ListToolsInput(known_ref="x"), budget=4000),
    )
    result = await model.call_model(request)
    assert result.turn_start is not None and not result.turn_start.sent and result.turn_start.listing is None


def test_an_unset_turn_start_leaves_a_model_steps_name_as_older_workers_made_it():
    """A step an older worker began keeps its name on a newer one (a rolling deploy): its
    recorded result is found, the provider is not asked twice."""
    import hashlib

    from activities.model_steps import step_key
    from hermes.infra.redis_keys import model_step_key

    request = CallModelInput(session_id="s", turn=2, step=0, context_ref="c")
    older = request.model_dump_json(exclude={"turn_start"})
    assert '"turn_start"' not in older
    digest = hashlib.sha256(older.encode()).hexdigest()[:16]
    assert step_key(request, "run") == model_step_key(f"s:run:2:0:reply:{digest}")
    with_start = request.model_copy(update={"turn_start": TurnStartRequest(listing=ListToolsInput())})
    assert step_key(with_start, "run") != step_key(request, "run")


@pytest.mark.parametrize("correction", [1.0, 1.3])
async def test_the_fit_test_is_the_context_builds_own(correction: float):
    """Memories that the session's build would keep (same budget, same correction) go in;
    one token less of budget and they would not."""
    lines = [m.line() for m in Memory(["The user lives in Bern."]).result.memories]
    _, with_memories = _built(lines, 100_000)
    import math

    budget = math.ceil(with_memories * correction)
    tools = _tools()
    listing = await tools.list_tools(ListToolsInput(encoding=ENCODING))
    messages, tokens = _built([], 100_000)
    for room, sent in ((budget, True), (budget - 1, False)):
        request = CallModelInput(
            session_id="s", turn=2, step=0, messages=messages, context_tokens=tokens, encoding=ENCODING,
            turn_start=TurnStartRequest(
                listing=ListToolsInput(known_ref=listing.ref, encoding=ENCODING),
                recall=SearchMemoriesInput(user_id="u", query="q"), budget=room, correction=correction,
            ),
        )
        _, outcome = await TurnStartActivities(tools, Memory(["The user lives in Bern."])).prepare(request, request)  # type: ignore[arg-type]
        assert outcome.sent is sent, (room, outcome.why)


# ------------------------------------------------------------ through real sessions


async def test_a_tool_registered_between_turns_is_offered_and_run_in_the_next_turn(
    run_worker: Any, session_id: str, temporal_client: Any,
) -> None:
    """The turn's first model call offers the run's last listing; the worker lists one
    more tool now, so that call is not sent and the step goes out again offering it."""

    def fetch_quote(symbol: str) -> dict[str, Any]:
        """Latest price of a stock.

        Args:
            symbol: ticker symbol, e.g. "ACME".
        """
        return {"symbol": symbol, "price": 12.5}

    model = RecordingModel({"turns": [
        {"match": "hi", "steps": [{"reply": "Hello."}]},
        {"match": "quote", "steps": [
            {"tool_calls": [{"name": "fetch_quote", "arguments": {"symbol": "ACME"}}]},
            {"reply": "ACME is at {{ last_tool_result.data.price }}."},
        ]},
    ]})
    registry = register_builtins(ToolRegistry())
    async with run_worker(model, registry=registry) as hermes:
        assert (await hermes.send_message(session_id, "hi")).reply == "Hello."
        registry.register(fetch_quote, idempotent=True, permission="read")
        result = await hermes.send_message(session_id, "quote ACME please")
        events = [e.type for e in await hermes.events.read(session_id) if e.turn == 2]
    # The unsent call published nothing of its step: no attempt to discard (a client
    # would show the answer as cut off and started again).
    assert events[0] == "turn_started" and events.count("turn_started") == 1 and "attempt_discarded" not in events, events
    assert result.reply == "ACME is at 12.5.", result
    assert [r.name for r in result.tool_calls] == ["fetch_quote"] and result.tool_calls[0].result.code == 0
    turn_two = [r for r in model.requests if r.turn == 2]
    assert len(turn_two) == 2, "the unsent first call asked no provider"
    assert "fetch_quote" in {t.name for t in turn_two[0].tools}
    from hermes import names
    from tests.test_memory_session import _scheduled, local_activities

    history = await temporal_client.get_workflow_handle(session_id).fetch_history()
    assert local_activities(history).count(names.LIST_TOOLS) == 1, "listed once, by the run's first turn"
    assert _scheduled(history, names.CALL_MODEL) == 4, "turn 1; turn 2's first call (not sent), its call again, its reply"


async def test_a_worker_that_ignores_the_turn_start_costs_the_first_step_its_memories_and_says_so(
    run_worker: Any, settings: Any, session_id: str, monkeypatch: Any,
) -> None:
    """An older worker (a rolling deploy) does not know ``turn_start``: it answers the
    call as it was. The session says the step went without memories, and searches
    for the turn's later steps."""
    user = f"user-{session_id}"
    model = RecordingModel({"turns": [
        {"match": "live", "steps": [
            {"tool_calls": [{"name": "calculate", "arguments": {"expression": "1 + 1"}}]},
            {"reply": "Noted."},
        ]},
    ], "fallback": "Noted."})
    async with run_worker(model, memory_ready=True) as hermes:
        await _said_bern(hermes, settings, session_id, user)
        real = ModelActivities._call_model_with

        async def older(self: ModelActivities, request: CallModelInput, events: Any) -> Any:
            return await real(self, request.model_copy(update={"turn_start": None}), events)

        monkeypatch.setattr(ModelActivities, "_call_model_with", older)
        result = await hermes.send_message(session_id, "Where do I live?", user_id=user)
        state = await hermes.get_state(session_id)
    turn_two = [r for r in model.requests if r.turn == 2]
    assert len(turn_two) == 2
    assert not any("Bern" in (m.content or "") for m in turn_two[0].messages if m.role == "system")
    assert any("The user lives in Bern." in (m.content or "") for m in turn_two[1].messages), "the later step has them"
    assert any("Bern" in m for m in result.memories)
    assert any("without its memory recall" in n for n in state.notices), state.notices


async def test_a_turn_cancelled_while_its_first_call_searches_was_announced_and_asks_no_provider(
    run_worker: Any, settings: Any, session_id: str, monkeypatch: Any, turns: Any,
) -> None:
    """``turn_started`` goes out when the first call starts, not after its search (up to
    12 s): a live view shows the turn at once, and a turn cancelled meanwhile has one
    (found by a break-it probe: its events were only ``turn_finished``)."""
    from temporalio import activity

    from activities.memory import MemoryActivities
    from hermes import names
    user = f"user-{session_id}"
    model = RecordingModel({"turns": [], "fallback": "Noted."})
    async with run_worker(model, memory_ready=True) as hermes:
        await _said_bern(hermes, settings, session_id, user)
        real = MemoryActivities._search
        searching = asyncio.Event()

        async def slow(self: MemoryActivities, inp: Any) -> Any:
            if activity.info().activity_type == names.CALL_MODEL and not searching.is_set():
                searching.set()
                await asyncio.sleep(10)
            return await real(self, inp)

        monkeypatch.setattr(MemoryActivities, "_search", slow)
        task = turns(hermes.send_message(session_id, "Where do I live?", user_id=user))
        await asyncio.wait_for(searching.wait(), 30)
        started = [e.type for e in await hermes.events.read(session_id) if e.turn == 2]
        await hermes.cancel_turn(session_id)
        cancelled = await asyncio.wait_for(task, 60)
        after = await hermes.send_message(session_id, "Where do I live now?", user_id=user)
        events = await hermes.events.read(session_id)
    assert started == ["turn_started"], "announced while the search runs"
    assert cancelled.status == "cancelled" and not [r for r in model.requests if r.turn == 2]
    two = [e.type for e in events if e.turn == 2]
    assert two[0] == "turn_started" and two[-1] == "turn_finished" and "attempt_discarded" not in two, two
    assert after.status == "completed" and any("Bern" in m for m in after.memories), after
