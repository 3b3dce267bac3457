"""Streaming a message: its own turn's events while the turn runs, then its result.

A message's stream holds the events of the message's turn only; a session's stream
(:meth:`hermes.content.events.EventLog.follow`, ``GET /v1/sessions/{id}/events``) holds
every turn's. A message sent while another turn runs (or is queued) is queued by the
session behind them: its stream waits, silent, for its own turn.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from hermes.content.events import TurnEvent, check_offset
from hermes.errors import SessionNotFoundError
from hermes.infra.connections import cancel_requests, raise_if_cancelled
from hermes.models import SessionState, TurnResult

if TYPE_CHECKING:
    from hermes.client import HermesClient

log = logging.getLogger("hermes.client")

STREAM_DRAIN_SECONDS = 2.0
"""After a streamed message's result, how long :meth:`HermesClient.stream_message` waits
for the events still on their way (its turn's ``turn_finished`` ends the wait)."""


def first_possible_turn(state: SessionState | None) -> int:
    """The lowest turn number a message sent now can get: the session numbers its turns
    in the order it takes their messages (one turn at a time, the rest queued), so a
    message sent after ``state`` was read comes after its running and queued turns.

    Args:
        state: the session's state read just before the message is sent (None: no
            session yet, the message starts it).

    Returns:
        A turn number, from 1.
    """
    if state is None:
        return 1
    return state.turn_count + state.queued_messages + 1


class OwnTurn:
    """Which events of a session belong to one message's turn (plain; no I/O).

    The turn is not known before the session answers the message; until then, events of
    turns below :func:`first_possible_turn` are someone else's, and the first turn at or
    above it that starts after the message was sent is taken as the message's (exact
    unless another client sends to the same session in the same moment: then the
    result's turn, once known, settles it and the other turn's later events are left out).

    Args:
        first_turn: :func:`first_possible_turn` (None: unknown, every event is kept).
    """

    def __init__(self, first_turn: int | None):
        self.first_turn = first_turn
        self.turn: int | None = None

    def settle(self, turn: int) -> None:
        """The message's turn, from its result."""
        self.turn = turn

    def keeps(self, event: TurnEvent) -> bool:
        """Whether ``event`` goes into the message's stream: its turn's events, and those
        naming no turn (``truncated``: the reader may have missed some)."""
        if event.turn is None or self.first_turn is None:
            return True
        if self.turn is None and event.turn >= self.first_turn:
            self.turn = event.turn
        return event.turn == self.turn


async def stream_message(
    hermes: HermesClient, session_id: str, text: str, *, after: str | None = None, first_turn: int | None = None,
    **send: Any,
) -> AsyncIterator[TurnEvent | TurnResult]:
    """:meth:`~hermes.client.HermesClient.send_message` of ``hermes``, yielding the
    events of the message's own turn while it runs and, last, its :class:`TurnResult`.

    The events are those of this message's turn published after ``after`` (default:
    the session's newest event when this is called), in order, each with its
    ``offset``: the turn's ``turn_started``, ``text_delta`` (drop a step's text on
    ``attempt_discarded``), tool calls, approvals, recalled memories, warnings,
    ``turn_finished`` (see :class:`OwnTurn`). Other turns' events are left out: a
    message queued behind a running turn streams nothing until its own turn starts
    (the session's stream, :meth:`hermes.content.events.EventLog.follow`, has them
    all). Without Redis, or while it does not answer, only the result comes.

    Args:
        after: an event offset to start after (``hermes.content.events.check_offset``), no
            later than the session's newest event.
        first_turn: :func:`first_possible_turn` of a state the caller read just before
            (saves the query of the session's state this makes otherwise).
        send: the keyword arguments of :meth:`~hermes.client.HermesClient.send_message`.

    Raises:
        ValueError: ``after`` is not an offset, or is after the session's newest
            event (``EventLog.check_resume``); nothing was sent.
        The errors of :meth:`~hermes.client.HermesClient.send_message`, after the
            events published before them.
    """
    log_ = hermes.events
    offset = check_offset(after) if after is not None else None
    try:
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
        if first_turn is None and log_ is not None:
            first_turn = await _first_turn(hermes, session_id)
    except (asyncio.CancelledError, GeneratorExit):
        # The listener left while the events were being set up: the message is sent all
        # the same (see below), only nobody follows its events.
        _detach(_start_sending(hermes, session_id, text, send))
        raise
    own = OwnTurn(first_turn)
    sending = _start_sending(hermes, session_id, text, send)
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
                own.settle(finished_turn)
                drain_until = loop.time() + STREAM_DRAIN_SECONDS
                if finished_turn in finished_turns:
                    break
            if drain_until is not None and loop.time() >= drain_until:
                break
            asked = cancel_requests()
            try:
                batch = await log_.read(session_id, offset, block_ms=200)
            except Exception as err:  # noqa: BLE001 - wait for the result without events
                log.warning("reading the turn events of %s failed (%s)", session_id, err)
                raise_if_cancelled(asked)
                await asyncio.wait({sending}, timeout=0.5)
                continue
            raise_if_cancelled(asked)  # a listener cancelled mid-read stops (a turn can wait hours)
            ended = False
            for event in batch:
                if event.type != "truncated":
                    offset = event.offset
                if not own.keeps(event):
                    continue
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
            # The caller stopped listening (a page reloaded, a connection dropped). The
            # message is sent all the same: cancelling here, before the session had it,
            # lost it silently; once taken, its turn goes on in the session either way.
            _detach(sending)


def _start_sending(hermes: HermesClient, session_id: str, text: str, send: dict[str, Any]) -> asyncio.Future[TurnResult]:
    return asyncio.ensure_future(hermes.send_message(session_id, text, **send))


_detached: set[asyncio.Future[Any]] = set()
"""Sends whose listener left before their result (kept referenced until they end)."""


def _detach(sending: asyncio.Future[Any]) -> None:
    _detached.add(sending)
    sending.add_done_callback(_forget_detached)


def _forget_detached(sending: asyncio.Future[Any]) -> None:
    _detached.discard(sending)
    if not sending.cancelled() and sending.exception() is not None:
        log.info("a message whose listener left was not answered: %s", sending.exception())


async def _first_turn(hermes: HermesClient, session_id: str) -> int | None:
    """:func:`first_possible_turn` of the session now (None if its state did not come:
    then the stream keeps every turn's events, as a session's stream does)."""
    try:
        return first_possible_turn(await asyncio.wait_for(hermes.get_state(session_id), 5.0))
    except SessionNotFoundError:
        return 1
    except Exception as err:  # noqa: BLE001 - events are a view: the turn goes on without the filter
        log.warning("the state of %s did not come (%s); its message's stream keeps every turn's events", session_id, err)
        return None
