"""Server-sent events of the HTTP API: the event format, keepalive comments, the response.

Every ``text/event-stream`` answer of ``hermes serve`` (a message's turn, a session's
event stream, a streamed OpenAI-compatible completion) goes through :func:`event_stream`
over :func:`with_keepalive`, so none stays silent for longer than
:data:`KEEPALIVE_SECONDS`, even while a message is held by its session (a turn awaiting
a human's approval holds the next message, up to the approval timeout).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

from starlette.responses import StreamingResponse

__all__ = ["KEEPALIVE_COMMENT", "KEEPALIVE_SECONDS", "event_stream", "sse", "with_keepalive"]

KEEPALIVE_SECONDS = 15.0
"""An SSE comment is sent after this long without anything else, so proxies (and the
load balancers' idle timeouts, often 30-60 s) keep the stream open."""
KEEPALIVE_COMMENT = ": keepalive\n\n"
"""An SSE comment line: clients, browsers' ``EventSource`` and the OpenAI SDK ignore it
(WHATWG HTML, "Server-sent events", lines starting with a colon)."""


def sse(event: str, data: str, event_id: str | None = None) -> str:
    """One server-sent event (WHATWG HTML, "Server-sent events"): ``id``, ``event`` and
    ``data`` lines and a blank line; ``data`` is one line of JSON."""
    head = f"id: {event_id}\n" if event_id else ""
    return f"{head}event: {event}\ndata: {data}\n\n"


async def with_keepalive(source: AsyncIterator[str]) -> AsyncIterator[str]:
    """``source``'s items as they come, and :data:`KEEPALIVE_COMMENT` after each
    :data:`KEEPALIVE_SECONDS` (read at each wait) in which it gave none.

    The next item is awaited in a task that a keepalive does not cancel, so ``source`` is
    never interrupted mid-step; when the consumer stops (the client disconnected), that
    task is cancelled and ``source`` closed, which runs its clean-up.

    Args:
        source: an async generator of SSE text (events or comments).
    """
    pending: asyncio.Future[str] | None = None
    try:
        while True:
            if pending is None:
                pending = asyncio.ensure_future(anext(source))
            done, _ = await asyncio.wait({pending}, timeout=KEEPALIVE_SECONDS)
            if not done:
                yield KEEPALIVE_COMMENT
                continue
            finished, pending = pending, None
            try:
                item = finished.result()
            except StopAsyncIteration:
                return
            yield item
    finally:
        if pending is not None:
            pending.cancel()
            with contextlib.suppress(BaseException):
                await pending
        aclose = getattr(source, "aclose", None)
        if aclose is not None:
            await aclose()


class _ClosingStream(StreamingResponse):
    """A streaming response that calls ``on_close`` once it is over, however it ends
    (finished, the client gone, cancelled, failed)."""

    def __init__(self, content: AsyncIterator[str], on_close: Callable[[], None], **kwargs: Any):
        super().__init__(content, **kwargs)
        self.on_close = on_close

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.on_close()


def event_stream(body: AsyncIterator[str], on_close: Callable[[], None] | None = None) -> StreamingResponse:
    """The ``text/event-stream`` response of ``body`` (with keepalives), uncached and not
    buffered by a proxy (``X-Accel-Buffering: no`` for nginx).

    Args:
        body: the SSE text.
        on_close: called once the response is over (frees a stream slot,
            :class:`hermes.api.limits.StreamSlots`).
    """
    options: dict[str, Any] = dict(media_type="text/event-stream", headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
    if on_close is None:
        return StreamingResponse(with_keepalive(body), **options)
    return _ClosingStream(with_keepalive(body), on_close, **options)
