"""Connections to MCP servers on the worker: started on demand, shared, watched, cleaned up.

One :class:`McpManager` per worker process holds at most one connection per configured
server (seed 004 §5.2). Every request of every activity to that server is multiplexed on
it; an MCP ``ClientSession`` correlates concurrent requests by id.

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
- **Timeout**: each request has one deadline, ``timeout_seconds`` (the call's, else the
  server's), covering the start of the server when it is not running, so nothing a
  caller awaits can outlast it. The start itself has its own limit,
  ``startup_timeout_seconds`` (default 60 s): a slow start outlives the caller that began
  it and serves the next one, instead of being killed and begun again by every caller.

stdio process trees: a server is started through a small supervisor (``python -c``,
:data:`_SUPERVISOR`) in a session and process group of its own (``start_new_session``).
The supervisor forks the server into that group, passes it stdin/stdout/stderr, waits
for it and exits with its status. It sets Linux ``PR_SET_PDEATHSIG`` so that when the
worker dies (even by SIGKILL) it is signalled and SIGKILLs its whole process group,
grandchildren included. Closing a connection (``aclose``, idle, reconnect, failure)
closes the server's stdin, waits :data:`_EXIT_GRACE_SECONDS`, sends SIGTERM to the group,
waits :data:`KILL_GRACE_SECONDS`, then SIGKILLs the group. What escapes: a descendant
that calls ``setsid()``/``setpgid()`` to leave the group (a daemon, by design), and on
non-Linux systems the PDEATHSIG guard (close and atexit still kill the group). The
server's stderr is drained continuously (it can never fill the pipe and block the
server); its last lines go into error messages.

Streamable HTTP and SSE: one MCP session per server. An HTTP 404 to a request carrying
our ``Mcp-Session-Id`` means the server forgot the session (restarted, expired): the
session is reopened and the request sent once more (the server did not run it). Where
the SDK would lose what the server said, :class:`hermes.mcp.http.ReportingTransport`
(our HTTP transport under the SDK's) tells it: an error status (4xx/5xx) to a request fails that
request with the status and the start of the body (:data:`HTTP_ERROR_BODY_CHARS`), also
logged; a connection that cannot be made fails the request with that error, instead of
ending the transport ("unhandled errors in a TaskGroup"). A connection that closes
during a request (the server died, a proxy dropped it) fails the request at once and ends
the connection, naming what the HTTP layer saw, instead of at the request's deadline.

Lists (``tools/list``, ``resources/list``, ``prompts/list``) follow ``nextCursor`` for at
most :data:`MAX_LIST_PAGES` pages and stop early, keeping what was read, with a warning,
on a page that brings nothing new (a cursor that never advances).

Secrets: every message this module produces (errors, ``status()``, logs) has the
server's resolved ``${NAME}`` values and ``env``/``headers`` values masked
(:func:`hermes.mcp.config.redact`).

Why this module is long: a connection's life (start, initialize, watch, back off, stop
when idle, clean up the process tree) is one state machine whose transitions share one
lock and one record per server; spread over files, a reader could no longer check that
every path out of a state releases what it holds.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

import anyio
import httpx2
import mcp.types as types
from anyio.abc import Process
from anyio.streams.text import TextReceiveStream
from mcp import ClientSession
from mcp.client.sse import sse_client
from mcp.client.stdio import get_default_environment
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp.shared.message import SessionMessage
from pydantic import ValidationError

from hermes.errors import HermesError
from hermes import redaction, telemetry
from hermes.mcp.config import McpConfig, ResolvedServer, ServerConfig, Transport, redact, resolve_all
from hermes.mcp.http import HTTP_ERROR_BODY_CHARS, HttpState, ReportingTransport
from hermes.mcp.http import first_line as _first_line
from hermes.mcp.output import LenientSession

__all__ = [
    "BACKOFF_FIRST_SECONDS",
    "BACKOFF_MAX_SECONDS",
    "HTTP_ERROR_BODY_CHARS",
    "KILL_GRACE_SECONDS",
    "MAX_LIST_PAGES",
    "PING_AFTER_IDLE_SECONDS",
    "STABLE_SECONDS",
    "McpManager",
    "McpUnavailableError",
    "ServerState",
    "ServerStatus",
]

log = logging.getLogger("hermes.mcp")

ServerState = Literal["stopped", "starting", "ready", "failed", "backoff"]

BACKOFF_FIRST_SECONDS = 1.0
"""Wait before the first restart after a failure (issue 4: "1 s doubling to 30 s")."""
BACKOFF_MAX_SECONDS = 30.0
"""Longest wait between restarts."""
STABLE_SECONDS = 60.0
"""A connection that was up this long before failing restarts the doubling at 1 s."""
PING_AFTER_IDLE_SECONDS = 30.0
"""A connection unused for longer is pinged before it is used again."""
KILL_GRACE_SECONDS = 2.0
"""Between SIGTERM to a server's process group and SIGKILL."""
_EXIT_GRACE_SECONDS = 0.5
"""After closing a server's stdin, before SIGTERM (the spec's polite shutdown)."""
_PING_TIMEOUT_SECONDS = 5.0
"""Longest wait for a health-check ping."""
_REAP_SECONDS = 2.0
"""After SIGKILL, how long to wait for the kernel to report the group gone."""
MAX_LIST_PAGES = 100
"""Most pages read of one list; a server still sending ``nextCursor`` after that is cut
off there (with a warning), keeping what was read."""
_CLOSE_WAIT_SECONDS = 2.0
"""After an HTTP connection closed during a request: longest wait for its close to be
recorded (for the message) before the request fails anyway."""
_STDERR_LINES = 20
"""Lines of a server's stderr kept for error messages."""
_STDERR_LINE_CHARS = 500
_POLL_SECONDS = 0.05

_SUPERVISOR = r"""
import ctypes, os, signal, sys
parent = int(sys.argv[1])
group = os.getpgrp()
def kill_group(*_):
    os.killpg(group, signal.SIGKILL)
signal.signal(signal.SIGUSR1, kill_group)
try:
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGUSR1)  # PR_SET_PDEATHSIG
except Exception:
    pass
if os.getppid() != parent:
    kill_group()
signal.signal(signal.SIGTERM, signal.SIG_IGN)
signal.signal(signal.SIGINT, signal.SIG_IGN)
pid = os.fork()
if pid == 0:
    signal.signal(signal.SIGUSR1, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    try:
        os.execvp(sys.argv[2], sys.argv[2:])
    except OSError as err:
        os.write(2, f"cannot start {sys.argv[2]!r}: {err}\n".encode())
        os._exit(127)
null = os.open(os.devnull, os.O_RDWR)
os.dup2(null, 0)
os.dup2(null, 1)
while True:
    try:
        _, status = os.waitpid(pid, 0)
        break
    except InterruptedError:
        continue
code = os.waitstatus_to_exitcode(status)
os._exit(code if code >= 0 else 128 - code)
"""
"""The supervisor (see the module docstring). argv: the worker's pid, then the server's
command and arguments. It ignores SIGTERM (the group's SIGTERM is for the server; the
supervisor exits when the server does) and SIGKILLs the group on SIGUSR1, its
parent-death signal. It exits with the server's code (128 + signal for a signal)."""

_LIVE_GROUPS: set[int] = set()
"""Process groups of running stdio servers, SIGKILLed at interpreter exit if still there
(a worker that returns without ``aclose``)."""


@atexit.register
def _kill_live_groups() -> None:
    for group in list(_LIVE_GROUPS):
        with contextlib.suppress(OSError):
            os.killpg(group, signal.SIGKILL)


class McpUnavailableError(HermesError):
    """An MCP server could not answer a request: not started, crashed, hung, broke the protocol.

    The message names the server and says what happened (secrets masked). A tool that
    ran and failed is not this: it is a ``CallToolResult`` with ``is_error=True``.

    Attributes:
        server: the server's name.
        reason: ``"unknown_server"``, ``"start"`` (cannot start: bad command path, no
            handshake), ``"backoff"`` (failed recently; not retried before
            ``retry_in_seconds``, which is past the request's deadline), ``"timeout"``,
            ``"crashed"`` (connection lost mid-request),
            ``"protocol"`` (an error response or a malformed result), ``"http"`` (an
            HTTP error status; the message has the status and the start of the body),
            ``"unsupported"`` (the server does not offer resources/prompts), ``"closed"``
            (manager closed).
        maybe_ran: whether the request may have reached the server (a tool call whose
            outcome is unknown); False when it certainly did not.
        retry_in_seconds: for ``"backoff"``, seconds until the next start attempt.
        http_status: for ``"http"``, the HTTP status the server answered (e.g. 403).
    """

    def __init__(
        self,
        server: str,
        message: str,
        *,
        reason: str,
        maybe_ran: bool = False,
        retry_in_seconds: float | None = None,
        http_status: int | None = None,
    ):
        self.server = server
        self.reason = reason
        self.maybe_ran = maybe_ran
        self.retry_in_seconds = retry_in_seconds
        self.http_status = http_status
        super().__init__(message)


@dataclass(frozen=True)
class ServerStatus:
    """One server as :meth:`McpManager.status` sees it (no secrets)."""

    name: str
    transport: Transport
    state: ServerState
    pid: int | None
    """The stdio server's process id while it runs (its supervisor's child), else None."""
    restarts: int
    """Connections opened after a failure, since the manager was made."""
    last_error: str | None
    """Why the last connection or start failed (masked), or None."""
    tools_cached: int | None
    """Tools in the cached list (after allow/deny), None when no list is cached."""
    retry_in_seconds: float | None = None
    """In ``backoff``: seconds until a request may start the server again."""
    process_group: int | None = None
    """The stdio server's process group (the supervisor's pid), while it runs."""


T = TypeVar("T")


class _Connection:
    """One transport + ``ClientSession`` to one server, owned by one background task."""

    def __init__(self, server: _Server):
        self.server = server
        self.session: ClientSession | None = None
        self.ended = anyio.Event()
        self.finished = asyncio.Event()
        self.end_reason: str | None = None
        """Set with :meth:`end`: None for a deliberate close, else the failure."""
        self.failure: str | None = None
        """The final, masked description of the failure (with stderr), once finished."""
        self.deliberate = False
        self.opened_at = time.monotonic()
        self.last_used = time.monotonic()
        self.in_flight = 0
        self.suspect = False
        self.session_expired = False
        self.process: Process | None = None
        self.pid: int | None = None
        self.group: int | None = None
        self.stderr_tail: deque[str] = deque(maxlen=_STDERR_LINES)
        self.init_scope: anyio.CancelScope | None = None
        self.http = HttpState()
        """What the HTTP layer saw (streamable HTTP and SSE)."""

    @property
    def usable(self) -> bool:
        return self.session is not None and not self.ended.is_set()

    def end(self, failure: str | None) -> None:
        """Ask the owner task to close; ``failure`` None means a deliberate close."""
        if self.ended.is_set():
            return
        self.deliberate = failure is None
        self.end_reason = failure
        self.ended.set()
        if self.init_scope is not None:
            self.init_scope.cancel()

    def stderr_text(self) -> str:
        return " | ".join(self.stderr_tail)


class _Server:
    """Per-server state kept across connections."""

    def __init__(self, resolved: ResolvedServer):
        self.resolved = resolved
        self.config: ServerConfig = resolved.config
        self.conn: _Connection | None = None
        self.starting: asyncio.Task[_Connection] | None = None
        self.restarts = 0
        self.failures = 0
        """Consecutive failures (sets the backoff)."""
        self.retry_at: float | None = None
        self.last_error: str | None = None
        self.lists: dict[str, tuple[float, list[Any]]] = {}
        """Cached lists by kind (``tools``, ``resources``, ``prompts``): (when, items)."""
        self.generations: dict[str, int] = {}
        """Bumped by the server's ``list_changed`` notification of each kind."""
        self.background: set[asyncio.Task[Any]] = set()

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def tools(self) -> list[types.Tool] | None:
        cached = self.lists.get("tools")
        return None if cached is None else cached[1]

    def forget(self, kind: str) -> None:
        """Drop the cached list of ``kind`` (the server said it changed)."""
        self.lists.pop(kind, None)
        self.generations[kind] = self.generations.get(kind, 0) + 1

    def mask(self, text: Any) -> Any:
        return redact(text, self.resolved)


class McpManager:
    """The worker's connections to its MCP servers (see the module docstring).

    Use one per worker process and event loop; close it with :meth:`aclose` (or
    ``async with``). Safe for concurrent use by many activities.

    Args:
        config: the servers (from :func:`hermes.mcp.config.load_mcp_config`); disabled
            ones are not offered.
        environ: where ``${NAME}`` references are read from; default: this process'
            environment.

    Raises:
        ConfigError: an enabled server uses a ``${NAME}`` that is not set (every unset
            variable is named at once).
    """

    def __init__(self, config: McpConfig, *, environ: Mapping[str, str] | None = None):
        self.config = config
        self.resolved: dict[str, ResolvedServer] = resolve_all(config, environ)
        """Resolved servers by name (worker-only; ``repr`` masks secrets)."""
        # Libraries log what they send (httpx: every URL; the mcp client: whole messages).
        redaction.register(s for server in self.resolved.values() for s in server.secrets)
        self._servers = {name: _Server(resolved) for name, resolved in self.resolved.items()}
        self._live: set[_Connection] = set()
        self._closed = False
        self._closing = asyncio.Event()
        """Set by :meth:`aclose`: wakes requests waiting out a backoff."""

    async def __aenter__(self) -> McpManager:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # ------------------------------------------------------------------ public API

    async def list_tools(self, server: str, *, refresh: bool = False) -> list[types.Tool]:
        """The server's tools that its ``allow``/``deny`` globs let through.

        Served from a cache for ``list_ttl_seconds`` (0: always asked); a
        ``notifications/tools/list_changed`` from the server empties the cache.

        Args:
            server: the server's name.
            refresh: ask the server even when the cache is fresh.

        Returns:
            The tools in the server's order (every page), filtered by
            :meth:`ServerConfig.allows`.

        Raises:
            McpUnavailableError: the server cannot be reached within its
                ``timeout_seconds`` (see :meth:`call_tool`).
        """
        srv = self._server(server)

        async def listing(session: ClientSession) -> list[types.Tool]:
            return [tool for tool in await _all_pages(session.list_tools, "tools", srv.name) if srv.config.allows(tool.name)]

        return await self._cached_list(srv, "tools", listing, refresh=refresh)

    async def _cached_list(
        self, srv: _Server, kind: str, listing: Callable[[ClientSession], Awaitable[list[Any]]], *, refresh: bool = False
    ) -> list[Any]:
        """A server's list of ``kind``, from the cache while younger than
        ``list_ttl_seconds`` (0: always asked) and not invalidated by ``list_changed``."""
        ttl = srv.config.list_ttl_seconds
        cached = srv.lists.get(kind)
        if not refresh and cached is not None and ttl > 0 and time.monotonic() - cached[0] < ttl:
            return list(cached[1])
        generation = srv.generations.get(kind, 0)
        # A list does not wait out a backoff: the turn goes on without the server's tools.
        items = await self._request(srv, f"{kind}/list", listing, srv.config.timeout_seconds, wait_backoff=False)
        if generation == srv.generations.get(kind, 0):  # no list_changed arrived meanwhile
            srv.lists[kind] = (time.monotonic(), items)
        return list(items)

    async def call_tool(
        self, server: str, tool: str, arguments: dict[str, Any], *, timeout_seconds: float | None = None
    ) -> types.CallToolResult:
        """Call one tool of a server.

        Args:
            server: the server's name.
            tool: the tool's name as the server lists it.
            arguments: the tool's arguments (a JSON object).
            timeout_seconds: the whole call's limit in seconds, starting the server
                included; default the server's ``timeout_seconds``.

        Returns:
            The server's result as sent; a tool that failed is a result with
            ``is_error=True``, not an exception. It is not checked against the tool's
            ``outputSchema`` (see :func:`hermes.mcp.output.output_mismatch`).

        Raises:
            McpUnavailableError: within the timeout, naming the server: it cannot start
                (bad command path, no handshake), it is in backoff after a failure until
                after the deadline (says when it retries), it crashed or hung
                (``maybe_ran=True``), or it answered with a protocol error. A tool denied by ``allow``/``deny`` is refused the
                same way (``reason="protocol"``).
        """
        srv = self._server(server)
        if not srv.config.allows(tool):
            raise McpUnavailableError(
                server, f"MCP server {server!r}: tool {tool!r} is not allowed by its allow/deny lists", reason="protocol"
            )
        timeout = srv.config.timeout_seconds if timeout_seconds is None else timeout_seconds
        return await self._request(
            srv, f"tools/call {tool!r}", lambda session: session.call_tool(tool, arguments), timeout, maybe_ran=True
        )

    async def list_resources(self, server: str) -> list[types.Resource]:
        """The server's resources (every page), or ``[]`` when it offers none; cached like
        :meth:`list_tools` (its own ``list_changed`` notification empties the cache).

        Raises:
            McpUnavailableError: as :meth:`call_tool`.
        """
        srv = self._server(server)

        async def listing(session: ClientSession) -> list[types.Resource]:
            if _capabilities(session).resources is None:
                return []
            return await _all_pages(session.list_resources, "resources", srv.name)

        return await self._cached_list(srv, "resources", listing)

    async def read_resource(self, server: str, uri: str) -> types.ReadResourceResult:
        """Read one resource of a server.

        Args:
            server: the server's name.
            uri: the resource's URI as listed.

        Raises:
            McpUnavailableError: the server offers no resources (``reason="unsupported"``),
                or as :meth:`call_tool` (an unknown URI is a protocol error).
        """
        srv = self._server(server)

        async def read(session: ClientSession) -> types.ReadResourceResult:
            if _capabilities(session).resources is None:
                raise McpUnavailableError(
                    srv.name, f"MCP server {srv.name!r} offers no resources", reason="unsupported"
                )
            return await session.read_resource(uri)

        return await self._request(srv, f"resources/read {uri!r}", read, srv.config.timeout_seconds)

    async def list_prompts(self, server: str) -> list[types.Prompt]:
        """The server's prompts (every page), or ``[]`` when it offers none; cached like
        :meth:`list_tools` (its own ``list_changed`` notification empties the cache).

        Raises:
            McpUnavailableError: as :meth:`call_tool`.
        """
        srv = self._server(server)

        async def listing(session: ClientSession) -> list[types.Prompt]:
            if _capabilities(session).prompts is None:
                return []
            return await _all_pages(session.list_prompts, "prompts", srv.name)

        return await self._cached_list(srv, "prompts", listing)

    async def get_prompt(
        self, server: str, name: str, arguments: dict[str, str] | None = None
    ) -> types.GetPromptResult:
        """Render one prompt of a server.

        Args:
            server: the server's name.
            name: the prompt's name as listed.
            arguments: the prompt's arguments (strings).

        Raises:
            McpUnavailableError: the server offers no prompts (``reason="unsupported"``),
                or as :meth:`call_tool`.
        """
        srv = self._server(server)

        async def get(session: ClientSession) -> types.GetPromptResult:
            if _capabilities(session).prompts is None:
                raise McpUnavailableError(srv.name, f"MCP server {srv.name!r} offers no prompts", reason="unsupported")
            return await session.get_prompt(name, arguments or {})

        return await self._request(srv, f"prompts/get {name!r}", get, srv.config.timeout_seconds)

    def status(self) -> list[ServerStatus]:
        """Every enabled server's state, in config order (cheap; no I/O)."""
        now = time.monotonic()
        out = []
        for srv in self._servers.values():
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

        Waits for each tree to be gone (at most about ``_EXIT_GRACE_SECONDS +
        KILL_GRACE_SECONDS + _REAP_SECONDS``, servers in parallel). Later requests raise
        :class:`McpUnavailableError` (``reason="closed"``). Safe to call twice.
        """
        self._closed = True
        self._closing.set()
        for srv in self._servers.values():
            for task in list(srv.background):
                task.cancel()
        while self._live or any(srv.starting is not None and not srv.starting.done() for srv in self._servers.values()):
            for conn in list(self._live):
                conn.end(None)
            for srv in self._servers.values():
                if srv.starting is not None and not srv.starting.done():
                    with contextlib.suppress(BaseException):
                        await srv.starting
            for conn in list(self._live):
                await conn.finished.wait()

    # ------------------------------------------------------------------ requests

    def _server(self, name: str) -> _Server:
        if self._closed:
            raise McpUnavailableError(name, f"MCP server {name!r}: the MCP manager is closed", reason="closed")
        srv = self._servers.get(name)
        if srv is None:
            known = ", ".join(self._servers) or "none"
            raise McpUnavailableError(
                name, f"no enabled MCP server named {name!r} (configured: {known})", reason="unknown_server"
            )
        return srv

    async def _request(
        self,
        srv: _Server,
        what: str,
        fn: Callable[[ClientSession], Awaitable[T]],
        timeout_seconds: float,
        *,
        maybe_ran: bool = False,
        wait_backoff: bool = True,
    ) -> T:
        """Run ``fn`` on the server's session within ``timeout_seconds`` (start included);
        retried once on a fresh session after an HTTP 404 for an expired session."""
        deadline = time.monotonic() + timeout_seconds
        for attempt in range(2):
            conn = await self._acquire(srv, deadline, what, timeout_seconds, wait_backoff)
            assert conn.session is not None
            conn.in_flight += 1
            conn.last_used = time.monotonic()
            try:
                with anyio.fail_after(max(0.0, deadline - time.monotonic())):
                    result = await fn(conn.session)
            except TimeoutError:
                conn.suspect = True
                self._spawn(srv, self._health_check(srv, conn))
                raise McpUnavailableError(
                    srv.name,
                    f"MCP server {srv.name!r} did not answer {what} within {timeout_seconds:g} s"
                    + (" (the call may have run)" if maybe_ran else ""),
                    reason="timeout",
                    maybe_ran=maybe_ran,
                ) from None
            except MCPError as err:
                detail = err.data if isinstance(err.data, dict) else {}
                if isinstance(detail.get("http_status"), int):
                    status = detail["http_status"]
                    raise McpUnavailableError(
                        srv.name,
                        srv.mask(f"MCP server {srv.name!r} answered {what} with {err.message}"),
                        reason="http",
                        # A 5xx may come from a gateway after the server ran the call.
                        maybe_ran=maybe_ran and status >= 500,
                        http_status=status,
                    ) from None
                if err.code == types.CONNECTION_CLOSED or conn.ended.is_set() or conn.session_expired:
                    wait = deadline - time.monotonic()
                    if conn.session_expired and not conn.ended.is_set():
                        conn.end(None)
                    elif not conn.ended.is_set() and conn.process is None:
                        # HTTP: the SDK fails the request whose stream closed unanswered but
                        # keeps the transport; the server is gone or unreachable, so is it.
                        cause = f" ({conn.http.transport_error})" if conn.http.transport_error else ""
                        conn.end(f"the connection closed mid-request: {err.message}{cause}")
                    if conn.process is None:
                        wait = min(wait, _CLOSE_WAIT_SECONDS)
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(conn.finished.wait(), max(0.1, wait))
                    if conn.session_expired and attempt == 0 and time.monotonic() < deadline:
                        log.info("MCP server %s: HTTP session expired (404); reconnecting once", srv.name)
                        continue
                    if conn.session_expired and conn.http.refusal is not None:
                        status, answer = conn.http.refusal
                        raise McpUnavailableError(
                            srv.name,
                            srv.mask(f"MCP server {srv.name!r} answered {what} with {answer} (on a new session too)"),
                            reason="http",
                            maybe_ran=False,
                            http_status=status,
                        ) from None
                    raise McpUnavailableError(
                        srv.name,
                        srv.mask(
                            f"MCP server {srv.name!r}: connection lost during {what}: "
                            f"{conn.failure or conn.end_reason or err.message}{self._retry_note(srv)}"
                        ),
                        reason="crashed",
                        maybe_ran=maybe_ran and detail.get("delivered") is not False,
                    ) from None
                raise McpUnavailableError(
                    srv.name,
                    srv.mask(f"MCP server {srv.name!r} answered {what} with error {err.code}: {err.message}"),
                    reason="protocol",
                    maybe_ran=False,
                ) from None
            except (ValidationError, RuntimeError, ValueError) as err:
                raise McpUnavailableError(
                    srv.name,
                    srv.mask(f"MCP server {srv.name!r} sent an invalid answer to {what}: {_first_line(err)}"),
                    reason="protocol",
                    maybe_ran=maybe_ran,
                ) from None
            finally:
                conn.in_flight -= 1
                conn.last_used = time.monotonic()
            if time.monotonic() - conn.opened_at >= STABLE_SECONDS:
                srv.failures = 0
            return result
        raise AssertionError("unreachable")

    def _retry_note(self, srv: _Server) -> str:
        if srv.retry_at is None:
            return ""
        return f"; next start attempt in {max(0.0, srv.retry_at - time.monotonic()):.1f} s"

    async def _acquire(
        self, srv: _Server, deadline: float, what: str, timeout_seconds: float, wait_backoff: bool
    ) -> _Connection:
        """A ready connection, started (or health-checked) as needed before ``deadline``;
        with ``wait_backoff``, after a backoff that ends before ``deadline``."""
        while True:
            if self._closed:
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
                if srv.retry_at is not None and time.monotonic() < srv.retry_at:
                    wait = srv.retry_at - time.monotonic()
                    if wait_backoff and srv.retry_at < deadline:  # the relaunch comes in time: wait for it
                        with contextlib.suppress(TimeoutError):
                            await asyncio.wait_for(self._closing.wait(), wait)
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

    async def _ping(self, srv: _Server, conn: _Connection, timeout_seconds: float) -> bool:
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

    async def _health_check(self, srv: _Server, conn: _Connection) -> None:
        """After a timeout: kill a server that no longer answers a ping."""
        if conn.usable:
            await self._ping(srv, conn, min(_PING_TIMEOUT_SECONDS, srv.config.timeout_seconds))

    def _spawn(self, srv: _Server, coro: Awaitable[Any]) -> None:
        task = asyncio.ensure_future(coro)
        srv.background.add(task)
        task.add_done_callback(srv.background.discard)

    # ------------------------------------------------------------------ connections

    async def _start(self, srv: _Server) -> _Connection:
        """Open a connection (the shared start task; callers wait on it with their deadline)."""
        if self._closed:
            raise McpUnavailableError(srv.name, f"MCP server {srv.name!r}: the MCP manager is closed", reason="closed")
        if srv.failures:
            srv.restarts += 1
            telemetry.count_mcp_restart(srv.name)
        conn = _Connection(srv)
        self._live.add(conn)
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

    async def _own(self, srv: _Server, conn: _Connection, ready: asyncio.Future[None]) -> None:
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
                        failure += _exit_note(conn.process)
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
            elif failure is None and not conn.deliberate and not self._closed:
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
            self._live.discard(conn)
            if not ready.done():
                ready.set_exception(
                    McpUnavailableError(
                        srv.name,
                        f"MCP server {srv.name!r} could not be started: {failure or 'closed while starting'}"
                        f"{self._retry_note(srv)}",
                        reason="start" if not self._closed else "closed",
                    )
                )
                ready.exception()  # retrieved here too: no "never retrieved" warning

    async def _open(
        self, srv: _Server, conn: _Connection, ready: asyncio.Future[None], stack: contextlib.AsyncExitStack
    ) -> None:
        """Open the transport and session on ``stack``, initialize within the server's
        ``startup_timeout_seconds``, mark ``ready``, then serve until the connection ends."""
        read, write = await stack.enter_async_context(self._transport(srv, conn))

        async def on_message(message: Any) -> None:
            kind = _LIST_CHANGED.get(type(message))
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
        if conn.ended.is_set() or self._closed:
            raise _Ended()
        conn.session = session
        conn.opened_at = conn.last_used = time.monotonic()
        srv.retry_at = None
        ready.set_result(None)
        await self._serve(srv, conn)

    @staticmethod
    def _start_failure(srv: _Server, conn: _Connection, err: Exception) -> str:
        """What broke a connection, in a line."""
        if isinstance(err, _StartError):
            return str(err)
        if isinstance(err, TimeoutError) and conn.session is None:
            return f"no answer to initialize within {srv.config.startup_timeout_seconds:g} s"
        if isinstance(err, MCPError):
            return f"handshake failed: {err.message}" if conn.session is None else err.message
        return _first_line(err)

    async def _serve(self, srv: _Server, conn: _Connection) -> None:
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

    def _failed(self, srv: _Server, conn: _Connection, failure: str) -> None:
        lived = time.monotonic() - conn.opened_at if conn.session is not None else 0.0
        if lived >= STABLE_SECONDS:
            srv.failures = 0
        srv.failures += 1
        delay = min(BACKOFF_MAX_SECONDS, BACKOFF_FIRST_SECONDS * 2 ** (srv.failures - 1))
        srv.retry_at = time.monotonic() + delay
        srv.last_error = failure
        if srv.conn is conn:
            srv.conn = None
        log.warning("MCP server %s failed: %s; next start attempt in %.1f s", srv.name, failure, delay)

    @contextlib.asynccontextmanager
    async def _transport(self, srv: _Server, conn: _Connection) -> AsyncIterator[tuple[Any, Any]]:
        resolved = srv.resolved
        if resolved.transport == "stdio":
            async with self._stdio(srv, conn) as streams:
                yield streams
            return
        assert resolved.url is not None

        async def on_response(response: httpx2.Response) -> None:
            if response.status_code == 404 and response.request.headers.get("mcp-session-id"):
                conn.session_expired = True

        timeout = httpx2.Timeout(srv.config.timeout_seconds, read=max(300.0, srv.config.timeout_seconds))
        if resolved.transport == "sse":

            def client_factory(
                headers: dict[str, Any] | None = None, timeout: httpx2.Timeout | None = None, auth: Any = None
            ) -> httpx2.AsyncClient:
                return httpx2.AsyncClient(
                    headers=headers, timeout=timeout, auth=auth, transport=ReportingTransport(srv.name, srv.mask, conn.http, sse=True)
                )

            async with sse_client(
                resolved.url,
                headers=dict(resolved.headers),
                timeout=srv.config.timeout_seconds,
                httpx_client_factory=client_factory,
            ) as (read, write):
                # The session reads the SDK's stream through ours, into which the transport
                # puts the answers to requests the server refused (see ReportingTransport).
                inject, merged = anyio.create_memory_object_stream[SessionMessage | Exception](16)

                async def forward() -> None:
                    try:
                        async for item in read:
                            await inject.send(item)
                    except (anyio.ClosedResourceError, anyio.BrokenResourceError, anyio.EndOfStream):
                        pass
                    finally:
                        conn.http.inject = None
                        inject.close()  # the SDK's stream ended (the server went away): so does ours

                conn.http.inject = inject
                async with anyio.create_task_group() as tg:
                    tg.start_soon(forward)
                    try:
                        yield merged, write
                    finally:
                        tg.cancel_scope.cancel()
                        merged.close()
            return
        async with httpx2.AsyncClient(
            headers=dict(resolved.headers),
            timeout=timeout,
            event_hooks={"response": [on_response]},
            transport=ReportingTransport(srv.name, srv.mask, conn.http, sse=False),
        ) as client:
            async with streamable_http_client(resolved.url, http_client=client) as (read, write):
                yield read, write

    @contextlib.asynccontextmanager
    async def _stdio(self, srv: _Server, conn: _Connection) -> AsyncIterator[tuple[Any, Any]]:
        """Start the server under the supervisor in a new process group; yield its streams.

        On exit (any cause) the whole group is killed: stdin closed, SIGTERM, SIGKILL.
        """
        resolved = srv.resolved
        assert resolved.command is not None
        env = {**get_default_environment(), **resolved.env}
        command = resolved.command
        if os.sep not in command and shutil.which(command, path=env.get("PATH")) is None:
            raise _StartError(f"command {command!r} not found on PATH")
        if os.sep in command and not os.access(command, os.X_OK):
            raise _StartError(f"command {command!r} does not exist or is not executable")
        try:
            process = await anyio.open_process(
                [sys.executable, "-c", _SUPERVISOR, str(os.getpid()), command, *resolved.args],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=env,
                cwd=resolved.cwd,
                start_new_session=True,
            )
        except OSError as err:
            raise _StartError(f"cannot start {command!r}: {err}") from None
        conn.process = process
        conn.group = process.pid
        _LIVE_GROUPS.add(process.pid)
        read_writer, read_stream = anyio.create_memory_object_stream[SessionMessage | Exception](0)
        write_stream, write_reader = anyio.create_memory_object_stream[SessionMessage](0)

        async def stdout_reader() -> None:
            assert process.stdout is not None
            try:
                async with read_writer:
                    buffer = ""
                    async for chunk in TextReceiveStream(process.stdout, encoding="utf-8"):
                        lines = (buffer + chunk).split("\n")
                        buffer = lines.pop()
                        for line in lines:
                            if not line.strip():
                                continue
                            try:
                                message = types.jsonrpc_message_adapter.validate_json(line, by_name=False)
                            except ValueError as err:
                                conn.stderr_tail.append(f"(not JSON-RPC on stdout: {line[:200]!r})")
                                await read_writer.send(err)
                                continue
                            await read_writer.send(SessionMessage(message))
            except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError, UnicodeDecodeError):
                pass
            if conn.ended.is_set():
                return
            with anyio.move_on_after(1.0):  # the exit code makes a better message
                while process.returncode is None:
                    await anyio.sleep(0.01)
            if process.returncode is None:
                conn.end("the server closed its stdout")
            else:
                conn.end(f"the server process exited with code {_exit_code(process)}")

        async def stdin_writer() -> None:
            assert process.stdin is not None
            try:
                async with write_reader:
                    async for message in write_reader:
                        data = message.message.model_dump_json(by_alias=True, exclude_unset=True) + "\n"
                        await process.stdin.send(data.encode("utf-8"))
            except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
                conn.end(f"the server closed its stdin{_exit_note(process)}")

        async def stderr_drain() -> None:
            assert process.stderr is not None
            buffer = b""
            with contextlib.suppress(anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
                while True:
                    buffer += await process.stderr.receive(65536)
                    *lines, buffer = buffer.split(b"\n")
                    for line in lines:
                        text = line.decode("utf-8", "replace").strip()
                        if text:
                            conn.stderr_tail.append(text[:_STDERR_LINE_CHARS])
                    buffer = buffer[-_STDERR_LINE_CHARS:]

        async def exit_watch() -> None:
            while process.returncode is None:
                await anyio.sleep(0.2)
            conn.end(f"the server process exited with code {_exit_code(process)}")

        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(stdout_reader)
                tg.start_soon(stdin_writer)
                tg.start_soon(stderr_drain)
                tg.start_soon(exit_watch)
                conn.pid = await _child_pid(process.pid)
                try:
                    yield read_stream, write_stream
                finally:
                    with anyio.CancelScope(shield=True):
                        write_stream.close()
                        read_stream.close()
                        await _stop_tree(process)
                    tg.cancel_scope.cancel()
        finally:
            _LIVE_GROUPS.discard(process.pid)
            for stream in (process.stdin, process.stdout, process.stderr):
                if stream is not None:
                    with contextlib.suppress(Exception):
                        await stream.aclose()
            transport = getattr(getattr(process, "_process", None), "_transport", None)
            if transport is not None:
                with contextlib.suppress(Exception):
                    transport.close()


class _Ended(Exception):
    """The connection was ended while it started."""


class _StartError(Exception):
    """A stdio server that cannot be started at all."""


def _retrieve(task: asyncio.Task[Any]) -> None:
    """Mark a start task's exception as seen (its waiters may all have timed out)."""
    if not task.cancelled():
        task.exception()


_LIST_CHANGED: dict[type, str] = {
    types.ToolListChangedNotification: "tools",
    types.ResourceListChangedNotification: "resources",
    types.PromptListChangedNotification: "prompts",
}


async def _all_pages(fetch: Callable[..., Awaitable[Any]], field: str, server: str) -> list[Any]:
    """Every item of a paginated MCP list, page by page, following ``next_cursor``.

    Stops early, keeping what it read and logging a warning, on a page that brings no
    item not already read (a cursor that never advances, or empty pages), and after
    :data:`MAX_LIST_PAGES` pages. A repeated cursor alone is no reason to stop: cursors
    are opaque, and a server may keep its position itself behind a constant one (MCP
    2026-07-28, pagination). An item read twice is kept once, the first time.

    Args:
        fetch: the session's ``list_tools``, ``list_resources`` or ``list_prompts``.
        field: the result's list: ``"tools"``, ``"resources"`` or ``"prompts"``.
        server: the server's name, for the warning.

    Returns:
        The items in the server's order, duplicates dropped (tools and prompts by name,
        resources by URI).
    """
    found: list[Any] = []
    seen: set[str] = set()
    cursor: str | None = None
    for pages in range(1, MAX_LIST_PAGES + 1):
        page = await fetch(params=types.PaginatedRequestParams(cursor=cursor) if cursor else None)
        fresh = 0
        for item in getattr(page, field):
            key = str(getattr(item, "uri", None) or getattr(item, "name", None) or id(item))
            if key not in seen:
                seen.add(key)
                found.append(item)
                fresh += 1
        if not page.next_cursor:
            return found
        if fresh == 0:
            log.warning(
                "MCP server %s: %s/list page %d brought nothing new and still has a next cursor; "
                "stopped there with the %d read",
                server, field, pages, len(found),
            )
            return found
        cursor = page.next_cursor
    log.warning(
        "MCP server %s: %s/list still had a next cursor after %d pages; stopped there with the %d read",
        server, field, MAX_LIST_PAGES, len(found),
    )
    return found


def _capabilities(session: ClientSession) -> types.ServerCapabilities:
    return session.server_capabilities or types.ServerCapabilities()


def _exit_code(process: Process) -> str:
    code = process.returncode
    if code is not None and code > 128:
        with contextlib.suppress(ValueError):
            return f"{code} ({signal.Signals(code - 128).name})"
    return str(code)


def _exit_note(process: Process) -> str:
    return "" if process.returncode is None else f" (the server process exited with code {_exit_code(process)})"


async def _child_pid(supervisor: int) -> int | None:
    """The server's pid: the supervisor's child (forked right after it starts)."""
    for _ in range(40):
        with contextlib.suppress(OSError):
            with open(f"/proc/{supervisor}/task/{supervisor}/children") as f:
                children = f.read().split()
            if children:
                return int(children[0])
        await anyio.sleep(0.005)
    return None


def _group_members(group: int) -> list[int]:
    """Live (not zombie) processes in process group ``group`` (Linux ``/proc``).

    Elsewhere: ``[group]`` while ``killpg(group, 0)`` succeeds, else ``[]``.
    """
    if not os.path.isdir("/proc/self"):
        try:
            os.killpg(group, 0)
        except ProcessLookupError:
            return []
        except PermissionError:
            pass
        return [group]
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rfind(b")") + 2 :].split()
        if len(fields) > 2 and fields[0] != b"Z" and int(fields[2]) == group:
            members.append(int(entry))
    return members


async def _stop_tree(process: Process) -> None:
    """Close the server's stdin, then SIGTERM and SIGKILL its whole process group."""
    group = process.pid
    if process.stdin is not None:
        with contextlib.suppress(Exception):
            await process.stdin.aclose()
    with anyio.move_on_after(_EXIT_GRACE_SECONDS):
        while process.returncode is None:
            await anyio.sleep(0.01)
    if not _group_members(group):
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(group, signal.SIGTERM)
    with anyio.move_on_after(KILL_GRACE_SECONDS):
        while _group_members(group):
            await anyio.sleep(_POLL_SECONDS)
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(group, signal.SIGKILL)
    with anyio.move_on_after(_REAP_SECONDS):
        while _group_members(group) or process.returncode is None:
            await anyio.sleep(0.01)
    if _group_members(group):
        log.warning("MCP server process group %d survived SIGKILL", group)
