"""MCP tools inside a session, on the suite's real Temporal and Redis: a turn that calls
tools of two MCP servers (the npm ``server-everything`` and a server of our own) and a
built-in tool, a tool list that changes between turns, and the replay of that history.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer

from hermes.mcp.config import parse_mcp_config
from hermes.mcp.manager import McpManager
from hermes.mcp.tools import McpToolset
from tests.conftest import builtin_registry
from tests.mcp_servers.installed import everything_stdio, need
from tests.support import eventually
from tests.test_tool_layer import Steps
from workflows.composite import CompositeToolWorkflow
from workflows.session import SessionWorkflow

SERVERS = Path(__file__).resolve().parent / "mcp_servers"
TEXT = "中文 · 😀 · <|endoftext|> · \u200b · \"quoted\"\nsecond line"
SUFFIX = "Service boundary: the Hermes test server; it knows nothing about real orders."


@pytest.fixture
async def toolset() -> AsyncIterator[McpToolset]:
    command, args = need(everything_stdio(), "server-everything")
    config = parse_mcp_config(
        {
            "mcpServers": {
                "everything": {"command": command, "args": args, "idempotency": "idempotent", "allow": ["echo", "get-sum"]},
                "local": {
                    "command": sys.executable,
                    "args": [str(SERVERS / "normal.py")],
                    "description_suffix": SUFFIX,
                    "list_ttl_seconds": 600,
                    "tools": {"echo": {"idempotency": "idempotent"}},
                },
            }
        },
        environ=dict(os.environ),
    )
    manager = McpManager(config, environ=dict(os.environ))
    try:
        yield McpToolset(config, manager, reserved=set(builtin_registry().names()))
    finally:
        await manager.aclose()


@asynccontextmanager
async def open_toolset(servers: dict[str, Any]) -> AsyncIterator[McpToolset]:
    """A toolset over these ``mcpServers`` entries (its manager closed on exit)."""
    config = parse_mcp_config({"mcpServers": servers}, environ=dict(os.environ))
    manager = McpManager(config, environ=dict(os.environ))
    try:
        yield McpToolset(config, manager, reserved=set(builtin_registry().names()))
    finally:
        await manager.aclose()


def results_json(request: Any) -> str:
    last_user = max(i for i, m in enumerate(request.messages) if m.role == "user")
    return json.dumps(
        [json.loads(m.content or "{}") for m in request.messages[last_user:] if m.role == "tool"], ensure_ascii=False
    )


async def test_one_turn_gets_the_results_of_two_mcp_servers_and_a_builtin_tool(run_worker, session_id, toolset):
    model = Steps(
        [("everything_echo", {"message": TEXT}), ("local_echo", {"text": TEXT}), ("calculate", {"expression": "6*7"})],
        results_json,
    )
    async with run_worker(model, registry=builtin_registry(), mcp=toolset) as hermes:
        result = await hermes.send_message(session_id, "echo it everywhere", user_id="alice")
    assert [(r.name, int(r.result.code)) for r in result.tool_calls] == [
        ("everything_echo", 0),
        ("local_echo", 0),
        ("calculate", 0),
    ]
    assert TEXT in result.tool_calls[0].result.data  # server-everything answers "Echo: <text>"
    assert result.tool_calls[1].result.data == {"result": TEXT}  # structured content, byte-identical
    offered = set(model.offered[0])
    assert {"everything_echo", "everything_get-sum", "local_echo", "local_grow", "calculate"} <= offered
    assert not any(name.startswith("everything_") and name not in ("everything_echo", "everything_get-sum") for name in offered)


async def test_a_tool_list_that_changes_between_turns_is_seen_by_the_next_turn_and_the_history_replays(
    run_worker, session_id, toolset, temporal_client: Client
):
    model = Steps([("local_grow", {})], "grown")
    async with run_worker(model, registry=builtin_registry(), mcp=toolset, memory=False) as hermes:  # reads every model request: no memory extraction calls
        first = await hermes.send_message(session_id, "grow a tool", user_id="alice")
        model.steps = ([("local_extra_1", {})], results_json)
        second = await hermes.send_message(session_id, "call the new tool", user_id="alice")
        # A tool the server no longer lists: a clean error result, the session goes on.
        model.steps = ([("local_extra_9", {})], results_json)
        third = await hermes.send_message(session_id, "call a tool that is gone", user_id="alice")
        history = await temporal_client.get_workflow_handle(session_id).fetch_history()
    assert first.tool_calls[0].result.data == {"result": "extra_1"}
    assert "local_extra_1" not in model.offered[0] and "local_extra_1" in model.offered[2]
    assert second.tool_calls[0].result.code == 0 and second.tool_calls[0].result.data == {"result": "extra_1"}
    assert third.status == "completed" and third.tool_calls[0].result.code != 0
    # The tool lists are in the history: replay needs no MCP server and no worker cache.
    replay = await Replayer(
        workflows=[SessionWorkflow, CompositeToolWorkflow], data_converter=pydantic_data_converter
    ).replay_workflow(history)
    assert replay.replay_failure is None


async def test_a_hung_server_and_one_that_never_starts_become_error_results_and_the_session_goes_on(
    run_worker, session_id, temporal_client: Client, tmp_path
):
    secret = "s3cr3t-token-value-1234"
    config = parse_mcp_config(
        {
            "mcpServers": {
                "slow": {"command": sys.executable, "args": [str(SERVERS / "hang.py")], "timeout_seconds": 2},
                "gone": {"command": str(tmp_path / "not-installed"), "env": {"API_TOKEN": "${HERMES_TEST_SECRET}"}},
                "local": {"command": sys.executable, "args": [str(SERVERS / "normal.py")], "env": {"API_TOKEN": "${HERMES_TEST_SECRET}"}},
            }
        },
        environ={**os.environ, "HERMES_TEST_SECRET": secret},
    )
    manager = McpManager(config, environ={**os.environ, "HERMES_TEST_SECRET": secret})
    toolset = McpToolset(config, manager, reserved=set(builtin_registry().names()))
    try:
        # A worker lists every turn; a cold Python server may take longer to start than
        # the 2 s listing budget on a loaded machine, and is listed once it has started.
        async def slow_listed() -> set[str] | None:
            names = {t.name for t in await toolset.discover()}
            return names if "slow_hang" in names else None

        listed = await eventually(slow_listed, what="the slow server's tools to be listed")
        model = Steps([("slow_hang", {}), ("local_echo", {"text": "still here"})], results_json)
        async with run_worker(model, registry=builtin_registry(), mcp=toolset, memory=False) as hermes:  # reads every model request: no memory extraction calls
            result = await hermes.send_message(session_id, "try them", user_id="alice")
            model.steps = ([("local_echo", {"text": "next turn"})], results_json)
            after = await hermes.send_message(session_id, "again", user_id="alice")
            history = await temporal_client.get_workflow_handle(session_id).fetch_history()
    finally:
        await manager.aclose()
    assert not any(name.startswith("gone_") for name in listed)  # never started: no tools, no error for the others
    slow, echo = result.tool_calls
    assert slow.result.code in (2, 4) and "slow" in slow.result.message
    assert echo.result.code == 0 and echo.result.data == {"result": "still here"}
    assert after.tool_calls[0].result.data == {"result": "next turn"}
    assert secret not in history.to_json()


async def test_a_servers_resources_and_prompts_are_offered_as_read_only_tools(run_worker, session_id, toolset):
    model = Steps(
        [("local_resources_read", {"uri": "note://greeting"}), ("local_prompts_get", {"name": "greet", "arguments": {"name": "小明"}})],
        results_json,
    )
    async with run_worker(model, registry=builtin_registry(), mcp=toolset) as hermes:
        result = await hermes.send_message(session_id, "read and prompt", user_id="alice")
    resource, prompt = result.tool_calls
    assert resource.result.code == 0 and resource.result.data["text"] == "hello from a resource ✓"
    assert prompt.result.code == 0 and "小明" in json.dumps(prompt.result.data, ensure_ascii=False)
    assert all(r.approval == "not_required" for r in result.tool_calls)  # read-only, whatever the server's permission


async def test_the_four_third_party_servers_answer_through_hermes_in_one_session(run_worker, session_id, tmp_path):
    """server-everything and server-filesystem (npm), mcp-server-time and mcp-server-git
    (PyPI), as installed from the committed lock files, each called through Hermes'
    manager and tool layer in one turn."""
    import subprocess

    from tests.mcp_servers.installed import filesystem_stdio, git_stdio, time_stdio

    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "报告.txt").write_text("季度报告 ✓", encoding="utf-8")
    repo = tmp_path / "repo"
    subprocess.run(["git", "init", "-q", "-b", "trunk", str(repo)], check=True)
    (repo / "new.txt").write_text("x", encoding="utf-8")
    commands = {
        "everything": need(everything_stdio(), "server-everything"),
        "files": need(filesystem_stdio(docs), "server-filesystem"),
        "time": need(time_stdio(), "mcp-server-time"),
        "git": need(git_stdio(repo), "mcp-server-git"),
    }
    config = parse_mcp_config(
        {"mcpServers": {name: {"command": cmd, "args": args, "idempotency": "idempotent"} for name, (cmd, args) in commands.items()}},
        environ=dict(os.environ),
    )
    manager = McpManager(config, environ=dict(os.environ))
    toolset = McpToolset(config, manager, reserved=set(builtin_registry().names()))
    model = Steps(
        [
            ("everything_get-sum", {"a": 2, "b": "3"}),
            ("files_list_directory", {"path": str(docs)}),
            ("time_get_current_time", {"timezone": "Asia/Shanghai"}),
            ("git_git_status", {"repo_path": str(repo)}),
        ],
        results_json,
    )
    try:
        async with run_worker(model, registry=builtin_registry(), mcp=toolset) as hermes:
            result = await hermes.send_message(session_id, "ask every server", user_id="alice")
    finally:
        await manager.aclose()
    codes = {r.name: (int(r.result.code), json.dumps(r.result.data, ensure_ascii=False)) for r in result.tool_calls}
    assert all(code == 0 for code, _ in codes.values()), codes
    assert "5" in codes["everything_get-sum"][1]  # "3" was coerced to a number by the tool layer
    assert "报告.txt" in codes["files_list_directory"][1]
    assert "Asia/Shanghai" in codes["time_get_current_time"][1]
    assert "new.txt" in codes["git_git_status"][1]


async def listed(toolset: McpToolset, name: str) -> None:
    """Wait until the server has started and listed ``name`` (then cached for the turn): a
    cold start on a loaded machine can take longer than a turn's listing budget."""

    async def found() -> bool:
        return name in {t.name for t in await toolset.discover()}

    await eventually(found, what=f"{name} to be listed")
