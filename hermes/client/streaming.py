"""Streaming a message: its session's turn events while the turn runs, then its result."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from hermes.content.events import TurnEvent, check_offset
from hermes.models import TurnResult

if TYPE_CHECKING:
    from hermes.client import HermesClient

log = logging.getLogger("hermes.client")

STREAM_DRAIN_SECONDS = 2.0
"""After a streamed message's result, how long :meth:`HermesClient.stream_message` waits
for the events still on their way (its turn's ``turn_finished`` ends the wait)."""


async def stream_message(
    hermes: HermesClient, session_id: str, text: str, *, after: str | None = None, **send: Any
) -> AsyncIterator[TurnEvent | TurnResult]:
    """:meth:`~hermes.client.HermesClient.send_message` of ``hermes``, yielding the
    session's turn events while the turn runs and, last, its :class:`TurnResult`.

    The events are those published after ``after`` (default: the session's newest
    event when this is called), in order, each with its ``offset``: the turn's
    ``turn_started``, ``text_delta`` (drop a step's text on ``attempt_discarded``),
    tool calls, approvals, recalled memories, ``turn_finished``; also those of any
    turn queued before this message. Without Redis, or while it does not answer,
    only the result comes.

    Args:
        after: an event offset to start after (``hermes.content.events.check_offset``), no
            later than the session's newest event.
        send: the keyword arguments of :meth:`~hermes.client.HermesClient.send_message`.

    Raises:
        ValueError: ``after`` is not an offset, or is after the session's newest
            event (``EventLog.check_resume``); nothing was sent.
        The errors of :meth:`~hermes.client.HermesClient.send_message`, after the
            events published before them.
    """
    log_ = hermes.events
    offset = check_offset(after) if after is not None else None
    if log_ is not None:
        try:
            if offset is None:
                offset = await asyncio.wait_for(log_.last_offset(session_id), 2.0)
            else:
                await asyncio.wait_for(log_.check_resume(session_id, offset), 2.0)
        except ValueError:
            raise
        except Exception as err:  # noqa: BLE001 - events are a view: the turn goes on without them
            log.warning("turn events of %s not available (%s); the result alone follows", session_id, err)
            log_ = None
    sending = asyncio.ensure_future(hermes.send_message(session_id, text, **send))
    try:
        loop = asyncio.get_running_loop()
        finished_turn: int | None = None
        finished_turns: set[int | None] = set()
        drain_until: float | None = None
        while log_ is not None and offset is not None:
            if sending.done() and drain_until is None:
                if sending.exception() is not None:
                    break
                finished_turn = sending.result().turn
                drain_until = loop.time() + STREAM_DRAIN_SECONDS
                if finished_turn in finished_turns:
                    break
            if drain_until is not None and loop.time() >= drain_until:
                break
            try:
                batch = await log_.read(session_id, offset, block_ms=200)
            except Exception as err:  # noqa: BLE001 - wait for the result without events
                log.warning("reading the turn events of %s failed (%s)", session_id, err)
                await asyncio.wait({sending}, timeout=0.5)
                continue
            ended = False
            for event in batch:
                if event.type != "truncated":
                    offset = event.offset
                if event.type == "turn_finished":
                    finished_turns.add(event.turn)
                    ended = True
                yield event
            if finished_turn is not None and finished_turn in finished_turns:
                break
            if ended and not sending.done():
                # A turn ended: if it is this message's, its result is on its way; wait
                # for it rather than in a blocking read (which cost up to 0.2 s).
                await asyncio.wait({sending}, timeout=0.2)
        yield await sending
    finally:
        if not sending.done():
            sending.cancel()  # the caller stopped listening; the turn goes on in the session
            with contextlib.suppress(BaseException):
                await sending

