"""Secrets stay out of what Hermes keeps (issue 17): every ``${ENV}`` value used by a tool
file and by MCP servers (a stdio server's env, an HTTP server's URL path and its
Authorization header), with servers that send them back in tool results, tool-level
errors, resources, prompts, tool descriptions and stderr, is searched for in every event
of the session's workflow history (payloads decoded), every Redis key and value, every log
line and every file under the LanceDB directory: none is found. The suite's real Temporal
and Redis, real MCP servers (tests/mcp_servers/echo_secrets.py) over stdio and streamable
HTTP, a real HTTP endpoint for the tool file."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from hermes.security import redaction
from hermes.mcp.config import parse_mcp_config
from hermes.mcp.manager import McpManager
from hermes.mcp.tools import McpToolset
from hermes.infra.stack import free_port
from hermes.tools.builtin import register_builtins
from hermes.tools.files import register_tool_file
from hermes.tools.registry import ToolRegistry
from tests.test_mcp_session import results_json
from tests.support import decoded_history
from tests.test_tool_files import EXAMPLE, SECRET, Endpoint
from tests.test_tool_layer import Steps

ECHO = Path(__file__).resolve().parent / "mcp_servers" / "echo_secrets.py"
STDIO_TOKEN = "stdio-tok-7Hq2-abcdef123456"
URL_TOKEN = "urltok-5Rk8-zyxw9876"
HEADER_TOKEN = "hdr-tok-Xy12-qwerty7890"
TOKENS = (STDIO_TOKEN, URL_TOKEN, HEADER_TOKEN, SECRET)


@pytest.fixture
def endpoint(monkeypatch: pytest.MonkeyPatch) -> Any:
    with Endpoint() as server:
        monkeypatch.setenv("WEATHER_API_URL", server.url)
        monkeypatch.setenv("WEATHER_API_TOKEN", SECRET)
        yield server


@pytest.fixture
async def http_server() -> AsyncIterator[int]:
    """echo_secrets.py over streamable HTTP at ``/t/<URL_TOKEN>/mcp``; its port."""
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, str(ECHO), "--http", str(port), "--path", f"/t/{URL_TOKEN}/mcp"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )
    try:
        for _ in range(600):
            assert process.poll() is None, "the MCP server exited"
            with socket.socket() as sock:
                if sock.connect_ex(("127.0.0.1", port)) == 0:
                    break
            await asyncio.sleep(0.05)
        else:
            pytest.fail("the MCP server did not listen within 30 s")
        yield port
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(10)


async def redis_text(redis: Any) -> str:
    """Every key and value in Redis, whatever its type, as text."""
    texts: list[str] = []
    async for key in redis.scan_iter(count=1000):
        kind = (await redis.type(key)).decode()
        texts.append(key.decode("utf-8", "replace"))
        if kind == "string":
            value: Any = await redis.get(key)
        elif kind == "hash":
            value = await redis.hgetall(key)
        elif kind == "list":
            value = await redis.lrange(key, 0, -1)
        elif kind == "set":
            value = await redis.smembers(key)
        elif kind == "zset":
            value = await redis.zrange(key, 0, -1)
        elif kind == "stream":
            value = await redis.xrange(key)
        else:
            value = kind
        texts.append(repr(value) if not isinstance(value, bytes) else value.decode("utf-8", "replace"))
    return "\n".join(texts)


def files_text(root: Path) -> bytes:
    return b"\n".join(p.read_bytes() for p in root.rglob("*") if p.is_file())


def test_a_secret_is_masked_in_each_form_it_comes_back_in() -> None:
    forms = redaction.secret_forms(["tok+1/2=3 é"])
    assert {"tok+1/2=3 é", "tok%2B1%2F2%3D3%20%C3%A9", "tok%2B1/2%3D3%20%C3%A9", "tok%2B1%2F2%3D3+%C3%A9"} <= set(forms)
    assert forms == sorted(forms, key=lambda s: (-len(s), s))
    assert redaction.secret_forms(["on", "1"]) == []  # too short to be a credential


def test_a_registered_secret_is_masked_in_every_log_record_of_any_logger(caplog: pytest.LogCaptureFixture) -> None:
    secret = "log-tok-Qm4-5551234"
    redaction.register([secret, "tok+1/2"])
    caplog.set_level(logging.DEBUG)
    other = logging.getLogger("some.library")
    other.info("HTTP Request: POST http://h/t/%s/mcp", secret)
    other.debug("in a query: ?key=%s", "tok%2B1%2F2")
    try:
        raise ValueError(f"bad token {secret}")
    except ValueError:
        other.exception("failed")
    other.info("nothing secret here: %d items", 3)
    assert secret not in caplog.text
    assert "HTTP Request: POST http://h/t/***/mcp" in caplog.text and "bad token ***" in caplog.text
    assert "nothing secret here: 3 items" in caplog.text and "?key=***" in caplog.text


async def test_no_env_secret_of_a_tool_file_or_an_mcp_server_reaches_history_redis_logs_or_lancedb(
    endpoint: Endpoint, http_server: int, run_worker: Any, session_id: str, temporal_client: Any, redis: Any,
    settings: Any, caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    environ = {**os.environ, "STDIO_TOKEN": STDIO_TOKEN, "URL_TOKEN": URL_TOKEN, "HEADER_TOKEN": HEADER_TOKEN}
    config = parse_mcp_config(
        {"mcpServers": {
            "local": {"command": sys.executable, "args": [str(ECHO)], "env": {"ECHO_TOKEN": "${STDIO_TOKEN}"},
                      "idempotency": "idempotent"},
            "remote": {"url": f"http://127.0.0.1:{http_server}/t/${{URL_TOKEN}}/mcp",
                       "headers": {"Authorization": "Bearer ${HEADER_TOKEN}"}, "idempotency": "idempotent"},
        }},
        environ=environ,
    )
    registry = register_builtins(ToolRegistry())
    register_tool_file(registry, EXAMPLE)
    registry.check_references()
    manager = McpManager(config, environ=environ)
    toolset = McpToolset(config, manager, reserved=set(registry.names()))
    calls = [
        ("local_whoami", {}), ("remote_whoami", {}), ("local_fail_with_token", {}), ("remote_fail_with_token", {}),
        ("local_resources_read", {"uri": "token://mine"}), ("remote_prompts_get", {"name": "leak"}),
        ("get_weather", {"city": "Paris", "units": "metric"}),
    ]
    model = Steps(calls, results_json)
    try:
        async with run_worker(model, registry=registry, mcp=toolset, memory=False) as hermes:
            result = await hermes.send_message(session_id, "who are you, everywhere?", user_id="alice")
            transcript = [m.model_dump(mode="json") for m in await hermes.get_transcript(session_id)]
            history = await temporal_client.get_workflow_handle(session_id).fetch_history()
    finally:
        await manager.aclose()

    # The servers did send their secrets back, masked on the way in.
    by_name = {r.name: r for r in result.tool_calls}
    assert [r.name for r in result.tool_calls] == [name for name, _ in calls]
    local = json.loads(by_name["local_whoami"].result.data if isinstance(by_name["local_whoami"].result.data, str)
                       else by_name["local_whoami"].result.data["result"])
    remote = json.loads(by_name["remote_whoami"].result.data if isinstance(by_name["remote_whoami"].result.data, str)
                        else by_name["remote_whoami"].result.data["result"])
    assert local == {"env": "***"}
    assert remote["authorization"] in ("***", "Bearer ***") and "/t/***/mcp" in remote["url"]
    assert "***" in by_name["local_fail_with_token"].result.message
    assert by_name["get_weather"].result.data["seen_authorization"] == "Bearer ***"
    assert "token=***" in json.dumps(by_name["local_resources_read"].result.data)
    offered = json.dumps(model.offered, ensure_ascii=False) + json.dumps(getattr(model, "requests", []), default=str)
    for token in TOKENS:
        assert token not in offered, token

    places = {
        "history": decoded_history(history.to_json()),
        "redis": await redis_text(redis),
        "logs": caplog.text,
        "lancedb": files_text(Path(settings.resolved_memory_uri)).decode("utf-8", "replace"),
        "transcript": json.dumps(transcript, ensure_ascii=False),
        "result": result.model_dump_json(),
    }
    assert "who are you, everywhere?" in places["history"]  # the scan sees payloads
    found = {(place, token) for place, text in places.items() for token in TOKENS if token in text}
    assert found == set()
