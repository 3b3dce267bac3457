"""The edge both HTTP servers of Hermes share (``hermes serve``'s API and the codec
server): one parser of ``Authorization: Bearer``, the security headers of every
response, and deadlines for reading a request.

Why a protocol class for the deadlines: uvicorn bounds only the idle time between two
requests of a keep-alive connection (``timeout_keep_alive``, armed after a response and
cancelled by the next byte); a connection that sends nothing, or its headers or body a
byte at a time, is held for good (slowloris). :class:`ReadDeadlineH11Protocol` is
uvicorn's h11 protocol with two total deadlines: the request line and headers within
``header_timeout_seconds`` of the connection (or of the first byte of a keep-alive
connection's next request), the body within ``body_timeout_seconds`` of the headers.
Neither is reset by a byte arriving, so dribbling does not extend them. Past either, the
connection is answered ``408 Request Timeout`` (when the request has begun and no
response has) and closed; an application waiting for the body sees a disconnect.
"""

from __future__ import annotations

import asyncio
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

__all__ = [
    "CODEC_CSP",
    "PAGE_CSP",
    "ReadDeadlineH11Protocol",
    "SecurityHeaders",
    "bearer_token",
    "read_deadline_protocol",
]


def bearer_token(header: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header value.

    The scheme is matched case-insensitively (RFC 7235 §2.1: "auth-scheme" is a
    case-insensitive token; RFC 6750 §2.1 uses it), so ``bearer x`` and ``BEARER x`` are
    the same as ``Bearer x``; spaces around the token are dropped.

    Args:
        header: the header's value, or None when absent.

    Returns:
        The token, or None when the header is absent, another scheme, or has no token.
    """
    if not header:
        return None
    scheme, _, token = header.strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        return None
    return token


PAGE_CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self'; "
    "base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)
"""Content-Security-Policy of ``hermes serve``: the web chat loads its own script and
style files and calls its own API; no inline script or style, no other origin, no frame."""
CODEC_CSP = "default-src 'none'; frame-ancestors 'none'"
"""Content-Security-Policy of the codec server, which answers JSON only. (CORS, which the
Temporal Web UI needs, is another mechanism: this policy does not touch it.)"""


class SecurityHeaders:
    """ASGI middleware adding to every HTTP response (errors and event streams included)
    ``Content-Security-Policy``, ``X-Frame-Options: DENY``, ``X-Content-Type-Options:
    nosniff`` and ``Referrer-Policy: no-referrer``, unless the app set one of them itself.

    Args:
        app: the ASGI app.
        csp: the Content-Security-Policy value (:data:`PAGE_CSP`, :data:`CODEC_CSP`).
    """

    def __init__(self, app: Any, csp: str):
        self.app = app
        self.headers = [
            (b"content-security-policy", csp.encode("latin-1")),
            (b"x-frame-options", b"DENY"),
            (b"x-content-type-options", b"nosniff"),
            (b"referrer-policy", b"no-referrer"),
        ]

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Any) -> None:
            if message["type"] == "http.response.start":
                present = {name.lower() for name, _ in message.get("headers", [])}
                extra = [(name, value) for name, value in self.headers if name not in present]
                message = {**message, "headers": [*message.get("headers", []), *extra]}
            await send(message)

        await self.app(scope, receive, send_with_headers)


_TIMEOUT_BODY = b"the request was not received in time\n"
_TIMEOUT_RESPONSE = (
    b"HTTP/1.1 408 Request Timeout\r\ncontent-type: text/plain; charset=utf-8\r\nconnection: close\r\n"
    b"content-length: " + str(len(_TIMEOUT_BODY)).encode() + b"\r\n\r\n" + _TIMEOUT_BODY
)


class ReadDeadlineH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with total deadlines for a request's headers and body (see
    the module docstring). Subclass it with other values through
    :func:`read_deadline_protocol`."""

    header_timeout_seconds: float = 10.0
    """From the connection (or a keep-alive connection's next request's first byte) to
    the end of the request's headers."""
    body_timeout_seconds: float = 60.0
    """From the end of the headers to the end of the body."""

    _deadline: asyncio.TimerHandle | None = None
    _phase: str | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm("headers")

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        self._follow()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._follow()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _follow(self) -> None:
        """Arm, move or drop the deadline for where the client's side of h11 stands."""
        state = self.conn.their_state
        if state is h11.IDLE:
            # Between requests the keep-alive timer rules, until bytes of the next one come.
            if self._phase is None and self.conn.trailing_data[0]:
                self._arm("headers")
        elif state is h11.SEND_BODY:
            if self._phase != "body":
                self._arm("body")
        else:  # DONE (the request is read; the app answers), MUST_CLOSE, CLOSED, ERROR
            self._disarm()

    def _arm(self, phase: str) -> None:
        self._disarm()
        seconds = self.header_timeout_seconds if phase == "headers" else self.body_timeout_seconds
        self._phase = phase
        self._deadline = self.loop.call_later(seconds, self._expired)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
        self._deadline = None
        self._phase = None

    def _expired(self) -> None:
        phase, self._deadline, self._phase = self._phase, None, None
        if self.transport.is_closing():
            return
        begun = bool(self.conn.trailing_data[0]) if phase == "headers" else True
        answered = phase == "body" and self.cycle is not None and self.cycle.response_started
        if begun and not answered:
            self.transport.write(_TIMEOUT_RESPONSE)
        self.transport.close()


def read_deadline_protocol(header_timeout_seconds: float, body_timeout_seconds: float) -> type[ReadDeadlineH11Protocol]:
    """A :class:`ReadDeadlineH11Protocol` with these deadlines, for ``uvicorn.Config(http=...)``.

    Args:
        header_timeout_seconds: the most time to receive a request line and headers.
        body_timeout_seconds: the most time to receive a body once the headers are in.
    """
    return type(
        "ReadDeadlineH11Protocol", (ReadDeadlineH11Protocol,),
        {"header_timeout_seconds": header_timeout_seconds, "body_timeout_seconds": body_timeout_seconds},
    )
