"""Discovery: a server's tools, resources and prompts, every page, cached.

Lists (``tools/list``, ``resources/list``, ``prompts/list``) follow ``nextCursor`` for at
most :data:`MAX_LIST_PAGES` pages and stop early, keeping what was read, with a warning,
on a page that brings nothing new (a cursor that never advances). A list is cached for
the server's ``list_ttl_seconds`` (0: always asked); the server's ``list_changed``
notification of its kind empties the cache, and a list read while one arrived is not
cached. A list does not wait out a backoff: the turn goes on without the server's tools.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, Literal

import mcp.types as types
from mcp import ClientSession

from hermes.mcp.calls import capabilities, request
from hermes.mcp.state import Server
from hermes.mcp.supervision import Supervisor

__all__ = ["MAX_LIST_PAGES", "all_pages", "cached_items", "list_prompts", "list_resources", "list_tools"]

log = logging.getLogger("hermes.mcp")

MAX_LIST_PAGES = 100
"""Most pages read of one list; a server still sending ``nextCursor`` after that is cut
off there (with a warning), keeping what was read."""


def cached_items(cached: tuple[float, list[Any]] | None, ttl_seconds: float, now: float, *, refresh: bool) -> list[Any] | None:
    """A copy of the cached list when it may be served, else None (ask the server).

    Args:
        cached: (monotonic time it was read, items), or None when nothing is cached.
        ttl_seconds: the server's ``list_ttl_seconds``; 0 never serves from the cache.
        now: monotonic seconds.
        refresh: the caller wants the server asked.
    """
    if refresh or cached is None or ttl_seconds <= 0 or now - cached[0] >= ttl_seconds:
        return None
    return list(cached[1])


async def cached_list(
    sup: Supervisor, srv: Server, kind: str, listing: Callable[[ClientSession], Awaitable[list[Any]]], *, refresh: bool = False
) -> list[Any]:
    """A server's list of ``kind``, from the cache while younger than
    ``list_ttl_seconds`` (0: always asked) and not invalidated by ``list_changed``.

    Raises:
        McpUnavailableError: the server cannot be reached (a backoff fails it at once).
    """
    served = cached_items(srv.lists.get(kind), srv.config.list_ttl_seconds, time.monotonic(), refresh=refresh)
    if served is not None:
        return served
    generation = srv.generations.get(kind, 0)
    items = await request(sup, srv, f"{kind}/list", listing, srv.config.timeout_seconds, wait_backoff=False)
    if generation == srv.generations.get(kind, 0):  # no list_changed arrived meanwhile
        srv.lists[kind] = (time.monotonic(), items)
    return list(items)


async def list_tools(sup: Supervisor, srv: Server, *, refresh: bool) -> list[types.Tool]:
    """The tools that the server's allow/deny lists let through (see ``McpManager.list_tools``)."""

    async def listing(session: ClientSession) -> list[types.Tool]:
        return [tool for tool in await all_pages(session.list_tools, "tools", srv.name) if srv.config.allows(tool.name)]

    return await cached_list(sup, srv, "tools", listing, refresh=refresh)


async def list_resources(sup: Supervisor, srv: Server) -> list[types.Resource]:
    """The server's resources, or ``[]`` when it offers none (see ``McpManager.list_resources``)."""
    return await _offered_list(sup, srv, "resources")


async def list_prompts(sup: Supervisor, srv: Server) -> list[types.Prompt]:
    """The server's prompts, or ``[]`` when it offers none (see ``McpManager.list_prompts``)."""
    return await _offered_list(sup, srv, "prompts")


async def _offered_list(sup: Supervisor, srv: Server, kind: Literal["resources", "prompts"]) -> list[Any]:
    """A cached list of ``kind``; ``[]`` when the server's capabilities do not offer it."""

    async def listing(session: ClientSession) -> list[Any]:
        if getattr(capabilities(session), kind) is None:
            return []
        return await all_pages(getattr(session, f"list_{kind}"), kind, srv.name)

    return await cached_list(sup, srv, kind, listing)


async def all_pages(fetch: Callable[..., Awaitable[Any]], field: str, server: str) -> list[Any]:
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
