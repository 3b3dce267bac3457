"""MCP servers that misbehave as public bug reports describe, each a real process
(``tests/mcp_servers/misbehave.py``): one killed with SIGKILL in the middle of a call over
streamable HTTP or SSE, one answering HTTP 4xx with a body, one whose list cursor never
advances. Each test asserts how soon the failure is told and what it says.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from activities.tools import ToolActivities
from hermes.mcp.config import parse_mcp_config
from hermes.mcp.manager import HTTP_ERROR_BODY_CHARS, MAX_LIST_PAGES, McpManager, McpUnavailableError
from hermes.mcp.tools import McpToolset
from hermes.models import McpOrigin, RunToolInput, ToolCall, ToolResultCode
from hermes.tools.registry import ToolRegistry

SERVERS = Path(__file__).parent / "mcp_servers"
MISBEHAVE = str(SERVERS / "misbehave.py")
REFUSAL = '{"error": "insufficient_scope", "error_description": "token lacks tools:call"}'


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


async def _until(condition: Callable[[], bool], timeout_seconds: float, what: str) -> None:
    deadline = time.monotonic() + timeout_seconds
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_seconds} s waiting for {what}")
        await asyncio.sleep(0.02)


@pytest.fixture
async def serve() -> AsyncIterator[Callable[..., Any]]:
    """``await serve("--http", *options)`` starts misbehave.py on a free port and returns
    ``(process, url)``; every server is SIGKILLed (its process group) at the end."""
    started: list[subprocess.Popen[bytes]] = []

    async def start(transport: str, *options: str) -> tuple[subprocess.Popen[bytes], str]:
        port = _free_port()
        process = subprocess.Popen(
            [sys.executable, MISBEHAVE, transport, str(port), *options],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        started.append(process)

        def listening() -> bool:
            assert process.poll() is None, "the MCP server exited"
            with socket.socket() as sock:
                return sock.connect_ex(("127.0.0.1", port)) == 0

        await _until(listening, 30, "the MCP server to listen")
        return process, f"http://127.0.0.1:{port}/{'mcp' if transport == '--http' else 'sse'}"

    yield start
    for process in started:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(10)


@pytest.fixture
async def make_manager() -> AsyncIterator[Callable[[dict[str, Any]], McpManager]]:
    made: list[McpManager] = []

    def make(servers: dict[str, Any]) -> McpManager:
        made.append(McpManager(parse_mcp_config({"mcpServers": servers}), environ=dict(os.environ)))
        return made[-1]

    yield make
    for manager in made:
        await manager.aclose()


def _http(url: str, transport: str, **extra: Any) -> dict[str, Any]:
    return {"url": url, **({"transport": "sse"} if transport == "--sse" else {}), **extra}


# ---------------------------------------------------------------- a server killed mid-call


@pytest.mark.parametrize("transport", ["--http", "--sse"])
async def test_a_call_fails_as_soon_as_its_http_server_is_killed_not_at_the_deadline(serve, make_manager, transport):
    process, url = await serve(transport)
    manager = make_manager({"web": _http(url, transport, timeout_seconds=30)})
    assert "block" in {t.name for t in await manager.list_tools("web")}
    call = asyncio.create_task(manager.call_tool("web", "block", {}))
    # The call is in the server's hands once the server has answered a later request.
    assert (await manager.call_tool("web", "echo", {"text": "up"})).content[0].text == "up"
    os.killpg(process.pid, signal.SIGKILL)
    killed = time.monotonic()
    with pytest.raises(McpUnavailableError) as err:
        await asyncio.wait_for(call, 25)
    took = time.monotonic() - killed
    assert took < 5, f"the call failed {took:.1f} s after the kill (its deadline was 30 s)"
    message = str(err.value)
    assert err.value.reason == "crashed" and err.value.maybe_ran
    assert "'web'" in message and "connection lost during tools/call 'block'" in message
    # What the HTTP layer saw (httpx words it either way, by when the close is read).
    assert any(w in message for w in ("peer closed connection", "Server disconnected", "ReadError"))
    status = next(s for s in manager.status() if s.name == "web")
    assert status.state == "backoff" and "connection closed mid-request" in status.last_error


# ---------------------------------------------------------------- HTTP error statuses


@pytest.mark.parametrize("transport", ["--http", "--sse"])
async def test_an_http_403_to_a_tool_call_reaches_the_caller_with_its_body(serve, make_manager, transport, caplog):
    _, url = await serve(transport, "--refuse", "403")
    manager = make_manager({"web": _http(url, transport, timeout_seconds=30)})
    started = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="hermes.mcp"), pytest.raises(McpUnavailableError) as err:
        await manager.call_tool("web", "echo", {"text": "x"})
    assert time.monotonic() - started < 10
    assert err.value.reason == "http" and err.value.http_status == 403 and not err.value.maybe_ran
    assert f"MCP server 'web' answered tools/call 'echo' with HTTP 403 Forbidden: {REFUSAL}" == str(err.value)
    assert any("HTTP 403 Forbidden" in r.getMessage() and "insufficient_scope" in r.getMessage() for r in caplog.records)
    # Only that request failed: the connection serves the next one.
    assert "echo" in {t.name for t in await manager.list_tools("web", refresh=True)}
    assert next(s for s in manager.status() if s.name == "web").state == "ready"


async def test_an_http_401_text_body_at_the_handshake_is_the_start_failure(serve, make_manager):
    _, url = await serve("--http", "--refuse", "401", "--refuse-method", "*", "--refuse-type", "text/plain",
                         "--refuse-body", "Unauthorized: the token expired at 12:00")
    manager = make_manager({"web": {"url": url, "timeout_seconds": 30}})
    started = time.monotonic()
    with pytest.raises(McpUnavailableError) as err:
        await manager.list_tools("web")
    assert time.monotonic() - started < 10
    assert err.value.reason == "start"
    assert "handshake failed: HTTP 401 Unauthorized: Unauthorized: the token expired at 12:00" in str(err.value)
    assert "TaskGroup" not in str(err.value) and "Server returned an error response" not in str(err.value)


async def test_a_long_http_404_body_is_capped_and_told_after_the_session_retry(serve, make_manager):
    body = "no such tool here. " * 400
    _, url = await serve("--http", "--refuse", "404", "--refuse-type", "text/plain", "--refuse-body", body)
    manager = make_manager({"web": {"url": url, "timeout_seconds": 30}})
    with pytest.raises(McpUnavailableError) as err:
        await manager.call_tool("web", "echo", {"text": "x"})
    message = str(err.value)
    assert err.value.http_status == 404 and "HTTP 404 Not Found: no such tool here." in message
    # A 404 to a request with a session id reads as an expired session: reopened once,
    # then the server's own answer is told.
    assert message.endswith(" ... (on a new session too)") and len(message) < HTTP_ERROR_BODY_CHARS + 200
    assert err.value.reason == "http" and not err.value.maybe_ran


async def test_a_tool_answered_with_http_403_is_a_code_2_result_at_once(serve):
    _, url = await serve("--http", "--refuse", "403")
    config = parse_mcp_config(
        {"mcpServers": {"web": {"url": url, "timeout_seconds": 30, "idempotency": "idempotent"}}}, environ=dict(os.environ)
    )
    manager = McpManager(config, environ=dict(os.environ))
    try:
        toolset = McpToolset(config, manager)
        tools = {t.name: t for t in await toolset.discover()}
        activities = ToolActivities(ToolRegistry(), None, tier_seconds={"external": 60}, mcp=toolset)
        request = RunToolInput(
            session_id="s",
            user_id="u",
            turn=1,
            tool_call=ToolCall(tool_call_id="c1", name=tools["web_echo"].name, arguments={"text": "x"}),
            mcp=McpOrigin(server="web", tool="echo"),
        )
        # An idempotent tool's failure would be raised for Temporal to retry; a 403 is not
        # worth another attempt, so it is the result at once.
        result = await activities.run_tool(request)
    finally:
        await manager.aclose()
    assert result.code == ToolResultCode.DEPENDENCY_UNAVAILABLE
    assert "HTTP 403 Forbidden" in result.message and "token lacks tools:call" in result.message
    assert result.data == {"http_status": 403}


# ---------------------------------------------------------------- pagination


async def test_a_list_whose_cursor_never_advances_stops_keeping_what_it_read(make_manager, tmp_path, caplog):
    counts = tmp_path / "requests.txt"
    manager = make_manager(
        {"loop": {"command": sys.executable, "args": [MISBEHAVE, "--paginate-forever", "--count-file", str(counts)], "timeout_seconds": 30}}
    )
    started = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="hermes.mcp"):
        tools = await manager.list_tools("loop")
        resources = await manager.list_resources("loop")
        prompts = await manager.list_prompts("loop")
    assert time.monotonic() - started < 15
    assert [t.name for t in tools] == ["echo", "pid", "block"]
    assert [str(r.uri) for r in resources] == ["note://one"] and [p.name for p in prompts] == ["greet"]
    sent = counts.read_text().split()
    assert sent.count("tools/list") == 2 and sent.count("resources/list") == 2 and sent.count("prompts/list") == 2
    warnings = [r.getMessage() for r in caplog.records if "brought nothing new" in r.getMessage()]
    assert len(warnings) == 3 and all("loop" in w for w in warnings)


async def test_a_list_that_never_ends_stops_at_the_page_cap(make_manager, tmp_path, caplog):
    counts = tmp_path / "requests.txt"
    manager = make_manager(
        {"endless": {"command": sys.executable, "args": [MISBEHAVE, "--paginate-endless", "--count-file", str(counts)], "timeout_seconds": 60}}
    )
    with caplog.at_level(logging.WARNING, logger="hermes.mcp"):
        tools = await manager.list_tools("endless")
    assert len(tools) == MAX_LIST_PAGES and tools[-1].name == f"generated_{MAX_LIST_PAGES}"
    assert counts.read_text().split().count("tools/list") == MAX_LIST_PAGES
    assert any(f"after {MAX_LIST_PAGES} pages" in r.getMessage() for r in caplog.records)
