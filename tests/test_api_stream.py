"""Turn events over the HTTP API: a message answered as server-sent events, and a
session's event stream interrupted and resumed from its last id (no gap, no repeat).

Real HTTP on a socket (uvicorn in the test's loop, as tests/test_api.py), the fixtures'
Temporal and Redis, a worker whose scripted model streams its replies word by word.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest

from hermes.content.events import START
from tests.test_api import api_server, assert_problem, auth, keys  # noqa: F401 - the fixture
from tests.test_events import STREAMING_SCRIPT


async def read_sse(response: Any, *, stop_after: int | None = None, lines: Any = None) -> list[dict[str, Any]]:
    """The events of an SSE response ({"id", "event", "data"}), ``stop_after`` of them at
    most (``lines``: the rest of a line iterator of it already begun)."""
    events: list[dict[str, Any]] = []
    current: dict[str, Any] = {}
    async for line in lines if lines is not None else response.aiter_lines():
        if line.startswith(":"):
            continue
        if not line:
            if current:
                current["data"] = json.loads(current["data"])
                events.append(current)
                current = {}
                if stop_after is not None and len(events) >= stop_after:
                    break
            continue
        name, _, value = line.partition(": ")
        current[name] = value
    return events


@pytest.mark.timeout(900)
async def test_a_message_streams_its_turn_as_server_sent_events_then_its_result(run_worker, settings, keys):  # noqa: F811
    async with run_worker(STREAMING_SCRIPT, memory=False) as hermes, api_server(settings, keys["path"], hermes) as http:
        alice, bob = auth(keys["alice"]), auth(keys["bob"])
        sid = f"api-{uuid.uuid4()}"
        assert (await http.post("/v1/sessions", json={"session_id": sid}, headers=alice)).status_code == 201
        url = f"/v1/sessions/{sid}/messages"
        sse = {"Accept": "text/event-stream"}
        # Refusals come before the stream, with their status.
        assert_problem(await http.post(url, json={"text": "hi"}, headers={**bob, **sse}), 404, "not-found")
        assert_problem(await http.post(url, json={}, headers={**alice, **sse}), 422)

        async with http.stream("POST", url, json={"text": "please add these"}, headers={**alice, **sse}) as r:
            assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
            events = await read_sse(r)
        kinds = [e["event"] for e in events]
        assert kinds[0] == "turn_started" and kinds[-2:] == ["turn_finished", "result"], kinds
        assert {"tool_call_started", "tool_call_finished", "text_delta"} <= set(kinds)
        result = events[-1]["data"]
        text = "".join(e["data"]["data"]["text"] for e in events if e["event"] == "text_delta")
        assert text == result["reply"] and result["status"] == "completed"
        ids = [e["id"] for e in events[:-1]]
        assert all(ids) and len(set(ids)) == len(ids) and "id" not in events[-1]

        # A failure after the stream began (here: a closed session) is an `error` event.
        assert (await http.post(f"/v1/sessions/{sid}/close", headers=alice)).status_code == 204
        async with http.stream("POST", url, json={"text": "more"}, headers={**alice, **sse}) as r:
            closed = await read_sse(r)
        assert closed[-1]["event"] == "error" and closed[-1]["data"]["status"] == 409, closed


@pytest.mark.timeout(900)
async def test_an_event_stream_resumed_from_its_last_id_has_no_gap_and_no_repeat(run_worker, settings, keys):  # noqa: F811
    async with run_worker(STREAMING_SCRIPT, memory=False) as hermes, api_server(settings, keys["path"], hermes) as http:
        alice, bob = auth(keys["alice"]), auth(keys["bob"])
        sid = f"api-{uuid.uuid4()}"
        assert (await http.post("/v1/sessions", json={"session_id": sid}, headers=alice)).status_code == 201
        for text in ("please add these", "now talk", "please add again"):
            r = await http.post(f"/v1/sessions/{sid}/messages", json={"text": text}, headers=alice)
            assert r.status_code == 200, r.text
        stored = await hermes.events.read(sid, START, count=10_000)
        assert len(stored) > 12

        url = f"/v1/sessions/{sid}/events"
        assert_problem(await http.get(url, headers=bob), 404)
        assert_problem(await http.get(url, params={"after": "yesterday"}, headers=alice), 400)
        # The client drops the connection after 5 events, then reconnects twice.
        async with http.stream("GET", url, params={"after": START}, headers=alice) as r:
            assert r.status_code == 200
            seen = await read_sse(r, stop_after=5)
        while len(seen) < len(stored):
            headers = {**alice, "Last-Event-ID": seen[-1]["id"]}
            async with http.stream("GET", url, headers=headers) as r:
                seen += await read_sse(r, stop_after=min(7, len(stored) - len(seen)))
        assert [e["id"] for e in seen] == [e.offset for e in stored]
        assert [e["event"] for e in seen] == [e.type for e in stored]

        # Live: a stream opened with no offset gets only what comes next.
        async with http.stream("GET", url, headers=alice) as r:
            # Its own key: the same body again without one would be a retry of the first.
            again = {**alice, "Idempotency-Key": str(uuid.uuid4())}
            sent = await http.post(f"/v1/sessions/{sid}/messages", json={"text": "now talk"}, headers=again)
            live = await read_sse(r, stop_after=1)
        assert live[0]["event"] == "turn_started" and live[0]["data"]["turn"] == sent.json()["turn"]


@pytest.mark.timeout(600)
async def test_an_event_offset_after_the_newest_event_is_refused_with_400_not_followed_in_silence(run_worker, settings, keys):  # noqa: F811
    async with run_worker(STREAMING_SCRIPT, memory=False) as hermes, api_server(settings, keys["path"], hermes) as http:
        alice = auth(keys["alice"])
        sid = f"api-{uuid.uuid4()}"
        assert (await http.post("/v1/sessions", json={"session_id": sid}, headers=alice)).status_code == 201
        assert (await http.post(f"/v1/sessions/{sid}/messages", json={"text": "now talk"}, headers=alice)).status_code == 200
        newest = await hermes.events.last_offset(sid)
        ms, seq = (int(x) for x in newest.split("-"))
        url = f"/v1/sessions/{sid}/events"
        # A future offset used to open a stream that showed nothing (until the clock passed it).
        # (A short timeout: an accepted offset is a stream that never ends.)
        for future in (f"{ms}-{seq + 1}", f"{ms + 60_000}-0", "32503680000000-0", "99999999999999999999-0"):
            refused = await http.get(url, params={"after": future}, headers=alice, timeout=20)
            doc = assert_problem(refused, 400, "malformed-request")
            assert future in doc["detail"] and newest in doc["detail"], doc
            refused = await http.get(url, headers={**alice, "Last-Event-ID": future}, timeout=20)
            assert_problem(refused, 400, "malformed-request")
        for malformed in ("1700000000000", "-1-0", "abc-0", "1700000000000-0-0"):
            doc = assert_problem(await http.get(url, headers={**alice, "Last-Event-ID": malformed}), 400)
            assert "is not an event offset" in doc["detail"], doc
        with pytest.raises(ValueError, match="after the newest event"):
            async for _ in hermes.stream_message(sid, "now talk", after=f"{ms + 60_000}-0", user_id="alice"):
                pass
        # The newest offset itself (and the start) resume: the next turn's events come.
        async with http.stream("GET", url, headers={**alice, "Last-Event-ID": newest}) as r:
            assert r.status_code == 200
            # Its own key: the same body again without one would be a retry of the first.
            again = {**alice, "Idempotency-Key": str(uuid.uuid4())}
            sent = await http.post(f"/v1/sessions/{sid}/messages", json={"text": "now talk"}, headers=again)
            live = await read_sse(r, stop_after=1)
        assert live[0]["event"] == "turn_started" and live[0]["data"]["turn"] == sent.json()["turn"]
        assert (await hermes.get_state(sid)).turn_count == 2  # the refused stream_message sent nothing


@pytest.mark.timeout(600)
async def test_a_message_held_while_a_turn_awaits_approval_streams_keepalives_until_its_turn_runs(
    run_worker, settings, keys, monkeypatch  # noqa: F811
):
    import asyncio

    from hermes.api import sse as sse_module
    from hermes.providers.scripted import ScriptedModel

    monkeypatch.setattr(sse_module, "KEEPALIVE_SECONDS", 0.2)
    async with run_worker(ScriptedModel.demo(), memory=False) as hermes, api_server(settings, keys["path"], hermes) as http:
        alice = auth(keys["alice"])
        sid = f"api-{uuid.uuid4()}"
        assert (await http.post("/v1/sessions", json={"session_id": sid}, headers=alice)).status_code == 201
        url = f"/v1/sessions/{sid}/messages"
        first = asyncio.create_task(http.post(url, json={"text": "Save a note: buy milk"}, headers=alice))
        pending = await hermes.wait_for_approval(sid, timeout_seconds=120)
        sse_headers = {**alice, "Accept": "text/event-stream"}
        async with http.stream("POST", url, json={"text": "What is 2 ** 10?"}, headers=sse_headers) as r:
            assert r.status_code == 200
            lines = r.aiter_lines()
            held: list[str] = []

            async def until_keepalive() -> None:
                async for line in lines:
                    held.append(line)
                    if line.startswith(":"):
                        return

            # The session holds the message while the first turn awaits its approval: the
            # stream stayed silent (a proxy's idle timeout would cut it) until this fix.
            await asyncio.wait_for(until_keepalive(), 60)
            assert held[-1] == ": keepalive" and not any(line.startswith("event: result") for line in held), held
            decided = await http.post(f"/v1/sessions/{sid}/approvals/{pending.tool_call_id}/approve", headers=alice)
            assert decided.status_code == 200, decided.text
            events = await read_sse(r, lines=lines)
        assert events[-1]["event"] == "result" and events[-1]["data"]["reply"].endswith("1024."), events
        assert (await first).status_code == 200


@pytest.mark.timeout(600)
async def test_approval_events_carry_the_turn_of_their_tool_call(run_worker, settings, keys):  # noqa: F811
    from hermes.providers.scripted import ScriptedModel

    async with run_worker(ScriptedModel.demo(), memory=False) as hermes, api_server(settings, keys["path"], hermes) as http:
        alice = auth(keys["alice"])
        sid = f"api-{uuid.uuid4()}"
        url = f"/v1/sessions/{sid}/messages"
        assert (await http.post("/v1/sessions", json={"session_id": sid}, headers=alice)).status_code == 201
        assert (await http.post(url, json={"text": "What is 2 ** 10?"}, headers=alice)).status_code == 200
        sse_headers = {**alice, "Accept": "text/event-stream"}
        async with http.stream("POST", url, json={"text": "Save a note: buy milk"}, headers=sse_headers) as r:
            lines = r.aiter_lines()
            requested = await read_sse(r, stop_after=1, lines=_after_event(lines, "approval_requested"))
            call = requested[0]["data"]["data"]["tool_call_id"]
            decided = await http.post(f"/v1/sessions/{sid}/approvals/{call}/approve", headers=alice)
            assert decided.status_code == 200, decided.text
            rest = await read_sse(r, lines=lines)
        result = rest[-1]["data"]
        assert rest[-1]["event"] == "result" and result["turn"] == 2
        approvals = requested + [e for e in rest if e["event"].startswith("approval_")]
        assert [e["event"] for e in approvals] == ["approval_requested", "approval_decided"]
        # Both were `turn: null` (the audit log that publishes them did not know the turn).
        assert [e["data"]["turn"] for e in approvals] == [2, 2], approvals
        stored = [e for e in await hermes.events.read(sid, START) if e.type.startswith("approval_")]
        assert [e.turn for e in stored] == [2, 2]


async def _after_event(lines: Any, kind: str) -> Any:
    """The lines of an SSE response from the event of type ``kind`` (the ones before it
    skipped) to the end of that event."""
    started = False
    async for line in lines:
        started = started or line == f"event: {kind}"
        if started:
            yield line
            if not line:
                return


@pytest.mark.timeout(600)
async def test_a_memory_warning_is_sent_once_in_one_wording_in_a_messages_stream(run_worker, settings, keys):  # noqa: F811
    from hermes.memory.store import MemoryStoreError

    def unavailable_store() -> None:
        raise MemoryStoreError("the disk of the memory store is not mounted")

    script = {"turns": [], "fallback": "Noted."}
    async with run_worker(script, memory=unavailable_store) as hermes, api_server(settings, keys["path"], hermes) as http:
        alice = auth(keys["alice"])
        sid = f"api-{uuid.uuid4()}"
        assert (await http.post("/v1/sessions", json={"session_id": sid}, headers=alice)).status_code == 201
        sse_headers = {**alice, "Accept": "text/event-stream"}
        async with http.stream("POST", f"/v1/sessions/{sid}/messages", json={"text": "I live in Bern."}, headers=sse_headers) as r:
            events = await read_sse(r)
    assert events[-1]["event"] == "result" and events[-1]["data"]["reply"] == "Noted.", events
    shown = [e["data"]["data"]["text"] for e in events if e["event"] == "warning"] + events[-1]["data"]["warnings"]
    about_memory = [w for w in shown if "not mounted" in w]
    assert len(about_memory) == 1 and about_memory[0].startswith("Long-term memory was not searched: "), shown
