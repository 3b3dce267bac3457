"""Long-term memory through real sessions: what a user says in one session is in the
model's context in the next (real Temporal dev server, real Redis, real LanceDB, the real
offline embedder; only the model is scripted)."""

from __future__ import annotations

import uuid
from typing import Any

from hermes.memory.service import open_store
from hermes.models import CallModelInput, CallModelResult
from hermes.providers.scripted import ScriptedModel
from hermes.settings import Settings
from tests.support import eventually


class RecordingModel:
    """The scripted model, keeping every request it is sent (contexts included)."""

    name = "recording"

    def __init__(self, script: dict[str, Any]) -> None:
        self.inner = ScriptedModel.from_dict(script)
        self.requests: list[CallModelInput] = []

    async def complete(self, request: CallModelInput) -> CallModelResult:
        self.requests.append(request)
        return await self.inner.complete(request)

    def contexts(self) -> list[str]:
        return ["\n".join(m.content or "" for m in r.messages) for r in self.requests if r.purpose == "reply"]


async def test_facts_stated_in_one_session_are_in_the_next_sessions_model_context(run_worker: Any, settings: Settings) -> None:
    user = f"user-{uuid.uuid4()}"
    model = RecordingModel({"turns": [], "fallback": "Noted."})
    async with run_worker(model) as hermes:
        first = f"s1-{uuid.uuid4()}"
        await hermes.send_message(first, "Hi! My name is Lin Wei and I live in Bern.", user_id=user)
        await hermes.send_message(first, "Please keep answers short.", user_id=user)
        store = open_store(settings)
        rows = await eventually(
            lambda: _async(len(store.list(user)) >= 3 and store.list(user)),
            what="the memories of session 1 written", timeout_seconds=30,
        )
        texts = {r["text"] for r in rows}
        assert "The user's name is Lin Wei." in texts and "The user lives in Bern." in texts

        second = f"s2-{uuid.uuid4()}"
        result = await hermes.send_message(second, "Where do I live, and what is my name?", user_id=user)
        assert any("Bern" in m for m in result.memories), result.memories
        context = model.contexts()[-1]
        assert "The user lives in Bern." in context
        assert "The user's name is Lin Wei." in context


async def _async(value: Any) -> Any:
    return value


async def test_a_recall_whose_local_search_fails_is_searched_again_on_the_task_queue_not_answered_from_nothing(
    run_worker: Any, settings: Settings, temporal_client: Any, monkeypatch: Any,
) -> None:
    """Issue 28: on a starved survivor of a SIGKILL both local attempts of a recall timed
    out, and the moved session answered "Where do I live?" as if it knew nothing."""
    from temporalio import activity
    from temporalio.api.enums.v1 import EventType

    from activities.memory import MemoryActivities
    from hermes import names

    user = f"user-{uuid.uuid4()}"
    model = RecordingModel({"turns": [], "fallback": "Noted."})
    async with run_worker(model, memory_ready=True) as hermes:
        await hermes.send_message(f"s1-{uuid.uuid4()}", "I live in Bern.", user_id=user)
        store = open_store(settings)
        await eventually(lambda: _async(any("Bern" in r["text"] for r in store.list(user))),
                         what="the home written", timeout_seconds=30)
        real_search = MemoryActivities._search
        local_attempts: list[int] = []

        async def starved(self: MemoryActivities, inp: Any) -> Any:
            if activity.info().is_local:
                local_attempts.append(activity.info().attempt)
                raise RuntimeError("local search timed out (a starved worker)")
            return await real_search(self, inp)

        monkeypatch.setattr(MemoryActivities, "_search", starved)
        second = f"s2-{uuid.uuid4()}"
        result = await hermes.send_message(second, "Where do I live?", user_id=user)
    assert local_attempts == [1, 2]
    assert any("Bern" in m for m in result.memories), result.memories
    assert "The user lives in Bern." in model.contexts()[-1]
    assert not any("memory" in w.lower() for w in result.warnings), result.warnings
    history = await temporal_client.get_workflow_handle(second).fetch_history()
    again = [e for e in history.events if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
             and e.activity_task_scheduled_event_attributes.activity_type.name == names.SEARCH_MEMORIES]
    assert len(again) == 1, "searched again once, as a normal activity"


async def test_a_move_said_in_chinese_is_written_after_its_turn_and_recalled_later_in_the_same_session(
    run_worker: Any, settings: Settings,
) -> None:
    """Issue 30: "我二月底从利兹搬到爱丁堡了" was not written at all offline (and with a capable
    extractor only when the session closed), so "Where do I live now?" answered Leeds."""
    user = f"user-{uuid.uuid4()}"
    model = RecordingModel({"turns": [], "fallback": "Noted."})
    async with run_worker(model) as hermes:
        session = f"s-{uuid.uuid4()}"
        await hermes.send_message(session, "I live in Leeds.", user_id=user)
        store = open_store(settings)
        await eventually(lambda: _async(any("Leeds" in r["text"] for r in store.list(user))),
                         what="the first home written", timeout_seconds=30)
        await hermes.send_message(session, "我二月底从利兹搬到爱丁堡了", user_id=user)
        rows = await eventually(
            lambda: _async([r["text"] for r in store.list(user, statuses=("active",))] == ["用户住在爱丁堡。"]
                           and store.list(user, statuses=("active", "superseded"))),
            what="the move written after its turn, the old home superseded", timeout_seconds=30,
        )
        assert {r["text"]: r["status"] for r in rows} == {"The user lives in Leeds.": "superseded", "用户住在爱丁堡。": "active"}
        result = await hermes.send_message(session, "Where do I live now?", user_id=user)
    assert any("爱丁堡" in m for m in result.memories) and not any("Leeds" in m for m in result.memories), result.memories


def local_activities(history: Any) -> list[str]:
    """The activity types of a history's local activities, in order (their markers'
    ``data`` detail, as Temporal's core writes it)."""
    import json

    found = []
    for event in history.events:
        if event.HasField("marker_recorded_event_attributes"):
            details = event.marker_recorded_event_attributes.details
            if "data" in details and details["data"].payloads:
                found.append(json.loads(details["data"].payloads[0].data).get("activity_type", ""))
    return found


async def _said_bern(hermes: Any, settings: Settings, session_id: str, user: str) -> None:
    await hermes.send_message(session_id, "I live in Bern.", user_id=user)
    store = open_store(settings)
    await eventually(lambda: _async(any("Bern" in r["text"] for r in store.list(user))),
                     what="the home written", timeout_seconds=30)


async def test_a_later_turn_lists_and_recalls_in_its_first_model_call_not_in_a_local_activity(
    run_worker: Any, settings: Settings, temporal_client: Any,
) -> None:
    """Issue 31: each local activity is a workflow activation and a history marker; a
    turn after the run's first makes none before its first model call, which checks the
    listing and searches (``CallModelInput.turn_start``); the provider is asked once."""
    from hermes import names

    user, session_id = f"user-{uuid.uuid4()}", f"s-{uuid.uuid4()}"
    model = RecordingModel({"turns": [], "fallback": "Noted."})
    async with run_worker(model, memory_ready=True) as hermes:
        await _said_bern(hermes, settings, session_id, user)
        result = await hermes.send_message(session_id, "Where do I live?", user_id=user)
        events = await hermes.events.read(session_id)
    assert any("Bern" in m for m in result.memories), result.memories
    assert "The user lives in Bern." in model.contexts()[-1]
    assert len([r for r in model.requests if r.turn == 2 and r.purpose == "reply"]) == 1
    history = await temporal_client.get_workflow_handle(session_id).fetch_history()
    kinds = local_activities(history)
    assert kinds.count(names.BEGIN_TURN) == 0, kinds
    assert kinds.count(names.LIST_TOOLS) == 1 and kinds.count(names.SEARCH_MEMORIES) == 1, "the run's first turn: apart"
    # The first turn's listing (counted in the worker's encoding) is the one turn 2 knows:
    # its first call is sent, not refused as "tools changed" and called again.
    assert _scheduled(history, names.CALL_MODEL) == 2
    turn_two = [e.type for e in events if e.turn == 2]
    assert turn_two[0] == "turn_started" and turn_two.count("turn_started") == 1, turn_two
    assert "attempt_discarded" not in turn_two, turn_two
    assert turn_two.count("memories_recalled") == 1 and turn_two.index("memories_recalled") < turn_two.index("turn_finished")


async def test_a_new_runs_first_turn_lists_recalls_and_stores_nothing_before_its_first_model_call(
    run_worker: Any, settings: Settings, temporal_client: Any,
) -> None:
    """Issue 31: continue-as-new hands the run's last listing, its last context list and
    what the content store took to the next run (``SessionCarry.context``), so the new
    run's first turn is like any later one: no local activity before its first model call,
    which checks the listing and searches; the provider is asked once, with the memory."""
    from hermes import names
    from hermes.models import SessionConfig
    from tests.support import run_histories

    user, session_id = f"user-{uuid.uuid4()}", f"s-{uuid.uuid4()}"
    model = RecordingModel({"turns": [], "fallback": "Noted."})
    async with run_worker(model, memory_ready=True, config=SessionConfig(max_updates_per_run=2)) as hermes:
        await _said_bern(hermes, settings, session_id, user)
        await hermes.send_message(session_id, "Thanks.", user_id=user)
        result = await hermes.send_message(session_id, "Where do I live?", user_id=user)
        state = await hermes.get_state(session_id)
        events = await hermes.events.read(session_id)
    histories = await run_histories(temporal_client, session_id, state.chain_id)
    assert len(histories) == 2 and state.turn_count == 3
    assert any("Bern" in m for m in result.memories), result.memories
    assert "The user lives in Bern." in model.contexts()[-1]
    assert len([r for r in model.requests if r.turn == 3 and r.purpose == "reply"]) == 1
    kinds = local_activities(histories[1])
    assert kinds.count(names.LIST_TOOLS) == kinds.count(names.SEARCH_MEMORIES) == kinds.count(names.BEGIN_TURN) == 0, kinds
    assert kinds.count(names.STORE_MESSAGE_BODIES) == 0, kinds
    turn_three = [e.type for e in events if e.turn == 3]
    assert turn_three[0] == "turn_started" and "attempt_discarded" not in turn_three, turn_three


def _scheduled(history: Any, activity_type: str) -> int:
    from temporalio.api.enums.v1 import EventType

    return len([e for e in history.events if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
                and e.activity_task_scheduled_event_attributes.activity_type.name == activity_type])


async def test_a_recall_that_fails_in_the_first_model_call_is_searched_again_on_the_task_queue(
    run_worker: Any, settings: Settings, temporal_client: Any, monkeypatch: Any,
) -> None:
    from temporalio import activity

    from activities.memory import MemoryActivities
    from hermes import names

    user, session_id = f"user-{uuid.uuid4()}", f"s-{uuid.uuid4()}"
    model = RecordingModel({"turns": [], "fallback": "Noted."})
    async with run_worker(model, memory_ready=True) as hermes:
        await _said_bern(hermes, settings, session_id, user)
        real_search = MemoryActivities._search

        async def starved(self: MemoryActivities, inp: Any) -> Any:
            if activity.info().is_local or activity.info().activity_type == names.CALL_MODEL:
                raise RuntimeError("the search timed out (a starved worker)")
            return await real_search(self, inp)

        monkeypatch.setattr(MemoryActivities, "_search", starved)
        result = await hermes.send_message(session_id, "Where do I live?", user_id=user)
    assert any("Bern" in m for m in result.memories), result.memories
    assert not any("memory" in w.lower() for w in result.warnings), result.warnings
    assert "The user lives in Bern." in model.contexts()[-1]
    assert len([r for r in model.requests if r.turn == 2 and r.purpose == "reply"]) == 1, "the unsent call asked no provider"
    history = await temporal_client.get_workflow_handle(session_id).fetch_history()
    assert _scheduled(history, names.SEARCH_MEMORIES) == 1, "searched again once, as a normal activity"
    assert _scheduled(history, names.CALL_MODEL) == 3, "turn 1, then turn 2's first call (not sent) and its call again"


async def test_a_turn_whose_listing_fails_in_its_first_model_call_lists_and_searches_apart(
    run_worker: Any, settings: Settings, temporal_client: Any, monkeypatch: Any,
) -> None:
    """A listing that failed in the model call: the turn lists and searches as it did
    before, and loses nothing."""
    from activities.tools import ToolActivities
    from hermes import names

    user, session_id = f"user-{uuid.uuid4()}", f"s-{uuid.uuid4()}"
    model = RecordingModel({"turns": [], "fallback": "Noted."})
    async with run_worker(model, memory_ready=True) as hermes:
        await _said_bern(hermes, settings, session_id, user)
        # The turn start looks the listing up on its object; the list_tools activity the
        # fallback runs is the one registered before.
        async def failing(self: ToolActivities, request: Any = None) -> Any:
            raise RuntimeError("the listing failed")

        monkeypatch.setattr(ToolActivities, "list_tools", failing)
        result = await hermes.send_message(session_id, "Where do I live?", user_id=user)
    assert any("Bern" in m for m in result.memories), result.memories
    assert "The user lives in Bern." in model.contexts()[-1]
    history = await temporal_client.get_workflow_handle(session_id).fetch_history()
    kinds = local_activities(history)
    assert kinds.count(names.BEGIN_TURN) == 0 and kinds.count(names.LIST_TOOLS) == 2 and kinds.count(names.SEARCH_MEMORIES) == 1, kinds
    assert _scheduled(history, names.SEARCH_MEMORIES) == 1


async def test_a_listing_that_fails_after_the_search_beside_it_says_the_recall_once(
    run_worker: Any, settings: Settings, monkeypatch: Any,
) -> None:
    """The turn searches again when begin_turn fails; the first search's
    ``memories_recalled`` must not be out already (found by a helper: it was, twice)."""
    import asyncio

    from activities.tools import ToolActivities

    user, session_id = f"user-{uuid.uuid4()}", f"s-{uuid.uuid4()}"
    model = RecordingModel({"turns": [], "fallback": "Noted."})
    async with run_worker(model, memory_ready=True) as hermes:
        await _said_bern(hermes, settings, session_id, user)

        async def failing(self: ToolActivities, request: Any = None) -> Any:
            await asyncio.sleep(2)  # the search beside it is done first
            raise RuntimeError("the listing failed late")

        monkeypatch.setattr(ToolActivities, "list_tools", failing)
        result = await hermes.send_message(session_id, "Where do I live?", user_id=user)
        events = await hermes.events.read(session_id)
    assert any("Bern" in m for m in result.memories), result.memories
    kinds = [e.type for e in events if e.turn == 2]
    assert kinds.count("turn_started") == 1 and kinds.count("memories_recalled") == 1, kinds
