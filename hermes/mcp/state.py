"""What the MCP manager's parts share: the error, the status, one record per server and per connection.

:class:`Server` is kept for the worker's life (backoff, cached lists); a
:class:`Connection` lives from one start to its end, owned by one background task
(:mod:`hermes.mcp.supervision`). Plain records: no I/O here.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Literal

import anyio
import mcp.types as types
from anyio.abc import Process
from mcp import ClientSession

from hermes.errors import HermesError
from hermes.mcp.config import ResolvedServer, ServerConfig, Transport, redact
from hermes.mcp.http import HttpState
from hermes.mcp.stdio import STDERR_LINES

__all__ = ["LIST_CHANGED", "Connection", "McpUnavailableError", "Server", "ServerState", "ServerStatus"]

ServerState = Literal["stopped", "starting", "ready", "failed", "backoff"]


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


class Connection:
    """One transport + ``ClientSession`` to one server, owned by one background task."""

    def __init__(self, server: Server):
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
        self.stderr_tail: deque[str] = deque(maxlen=STDERR_LINES)
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


class Server:
    """Per-server state kept across connections."""

    def __init__(self, resolved: ResolvedServer):
        self.resolved = resolved
        self.config: ServerConfig = resolved.config
        self.conn: Connection | None = None
        self.starting: asyncio.Task[Connection] | None = None
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


LIST_CHANGED: dict[type, str] = {
    types.ToolListChangedNotification: "tools",
    types.ResourceListChangedNotification: "resources",
    types.PromptListChangedNotification: "prompts",
}
"""The server's ``list_changed`` notifications, by the list (:meth:`Server.forget`) each empties."""
