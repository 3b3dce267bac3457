"""Turn events: what a session does while a turn runs, streamed to whoever watches it.

A turn's events (started, the model's text as it arrives, tool calls started and
finished, approvals requested and decided, memories recalled, warnings, finished) are
published by the activities that do the work (the model call, the tool call, the audit
log, the memory search, the session index at the turn's end) to a Redis Stream per
session, ``hermes:events:<session_id>``. Nothing is added to the session's Temporal
history: the events are a view of the turn, the transcript and the ``TurnResult`` stay
the record (issue 16 asked for ``temporalio.contrib.workflow_streams`` first, "if
Workflow Streams cannot meet the history budget ... use Redis Streams with the same
contract"; ``bench/stream.py`` measures both).

The contract:

* **Offsets.** Every event has an ``offset``: its Redis Stream entry id (``"<ms>-<seq>"``),
  increasing within a session. Reading after an offset returns the events that follow
  it, in order, with no gap and no repeat; an SSE client sends the last one it saw as
  ``Last-Event-ID`` to resume.
* **Retried model attempts.** A model call's text deltas carry the attempt
  (``"<step>.<reissue>.<attempt>"``). When a step's call starts again (its worker died,
  the provider failed), an ``attempt_discarded`` event names the step: a client drops
  the text it showed for that step and shows the new attempt's.
* **Bounded.** A session keeps its newest :data:`DEFAULT_MAX_EVENTS` events (Redis
  ``XADD MAXLEN ~``) and its stream expires :data:`DEFAULT_TTL_SECONDS` after its last
  event, so a months-long session holds a bounded stream. A reader whose offset is no
  longer kept gets a ``truncated`` event first (then the oldest retained ones): it may
  have missed events (Redis 6.2 keeps no record of what trimming removed, so a reader
  exactly at the boundary is told so too).
* **Best effort.** Publishing never fails or delays the work it describes: a Redis
  error is logged and the events are dropped (the turn's result is unaffected).
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import json
import logging
import re
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from datetime import datetime, timezone
from typing import Any, Literal

from pydantic import BaseModel, Field

from hermes.infra.connections import cancel_requests, raise_if_cancelled, sync_twin
from hermes.infra.redis_writes import report_skipped, write_or_report
from hermes.security import encryption

log = logging.getLogger("hermes.events")

EventType = Literal[
    "turn_started",
    "text_delta",
    "attempt_discarded",
    "tool_call_started",
    "tool_call_finished",
    "approval_requested",
    "approval_decided",
    "memories_recalled",
    "warning",
    "turn_finished",
    "truncated",
]

DEFAULT_MAX_EVENTS = 10_000
"""Events a session's stream keeps (approximately: ``XADD MAXLEN ~``): about a hundred
turns with streamed text. Older ones are truncated."""
DEFAULT_TTL_SECONDS = 7 * 24 * 3600
"""A session's stream expires this long (7 days) after its last event."""
MARKER_TTL_SECONDS = 24 * 3600
"""The once-per-turn and once-per-step markers (``...:turn:<n>``, ``...:step:<n>.<k>``)
expire this long (a day) after they are set: two keys a turn, needed only while that turn
runs, so they bound Redis by a day of turns rather than a week (issue 28). A turn that
runs longer (waiting on an approval) may publish ``turn_started`` a second time."""
TEXT_FLUSH_SECONDS = 0.1
"""Text deltas are published in batches: at most every 0.1 s per model call (and when the
call ends), so a fast stream costs a few Redis writes a second, not one per token."""
TEXT_FLUSH_CHARS = 2_000
"""...or as soon as this many characters are waiting."""
MAX_STREAMED_CHARS = 200_000
"""Text published per model call at most; the rest of a longer reply is left out (one
``warning`` event says so) and is read from the turn's result."""
EVENT_ARGUMENTS_CHARS = 2_000
"""Tool-call arguments and result messages in events are cut to this many characters
(their whole values are in the transcript)."""
PUBLISH_TIMEOUT_SECONDS = 1.0
"""The longest a publish may hold up the work it describes; then it is dropped."""
_BLOCKING_CONNECTIONS = 32
"""Connections of :attr:`EventLog.blocking`, opened as needed (a thread that finds none
free in time drops its events, reported)."""
START = "0-0"
"""The offset before the first event of any session."""

_OFFSET = re.compile(r"^\d{1,20}-\d{1,20}$")


def _describe(events: list[TurnEvent]) -> str:
    """What a batch of events is, for a report that it was not published."""
    kinds = ", ".join(sorted({e.type for e in events}))
    sessions = ", ".join(sorted({repr(e.session_id) for e in events})[:3])
    return f"{len(events)} turn event(s) ({kinds}) of session {sessions}"


def _turn_marker(session_id: str, turn: int) -> str:
    """The key whose ``SET NX`` publishes ``turn``'s ``turn_started`` once."""
    return f"{stream_key(session_id)}:turn:{turn}"


def _step_marker(session_id: str, turn: int, step: int) -> str:
    """The key naming the attempt of ``turn``'s ``step`` that started last."""
    return f"{stream_key(session_id)}:step:{turn}.{step}"


def stream_key(session_id: str) -> str:
    """The Redis key of ``session_id``'s event stream."""
    return f"hermes:events:{session_id}"


def check_offset(offset: str) -> str:
    """``offset`` if it is a stream offset (``"<ms>-<seq>"``, e.g. ``"1733184000000-0"``).

    Raises:
        ValueError: anything else, naming it.
    """
    if not _OFFSET.match(offset or ""):
        raise ValueError(f"offset {offset!r} is not an event offset like '1733184000000-0'")
    return offset


def preview_json(value: Any, limit: int) -> str:
    """``value`` as JSON, cut to ``limit`` characters (with an ellipsis) when longer; a
    value JSON cannot show (an integer past Python's 4,300 digits, a cycle) as a JSON
    string saying so: an event never fails the work it describes."""
    try:
        text = json.dumps(value, ensure_ascii=False, default=str)
    except (ValueError, TypeError, RecursionError) as err:
        text = json.dumps(f"(not shown: {type(err).__name__}: {err})"[: max(limit - 2, 0)], ensure_ascii=False)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _after(a: str, b: str) -> bool:
    """Whether offset ``a`` comes after offset ``b``."""
    ams, aseq = (int(x) for x in a.split("-"))
    bms, bseq = (int(x) for x in b.split("-"))
    return (ams, aseq) > (bms, bseq)


class TurnEvent(BaseModel):
    """One event of a session.

    ``data`` by ``type``:

    * ``turn_started``: ``{}``
    * ``text_delta``: ``{"text": str}`` (the model's text, in order, for ``attempt``)
    * ``attempt_discarded``: ``{"reason": str}``: drop the text shown for ``step`` so far
    * ``tool_call_started``: ``{"tool_call_id", "name", "arguments", "attempt"}`` (arguments:
      JSON, cut to :data:`EVENT_ARGUMENTS_CHARS`)
    * ``tool_call_finished``: ``{"tool_call_id", "name", "code", "ok", "message", "seconds",
      "attempt"}`` and ``"data"`` (JSON, cut) when the result has data (``code`` as in
      ``ToolResult.code``: 0 ok, 1 bad arguments, ...); ``"retrying": true`` when this
      attempt raised and Temporal may run it again (a later event gives the outcome)
    * ``approval_requested``: ``{"tool_call_id", "name", "requester", "permission", "arguments"}``
    * ``approval_decided``: ``{"tool_call_id", "name", "approved", "approver", "outcome", "reason"}``
    * ``memories_recalled``: ``{"memories": [{"id", "kind", "text"}]}``
    * ``warning``: ``{"text": str}``
    * ``turn_finished``: ``{"status": str, "turn_count": int}``
    * ``truncated``: ``{"oldest": str}``: the reader's offset is no longer kept; events
      between it and ``oldest`` (the oldest kept) may have been dropped
    """

    type: EventType
    session_id: str
    turn: int | None = None
    step: int | None = None
    attempt: str | None = None
    """Model attempt, ``"<step>.<reissue>.<attempt>"`` (text deltas only)."""
    data: dict[str, Any] = Field(default_factory=dict)
    at: datetime = Field(default_factory=lambda: datetime.now(timezone.utc))
    offset: str = ""
    """The event's stream offset; set when it is read."""


class EventLog:
    """The event streams of all sessions, in Redis.

    Args:
        redis: a ``redis.asyncio.Redis``.
        max_events: events kept per session (:data:`DEFAULT_MAX_EVENTS`).
        ttl_seconds: a stream's lifetime after its last event (:data:`DEFAULT_TTL_SECONDS`).
        marker_ttl_seconds: a turn's or step's marker's lifetime (:data:`MARKER_TTL_SECONDS`,
            at most ``ttl_seconds``).
    """

    def __init__(
        self, redis: Any, *, max_events: int = DEFAULT_MAX_EVENTS, ttl_seconds: int = DEFAULT_TTL_SECONDS,
        marker_ttl_seconds: int = MARKER_TTL_SECONDS,
    ):
        self.redis = redis
        self.max_events = max_events
        self.ttl_seconds = ttl_seconds
        self.marker_ttl_seconds = min(marker_ttl_seconds, ttl_seconds)

    async def publish(self, events: Iterable[TurnEvent]) -> list[str]:
        """Append ``events`` (any sessions) in order; returns their offsets.

        Raises:
            redis.RedisError: Redis failed (see :meth:`publish_quietly`).
        """
        events = list(events)
        if not events:
            return []
        pipe = self.redis.pipeline(transaction=False)
        self.queue(pipe, events)
        answers = await pipe.execute()
        return [_text(a) for a in answers[: len(events)]]

    def queue(self, pipe: Any, events: list[TurnEvent]) -> int:
        """Queue on ``pipe`` (a ``transaction=False`` pipeline that may carry other
        writes) the commands that publish ``events``, in order: one ``XADD`` each, then
        one ``EXPIRE`` per stream. Returns how many commands were queued: the first
        ``len(events)`` of their answers are the events' offsets. A writer that sends
        them with its own write reports a failure with :meth:`report_unpublished`."""
        keys: dict[str, None] = {}
        for event in events:
            key = stream_key(event.session_id)
            keys[key] = None
            # Sealed when encryption is on: text deltas are the reply's text.
            body = encryption.seal(event.model_dump_json(exclude={"offset", "session_id"}))
            pipe.xadd(key, {"e": body}, maxlen=self.max_events, approximate=True)
        for key in keys:  # once per stream, after its events
            pipe.expire(key, self.ttl_seconds)
        return len(events) + len(keys)

    @functools.cached_property
    def blocking(self) -> Any:
        """A blocking client to the same Redis, for :meth:`publish_in_thread` (made on first
        use); None where there is none (a Redis Cluster or Sentinel client: events go
        through the loop). A connection's wait, its connect and its command each get a
        third of :data:`PUBLISH_TIMEOUT_SECONDS`, so a publish holds a tool's thread no
        longer than the loop's publish would hold the call."""
        return sync_twin(self.redis, max_connections=_BLOCKING_CONNECTIONS, timeout_seconds=PUBLISH_TIMEOUT_SECONDS / 3)

    def publish_in_thread(self, events: list[TurnEvent]) -> BaseException | None:
        """:meth:`publish`, from a plain OS thread (a synchronous tool's, after the tool
        returned: its end's events cost the event loop no round trip, issue 31), with
        :attr:`blocking`, within :data:`PUBLISH_TIMEOUT_SECONDS` in all, tried once.

        Returns:
            None if published; else why not, for the caller to hand to
            :meth:`report_unpublished` on the event loop (the tally is the loop's).

        Raises:
            RuntimeError: no :attr:`blocking` client (a programming error: check first).
        """
        if self.blocking is None:
            raise RuntimeError("publish_in_thread needs a blocking client: this EventLog has none")
        pipe = self.blocking.pipeline(transaction=False)
        self.queue(pipe, events)
        try:
            pipe.execute()
        except Exception as err:  # noqa: BLE001 - best effort: reported by the caller, dropped
            return err
        return None

    @staticmethod
    def report_unpublished(events: list[TurnEvent], err: BaseException | str) -> None:
        """Report ``events`` queued by :meth:`queue` that did not land, as
        :meth:`publish_quietly` does (a warning, the ``hermes.redis.writes_skipped``
        metric); they are dropped."""
        sessions = {e.session_id for e in events}
        report_skipped(
            "turn_events", _describe(events), err, items=len(events),
            session_id=next(iter(sessions)) if len(sessions) == 1 else None,
        )

    async def publish_quietly(self, events: Iterable[TurnEvent]) -> bool:
        """:meth:`publish` within :data:`PUBLISH_TIMEOUT_SECONDS` (a wait for a free pool
        connection included; tried once: ``XADD`` is not idempotent, and a second try
        after a lost answer would show clients the text twice); events that do not land
        are reported (:func:`hermes.infra.redis_writes.report_skipped`: a
        warning naming them, the ``hermes.redis.writes_skipped`` metric) and dropped:
        events are a view of the work, never a reason for it to fail.

        Returns:
            True if published (or nothing to publish); False if skipped and reported.
        """
        events = list(events)
        if not events:
            return True
        sessions = {e.session_id for e in events}
        session_id = next(iter(sessions)) if len(sessions) == 1 else None
        return await self._quietly(
            lambda: self.publish(events), _describe(events), items=len(events), session_id=session_id
        )

    async def _quietly(
        self, work: Callable[[], Awaitable[Any]], what: str, *, items: int = 1, session_id: str | None = None
    ) -> bool:
        return await write_or_report(
            "turn_events", what, work, timeout_seconds=PUBLISH_TIMEOUT_SECONDS, attempts=1, items=items, session_id=session_id
        )

    async def begin_turn(self, session_id: str, turn: int) -> bool:
        """Publish ``turn_started`` for ``turn``, once however many activities call this
        (the memory recall and the first model call both do; retries too): a marker key
        set with ``SET NX``. Best effort, like :meth:`publish_quietly`.

        Returns:
            False if skipped (and reported)."""

        async def work() -> None:
            if await self.redis.set(_turn_marker(session_id, turn), "1", nx=True, ex=self.marker_ttl_seconds):
                await self.publish([TurnEvent(type="turn_started", session_id=session_id, turn=turn)])

        return await self._quietly(work, f"turn_started of session {session_id!r} turn {turn}", session_id=session_id)

    async def begin_step(
        self, session_id: str, turn: int, step: int, attempt: str, *, marked: list[Any] | BaseException | None = None
    ) -> bool:
        """Note that model ``attempt`` of ``step`` starts; if another attempt of the same
        step ran before it (a retry, a step started again), publish ``attempt_discarded``
        naming that attempt, so clients drop the text it streamed. For a turn's first step
        (``step`` 0) also :meth:`begin_turn`. The markers go in one Redis round trip, the
        events they call for in one more, only when there are any. Best effort, like
        :meth:`publish_quietly`. ``marked``: the markers' answers, when the caller sent
        them with other writes (:meth:`queue_step_markers`; only the events remain), or
        what that round trip raised (reported; the markers are not written again: a late
        answer may have written them).

        Returns:
            False if skipped (and reported)."""

        async def work() -> None:
            answers = marked
            if isinstance(answers, BaseException):
                raise answers
            if answers is None:
                pipe = self.redis.pipeline(transaction=False)
                self.queue_step_markers(pipe, session_id, turn, step, attempt)
                answers = await pipe.execute(raise_on_error=False)
            await self.step_marked(answers, session_id, turn, step, attempt)

        return await self._quietly(work, f"start of attempt {attempt} of session {session_id!r} turn {turn}", session_id=session_id)

    def queue_step_markers(self, pipe: Any, session_id: str, turn: int, step: int, attempt: str) -> None:
        """Add :meth:`begin_step`'s marker writes to ``pipe`` (a non-transactional pipeline
        of :attr:`redis`; a caller may send other commands in the same round trip), whose
        answers go to :meth:`step_marked`."""
        marker = _step_marker(session_id, turn, step)
        if step == 0:
            pipe.set(_turn_marker(session_id, turn), "1", nx=True, ex=self.marker_ttl_seconds)
        pipe.getset(marker, attempt)
        pipe.expire(marker, self.marker_ttl_seconds)

    async def step_marked(self, answers: list[Any], session_id: str, turn: int, step: int, attempt: str) -> None:
        """Publish what the answers of :meth:`queue_step_markers` call for: ``turn_started``
        when the turn marker was taken, ``attempt_discarded`` when another attempt of the
        step started before this one.

        Raises:
            redis.RedisError: a marker write failed (after the events it allowed are out).
        """
        # Each answer on its own: a turn marker set while the step marker failed still
        # publishes turn_started (no later call would: the marker is taken).
        started = step == 0 and answers[0] is True
        events = [TurnEvent(type="turn_started", session_id=session_id, turn=turn)] if started else []
        previous = answers[-2]
        failed = next((a for a in answers if isinstance(a, Exception)), None)
        if previous is not None and not isinstance(previous, Exception) and _text(previous) != attempt:
            events.append(
                TurnEvent(
                    type="attempt_discarded", session_id=session_id, turn=turn, step=step,
                    attempt=_text(previous), data={"reason": f"model step {step} started again (attempt {attempt})"},
                )
            )
        if events:
            await self.publish(events)
        if failed is not None:
            raise failed

    async def forget_step(self, session_id: str, turn: int, step: int) -> bool:
        """Forget the attempt of ``step`` that :meth:`begin_step` noted: it published
        nothing and was not sent (a turn's first model call that came back for the
        session to call again), so the step's next attempt has nothing to discard. Best
        effort, like :meth:`publish_quietly`."""

        async def work() -> None:
            await self.redis.delete(_step_marker(session_id, turn, step))

        return await self._quietly(work, f"unsent attempt of session {session_id!r} turn {turn}", session_id=session_id)

    async def last_offset(self, session_id: str) -> str:
        """The offset of ``session_id``'s newest event (:data:`START` if none): reading
        after it returns only events published later."""
        newest = await self.redis.xrevrange(stream_key(session_id), count=1)
        return _text(newest[0][0]) if newest else START

    async def check_resume(self, session_id: str, after: str) -> str:
        """``after`` if a reader of ``session_id`` may resume after it: a well-formed
        offset (:func:`check_offset`) no later than the session's newest event
        (:data:`START` always). An offset after the newest event names no event of the
        session: reading after it would skip every event to come until Redis's clock
        passed it (a year-3000 offset: all of them), so it is refused rather than
        followed in silence.

        Returns:
            ``after``.

        Raises:
            ValueError: malformed, or after the newest event (the message names both;
                a session whose stream expired, 7 days after its last event, has none).
            redis.RedisError: Redis failed.
        """
        check_offset(after)
        if after == START:
            return after
        newest = await self.last_offset(session_id)
        if _after(after, newest):
            kept = f"its newest is {newest!r}" if newest != START else "it has none (its stream is empty or expired)"
            raise ValueError(
                f"offset {after!r} is after the newest event of session {session_id!r} ({kept}): no event has "
                "that offset; resume after the last id you received, '0-0' for every retained event, or none "
                "for new events only"
            )
        return after

    async def read(self, session_id: str, after: str = START, *, count: int = 500, block_ms: int | None = None) -> list[TurnEvent]:
        """Events of ``session_id`` after offset ``after``, oldest first, at most ``count``.

        Args:
            after: an offset (:func:`check_offset`), :data:`START` for all retained events.
            block_ms: wait up to this many milliseconds for a first event (None: don't).

        Returns:
            The events; a ``truncated`` event first when events after ``after`` were
            already dropped (so the reader knows it missed some).

        Raises:
            ValueError: ``after`` is not an offset.
            redis.RedisError: Redis failed.
        """
        check_offset(after)
        key = stream_key(session_id)
        gap: list[TurnEvent] = []
        if after != START:
            oldest = await self.redis.xrange(key, count=1)
            if oldest and _after(_text(oldest[0][0]), _next(after)):
                first = _text(oldest[0][0])
                gap = [TurnEvent(type="truncated", session_id=session_id, data={"oldest": first}, offset=after)]
        answer = await self.redis.xread({key: after}, count=count, block=block_ms)
        events = gap
        for _stream, entries in answer or ():
            for entry_id, fields in entries:
                events.append(_event(session_id, _text(entry_id), fields))
        return events

    async def follow(self, session_id: str, after: str = START, *, poll_ms: int = 1_000) -> AsyncIterator[list[TurnEvent]]:
        """The events of ``session_id`` after ``after`` as they come, a batch per read
        (empty when none came within ``poll_ms``, so a caller can do other work between
        them), until the caller stops iterating or its task is cancelled. A Redis error
        is retried 1 s later from the last offset read, so a Redis restart costs the
        reader a pause, not events. A cancel that redis-py swallowed ends it too
        (:func:`~hermes.infra.connections.raise_if_cancelled`).

        Raises:
            ValueError: ``after`` is not an offset.
            asyncio.CancelledError: the task iterating it was cancelled.
        """
        offset = check_offset(after)
        while True:
            asked = cancel_requests()
            try:
                batch = await self.read(session_id, offset, block_ms=poll_ms)
            except Exception as err:  # noqa: BLE001 - a reader outlives a Redis blip
                log.warning("reading the events of %s failed (%s); again in 1 s", session_id, err)
                await asyncio.sleep(1.0)
                batch = []
            raise_if_cancelled(asked)  # a cancel redis-py swallowed: this loop ends only by one
            for event in batch:
                if event.type != "truncated":
                    offset = event.offset
            yield batch


def _next(offset: str) -> str:
    ms, seq = (int(x) for x in offset.split("-"))
    return f"{ms}-{seq + 1}"


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _event(session_id: str, offset: str, fields: dict[Any, Any]) -> TurnEvent:
    try:
        body = encryption.open_sealed(_text(fields.get(b"e", fields.get("e")) or b"{}"))
    except Exception as err:  # noqa: BLE001 - an unknown key or altered data: say so in its place
        return TurnEvent(type="warning", session_id=session_id, offset=offset,
                         data={"text": f"an event this reader cannot decrypt ({err})"})
    values = json.loads(body)
    values.update(session_id=session_id, offset=offset)
    return TurnEvent.model_validate(values)


# --- publishing from inside an activity -------------------------------------------------


class TextEvents:
    """Text deltas of one model call, batched (:data:`TEXT_FLUSH_SECONDS`,
    :data:`TEXT_FLUSH_CHARS`) and published in the background; :meth:`close` publishes
    the rest. Made by :func:`model_call_events` for the duration of a call."""

    def __init__(self, log_: EventLog, session_id: str, turn: int, step: int, attempt: str):
        self.log, self.session_id, self.turn, self.step, self.attempt = log_, session_id, turn, step, attempt
        self.published = False
        """Whether any text was handed over (so a whole reply is not published twice)."""
        self.unpublished = 0
        """Events of this call whose publication reported it did not land (``False`` from
        :meth:`EventLog.publish_quietly`), for the call's result to say so (issue 27)."""
        self._buffer: list[str] = []
        self._size = 0
        self._total = 0
        self._cut = False
        self._last = time.monotonic()
        self._tasks: set[asyncio.Task[None]] = set()

    def add(self, text: str) -> None:
        if not text or self._total >= MAX_STREAMED_CHARS:
            return
        self.published = True
        room = MAX_STREAMED_CHARS - self._total
        if len(text) >= room:
            text = text[:room]
            self._cut = True
        self._total += len(text)
        self._buffer.append(text)
        self._size += len(text)
        if self._size >= TEXT_FLUSH_CHARS or time.monotonic() - self._last >= TEXT_FLUSH_SECONDS:
            self._flush()

    def _flush(self) -> None:
        if not self._buffer:
            return
        event = TurnEvent(
            type="text_delta", session_id=self.session_id, turn=self.turn, step=self.step,
            attempt=self.attempt, data={"text": "".join(self._buffer)},
        )
        self._buffer, self._size, self._last = [], 0, time.monotonic()
        self._publish_in_order(event)

    def _publish_in_order(self, event: TurnEvent) -> None:
        """Publish ``event`` in the background after the ones handed over before it."""
        previous = list(self._tasks)
        task = asyncio.get_running_loop().create_task(self._publish_after(previous, event))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _publish_after(self, previous: list[asyncio.Task[None]], event: TurnEvent) -> None:
        if previous:
            await asyncio.gather(*previous, return_exceptions=True)
        if await self.log.publish_quietly([event]) is False:
            self.unpublished += 1

    async def close(self) -> None:
        self._flush()
        if self._cut:
            self._cut = False
            note = TurnEvent(
                type="warning", session_id=self.session_id, turn=self.turn, step=self.step, attempt=self.attempt,
                data={"text": f"the reply is longer than the {MAX_STREAMED_CHARS} characters streamed; the rest is in the turn's result"},
            )
            self._publish_in_order(note)
        if self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)


_current_text: contextvars.ContextVar[TextEvents | None] = contextvars.ContextVar("hermes_text_events", default=None)


def model_text(text: str) -> None:
    """Called by a provider with each piece of reply text it receives; published as
    ``text_delta`` events when a model call of a session's turn runs (a no-op otherwise)."""
    current = _current_text.get()
    if current is not None:
        current.add(text)


class model_call_events:  # noqa: N801 - used as a context manager, like contextlib's
    """``async with model_call_events(log, ...)`` around a session's model call: text the
    provider hands :func:`model_text` inside it is published as ``text_delta`` events.
    ``log`` None: nothing is published."""

    def __init__(self, log_: EventLog | None, session_id: str, turn: int, step: int, attempt: str):
        self._text = TextEvents(log_, session_id, turn, step, attempt) if log_ is not None else None
        self._token: contextvars.Token[TextEvents | None] | None = None
        self.marked: list[Any] | BaseException | None = None
        """The answers of this attempt's step markers when the caller already wrote them
        (:meth:`EventLog.queue_step_markers`, in one round trip with its other writes), or
        what that round trip raised; None: :meth:`EventLog.begin_step` writes them on entry."""

    async def __aenter__(self) -> TextEvents | None:
        text = self._text
        if text is not None:
            # A publication that reports it did not land (False) is counted; None: not told.
            if await text.log.begin_step(text.session_id, text.turn, text.step, text.attempt, marked=self.marked) is False:
                text.unpublished += 1
            self._token = _current_text.set(text)
        return text

    @property
    def text(self) -> TextEvents | None:
        """The call's text events (None: nothing is published)."""
        return self._text

    async def publish(self, events: list[TurnEvent]) -> None:
        """Publish ``events`` of the call (a turn's recall) after its start, counting one
        that did not land in the call's ``unpublished``."""
        text = self._text
        if text is not None and events and await text.log.publish_quietly(events) is False:
            text.unpublished += 1

    async def unsent(self) -> None:
        """The call was not sent: forget its attempt (:meth:`EventLog.forget_step`)."""
        text = self._text
        if text is not None:
            await text.log.forget_step(text.session_id, text.turn, text.step)

    async def __aexit__(self, *exc: object) -> None:
        if self._text is not None and self._token is not None:
            _current_text.reset(self._token)
            await self._text.close()


class DelayedEvent:
    """An event published ``delay_seconds`` from now unless the work it announces ends
    first (``publish``: makes the publishing coroutine; None: nothing to publish), e.g. a
    tool call's ``tool_call_started``: :meth:`settle` tells whether it got out, so that a
    fast call's two events go out in one write, in order, and a slow one shows as running.

    A timer of the event loop until it is due (no task: a fast call, the usual one, costs
    one timer set and cancelled; issue 31); the publishing task is made when it is."""

    def __init__(self, publish: Callable[[], Awaitable[Any]] | None, delay_seconds: float) -> None:
        self._publish = publish
        self._task: asyncio.Future[Any] | None = None
        self._taken = False
        self._lock = threading.Lock()
        self._timer = asyncio.get_running_loop().call_later(delay_seconds, self._due) if publish is not None else None

    def _due(self) -> None:
        # From here on never cancelled: an event is not half sent.
        self._timer = None
        assert self._publish is not None
        with self._lock:
            if self._taken:
                return
            self._task = asyncio.ensure_future(self._publish())

    def take(self) -> bool:
        """From any thread: True if the event was not due yet, and then it never will be
        (the caller sends it, with what ends the work); False once it is being sent.
        The timer is left to :meth:`cancel` (the loop's)."""
        with self._lock:
            if self._task is not None or self._taken or self._publish is None:
                return False
            self._taken = True
            return True

    async def settle(self) -> bool:
        """True once the event is out; False (and it never will be) if it was not due yet.
        A caller cancelled while the event is being sent stops waiting; the event is still
        sent whole (``asyncio.wait`` never cancels what it waits on)."""
        if self._task is None:
            self.cancel()
            return False
        await asyncio.wait({self._task})
        if not self._task.cancelled():
            self._task.exception()  # retrieved: publishing is best effort and already reported
        return True

    def cancel(self) -> None:
        """Drop the event unless it is being sent; a later :meth:`take` (a thread still
        running the work of a cancelled call) gets False."""
        with self._lock:
            self._taken = self._taken or self._task is None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
