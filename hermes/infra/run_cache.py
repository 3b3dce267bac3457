"""Workers drop their cached copy of a session's run as soon as another worker takes the
session over.

Why (issue 12, measured in ``bench/README.md``): a worker keeps each workflow run it
served in its cache (``max_cached_workflows``) until the cache is full. When a session
moves to another worker (its worker crashed, or was too busy to start a workflow task
within the sticky schedule-to-start timeout), nothing tells the first worker: its copy
is stale, is never used again (the next task it gets for that run replays it anyway),
and stays. On a loaded machine sessions move often, so every worker ended up holding
every session: worker memory grew with the number of sessions in the deployment, not
with the number a worker serves (20 sessions on two workers: 8 -> 30 runs cached by one).

How: when a worker does new work (an activation that is not a replay, nor only a query)
on a run it did not have cached (a new run, or one it replayed from history: a
takeover), it publishes the run id on the Redis channel :data:`CHANNEL`; every other
worker that has that run cached asks the SDK core to evict it. A worker that only
replayed a run to answer a query announces nothing: the run's owner keeps its copy. A run that is evicted while a workflow task of it is running leaves when that task
completes (the core's rule), and a run evicted by mistake is only replayed on its next
task, so a late or duplicated notice costs a replay, never a turn. While Redis is down
nothing is published: stale copies then stay, as without this, until the LRU bound.

This uses two private parts of the Temporal Python SDK (1.x, pinned below 2 in
pyproject.toml): ``Worker._workflow_worker`` (its activation handler and its cache) and
the bridge worker's ``request_workflow_eviction``. If they are missing, :meth:`install`
returns False, logs it, and the worker runs as before.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from typing import Any

from hermes.infra.connections import raise_if_cancelled, stop_task
from hermes.infra.redis_keys import is_cluster

log = logging.getLogger("hermes.run_cache")

CHANNEL = "hermes:workflow-runs-taken"
"""Redis pub/sub channel: messages ``<worker id> <run id>``, one per run a worker took
(started doing new work on without having it cached)."""

RECONNECT_SECONDS = (0.5, 5.0)
"""Backoff (first, last) between attempts to subscribe again after a Redis error."""

STOP_WAIT_SECONDS = 5.0
"""How long the worker's shutdown waits for the listener to stop (it checks its stop flag
at least once a second); past that the shutdown goes on without it."""


class MovedRunEviction:
    """Evicts this worker's stale copies of runs other workers took over (see the module
    docstring), and tells the other workers about the runs this one takes.

    Args:
        worker: a ``temporalio.worker.Worker`` (not yet running is fine).
        redis: a ``redis.asyncio.Redis``; None disables the whole mechanism.
        worker_id: this worker's id in the messages; unique by default.
    """

    def __init__(self, worker: Any, redis: Any, *, worker_id: str | None = None) -> None:
        self._worker = worker
        self._redis = redis
        self.worker_id = worker_id or uuid.uuid4().hex
        self._workflows: Any = None
        self._pending: set[asyncio.Task[Any]] = set()
        self._stopping = False
        self._unannounced: set[str] = set()
        """Runs this worker started without having them cached, until it does new work
        on them (then announced) or they leave its cache."""
        self.published = 0
        """Runs announced (attempts; a publish that failed on a Redis error counts too)."""
        self.evicted = 0
        """Cached runs evicted because another worker took them."""

    def install(self) -> bool:
        """Hook the worker's activation handler, and run :meth:`run` beside its workflow
        polling. Returns False (and changes nothing) when there is no Redis, no workflow
        worker, or the SDK's internals are not the ones this was written for."""
        workflows = getattr(self._worker, "_workflow_worker", None)
        if self._redis is None or workflows is None:
            return False
        handle = getattr(workflows, "_handle_activation", None)
        if (
            handle is None
            or not isinstance(getattr(workflows, "_running_workflows", None), dict)
            or not callable(getattr(workflows, "_bridge_worker", None))
            or not callable(getattr(workflows, "run", None))
        ):
            log.warning("stale-run eviction off: this temporalio version's worker internals differ")
            return False
        self._workflows = workflows

        running = workflows._running_workflows
        unannounced = self._unannounced

        async def handle_activation(act: Any) -> None:
            run_id = act.run_id
            if run_id in running and run_id not in unannounced:
                # Nearly every activation: a cached run already announced. Nothing below
                # applies to it, so its jobs are not read (issue 31: this wrapper runs
                # for every activation).
                await handle(act)
                return
            kinds = [job.WhichOneof("variant") for job in act.jobs]
            if "remove_from_cache" in kinds:
                self._unannounced.discard(run_id)
            elif run_id not in workflows._running_workflows and "initialize_workflow" in kinds:
                self._unannounced.add(run_id)
            if run_id in self._unannounced and not act.is_replaying and any(k != "query_workflow" for k in kinds):
                # New work on a run this worker did not have cached: it holds the run's
                # workflow task now. (A replay only to answer a query is no takeover: the
                # owner keeps its copy.)
                self._unannounced.discard(run_id)
                self._announce(run_id)
            await handle(act)

        workflows._handle_activation = handle_activation
        poll = workflows.run

        async def run_with_listener() -> None:
            # The listener lives as long as the worker's workflow polling does, however
            # the worker is run (``async with``, ``Worker.run``, hermes dev / demo).
            self._stopping = False
            listener = asyncio.ensure_future(self.run())
            try:
                await poll()
            finally:
                await self._stop(listener)

        workflows.run = run_with_listener
        return True

    async def _stop(self, listener: asyncio.Task[Any]) -> None:
        # A stop flag as well as the cancel: it also ends the reconnect backoff, and a
        # cancel redis-py swallows (raise_if_cancelled) cannot hold the worker's shutdown.
        self._stopping = True
        await stop_task(listener, wait_seconds=STOP_WAIT_SECONDS, what="the run-taken listener")

    def _announce(self, run_id: str) -> None:
        task = asyncio.ensure_future(self._publish(run_id))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def _publish(self, run_id: str) -> None:
        self.published += 1
        try:
            await self._redis.publish(CHANNEL, f"{self.worker_id} {run_id}")
        except Exception as err:  # noqa: BLE001 - best effort: a stale copy only costs memory
            log.debug("run %s not announced: %r", run_id, err)

    def on_message(self, data: bytes | str) -> bool:
        """Handle one channel message; True if it evicted a cached run of this worker."""
        text = data.decode() if isinstance(data, bytes) else data
        sender, _, run_id = text.partition(" ")
        if not run_id or sender == self.worker_id or self._workflows is None:
            return False
        if run_id not in self._workflows._running_workflows:
            return False
        try:
            self._workflows._bridge_worker().request_workflow_eviction(run_id)
        except Exception:  # noqa: BLE001 - the worker may be shutting down
            log.debug("eviction of run %s not requested", run_id, exc_info=True)
            return False
        self.evicted += 1
        return True

    async def run(self) -> None:
        """Listen on :data:`CHANNEL` until cancelled or the worker's polling ends,
        subscribing again after a Redis error (with backoff)."""
        if self._workflows is None:
            return
        delay = RECONNECT_SECONDS[0]
        while not self._stopping:
            pubsub = self._redis.pubsub()
            try:
                if is_cluster(self._redis):
                    # A cluster client learns the slots at its first command; a subscribe
                    # before that fails (KeyError of the channel's slot).
                    await self._redis.initialize()
                await pubsub.subscribe(CHANNEL)
                delay = RECONNECT_SECONDS[0]
                while not self._stopping:
                    message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=1.0)
                    raise_if_cancelled()
                    if message is not None and message.get("type") == "message":
                        self.on_message(message["data"])
            except asyncio.CancelledError:
                raise
            except Exception as err:  # noqa: BLE001 - Redis down: try again later
                log.debug("run-taken channel: %r; subscribing again in %.1f s", err, delay)
                for _ in range(max(1, round(delay / 0.25))):  # the stop flag is checked during the backoff
                    if self._stopping:
                        break
                    await asyncio.sleep(0.25)
                delay = min(delay * 2, RECONNECT_SECONDS[1])
            finally:
                try:
                    await asyncio.wait_for(pubsub.aclose(), timeout=2.0)
                except (Exception, asyncio.CancelledError):  # noqa: BLE001 - closing a dead connection
                    pass
