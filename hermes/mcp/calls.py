"""Requests on an MCP connection: one deadline, error mapping, the tool, resource and prompt calls.

- **Timeout**: each request has one deadline, ``timeout_seconds`` (the call's, else the
  server's), covering the start of the server when it is not running, so nothing a
  caller awaits can outlast it. The start itself has its own limit,
  ``startup_timeout_seconds`` (default 60 s): a slow start outlives the caller that began
  it and serves the next one, instead of being killed and begun again by every caller.
- **Errors**: every way a request fails is a :class:`McpUnavailableError` naming the
  server, with ``maybe_ran`` True only where a tool call may have reached the server
  (a timeout, a lost connection, an HTTP 5xx; :func:`http_maybe_ran`). An HTTP 404 to
  our session reopens it and sends the request once more (the server did not run it).
- **Output**: a tool result off its ``outputSchema`` is kept, not refused
  (:mod:`hermes.mcp.output`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import anyio
import mcp.types as types
from mcp import ClientSession
from mcp.shared.exceptions import MCPError
from pydantic import ValidationError

from hermes.mcp.http import first_line as _first_line
from hermes.mcp.state import McpUnavailableError, Server
from hermes.mcp.supervision import STABLE_SECONDS, Supervisor

__all__ = ["CLOSE_WAIT_SECONDS", "call_tool", "get_prompt", "http_maybe_ran", "read_resource", "remaining_seconds", "request"]

log = logging.getLogger("hermes.mcp")

T = TypeVar("T")

CLOSE_WAIT_SECONDS = 2.0
"""After an HTTP connection closed during a request: longest wait for its close to be
recorded (for the message) before the request fails anyway."""


def remaining_seconds(deadline: float, now: float) -> float:
    """Seconds left before ``deadline`` (monotonic), never negative."""
    return max(0.0, deadline - now)


def http_maybe_ran(status: int, *, maybe_ran: bool) -> bool:
    """Whether a request answered with HTTP ``status`` may have run on the server.

    A 5xx may come from a gateway after the server ran the call; a 4xx was refused.
    """
    return maybe_ran and status >= 500


def capabilities(session: ClientSession) -> types.ServerCapabilities:
    """The server's capabilities from its ``initialize`` answer (empty when it sent none)."""
    return session.server_capabilities or types.ServerCapabilities()


async def request(
    sup: Supervisor,
    srv: Server,
    what: str,
    fn: Callable[[ClientSession], Awaitable[T]],
    timeout_seconds: float,
    *,
    maybe_ran: bool = False,
    wait_backoff: bool = True,
) -> T:
    """Run ``fn`` on the server's session within ``timeout_seconds`` (start included);
    retried once on a fresh session after an HTTP 404 for an expired session.

    Args:
        sup: the connections.
        srv: the server.
        what: the request, for messages (``"tools/call 'echo'"``).
        fn: the request on a ready session.
        timeout_seconds: the whole request's limit, starting the server included.
        maybe_ran: whether the request may have an effect (a tool call): then errors
            where it may have reached the server say so (``maybe_ran=True``).
        wait_backoff: wait out a backoff that ends before the deadline (lists do not).

    Returns:
        What ``fn`` returned.

    Raises:
        McpUnavailableError: the server could not answer (see its ``reason``).
    """
    deadline = time.monotonic() + timeout_seconds
    for attempt in range(2):
        conn = await sup.acquire(srv, deadline, what, timeout_seconds, wait_backoff)
        assert conn.session is not None
        conn.in_flight += 1
        conn.last_used = time.monotonic()
        try:
            with anyio.fail_after(remaining_seconds(deadline, time.monotonic())):
                result = await fn(conn.session)
        except TimeoutError:
            conn.suspect = True
            sup.spawn(srv, sup.health_check(srv, conn))
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
                    maybe_ran=http_maybe_ran(status, maybe_ran=maybe_ran),
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
                    wait = min(wait, CLOSE_WAIT_SECONDS)
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
                        f"{conn.failure or conn.end_reason or err.message}{sup.retry_note(srv)}"
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


async def call_tool(
    sup: Supervisor, srv: Server, tool: str, arguments: dict[str, Any], timeout_seconds: float | None
) -> types.CallToolResult:
    """Call one tool (see :meth:`hermes.mcp.manager.McpManager.call_tool`)."""
    if not srv.config.allows(tool):
        raise McpUnavailableError(
            srv.name, f"MCP server {srv.name!r}: tool {tool!r} is not allowed by its allow/deny lists", reason="protocol"
        )
    timeout = srv.config.timeout_seconds if timeout_seconds is None else timeout_seconds
    return await request(
        sup, srv, f"tools/call {tool!r}", lambda session: session.call_tool(tool, arguments), timeout, maybe_ran=True
    )


async def read_resource(sup: Supervisor, srv: Server, uri: str) -> types.ReadResourceResult:
    """Read one resource (see :meth:`hermes.mcp.manager.McpManager.read_resource`)."""

    async def read(session: ClientSession) -> types.ReadResourceResult:
        if capabilities(session).resources is None:
            raise McpUnavailableError(srv.name, f"MCP server {srv.name!r} offers no resources", reason="unsupported")
        return await session.read_resource(uri)

    return await request(sup, srv, f"resources/read {uri!r}", read, srv.config.timeout_seconds)


async def get_prompt(sup: Supervisor, srv: Server, name: str, arguments: dict[str, str] | None) -> types.GetPromptResult:
    """Render one prompt (see :meth:`hermes.mcp.manager.McpManager.get_prompt`)."""

    async def get(session: ClientSession) -> types.GetPromptResult:
        if capabilities(session).prompts is None:
            raise McpUnavailableError(srv.name, f"MCP server {srv.name!r} offers no prompts", reason="unsupported")
        return await session.get_prompt(name, arguments or {})

    return await request(sup, srv, f"prompts/get {name!r}", get, srv.config.timeout_seconds)
