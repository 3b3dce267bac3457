"""A worker killed in the middle of a tool call: the session goes on on another worker.

The worker is a real subprocess (``python worker.py``) configured only through the
environment, as in production; the test SIGKILLs its process group while a slow tool
runs (the tool has already done its side effect: a line in a counter file), starts a
fresh worker, and checks what the client gets back:

- a non-idempotent tool is not run again: its outcome is reported as unknown (code 4);
- an idempotent tool is retried on the new worker and the turn completes normally;
- a keyed tool is retried on the new worker with the same idempotency key.

The time from the kill to the reply is printed (run with ``-s`` to see it).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from hermes.client import HermesClient
from hermes.models import ToolResultCode
from hermes.security import command_auth

MAIN_DIR = Path(__file__).resolve().parent.parent
COUNTER_FILE_ENV = "HERMES_CRASH_COUNTER_FILE"
SLOW_SECONDS_ENV = "HERMES_CRASH_SLOW_SECONDS"
"""As in tests/crash_tools.py, which is not imported here: importing it would register
its tools in this process's default registry, which other tests may serve."""
HEARTBEAT_SECONDS = 1.5
"""Lowered from 5 s so that the dead worker's tool call is noticed quickly."""

SCRIPT = {
    "turns": [
        {
            "match": "(?i)once",
            "steps": [
                {"tool_calls": [{"name": "slow_side_effect", "arguments": {"label": "once"}}]},
                {"reply": "code={{ last_tool_result.code }} message={{ last_tool_result.message }}"},
            ],
        },
        {
            "match": "(?i)keyed",
            "steps": [
                {"tool_calls": [{"name": "slow_keyed_side_effect", "arguments": {"label": "keyed"}}]},
                {"reply": "code={{ last_tool_result.code }} message={{ last_tool_result.message }}"},
            ],
        },
        {
            "match": "(?i)again",
            "steps": [
                {"tool_calls": [{"name": "slow_idempotent_side_effect", "arguments": {"label": "again"}}]},
                {"reply": "code={{ last_tool_result.code }} message={{ last_tool_result.message }}"},
            ],
        },
    ]
}


@pytest.fixture
def counter_file(tmp_path: Path) -> Path:
    return tmp_path / "side_effects.jsonl"


@pytest.fixture
def spawn_worker(
    tmp_path: Path, temporal_env: Any, redis_url: str, task_queue: str, counter_file: Path
) -> Iterator[Callable[[], subprocess.Popen[bytes]]]:
    """Start ``python worker.py`` subprocesses; every one still running at teardown is
    stopped (SIGTERM, then SIGKILL of its process group) and reaped."""
    script = tmp_path / "script.yaml"
    script.write_text(yaml.safe_dump(SCRIPT, allow_unicode=True), encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HERMES_", "OPENAI_"))}
    env.update(
        {
            "TEMPORAL_ADDRESS": temporal_env.client.service_client.config.target_host,
            "REDIS_URL": redis_url,
            "HERMES_TASK_QUEUE": task_queue,
            "HERMES_MODEL_PROVIDER": "scripted",
            "HERMES_SCRIPT": str(script),
            "HERMES_TOOL_MODULES": "tests.crash_tools",
            "HERMES_TOOL_HEARTBEAT_SECONDS": str(HEARTBEAT_SECONDS),
            COUNTER_FILE_ENV: str(counter_file),
            SLOW_SECONDS_ENV: "30",
            "PYTHONUNBUFFERED": "1",
            # The command keys of this process, whose clients talk to these workers.
            "HERMES_COMMAND_KEYS": command_auth.format_keys(command_auth.active()),
        }
    )
    procs: list[tuple[subprocess.Popen[bytes], Any]] = []

    def spawn() -> subprocess.Popen[bytes]:
        log = open(tmp_path / f"worker-{len(procs)}.log", "wb")  # noqa: SIM115 - closed at teardown
        proc = subprocess.Popen(
            [sys.executable, "worker.py"],
            cwd=MAIN_DIR,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group, so a kill takes all of it
        )
        procs.append((proc, log))
        return proc

    try:
        yield spawn
    finally:
        for proc, _ in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc, log in procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
            kill_group(proc)
            log.close()


def kill_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL the process group of ``proc`` and reap ``proc``."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(timeout=10)


def worker_log(tmp_path: Path) -> str:
    """The tail of every worker log of this test."""
    logs = sorted(tmp_path.glob("worker-*.log"))
    return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}" for p in logs)


def side_effects(counter_file: Path) -> list[dict[str, Any]]:
    if not counter_file.exists():
        return []
    return [json.loads(line) for line in counter_file.read_text(encoding="utf-8").splitlines() if line.strip()]


async def wait_for_side_effect(
    counter_file: Path, proc: subprocess.Popen[bytes], turn: asyncio.Task[Any], tmp_path: Path, *, timeout_seconds: float = 60.0
) -> list[dict[str, Any]]:
    """Poll the counter file until the tool has done its side effect (bounded)."""
    deadline = time.monotonic() + timeout_seconds
    while True:
        lines = side_effects(counter_file)
        if lines:
            return lines
        if proc.poll() is not None:
            raise AssertionError(f"the worker exited with {proc.returncode}:\n{worker_log(tmp_path)}")
        if turn.done():
            raise AssertionError(f"the turn ended before the tool ran: {turn.result()!r}")
        if time.monotonic() > deadline:
            raise AssertionError(f"the tool did not run within {timeout_seconds} s:\n{worker_log(tmp_path)}")
        await asyncio.sleep(0.05)


async def crash_during_tool_call(
    message: str,
    *,
    spawn_worker: Callable[[], subprocess.Popen[bytes]],
    temporal_client: Any,
    redis: Any,
    task_queue: str,
    session_id: str,
    counter_file: Path,
    tmp_path: Path,
) -> tuple[Any, list[dict[str, Any]], float, subprocess.Popen[bytes], subprocess.Popen[bytes]]:
    """Send ``message``, kill the worker once its tool has done its side effect, start
    a new worker, and return (reply, side effects, kill-to-reply seconds, workers)."""
    first = spawn_worker()
    hermes = HermesClient(temporal_client, task_queue=task_queue, redis=redis)
    turn = asyncio.ensure_future(hermes.send_message(session_id, message, user_id="crash-test"))
    try:
        before = await wait_for_side_effect(counter_file, first, turn, tmp_path)
        assert len(before) == 1 and before[0]["pid"] == first.pid
        assert not turn.done()

        kill_group(first)
        killed_at = time.monotonic()
        killed_at_wall = time.time()
        second = spawn_worker()
        try:
            result = await asyncio.wait_for(asyncio.shield(turn), 60)
        except asyncio.TimeoutError:
            raise AssertionError(f"no reply within 60 s of the crash:\n{worker_log(tmp_path)}") from None
        elapsed = time.monotonic() - killed_at
        for e in side_effects(counter_file)[1:]:
            print(f"\n{e['tool']} attempt {e['attempt']} started {e['at'] - killed_at_wall:.2f} s after the kill")
    finally:
        if not turn.done():
            turn.cancel()
            await asyncio.gather(turn, return_exceptions=True)
    return result, side_effects(counter_file), elapsed, first, second


async def test_a_non_idempotent_tool_cut_off_by_a_worker_crash_is_reported_unknown_and_not_run_again(
    spawn_worker, temporal_client, redis, task_queue, session_id, counter_file, tmp_path
):
    result, lines, elapsed, first, second = await crash_during_tool_call(
        "run the once tool",
        spawn_worker=spawn_worker,
        temporal_client=temporal_client,
        redis=redis,
        task_queue=task_queue,
        session_id=session_id,
        counter_file=counter_file,
        tmp_path=tmp_path,
    )
    print(f"\nkill-to-reply (non-idempotent tool): {elapsed:.2f} s")

    assert [(e["tool"], e["attempt"], e["pid"]) for e in lines] == [("slow_side_effect", 1, first.pid)], (
        "the side effect must happen exactly once"
    )
    assert result.status == "completed"
    [record] = result.tool_calls
    assert record.name == "slow_side_effect"
    assert record.result.code == ToolResultCode.OUTCOME_UNKNOWN
    assert "unknown" in record.result.message and "not run again" in record.result.message
    assert result.reply.startswith("code=4 ")  # the model was told the outcome is unknown
    assert second.poll() is None, "the new worker should still be serving"


async def test_an_idempotent_tool_cut_off_by_a_worker_crash_is_retried_and_the_turn_completes(
    spawn_worker, temporal_client, redis, task_queue, session_id, counter_file, tmp_path
):
    result, lines, elapsed, first, second = await crash_during_tool_call(
        "run it again",
        spawn_worker=spawn_worker,
        temporal_client=temporal_client,
        redis=redis,
        task_queue=task_queue,
        session_id=session_id,
        counter_file=counter_file,
        tmp_path=tmp_path,
    )
    print(f"\nkill-to-reply (idempotent tool): {elapsed:.2f} s")

    # Idempotent: retried on the new worker (attempt 2), which is allowed to repeat it.
    assert [(e["tool"], e["attempt"], e["pid"]) for e in lines] == [
        ("slow_idempotent_side_effect", 1, first.pid),
        ("slow_idempotent_side_effect", 2, second.pid),
    ]
    assert result.status == "completed"
    [record] = result.tool_calls
    assert record.result.code == ToolResultCode.OK
    assert record.result.data == {"label": "again", "attempt": 2}
    assert result.reply == "code=0 message=slow_idempotent_side_effect done"


async def test_a_keyed_tool_cut_off_by_a_worker_crash_is_retried_with_the_same_key(
    spawn_worker, temporal_client, redis, task_queue, session_id, counter_file, tmp_path
):
    result, lines, elapsed, first, second = await crash_during_tool_call(
        "run the keyed tool",
        spawn_worker=spawn_worker,
        temporal_client=temporal_client,
        redis=redis,
        task_queue=task_queue,
        session_id=session_id,
        counter_file=counter_file,
        tmp_path=tmp_path,
    )
    print(f"\nkill-to-reply (keyed tool): {elapsed:.2f} s")
    assert [(e["tool"], e["attempt"], e["pid"]) for e in lines] == [
        ("slow_keyed_side_effect", 1, first.pid),
        ("slow_keyed_side_effect", 2, second.pid),
    ]
    keys = {e["key"] for e in lines}
    assert len(keys) == 1, "both attempts must carry the same idempotency key"
    (key,) = keys
    assert key.startswith(f"{session_id}:") and key.endswith(f":{result.tool_calls[0].tool_call_id}")
    assert result.status == "completed" and result.tool_calls[0].result.code == ToolResultCode.OK
