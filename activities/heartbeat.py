"""Heartbeats for activities that wait on something slow (a provider, a tool, a store).

A heartbeat timeout is how Temporal notices a dead worker in seconds instead of after
the start-to-close timeout: an attempt that stops heartbeating for ``heartbeat_timeout``
is failed with a heartbeat timeout and retried on another worker.

:func:`heartbeating` beats while it is entered from a plain OS thread (one
:class:`Ticker` per process), not from the event loop: a loop starved of CPU, or held by
CPU work, made a live worker look dead, its calls were retried and paid again (issue 31).
The thread hands each beat straight to the SDK's core (``record_activity_heartbeat`` of
the Rust bridge, which releases the GIL and may be called from any thread; the SDK's own
``activity.heartbeat`` schedules an asyncio task on the loop instead, so a late loop sent
late beats). Core then sends at most one heartbeat RPC per 0.8 x ``heartbeat_timeout``
per running activity, or per the worker's ``max_heartbeat_throttle_interval`` when that
is shorter (Hermes' workers: a third of the timeout, ``HERMES_HEARTBEAT_THROTTLE_SECONDS``),
from its own threads, so beating more often costs no RPCs. Where the bridge cannot be
reached (``ActivityEnvironment`` in unit tests, a future SDK) the thread queues
``activity.heartbeat`` on the loop, as before. The thread's beats carry no details (no
Hermes activity keeps progress in them). Code that receives a stream (a model's
chunks) also calls :func:`beat` per chunk. Outside an activity and in a local activity
(which runs inside its workflow task and cannot heartbeat) both do nothing.
"""

from __future__ import annotations

import asyncio
import contextvars
import itertools
import logging
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from temporalio import activity

T = TypeVar("T")

log = logging.getLogger("hermes.activities.heartbeat")

IDLE_INTERVAL_SECONDS = 5.0
"""Beat interval of an activity scheduled without a heartbeat timeout: heartbeats still
carry cancellation to it (the SDK sends them at most every 30 s)."""

_MIN_INTERVAL_SECONDS = 0.05


class Ticker:
    """One daemon thread that calls registered functions, each every ``interval_seconds``.

    What the event loop must not be trusted to do on time (heartbeats, lease renewals)
    runs here; a function that raises is dropped (and logged) without stopping the rest.
    Started on first use, so a process that never registers anything has no thread.
    """

    MAX_SLEEP_SECONDS = 0.25
    """The longest the thread sleeps, with or without entries. A new entry wakes it only if
    it is due more than half its interval before the thread wakes on its own: otherwise its
    first call waits for that wake-up (late by at most half its interval; a heartbeat's first
    beat, due a sixth of the timeout after the start, then comes within a quarter of it).
    Four wakes a second cost less than one per activity (issue 31: each activity's first
    entry woke the sleeping thread, a thread switch and a wait for the GIL per tool call)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._cond = threading.Condition()
        self._entries: dict[int, list[Any]] = {}
        self._ids = itertools.count()
        self._thread: threading.Thread | None = None
        self._wake_at = 0.0
        """When the thread wakes next (monotonic seconds; 0: awake): an entry due later
        does not wake it (each wake costs a thread switch and the GIL)."""

    def add(self, fn: Callable[[], None], interval_seconds: float, *, first_after_seconds: float = 0.0) -> int:
        """Call ``fn()`` after ``first_after_seconds`` (default: now; at most half an
        interval later, see :attr:`MAX_SLEEP_SECONDS`) and then every ``interval_seconds``
        (> 0) until :meth:`remove`.

        Returns:
            The handle to pass to :meth:`remove`.
        """
        with self._cond:
            key = next(self._ids)
            self._entries[key] = [time.monotonic() + first_after_seconds, interval_seconds, fn]
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
                self._thread.start()
            if self._entries[key][0] + interval_seconds / 2 < self._wake_at:
                self._cond.notify()
        return key

    def remove(self, key: int) -> None:
        """Stop calling the function of ``key`` (a call under way finishes)."""
        with self._cond:
            self._entries.pop(key, None)

    def _run(self) -> None:
        while True:
            with self._cond:
                now = time.monotonic()
                due = [(key, entry[2]) for key, entry in self._entries.items() if entry[0] <= now]
                for key, _ in due:
                    self._entries[key][0] = now + self._entries[key][1]
                if not due:
                    self._wake_at = min([now + self.MAX_SLEEP_SECONDS, *(entry[0] for entry in self._entries.values())])
                    self._cond.wait(self._wake_at - now)
                    self._wake_at = 0.0  # awake: a new entry is seen before the next wait
                    continue
            for key, fn in due:
                try:
                    fn()
                except Exception:  # noqa: BLE001 - one failing function must not stop the others
                    log.warning("%s: a periodic call failed; it is stopped", self.name, exc_info=True)
                    self.remove(key)


HEARTBEATS = Ticker("hermes-heartbeats")
"""The thread that sends every activity's heartbeats in this process."""


def beat_interval_seconds(heartbeat_timeout_seconds: float | None) -> float:
    """How often to queue a heartbeat for an activity with this heartbeat timeout.

    A sixth of the timeout: the worker sends the queued heartbeat every third of it
    (``max_heartbeat_throttle_interval``), so one is queued each time it does even when
    the beating thread is late by a sixth of the timeout.

    Args:
        heartbeat_timeout_seconds: the attempt's heartbeat timeout; None or 0: none set.

    Returns:
        The interval in seconds (at least 0.05).
    """
    if not heartbeat_timeout_seconds or heartbeat_timeout_seconds <= 0:
        return IDLE_INTERVAL_SECONDS
    return max(heartbeat_timeout_seconds / 6, _MIN_INTERVAL_SECONDS)


def _can_heartbeat() -> bool:
    return activity.in_activity() and not activity.info().is_local


def beat() -> None:
    """Queue one heartbeat (no-op outside a regular activity); e.g. once per streamed chunk."""
    if _can_heartbeat():
        activity.heartbeat()


def _core_sender() -> Callable[[], None] | None:
    """A function, callable from any thread, that records an empty heartbeat of the running
    activity straight into the SDK's core; None where the SDK's internals differ from what
    this reads (``temporalio.worker._activity``, checked against temporalio 1.x: the
    context's ``heartbeat`` is an outbound interceptor chain ending in
    ``_ActivityOutboundImpl``, whose worker holds the bridge and the running activities)."""
    try:
        from temporalio.bridge import proto
        from temporalio.worker import _activity as sdk

        outbound = getattr(activity._Context.current().heartbeat, "__self__", None)
        while outbound is not None and not isinstance(outbound, sdk._ActivityOutboundImpl):
            outbound = getattr(outbound, "next", None)
        if outbound is None:
            return None
        worker = outbound._worker
        token = activity.info().task_token
        running = worker._running_activities.get(token)
        bridge = worker._bridge_worker()
        message = proto.ActivityHeartbeat(task_token=token)
        if running is None:
            return None
    except Exception:  # noqa: BLE001 - any mismatch: beat through the loop instead
        log.debug("heartbeats go through the event loop", exc_info=True)
        return None

    def send() -> None:
        if not running.done:
            bridge.record_activity_heartbeat(message)

    return send


def _loop_sender() -> Callable[[], None]:
    """A function, callable from any thread, that queues ``activity.heartbeat()`` on the
    running loop in this activity's context."""
    loop = asyncio.get_running_loop()
    context = contextvars.copy_context()

    def send() -> None:
        if not loop.is_closed():
            loop.call_soon_threadsafe(activity.heartbeat, context=context)

    return send


_beating: contextvars.ContextVar[bool] = contextvars.ContextVar("hermes_heartbeating", default=False)


def heartbeat_sender() -> Callable[[], None]:
    """The function :func:`heartbeating` calls from its thread for the running activity
    (tests replace it to make a live worker's heartbeats go missing)."""
    return _core_sender() or _loop_sender()


class heartbeating:  # noqa: N801 - used as a function: ``async with heartbeating():``
    """Heartbeat from the :data:`HEARTBEATS` thread while the block runs.

    The first heartbeat is sent after ``interval_seconds``, then one every
    ``interval_seconds``: a block done sooner sends none (the attempt's start told the
    server it runs; a beat at once cost every short tool call a heartbeat RPC and a wake of
    the thread, issue 31), and the first comes well within the heartbeat timeout. Never
    reacts to the worker shutting down: a graceful shutdown lets the block finish and
    report (see ``HERMES_WORKER_SHUTDOWN_SECONDS``). Nested blocks of one activity beat once.

    Args:
        interval_seconds: default: :func:`beat_interval_seconds` of the running
            attempt's heartbeat timeout.

    Raises:
        ValueError: ``interval_seconds`` is not positive (on entering the block).

    (A class, not a generator-based context manager: it is entered once per activity,
    issue 31.)
    """

    __slots__ = ("_interval", "_key", "_token")

    def __init__(self, interval_seconds: float | None = None) -> None:
        self._interval = interval_seconds
        self._key: int | None = None
        self._token: contextvars.Token[bool] | None = None

    async def __aenter__(self) -> None:
        if self._key is not None:
            raise RuntimeError("this heartbeating block is already entered: make a new one for each block")
        if not _can_heartbeat() or _beating.get():
            return
        interval_seconds = self._interval
        if interval_seconds is None:
            timeout = activity.info().heartbeat_timeout
            interval_seconds = beat_interval_seconds(timeout.total_seconds() if timeout else None)
        if interval_seconds <= 0:
            raise ValueError(f"interval_seconds: expected a positive number of seconds, got {interval_seconds!r}")
        self._key = HEARTBEATS.add(heartbeat_sender(), interval_seconds, first_after_seconds=interval_seconds)
        self._token = _beating.set(True)

    async def __aexit__(self, *exc_info: object) -> None:
        if self._key is not None:
            assert self._token is not None
            _beating.reset(self._token)
            HEARTBEATS.remove(self._key)
            self._key = self._token = None


async def with_heartbeat(awaitable: Awaitable[T], interval_seconds: float | None = None) -> T:
    """Await ``awaitable`` inside :func:`heartbeating`; returns its result, raises what it raises."""
    async with heartbeating(interval_seconds):
        return await awaitable
