"""The Redis side of a non-idempotent tool call's claim: the call's record and the running
lease of the attempt that holds it.

A call's record (``hermes:toolcall:<call key>``, see ``activities.tools.idempotency_key``)
says that the call started or what it returned; the **running lease**
(:func:`running_lease_key`) says that the attempt that started it still runs. A later
attempt (Temporal gave up on a late heartbeat) that finds the call started waits for its
result while the lease lives: a busy worker's call is finishing, only a lapsed lease means
its worker is gone (issue 31).

Round trips (issue 31, "less CPU per tool call"): :func:`claim_call` makes the claim
(``SET NX`` of the record), takes the lease (``SET NX PX`` with a value of the attempt's own,
only if the claim was granted) and reads both, in one atomic Lua script (:data:`_CLAIM`; on
a Redis Cluster, where the two keys are in different slots, a pipeline); the lease is
renewed only once a fifth of :data:`STARTED_LEASE_SECONDS` has passed (:class:`RunningLease`),
so a call done sooner costs no renewal task and no round trip of its own; its end drops the
lease in the same pipeline as the result's record (``activities.tools``). A call used to
take four round trips (claim, lease, record and drop, events); it takes two.

Tokens: a lease is only ever dropped by the attempt whose token it holds (a Lua
compare-and-delete, one key), so a late drop never removes a live holder's lease; a claim
whose answer was lost or that was cancelled takes back the lease and the "started" record
it may have set (else a retry reports a call that never ran as "outcome unknown"); the
"started" record names the lease's token, so a claim the Redis client sent twice (a retry
after a lost answer) is still this attempt's. A claim granted while *another* attempt holds
the lease means Redis lost the record of a call that still runs (an eviction), or, on a
cluster, a refused attempt took the lease for an instant: the claim is not used, the caller
waits for the lease's holder and reports the outcome unknown when it lapses (never a second
run). On a cluster the record's write is answered before the lease is dropped. Each of these
was found by a break-it review (``tests/test_call_lease_*.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import uuid
from typing import Any

from redis.asyncio.cluster import RedisCluster

from hermes.infra.connections import raise_if_cancelled
from hermes.security import encryption

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


_DROP_IF_HELD = "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0"
"""Delete the lease ``KEYS[1]`` only if it holds the token ``ARGV[1]``."""

_UNDO_SECONDS = 0.5
"""The longest a claim that failed waits to take back what it may have set (seconds)."""

_CLAIM = """
local claimed = redis.call('SET', KEYS[1], ARGV[1], 'NX', 'EX', ARGV[2])
if claimed then redis.call('SET', KEYS[2], ARGV[3], 'NX', 'PX', ARGV[4]) end
return {claimed and 1 or 0, redis.call('GET', KEYS[1]), redis.call('GET', KEYS[2])}
"""
"""The claim on one Redis server, atomic: the record ``KEYS[1]`` set to ``ARGV[1]`` if
absent (kept ``ARGV[2]`` s); only if that was granted, the lease ``KEYS[2]`` set to the token
``ARGV[3]`` if absent (kept ``ARGV[4]`` ms); then whether it was granted, the record and the
lease's holder. A refused attempt never touches the lease, so two attempts claiming at the
same moment cannot take the lease from each other (found by break-it reviews of a
pipeline, whose commands another client's can interleave)."""


def _retrieved(task: asyncio.Future[Any]) -> None:
    if not task.cancelled():
        task.exception()  # a best-effort write: its failure is not reported again


def open_record(raw: Any, key: str) -> dict[str, Any]:
    """The call record ``raw`` (as Redis returned it for ``key``: sealed or not, bytes or
    text) as a dict; ``{}`` when missing, and when it cannot be opened (then it reads as
    not done: outcome unknown, never run twice)."""
    return json.loads(encryption.open_quietly(raw, what=f"tool call record {key}") or "{}")


def _text(value: Any) -> str | None:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


async def claim_call(lease: RunningLease, started: str, ttl_seconds: int) -> tuple[bool, Any]:
    """Claim the call whose record is ``lease.record_key`` (``started``: its sealed
    "started" record, kept ``ttl_seconds``) and take its running ``lease``, in one round
    trip; sets :attr:`RunningLease.taken` (False: another attempt holds the lease). The
    lease does not renew until :meth:`RunningLease.start`.

    Returns:
        ``(claimed, record)``: whether the record's ``SET NX`` was granted, and the
        record's raw value as Redis holds it now (the earlier attempt's when refused).

    Raises:
        redis.RedisError: Redis failed or its answer was lost (the lease and the record
            this attempt may have set are taken back first, within :data:`_UNDO_SECONDS`).
    """
    lease_ms = int(STARTED_LEASE_SECONDS * 1000)
    try:
        if isinstance(lease.redis, RedisCluster):
            # The record and the lease are in different slots (their key names predate this):
            # a pipeline, each node's part in order; a refused attempt may take the lease.
            pipe = lease.redis.pipeline(transaction=False)
            pipe.set(lease.record_key, started, nx=True, ex=ttl_seconds)
            pipe.set(lease.key, lease.token, nx=True, px=lease_ms)
            pipe.get(lease.record_key)
            pipe.get(lease.key)
            claimed, _, record, holder = await pipe.execute()
        else:
            claimed, record, holder = await lease.redis.eval(
                _CLAIM, 2, lease.record_key, lease.key, started, ttl_seconds, lease.token, lease_ms
            )
    except BaseException:
        # Redis may have run it and lost the answer: what this attempt set is taken back (its
        # lease, and its "started" record, which would make a retry report a call that never
        # ran as "outcome unknown"), only where it still holds this attempt's values.
        undo = lease.redis.pipeline(transaction=False)
        lease.queue_drop(undo)
        undo.eval(_DROP_IF_HELD, 1, lease.record_key, started)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(undo.execute(), _UNDO_SECONDS)
        raise
    lease.taken = _text(holder) == lease.token
    return bool(claimed), record


async def claim_for_attempt(lease: RunningLease, started: str, ttl_seconds: int) -> dict[str, Any] | None:
    """:func:`claim_call` for one attempt, and what its answers mean.

    Args:
        lease: the attempt's lease (of the call's record key).
        started: the "started" record as JSON (naming ``lease.token`` as ``"lease"``).
        ttl_seconds: how long the record is kept.

    Returns:
        None when this attempt holds the claim and the lease (not renewing yet: see
        :meth:`RunningLease.start`); otherwise the call's record for the caller to act on:
        the earlier attempt's (refused), or this attempt's own "started" when another
        attempt holds the lease (Redis lost the record of a call that still runs: wait for
        it, never run it again). A record that cannot be opened reads as ``{}``.

    Raises:
        redis.RedisError: see :func:`claim_call`.
    """
    claimed, raw = await claim_call(lease, encryption.seal(started), ttl_seconds)
    record = open_record(raw, lease.record_key)
    if lease.taken and (claimed or record.get("lease") == lease.token):
        return None  # (the second: this attempt's own claim, sent twice by a client's retry)
    if lease.taken:
        await lease.drop()  # (a cluster's pipeline) refused, and no attempt held the lease
    return record


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
        self.record_key = key
        self.key = running_lease_key(key)
        self.token = token or uuid.uuid4().hex
        self.taken = False
        """Whether the lease holds this attempt's token (:func:`claim_call`)."""
        self.by_record = False
        """Set when the result's record drops the lease in its own write (the renewals
        then stop without dropping it)."""
        self._timer: asyncio.TimerHandle | None = None
        self._task: asyncio.Task[None] | None = None
        self._stopped = False

    def start(self) -> None:
        """Renew the lease every fifth of :data:`STARTED_LEASE_SECONDS`, the first time
        one fifth from now, until :meth:`stop`."""
        self._timer = asyncio.get_running_loop().call_later(STARTED_LEASE_SECONDS / 5, self._begin)

    def _begin(self) -> None:
        self._timer = None
        if not self._stopped and self._task is None:
            self._task = asyncio.create_task(self.hold(), name="tool-call-lease")

    async def hold(self) -> None:
        """Set the lease now and every fifth of :data:`STARTED_LEASE_SECONDS` until
        cancelled, then drop it (unless :attr:`by_record`, or :meth:`stop` does)."""
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
            if not self.by_record and not self._stopped:
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
            task.cancel()  # (a task cancelled before its first step never runs its finally)
            await asyncio.gather(task, return_exceptions=True)
        if not self.by_record:
            await self.drop()

    async def drop(self) -> None:
        """Delete the lease if it holds this attempt's token, whatever cancels the caller
        meanwhile; failures are ignored (a lease left behind lapses within
        :data:`STARTED_LEASE_SECONDS`)."""
        dropping = asyncio.ensure_future(self.redis.eval(_DROP_IF_HELD, 1, self.key, self.token))
        dropping.add_done_callback(_retrieved)
        with contextlib.suppress(Exception):
            await asyncio.shield(dropping)

    def queue_drop(self, pipe: Any) -> None:
        """Queue :meth:`drop`'s delete on ``pipe`` (its answer: 1 if dropped, else 0)."""
        pipe.eval(_DROP_IF_HELD, 1, self.key, self.token)

    async def held_by_another(self) -> bool:
        """Whether the lease exists and holds another attempt's token.

        Raises:
            redis.RedisError: Redis failed.
        """
        found = _text(await self.redis.get(self.key))
        return found is not None and found != self.token
