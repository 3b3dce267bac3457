"""The HTTP transport under the MCP SDK's streamable HTTP and SSE clients (one per connection).

The SDK (mcp 2.x) loses what an HTTP MCP server said when it fails: an error status
becomes "Server returned an error response", a refused connection ends the whole
transport ("unhandled errors in a TaskGroup"), and over SSE an error status stops the
writer, the request then waiting out its deadline. :class:`ReportingTransport` answers
the SDK instead with a JSON-RPC error for the request that failed, carrying the status
and body (or the connection error), and records what the HTTP layer saw in an
:class:`HttpState` that :mod:`hermes.mcp.calls` and :mod:`hermes.mcp.supervision` read
for their messages.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import anyio
import httpx2
import mcp.types as types
from mcp.shared.message import SessionMessage

from hermes.security import encryption

__all__ = ["HTTP_ERROR_BODY_CHARS", "HttpState", "ReportingTransport", "first_line"]

log = logging.getLogger("hermes.mcp")

HTTP_ERROR_BODY_CHARS = 2000
"""Characters of an HTTP error answer's body kept in the error (the model's and the logs')."""


@dataclass
class HttpState:
    """What the HTTP layer of one MCP connection saw (every text masked)."""

    transport_error: str | None = None
    """The last failure of the HTTP layer (a read error, a refused connection)."""
    refusal: tuple[int, str] | None = None
    """The status and described answer of the last HTTP 404 to a request with a session
    id (the expired-session path), for the message if the retry is refused too."""
    inject: Any = None
    """SSE only: an ``anyio`` send stream into the session's read stream, for the answers
    the SDK would have dropped; None while there is none."""


class ReportingTransport(httpx2.AsyncBaseTransport):
    """The HTTP transport under the SDK's, for one connection: tells the SDK what the
    server said where the SDK would lose it.

    The SDK (mcp 2.x) turns an error status without a JSON-RPC error body into "Server
    returned an error response" (the status and body are lost), lets a refused
    connection end the whole transport ("unhandled errors in a TaskGroup"), and over SSE
    lets an error status to a POST stop its writer, the request then waiting out its
    deadline. For a POST carrying a JSON-RPC request, this answers instead with a JSON-RPC
    error for that request: ``HTTP <status> <reason>: <body>`` (the body's first
    :data:`HTTP_ERROR_BODY_CHARS` characters; ``data={"http_status", "body"}``), or
    ``CONNECTION_CLOSED`` with the connection error (``data={"delivered": False}`` when the
    request never left). Only that request fails; the connection stays up. Over SSE the
    error goes into the session's read stream (``HttpState.inject``) and the SDK gets a 202.
    A JSON-RPC error body is passed on as sent, and a 404 to a request with our session
    id is left to the SDK (the expired-session path). A read error on an answer's body
    is recorded on the connection (``HttpState.transport_error``), for the message of a
    connection that closed mid-call.

    Args:
        server: the server's name, for the log.
        mask: masks the server's secrets in a text (:func:`hermes.mcp.config.redact`).
        state: where what the HTTP layer saw is recorded, for the connection's messages.
        sse: the older SSE transport (its errors go through ``state.inject``).
    """

    def __init__(self, server: str, mask: Callable[[str], str], state: HttpState, *, sse: bool):
        self._server = server
        self._mask = mask
        self._state = state
        self._sse = sse
        self._inner = httpx2.AsyncHTTPTransport()

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        call = _jsonrpc_call(request)
        try:
            response = await self._inner.handle_async_request(request)
        except httpx2.TransportError as err:
            text = self._mask(first_line(err))
            self._state.transport_error = text
            if call is None:
                raise
            delivered = not isinstance(err, (httpx2.ConnectError, httpx2.ConnectTimeout))
            message = f"cannot reach the server: {text}" if not delivered else f"the connection failed: {text}"
            return await self._answer(request, call[0], types.CONNECTION_CLOSED, message, {"delivered": delivered})
        if response.status_code < 400 or call is None:
            return httpx2.Response(
                response.status_code,
                headers=response.headers,
                stream=_WatchedStream(response.stream, self._mask, self._state),
                extensions=response.extensions,
            )
        try:
            body = await response.aread()
        except httpx2.HTTPError as err:
            body = f"(body unreadable: {first_line(err)})".encode()
        finally:
            await response.aclose()
        message, capped = self._describe(response, body)
        if response.status_code == 404 and request.headers.get("mcp-session-id") and not self._sse:
            # Left to the SDK ("Session terminated"): the session is reopened once; if the
            # new one is refused too, this is what the caller is told.
            self._state.refusal = (404, message)
            return httpx2.Response(404, headers={"content-type": response.headers.get("content-type", "")}, content=body)
        if not self._sse and response.headers.get("content-type", "").lower().startswith("application/json"):
            with contextlib.suppress(ValueError):
                if isinstance(types.jsonrpc_message_adapter.validate_json(body, by_name=False), types.JSONRPCError):
                    return httpx2.Response(
                        response.status_code, headers={"content-type": "application/json"}, content=body
                    )
        # With encryption on, the status only: the body may quote the call's arguments
        # (it is in the call's result, sealed).
        shown = message if encryption.active() is None else f"HTTP {response.status_code} (body withheld: encryption at rest)"
        log.warning("MCP server %s answered %s with %s", self._server, call[1], shown)
        data = {"http_status": response.status_code, "body": capped}
        return await self._answer(request, call[0], types.INTERNAL_ERROR, message, data, status=response.status_code)

    def _describe(self, response: httpx2.Response, body: bytes) -> tuple[str, str]:
        """``("HTTP <status> <reason>: <capped body>", capped body)``, secrets masked."""
        text = body.decode(response.encoding or "utf-8", "replace").strip()
        capped = self._mask(text[:HTTP_ERROR_BODY_CHARS] + (" ..." if len(text) > HTTP_ERROR_BODY_CHARS else ""))
        status = f"HTTP {response.status_code} {httpx2.codes.get_reason_phrase(response.status_code)}".rstrip()
        return (f"{status}: {capped}" if capped else status), capped

    async def _answer(
        self, request: httpx2.Request, request_id: Any, code: int, message: str, data: dict[str, Any], *, status: int = 502
    ) -> httpx2.Response:
        """A JSON-RPC error for ``request_id`` as the SDK will take it (see the class)."""
        error = types.JSONRPCError(jsonrpc="2.0", id=request_id, error=types.ErrorData(code=code, message=message, data=data))
        if self._sse:
            inject = self._state.inject
            if inject is not None:
                with contextlib.suppress(anyio.ClosedResourceError, anyio.BrokenResourceError):
                    await inject.send(SessionMessage(error))
            return httpx2.Response(202, request=request)
        content = error.model_dump_json(by_alias=True, exclude_unset=True).encode()
        return httpx2.Response(status, headers={"content-type": "application/json"}, content=content, request=request)

    async def aclose(self) -> None:
        await self._inner.aclose()


class _WatchedStream(httpx2.AsyncByteStream):
    """An answer's body that records a read error on the connection (see :class:`ReportingTransport`)."""

    def __init__(self, inner: Any, mask: Callable[[str], str], state: HttpState):
        self._inner = inner
        self._mask = mask
        self._state = state

    async def __aiter__(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self._inner:
                yield chunk
        except httpx2.TransportError as err:
            self._state.transport_error = self._mask(first_line(err))
            raise

    async def aclose(self) -> None:
        await self._inner.aclose()


def _jsonrpc_call(request: httpx2.Request) -> tuple[Any, str] | None:
    """``(id, method)`` of the JSON-RPC request a POST carries, else None (a
    notification, an answer, a GET or DELETE)."""
    if request.method != "POST":
        return None
    try:
        sent = json.loads(request.content)
    except (ValueError, httpx2.RequestNotRead):
        return None
    if isinstance(sent, dict) and "id" in sent and isinstance(sent.get("method"), str):
        return sent["id"], sent["method"]
    return None


def first_line(err: BaseException) -> str:
    """``"<ExceptionType>: <first line of its message>"``, of the first leaf of an exception group."""
    while isinstance(err, BaseExceptionGroup) and err.exceptions:  # the cause, not "unhandled errors in a TaskGroup"
        err = err.exceptions[0]
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0]}" if text else type(err).__name__
