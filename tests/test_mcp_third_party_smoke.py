"""The pinned third-party MCP servers (``tests/mcp_servers``) work over stdio with the ``mcp``
client, and leave no process behind once the client is closed; ``server-everything`` also
over streamable HTTP through Hermes' ``McpManager``.

One real server per test, started by ``mcp.stdio_client`` as users' editors start them:
initialize, list the tools, call one. Each server process gets a unique environment variable,
so the test finds it, and any child it started, in ``/proc`` while it runs and checks that none
is left (not even a zombie) after the client exits. A server that is not installed skips its
test with the install command (fails it in CI, see ``tests/mcp_servers/installed.py``).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import datetime, timedelta, timezone
from pathlib import Path

import anyio
import pytest
from mcp import ClientSession, StdioServerParameters, stdio_client

from hermes.mcp.config import parse_mcp_config
from hermes.mcp.manager import McpManager, McpUnavailableError
from tests.mcp_servers import installed

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="the process checks read /proc"
)

MARKER_ENV = "HERMES_MCP_SMOKE_MARKER"
STEP_SECONDS = 20.0
"""Bound on starting a server plus one request; they take about a second here."""
GONE_WITHIN_SECONDS = 5.0
TEXT = "héllo 你好 🎉 <|endoftext|> \"quoted\"\n second line"


def _processes_marked(marker: str) -> set[int]:
    """Pids of the live processes whose environment holds ``MARKER_ENV=marker``."""
    needle = f"{MARKER_ENV}={marker}".encode()
    pids = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:  # gone meanwhile, or a kernel thread
            continue
        if needle in environ.split(b"\0"):
            pids.add(int(entry.name))
    return pids


async def _wait_until_gone(marker: str, seen: set[int]) -> set[int]:
    """Polls until no marked process is left and no pid in ``seen`` exists (zombies
    included); returns what is still there after ``GONE_WITHIN_SECONDS``."""
    with anyio.move_on_after(GONE_WITHIN_SECONDS):
        while True:
            left = _processes_marked(marker) | {p for p in seen if Path(f"/proc/{p}").exists()}
            if not left:
                return left
            await anyio.sleep(0.05)
    return _processes_marked(marker) | {p for p in seen if Path(f"/proc/{p}").exists()}


@asynccontextmanager
async def _connected(
    command: installed.StdioCommand, tmp_path: Path, env: dict[str, str] | None = None
) -> AsyncIterator[ClientSession]:
    """An initialized session to the server ``command`` starts (with ``env`` added to its
    environment); on exit, asserts that the server and every process it started are gone."""
    marker = uuid.uuid4().hex
    params = StdioServerParameters(
        command=command[0], args=command[1], env={**(env or {}), MARKER_ENV: marker}, cwd=tmp_path
    )
    seen: set[int] = set()
    with (tmp_path / "server-stderr.log").open("w", encoding="utf-8") as errlog:
        async with stdio_client(params, errlog=errlog) as (read, write):
            async with ClientSession(read, write, read_timeout_seconds=STEP_SECONDS) as session:
                with anyio.fail_after(STEP_SECONDS):
                    await session.initialize()
                seen = _processes_marked(marker)
                assert seen, "the server process was not found by its marker"
                yield session
    left = await _wait_until_gone(marker, seen)
    assert not left, f"processes left after the client closed: {sorted(left)}"


def _texts(result) -> list[str]:
    return [block.text for block in result.content if block.type == "text"]


async def test_server_everything_lists_its_tools_and_echoes_text_byte_identical(tmp_path):
    command = installed.need(installed.everything_stdio(), "@modelcontextprotocol/server-everything")
    async with _connected(command, tmp_path) as session:
        assert session.server_info.name == "mcp-servers/everything"
        names = {tool.name for tool in (await session.list_tools()).tools}
        assert {"echo", "get-sum", "get-tiny-image", "trigger-long-running-operation"} <= names
        result = await session.call_tool("echo", {"message": TEXT})
        assert not result.is_error
        assert _texts(result) == [f"Echo: {TEXT}"]


async def test_server_filesystem_lists_the_allowed_directory_and_refuses_outside_it(tmp_path):
    root = tmp_path / "root"
    (root / "sub").mkdir(parents=True)
    (root / "報告.txt").write_text("x", encoding="utf-8")
    command = installed.need(installed.filesystem_stdio(root), "@modelcontextprotocol/server-filesystem")
    async with _connected(command, tmp_path) as session:
        names = {tool.name for tool in (await session.list_tools()).tools}
        assert {"list_directory", "read_text_file", "write_file", "list_allowed_directories"} <= names
        listing = await session.call_tool("list_directory", {"path": str(root)})
        assert not listing.is_error
        assert sorted(_texts(listing)[0].splitlines()) == ["[DIR] sub", "[FILE] 報告.txt"]
        outside = await session.call_tool("list_directory", {"path": str(tmp_path)})
        assert outside.is_error
        assert "outside allowed directories" in _texts(outside)[0]


async def test_mcp_server_time_tells_the_current_time_in_a_named_zone(tmp_path):
    command = installed.need(installed.time_stdio(), "mcp-server-time")
    async with _connected(command, tmp_path) as session:
        names = {tool.name for tool in (await session.list_tools()).tools}
        assert names == {"get_current_time", "convert_time"}
        result = await session.call_tool("get_current_time", {"timezone": "Asia/Shanghai"})
        assert not result.is_error
        answer = json.loads(_texts(result)[0])
        assert answer == result.structured_content
        assert answer["timezone"] == "Asia/Shanghai"
        told = datetime.fromisoformat(answer["datetime"])
        assert told.utcoffset() == timedelta(hours=8)
        assert abs(told - datetime.now(timezone.utc)) < timedelta(minutes=1)


async def test_mcp_server_git_reports_staged_and_untracked_files_of_a_repository(tmp_path):
    repo = tmp_path / "repo"
    subprocess.run(["git", "init", "-q", "-b", "trunk", str(repo)], check=True)
    (repo / "staged.txt").write_text("a\n", encoding="utf-8")
    (repo / "untracked.txt").write_text("b\n", encoding="utf-8")
    subprocess.run(["git", "-C", str(repo), "add", "staged.txt"], check=True)
    command = installed.need(installed.git_stdio(repo), "mcp-server-git")
    async with _connected(command, tmp_path) as session:
        names = {tool.name for tool in (await session.list_tools()).tools}
        assert {"git_status", "git_log", "git_diff_staged", "git_add", "git_commit"} <= names
        result = await session.call_tool("git_status", {"repo_path": str(repo)})
        assert not result.is_error
        status = _texts(result)[0]
        assert "On branch trunk" in status
        staged, _, rest = status.partition("Untracked files:")
        assert "new file:   staged.txt" in staged
        assert "untracked.txt" in rest and "staged.txt" not in rest


async def test_server_memory_keeps_its_knowledge_graph_in_its_file(tmp_path):
    command = installed.need(installed.memory_stdio(), "@modelcontextprotocol/server-memory")
    graph = tmp_path / "memory.jsonl"
    entity = {"name": "Ada 你好", "entityType": "person", "observations": [TEXT]}
    async with _connected(command, tmp_path, env={"MEMORY_FILE_PATH": str(graph)}) as session:
        names = {tool.name for tool in (await session.list_tools()).tools}
        assert {"create_entities", "create_relations", "read_graph", "search_nodes", "open_nodes"} <= names
        created = await session.call_tool("create_entities", {"entities": [entity]})
        assert not created.is_error
        found = await session.call_tool("search_nodes", {"query": "Ada"})
        assert not found.is_error
        assert [e["observations"] for e in json.loads(_texts(found)[0])["entities"]] == [[TEXT]]
    kept = [json.loads(line) for line in graph.read_text(encoding="utf-8").splitlines()]
    assert [(e["name"], e["observations"]) for e in kept] == [("Ada 你好", [TEXT])]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


async def test_server_everything_over_streamable_http_answers_and_its_death_fails_the_call_at_once(tmp_path):
    command, args = installed.need(installed.everything_http(), "@modelcontextprotocol/server-everything")
    port = _free_port()
    with (tmp_path / "server-stderr.log").open("w", encoding="utf-8") as errlog:
        process = subprocess.Popen(
            [command, *args], env={**os.environ, "PORT": str(port)}, stdout=errlog, stderr=errlog, start_new_session=True
        )
    manager = McpManager(
        parse_mcp_config({"mcpServers": {"everything": {"url": f"http://127.0.0.1:{port}/mcp", "timeout_seconds": 60}}}),
        environ=dict(os.environ),
    )
    try:
        with anyio.fail_after(STEP_SECONDS):
            while True:
                assert process.poll() is None, "server-everything exited"
                with socket.socket() as sock:
                    if sock.connect_ex(("127.0.0.1", port)) == 0:
                        break
                await anyio.sleep(0.05)
        names = {tool.name for tool in await manager.list_tools("everything")}
        assert {"echo", "get-sum", "trigger-long-running-operation"} <= names
        result = await manager.call_tool("everything", "echo", {"message": TEXT})
        assert not result.is_error and _texts(result) == [f"Echo: {TEXT}"]

        async with anyio.create_task_group() as tg:
            failure: list[BaseException] = []

            async def long_call() -> None:
                try:
                    await manager.call_tool("everything", "trigger-long-running-operation", {"duration": 50, "steps": 5})
                except McpUnavailableError as err:
                    failure.append(err)

            tg.start_soon(long_call)
            assert _texts(await manager.call_tool("everything", "echo", {"message": "up"})) == ["Echo: up"]
            os.killpg(process.pid, signal.SIGKILL)
            killed = time.monotonic()
        took = time.monotonic() - killed
        assert failure, "the long call did not fail"
        assert took < 5, f"the call failed {took:.1f} s after the kill (its deadline was 60 s)"
        assert "'everything'" in str(failure[0]) and "connection lost during tools/call" in str(failure[0])
    finally:
        await manager.aclose()
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(10)
