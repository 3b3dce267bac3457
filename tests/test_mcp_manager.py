"""The worker's MCP connection manager against real server processes (``tests/mcp_servers``).

Nothing about the protocol is mocked: every server is a real process speaking MCP over
stdio or streamable HTTP. After every test no process of ours is left: the fixture
scans ``/proc`` for anything started from ``tests/mcp_servers`` or living in a process
group a server had (grandchildren included).
"""

from __future__ import annotations

import asyncio
import json
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

from hermes.mcp.config import parse_mcp_config
from hermes.mcp.manager import McpManager, McpUnavailableError, ServerStatus

SERVERS = Path(__file__).parent / "mcp_servers"
TRICKY_TEXT = "日本語のテキスト 中文 한국어 🎉👩‍👩‍👧 <|endoftext|> <|im_start|> \u200b\ttab"

_seen_groups: set[int] = set()
"""Every process group a stdio server of a test had (read from status())."""


def stdio(script: str, **extra: Any) -> dict[str, Any]:
    return {"command": sys.executable, "args": [str(SERVERS / script)], **extra}


def _procs() -> dict[int, tuple[int, int, str, str]]:
    """pid -> (ppid, pgrp, state, cmdline) for every process."""
    out = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        fields = stat[stat.rfind(b")") + 2 :].split()
        out[int(entry)] = (int(fields[1]), int(fields[2]), fields[0].decode(), cmdline)
    return out


def leftovers(exclude: set[int] = frozenset()) -> list[str]:  # type: ignore[assignment]
    """Live (non-zombie) processes of ours: started from tests/mcp_servers (not ``owner.py``
    itself, whose fate the test decides), or in a process group a server had."""
    found = []
    for pid, (ppid, group, state, cmdline) in _procs().items():
        if state == "Z" or pid in exclude or pid == os.getpid():
            continue
        if group in _seen_groups or (str(SERVERS) in cmdline and "owner.py" not in cmdline):
            found.append(f"{pid} (ppid {ppid}, group {group}): {cmdline[:160]}")
    return found


def alive(pid: int) -> bool:
    info = _procs().get(pid)
    return info is not None and info[2] != "Z"


async def wait_for(condition: Callable[[], bool], timeout_seconds: float, what: str) -> float:
    """Poll ``condition`` until true (bounded); returns the seconds it took."""
    start = time.monotonic()
    while not condition():
        if time.monotonic() - start > timeout_seconds:
            raise AssertionError(f"timed out after {timeout_seconds} s waiting for {what}")
        await asyncio.sleep(0.02)
    return time.monotonic() - start


def status_of(manager: McpManager, name: str) -> ServerStatus:
    status = next(s for s in manager.status() if s.name == name)
    if status.process_group is not None:
        _seen_groups.add(status.process_group)
    return status


def text_of(result: Any) -> str:
    assert len(result.content) == 1, result
    return result.content[0].text


@pytest.fixture
async def make_manager() -> AsyncIterator[Callable[..., McpManager]]:
    """Builds managers from ``{"name": server}``; closes them and checks nothing is left."""
    made: list[McpManager] = []

    def make(servers: dict[str, Any], environ: dict[str, str] | None = None) -> McpManager:
        manager = McpManager(parse_mcp_config({"mcpServers": servers}), environ=environ or dict(os.environ))
        made.append(manager)
        return manager

    yield make
    for manager in made:
        for name in manager.resolved:
            status_of(manager, name)
        await manager.aclose()
    assert leftovers() == [], "processes left after aclose()"


# ---------------------------------------------------------------- calls and results


async def test_text_comes_back_byte_identical_and_one_process_serves_every_call(make_manager):
    manager = make_manager({"normal": stdio("normal.py")})
    result = await manager.call_tool("normal", "echo", {"text": TRICKY_TEXT})
    assert not result.is_error
    assert text_of(result).encode("utf-8") == TRICKY_TEXT.encode("utf-8")
    first_pid = text_of(await manager.call_tool("normal", "pid", {}))

    texts = [f"{TRICKY_TEXT} #{i}" for i in range(20)]
    answers = await asyncio.gather(*(manager.call_tool("normal", "echo", {"text": t}) for t in texts))
    assert [text_of(a) for a in answers] == texts
    assert text_of(await manager.call_tool("normal", "pid", {})) == first_pid
    status = status_of(manager, "normal")
    assert (status.state, status.transport, status.restarts, status.last_error) == ("ready", "stdio", 0, None)
    assert status.pid == int(first_pid)


async def test_concurrent_first_calls_start_a_single_server_process(make_manager):
    manager = make_manager({"normal": stdio("normal.py")})
    pids = await asyncio.gather(*(manager.call_tool("normal", "pid", {}) for _ in range(5)))
    assert len({text_of(p) for p in pids}) == 1


async def test_a_failing_tool_is_returned_as_an_error_result_not_raised(make_manager):
    manager = make_manager({"normal": stdio("normal.py")})
    result = await manager.call_tool("normal", "fail", {"reason": "because"})
    assert result.is_error is True
    assert "fail" in text_of(result)
    assert status_of(manager, "normal").state == "ready"


async def test_a_server_writing_megabytes_to_stderr_is_not_blocked(make_manager):
    manager = make_manager({"normal": stdio("normal.py", timeout_seconds=10)})
    result = await manager.call_tool("normal", "shout", {"kilobytes": 2048})  # 2 MiB: 32x a pipe buffer
    assert text_of(result) == "shouted"


# ---------------------------------------------------------------- discovery


async def test_tool_list_is_filtered_cached_and_refreshed_on_list_changed(make_manager):
    manager = make_manager({"normal": stdio("normal.py", deny=["shout"], list_ttl_seconds=600)})
    names = [t.name for t in await manager.list_tools("normal")]
    assert "echo" in names and "grow" in names and "shout" not in names
    assert status_of(manager, "normal").tools_cached == len(names)
    with pytest.raises(McpUnavailableError, match="not allowed"):
        await manager.call_tool("normal", "shout", {"kilobytes": 1})

    added = text_of(await manager.call_tool("normal", "grow", {}))
    assert added == "extra_1"
    # The server's notifications/tools/list_changed empties the cache...
    await wait_for(lambda: status_of(manager, "normal").tools_cached is None, 5, "the list_changed notification")
    # ...so the next listing (well within the TTL) sees the new tool.
    assert [t.name for t in await manager.list_tools("normal")] == [*names, "extra_1"]


async def test_cached_tool_list_is_served_without_asking_the_server(make_manager):
    manager = make_manager({"normal": stdio("normal.py", list_ttl_seconds=600)})
    listed = await manager.list_tools("normal")
    group = status_of(manager, "normal").process_group
    assert group is not None
    os.killpg(group, signal.SIGKILL)
    await wait_for(lambda: status_of(manager, "normal").state == "backoff", 5, "the crash to be noticed")
    assert await manager.list_tools("normal") == listed  # from the cache, the server is gone
    with pytest.raises(McpUnavailableError, match=r"'normal' is unavailable.*next start attempt in \d"):
        await manager.list_tools("normal", refresh=True)


async def test_cached_resource_and_prompt_lists_are_served_without_asking_the_server(make_manager):
    # A turn lists tools, resources and prompts of every server: all three are cached.
    manager = make_manager({"normal": stdio("normal.py", list_ttl_seconds=600)})
    resources = await manager.list_resources("normal")
    prompts = await manager.list_prompts("normal")
    group = status_of(manager, "normal").process_group
    assert group is not None
    os.killpg(group, signal.SIGKILL)
    await wait_for(lambda: status_of(manager, "normal").state == "backoff", 5, "the crash to be noticed")
    assert await manager.list_resources("normal") == resources
    assert await manager.list_prompts("normal") == prompts


async def test_resources_and_prompts_are_exposed(make_manager):
    manager = make_manager({"normal": stdio("normal.py"), "crashy": stdio("crashy.py")})
    resources = await manager.list_resources("normal")
    assert [str(r.uri) for r in resources] == ["note://greeting"]
    read = await manager.read_resource("normal", "note://greeting")
    assert read.contents[0].text == "hello from a resource ✓"
    prompts = await manager.list_prompts("normal")
    assert [p.name for p in prompts] == ["greet"]
    rendered = await manager.get_prompt("normal", "greet", {"name": "Ada"})
    assert rendered.messages[0].content.text == "Say hello to Ada."
    assert await manager.list_resources("crashy") == []
    assert await manager.list_prompts("crashy") == []
    with pytest.raises(McpUnavailableError, match="'normal'") as err:
        await manager.read_resource("normal", "note://missing")
    assert err.value.reason == "protocol"


# ---------------------------------------------------------------- faults


async def test_crash_mid_call_fails_within_timeout_then_restarts_with_doubling_backoff(make_manager):
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from hermes.infra import telemetry

    metrics = InMemoryMetricReader()
    telemetry.start(metric_readers=[metrics], batch=False)
    try:
        await _crash_then_restart(make_manager)
    finally:
        points = metrics.get_metrics_data()
        telemetry.shutdown()
    restarts = [p for rm in points.resource_metrics for sm in rm.scope_metrics for m in sm.metrics
                if m.name == "hermes.mcp.restarts" for p in m.data.data_points]
    assert [(p.attributes["hermes.mcp.server"], p.value) for p in restarts] == [("crashy", 1)]


async def _crash_then_restart(make_manager):
    manager = make_manager({"crashy": stdio("crashy.py", timeout_seconds=10)})
    assert text_of(await manager.call_tool("crashy", "ok", {})) == "ok"
    first_group = status_of(manager, "crashy").process_group

    started = time.monotonic()
    with pytest.raises(McpUnavailableError) as err:
        await manager.call_tool("crashy", "crash", {})
    assert time.monotonic() - started < 5
    message = str(err.value)
    assert err.value.reason == "crashed" and err.value.maybe_ran
    assert "'crashy'" in message and "code 3" in message and "about to die mid-call" in message
    status = status_of(manager, "crashy")
    assert status.state == "backoff" and status.pid is None
    assert 0.5 < status.retry_in_seconds <= 1.0
    assert not [pid for pid, info in _procs().items() if info[1] == first_group and info[2] != "Z"]

    # A call during the backoff whose deadline ends before the relaunch fails at once and
    # says when the server is tried again (one that can wait for it does: test_mcp_outputs).
    started = time.monotonic()
    with pytest.raises(McpUnavailableError, match=r"next start attempt in [01]\.\d s") as err:
        await manager.call_tool("crashy", "ok", {}, timeout_seconds=0.3)
    assert err.value.reason == "backoff" and time.monotonic() - started < 0.1

    waited = await wait_for(lambda: status_of(manager, "crashy").state != "backoff", 3, "the 1 s backoff")
    assert waited < 1.2
    assert text_of(await manager.call_tool("crashy", "ok", {})) == "ok"
    assert status_of(manager, "crashy").restarts == 1

    with pytest.raises(McpUnavailableError):
        await manager.call_tool("crashy", "crash", {})
    status = status_of(manager, "crashy")
    assert status.state == "backoff" and 1.5 < status.retry_in_seconds <= 2.0  # doubled


async def test_hung_server_fails_within_timeout_and_is_killed(make_manager):
    manager = make_manager({"hang": stdio("hang.py", timeout_seconds=1)})
    assert text_of(await manager.call_tool("hang", "ok", {}, timeout_seconds=10)) == "ok"
    group = status_of(manager, "hang").process_group
    started = time.monotonic()
    with pytest.raises(McpUnavailableError, match=r"'hang' did not answer tools/call 'hang' within 1 s") as err:
        await manager.call_tool("hang", "hang", {})
    assert 0.9 < time.monotonic() - started < 1.5
    assert err.value.reason == "timeout" and err.value.maybe_ran
    # The health check after the timeout finds it does not answer a ping and kills it.
    await wait_for(lambda: status_of(manager, "hang").state == "backoff", 6, "the hung server to be given up")
    assert "ping" in status_of(manager, "hang").last_error
    await wait_for(lambda: not [p for p, i in _procs().items() if i[1] == group and i[2] != "Z"], 5, "the tree to go")


async def test_a_start_slower_than_the_request_serves_the_next_request(make_manager):
    """A server that takes 2 s to start, asked with a 0.5 s request timeout: the first call
    fails naming the start, the start goes on (``startup_timeout_seconds``, not the request's
    limit), and a later call uses that same process instead of killing and starting again."""
    slow = {"command": sys.executable, "args": [str(SERVERS / "slow_start.py"), "2"], "timeout_seconds": 0.5}
    manager = make_manager({"slow": slow})
    with pytest.raises(McpUnavailableError, match=r"'slow' did not start within 0.5 s") as err:
        await manager.call_tool("slow", "ok", {})
    assert err.value.reason == "timeout"
    group = status_of(manager, "slow").process_group
    assert group is not None and status_of(manager, "slow").state == "starting"
    await wait_for(lambda: status_of(manager, "slow").state == "ready", 60, "the slow start to finish")
    assert text_of(await manager.call_tool("slow", "ok", {})) == "ok"
    status = status_of(manager, "slow")
    assert status.process_group == group and status.restarts == 0


async def test_a_start_past_its_startup_timeout_is_reported_as_such(make_manager):
    """The reported cause is the timeout, not the exit (code 0) of the server closed for it."""
    slow = {
        "command": sys.executable,
        "args": [str(SERVERS / "slow_start.py"), "30"],
        "startup_timeout_seconds": 1,
    }
    manager = make_manager({"slow": slow})
    with pytest.raises(McpUnavailableError) as err:
        await manager.call_tool("slow", "ok", {}, timeout_seconds=20)
    assert err.value.reason == "start"
    assert "no answer to initialize within 1 s" in str(err.value)
    assert "exited" not in str(err.value)
    assert "no answer to initialize within 1 s" in status_of(manager, "slow").last_error


async def test_bad_command_path_fails_fast_naming_the_server_with_secrets_masked(make_manager):
    secret = "s3cr3t-token-value"
    manager = make_manager(
        {
            "missing": {"command": "/nonexistent/${MCP_TEST_SECRET}/server"},
            "unknown": {"command": "no-such-mcp-server-for-hermes-tests"},
        },
        environ={**os.environ, "MCP_TEST_SECRET": secret},
    )
    for name, expected in (("missing", "does not exist"), ("unknown", "not found on PATH")):
        started = time.monotonic()
        with pytest.raises(McpUnavailableError) as err:
            await manager.call_tool(name, "anything", {})
        assert time.monotonic() - started < 0.5
        assert err.value.reason == "start" and f"'{name}'" in str(err.value) and expected in str(err.value)
        assert secret not in str(err.value)
    status = status_of(manager, "missing")
    assert status.state == "backoff" and "***" in status.last_error and secret not in status.last_error


async def test_unknown_server_is_refused(make_manager):
    manager = make_manager({"normal": stdio("normal.py")})
    with pytest.raises(McpUnavailableError, match="no enabled MCP server named 'nope'"):
        await manager.list_tools("nope")


# ---------------------------------------------------------------- process trees


async def test_server_ignoring_sigterm_and_its_grandchild_are_killed_on_aclose(make_manager):
    manager = make_manager({"stubborn": stdio("stubborn.py")})
    grandchild = int(text_of(await manager.call_tool("stubborn", "grandchild", {})))
    status = status_of(manager, "stubborn")
    assert alive(grandchild) and alive(status.pid)
    started = time.monotonic()
    await manager.aclose()
    assert time.monotonic() - started < 6  # stdin close, SIGTERM ignored, SIGKILL after the grace
    assert not alive(grandchild) and not alive(status.pid)
    assert leftovers() == []
    with pytest.raises(McpUnavailableError, match="closed"):
        await manager.call_tool("stubborn", "grandchild", {})


async def test_idle_server_is_closed_with_its_tree_and_started_again_on_use(make_manager):
    manager = make_manager({"stubborn": stdio("stubborn.py", idle_seconds=0.5)})
    grandchild = int(text_of(await manager.call_tool("stubborn", "grandchild", {})))
    first = status_of(manager, "stubborn")
    await wait_for(lambda: status_of(manager, "stubborn").state == "stopped", 5, "the idle close")
    # SIGTERM is ignored by both, so the tree goes with the SIGKILL after the grace.
    await wait_for(lambda: status_of(manager, "stubborn").pid is None, 5, "the tree to be killed")
    assert not alive(grandchild) and not alive(first.pid)
    status = status_of(manager, "stubborn")
    assert (status.state, status.last_error, status.restarts) == ("stopped", None, 0)  # idle is not a failure

    again = int(text_of(await manager.call_tool("stubborn", "grandchild", {})))
    assert again != grandchild and status_of(manager, "stubborn").state == "ready"


async def test_server_tree_dies_with_a_worker_killed_by_sigkill(make_manager):
    config = {"mcpServers": {"stubborn": stdio("stubborn.py")}}
    owner = subprocess.Popen(
        [sys.executable, str(SERVERS / "owner.py"), json.dumps(config)],
        stdout=subprocess.PIPE,
        cwd=Path(__file__).parent.parent,
    )
    try:
        line = await asyncio.wait_for(asyncio.to_thread(owner.stdout.readline), 20)
        started = json.loads(line)
        _seen_groups.add(started["group"])
        assert alive(started["pid"]) and alive(started["grandchild"])
        owner.send_signal(signal.SIGKILL)  # no cleanup code of the owner runs
        owner.wait(5)
        took = await wait_for(
            lambda: not alive(started["pid"]) and not alive(started["grandchild"]),
            5,
            "the orphaned server tree to be killed",
        )
        assert took < 2
        assert leftovers() == []
    finally:
        owner.kill()
        owner.wait()


# ---------------------------------------------------------------- streamable HTTP


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


async def _start_http(port: int, transport: str = "--http") -> subprocess.Popen[bytes]:
    process = subprocess.Popen(
        [sys.executable, str(SERVERS / "normal.py"), transport, str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )

    def listening() -> bool:
        assert process.poll() is None, "the HTTP MCP server exited"
        with socket.socket() as sock:
            return sock.connect_ex(("127.0.0.1", port)) == 0

    await wait_for(listening, 15, "the HTTP MCP server to listen")
    return process


def _stop_http(process: subprocess.Popen[bytes]) -> None:
    with_group = process.pid
    try:
        os.killpg(with_group, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait(5)


async def test_streamable_http_text_is_byte_identical_and_expired_session_reconnects(make_manager):
    port = _free_port()
    server = await _start_http(port)
    try:
        manager = make_manager({"web": {"url": f"http://127.0.0.1:{port}/mcp", "timeout_seconds": 10}})
        result = await manager.call_tool("web", "echo", {"text": TRICKY_TEXT})
        assert text_of(result).encode("utf-8") == TRICKY_TEXT.encode("utf-8")
        assert text_of(await manager.call_tool("web", "pid", {})) == str(server.pid)
        status = status_of(manager, "web")
        assert (status.transport, status.state, status.pid) == ("streamable-http", "ready", None)

        # The server restarts: it no longer knows our session id and answers 404; the
        # call is sent again once on a fresh session, and that is not a failure.
        _stop_http(server)
        server = await _start_http(port)
        assert text_of(await manager.call_tool("web", "pid", {})) == str(server.pid)
        status = status_of(manager, "web")
        assert (status.state, status.restarts, status.last_error) == ("ready", 0, None)
        assert text_of(await manager.call_tool("web", "echo", {"text": TRICKY_TEXT})) == TRICKY_TEXT
    finally:
        _stop_http(server)


async def test_an_older_sse_server_answers_byte_identical_text(make_manager):
    port = _free_port()
    server = await _start_http(port, "--sse")
    try:
        manager = make_manager({"old": {"url": f"http://127.0.0.1:{port}/sse", "transport": "sse", "timeout_seconds": 10}})
        assert "echo" in {t.name for t in await manager.list_tools("old")}
        result = await manager.call_tool("old", "echo", {"text": TRICKY_TEXT})
        assert text_of(result).encode("utf-8") == TRICKY_TEXT.encode("utf-8")
        assert status_of(manager, "old").transport == "sse"
    finally:
        _stop_http(server)


async def test_streamable_http_server_down_fails_within_timeout(make_manager):
    port = _free_port()
    manager = make_manager({"web": {"url": f"http://127.0.0.1:{port}/mcp", "timeout_seconds": 3}})
    started = time.monotonic()
    with pytest.raises(McpUnavailableError, match="'web'") as err:
        await manager.list_tools("web")
    assert time.monotonic() - started < 3.5
    assert err.value.reason in ("start", "timeout")
    assert status_of(manager, "web").state in ("backoff", "failed")


async def test_a_server_forked_late_still_has_its_pid_in_the_status(make_manager, monkeypatch):
    # On a loaded machine the supervisor forked the server after the connection stopped
    # looking (200 ms): the status of a running server said pid=None for good.
    from hermes.mcp import stdio as stdio_module

    async def gave_up(supervisor: int, **kwargs: object) -> None:
        return None

    monkeypatch.setattr(stdio_module, "child_pid", gave_up)
    manager = make_manager({"stubborn": stdio("stubborn.py")})
    grandchild = int(text_of(await manager.call_tool("stubborn", "grandchild", {})))
    status = status_of(manager, "stubborn")
    assert status.pid is not None and alive(status.pid) and alive(grandchild)
    await manager.aclose()
    assert not alive(status.pid) and not alive(grandchild)


async def test_child_pid_waits_by_the_clock_and_stops_when_the_supervisor_exits():
    from hermes.mcp.stdio import child_pid

    childless = subprocess.Popen(["sleep", "30"])
    try:
        started = time.monotonic()
        assert await child_pid(childless.pid, wait_seconds=0.3) is None
        assert 0.3 <= time.monotonic() - started < 3
        started = time.monotonic()
        assert await child_pid(childless.pid, exited=lambda: True, wait_seconds=30) is None
        assert time.monotonic() - started < 1
    finally:
        childless.kill()
        childless.wait()
