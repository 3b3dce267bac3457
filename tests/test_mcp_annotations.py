"""MCP tool annotations in a session, on the suite's real Temporal and Redis with a real
MCP server (``tests/mcp_servers/annotated.py``): ``destructiveHint`` waits for the user's
approval, ``readOnlyHint`` runs, ``idempotentHint`` is retried, the operator's
``mcpServers`` keys win over the hints, and ``hermes tools`` says what set each.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.test_cli import cli_env, hermes_cli  # noqa: F401 - cli_env is a fixture
from tests.test_mcp_session import listed, open_toolset, results_json
from tests.test_tool_layer import Steps

SERVER = Path(__file__).resolve().parent / "mcp_servers" / "annotated.py"


@pytest.fixture
def ledger(tmp_path: Path) -> Path:
    """The file ``delete_all`` appends to: a line per run."""
    return tmp_path / "ledger.txt"


def entry(ledger: Path, **keys: Any) -> dict[str, Any]:
    return {"command": sys.executable, "args": [str(SERVER), str(ledger)], **keys}


@pytest.fixture
def toolset_of() -> Callable[[dict[str, Any]], Any]:
    """``async with toolset_of(entry) as toolset``: the server ``annotated`` with these keys."""

    return lambda server: open_toolset({"annotated": server})


def lines(ledger: Path) -> list[str]:
    return ledger.read_text(encoding="utf-8").splitlines() if ledger.exists() else []


@pytest.mark.timeout(120)
async def test_a_destructive_hinted_tool_waits_for_the_users_approval_and_a_read_only_one_runs_at_once(
    run_worker, session_id, ledger, toolset_of
):
    model = Steps([("annotated_count", {})], [("annotated_delete_all", {"scope": "everything"})], results_json)
    async with toolset_of(entry(ledger)) as toolset, run_worker(model, mcp=toolset, memory=False) as hermes:
        turn = asyncio.ensure_future(hermes.send_message(session_id, "count, then delete it all", user_id="alice"))
        try:
            pending = await hermes.wait_for_approval(session_id, timeout_seconds=30)
            assert (pending.tool_name, pending.permission) == ("annotated_delete_all", "write")
            assert lines(ledger) == [], "a destructive tool ran before it was approved"
            await hermes.approve(session_id, pending.tool_call_id, approver="alice")
            result = await asyncio.wait_for(turn, 30)
        finally:
            turn.cancel()
    count, delete = result.tool_calls
    assert (count.name, count.approval, count.result.code) == ("annotated_count", "not_required", 0)
    assert (delete.approval, delete.result.code) == ("approved", 0)
    assert lines(ledger) == ["deleted everything"]


@pytest.mark.timeout(120)
async def test_the_operators_per_tool_permission_wins_over_the_hints_in_both_directions(
    run_worker, session_id, ledger, toolset_of
):
    keys = {"tools": {"delete_all": {"permission": "read"}, "count": {"permission": "write"}}}
    model = Steps([("annotated_delete_all", {"scope": "tmp"})], [("annotated_count", {})], results_json)
    async with toolset_of(entry(ledger, **keys)) as toolset, run_worker(model, mcp=toolset, memory=False) as hermes:
        turn = asyncio.ensure_future(hermes.send_message(session_id, "delete tmp, then count", user_id="alice"))
        try:
            pending = await hermes.wait_for_approval(session_id, timeout_seconds=30)
            assert pending.tool_name == "annotated_count"  # read-only hinted, but the operator says write
            assert lines(ledger) == ["deleted tmp"]  # destructive hinted, but the operator says read
            await hermes.approve(session_id, pending.tool_call_id, approver="alice")
            result = await asyncio.wait_for(turn, 30)
        finally:
            turn.cancel()
    assert [(r.name, r.approval, int(r.result.code)) for r in result.tool_calls] == [
        ("annotated_delete_all", "not_required", 0),
        ("annotated_count", "approved", 0),
    ]


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("keys", "expected"),
    [({}, (0, "synced")), ({"tools": {"flaky_sync": {"idempotency": "none"}}}, (4, None))],
    ids=["hinted-idempotent", "operator-says-none"],
)
async def test_an_idempotent_hinted_tool_is_retried_after_a_timeout_unless_the_operator_says_none(
    run_worker, session_id, ledger, toolset_of, keys, expected
):
    # A 2 s request timeout: the first call hangs (the server's marker), so the call times out.
    model = Steps([("annotated_flaky_sync", {})], results_json)
    async with toolset_of(entry(ledger, timeout_seconds=2, **keys)) as toolset, run_worker(model, mcp=toolset, memory=False) as hermes:
        # Started and listed first: 2 s is also the turn's listing budget, which a cold start
        # on a loaded machine can miss (then the turn has no such tool).
        await listed(toolset, "annotated_flaky_sync")
        result = await hermes.send_message(session_id, "sync", user_id="alice")
    [call] = result.tool_calls
    assert call.approval == "not_required"
    code, data = expected
    assert int(call.result.code) == code, call.result.message
    if data is not None:
        assert call.result.data == {"result": data}


@pytest.mark.timeout(120)
async def test_hermes_tools_shows_what_set_each_mcp_tools_permission_and_idempotency(cli_env, ledger, tmp_path):
    config = tmp_path / "mcp.json"
    config.write_text(
        json.dumps({"mcpServers": {"annotated": entry(ledger, idempotency="keyed", tools={"plain": {"permission": "admin"}})}}),
        encoding="utf-8",
    )
    env = {**cli_env, "HERMES_MCP_CONFIG": str(config)}
    listed = await hermes_cli("tools", "--json", env=env, cwd=tmp_path)
    table = await hermes_cli("tools", env=env, cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    specs = {t["name"]: t for t in json.loads(listed.stdout)}
    assert {
        name: (specs[name]["permission"], specs[name]["permission_source"], specs[name]["idempotency"], specs[name]["idempotency_source"])
        for name in ("annotated_delete_all", "annotated_count", "annotated_plain")
    } == {
        "annotated_delete_all": ("write", "annotation", "keyed", "config"),
        "annotated_count": ("read", "annotation", "keyed", "config"),
        "annotated_plain": ("admin", "config", "keyed", "config"),
    }
    assert "permission_source" not in specs["save_note"]  # Hermes' own tools: their code says
    assert table.returncode == 0, table.stderr
    row = next(line for line in table.stdout.splitlines() if "annotated_delete_all" in line)
    assert "write (annotation)" in row and "keyed (config)" in row
