"""The transport under one MCP connection: stdio (:mod:`hermes.mcp.stdio`), streamable HTTP or SSE.

Streamable HTTP and SSE: one MCP session per server. An HTTP 404 to a request carrying
our ``Mcp-Session-Id`` means the server forgot the session (restarted, expired): the
session is reopened and the request sent once more (the server did not run it). Where
the SDK would lose what the server said, :class:`hermes.mcp.http.ReportingTransport`
(our HTTP transport under the SDK's) tells it: an error status (4xx/5xx) to a request fails that
request with the status and the start of the body (:data:`hermes.mcp.http.HTTP_ERROR_BODY_CHARS`), also
logged; a connection that cannot be made fails the request with that error, instead of
ending the transport ("unhandled errors in a TaskGroup"). A connection that closes
during a request (the server died, a proxy dropped it) fails the request at once and ends
the connection, naming what the HTTP layer saw, instead of at the request's deadline
(:func:`hermes.mcp.calls.request`).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import anyio
import httpx2
from mcp.client.sse import sse_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.message import SessionMessage

from hermes.mcp.http import ReportingTransport
from hermes.mcp.state import Connection, Server
from hermes.mcp.stdio import open_stdio

__all__ = ["open_transport"]


@contextlib.asynccontextmanager
async def open_transport(srv: Server, conn: Connection) -> AsyncIterator[tuple[Any, Any]]:
    """Open the server's transport for one connection (see the module docstring).

    Args:
        srv: the server.
        conn: the connection; its ``http`` state (HTTP) or process fields (stdio) are
            filled in, and ``session_expired`` is set on an HTTP 404 to our session.

    Yields:
        ``(read_stream, write_stream)`` for the MCP ``ClientSession``.

    Raises:
        StartError: a stdio command that cannot be started.
    """
    resolved = srv.resolved
    if resolved.transport == "stdio":
        async with open_stdio(resolved, conn) as streams:
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
