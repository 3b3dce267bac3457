"""Tests for the ``hermes`` command line (hermes/cli.py) and the demo (hermes/cli/offline_demo.py).

The CLI runs as a real subprocess (``python -m hermes.cli``, the same ``app`` as the
``hermes`` entry point) against the fixtures' Temporal dev server and Redis, with a
worker running in the test process; `hermes demo` and `hermes dev` start their own
embedded stacks on free ports in a temporary directory.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest
from temporalio.client import Client

from hermes.infra.stack import free_port
from hermes.models import ToolResultCode, TurnResult
from hermes.providers.scripted import ScriptedModel
from hermes.security import command_auth
from hermes.sessions.index import list_entries

REPO_ROOT = Path(__file__).resolve().parents[1]
NOTE_MESSAGE = "请帮我记一条笔记：明天上午十点和 Alice 开会"
CLI_TIMEOUT_SECONDS = 300.0
"""A bound on one CLI run, for a hang to fail with its command; a whole demo took over
120 s on a loaded 2-core machine with the other test process beside it."""


@dataclass
class Run:
    returncode: int
    stdout: str
    stderr: str


def clean_env(**extra: str) -> dict[str, str]:
    """The environment of a CLI subprocess: none of the caller's Hermes/Temporal/Redis
    settings but its command key ring, the repo importable, a wide console so rich does
    not wrap ids."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("HERMES_", "TEMPORAL_", "OPENAI_")) and k != "REDIS_URL"
    }
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p)
    env["COLUMNS"] = "200"
    env["PYTHONUNBUFFERED"] = "1"
    # The command key ring of this process (its workers'), as an operator gives every
    # process of a deployment the same one (hermes.security.command_auth).
    env["HERMES_COMMAND_KEYS"] = command_auth.format_keys(command_auth.active())
    env.update(extra)
    return env


async def hermes_cli(*args: str, env: dict[str, str], cwd: Path, stdin: str | None = None) -> Run:
    """Run ``hermes ARGS`` to completion without blocking the test's event loop (the
    worker serving the CLI's requests runs on it)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "hermes.cli",
        *args,
        stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env,
        cwd=cwd,
    )
    try:
        out, err = await asyncio.wait_for(
            proc.communicate(stdin.encode() if stdin is not None else None), CLI_TIMEOUT_SECONDS
        )
    except asyncio.TimeoutError:
        proc.kill()
        await proc.wait()
        raise AssertionError(f"hermes {' '.join(args)} did not finish within {CLI_TIMEOUT_SECONDS:.0f} s") from None
    return Run(proc.returncode or 0, out.decode(), err.decode())


def assert_one_line_error(run: Run, *fragments: str) -> None:
    assert "Traceback" not in run.stderr + run.stdout
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1, run.stderr
    assert lines[0].startswith("error: "), lines[0]
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


def processes_using(data_dir: Path) -> list[str]:
    """Live processes whose command line names ``data_dir`` or whose working directory
    is inside it (redis-server rewrites its command line, but keeps its cwd)."""
    found = []
    needle = str(data_dir)
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
            if state in ("Z", "X"):
                continue
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            try:
                cwd = os.readlink(entry / "cwd")
            except OSError:
                cwd = ""
        except (FileNotFoundError, ProcessLookupError, PermissionError, IndexError):
            continue
        if needle in cmdline or cwd == needle or cwd.startswith(needle + os.sep):
            found.append(f"{entry.name}: {cmdline.strip()} (cwd {cwd})")
    return found


def wait_until_no_process_uses(data_dir: Path, timeout_seconds: float = 15.0) -> list[str]:
    deadline = time.monotonic() + timeout_seconds
    while True:
        left = processes_using(data_dir)
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.1)


@pytest.fixture
def cli_env(temporal_client: Client, redis_url: str, task_queue: str, _memory_store_per_test: Path) -> dict[str, str]:
    # The CLI reads what the workers keep durably (the audit log, archived transcripts)
    # from the same LanceDB URI as theirs, as a deployment configures it.
    return clean_env(
        TEMPORAL_ADDRESS=temporal_client.service_client.config.target_host,
        REDIS_URL=redis_url,
        HERMES_TASK_QUEUE=task_queue,
        HERMES_MEMORY_URI=str(_memory_store_per_test),
    )


@pytest.fixture
def user_id() -> str:
    return f"user-{uuid.uuid4().hex[:8]}"


def stack_env(data_dir: Path) -> dict[str, str]:
    return clean_env(
        HERMES_DATA_DIR=str(data_dir),
        HERMES_TEMPORAL_PORT=str(free_port()),
        HERMES_UI_PORT=str(free_port()),
        HERMES_REDIS_PORT=str(free_port()),
    )


# --------------------------------------------------------------------------- send


async def test_send_json_prints_the_turn_result(run_worker, cli_env, session_id, user_id, tmp_path):
    async with run_worker(ScriptedModel.demo()) as hermes:
        run = await hermes_cli(
            "send", session_id, "What is (17 + 25) * 3?", "--user", user_id, "--json", "--message-id", "m-1",
            env=cli_env, cwd=tmp_path,
        )
        assert run.returncode == 0, run.stderr
        result = TurnResult.model_validate_json(run.stdout)
        assert result.session_id == session_id
        assert result.reply == "(17 + 25) * 3 = 126."
        assert [(c.name, c.result.code, c.result.data["value"]) for c in result.tool_calls] == [
            ("calculate", ToolResultCode.OK, 126)
        ]
        assert result.client_message_id == "m-1"
        state = await hermes.get_state(session_id)
        assert (state.user_id, state.turn_count) == (user_id, 1)

        # A resend with the same message id is answered from the first turn, not run again.
        again = await hermes_cli(
            "send", session_id, "What is (17 + 25) * 3?", "--user", user_id, "--json", "--message-id", "m-1",
            env=cli_env, cwd=tmp_path,
        )
        assert TurnResult.model_validate_json(again.stdout).turn == result.turn
        assert (await hermes.get_state(session_id)).turn_count == 1


async def test_send_prints_the_reply_and_reports_tool_calls_on_stderr(run_worker, cli_env, session_id, tmp_path):
    async with run_worker(ScriptedModel.demo()):
        run = await hermes_cli("send", session_id, "你好！现在上海几点？", env=cli_env, cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith("上海现在是 ") and run.stdout.count("\n") == 1
    assert "current_time" in run.stderr and "code 0" in run.stderr


async def test_send_with_an_empty_message_exits_non_zero_with_one_line_error(
    run_worker, cli_env, session_id, temporal_client, tmp_path
):
    async with run_worker(ScriptedModel.demo()):
        run = await hermes_cli("send", session_id, "   ", env=cli_env, cwd=tmp_path)
    assert run.returncode == 1
    assert_one_line_error(run, "empty")
    assert run.stdout == ""
    with pytest.raises(Exception, match="not found"):
        await temporal_client.get_workflow_handle(session_id).describe()


async def test_send_as_another_user_to_an_existing_session_exits_1_and_is_not_taken(
    run_worker, cli_env, session_id, user_id, tmp_path
):
    async with run_worker(ScriptedModel.demo()) as hermes:
        first = await hermes.send_message(session_id, "What is (17 + 25) * 3?", user_id=user_id, client_message_id="m-1")
        for extra in ((), ("--message-id", "m-1")):  # a new message, and a resend of the owner's id
            run = await hermes_cli("send", session_id, "你好", "--user", "someone-else", *extra, env=cli_env, cwd=tmp_path)
            assert run.returncode == 1, run.stdout + run.stderr
            assert_one_line_error(run, session_id, "only from its own user", "'someone-else'", "not taken")
            assert run.stdout == ""
        state = await hermes.get_state(session_id)
        assert (state.user_id, state.turn_count) == (user_id, first.turn)
        owner = await hermes_cli("send", session_id, "你好", "--user", user_id, env=cli_env, cwd=tmp_path)
        assert owner.returncode == 0, owner.stderr
        assert (await hermes.get_state(session_id)).turn_count == first.turn + 1


async def test_send_to_unreachable_temporal_exits_2_with_one_line_error(cli_env, session_id, tmp_path):
    env = dict(cli_env, TEMPORAL_ADDRESS=f"127.0.0.1:{free_port()}")
    run = await hermes_cli("send", session_id, "hello", env=env, cwd=tmp_path)
    assert run.returncode == 2
    assert_one_line_error(run, "cannot connect to Temporal", "connection refused")


# --------------------------------------------------------------------------- approvals


async def test_approve_of_an_unknown_tool_call_reports_unknown_tool_call(run_worker, cli_env, session_id, tmp_path):
    async with run_worker(ScriptedModel.demo()) as hermes:
        await hermes.send_message(session_id, "What is (17 + 25) * 3?")
        run = await hermes_cli("approve", session_id, "call_does_not_exist", "--approver", "bob", env=cli_env, cwd=tmp_path)
        assert run.returncode == 1
        assert_one_line_error(run, "unknown_tool_call", "call_does_not_exist", "pending: none")
        decisions = (await hermes.get_state(session_id)).decisions
        assert [(d.tool_call_id, d.approver, d.outcome) for d in decisions] == [
            ("call_does_not_exist", "bob", "unknown_tool_call")
        ]


async def test_approve_of_a_session_that_does_not_exist_says_so(run_worker, cli_env, session_id, tmp_path):
    async with run_worker(ScriptedModel.demo()):
        for verb in ("approve", "reject"):
            run = await hermes_cli(verb, f"{session_id}-nope", "call_1", "--approver", "bob", env=cli_env, cwd=tmp_path)
            assert run.returncode == 1, run.stdout + run.stderr
            assert_one_line_error(run, f"no session '{session_id}-nope'")
            assert "unknown_tool_call" not in run.stderr


@pytest.mark.timeout(600)
async def test_close_then_close_or_decide_again_exits_1_at_once_saying_the_session_is_closed(
    run_worker, cli_env, session_id, tmp_path
):
    from temporalio.client import WorkflowExecutionStatus

    from tests.support import eventually

    async with run_worker(ScriptedModel.demo()) as hermes:
        turn = asyncio.ensure_future(hermes.send_message(session_id, NOTE_MESSAGE, user_id="carol"))
        pending = await hermes.wait_for_approval(session_id)
        closed = await hermes_cli("close", session_id, env=cli_env, cwd=tmp_path)
        assert closed.returncode == 0, closed.stderr
        assert f"closed: session {session_id}" in closed.stdout
        await turn

        async def ended() -> bool:
            return (await hermes.handle(session_id).describe()).status != WorkflowExecutionStatus.RUNNING

        await eventually(ended, what="the session's workflow to complete")
        # Each used to retry for HERMES_CLIENT_RETRY_SECONDS (120 s), then exit 2 "did not answer".
        again = await hermes_cli("close", session_id, env=cli_env, cwd=tmp_path)
        assert again.returncode == 1
        assert_one_line_error(again, f"session '{session_id}' is closed already")
        for verb in ("approve", "reject"):
            run = await hermes_cli(verb, session_id, pending.tool_call_id, "--approver", "carol", env=cli_env, cwd=tmp_path)
            assert run.returncode == 1, run.stdout + run.stderr
            assert_one_line_error(run, f"session '{session_id}' is closed")
        unknown = await hermes_cli("close", f"{session_id}-nope", env=cli_env, cwd=tmp_path)
        assert unknown.returncode == 1
        assert_one_line_error(unknown, f"no session '{session_id}-nope'")


async def test_approve_applies_to_a_pending_tool_call_and_a_second_decision_is_already_decided(
    run_worker, cli_env, session_id, tmp_path
):
    async with run_worker(ScriptedModel.demo()) as hermes:
        turn = asyncio.ensure_future(hermes.send_message(session_id, NOTE_MESSAGE, user_id="carol"))
        pending = await hermes.wait_for_approval(session_id)
        assert pending.tool_name == "save_note"

        shown = await hermes_cli("show", session_id, env=cli_env, cwd=tmp_path)
        assert pending.tool_call_id in shown.stdout and "save_note" in shown.stdout

        run = await hermes_cli(
            "approve", session_id, pending.tool_call_id, "--approver", "carol", env=cli_env, cwd=tmp_path
        )
        assert run.returncode == 0, run.stderr
        assert run.stdout.startswith("applied: approved tool call " + pending.tool_call_id)
        result = await asyncio.wait_for(turn, 30)
        assert [(c.name, c.approval, c.approver, c.result.code) for c in result.tool_calls] == [
            ("save_note", "approved", "carol", ToolResultCode.OK)
        ]

        again = await hermes_cli("reject", session_id, pending.tool_call_id, env=cli_env, cwd=tmp_path)
        assert again.returncode == 1
        assert_one_line_error(again, "already_decided")


async def test_approve_of_a_write_call_by_anyone_but_the_user_or_a_listed_approver_exits_1_and_it_stays_pending(
    run_worker, cli_env, session_id, tmp_path
):
    async with run_worker(ScriptedModel.demo()) as hermes:
        turn = asyncio.ensure_future(hermes.send_message(session_id, NOTE_MESSAGE, user_id="carol"))
        pending = await hermes.wait_for_approval(session_id)
        for verb in ("approve", "reject"):
            run = await hermes_cli(verb, session_id, pending.tool_call_id, "--approver", "anyone", env=cli_env, cwd=tmp_path)
            assert run.returncode == 1, run.stdout + run.stderr
            assert_one_line_error(run, "not_allowed", "'anyone' may not confirm", "'carol'", "still pending")
        assert [p.tool_call_id for p in await hermes.get_pending_approvals(session_id)] == [pending.tool_call_id]
        assert not turn.done()

        applied = await hermes_cli("approve", session_id, pending.tool_call_id, "--approver", "carol", env=cli_env, cwd=tmp_path)
        assert applied.returncode == 0, applied.stderr
        result = await asyncio.wait_for(turn, 30)
    assert [(c.approval, c.approver) for c in result.tool_calls] == [("approved", "carol")]


async def test_approvals_lists_pending_calls_across_sessions_and_the_requester_cannot_approve_an_admin_call(
    run_worker, cli_env, session_id, tmp_path
):
    from hermes.tools.builtin import register_builtins
    from hermes.tools.registry import ToolRegistry

    registry = register_builtins(ToolRegistry())

    def purge_cache(region: str) -> str:
        """Purge the CDN cache of a region.

        Args:
            region: region code.
        """
        return f"purged {region}"

    registry.register(purge_cache, permission="admin")
    script = {"turns": [{"steps": [{"tool_calls": [{"name": "purge_cache", "arguments": {"region": "eu"}}]},
                                   {"reply": "{{ last_tool_result.data }}"}]}]}
    async with run_worker(script, registry=registry) as hermes:
        turn = asyncio.ensure_future(hermes.send_message(session_id, "purge eu", user_id="dave"))
        pending = await hermes.wait_for_approval(session_id)
        listed = None
        for _ in range(100):  # visibility lags the search attribute by a moment
            listed = await hermes_cli("approvals", "--json", env=cli_env, cwd=tmp_path)
            rows = [r for r in json.loads(listed.stdout or "[]") if r["session_id"] == session_id]
            if rows:
                break
            await asyncio.sleep(0.1)
        assert listed is not None and listed.returncode == 0, listed.stderr
        assert [(r["tool_call_id"], r["tool_name"], r["requester"], r["action"]) for r in rows] == [
            (pending.tool_call_id, "purge_cache", "dave", "approve")
        ]
        table = await hermes_cli("approvals", "--approver", "dave", env=cli_env, cwd=tmp_path)
        assert pending.tool_call_id in table.stdout and "no: 'dave' requested this call" in table.stdout

        refused = await hermes_cli("approve", session_id, pending.tool_call_id, "--approver", "dave", env=cli_env, cwd=tmp_path)
        assert refused.returncode == 1
        assert_one_line_error(refused, "not_allowed", "someone else", "still pending")
        applied = await hermes_cli("approve", session_id, pending.tool_call_id, "--approver", "erin", env=cli_env, cwd=tmp_path)
        assert applied.returncode == 0, applied.stderr
        result = await asyncio.wait_for(turn, 30)
        audit = await hermes_cli("approvals", "--audit", "--session", session_id, "--json", env=cli_env, cwd=tmp_path)
    assert result.reply == "purged eu"
    assert audit.returncode == 0, audit.stderr
    events = [(e["event"], e["approver"], e["outcome"]) for e in json.loads(audit.stdout)]
    assert events == [
        ("requested", None, ""),
        ("decision", "dave", "not_allowed"),
        ("decision", "erin", "applied"),
        ("verdict", "erin", "approved"),
    ]


async def test_tools_lists_the_tools_and_refuses_a_wrong_tool_file_naming_file_and_key(cli_env, tmp_path):
    listed = await hermes_cli("tools", "--json", env=cli_env, cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    names_ = {t["name"]: t for t in json.loads(listed.stdout)}
    assert names_["save_note"]["permission"] == "write" and names_["save_note"]["idempotency"] == "none"
    bad = tmp_path / "tools.yaml"
    bad.write_text(
        "tools:\n  - name: ping\n    description: Ping.\n    parameters: {type: object}\n"
        "    http: {method: FETCH, url: 'http://example.com'}\n",
        encoding="utf-8",
    )
    refused = await hermes_cli("tools", env={**cli_env, "HERMES_TOOL_FILES": str(bad)}, cwd=tmp_path)
    assert refused.returncode == 2
    assert_one_line_error(refused, str(bad), "tools[0].http.method")


# --------------------------------------------------------------------------- reading


async def test_sessions_lists_the_session(run_worker, cli_env, session_id, user_id, redis, tmp_path):
    async with run_worker(ScriptedModel.demo()) as hermes:
        await hermes.send_message(session_id, "What is (17 + 25) * 3?", user_id=user_id)
        # The index is written by an activity after the reply; wait for the row.
        deadline = time.monotonic() + 10
        while not await list_entries(redis, user_id) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        as_json = await hermes_cli("sessions", "--user", user_id, "--json", env=cli_env, cwd=tmp_path)
        table = await hermes_cli("sessions", "--user", user_id, env=cli_env, cwd=tmp_path)
        nobody = await hermes_cli("sessions", "--user", f"nobody-{uuid.uuid4().hex}", env=cli_env, cwd=tmp_path)
    assert as_json.returncode == 0, as_json.stderr
    rows = json.loads(as_json.stdout)
    assert [(r["session_id"], r["user_id"], r["turn_count"]) for r in rows] == [(session_id, user_id, 1)]
    assert table.returncode == 0 and session_id in table.stdout and "What is (17 + 25) * 3?" in table.stdout
    assert nobody.returncode == 0 and "No sessions" in nobody.stdout


async def test_show_prints_the_transcript(run_worker, cli_env, session_id, tmp_path):
    async with run_worker(ScriptedModel.demo()) as hermes:
        await hermes.send_message(session_id, "What time is it in Paris and New York?")
        text = await hermes_cli("show", session_id, env=cli_env, cwd=tmp_path)
        as_json = await hermes_cli("show", session_id, "--json", env=cli_env, cwd=tmp_path)
    assert text.returncode == 0, text.stderr
    assert "What time is it in Paris and New York?" in text.stdout
    assert '{"timezone": "Europe/Paris"}' in text.stdout and '{"timezone": "America/New_York"}' in text.stdout
    assert "Paris: " in text.stdout and "New York: " in text.stdout
    assert "pending approvals: none" in text.stdout
    data = json.loads(as_json.stdout)
    assert data["state"]["turn_count"] == 1
    assert [m["role"] for m in data["transcript"]] == ["user", "assistant", "tool", "tool", "assistant"]
    assert [t["action_type"] for t in data["trace"]] == ["model", "tool", "tool", "model"]


async def test_show_of_an_unknown_session_exits_1_with_one_line_error(cli_env, tmp_path):
    run = await hermes_cli("show", f"no-such-{uuid.uuid4().hex}", env=cli_env, cwd=tmp_path)
    assert run.returncode == 1
    assert_one_line_error(run, "no session")


# --------------------------------------------------------------------------- chat


async def test_chat_asks_for_approval_inline_then_resumes_and_closes_the_session(
    run_worker, cli_env, session_id, user_id, tmp_path
):
    async with run_worker(ScriptedModel.demo()) as hermes:
        first = await hermes_cli(
            "chat", "--session", session_id, "--user", user_id,
            env=cli_env, cwd=tmp_path, stdin=f"{NOTE_MESSAGE}\ny\n/quit\n",
        )
        assert first.returncode == 0, first.stderr
        assert f"New session {session_id}" in first.stdout
        out = first.stdout
        # The call is shown, then the approval is asked for, then the result and the reply.
        positions = [out.index(s) for s in ("→ tool call save_note", "approval needed", "applied", "← save_note code 0", "：已保存。")]
        assert positions == sorted(positions), out
        result = (await hermes.get_state(session_id)).decisions[-1]
        assert (result.approver, result.outcome) == (user_id, "applied")

        second = await hermes_cli(
            "chat", "--session", session_id, env=cli_env, cwd=tmp_path, stdin="/close\n"
        )
        assert second.returncode == 0, second.stderr
        assert NOTE_MESSAGE in second.stdout and "：已保存。" in second.stdout  # the transcript first
        assert f"Session {session_id} closed." in second.stdout
        deadline = time.monotonic() + 10
        while (await hermes.get_state(session_id)).status != "closed":
            assert time.monotonic() < deadline, "the session did not close"
            await asyncio.sleep(0.05)

        closed = await hermes_cli("send", session_id, "hello again", env=cli_env, cwd=tmp_path)
    assert closed.returncode == 1
    assert_one_line_error(closed, "closed")


# --------------------------------------------------------------------------- demo and dev


@pytest.mark.timeout(1200)  # a dozen CLI processes or a whole demo: minutes under load
async def test_demo_runs_end_to_end_and_leaves_no_process(tmp_path):
    data_dir = tmp_path / "data"
    env = stack_env(data_dir)
    run = await hermes_cli("demo", env=env, cwd=tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "Traceback" not in run.stderr
    out = run.stdout
    for expected in (
        "你好！现在上海几点？",
        "上海现在是 ",
        "Paris: ",
        "(17 + 25) * 3 = 126.",
        "approval needed save_note",
        "approved by demo-user (signal approve_tool_call): applied",
        "保存笔记“明天上午十点和 Alice 开会”：已保存。",
        "the latest: 明天上午十点和 Alice 开会.",
        "Demo passed",
    ):
        assert expected in out, expected
    session_id = next(w for w in out.split() if w.startswith("demo-") and len(w) == 17)
    assert f"http://127.0.0.1:{env['HERMES_UI_PORT']}/namespaces/default/workflows/{session_id}" in out
    assert f"hermes show {session_id}" in out
    assert (data_dir / "temporal.db").exists()  # the session persists for `hermes dev`
    assert wait_until_no_process_uses(data_dir) == []


@pytest.mark.timeout(1200)  # a dozen CLI processes or a whole demo: minutes under load
async def test_demo_keep_serves_until_sigterm_then_stops_everything(tmp_path):
    data_dir = tmp_path / "data"
    env = stack_env(data_dir)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "hermes.cli", "demo", "--keep",
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env=env, cwd=tmp_path,
    )
    try:
        seen = await read_until(proc, "press Ctrl-C to stop")
        assert "Demo passed" in seen
        assert processes_using(data_dir)  # still serving
        proc.send_signal(signal.SIGTERM)
        await asyncio.wait_for(proc.wait(), 60)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode == 0
    assert wait_until_no_process_uses(data_dir) == []


async def read_until(proc: asyncio.subprocess.Process, marker: str, timeout_seconds: float = 300.0) -> str:
    """Read ``proc``'s stdout until a line contains ``marker``; return what was read."""
    assert proc.stdout is not None
    seen: list[str] = []
    deadline = time.monotonic() + timeout_seconds
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise AssertionError(f"no {marker!r} within {timeout_seconds:.0f} s:\n" + "".join(seen))
        try:
            line = await asyncio.wait_for(proc.stdout.readline(), remaining)
        except asyncio.TimeoutError:
            continue
        if not line:
            stderr = (await proc.stderr.read()).decode() if proc.stderr else ""
            raise AssertionError(f"exited before {marker!r}:\n" + "".join(seen) + stderr)
        seen.append(line.decode())
        if marker in seen[-1]:
            return "".join(seen)


@pytest.mark.timeout(1200)  # a dozen CLI processes or a whole demo: minutes under load
async def test_second_dev_on_a_data_dir_in_use_exits_non_zero_and_demo_reuses_the_running_stack(tmp_path):
    data_dir = tmp_path / "data"
    env = stack_env(data_dir)
    dev = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "hermes.cli", "dev",
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env=env, cwd=tmp_path,
    )
    try:
        banner = await read_until(dev, "Ready.")
        assert f"http://127.0.0.1:{env['HERMES_UI_PORT']}" in banner

        other_ports = dict(env, HERMES_TEMPORAL_PORT=str(free_port()), HERMES_UI_PORT=str(free_port()),
                           HERMES_REDIS_PORT=str(free_port()))
        second = await hermes_cli("dev", env=other_ports, cwd=tmp_path)
        assert second.returncode == 2
        assert_one_line_error(second, "already running", str(data_dir))

        same_ports = await hermes_cli("dev", env=dict(env, HERMES_DATA_DIR=str(tmp_path / "other")), cwd=tmp_path)
        assert same_ports.returncode == 2
        assert_one_line_error(same_ports, "in use")

        demo = await hermes_cli("demo", env=env, cwd=tmp_path)
        assert demo.returncode == 0, demo.stdout + demo.stderr
        assert "Using the running hermes dev stack" in demo.stdout
        assert "The running hermes dev stack keeps running." in demo.stdout
        assert dev.returncode is None

        dev.send_signal(signal.SIGINT)
        await asyncio.wait_for(dev.wait(), 60)
    finally:
        if dev.returncode is None:
            dev.kill()
            await dev.wait()
    assert dev.returncode == 0
    assert wait_until_no_process_uses(data_dir) == []


async def test_mcp_list_and_call_report_tools_results_and_a_broken_server_in_one_line(cli_env, tmp_path):
    servers = Path(__file__).resolve().parent / "mcp_servers"
    config = tmp_path / "mcp.json"
    config.write_text(
        json.dumps(
            {
                "mcpServers": {
                    "local": {"command": sys.executable, "args": [str(servers / "normal.py")]},
                    "broken": {"command": str(tmp_path / "no-such-server")},
                }
            }
        ),
        encoding="utf-8",
    )
    env = {**cli_env, "HERMES_MCP_CONFIG": str(config)}
    listed = await hermes_cli("mcp", "list", "--json", env=env, cwd=tmp_path)
    rows = {r["server"]: r for r in json.loads(listed.stdout)}
    assert listed.returncode == 1  # one server is broken
    assert {"echo", "grow"} <= set(rows["local"]["tools"]) and rows["local"]["error"] is None
    assert "does not exist" in rows["broken"]["error"]
    called = await hermes_cli("mcp", "call", "local", "echo", json.dumps({"text": "你好 😀 <|endoftext|>"}), env=env, cwd=tmp_path)
    assert called.returncode == 0, called.stderr
    assert json.loads(called.stdout)["data"] == {"result": "你好 😀 <|endoftext|>"}
    broken = await hermes_cli("mcp", "call", "broken", "anything", env=env, cwd=tmp_path)
    assert broken.returncode == 2
    assert_one_line_error(broken, "broken", "does not exist")
    bad_args = await hermes_cli("mcp", "call", "local", "echo", "[1, 2]", env=env, cwd=tmp_path)
    assert bad_args.returncode == 1
    assert_one_line_error(bad_args, "expected a JSON object")
