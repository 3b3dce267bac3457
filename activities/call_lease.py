"""The Redis side of a non-idempotent tool call's claim: the call's record and the running
lease of the attempt that holds it.

A call's record (``hermes:toolcall:<call key>``, see ``activities.tools.idempotency_key``)
says that the call started or what it returned; the **running lease**
(:func:`running_lease_key`) says that the attempt that started it still runs. A later
attempt (Temporal gave up on a late heartbeat) that finds the call started waits for its
result while the lease lives: a busy worker's call is finishing, only a lapsed lease means
its worker is gone (issue 31).

Round trips (issue 31, "less CPU per tool call"): :func:`claim_call` sends the claim
(``SET NX``), the lease (``SET NX PX``, with a value of the attempt's own) and a read of the
record in one pipeline; the lease is renewed only once a fifth of
:data:`STARTED_LEASE_SECONDS` has passed (:class:`RunningLease`), so a call done sooner
costs no renewal task and no round trip of its own; its end drops the lease in the same
pipeline as the result's record (``activities.tools``). A call used to take four round
trips (claim, lease, record and drop, events); it takes two.

Why the lease is taken only if absent and holds a token: an attempt refused the claim takes
the lease too when no one holds it (the earlier attempt ended or died); it drops it at once
(:meth:`RunningLease.drop`) and never waits on a lease holding its own token, so it can
neither wait on itself nor keep another attempt waiting (both found by a break-it review of
a pipeline that set the lease unconditionally). A live holder's lease is never overwritten.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from typing import Any

from hermes.infra.connections import raise_if_cancelled

log = logging.getLogger("hermes.tools")

STARTED_LEASE_SECONDS = 10.0
"""How long a non-idempotent tool call's "running" lease lives without renewal (seconds;
renewed every fifth of it while the call runs). A later attempt of the same call that
finds the call started waits for its result while this lease lives: a worker whose
heartbeats were late (a starved event loop) is busy, not dead, and its call is finishing.
Only when the lease lapses is the outcome reported unknown (issue 31)."""


def running_lease_key(key: str) -> str:
    """Redis key of the lease a running attempt of the call with record ``key`` holds
    (:data:`STARTED_LEASE_SECONDS`)."""
    return "hermes:toolcall-running:" + key.removeprefix("hermes:toolcall:")


def _text(value: Any) -> str | None:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


async def claim_call(redis: Any, key: str, started: str, ttl_seconds: int) -> tuple[bool, RunningLease, Any]:
    """Claim the call with record ``key`` (``started``: its sealed "started" record, kept
    ``ttl_seconds``) and take its running lease, in one round trip.

    Returns:
        ``(claimed, lease, record)``: whether this attempt now holds the claim; this
        attempt's lease (:attr:`RunningLease.taken`: whether it took it; False when another
        attempt holds it), not yet renewing (see :meth:`RunningLease.start`); and the
        record's raw value as Redis holds it now (the earlier attempt's when the claim was
        refused).

    Raises:
        redis.RedisError: Redis failed or its answer was lost. A lease set before an answer
            was lost is nobody's: it lapses within :data:`STARTED_LEASE_SECONDS`.
    """
    lease = RunningLease(redis, key)
    pipe = redis.pipeline(transaction=False)
    pipe.set(key, started, nx=True, ex=ttl_seconds)
    pipe.set(lease.key, lease.token, nx=True, px=int(STARTED_LEASE_SECONDS * 1000))
    pipe.get(key)
    claimed, taken, record = await pipe.execute()
    lease.taken = bool(taken)
    return bool(claimed), lease, record


class RunningLease:
    """The running lease of one attempt of a call: :func:`running_lease_key` of its record
    ``key``, holding this attempt's random ``token``.

    Args:
        redis: a ``redis.asyncio.Redis``.
        key: the call's record key.
        token: the lease's value (default: a new random one).
    """

    def __init__(self, redis: Any, key: str, token: str | None = None) -> None:
        self.redis = redis
        self.key = running_lease_key(key)
        self.token = token or uuid.uuid4().hex
        self.taken = False
        """Whether this attempt set the lease (:func:`claim_call`)."""
        self.by_record = False
        """Set when the result's record drops the lease in its own write (the renewals
        then stop without dropping it)."""
        self._timer: asyncio.TimerHandle | None = None
        self._task: asyncio.Task[None] | None = None
        self._stopped = False

    def start(self, *, at_once: bool = False) -> None:
        """Renew the lease every fifth of :data:`STARTED_LEASE_SECONDS` from then on, the
        first time after one fifth (``at_once``: now, for a lease another attempt took
        first) until :meth:`stop`."""
        if at_once:
            self._begin()
        else:
            self._timer = asyncio.get_running_loop().call_later(STARTED_LEASE_SECONDS / 5, self._begin)

    def _begin(self) -> None:
        self._timer = None
        if not self._stopped and self._task is None:
            self._task = asyncio.create_task(self.hold(), name="tool-call-lease")

    async def hold(self) -> None:
        """Set the lease now and every fifth of :data:`STARTED_LEASE_SECONDS` until
        cancelled, then drop it (unless :attr:`by_record`)."""
        try:
            while True:
                try:
                    await self.redis.set(self.key, self.token, px=int(STARTED_LEASE_SECONDS * 1000))
                except Exception as err:  # noqa: BLE001 - a lapsed lease costs only an "outcome unknown"
                    log.warning("tool call lease %s not renewed: %s", self.key, err)
                # Only a cancel ends this loop; one redis-py swallowed would renew the lease,
                # and hold the call's end, for as long as the worker lives.
                raise_if_cancelled()
                await asyncio.sleep(STARTED_LEASE_SECONDS / 5)
        finally:
            if not self.by_record:
                await self.drop()

    async def stop(self) -> None:
        """Stop renewing and drop the lease (unless :attr:`by_record`: the record's write
        drops it)."""
        self._stopped = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._task is not None:
            task, self._task = self._task, None
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)  # its end drops the lease
        elif not self.by_record:
            await self.drop()

    async def drop(self) -> None:
        """Delete the lease, whatever cancels the caller meanwhile; failures are ignored
        (a lease left behind lapses within :data:`STARTED_LEASE_SECONDS`)."""
        with contextlib.suppress(Exception):
            await asyncio.shield(self.redis.delete(self.key))

    async def held_by_another(self) -> bool:
        """Whether the lease exists and holds another attempt's token.

        Raises:
            redis.RedisError: Redis failed.
        """
        found = _text(await self.redis.get(self.key))
        return found is not None and found != self.token
