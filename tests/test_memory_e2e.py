"""Long-term memory end to end on the time-skipping test server: facts stated in one
session reach the model's context in a session days later, and closing a session right
after a message still gets that message's memories written. Real Redis, real LanceDB, the
default embedder; only the model is scripted."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import timedelta
from typing import Any

from temporalio.testing import WorkflowEnvironment

from hermes import names
from hermes.client import HermesClient
from hermes.memory.models import ExtractMemoriesInput
from hermes.memory.rules import detect_triggers
from hermes.memory.service import open_store
from hermes.models import SessionState
from hermes.settings import Settings
from hermes.tools.builtin import register_builtins
from hermes.tools.registry import ToolRegistry
from tests.test_memory_workflows import RecordingModel, rows_when, scheduled
from worker import build_worker

LUGANO = "We decided to book the hotel in Lugano for the team offsite."
LUGANO_MEMORY = "The user's team offsite hotel is booked in Lugano."
SCRIPT = {
    "turns": [],
    "fallback": "Noted.",
    "memories": [{"match": "Lugano", "kind": "episode", "text": LUGANO_MEMORY, "importance": 0.7, "confidence": 0.9}],
}


@asynccontextmanager
async def memory_worker(env: WorkflowEnvironment, redis_url: str, redis: Any, task_queue: str,
                        model: RecordingModel) -> AsyncIterator[tuple[HermesClient, Settings]]:
    """A worker with long-term memory on the time-skipping server, and a client for it."""
    settings = Settings(redis_url=redis_url, task_queue=task_queue, temporal_address="unused:0", memory_batch_seconds=0.5)
    worker = build_worker(env.client, settings, provider=model, registry=register_builtins(ToolRegistry()), redis=redis)
    async with worker:
        yield HermesClient(env.client, task_queue=task_queue, redis=redis), settings


async def close_and_wait(env: WorkflowEnvironment, hermes: HermesClient, session_id: str) -> SessionState:
    await hermes.close(session_id)
    return await env.client.get_workflow_handle(session_id, result_type=SessionState).result()


async def test_facts_from_a_closed_session_are_in_a_new_sessions_model_context_days_later_with_their_date(
    time_skipping_env: WorkflowEnvironment, redis_url: str, redis: Any, task_queue: str
) -> None:
    env = time_skipping_env
    user, first, second = f"user-{uuid.uuid4()}", f"s1-{uuid.uuid4()}", f"s2-{uuid.uuid4()}"
    model = RecordingModel(SCRIPT)
    async with memory_worker(env, redis_url, redis, task_queue, model) as (hermes, settings):
        await hermes.send_message(first, "My name is Lin Wei and I live in Bern.", user_id=user)
        await hermes.send_message(first, "I work at Globex as a data engineer.", user_id=user)
        assert (await close_and_wait(env, hermes, first)).status == "closed"
        store = open_store(settings)
        rows = await rows_when(store, user, lambda r: len(r) >= 3, "session 1's facts written")
        stated_at = (await env.get_current_time())

        await env.sleep(timedelta(days=3))  # skipped, not slept
        result = await hermes.send_message(second, "Where do I live, what is my name and where do I work?", user_id=user)
        transcript = await hermes.get_transcript(second)

    assert transcript[0].created_at - stated_at >= timedelta(days=3), "the second session is not days later"
    by_text = {r["text"]: r for r in rows}
    context = model.contexts()[-1]
    for text in ("The user's name is Lin Wei.", "The user lives in Bern.", "The user works at Globex."):
        line = next((m for m in result.memories if m.endswith(text)), None)
        assert line is not None, (text, result.memories)
        assert line.startswith(f"({by_text[text]['updated_at']:%Y-%m-%d}, score ")  # the memory's date, shown
        assert f"- {line}" in context


async def test_a_session_closed_right_after_a_message_still_gets_its_memories_written(
    time_skipping_env: WorkflowEnvironment, redis_url: str, redis: Any, task_queue: str
) -> None:
    env = time_skipping_env
    assert not detect_triggers(LUGANO).needs_model()  # only the close asks the model about it
    user, sid = f"user-{uuid.uuid4()}", f"s-{uuid.uuid4()}"
    model = RecordingModel(SCRIPT)
    async with memory_worker(env, redis_url, redis, task_queue, model) as (hermes, settings):
        await hermes.send_message(sid, LUGANO, user_id=user)
        assert await scheduled(env.client, sid, names.EXTRACT_MEMORIES) == []
        final = await close_and_wait(env, hermes, sid)
        extractions = await scheduled(env.client, sid, names.EXTRACT_MEMORIES, ExtractMemoriesInput)
        rows = await rows_when(open_store(settings), user, lambda r: len(r) >= 1, "the closed session's memory written")

    assert final.status == "closed"
    [(_, extraction)] = extractions
    assert extraction.reasons == ["close"] and extraction.use_model
    events = (await env.client.get_workflow_handle(sid).fetch_history()).events
    scheduled_id = next(e.event_id for e in events if e.activity_task_scheduled_event_attributes.activity_type.name == names.EXTRACT_MEMORIES)
    assert any(e.activity_task_completed_event_attributes.scheduled_event_id == scheduled_id for e in events), \
        "the session ended before its extraction completed"
    assert [(r["text"], r["kind"], r["source"]) for r in rows] == [(LUGANO_MEMORY, "episode", "model")]
