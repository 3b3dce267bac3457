"""What a worker does with the workflow runs it holds (issue 12): a stale copy of a
session's run leaves its cache once another worker takes the session (hermes.run_cache;
worker memory grew with every session of the deployment because each worker kept every
session it had ever served), and a slow activation on a loaded machine is not called a
deadlock (``Settings.workflow_deadlock_seconds``)."""

from __future__ import annotations

import time
import uuid
from typing import Any

from temporalio import workflow
from temporalio.api.enums.v1 import EventType
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from hermes.client import HermesClient
from hermes.durable import DurableStore
from hermes.providers.scripted import ScriptedModel
from hermes.run_cache import CHANNEL, MovedRunEviction
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
