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
