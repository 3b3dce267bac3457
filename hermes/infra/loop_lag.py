"""Event-loop lag of a worker: how late its asyncio loop runs what is due (issue 31).

Every activity's heartbeats are sent from the worker's event loop. When something holds
that loop (a long synchronous call) or the GIL (a thread doing CPU work), or the machine
gives the process no CPU, the heartbeats are late by as much, and past the heartbeat
timeout Temporal takes a busy worker for a dead one. The lag says which it was before a
timeout does.

A task sleeps :data:`INTERVAL_SECONDS` at a time and records how much later than asked it
woke: the ``hermes.worker.event_loop_lag`` histogram (seconds; Prometheus
``hermes_worker_event_loop_lag_seconds``, through :mod:`hermes.infra.telemetry`), and a
warning in the log when a wake-up is ``HERMES_EVENT_LOOP_LAG_WARN_SECONDS`` late or more
(at most one per :data:`WARN_EVERY_SECONDS`, saying the worst lag since the last one).
"""

from __future__ import annotations

import asyncio
import logging
import weakref

from hermes.infra import telemetry

__all__ = ["INTERVAL_SECONDS", "LoopLagMonitor", "watch_loop_lag"]

log = logging.getLogger("hermes.worker")

INTERVAL_SECONDS = 0.25
"""How long the monitor sleeps between two measurements."""
WARN_EVERY_SECONDS = 10.0
"""At most one lag warning this often (a starved worker would otherwise log 4 a second)."""


class LoopLagMonitor:
    """Measures the lag of the running loop until :meth:`stop`.

    Args:
        warn_seconds: a lag at least this long (seconds) is logged as a warning.
        interval_seconds: sleep between two measurements.
    """

    def __init__(self, warn_seconds: float = 1.0, *, interval_seconds: float = INTERVAL_SECONDS) -> None:
        self.warn_seconds = warn_seconds
        self.interval_seconds = interval_seconds
        self._task: asyncio.Task[None] | None = None
        self._last_warned: float | None = None
        self._worst_unwarned = 0.0
        self.samples = 0
        """Measurements taken."""
        self.max_lag_seconds = 0.0
        """The worst lag seen since the monitor started."""
        self._sampled = asyncio.Event()

    def start(self) -> None:
        """Start measuring on the running loop (again after :meth:`stop`)."""
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._watch(), name="hermes-loop-lag")

    async def stop(self) -> None:
        """Stop measuring."""
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None

    async def next_sample(self) -> None:
        """Wait for the next measurement (tests)."""
        self._sampled.clear()
        await self._sampled.wait()

    async def _watch(self) -> None:
        clock = asyncio.get_running_loop().time
        while True:
            asked = clock() + self.interval_seconds
            await asyncio.sleep(self.interval_seconds)
            now = clock()
            self.record(max(0.0, now - asked), now)

    def record(self, lag_seconds: float, now: float) -> None:
        """One measurement: exported, and warned about when it is over the threshold."""
        self.samples += 1
        self.max_lag_seconds = max(self.max_lag_seconds, lag_seconds)
        telemetry.record_event_loop_lag(lag_seconds)
        if lag_seconds >= self.warn_seconds:
            self._worst_unwarned = max(self._worst_unwarned, lag_seconds)
            if self._last_warned is None or now - self._last_warned >= WARN_EVERY_SECONDS:
                log.warning(
                    "event loop lag %.2f s (threshold %.2f s): heartbeats of this worker's activities are late by as "
                    "much; CPU starved, or something holds the loop or the GIL", self._worst_unwarned, self.warn_seconds,
                )
                self._last_warned, self._worst_unwarned = now, 0.0
        self._sampled.set()


_monitors: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, LoopLagMonitor] = weakref.WeakKeyDictionary()


def watch_loop_lag(warn_seconds: float = 1.0) -> LoopLagMonitor:
    """The lag monitor of the running loop, started on first call (one per loop however
    many workers it runs; it ends with the loop, or with :meth:`LoopLagMonitor.stop`).

    Args:
        warn_seconds: the warning threshold of a monitor this call starts.

    Raises:
        RuntimeError: no running event loop.
    """
    loop = asyncio.get_running_loop()
    monitor = _monitors.get(loop)
    if monitor is None:
        monitor = _monitors[loop] = LoopLagMonitor(warn_seconds)
    monitor.start()
    return monitor
