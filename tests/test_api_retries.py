"""A client's retry of a message attaches to the turn it started (hermes/api/retries.py,
issue 27): the real `openai` client, whose first attempt times out while the model is
still answering, resends the request on its own; the session runs one turn and one model
call, and the client gets the answer. An `Idempotency-Key` names one request only; the
same body sent after the retry window is a new message."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import datetime, timedelta, timezone
from typing import Any

import httpx2
import openai
import pytest

from hermes.api.retries import message_name, request_fingerprint
from hermes.models import Message, TakenMessage, TurnResult
from hermes.settings import Settings
from tests.support import eventually
from tests.test_api import api_server, assert_problem, auth, keys  # noqa: F401 - the fixture
from tests.test_session import EchoModel
from workflows.session.replies import ReplyBook, taken_messages


def _client(http: Any, key: str, session_id: str, **options: Any) -> openai.AsyncOpenAI:
    options.setdefault("max_retries", 0)
    return openai.AsyncOpenAI(
        base_url=f"{http.base_url}/v1", api_key=key, default_headers={"X-Hermes-Session-Id": session_id}, **options
    )


@asynccontextmanager
async def _served(run_worker: Any, settings: Settings, keys_path: Any, model: EchoModel) -> AsyncIterator[tuple[Any, Any, str]]:
    """A worker with ``model``, the API over it, and a new session id: (hermes, http, session_id)."""
    async with run_worker(model, memory=False) as hermes, api_server(settings, keys_path, hermes) as http:
        yield hermes, http, f"s-{uuid.uuid4().hex[:8]}"


async def _ask(client: openai.AsyncOpenAI, text: str, key: str | None = None) -> str:
    headers = {"Idempotency-Key": key} if key else None
    done = await client.chat.completions.create(model="hermes", messages=[{"role": "user", "content": text}], extra_headers=headers)
    return done.choices[0].message.content or ""


async def _users(hermes: Any, session_id: str) -> list[str]:
    return [m.content or "" for m in await hermes.get_transcript(session_id) if m.role == "user"]


@pytest.mark.timeout(300)
async def test_an_openai_client_retry_of_a_timed_out_completion_attaches_to_the_running_turn(run_worker, settings, keys):  # noqa: F811
    model = EchoModel()
    async with _served(run_worker, settings, keys["path"], model) as (hermes, http, sid):
        attempts: list[str | None] = []

        async def sent(request: httpx2.Request) -> None:
            attempts.append(request.headers.get("x-stainless-retry-count"))

        # The client gives up on an attempt after 2 s; the model answers only when released.
        client = _client(
            http, keys["alice"], sid, timeout=2.0, max_retries=6,
            http_client=openai.DefaultAsyncHttpxClient(event_hooks={"request": [sent]}),
        )
        asking = asyncio.create_task(
            client.chat.completions.create(model="hermes", messages=[{"role": "user", "content": "a slow question"}])
        )

        async def retried() -> bool:
            assert not asking.done(), asking
            return len(attempts) >= 2

        await eventually(retried, what="the client's retry of the timed-out attempt")
        assert attempts[:2] == ["0", "1"]  # the SDK's own retry, with no Idempotency-Key

        # The same request, streamed, while the turn runs: it waits for that turn's reply.
        opened = asyncio.Event()

        async def streamed() -> str:
            stream = await _client(http, keys["alice"], sid, timeout=120.0).chat.completions.create(
                model="hermes", stream=True, messages=[{"role": "user", "content": "a slow question"}]
            )
            opened.set()  # answered with headers: its message is named (a retry of the running one)
            return "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])

        watching = asyncio.create_task(streamed())
        await asyncio.wait_for(opened.wait(), 60)
        assert not asking.done()
        model.release.set()
        done = await asyncio.wait_for(asking, 120)
        assert done.choices[0].message.content == "echo: a slow question"
        assert await asyncio.wait_for(watching, 120) == "echo: a slow question"
        assert model.calls == 1
        assert await _users(hermes, sid) == ["a slow question"]
        assert (await hermes.get_state(sid)).turn_count == 1

        # The answered request sent again, streamed: the same answer, no new turn.
        assert await streamed() == "echo: a slow question"
        assert model.calls == 1 and (await hermes.get_state(sid)).turn_count == 1


@pytest.mark.timeout(300)
async def test_an_idempotency_key_names_one_request_and_another_body_under_it_is_refused(run_worker, settings, keys):  # noqa: F811
    model = EchoModel()
    async with _served(run_worker, settings, keys["path"], model) as (hermes, http, sid):
        client = _client(http, keys["alice"], sid)
        assert await _ask(client, "hello", "order-7") == await _ask(client, "hello", "order-7") == "echo: hello"
        with pytest.raises(openai.UnprocessableEntityError, match="order-7"):
            await _ask(client, "goodbye", "order-7")
        # A distinct key per request: the same text twice is two messages (the opt-out).
        for n in (1, 2):
            await _ask(client, "hello", f"hi-{n}")
        assert await _users(hermes, sid) == ["hello", "hello", "hello"] and model.calls == 3

        # The session route: the same rule.
        path = f"/v1/sessions/{sid}/messages"
        headers = {**auth(keys["alice"]), "Idempotency-Key": "note-1"}
        r = await http.post(path, json={"text": "note one"}, headers=headers)
        assert r.status_code == 200, r.text
        r2 = await http.post(path, json={"text": "note one"}, headers=headers)
        assert r2.json()["turn"] == r.json()["turn"] and r2.headers.get("idempotent-replayed") == "true"
        doc = assert_problem(await http.post(path, json={"text": "note two"}, headers=headers), 422, "idempotency-key-reused")
        assert "note-1" in doc["detail"]
        assert model.calls == 4 and (await hermes.get_state(sid)).turn_count == 4


@pytest.mark.timeout(300)
async def test_the_same_body_without_a_key_is_a_new_message_once_the_retry_window_has_passed(run_worker, settings, keys):  # noqa: F811
    model = EchoModel()
    async with _served(run_worker, settings, keys["path"], model) as (hermes, http, sid):
        r = await http.post("/v1/sessions", json={"session_id": sid}, headers=auth(keys["alice"]))
        assert r.status_code == 201, r.text
        path = f"/v1/sessions/{sid}/messages"
        first = await http.post(path, json={"text": "same words"}, headers=auth(keys["alice"]))
        retry = await http.post(path, json={"text": "same words"}, headers=auth(keys["alice"]))
        assert retry.json()["turn"] == first.json()["turn"] == 1 and model.calls == 1
        # The returned reply says so; the first one does not.
        assert retry.headers.get("idempotent-replayed") == "true" and "idempotent-replayed" not in first.headers

        # Past the window (its clock moved on), the same body is the user's second message.
        fingerprint = request_fingerprint("alice", sid, {"text": "same words"})
        answered = await hermes.taken_messages(sid, f"fp-{fingerprint[:32]}-")
        assert [t.client_message_id[-2:] for t in answered] == ["-0"] and answered[0].answered_at is not None
        later = answered[0].answered_at + timedelta(seconds=301)
        name = await message_name(hermes, sid, fingerprint=fingerprint, key=None, window_seconds=300, now=later)
        assert name.client_message_id.endswith("-1") and not name.retry
        soon = await message_name(
            hermes, sid, fingerprint=fingerprint, key=None, window_seconds=300, now=answered[0].answered_at + timedelta(seconds=299)
        )
        assert soon.client_message_id.endswith("-0") and soon.retry

    # A server whose window is all but closed: the second identical message runs.
    tight = settings.model_copy(update={"api_retry_window_seconds": 0.001})
    async with _served(run_worker, tight, keys["path"], model) as (hermes, http, _):
        again = await http.post(path, json={"text": "same words"}, headers=auth(keys["alice"]))
        assert again.status_code == 200, again.text
        assert again.json()["turn"] == 2 and model.calls == 2
        assert await _users(hermes, sid) == ["same words", "same words"]


def test_taken_messages_lists_running_and_answered_ids_under_a_prefix_with_when_their_turns_ended():
    t0 = datetime(2026, 1, 1, tzinfo=timezone.utc)
    messages = [
        Message(role="user", content="a", turn=1, created_at=t0, client_message_id="fp-x-0"),
        Message(role="assistant", content="b", turn=1, created_at=t0 + timedelta(seconds=5)),
        Message(role="user", content="c", turn=2, created_at=t0 + timedelta(seconds=9), client_message_id="other"),
        Message(role="user", content="a", turn=3, created_at=t0 + timedelta(seconds=20), client_message_id="fp-x-1"),
    ]
    replies = ReplyBook({}, {"fp-x-old": 0}, max_completed=10, max_answered=10)
    replies.remember("fp-x-0", TurnResult(session_id="s", turn=1, reply="b"))
    found = taken_messages("fp-x-", running={"fp-x-1", "elsewhere"}, replies=replies, messages=messages)
    assert found == [
        TakenMessage(client_message_id="fp-x-old", running=False, answered_at=None),
        TakenMessage(client_message_id="fp-x-0", running=False, answered_at=t0 + timedelta(seconds=5)),
        TakenMessage(client_message_id="fp-x-1", running=True, answered_at=None),
    ]


def test_a_request_fingerprint_ignores_key_order_and_the_delivery_form_but_not_the_caller_or_session():
    body = {"model": "hermes", "messages": [{"role": "user", "content": "hi"}]}
    same = request_fingerprint("alice", "s1", body)
    assert request_fingerprint("alice", "s1", {"messages": body["messages"], "model": "hermes", "stream": True}) == same
    assert request_fingerprint("bob", "s1", body) != same
    assert request_fingerprint("alice", "s2", body) != same
    assert request_fingerprint("alice", "s1", {**body, "messages": [{"role": "user", "content": "hi!"}]}) != same
