"""The edge of ``hermes serve`` (issue 26, the low items): no answer tells which session
ids exist, the OpenAI ``user`` field cannot reach another user's session, failed keys are
limited per client address and requests per user, slow clients are cut off, open event
streams are capped per user, every answer carries security headers, and one bearer
parser serves the API and the codec server.

Real servers on sockets (uvicorn through ``hermes.api.serving.uvicorn_config``, as
``hermes serve`` runs it), the fixtures' Temporal and Redis where a route needs them.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from hermes.api import add_key
from hermes.api.openai_compat import openai_session_id
from hermes.infra.stack import free_port
from hermes.providers.scripted import ScriptedModel
from hermes.security.http_security import PAGE_CSP, bearer_token
from hermes.settings import Settings
from tests.test_api import api_server, assert_problem, auth, keys  # noqa: F401 - the fixture
from tests.test_events import STREAMING_SCRIPT


def nowhere(**settings: Any) -> Settings:
    """Settings whose Temporal and Redis do not answer (for routes that need neither)."""
    return Settings(temporal_address=f"127.0.0.1:{free_port()}", redis_url=f"redis://127.0.0.1:{free_port()}/0", **settings)


# --------------------------------------------------------------------------- 1. no existence oracle


@pytest.mark.timeout(300)
async def test_another_users_session_is_answered_exactly_as_one_that_does_not_exist_on_every_route(run_worker, settings, keys):  # noqa: F811
    async with run_worker(ScriptedModel.demo(), memory=False) as hermes, api_server(settings, keys["path"], hermes) as http:
        alice, bob = auth(keys["alice"]), auth(keys["bob"])
        sid, ghost = f"api-{uuid.uuid4()}", f"api-{uuid.uuid4()}"
        assert (await http.post("/v1/sessions", json={"session_id": sid}, headers=alice)).status_code == 201
        sse = {"Accept": "text/event-stream"}
        routes: list[tuple[str, str, dict[str, Any] | None, dict[str, str]]] = [
            ("GET", "/v1/sessions/{}", None, {}),
            ("POST", "/v1/sessions/{}/messages", {"text": "hi"}, {}),
            ("POST", "/v1/sessions/{}/messages", {"text": "hi"}, sse),
            ("GET", "/v1/sessions/{}/events", None, {}),
            ("GET", "/v1/sessions/{}/transcript", None, {}),
            ("POST", "/v1/sessions/{}/close", None, {}),
            ("POST", "/v1/sessions/{}/approvals/call_1/approve", None, {}),
            ("POST", "/v1/sessions/{}/approvals/call_1/reject", None, {}),
        ]
        for method, path, body, extra in routes:
            theirs = await http.request(method, path.format(sid), json=body, headers={**bob, **extra})
            absent = await http.request(method, path.format(ghost), json=body, headers={**bob, **extra})
            assert_problem(theirs, 404, "not-found")
            assert_problem(absent, 404, "not-found")
            assert theirs.json() == {**absent.json(), "detail": absent.json()["detail"].replace(ghost, sid)}, (method, path)
            assert theirs.headers["content-type"] == absent.headers["content-type"]
        # Nothing reached alice's session, which is still hers.
        state = await http.get(f"/v1/sessions/{sid}", headers=alice)
        assert state.status_code == 200 and state.json()["turn_count"] == 0 and state.json()["status"] != "closed"


# --------------------------------------------------------------------------- 2. no squatting


@pytest.mark.timeout(300)
async def test_the_openai_user_field_names_a_session_of_the_keys_user_so_no_one_takes_or_squats_another_users(run_worker, settings, keys):  # noqa: F811
    async with run_worker(ScriptedModel.demo(), memory=False) as hermes, api_server(settings, keys["path"], hermes) as http:
        ask = {"model": "hermes", "messages": [{"role": "user", "content": "What is 2 ** 10?"}], "user": "team-chat"}
        # bob comes first with the `user` alice will use: his own session, not hers.
        first = await http.post("/v1/chat/completions", json=ask, headers=auth(keys["bob"]))
        assert first.status_code == 200, first.text
        second = await http.post("/v1/chat/completions", json=ask, headers=auth(keys["alice"]))
        assert second.status_code == 200, second.text
        assert second.json()["choices"][0]["message"]["content"].endswith("1024.")
        bobs, alices = first.json()["hermes"]["session_id"], second.json()["hermes"]["session_id"]
        assert alices == openai_session_id("alice", "team-chat") != bobs == openai_session_id("bob", "team-chat")
        assert (await hermes.get_state(alices)).user_id == "alice" and (await hermes.get_state(bobs)).user_id == "bob"
        assert (await hermes.get_state(alices)).turn_count == 1
        # bob naming alice's session outright gets the answer of no such session.
        taken = await http.post("/v1/chat/completions", json=ask, headers={**auth(keys["bob"]), "X-Hermes-Session-Id": alices})
        assert_problem(taken, 404, "not-found")
        assert (await hermes.get_state(alices)).turn_count == 1


def test_a_derived_session_id_is_a_valid_id_however_long_the_user_field():
    from hermes.api.openai_compat import _SESSION_ID

    for user in ("u", "x" * 200, "a@b.example"):
        derived = openai_session_id("ålice with spaces", user)
        assert _SESSION_ID.match(derived) and len(derived) <= 200
    assert openai_session_id("alice", "x" * 200) != openai_session_id("alice", "x" * 199)


# --------------------------------------------------------------------------- 3. rate limits


async def test_failed_keys_are_limited_per_client_address_as_a_trusted_proxy_forwards_it(keys):  # noqa: F811
    limited = nowhere(api_auth_failures_per_minute=3, api_forwarded_allow_ips="127.0.0.1")
    async with api_server(limited, keys["path"]) as http:
        guesser, other = {"X-Forwarded-For": "203.0.113.7"}, {"X-Forwarded-For": "203.0.113.8"}
        assert_problem(await http.get("/v1/models", headers={**guesser, **auth("hk_guess-1")}), 401)
        assert_problem(await http.get("/v1/models", headers=guesser), 401)  # no key counts too
        assert_problem(await http.get("/v1/models", headers={**guesser, "Authorization": "Basic x"}), 401)
        over = await http.get("/v1/models", headers={**guesser, **auth("hk_guess-4")})
        doc = assert_problem(over, 429, "rate-limited")
        assert 1 <= int(over.headers["retry-after"]) <= 60 and "3 requests a minute" in doc["detail"]
        # Refused before the key is looked at: a right key from there is no different.
        assert_problem(await http.get("/v1/models", headers={**guesser, **auth(keys["alice"])}), 429)
        # Another address, and routes that need no key, are not held back.
        assert (await http.get("/v1/models", headers={**other, **auth(keys["alice"])})).status_code == 200
        assert (await http.get("/openapi.json", headers=guesser)).status_code == 200


async def test_without_a_trusted_proxy_a_forwarded_address_is_ignored(keys):  # noqa: F811
    async with api_server(nowhere(api_auth_failures_per_minute=2), keys["path"]) as http:
        for n in range(2):
            forged = {"X-Forwarded-For": f"198.51.100.{n}"}
            assert_problem(await http.get("/v1/models", headers={**forged, **auth("hk_guess")}), 401)
        forged = {"X-Forwarded-For": "198.51.100.99"}
        assert_problem(await http.get("/v1/models", headers={**forged, **auth(keys["alice"])}), 429)


async def test_a_users_keys_share_one_request_budget(keys):  # noqa: F811
    second = add_key(keys["path"], "alice", ["user"], label="second key")
    async with api_server(nowhere(api_rate_per_minute=3), keys["path"]) as http:
        for key in (keys["alice"], second, keys["alice"]):
            assert (await http.get("/v1/models", headers=auth(key))).status_code == 200
        doc = assert_problem(await http.get("/v1/models", headers=auth(second)), 429, "rate-limited")
        assert "alice" in doc["detail"]
        assert (await http.get("/v1/models", headers=auth(keys["bob"]))).status_code == 200


# --------------------------------------------------------------------------- 4. read deadlines


async def _held_until_closed(reader: asyncio.StreamReader) -> bytes:
    return await asyncio.wait_for(reader.read(), 20)


@pytest.mark.timeout(120)
async def test_slow_clients_are_answered_408_and_cut_off_while_others_are_served(keys):  # noqa: F811
    quick = nowhere(api_header_timeout_seconds=1.0, api_body_timeout_seconds=1.0)
    async with api_server(quick, keys["path"]) as http:
        port = http.base_url.port
        key = keys["alice"]
        opened: list[tuple[str, asyncio.StreamReader, asyncio.StreamWriter]] = []
        # 300 clients: 100 connect and send nothing, 100 send half their headers,
        # 100 send their headers and half a body.
        for n in range(300):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            if n % 3 == 1:
                writer.write(b"GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bea")
                kind = "headers"
            elif n % 3 == 2:
                writer.write(
                    b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                    b"Authorization: Bearer " + key.encode() + b"\r\nContent-Length: 200\r\n\r\n{\"model\": "
                )
                kind = "body"
            else:
                kind = "idle"
            await writer.drain()
            opened.append((kind, reader, writer))
        # Meanwhile the server answers others.
        assert (await http.get("/v1/models", headers=auth(key))).status_code == 200
        started = time.monotonic()
        answers = await asyncio.gather(*(_held_until_closed(reader) for _, reader, _ in opened))
        assert time.monotonic() - started < 15
        for (kind, _, writer), answer in zip(opened, answers):
            if kind == "idle":
                assert answer == b""
            else:
                assert answer.startswith(b"HTTP/1.1 408 "), (kind, answer[:200])
            writer.close()


@pytest.mark.timeout(120)
async def test_headers_sent_a_byte_at_a_time_do_not_extend_the_deadline_even_on_a_kept_alive_connection(keys):  # noqa: F811
    quick = nowhere(api_header_timeout_seconds=1.0, api_body_timeout_seconds=1.0)
    async with api_server(quick, keys["path"]) as http:
        reader, writer = await asyncio.open_connection("127.0.0.1", http.base_url.port)
        writer.write(b"GET /openapi.json HTTP/1.1\r\nHost: x\r\n\r\n")
        await writer.drain()
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 20)
        assert head.startswith(b"HTTP/1.1 200 ")
        length = int(next(line.split(b":")[1] for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")))
        await asyncio.wait_for(reader.readexactly(length), 20)
        # The next request on the same connection, a byte every 0.2 s: cut off after about 1 s.
        started = time.monotonic()
        request = b"GET /openapi.json HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 200 + b"\r\n\r\n"
        reading = asyncio.create_task(reader.read())
        sent = 0
        with contextlib.suppress(ConnectionError):
            while sent < len(request) and not reading.done():
                writer.write(request[sent:sent + 1])
                await writer.drain()
                sent += 1
                await asyncio.wait({reading}, timeout=0.2)  # the client's pace, or the server's answer
        answer = await asyncio.wait_for(reading, 20)
        assert answer.startswith(b"HTTP/1.1 408 ") and sent < len(request), (sent, answer[:200])
        assert time.monotonic() - started < 10
        writer.close()


# --------------------------------------------------------------------------- 5. open streams


@pytest.mark.timeout(300)
async def test_open_event_streams_are_capped_per_user_and_a_closed_one_frees_its_slot(run_worker, settings, keys):  # noqa: F811
    second = add_key(keys["path"], "alice", ["user"], label="second key")
    capped = settings.model_copy(update={"api_max_streams_per_user": 2})
    async with run_worker(STREAMING_SCRIPT, memory=False) as hermes, api_server(capped, keys["path"], hermes) as http:
        alice, bob = auth(keys["alice"]), auth(keys["bob"])
        sid = f"api-{uuid.uuid4()}"
        assert (await http.post("/v1/sessions", json={"session_id": sid}, headers=alice)).status_code == 201
        bobs = f"api-{uuid.uuid4()}"
        assert (await http.post("/v1/sessions", json={"session_id": bobs}, headers=bob)).status_code == 201
        url = f"/v1/sessions/{sid}/events"
        async with contextlib.AsyncExitStack() as stack:
            first = await stack.enter_async_context(http.stream("GET", url, headers=alice))
            assert first.status_code == 200
            async with http.stream("GET", url, headers=auth(second)) as other:
                assert other.status_code == 200
                # A third stream of alice's, by either key and of any kind, is refused.
                # (Bounded: were it not refused, a stream would not end.)
                over = await asyncio.wait_for(http.get(url, headers=alice), 30)
                doc = assert_problem(over, 429, "too-many-streams")
                assert "2 event streams" in doc["detail"] and "HERMES_API_MAX_STREAMS_PER_USER" in doc["detail"]
                streamed = await asyncio.wait_for(http.post(f"/v1/sessions/{sid}/messages", json={"text": "now talk"},
                                                            headers={**auth(second), "Accept": "text/event-stream"}), 30)
                assert_problem(streamed, 429, "too-many-streams")
                completion = {"model": "hermes", "stream": True, "messages": [{"role": "user", "content": "now talk"}]}
                refused = http.post("/v1/chat/completions", json=completion, headers={**alice, "X-Hermes-Session-Id": sid})
                assert_problem(await asyncio.wait_for(refused, 30), 429, "too-many-streams")
                # bob has his own budget.
                async with http.stream("GET", f"/v1/sessions/{bobs}/events", headers=bob) as his:
                    assert his.status_code == 200
            # The closed stream's slot is free again (once the server has seen it go).
            for _ in range(200):
                async with http.stream("GET", url, headers=alice) as again:
                    if again.status_code == 200:
                        break
                await asyncio.sleep(0.05)
            assert again.status_code == 200
        assert (await hermes.get_state(sid)).turn_count == 0


# --------------------------------------------------------------------------- 6. security headers


async def test_every_answer_of_the_api_and_its_page_carries_the_security_headers(keys):  # noqa: F811
    async with api_server(nowhere(), keys["path"]) as http:
        answers = [
            await http.get("/"),
            await http.get("/static/app.js"),
            await http.get("/static/app.css"),
            await http.get("/openapi.json"),
            await http.get("/v1/models", headers=auth(keys["alice"])),
            await http.get("/v1/models"),  # 401
            await http.get("/no/such/route"),  # 404
            await http.post("/v1/sessions", content=b"{", headers=auth(keys["alice"])),  # 400
        ]
        for answer in answers:
            assert answer.headers["content-security-policy"] == PAGE_CSP, answer.request.url
            assert answer.headers["x-frame-options"] == "DENY"
            assert answer.headers["x-content-type-options"] == "nosniff"
            assert answer.headers["referrer-policy"] == "no-referrer"
        assert "frame-ancestors 'none'" in PAGE_CSP and "'unsafe-inline'" not in PAGE_CSP


def test_the_web_page_has_no_inline_script_or_style_a_strict_policy_would_block():
    import re

    static = Path(__file__).resolve().parents[1] / "hermes" / "api" / "static"
    page = (static / "index.html").read_text(encoding="utf-8")
    scripts = re.findall(r"<script\b([^>]*)>(.*?)</script>", page, flags=re.S | re.I)
    assert scripts and all("src=" in attrs and not body.strip() for attrs, body in scripts)
    assert not re.search(r"<style\b|\sstyle=|\son[a-z]+=|javascript:", page, flags=re.I)
    script = (static / "app.js").read_text(encoding="utf-8")
    assert not re.search(r"\.style\b|setAttribute\(\s*['\"]style|\beval\(|new Function\(|\son[a-z]+=", script)


# --------------------------------------------------------------------------- 7. one bearer parser


def test_the_bearer_scheme_is_matched_in_any_case_and_nothing_else_passes():
    for header in ("Bearer tok", "bearer tok", "BEARER tok", "  Bearer   tok  "):
        assert bearer_token(header) == "tok", header
    for header in (None, "", "Bearer", "Bearer   ", "Basic tok", "Bearertok", "tok"):
        assert bearer_token(header) is None, header


async def test_the_api_takes_a_lower_case_bearer_scheme(keys):  # noqa: F811
    async with api_server(nowhere(), keys["path"]) as http:
        info = await http.get("/v1/models", headers={"Authorization": f"bearer {keys['alice']}"})
        assert info.status_code == 200, info.text


# --------------------------------------------------------------------------- the Temporal Web UI link


async def test_info_links_the_temporal_web_ui_of_a_remote_temporal_when_one_is_configured_or_it_is_temporal_cloud(
    keys, monkeypatch  # noqa: F811
):
    alice = auth(keys["alice"])
    for name in ("TEMPORAL_ADDRESS", "HERMES_TEMPORAL_ADDRESS", "HERMES_TEMPORAL_UI_URL"):
        monkeypatch.delenv(name, raising=False)
    seen = {}
    cases = {
        "self-hosted, configured": ("temporal.internal:7233", "http://temporal-ui.internal:8080/"),
        "self-hosted, not configured": ("temporal.internal:7233", None),
        "cloud namespace endpoint": ("prod.a1b2c.tmprl.cloud:7233", None),
        "cloud API-key endpoint": ("us-east-1.aws.api.temporal.io:7233", None),
        "cloud, configured off": ("prod.a1b2c.tmprl.cloud:7233", ""),
    }
    for case, (address, ui) in cases.items():
        monkeypatch.setenv("TEMPORAL_ADDRESS", address)
        if ui is None:
            monkeypatch.delenv("HERMES_TEMPORAL_UI_URL", raising=False)
        else:
            monkeypatch.setenv("HERMES_TEMPORAL_UI_URL", ui)
        # As `hermes serve` reads them: from the environment.
        async with api_server(Settings(_env_file=None), keys["path"]) as http:
            r = await http.get("/v1/info", headers=alice)
        assert r.status_code == 200, r.text
        seen[case] = r.json()["temporal_ui_url"]
    assert seen == {
        "self-hosted, configured": "http://temporal-ui.internal:8080",
        "self-hosted, not configured": None,
        "cloud namespace endpoint": "https://cloud.temporal.io",
        "cloud API-key endpoint": "https://cloud.temporal.io",
        "cloud, configured off": None,
    }
