"""Connections and their supervision: launch on demand, health, crash detection, backoff, idle close.

:class:`Supervisor` holds one :class:`~hermes.mcp.state.Server` record per configured
server and at most one live :class:`~hermes.mcp.state.Connection` each (seed 004 §5.2).
Every request of every activity to that server is multiplexed on it; an MCP
``ClientSession`` correlates concurrent requests by id.

Life of a connection::

    stopped --first use--> starting --initialize ok--> ready --idle_seconds unused--> stopped
                              |                          |
                              +--fails--> backoff <------+ process exits / stops answering
                                            |
                                            +--retry_at passes--> failed --next use--> starting

- **On demand**: nothing starts before the first request for a server.
- **Health**: a ``ping`` goes first when the connection was idle more than
  :data:`PING_AFTER_IDLE_SECONDS`, or after a request to it timed out (a hung server is
  found and killed then, in the background, not on the next call). A stdio process that
  exits, or a transport that breaks, ends the connection at once.
- **Backoff**: after a failure the server is not started again before ``retry_at``:
  1 s after the first failure, doubling to 30 s (:data:`BACKOFF_FIRST_SECONDS`,
  :data:`BACKOFF_MAX_SECONDS`); a call (tool, resource, prompt) in that window waits for
  the relaunch when ``retry_at`` comes before its deadline, and fails at once otherwise,
  saying when the next attempt is (issue 27: a call that could have waited is never
  refused); a list fails at once (a turn goes on without the server's tools). A
  connection that stayed up :data:`STABLE_SECONDS` resets the doubling.

The backoff schedule and the choice a request makes in a backoff window are plain
functions (:func:`backoff_delay`, :func:`failures_after`, :func:`backoff_step`).

Why :class:`Supervisor` is one class: a connection's life (start, initialize, watch, back
off, stop when idle, clean up) is one state machine whose transitions share one record per
server; spread over classes, a reader could no longer check that every path out of a
state releases what it holds.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Mapping
from typing import Any, Literal

import anyio
import mcp.types as types
from mcp.shared.exceptions import MCPError

from hermes.infra import telemetry
from hermes.mcp.config import ResolvedServer
from hermes.mcp.http import first_line as _first_line
from hermes.mcp.output import LenientSession
from hermes.mcp.state import (
    LIST_CHANGED,
    Connection,
    McpUnavailableError,
    Server,
    ServerState,
    ServerStatus,
)
from hermes.mcp.stdio import StartError, child_pid_now, exit_note
from hermes.mcp.transport import open_transport

__all__ = [
    "BACKOFF_FIRST_SECONDS",
    "BACKOFF_MAX_SECONDS",
    "PING_AFTER_IDLE_SECONDS",
    "STABLE_SECONDS",
    "Supervisor",
    "backoff_delay",
    "backoff_step",
    "failures_after",
    "start_failure",
]

log = logging.getLogger("hermes.mcp")

BACKOFF_FIRST_SECONDS = 1.0
"""Wait before the first restart after a failure (issue 4: "1 s doubling to 30 s")."""
BACKOFF_MAX_SECONDS = 30.0
"""Longest wait between restarts."""
STABLE_SECONDS = 60.0
"""A connection that was up this long before failing restarts the doubling at 1 s."""
PING_AFTER_IDLE_SECONDS = 30.0
"""A connection unused for longer is pinged before it is used again."""
_PING_TIMEOUT_SECONDS = 5.0
"""Longest wait for a health-check ping."""
_POLL_SECONDS = 0.05


def backoff_delay(failures: int) -> float:
    """Seconds before the next start after ``failures`` consecutive failures.

    Args:
        failures: consecutive failures, counting the one just seen (at least 1).

    Returns:
        :data:`BACKOFF_FIRST_SECONDS` doubled per earlier failure, at most
        :data:`BACKOFF_MAX_SECONDS` (1, 2, 4, ... 30 s).
    """
    return min(BACKOFF_MAX_SECONDS, BACKOFF_FIRST_SECONDS * 2 ** (max(1, failures) - 1))


def failures_after(failures: int, lived_seconds: float) -> int:
    """Consecutive failures after one more, for a connection that was up ``lived_seconds``.

    A connection up :data:`STABLE_SECONDS` or longer restarts the count (and so the
    doubling) at 1; 0 for a connection that never opened.
    """
    return (0 if lived_seconds >= STABLE_SECONDS else failures) + 1


def backoff_step(
    now: float, retry_at: float | None, deadline: float, *, wait_backoff: bool
) -> Literal["start", "wait", "refuse"]:
    """What a request does when no connection is up and none is starting.

    Args:
        now, retry_at, deadline: monotonic seconds; ``retry_at`` None: no backoff.
        wait_backoff: whether this request may wait out a backoff (calls yes, lists no).

    Returns:
        ``"start"`` (no backoff, or it is over), ``"wait"`` (the relaunch comes before the
        deadline: wait for it; issue 27), or ``"refuse"`` (fail at once, saying when).
    """
    if retry_at is None or now >= retry_at:
        return "start"
    return "wait" if wait_backoff and retry_at < deadline else "refuse"


def start_failure(err: Exception, *, opened: bool, startup_timeout_seconds: float) -> str:
    """What broke a connection, in a line.

    Args:
        err: what the connection's owner task caught.
        opened: whether the session had finished ``initialize``.
        startup_timeout_seconds: the server's start limit, named when it ran out.

    Returns:
        The failure as reported (in ``last_error`` and error messages, before masking).
    """
    if isinstance(err, StartError):
        return str(err)
    if isinstance(err, TimeoutError) and not opened:
        return f"no answer to initialize within {startup_timeout_seconds:g} s"
    if isinstance(err, MCPError):
        return err.message if opened else f"handshake failed: {err.message}"
    return _first_line(err)


class Supervisor:
    """The worker's MCP connections, one per server, and the state they share.

    Args:
        resolved: the enabled servers by name, resolved (secrets filled in).
    """

    def __init__(self, resolved: Mapping[str, ResolvedServer]):
        self.servers = {name: Server(server) for name, server in resolved.items()}
        self.live: set[Connection] = set()
        self.closed = False
        self.closing = asyncio.Event()
        """Set by :meth:`aclose`: wakes requests waiting out a backoff."""

    def status(self) -> list[ServerStatus]:
        """Every enabled server's state, in config order (cheap; no I/O)."""
        now = time.monotonic()
        out = []
        for srv in self.servers.values():
            conn = srv.conn
            if conn is not None and conn.usable:
                state: ServerState = "ready"
            elif srv.starting is not None and not srv.starting.done():
                state = "starting"
            elif srv.retry_at is not None and now < srv.retry_at:
                state = "backoff"
            elif srv.last_error is not None and srv.failures:
                state = "failed"
            else:
                state = "stopped"
            running = conn is not None and not conn.finished.is_set()
            if running and conn is not None and conn.pid is None and conn.group is not None:
                conn.pid = child_pid_now(conn.group)  # forked after the connection stopped waiting
            out.append(
                ServerStatus(
                    name=srv.name,
                    transport=srv.config.transport,
                    state=state,
                    pid=conn.pid if running and conn is not None else None,
                    restarts=srv.restarts,
                    last_error=srv.last_error,
                    tools_cached=None if srv.tools is None else len(srv.tools),
                    retry_in_seconds=max(0.0, srv.retry_at - now) if state == "backoff" and srv.retry_at else None,
                    process_group=conn.group if running and conn is not None else None,
                )
            )
        return out

    async def aclose(self) -> None:
        """Close every connection and kill every stdio server's process tree.

        Waits for each tree to be gone (at most about the grace periods of
        :func:`hermes.mcp.stdio.stop_tree`: 4.5 s, servers in parallel). Later requests raise
        :class:`McpUnavailableError` (``reason="closed"``). Safe to call twice.
        """
        self.closed = True
        self.closing.set()
        for srv in self.servers.values():
            for task in list(srv.background):
                task.cancel()
        while self.live or any(srv.starting is not None and not srv.starting.done() for srv in self.servers.values()):
            for conn in list(self.live):
                conn.end(None)
            for srv in self.servers.values():
                if srv.starting is not None and not srv.starting.done():
                    with contextlib.suppress(BaseException):
                        await srv.starting
            for conn in list(self.live):
                await conn.finished.wait()

    # ------------------------------------------------------------------ requests

    def server(self, name: str) -> Server:
        if self.closed:
            raise McpUnavailableError(name, f"MCP server {name!r}: the MCP manager is closed", reason="closed")
        srv = self.servers.get(name)
        if srv is None:
            known = ", ".join(self.servers) or "none"
            raise McpUnavailableError(
                name, f"no enabled MCP server named {name!r} (configured: {known})", reason="unknown_server"
            )
        return srv

    def retry_note(self, srv: Server) -> str:
        if srv.retry_at is None:
            return ""
        return f"; next start attempt in {max(0.0, srv.retry_at - time.monotonic()):.1f} s"

    async def acquire(
        self, srv: Server, deadline: float, what: str, timeout_seconds: float, wait_backoff: bool
    ) -> Connection:
        """A ready connection, started (or health-checked) as needed before ``deadline``;
        with ``wait_backoff``, after a backoff that ends before ``deadline``."""
        while True:
            if self.closed:
                raise McpUnavailableError(srv.name, f"MCP server {srv.name!r}: the MCP manager is closed", reason="closed")
            remaining = deadline - time.monotonic()
            conn = srv.conn
            if conn is not None and conn.usable:
                if conn.session_expired:
                    conn.end(None)
                    await conn.finished.wait()
                    continue
                if conn.process is not None and conn.process.returncode is not None:
                    conn.end(f"the server process exited with code {conn.process.returncode}")
                    await conn.finished.wait()
                    continue
                if conn.suspect or time.monotonic() - conn.last_used > PING_AFTER_IDLE_SECONDS:
                    if not await self._ping(srv, conn, min(remaining, _PING_TIMEOUT_SECONDS)):
                        await conn.finished.wait()
                        continue
                return conn
            if srv.starting is None or srv.starting.done():
                now = time.monotonic()
                step = backoff_step(now, srv.retry_at, deadline, wait_backoff=wait_backoff)
                if step != "start":
                    assert srv.retry_at is not None
                    wait = srv.retry_at - now
                    if step == "wait":  # the relaunch comes in time: wait for it
                        with contextlib.suppress(TimeoutError):
                            await asyncio.wait_for(self.closing.wait(), wait)
                        continue
                    late = f", after this request's {timeout_seconds:g} s deadline" if wait_backoff else ""
                    raise McpUnavailableError(
                        srv.name,
                        srv.mask(
                            f"MCP server {srv.name!r} is unavailable after a failure ({srv.last_error}); "
                            f"next start attempt in {wait:.1f} s{late}"
                        ),
                        reason="backoff",
                        retry_in_seconds=wait,
                    )
                srv.starting = asyncio.create_task(self._start(srv))
                srv.starting.add_done_callback(_retrieve)
            if remaining <= 0:
                raise McpUnavailableError(
                    srv.name, f"MCP server {srv.name!r} did not start within {timeout_seconds:g} s", reason="timeout"
                )
            try:
                await asyncio.wait_for(asyncio.shield(srv.starting), remaining)
            except (TimeoutError, asyncio.TimeoutError):
                raise McpUnavailableError(
                    srv.name,
                    f"MCP server {srv.name!r} did not start within {timeout_seconds:g} s (for {what})",
                    reason="timeout",
                ) from None

    async def _ping(self, srv: Server, conn: Connection, timeout_seconds: float) -> bool:
        """Whether the server answers a ping; ends the connection as failed if not."""
        assert conn.session is not None
        try:
            with anyio.fail_after(max(0.05, timeout_seconds)):
                await conn.session.send_ping()
        except Exception as err:  # noqa: BLE001 - any failure of a ping means "not healthy"
            reason = "did not answer a ping" if isinstance(err, TimeoutError) else f"ping failed: {_first_line(err)}"
            conn.end(reason)
            return False
        conn.suspect = False
        conn.last_used = time.monotonic()
        return True

    async def health_check(self, srv: Server, conn: Connection) -> None:
        """After a timeout: kill a server that no longer answers a ping."""
        if conn.usable:
            await self._ping(srv, conn, min(_PING_TIMEOUT_SECONDS, srv.config.timeout_seconds))

    def spawn(self, srv: Server, coro: Awaitable[Any]) -> None:
        task = asyncio.ensure_future(coro)
        srv.background.add(task)
        task.add_done_callback(srv.background.discard)

    # ------------------------------------------------------------------ connections

    async def _start(self, srv: Server) -> Connection:
        """Open a connection (the shared start task; callers wait on it with their deadline)."""
        if self.closed:
            raise McpUnavailableError(srv.name, f"MCP server {srv.name!r}: the MCP manager is closed", reason="closed")
        if srv.failures:
            srv.restarts += 1
            telemetry.count_mcp_restart(srv.name)
        conn = Connection(srv)
        self.live.add(conn)
        ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        srv.conn = conn
        owner = asyncio.create_task(self._own(srv, conn, ready), name=f"mcp-{srv.name}")
        srv.background.discard(owner)  # never cancelled: it ends itself via conn.end()
        try:
            await ready
        except McpUnavailableError:
            raise
        except BaseException:
            conn.end("start interrupted")
            raise
        return conn

    async def _own(self, srv: Server, conn: Connection, ready: asyncio.Future[None]) -> None:
        """The connection's owner task: opens the transport and session, waits for the end,
        closes both (killing a stdio server's tree) in the same task."""
        failure: str | None = None
        try:
            async with contextlib.AsyncExitStack() as stack:
                try:
                    await self._open(srv, conn, ready, stack)
                except _Ended:
                    raise
                except Exception as err:
                    # The first cause is the one reported: closing the stack below makes
                    # a stdio server exit (code 0), which would otherwise hide a timeout.
                    failure = self._start_failure(srv, conn, err)
                    if conn.process is not None and "exited" not in failure:
                        failure += exit_note(conn.process)
                    conn.end(failure)
                    raise
        except _Ended:
            pass
        except Exception as err:  # noqa: BLE001 - every way a connection can break is reported
            failure = self._start_failure(srv, conn, err)
        finally:
            # A reason recorded before the close is the cause (an exit it saw is in it); an
            # exit code seen only now is the close's doing (143: our SIGTERM), not news.
            if conn.end_reason is not None:
                failure = conn.end_reason
            elif failure is None and not conn.deliberate and not self.closed:
                failure = "the connection closed"
            elif conn.process is not None and failure is not None and conn.process.returncode is not None:
                if "exited" not in failure:
                    failure = f"{failure} (the server process exited with code {conn.process.returncode})"
            if conn.deliberate:
                failure = None
            if failure is not None and conn.stderr_tail:
                failure = f"{failure}; stderr: {conn.stderr_text()}"
            if failure is not None:
                failure = srv.mask(failure)
                conn.failure = failure
                self._failed(srv, conn, failure)
            elif srv.conn is conn:
                srv.conn = None
            conn.ended.set()
            conn.finished.set()
            self.live.discard(conn)
            if not ready.done():
                ready.set_exception(
                    McpUnavailableError(
                        srv.name,
                        f"MCP server {srv.name!r} could not be started: {failure or 'closed while starting'}"
                        f"{self.retry_note(srv)}",
                        reason="start" if not self.closed else "closed",
                    )
                )
                ready.exception()  # retrieved here too: no "never retrieved" warning

    async def _open(
        self, srv: Server, conn: Connection, ready: asyncio.Future[None], stack: contextlib.AsyncExitStack
    ) -> None:
        """Open the transport and session on ``stack``, initialize within the server's
        ``startup_timeout_seconds``, mark ``ready``, then serve until the connection ends."""
        read, write = await stack.enter_async_context(open_transport(srv, conn))

        async def on_message(message: Any) -> None:
            kind = LIST_CHANGED.get(type(message))
            if kind is not None:
                srv.forget(kind)
                log.info("MCP server %s: %s list changed", srv.name, kind)
            elif isinstance(message, Exception):
                conn.http.transport_error = srv.mask(_first_line(message))
                log.debug("MCP server %s: transport error: %s", srv.name, conn.http.transport_error)

        session = await stack.enter_async_context(
            LenientSession(  # a result off its output schema is kept (hermes.mcp.output)
                read,
                write,
                message_handler=on_message,
                client_info=types.Implementation(name="hermes-agent", version="0.1.0"),
            )
        )
        conn.init_scope = anyio.CancelScope()
        with conn.init_scope:
            with anyio.fail_after(srv.config.startup_timeout_seconds):
                await session.initialize()
        conn.init_scope = None
        if conn.ended.is_set() or self.closed:
            raise _Ended()
        conn.session = session
        conn.opened_at = conn.last_used = time.monotonic()
        srv.retry_at = None
        ready.set_result(None)
        await self._serve(srv, conn)

    @staticmethod
    def _start_failure(srv: Server, conn: Connection, err: Exception) -> str:
        return start_failure(err, opened=conn.session is not None, startup_timeout_seconds=srv.config.startup_timeout_seconds)

    async def _serve(self, srv: Server, conn: Connection) -> None:
        """Wait until the connection is ended, closing it when idle too long."""
        idle = srv.config.idle_seconds
        while not conn.ended.is_set():
            wait = conn.last_used + idle - time.monotonic()
            with anyio.move_on_after(max(_POLL_SECONDS, wait)):
                await conn.ended.wait()
            if conn.ended.is_set():
                return
            if conn.in_flight == 0 and time.monotonic() - conn.last_used >= idle:
                log.info("MCP server %s: closing after %g s unused", srv.name, idle)
                conn.end(None)

    def _failed(self, srv: Server, conn: Connection, failure: str) -> None:
        """Record a failed connection: the failure count, the backoff, the message."""
        lived = time.monotonic() - conn.opened_at if conn.session is not None else 0.0
        srv.failures = failures_after(srv.failures, lived)
        delay = backoff_delay(srv.failures)
        srv.retry_at = time.monotonic() + delay
        srv.last_error = failure
        if srv.conn is conn:
            srv.conn = None
        log.warning("MCP server %s failed: %s; next start attempt in %.1f s", srv.name, failure, delay)


class _Ended(Exception):
    """The connection was ended while it started."""


def _retrieve(task: asyncio.Task[Any]) -> None:
    """Mark a start task's exception as seen (its waiters may all have timed out)."""
    if not task.cancelled():
        task.exception()
