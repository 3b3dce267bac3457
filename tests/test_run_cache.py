"""What a worker does with the workflow runs it holds (issue 12): a stale copy of a
session's run leaves its cache once another worker takes the session (hermes.infra.run_cache;
worker memory grew with every session of the deployment because each worker kept every
session it had ever served), and a slow activation on a loaded machine is not called a
deadlock (``Settings.workflow_deadlock_seconds``)."""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

from temporalio import workflow
from temporalio.api.enums.v1 import EventType
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from hermes.client import HermesClient
from hermes.infra.durable import DurableStore
from hermes.infra.run_cache import CHANNEL, MovedRunEviction
from hermes.providers.scripted import ScriptedModel
from hermes.tools.builtin import register_builtins
from hermes.tools.registry import ToolRegistry
from tests.support import eventually
from worker import build_worker, set_deadlock_timeout


def _hermes(temporal_client: Any, settings: Any, redis: Any) -> HermesClient:
    return HermesClient(
        temporal_client, task_queue=settings.task_queue, redis=redis, durable=DurableStore(settings.resolved_memory_uri)
    )


def _worker(temporal_client: Any, settings: Any, redis: Any) -> Any:
    registry = register_builtins(ToolRegistry())
    return build_worker(temporal_client, settings, provider=ScriptedModel.demo(), registry=registry, redis=redis)


def _cached(worker: Any) -> dict[str, Any]:
    return worker._workflow_worker._running_workflows


async def test_a_run_announced_by_another_worker_leaves_this_workers_cache_and_the_session_goes_on(
    temporal_client, settings, redis, session_id
):
    worker = _worker(temporal_client, settings, redis)
    eviction: MovedRunEviction = worker.hermes_run_eviction
    assert eviction is not None, "the hook is installed on this SDK version"
    hermes = _hermes(temporal_client, settings, redis)
    async with worker:  # the listener runs beside the worker's workflow polling
        first = await hermes.send_message(session_id, "What is (17 + 25) * 3?")
        assert first.status == "completed"
        run_id = (await temporal_client.get_workflow_handle(session_id).describe()).run_id
        assert run_id in _cached(worker)

        # This worker's own announcements are ignored ...
        assert not eviction.on_message(f"{eviction.worker_id} {run_id}")
        assert run_id in _cached(worker)
        # ... another worker's evict the run (the listener gets it from Redis).
        await eventually(lambda: _subscribed(redis), what="the listener subscribed")
        await redis.publish(CHANNEL, f"other-worker {run_id}")

        async def gone() -> bool:
            return run_id not in _cached(worker)

        await eventually(gone, what="the run evicted", timeout_seconds=30)
        assert eviction.evicted == 1

        # A query replays the run here only to answer: that is no takeover, nothing is
        # announced (the run's owner, were it another worker, keeps its copy).
        announced = eviction.published
        assert (await hermes.get_state(session_id)).turn_count == 1
        assert eviction.published == announced
        # The next turn is new work on a run this worker did not have cached: announced.
        # It answers as before.
        second = await hermes.send_message(session_id, "What is (17 + 25) * 3?")
        assert (second.status, second.reply) == ("completed", first.reply)
        assert run_id in _cached(worker) and eviction.published == announced + 1
        transcript = await hermes.get_transcript(session_id)
        assert [m.content for m in transcript if m.role == "user"] == ["What is (17 + 25) * 3?"] * 2


async def _subscribed(redis: Any) -> bool:
    return (await redis.pubsub_numsub(CHANNEL))[0][1] >= 1


async def test_a_new_run_is_announced_on_redis_with_this_workers_id(
    temporal_client, settings, redis, session_id
):
    worker = _worker(temporal_client, settings, redis)
    eviction: MovedRunEviction = worker.hermes_run_eviction
    pubsub = redis.pubsub()
    await pubsub.subscribe(CHANNEL)
    try:
        async with worker:
            await _hermes(temporal_client, settings, redis).send_message(session_id, "hello")
            run_id = (await temporal_client.get_workflow_handle(session_id).describe()).run_id

            async def announced() -> bool:
                message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=0.2)
                return message is not None and message["data"].decode() == f"{eviction.worker_id} {run_id}"

            await eventually(announced, what="the new run announced", timeout_seconds=30)
    finally:
        await pubsub.aclose()


class _SwallowingPubSub:
    """A real Redis pub/sub whose reads swallow a cancel, as redis-py's read timeout can
    on Python 3.11 when the cancel lands while the timeout expires (asyncio.timeout)."""

    def __init__(self, pubsub: Any) -> None:
        self._pubsub = pubsub
        self.swallowed = 0

    async def subscribe(self, *channels: str) -> None:
        await self._pubsub.subscribe(*channels)

    async def get_message(self, **kwargs: Any) -> Any:
        try:
            return await self._pubsub.get_message(**kwargs)
        except asyncio.CancelledError:
            self.swallowed += 1
            return None

    async def aclose(self) -> None:
        await self._pubsub.aclose()


class _SwallowingRedis:
    def __init__(self, redis: Any) -> None:
        self._redis = redis
        self.pubsubs: list[_SwallowingPubSub] = []

    def pubsub(self) -> _SwallowingPubSub:
        self.pubsubs.append(_SwallowingPubSub(self._redis.pubsub()))
        return self.pubsubs[-1]

    def __getattr__(self, name: str) -> Any:
        return getattr(self._redis, name)


async def test_a_listener_that_swallows_its_cancel_does_not_hold_the_workers_shutdown(
    temporal_client, settings, redis, session_id
):
    # CI once waited 570 s for a worker's shutdown: the run-taken listener went on
    # after its cancel. It also stops on a flag, and the shutdown waits for it at most
    # STOP_WAIT_SECONDS.
    swallowing = _SwallowingRedis(redis)
    worker = _worker(temporal_client, settings, redis)
    eviction = MovedRunEviction(worker, swallowing)
    assert eviction.install()  # over build_worker's own (which reads the real Redis)
    async with worker:
        await _hermes(temporal_client, settings, redis).send_message(session_id, "hello")
        await eventually(lambda: _subscribed(redis), what="the listener subscribed")
    # The shutdown returned (the per-test timeout fails this test otherwise), after
    # cancelling a read that swallowed the cancel.
    assert sum(p.swallowed for p in swallowing.pubsubs) >= 1
    assert eviction._stopping


def test_without_redis_or_workflows_nothing_is_hooked():
    class NoWorkflows:
        _workflow_worker = None

    assert not MovedRunEviction(NoWorkflows(), object()).install()
    assert not MovedRunEviction(NoWorkflows(), None).install()
    # A message for a run this worker does not have, or a malformed one, changes nothing.
    idle = MovedRunEviction(NoWorkflows(), object())
    assert not idle.on_message(b"other 01a2-run") and not idle.on_message(b"garbage")


# ------------------------------------------------- the deadlock bound of workflow code


@workflow.defn(sandboxed=False)
class SlowActivation:
    """One activation that holds the workflow thread for 3 s, as a starved thread on a
    loaded machine does (the SDK's own bound is 2 s)."""

    @workflow.run
    async def run(self) -> str:
        time.sleep(3.0)  # noqa: ASYNC251 - the point: a long activation, not an await
        return "done"


async def test_an_activation_slower_than_the_sdks_2_s_is_no_deadlock_under_the_workers_bound(
    temporal_client, settings, task_queue
):
    assert settings.workflow_deadlock_seconds == 8.0
    worker = Worker(
        temporal_client,
        task_queue=task_queue,
        workflows=[SlowActivation],
        workflow_runner=UnsandboxedWorkflowRunner(),
    )
    assert set_deadlock_timeout(worker, settings.workflow_deadlock_seconds)
    async with worker:
        handle = await temporal_client.start_workflow(
            SlowActivation.run, id=f"slow-{uuid.uuid4().hex[:8]}", task_queue=task_queue
        )
        assert await handle.result() == "done"
    failed = [
        e
        for e in (await handle.fetch_history()).events
        if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED
    ]
    assert failed == [], failed
