"""MCP answers kept and calls that wait (issue 27), on the suite's real Temporal and Redis
with real MCP server processes (``tests/mcp_servers/outputs.py``, ``crashy.py``).

- A tool whose answer does not fit its declared output schema (text only, or structured
  content off the schema) ran once: its answer reaches the model with a warning, and it is
  neither run again nor reported "outcome unknown".
- A call in a stdio server's restart backoff waits for the relaunch when that comes
  before its deadline; an idempotent tool whose server died mid-call succeeds on a retry,
  also when another turn's tool list, asked during the backoff, had none of its tools.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from hermes.mcp.config import parse_mcp_config
from hermes.mcp.manager import BACKOFF_FIRST_SECONDS, McpManager, McpUnavailableError
from hermes.mcp.tools import McpToolset, McpUnavailable
from hermes.models import McpOrigin, ToolSpec
from tests.support import eventually
from tests.test_cli import cli_env, hermes_cli  # noqa: F401 - cli_env is a fixture
from tests.test_mcp_session import listed, open_toolset, results_json
from tests.test_tool_layer import Steps
from workflows.tool_calls import tool_activity_options

SERVERS = Path(__file__).resolve().parent / "mcp_servers"
REPORT_TEXT = "rows: 42\ntotal: 42 (all rows read)"


@pytest.fixture
def ledger(tmp_path: Path) -> Path:
    """The file the ``outputs`` server appends ``<tool> ran`` to, once per run."""
    return tmp_path / "ledger.txt"


def runs(ledger: Path) -> list[str]:
    return ledger.read_text(encoding="utf-8").splitlines() if ledger.exists() else []


def outputs(ledger: Path, **keys: Any) -> dict[str, Any]:
    return {"outputs": {"command": sys.executable, "args": [str(SERVERS / "outputs.py"), str(ledger)], **keys}}


# ---------------------------------------------------------------- answers off their output schema


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "keys", [{}, {"tools": {"report": {"idempotency": "idempotent"}}}], ids=["default", "marked-idempotent"]
)
async def test_a_text_answer_to_a_tool_with_an_output_schema_reaches_the_model_once_with_a_warning(
    run_worker, session_id, ledger, keys, caplog
):
    model = Steps([("outputs_report", {})], results_json)
    with caplog.at_level(logging.WARNING, logger="hermes.mcp"):
        async with open_toolset(outputs(ledger, **keys)) as toolset, run_worker(model, mcp=toolset, memory=False) as hermes:
            await listed(toolset, "outputs_report")
            result = await hermes.send_message(session_id, "how many rows?", user_id="alice")
    assert runs(ledger) == ["report ran"]  # the server ran it exactly once
    [call] = result.tool_calls
    assert int(call.result.code) == 0, call.result.message
    assert call.result.data == REPORT_TEXT
    assert call.result.message.startswith("ok; warning: ") and "no structured content" in call.result.message
    assert not result.warnings  # nothing "outcome unknown" for the user
    [seen] = json.loads(result.reply)  # what the model was given for the call
    assert seen["data"] == REPORT_TEXT and "output schema" in seen["message"]
    assert any("output schema" in r.getMessage() and "report" in r.getMessage() for r in caplog.records)


async def test_structured_content_off_the_output_schema_is_kept_with_a_warning_naming_the_field(ledger):
    async with open_toolset(outputs(ledger)) as toolset:
        [tool] = [t for t in await toolset.discover() if t.name == "outputs_wrong_report"]
        result = await tool.invoke({}, None)
    assert runs(ledger) == ["wrong_report ran"]
    assert int(result.code) == 0 and result.data == {"total": "42"}
    assert "does not match the tool's output schema at total" in result.message


@pytest.mark.timeout(120)
async def test_hermes_mcp_call_prints_a_text_answer_off_the_output_schema_with_the_warning(cli_env, ledger, tmp_path):
    config = tmp_path / "mcp.json"
    config.write_text(json.dumps({"mcpServers": outputs(ledger)}), encoding="utf-8")
    called = await hermes_cli("mcp", "call", "outputs", "report", env={**cli_env, "HERMES_MCP_CONFIG": str(config)}, cwd=tmp_path)
    assert called.returncode == 0, called.stderr
    printed = json.loads(called.stdout)
    assert printed["data"] == REPORT_TEXT and "no structured content" in printed["message"]
    assert runs(ledger) == ["report ran"]


# ---------------------------------------------------------------- calls in a restart backoff


async def test_a_call_right_after_a_stdio_server_crash_waits_for_the_relaunch_and_succeeds():
    config = parse_mcp_config(
        {"mcpServers": {"crashy": {"command": sys.executable, "args": [str(SERVERS / "crashy.py")], "timeout_seconds": 10}}},
        environ=dict(os.environ),
    )
    async with McpManager(config, environ=dict(os.environ)) as manager:
        with pytest.raises(McpUnavailableError) as err:
            await manager.call_tool("crashy", "crash", {})
        assert err.value.reason == "crashed"
        [status] = manager.status()
        assert status.state == "backoff"
        started = time.monotonic()
        result = await manager.call_tool("crashy", "ok", {})
        waited = time.monotonic() - started
        assert result.content[0].text == "ok"
        assert waited <= BACKOFF_FIRST_SECONDS + 5  # the backoff, then a start: not the 10 s deadline
        assert manager.status()[0].restarts == 1

        # A call whose deadline ends before the next relaunch is refused at once, saying so.
        with pytest.raises(McpUnavailableError):
            await manager.call_tool("crashy", "crash", {})
        started = time.monotonic()
        with pytest.raises(McpUnavailableError, match=r"next start attempt in [12]\.\d s, after this request's 0\.5 s deadline") as err:
            await manager.call_tool("crashy", "ok", {}, timeout_seconds=0.5)
        assert err.value.reason == "backoff" and time.monotonic() - started < 0.3


@pytest.mark.timeout(120)
async def test_an_idempotent_tool_whose_server_died_mid_call_succeeds_on_a_retry(
    run_worker, session_id, ledger
):
    model = Steps([("outputs_crash_once", {})], results_json)
    async with open_toolset(outputs(ledger)) as toolset, run_worker(model, mcp=toolset, memory=False) as hermes:
        await listed(toolset, "outputs_crash_once")
        result = await hermes.send_message(session_id, "sync", user_id="alice")
    [call] = result.tool_calls
    assert int(call.result.code) == 0, call.result.message
    assert call.result.data == {"result": "recovered"}
    assert (ledger.with_name(ledger.name + ".crashed")).exists() and runs(ledger) == ["crash_once ran"]


async def test_a_call_recorded_before_its_server_crashed_finds_its_tool_and_waits_for_the_relaunch(ledger):
    # The tool list is asked every time (TTL 0), so a listing in the backoff has nothing.
    async with open_toolset(outputs(ledger, list_ttl_seconds=0)) as toolset:
        [tool] = [t for t in await toolset.discover() if t.name == "outputs_crash_once"]
        with pytest.raises(McpUnavailable, match="connection lost"):
            await tool.invoke({}, None)  # kills the server mid-call
        assert "outputs_crash_once" not in {t.name for t in await toolset.discover()}  # another turn's list
        again = await toolset.tool_for("outputs_crash_once", tool.origin)  # the recorded call's retry
        assert again is not None
        result = await again.invoke({}, None)
    assert int(result.code) == 0 and result.data == {"result": "recovered"}


def test_the_retries_of_an_idempotent_mcp_tool_span_more_than_the_first_restart_backoff():
    spec = ToolSpec(name="x_sync", description="", parameters={"type": "object"}, mcp=McpOrigin(server="x", tool="sync"))
    retry = tool_activity_options(spec)["retry_policy"]
    waits = [retry.initial_interval.total_seconds() * retry.backoff_coefficient**n for n in range(retry.maximum_attempts - 1)]
    assert sum(waits) > BACKOFF_FIRST_SECONDS
