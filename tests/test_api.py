"""Tests of the HTTP API (hermes/api, `hermes serve`) over real HTTP on a socket.

The app runs under uvicorn in the test's event loop (or, for `hermes serve`, as a real
subprocess) against the fixtures' Temporal dev server and Redis, with a worker in the
test process on the scripted demo model; requests go through httpx2.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import httpx2
import pytest
import uvicorn
import yaml
from temporalio.service import RPCError

from hermes import names
from hermes.api import OPERATIONS, KeyRing, add_key, create_app
from hermes.api.keys import hash_key
from hermes.api.serving import uvicorn_config
from hermes.client import HermesClient
from hermes.infra.stack import free_port
from hermes.providers.scripted import ScriptedModel
from hermes.settings import Settings

REPO_ROOT = Path(__file__).resolve().parents[1]
PROBLEM = "application/problem+json"


@pytest.fixture
def keys(tmp_path: Path) -> dict[str, Any]:
    """A key file with alice and bob (users), carol (approver) and root (admin)."""
    path = tmp_path / "api_keys.yaml"
    made = {
        "alice": add_key(path, "alice", ["user"]),
        "bob": add_key(path, "bob", ["user"]),
        "carol": add_key(path, "carol", ["user", "approver"]),
        "root": add_key(path, "root", ["admin"]),
    }
    return {"path": path, **made}


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@asynccontextmanager
async def api_server(settings: Settings, keys_path: Path, hermes: HermesClient | None = None) -> AsyncIterator[httpx2.AsyncClient]:
    """The API on a free port in this event loop; yields an HTTP client for it."""
    port = free_port()
    app = create_app(settings, keys=KeyRing(keys_path), hermes=hermes)
    server = uvicorn.Server(uvicorn_config(app, settings, host="127.0.0.1", port=port, log_config=None))
    server.capture_signals = contextlib.nullcontext  # type: ignore[method-assign]  # the test owns the signals
    task = asyncio.create_task(server.serve())
    try:
        while not server.started:
            assert not task.done(), "the API server stopped during start-up"
            await asyncio.sleep(0.02)
        async with httpx2.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=120.0) as http:
            yield http
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 30)


def assert_problem(response: httpx2.Response, status: int, slug: str | None = None) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith(PROBLEM), response.headers
    doc = response.json()
    assert doc["status"] == status and doc["title"] and doc["detail"] and doc["type"].startswith("https://")
    if slug is not None:
        assert doc["type"].endswith("/" + slug), doc
    return doc


# --------------------------------------------------------------------------- keys and OpenAPI


def test_key_file_holds_only_hashes_and_unknown_keys_are_refused(tmp_path: Path):
    path = tmp_path / "k.yaml"
    key = add_key(path, "alice", ["user", "approver"], label="laptop")
    text = path.read_text()
    assert key not in text and hash_key(key) in text
    assert (path.stat().st_mode & 0o777) == 0o600
    entry = yaml.safe_load(text)["keys"][0]
    assert entry["user_id"] == "alice" and entry["roles"] == ["user", "approver"]
    ring = KeyRing(path)
    identity = ring.identify(key)
    assert identity is not None and identity.user_id == "alice" and identity.is_approver and not identity.is_admin
    assert ring.identify(key + "x") is None and ring.identify("") is None
    # A key added while the ring is in use is taken without a restart.
    other = add_key(path, "bob", ["user"])
    assert ring.identify(other).user_id == "bob"


async def test_a_key_over_its_rate_gets_429_with_retry_after(settings, keys):
    limited = settings.model_copy(update={"api_rate_per_minute": 3})
    async with api_server(limited, keys["path"]) as http:
        for _ in range(3):
            assert (await http.get("/v1/models", headers=auth(keys["alice"]))).status_code == 200
        over = await http.get("/v1/models", headers=auth(keys["alice"]))
        doc = assert_problem(over, 429, "rate-limited")
        assert 1 <= int(over.headers["retry-after"]) <= 60 and "3 requests a minute" in doc["detail"]
        # Another key is counted apart; a key that is not known is refused before it counts.
        assert (await http.get("/v1/models", headers=auth(keys["bob"]))).status_code == 200
        assert_problem(await http.get("/v1/models", headers=auth("hk_unknown")), 401)


def test_openapi_document_describes_every_route():
    app = create_app(Settings(temporal_address="127.0.0.1:1"), keys=KeyRing(Path("/nonexistent/keys.yaml")))
    doc = app.state.openapi
    assert doc["openapi"].startswith("3.")
    routes = {(method, route.path) for route in app.routes for method in route.methods if method != "HEAD"}
    documented = {(method.upper(), path) for path, item in doc["paths"].items() for method in item}
    assert routes == documented and len(routes) == len(OPERATIONS)
    schemas = doc["components"]["schemas"]
    for path, item in doc["paths"].items():
        for method, op in item.items():
            for response in op["responses"].values():
                for content in response.get("content", {}).values():
                    ref = content["schema"].get("$ref")
                    assert ref is None or ref.rsplit("/", 1)[1] in schemas, (method, path, ref)
    assert "text" in schemas["SendMessageRequest"]["properties"]
    assert "approver" not in schemas["DecisionRequest"]["properties"]


# --------------------------------------------------------------------------- sessions and messages


@pytest.mark.timeout(900)
async def test_sessions_messages_transcript_and_error_statuses(run_worker, settings, keys):
    small = settings.model_copy(update={"api_max_body_bytes": 4096})
    async with run_worker(ScriptedModel.demo(), memory=False) as hermes, api_server(small, keys["path"], hermes) as http:
        alice, bob, root = auth(keys["alice"]), auth(keys["bob"]), auth(keys["root"])

        health = await http.get("/health")
        assert health.status_code == 200 and health.json() == {"status": "ok", "temporal": True, "redis": True}
        assert (await http.get("/openapi.json")).json()["paths"]

        # 401: no key, not Bearer, unknown key.
        assert_problem(await http.get("/v1/sessions"), 401, "unauthorized")
        assert_problem(await http.get("/v1/sessions", headers={"Authorization": f"Basic {keys['alice']}"}), 401)
        r = await http.get("/v1/sessions", headers=auth("hk_not-a-key"))
        assert_problem(r, 401)
        assert r.headers["www-authenticate"].startswith("Bearer")

        # Create: 201, then 409 for the same id; 422 for a bad field; 400 for bad JSON.
        sid = f"api-{uuid.uuid4()}"
        created = await http.post("/v1/sessions", json={"session_id": sid, "config": {"max_iterations": 4}}, headers=alice)
        assert created.status_code == 201, created.text
        assert created.json() == {"session_id": sid, "user_id": "alice", "channel": "api"}
        assert_problem(await http.post("/v1/sessions", json={"session_id": sid}, headers=alice), 409, "session-exists")
        bad = assert_problem(await http.post("/v1/sessions", json={"config": {"max_iterations": 0}}, headers=alice), 422)
        assert bad["errors"][0]["loc"] == ["config", "max_iterations"]
        assert_problem(await http.post("/v1/sessions", json={"user_id": "mallory"}, headers=alice), 422)
        assert_problem(await http.post("/v1/sessions", content=b"{not json", headers=alice), 400, "malformed-request")

        # State: the owner and an admin reach it; another user gets the 404 of no such session.
        state = await http.get(f"/v1/sessions/{sid}", headers=alice)
        assert state.status_code == 200 and state.json()["user_id"] == "alice" and state.json()["turn_count"] == 0
        assert (await http.get(f"/v1/sessions/{sid}", headers=root)).status_code == 200
        assert_problem(await http.get(f"/v1/sessions/{sid}", headers=bob), 404, "not-found")
        assert_problem(await http.get(f"/v1/sessions/{sid}-nope", headers=alice), 404, "not-found")
        assert_problem(await http.post(f"/v1/sessions/{sid}-nope/messages", json={"text": "hi"}, headers=alice), 404)

        # A message with an Idempotency-Key; the resend returns the first reply, runs no turn.
        url = f"/v1/sessions/{sid}/messages"
        first = await http.post(url, json={"text": "What is (17 + 25) * 3?"}, headers={**alice, "Idempotency-Key": "k-1"})
        assert first.status_code == 200, first.text
        assert first.json()["reply"] == "(17 + 25) * 3 = 126."
        again = await http.post(url, json={"text": "What is (17 + 25) * 3?"}, headers={**alice, "Idempotency-Key": "k-1"})
        assert again.status_code == 200 and again.json()["turn"] == first.json()["turn"]
        assert again.json()["reply"] == first.json()["reply"]
        assert (await hermes.get_state(sid)).turn_count == 1

        # Another user's key cannot post to it.
        assert_problem(await http.post(url, json={"text": "hi"}, headers=bob), 404)

        # Bad input: 400, 422, 413; nothing is lost, the session stays usable.
        assert_problem(await http.post(url, content=b"[1, 2]", headers=alice), 400)
        assert_problem(await http.post(url, content=b'{"text": ', headers=alice), 400)
        assert_problem(await http.post(url, json={"text": "x", "user_id": "bob"}, headers=alice), 422)
        assert_problem(await http.post(url, json={}, headers=alice), 422, "validation-failed")
        assert_problem(await http.post(url, json={"text": "   \u200b "}, headers=alice), 422, "message-rejected")
        assert_problem(await http.post(url, json={"text": "x"}, headers={**alice, "Idempotency-Key": "k" * 300}), 400)
        assert_problem(await http.post(url, json={"text": "a" * 5000}, headers=alice), 413, "payload-too-large")
        assert (await hermes.get_state(sid)).turn_count == 1
        second = await http.post(url, json={"text": "What is 2 ** 10?"}, headers=alice)
        assert second.status_code == 200 and second.json()["reply"].endswith("1024.")

        # Transcript: the owner's, in order; 404 for another user.
        transcript = await http.get(f"/v1/sessions/{sid}/transcript", headers=alice)
        assert transcript.status_code == 200
        user_texts = [m["content"] for m in transcript.json()["messages"] if m["role"] == "user"]
        assert user_texts == ["What is (17 + 25) * 3?", "What is 2 ** 10?"]
        assert_problem(await http.get(f"/v1/sessions/{sid}/transcript", headers=bob), 404)

        # Listing: alice's session is hers, not bob's; only an admin lists another's.
        async def listed(headers: dict[str, str], query: str = "") -> list[str]:
            r = await http.get(f"/v1/sessions{query}", headers=headers)
            assert r.status_code == 200, r.text
            return [s["session_id"] for s in r.json()["sessions"]]

        for _ in range(100):  # the index is written by the session, after the turn
            if sid in await listed(alice):
                break
            await asyncio.sleep(0.1)
        assert sid in await listed(alice)
        assert sid not in await listed(bob)
        assert sid in await listed(root, "?user_id=alice")
        assert_problem(await http.get("/v1/sessions?user_id=alice", headers=bob), 403)
        assert_problem(await http.get("/v1/sessions?limit=0", headers=alice), 422)

        # Closed: 409 for a message; unknown route: 404 problem.
        assert (await http.post(f"/v1/sessions/{sid}/close", headers=bob)).status_code == 404
        assert (await http.post(f"/v1/sessions/{sid}/close", headers=alice)).status_code == 204
        for _ in range(100):
            if (await hermes.get_state(sid)).status == "closed":
                break
            await asyncio.sleep(0.1)
        assert_problem(await http.post(url, json={"text": "hello again"}, headers=alice), 409, "session-closed")
        assert_problem(await http.get("/v1/nothing-here", headers=alice), 404)


async def session_ended(hermes: HermesClient, session_id: str) -> bool:
    """Whether the session's workflow has completed (not only its status said closed)."""
    from temporalio.client import WorkflowExecutionStatus

    return (await hermes.handle(session_id).describe()).status != WorkflowExecutionStatus.RUNNING


@pytest.mark.timeout(300)
async def test_closing_or_deciding_on_a_closed_session_is_409_at_once_and_on_an_unknown_one_404(run_worker, settings, keys):
    from tests.support import eventually

    async with run_worker(ScriptedModel.demo(), memory=False) as hermes, api_server(settings, keys["path"], hermes) as http:
        alice = auth(keys["alice"])
        sid = f"api-{uuid.uuid4()}"
        assert (await http.post("/v1/sessions", json={"session_id": sid}, headers=alice)).status_code == 201
        turn = asyncio.create_task(http.post(f"/v1/sessions/{sid}/messages", json={"text": "Save a note: buy milk"}, headers=alice))
        pending = await hermes.wait_for_approval(sid, timeout_seconds=120)
        assert (await http.post(f"/v1/sessions/{sid}/close", headers=alice)).status_code == 204
        assert (await turn).status_code == 200  # the pending call was denied, the turn ended
        await eventually(lambda: session_ended(hermes, sid), what="the session's workflow to complete")

        # The client used to retry "workflow execution already completed" for its whole
        # retry window (120 s), then answer 503.
        doc = assert_problem(await http.post(f"/v1/sessions/{sid}/close", headers=alice), 409, "session-closed")
        assert sid in doc["detail"] and "closed" in doc["detail"]
        for verb in ("approve", "reject"):
            url = f"/v1/sessions/{sid}/approvals/{pending.tool_call_id}/{verb}"
            assert_problem(await http.post(url, headers=alice), 409, "session-closed")
        # A session that never existed is 404, whatever is asked of it.
        nobody = f"api-{uuid.uuid4()}"
        assert_problem(await http.post(f"/v1/sessions/{nobody}/close", headers=alice), 404, "not-found")
        assert_problem(await http.post(f"/v1/sessions/{nobody}/approvals/call_1/approve", headers=alice), 404, "not-found")


# --------------------------------------------------------------------------- approvals


@pytest.mark.timeout(900)
async def test_approvals_are_listed_and_decided_as_the_keys_identity(run_worker, settings, keys):
    async with run_worker(ScriptedModel.demo(), memory=False) as hermes, api_server(settings, keys["path"], hermes) as http:
        alice, bob, carol, root = auth(keys["alice"]), auth(keys["bob"]), auth(keys["carol"]), auth(keys["root"])
        sid = f"api-{uuid.uuid4()}"
        assert (await http.post("/v1/sessions", json={"session_id": sid}, headers=alice)).status_code == 201
        turn = asyncio.create_task(http.post(f"/v1/sessions/{sid}/messages", json={"text": "Save a note: buy milk"}, headers=alice))
        pending = await hermes.wait_for_approval(sid, timeout_seconds=120)
        assert pending.tool_name == "save_note"
        call = pending.tool_call_id

        async def approvals(headers: dict[str, str]) -> list[tuple[str, str]]:
            r = await http.get("/v1/approvals", headers=headers)
            assert r.status_code == 200, r.text
            return [(a["session_id"], a["tool_call_id"]) for a in r.json()["approvals"]]

        for _ in range(200):  # Temporal visibility lags a moment behind the session
            if (sid, call) in await approvals(alice):
                break
            await asyncio.sleep(0.1)
        assert (sid, call) in await approvals(alice)
        # A write call is confirmed by the session's user alone (or a listed approver): not
        # listed for bob, nor for carol whose approver role covers calls that need someone
        # other than the requester (admin tools).
        assert (sid, call) not in await approvals(carol)
        assert (sid, call) not in await approvals(bob)
        assert (sid, call) not in await approvals(root)  # the admin role neither (README said it did)

        base = f"/v1/sessions/{sid}/approvals/{call}"
        # A user key of someone else may not decide (404, as for no such session); a name in the body is refused.
        assert_problem(await http.post(f"{base}/approve", headers=bob), 404, "not-found")
        assert_problem(await http.post(f"{base}/approve", json={"approver": "carol"}, headers=alice), 422)
        assert_problem(await http.post(f"/v1/sessions/{sid}-nope/approvals/{call}/approve", headers=alice), 404)
        assert_problem(await http.post(f"/v1/sessions/{sid}/approvals/call_unknown/approve", headers=alice), 404)
        assert not turn.done()

        approved = await http.post(f"{base}/approve", json={"reason": "fine"}, headers=alice)
        assert approved.status_code == 200, approved.text
        assert approved.json()["approver"] == "alice" and approved.json()["outcome"] == "applied"
        reply = await asyncio.wait_for(turn, 120)
        assert reply.status_code == 200, reply.text
        assert [(c["name"], c["result"]["code"]) for c in reply.json()["tool_calls"]] == [("save_note", 0)]
        assert_problem(await http.post(f"{base}/reject", headers=alice), 409, "already-decided")

        # The approver role reaches the session, but the session refuses its confirmation of
        # another user's write call (403, still pending); the user rejects it.
        turn = asyncio.create_task(http.post(f"/v1/sessions/{sid}/messages", json={"text": "Save a note: sell eggs"}, headers=alice))
        for _ in range(1200):
            pending_now = await hermes.get_pending_approvals(sid)
            if pending_now:
                break
            await asyncio.sleep(0.1)
        second = pending_now[0].tool_call_id
        refused = assert_problem(await http.post(f"/v1/sessions/{sid}/approvals/{second}/reject", headers=carol), 403, "forbidden")
        assert "may not confirm" in refused["detail"] and not turn.done()
        refused = assert_problem(await http.post(f"/v1/sessions/{sid}/approvals/{second}/approve", headers=root), 403, "forbidden")
        assert "may not confirm" in refused["detail"] and not turn.done()
        rejected = await http.post(f"/v1/sessions/{sid}/approvals/{second}/reject", headers=alice)
        assert rejected.status_code == 200, rejected.text
        assert rejected.json()["approver"] == "alice" and rejected.json()["approved"] is False
        reply = await asyncio.wait_for(turn, 120)
        assert reply.json()["tool_calls"][0]["result"]["code"] == 5  # denied by a human
        decisions = [(d.tool_call_id, d.approver, d.outcome) for d in (await hermes.get_state(sid)).decisions]
        assert [d for d in decisions if d[0] == second] == [
            (second, "carol", "not_allowed"), (second, "root", "not_allowed"), (second, "alice", "applied"),
        ]


def test_the_readme_states_who_may_confirm_a_write_call_as_the_session_checks_it():
    """The README said approver and admin keys decide any session's approvals; the session
    takes a write call's confirmation only from its user or a listed approver."""
    text = " ".join((REPO_ROOT / "README.md").read_text(encoding="utf-8").split())
    assert "`approver` may also decide approvals of any session" not in text
    assert "or every session's with the `approver` or `admin` role |" not in text
    assert ("a `write` call (policy `confirm`) only by **the session's user or a user listed in the policy's "
            "`approvers`**") in text
    assert "the `approver` and `admin` roles do not let a key confirm another user's `write` call" in text


# --------------------------------------------------------------------------- memory


@pytest.mark.timeout(900)
async def test_memory_search_list_and_forget_reach_only_the_keys_user(run_worker, settings, keys, store):
    from hermes.memory.models import MemoryCandidate

    async with run_worker(ScriptedModel.demo(), memory=store) as worker_client:
        hermes = HermesClient(
            worker_client.client, task_queue=worker_client.task_queue, redis=worker_client.redis, memory_store=lambda: store
        )
        # The keys' users are the same in every test of the run: a memory writer an earlier
        # test started for them (test_web, test_api_stream) waits on that test's task queue,
        # which no worker polls any more, and would take this test's write for ever.
        for user in ("alice", "bob"):
            with contextlib.suppress(RPCError):
                await worker_client.client.get_workflow_handle(names.memory_writer_id(user)).terminate("a new test")
        now = datetime.now(timezone.utc)
        report = await worker_client.add_memories("alice", [MemoryCandidate(
            user_id="alice", kind="fact", text="Alice lives in Zurich", subject="home_city", value="Zurich",
            importance=0.8, confidence=1.0, source="api", source_session="t", created_at=now,
        )])
        assert report.inserted, report
        async with api_server(settings, keys["path"], hermes) as http:
            alice, bob, root = auth(keys["alice"]), auth(keys["bob"]), auth(keys["root"])
            found = await http.get("/v1/memory", params={"q": "Where does Alice live?"}, headers=alice)
            assert found.status_code == 200, found.text
            assert [m["text"] for m in found.json()["memories"]] == ["Alice lives in Zurich"]
            assert (await http.get("/v1/memory", params={"q": "Where does Alice live?"}, headers=bob)).json()["memories"] == []
            assert_problem(await http.get("/v1/memory", params={"q": "x", "user_id": "alice"}, headers=bob), 403)
            assert_problem(await http.get("/v1/memory", headers=alice), 422)
            listed = await http.get("/v1/memory/list", headers=alice)
            assert [m["text"] for m in listed.json()["memories"]] == ["Alice lives in Zurich"]
            assert (await http.get("/v1/memory/list", params={"user_id": "alice"}, headers=root)).json()["memories"]
            assert (await http.delete("/v1/memory", headers=bob)).json()["deleted"] == 0
            forgotten = await http.delete("/v1/memory", headers=alice)
            assert forgotten.status_code == 200 and forgotten.json()["deleted"] == 1
            assert (await http.get("/v1/memory/list", headers=alice)).json()["memories"] == []


# --------------------------------------------------------------------------- request bodies


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "path",
    ["/v1/sessions", "/v1/sessions/s-1/messages", "/v1/sessions/s-1/approvals/call_1/approve", "/v1/chat/completions"],
)
async def test_every_body_that_cannot_be_parsed_is_a_400_naming_why_and_a_large_one_413(keys, path):
    # Bodies are read before Temporal is needed: no server behind this app.
    nowhere = Settings(temporal_address=f"127.0.0.1:{free_port()}", redis_url=f"redis://127.0.0.1:{free_port()}/0")
    alice = {**auth(keys["alice"]), "Content-Type": "application/json"}
    openai_route = path == "/v1/chat/completions"
    async with api_server(nowhere, keys["path"]) as http:
        # Nested past Python's recursion limit: a RecursionError, answered 500 before.
        for depth in (100_000, 33):
            body = b'{"text": ' + b"[" * depth + b"]" * depth + b"}"
            doc = assert_problem(await http.post(path, content=body, headers=alice), 400, "malformed-request")
            assert "nested more than 32 levels" in doc["detail"], doc
            if openai_route:
                assert "nested" in doc["error"]["message"]
        # An integer past Python's 4,300 digits is a ValueError that is not a JSONDecodeError.
        doc = assert_problem(await http.post(path, content=b'{"text": ' + b"9" * 5000 + b"}", headers=alice), 400)
        assert "not JSON" in doc["detail"], doc
        for body in (b"[1, 2]", b'"text"', b"null", b"\xff\xfe", b'{"text": '):
            assert_problem(await http.post(path, content=body, headers=alice), 400, "malformed-request")
        big = b'{"text": "' + b"a" * (2 * 1024 * 1024) + b'"}'
        assert_problem(await http.post(path, content=big, headers=alice), 413, "payload-too-large")

        async def chunked() -> AsyncIterator[bytes]:  # no Content-Length: counted as it comes
            for _ in range(40):
                yield b" " * 65536

        assert_problem(await http.post(path, content=chunked(), headers=alice), 413, "payload-too-large")


# --------------------------------------------------------------------------- unavailable


async def test_temporal_unavailable_is_503(keys, redis_url):
    closed = Settings(temporal_address=f"127.0.0.1:{free_port()}", redis_url=redis_url)
    async with api_server(closed, keys["path"]) as http:
        health = await http.get("/health")
        assert health.status_code == 503 and health.json() == {"status": "unavailable", "temporal": False, "redis": True}
        r = await http.post("/v1/sessions", json={}, headers=auth(keys["alice"]))
        doc = assert_problem(r, 503, "unavailable")
        assert "cannot connect to Temporal" in doc["detail"] and r.headers["retry-after"]
        assert_problem(await http.get("/v1/sessions/s-1", headers=auth(keys["alice"])), 503)
        # Authentication comes first: no key is still 401, not 503.
        assert_problem(await http.get("/v1/sessions/s-1"), 401)


# --------------------------------------------------------------------------- hermes serve


@pytest.mark.timeout(900)
async def test_hermes_serve_runs_the_api_against_the_configured_servers(run_worker, temporal_client, redis_url, task_queue, keys, tmp_path):
    from tests.test_cli import clean_env

    port = free_port()
    env = clean_env(
        TEMPORAL_ADDRESS=temporal_client.service_client.config.target_host, REDIS_URL=redis_url,
        HERMES_TASK_QUEUE=task_queue, HERMES_DATA_DIR=str(tmp_path / "data"),
    )
    async with run_worker(ScriptedModel.demo(), memory=False):
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "hermes.cli", "serve", "--port", str(port), "--keys-file", str(keys["path"]),
            env=env, cwd=tmp_path, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )
        try:
            async with httpx2.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=120.0) as http:
                for _ in range(600):
                    try:
                        health = await http.get("/health")
                        break
                    except httpx2.TransportError:
                        assert proc.returncode is None, (await proc.stderr.read()).decode()
                        await asyncio.sleep(0.1)
                assert health.status_code == 200, health.text
                created = await http.post("/v1/sessions", json={}, headers=auth(keys["bob"]))
                assert created.status_code == 201, created.text
                sid = created.json()["session_id"]
                reply = await http.post(f"/v1/sessions/{sid}/messages", json={"text": "What is 2 ** 10?"}, headers=auth(keys["bob"]))
                assert reply.status_code == 200 and reply.json()["reply"].endswith("1024.")
                assert_problem(await http.get(f"/v1/sessions/{sid}", headers=auth(keys["alice"])), 404)
        finally:
            if proc.returncode is None:
                proc.send_signal(signal.SIGINT)
            out, err = await asyncio.wait_for(proc.communicate(), 60)
        assert proc.returncode == 0, err.decode()
        assert f"http://127.0.0.1:{port}" in out.decode()
