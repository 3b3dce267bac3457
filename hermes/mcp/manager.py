"""Connections to MCP servers on the worker: started on demand, shared, watched, cleaned up.

One :class:`McpManager` per worker process holds at most one connection per configured
server (seed 004 §5.2). It is a facade over parts with one concern each:

- :mod:`hermes.mcp.supervision`: connections and their life (launch on demand, health
  pings, crash detection, restart backoff that calls can wait for, idle close);
- :mod:`hermes.mcp.transport` and :mod:`hermes.mcp.stdio`: the transport under a
  connection (streamable HTTP, SSE, a stdio server's process tree);
- :mod:`hermes.mcp.discovery`: tool, resource and prompt lists (paging, caching);
- :mod:`hermes.mcp.calls`: requests (one deadline, error mapping, ``maybe_ran``);
- :mod:`hermes.mcp.state`: the records and the error they share;
- :mod:`hermes.mcp.output`: tool results kept when off their output schema.

Secrets: every message these modules produce (errors, ``status()``, logs) has the
server's resolved ``${NAME}`` values and ``env``/``headers`` values masked
(:func:`hermes.mcp.config.redact`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import mcp.types as types

from hermes.mcp import calls, discovery
from hermes.mcp.config import McpConfig, ResolvedServer, resolve_all
from hermes.mcp.discovery import MAX_LIST_PAGES
from hermes.mcp.http import HTTP_ERROR_BODY_CHARS
from hermes.mcp.state import McpUnavailableError, ServerState, ServerStatus
from hermes.mcp.stdio import KILL_GRACE_SECONDS
from hermes.mcp.supervision import (
    BACKOFF_FIRST_SECONDS,
    BACKOFF_MAX_SECONDS,
    PING_AFTER_IDLE_SECONDS,
    STABLE_SECONDS,
    Supervisor,
)
from hermes.security import redaction

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
        self._sup = Supervisor(self.resolved)

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
        return await discovery.list_tools(self._sup, self._sup.server(server), refresh=refresh)

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
        return await calls.call_tool(self._sup, self._sup.server(server), tool, arguments, timeout_seconds)

    async def list_resources(self, server: str) -> list[types.Resource]:
        """The server's resources (every page), or ``[]`` when it offers none; cached like
        :meth:`list_tools` (its own ``list_changed`` notification empties the cache).

        Raises:
            McpUnavailableError: as :meth:`call_tool`.
        """
        return await discovery.list_resources(self._sup, self._sup.server(server))

    async def read_resource(self, server: str, uri: str) -> types.ReadResourceResult:
        """Read one resource of a server.

        Args:
            server: the server's name.
            uri: the resource's URI as listed.

        Raises:
            McpUnavailableError: the server offers no resources (``reason="unsupported"``),
                or as :meth:`call_tool` (an unknown URI is a protocol error).
        """
        return await calls.read_resource(self._sup, self._sup.server(server), uri)

    async def list_prompts(self, server: str) -> list[types.Prompt]:
        """The server's prompts (every page), or ``[]`` when it offers none; cached like
        :meth:`list_tools` (its own ``list_changed`` notification empties the cache).

        Raises:
            McpUnavailableError: as :meth:`call_tool`.
        """
        return await discovery.list_prompts(self._sup, self._sup.server(server))

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
        return await calls.get_prompt(self._sup, self._sup.server(server), name, arguments)

    def status(self) -> list[ServerStatus]:
        """Every enabled server's state, in config order (cheap; no I/O)."""
        return self._sup.status()

    async def aclose(self) -> None:
        """Close every connection and kill every stdio server's process tree.

        Waits for each tree to be gone (at most about the grace periods of
        :func:`hermes.mcp.stdio.stop_tree`: 4.5 s, servers in parallel). Later requests raise
        :class:`McpUnavailableError` (``reason="closed"``). Safe to call twice.
        """
        await self._sup.aclose()
