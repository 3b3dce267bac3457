"""Per-call overhead of Hermes' MCP tool path over a bare call on an open MCP session.

    python bench/mcp_call.py            # N=300 measured calls per series
    python bench/mcp_call.py --quick    # N=80, well under a minute on 2 cores
    python bench/mcp_call.py -n 500 --transport stdio

One MCP server of our own, ``tests/mcp_servers/normal.py``, its ``echo`` tool called with
the same text (mixed scripts and emoji, 200 characters) by two series:

* ``hermes``: the ``run_tool`` activity (:class:`activities.tools.ToolActivities`, with
  the worker's MCP toolset :class:`hermes.mcp.tools.McpToolset` over an
  :class:`hermes.mcp.manager.McpManager`): the tool looked up from the recorded MCP
  origin, the arguments validated against the server's schema, the heartbeat wrapper,
  the manager's request path (connection health, deadline, HTTP transport), the result
  in ``{code, message, data}`` form, shallow and capped.
* ``bare``: an activity function that calls ``session.call_tool("echo", ...)`` on an
  ``mcp.ClientSession`` opened once, and returns the text.

Both run in an activity context (``temporalio.testing.ActivityEnvironment``, the same
for both: no Temporal server, so the figure is the tool path's own cost) against the same
server: over streamable HTTP (default) one server process that both connect to; over
stdio (``--transport stdio``) one process each. Both are warm (connected, tool list
cached) before measuring; the series run in interleaved blocks, alternating which goes
first, so machine noise hits both alike. Every answer is checked.

Printed: per series the median / p95 / min / max per call and CPU per call of this
process; the median difference. Last line: ``mcp_call_ratio=<hermes median / bare
median, 2 decimals>`` (target: at most 1.3; printed, not asserted).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import cpu_seconds, describe_ms, headline, parser, run  # noqa: E402
from mcp import ClientSession, StdioServerParameters, stdio_client  # noqa: E402
from mcp.client.streamable_http import streamable_http_client  # noqa: E402
from temporalio import activity  # noqa: E402
from temporalio.testing import ActivityEnvironment  # noqa: E402

from activities.tools import ToolActivities  # noqa: E402
from hermes.mcp.config import parse_mcp_config  # noqa: E402
from hermes.mcp.manager import McpManager  # noqa: E402
from hermes.mcp.tools import McpToolset  # noqa: E402
from hermes.models import McpOrigin, RunToolInput, ToolCall  # noqa: E402
from hermes.infra.stack import free_port  # noqa: E402
from hermes.tools.registry import ToolRegistry  # noqa: E402

SERVER = Path(__file__).resolve().parent.parent / "tests" / "mcp_servers" / "normal.py"
TEXT = ("héllo 你好 🎉 <|endoftext|> " * 10)[:200]
BLOCK = 10
"""Calls of one series in a row before the other series' turn."""


@contextlib.asynccontextmanager
async def http_server() -> AsyncIterator[str]:
    """normal.py over streamable HTTP on a free port; yields its URL."""
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, str(SERVER), "--http", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"{SERVER.name} exited with code {process.returncode}")
            with socket.socket() as sock:
                if sock.connect_ex(("127.0.0.1", port)) == 0:
                    break
            if time.monotonic() > deadline:
                raise RuntimeError(f"{SERVER.name} did not listen on port {port} within 30 s")
            await asyncio.sleep(0.05)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(10)


@contextlib.asynccontextmanager
async def bare_session(transport: str, url: str | None) -> AsyncIterator[ClientSession]:
    """An initialized ``mcp.ClientSession`` to the server, as a user of the SDK opens one."""
    if transport == "http":
        assert url is not None
        opened = streamable_http_client(url)
    else:
        opened = stdio_client(StdioServerParameters(command=sys.executable, args=[str(SERVER)]))
    async with opened as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        yield session


async def measure(
    series: dict[str, Callable[[], Awaitable[None]]], n: int
) -> tuple[dict[str, list[float]], dict[str, float]]:
    """``n`` calls of each series in interleaved blocks; per-call seconds and CPU per call."""
    samples: dict[str, list[float]] = {name: [] for name in series}
    cpu: dict[str, float] = {name: 0.0 for name in series}
    names = list(series)
    me = os.getpid()
    block = 0
    while min(len(s) for s in samples.values()) < n:
        order = names if block % 2 == 0 else names[::-1]
        for name in order:
            call = series[name]
            before = cpu_seconds(me)
            for _ in range(min(BLOCK, n - len(samples[name]))):
                started = time.perf_counter()
                await call()
                samples[name].append(time.perf_counter() - started)
            cpu[name] += cpu_seconds(me) - before
        block += 1
    return samples, {name: cpu[name] / n for name in series}


async def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("-n", type=int, default=None, help="measured calls per series (default 300; --quick 80)")
    p.add_argument("--transport", choices=["http", "stdio"], default="http")
    options = p.parse_args()
    n = options.n or (80 if options.quick else 300)
    warmup = 10 if options.quick else 30

    async with contextlib.AsyncExitStack() as stack:
        url = await stack.enter_async_context(http_server()) if options.transport == "http" else None
        server: dict[str, Any] = (
            {"url": url} if url else {"command": sys.executable, "args": [str(SERVER)]}
        )
        config = parse_mcp_config(
            {"mcpServers": {"local": {**server, "idempotency": "idempotent", "timeout_seconds": 60}}},
            environ=dict(os.environ),
        )
        manager = McpManager(config, environ=dict(os.environ))
        stack.push_async_callback(manager.aclose)
        toolset = McpToolset(config, manager)
        tools = {t.origin.tool: t for t in await toolset.discover()}
        echo = tools["echo"]
        activities = ToolActivities(ToolRegistry(), None, tier_seconds={"external": 60}, mcp=toolset)
        session = await stack.enter_async_context(bare_session(options.transport, url))
        env = ActivityEnvironment()
        calls = 0

        async def hermes() -> None:
            nonlocal calls
            calls += 1
            request = RunToolInput(
                session_id="bench",
                user_id="bench",
                turn=1,
                tool_call=ToolCall(tool_call_id=f"c{calls}", name=echo.name, arguments={"text": TEXT}),
                mcp=McpOrigin(server="local", tool="echo"),
            )
            result = await env.run(activities.run_tool, request)
            if result.code != 0 or result.data != {"result": TEXT}:
                raise AssertionError(f"hermes: unexpected result {result!r}")

        @activity.defn(name="bare_mcp_call")
        async def bare_mcp_call(text: str) -> str:
            result = await session.call_tool("echo", {"text": text})
            return result.content[0].text

        async def bare() -> None:
            text = await env.run(bare_mcp_call, TEXT)
            if text != TEXT:
                raise AssertionError(f"bare: unexpected text {text!r}")

        series = {"hermes": hermes, "bare": bare}
        await measure(series, warmup)
        samples, cpu = await measure(series, n)

    print(f"transport={options.transport} n={n} per series (warm-up {warmup}), blocks of {BLOCK}")
    for name in series:
        print(f"{name:7s} per call: {describe_ms(samples[name])}; CPU {cpu[name] * 1000:.2f} ms/call")
    hermes_ms = statistics.median(samples["hermes"]) * 1000
    bare_ms = statistics.median(samples["bare"]) * 1000
    print(f"difference of medians: {hermes_ms - bare_ms:.2f} ms per call")
    headline("mcp_call_ratio", f"{hermes_ms / bare_ms:.2f}")


if __name__ == "__main__":
    run(main)
