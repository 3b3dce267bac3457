"""One provider request per model step: attempt leases and recorded results (issue 31).

A heartbeat timeout retries a model call whose worker looked dead; a live worker that
was only late (starved of CPU, its heartbeats lost on the way) used to be called again by
the retry, and each call is paid. So each attempt of a session's model step
(:meth:`ModelSteps.once`):

- holds a **lease** while it runs: the Redis key ``hermes:model_step:{<step>}:lease``
  naming the worker and the attempt, with a TTL of 1.5 heartbeat timeouts of the attempt
  (:func:`lease_seconds`), renewed every sixth of it by a plain OS thread
  (:data:`LEASES`), not the event loop: it lives exactly as long as the worker process
  does;
- **records its result** (sealed, :func:`hermes.security.encryption.seal`) under
  ``hermes:model_step:{<step>}:result`` for
  :data:`RESULT_TTL_SECONDS` when the provider answered, even when Temporal timed the
  attempt out meanwhile: an attempt cancelled only because its heartbeat was late
  (``timed_out`` / ``not_found`` cancellation) finishes its provider call, within its
  start-to-close timeout, instead of abandoning a paid one (``not_found`` also follows a
  session that ended meanwhile: that finished call is then not used). A cancellation the session
  asked for, or a worker's shutdown grace period running out, still cancels it.

A later attempt of the same step first reads both: a recorded result is used as is (the
provider is not called); a live lease of another attempt means its worker lives, so it
waits for that result (polling every :data:`WAIT_POLL_SECONDS`, while the lease lives
and within its own start-to-close timeout); no live lease means that worker is gone, and
it calls the provider. The step's name is the session, the run, the turn, the step, the
purpose and a digest of the call's input, so a new step (or the same step number in
another run, or with another context) never reuses an old result.

Redis is an optimisation here, never a failure: without a blocking twin of the worker's
Redis client (:func:`hermes.infra.connections.sync_twin`: a Redis Cluster or Sentinel),
or when Redis fails, the call goes to the provider as before.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import socket
from collections.abc import Awaitable, Callable
from datetime import datetime, timezone
from typing import Any

from temporalio import activity

from activities.heartbeat import Ticker
from hermes.infra.connections import cancel_requests, raise_if_cancelled, sync_twin
from hermes.infra.redis_keys import model_step_key
from hermes.models import CallModelInput, CallModelResult
from hermes.security import encryption

log = logging.getLogger("hermes.activities.model_steps")

LEASE_HEARTBEATS = 1.5
"""A lease's TTL in heartbeat timeouts of its attempt: a dead worker's lease has lapsed,
or lapses within half a heartbeat timeout, when the retry that the heartbeat timeout
caused reads it (a killed worker's turn: 0.5 s more at most with the default 1 s), and a
live one's renewals may be 1.25 heartbeat timeouts late before it lapses."""
MIN_LEASE_SECONDS = 1.5
NO_HEARTBEAT_LEASE_SECONDS = 5.0
"""The TTL of a model call without a heartbeat timeout."""
LEASE_RENEWALS = 6
"""Renewals per TTL."""
RESULT_TTL_SECONDS = 3600
"""How long a step's result is kept for its later attempts: longer than a step's
attempts and reissues take (5 x 120 s by default)."""
WAIT_POLL_SECONDS = 0.1
"""How often an attempt waiting on another's lease reads the step again."""
START_TO_CLOSE_MARGIN_SECONDS = 2.0
"""Room left before the attempt's own start-to-close timeout when it stops waiting."""

LEASES = Ticker("hermes-model-leases")
"""The thread that renews the leases of this process' model calls (a Redis round trip
each, so apart from the heartbeats' thread)."""

_READ_OR_CLAIM = """
if ARGV[3] == '1' then
  local recorded = redis.call('GET', KEYS[2])
  if recorded then return {'result', recorded} end
end
local held = redis.call('GET', KEYS[1])
if held == false or held == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return {'claimed', ''}
end
return {'held', held}
"""
"""The step's recorded result (``KEYS[2]``, read when ``ARGV[3]`` is ``'1'``); else the
lease (``KEYS[1]``), taken or renewed unless another attempt holds it (a renewal after
this one's lease lapsed takes it again: the attempt still runs); else who holds it. One
round trip where a result read and a claim were two (both keys share a hash tag: one
Cluster slot); the renewals run it without the read."""
_RECORD_AND_RELEASE = """
if ARGV[2] ~= '' then redis.call('SET', KEYS[2], ARGV[2], 'EX', ARGV[3]) end
if redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('DEL', KEYS[1]) end
return 1
"""
"""Record the step's result (``ARGV[2]``; empty: none) and give the lease up if this
attempt still holds it, in one round trip."""

_HOLDER_PREFIX = f"{socket.gethostname()}:{os.getpid()}"


def step_key(request: CallModelInput, run_id: str) -> str:
    """The Redis name (without suffix) of ``request``'s model step in run ``run_id``.

    Args:
        request: a call with a ``step``.
        run_id: the session run's id (``activity.info().workflow_run_id``).

    Returns:
        ``hermes:model_step:{<session>:<run>:<turn>:<step>:<purpose>:<digest>}``: one hash
        tag, so the lease and the result live on one Redis Cluster node.
    """
    # Without an unset turn start, a call's JSON is what workers before that field
    # hashed: a step they began keeps its name on a newer worker (a rolling deploy).
    dumped = request.model_dump_json(exclude={"turn_start"} if request.turn_start is None else None)
    digest = hashlib.sha256(dumped.encode()).hexdigest()[:16]
    name = f"{request.session_id}:{run_id}:{request.turn}:{request.step}:{request.purpose}:{digest}"
    return model_step_key(name)


def lease_seconds(heartbeat_timeout_seconds: float | None) -> float:
    """The lease TTL of an attempt with this heartbeat timeout (None or 0: none).

    Returns:
        Seconds: :data:`LEASE_HEARTBEATS` heartbeat timeouts, at least
        :data:`MIN_LEASE_SECONDS`; :data:`NO_HEARTBEAT_LEASE_SECONDS` without one.
    """
    if not heartbeat_timeout_seconds or heartbeat_timeout_seconds <= 0:
        return NO_HEARTBEAT_LEASE_SECONDS
    return max(LEASE_HEARTBEATS * heartbeat_timeout_seconds, MIN_LEASE_SECONDS)


def _finishes_after(details: activity.ActivityCancellationDetails | None) -> bool:
    """Whether a cancellation only says the server gave this attempt up (its heartbeat
    timed out): then its provider call is worth finishing for the retry."""
    if details is None or details.cancel_requested or details.paused or details.reset or details.worker_shutdown:
        return False
    return details.timed_out or details.not_found


def remaining_seconds(info: activity.Info) -> float | None:
    """Seconds left of the attempt's start-to-close timeout (None: not set)."""
    if not info.start_to_close_timeout:
        return None
    started = info.started_time if info.started_time.tzinfo else info.started_time.replace(tzinfo=timezone.utc)
    return (started + info.start_to_close_timeout - datetime.now(timezone.utc)).total_seconds()


class ModelSteps:
    """The leases and recorded results of model steps, in the worker's Redis.

    Args:
        redis: the worker's ``redis.asyncio`` client (its blocking twin is made on first
            use); None: every call goes to the provider.
    """

    def __init__(self, redis: Any) -> None:
        self._source = redis
        self._client: Any = None
        self._made = False

    def client(self) -> Any:
        """The blocking Redis client, or None when there is none to be had."""
        if not self._made:
            self._made = True
            self._client = sync_twin(self._source) if self._source is not None else None
            if self._source is not None and self._client is None:
                log.info("model-step leases are off: the worker's Redis client has no blocking twin")
        return self._client

    async def once(self, request: CallModelInput, call: Callable[[], Awaitable[CallModelResult]]) -> CallModelResult:
        """``call()``'s result, or the one an earlier attempt of the same step recorded.

        Args:
            request: the model call (a session's step: ``step`` set, or a summary of its
                context: ``purpose="summary"``; others just call).
            call: makes the provider request and returns the finished result.

        Returns:
            The step's result.

        Raises:
            Whatever ``call`` raises; ``asyncio.CancelledError`` when the attempt is
            cancelled for any reason but its heartbeat timing out.
        """
        if (request.step is None and request.purpose != "summary") or not activity.in_activity() or activity.info().is_local:
            return await call()
        redis = self.client()
        if redis is None:
            return await call()
        info = activity.info()
        key = step_key(request, info.workflow_run_id)
        holder = f"{_HOLDER_PREFIX}/{info.activity_id}/{info.attempt}"
        ttl_ms = int(1000 * lease_seconds(info.heartbeat_timeout.total_seconds() if info.heartbeat_timeout else None))
        try:
            recorded = await self._wait_for_others(redis, key, holder, ttl_ms, info, request)
        except Exception as err:  # noqa: BLE001 - Redis down: no lease; a retry calls the provider, as before
            log.warning("model step %s: liveness not checked, no lease (%s)", key, err)
            return await call()
        if recorded is not None:
            return recorded

        def renew() -> None:
            redis.eval(_READ_OR_CLAIM, 2, f"{key}:lease", f"{key}:result", holder, ttl_ms, "0")

        every = ttl_ms / 1000 / LEASE_RENEWALS
        renewal = LEASES.add(renew, every, first_after_seconds=every)  # just taken: renewed from the next interval on
        result: CallModelResult | None = None
        try:
            result = await self._finished(call, info, request)
            return result
        finally:
            LEASES.remove(renewal)
            # Sealed like every Redis copy of a message (README "Encryption").
            sealed = encryption.seal(result.model_dump_json()) if result is not None else ""
            # From a thread, with the lease thread's client: the write lands even when this
            # await is cancelled before it is sent (a heartbeat timeout the worker has not
            # heard of yet, a shutdown), and never waits behind a busy event-loop pool.
            await self._quietly(
                redis.eval, _RECORD_AND_RELEASE, 2, f"{key}:lease", f"{key}:result", holder, sealed, RESULT_TTL_SECONDS
            )

    async def _wait_for_others(
        self, redis: Any, key: str, holder: str, ttl_ms: int, info: activity.Info, request: CallModelInput
    ) -> CallModelResult | None:
        """The step's recorded result, waiting for it while another attempt's lease lives;
        None once this attempt holds the lease (or the wait would eat its time: then it
        goes on without, and its renewals take the lease when the other lapses).

        Raises:
            redis.RedisError: Redis failed.
        """
        loop = asyncio.get_running_loop()
        remaining = remaining_seconds(info)
        deadline = None if remaining is None else loop.time() + remaining - START_TO_CLOSE_MARGIN_SECONDS
        waited_on = None
        read_result = "1"
        while True:
            # On the event loop (the worker's asyncio client): a thread hop cost twice the
            # round trip's CPU. Renewals stay on the blocking twin, in the lease thread.
            asked = cancel_requests()
            kind, value = await self._source.eval(
                _READ_OR_CLAIM, 2, f"{key}:lease", f"{key}:result", holder, ttl_ms, read_result
            )
            # A cancelled attempt must not go on to the provider (a cancel redis-py swallowed too).
            raise_if_cancelled(asked)
            kind = _text(kind)
            if kind == "result":
                text = encryption.open_quietly(value, what=f"model step result {key}")
                if text is not None:
                    log.info(
                        "turn %d step %s: attempt %d uses the result an earlier attempt recorded; no provider request",
                        request.turn, request.step, info.attempt,
                    )
                    return CallModelResult.model_validate_json(text)
                read_result = "0"  # sealed with another key: as if none, and claim
                continue
            if kind == "claimed":
                if waited_on is not None:
                    log.warning("turn %d step %s: the lease of %s lapsed; its worker is gone", request.turn, request.step, waited_on)
                return None
            lease = _text(value)
            read_result = "1"  # the holder may record a result this worker can read
            if deadline is not None and loop.time() >= deadline:
                log.warning("turn %d step %s: %s still holds the step; calling the provider", request.turn, request.step, lease)
                return None
            if waited_on != lease:
                log.info("turn %d step %s: waiting for %s, whose worker lives, to record its result", request.turn, request.step, lease)
                waited_on = lease
            await asyncio.sleep(WAIT_POLL_SECONDS)

    async def _finished(
        self, call: Callable[[], Awaitable[CallModelResult]], info: activity.Info, request: CallModelInput
    ) -> CallModelResult:
        """``call()``'s result, also when the attempt is cancelled because its heartbeat
        timed out (see :func:`_finishes_after`); bounded by its start-to-close timeout."""
        task = asyncio.ensure_future(call())
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            if task.done() and not task.cancelled():
                return task.result()
            if not _finishes_after(activity.cancellation_details()):
                task.cancel()
                raise
            remaining = remaining_seconds(info)
            log.warning(
                "turn %d step %s: attempt %d timed out while its worker lives; finishing its provider request "
                "for the retry (up to %s s)",
                request.turn, request.step, info.attempt, "-" if remaining is None else f"{max(remaining, 0):.0f}",
            )
            # Core cancels an attempt once, so its start-to-close timeout is the bound here.
            return await asyncio.wait_for(task, None if remaining is None else max(remaining, 0.0))

    @staticmethod
    async def _quietly(fn: Callable[..., Any], *args: Any) -> None:
        try:
            await asyncio.to_thread(fn, *args)
        except Exception as err:  # noqa: BLE001 - a lost record costs at most a second request
            log.warning("model step record not written (%s)", err)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
