"""Heartbeats for activities that wait on something slow (a provider, a tool, a store).

A heartbeat timeout is how Temporal notices a dead worker in seconds instead of after
the start-to-close timeout: an attempt that stops heartbeating for ``heartbeat_timeout``
is failed with a heartbeat timeout and retried on another worker.

:func:`heartbeating` beats in the background while it is entered; code that receives a
stream (a model's chunks) also calls :func:`beat` per chunk. Both only queue a
heartbeat: the SDK sends at most one heartbeat RPC per 0.8 x ``heartbeat_timeout`` per
running activity, or per the worker's ``max_heartbeat_throttle_interval`` when that is
shorter (Hermes' workers: a third of the timeout, ``HERMES_HEARTBEAT_THROTTLE_SECONDS``),
sending the newest one queued, so beating more often costs no RPCs. Outside
an activity (a unit test calling the method directly) and in a local activity (which
runs inside its workflow task and cannot heartbeat) both do nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable
from typing import TypeVar

from temporalio import activity

T = TypeVar("T")

log = logging.getLogger("hermes.activities.heartbeat")

IDLE_INTERVAL_SECONDS = 5.0
"""Beat interval of an activity scheduled without a heartbeat timeout: heartbeats still
carry cancellation to it (the SDK sends them at most every 30 s)."""

_MIN_INTERVAL_SECONDS = 0.05


def beat_interval_seconds(heartbeat_timeout_seconds: float | None) -> float:
    """How often to queue a heartbeat for an activity with this heartbeat timeout.

    A sixth of the timeout: the worker sends the queued heartbeat every third of it
    (``max_heartbeat_throttle_interval``), so one is queued each time it does even when
    the event loop is late by a sixth of the timeout.

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


@contextlib.asynccontextmanager
async def heartbeating(interval_seconds: float | None = None) -> AsyncIterator[None]:
    """Heartbeat in the background while the block runs.

    The first heartbeat is queued at once, then one every ``interval_seconds``. Never
    reacts to the worker shutting down: a graceful shutdown lets the block finish and
    report (see ``HERMES_WORKER_SHUTDOWN_SECONDS``).

    Args:
        interval_seconds: default: :func:`beat_interval_seconds` of the running
            attempt's heartbeat timeout.

    Raises:
        ValueError: ``interval_seconds`` is not positive.
    """
    if not _can_heartbeat():
        yield
        return
    if interval_seconds is None:
        timeout = activity.info().heartbeat_timeout
        interval_seconds = beat_interval_seconds(timeout.total_seconds() if timeout else None)
    if interval_seconds <= 0:
        raise ValueError(f"interval_seconds: expected a positive number of seconds, got {interval_seconds!r}")

    async def loop() -> None:
        while True:
            try:
                activity.heartbeat()
            except Exception:  # noqa: BLE001 - never fail the work for a heartbeat; its timeout will tell
                log.warning("heartbeats stopped", exc_info=True)
                return
            await asyncio.sleep(interval_seconds)

    beater = asyncio.create_task(loop(), name="heartbeat")
    try:
        yield
    finally:
        beater.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await beater


async def with_heartbeat(awaitable: Awaitable[T], interval_seconds: float | None = None) -> T:
    """Await ``awaitable`` inside :func:`heartbeating`; returns its result, raises what it raises."""
    async with heartbeating(interval_seconds):
        return await awaitable
