"""The consolidation schedule has one owner and bounded runs (issue 28, item 5).

Workers with other settings do not flip the schedule; only a higher
``memory_consolidation_schedule_version`` changes it; a run that hangs ends at its run
timeout and the schedule's next action runs. Real Temporal dev server; the consolidation
activity that hangs is this test's own, declared under the real activity's name.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from datetime import timedelta
from typing import Any

import pytest
from temporalio import activity
from temporalio.client import Client, ScheduleActionStartWorkflow, WorkflowExecutionStatus
from temporalio.worker import Worker

from hermes import names
from hermes.security import command_auth
from hermes.memory.models import ConsolidationInput
from hermes.memory.schedule import ScheduleStamp, consolidation_stamp, ensure_consolidation_schedule, schedule_decision
from hermes.settings import Settings
from tests.support import eventually
from workflows.memory import MemoryConsolidationWorkflow


def test_only_a_missing_unstamped_or_lower_version_schedule_is_written() -> None:
    mine = ScheduleStamp(2, "aaa")
    assert schedule_decision(None, mine, exists=False) == "create"
    assert schedule_decision(None, mine) == "update"  # written before stamps
    assert schedule_decision(ScheduleStamp(1, "bbb"), mine) == "update"
    assert schedule_decision(ScheduleStamp(2, "aaa"), mine) == "keep"
    assert schedule_decision(ScheduleStamp(2, "bbb"), mine) == "keep-conflict"
    assert schedule_decision(ScheduleStamp(3, "bbb"), mine) == "keep-newer"


def test_the_run_timeouts_default_to_most_of_the_interval_and_enter_the_stamp() -> None:
    settings = Settings(_env_file=None, memory_consolidation_every_seconds=3600)
    other = settings.model_copy(update={"memory_consolidation_run_timeout_seconds": 60.0})
    assert consolidation_stamp(settings, "q").settings_sha256 != consolidation_stamp(other, "q").settings_sha256
    assert consolidation_stamp(settings, "q") == consolidation_stamp(settings.model_copy(), "q")


async def _interval_and_stamp(client: Client, schedule_id: str) -> tuple[timedelta, int]:
    description = await client.get_schedule_handle(schedule_id).describe()
    action = description.schedule.action
    assert isinstance(action, ScheduleActionStartWorkflow)
    assert action.memo is not None
    version = client.data_converter.payload_converter.from_payload(action.memo["hermes_schedule_version"])
    return description.schedule.spec.intervals[0].every, version


@pytest.mark.timeout(120)
async def test_workers_with_other_settings_never_flip_the_schedule_and_a_higher_version_changes_it(
    temporal_client: Client, settings: Settings
) -> None:
    schedule_id = f"consolidation-{uuid.uuid4()}"
    base = settings.memory_consolidation_schedule_version
    old = settings.model_copy(update={"memory_consolidation_every_seconds": 1800.0})
    new = settings.model_copy(update={"memory_consolidation_every_seconds": 900.0, "memory_consolidation_schedule_version": base + 1})
    same_version_other = old.model_copy(update={"memory_consolidation_every_seconds": 600.0})
    handle = temporal_client.get_schedule_handle(schedule_id)
    try:
        await ensure_consolidation_schedule(temporal_client, old, schedule_id=schedule_id)
        await ensure_consolidation_schedule(temporal_client, same_version_other, schedule_id=schedule_id)
        assert await _interval_and_stamp(temporal_client, schedule_id) == (timedelta(seconds=1800), base)
        # A rolling deploy: new and old workers start in turns; the new settings stay.
        for worker_settings in (new, old, new, old, old):
            await ensure_consolidation_schedule(temporal_client, worker_settings, schedule_id=schedule_id)
            assert await _interval_and_stamp(temporal_client, schedule_id) == (timedelta(seconds=900), base + 1)
        await handle.pause(note="paused by an operator")
        newest = new.model_copy(update={"memory_consolidation_every_seconds": 300.0, "memory_consolidation_schedule_version": base + 2})
        await ensure_consolidation_schedule(temporal_client, newest, schedule_id=schedule_id)
        assert await _interval_and_stamp(temporal_client, schedule_id) == (timedelta(seconds=300), base + 2)
        description = await handle.describe()
        assert description.schedule.state.paused  # an update does not unpause it
        action = description.schedule.action
        assert isinstance(action, ScheduleActionStartWorkflow)
        assert action.run_timeout == action.execution_timeout == timedelta(seconds=270)
    finally:
        await handle.delete()


@pytest.mark.timeout(120)
async def test_an_upgraded_worker_rewrites_the_schedule_with_the_memory_heartbeat(
    temporal_client: Client, settings: Settings
) -> None:
    """The schedule's input carried the model calls' heartbeat (1 s) at version 1; a worker
    with ``memory_heartbeat_seconds`` has the default version 2, so it writes the schedule
    once (found by a break-it review: at the same version it only warned, and the runs
    kept 1 s), and a worker of the previous build leaves it alone."""
    schedule_id = f"consolidation-{uuid.uuid4()}"
    previous_build = settings.model_copy(
        update={"memory_heartbeat_seconds": settings.model_heartbeat_seconds, "memory_consolidation_schedule_version": 1}
    )
    handle = temporal_client.get_schedule_handle(schedule_id)

    async def heartbeat_seconds() -> float:
        action = (await handle.describe()).schedule.action
        assert isinstance(action, ScheduleActionStartWorkflow)
        [inp] = await temporal_client.data_converter.decode(action.args, [ConsolidationInput])
        return inp.heartbeat_seconds

    try:
        await ensure_consolidation_schedule(temporal_client, previous_build, schedule_id=schedule_id)
        assert await heartbeat_seconds() == settings.model_heartbeat_seconds
        for worker_settings in (settings, previous_build):  # the upgrade, then an old worker restarting
            await ensure_consolidation_schedule(temporal_client, worker_settings, schedule_id=schedule_id)
            assert await heartbeat_seconds() == settings.memory_heartbeat_seconds == 10
    finally:
        await handle.delete()


@pytest.mark.timeout(180)
async def test_a_stuck_consolidation_run_ends_at_its_run_timeout_and_the_next_scheduled_run_starts(
    temporal_client: Client, settings: Settings
) -> None:
    release = asyncio.Event()
    started: list[str] = []

    @activity.defn(name=names.LIST_MEMORY_USERS)
    async def stuck_list_memory_users() -> list[str]:
        started.append(activity.info().workflow_id or "")
        while not release.is_set():  # a store that never answers, on a worker that is alive
            activity.heartbeat()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(release.wait(), 0.2)
        return []

    command_auth.ensure(settings)  # the ring the workflow checks the schedule's proof with
    schedule_id = f"consolidation-{uuid.uuid4()}"
    bounded = settings.model_copy(
        update={"memory_consolidation_run_timeout_seconds": 3.0, "memory_consolidation_execution_timeout_seconds": 3.0}
    )
    handle = temporal_client.get_schedule_handle(schedule_id)
    worker = Worker(
        temporal_client, task_queue=settings.task_queue, workflows=[MemoryConsolidationWorkflow],
        activities=[stuck_list_memory_users],
    )
    try:
        async with worker:
            await ensure_consolidation_schedule(temporal_client, bounded, schedule_id=schedule_id)
            await handle.trigger()

            async def runs() -> list[Any]:
                description = await handle.describe()
                return [a.action for a in description.info.recent_actions]

            [first] = await eventually(runs, what="the first scheduled run")
            first_handle = temporal_client.get_workflow_handle(first.workflow_id, run_id=first.first_execution_run_id)

            async def timed_out() -> bool:
                return (await first_handle.describe()).status == WorkflowExecutionStatus.TIMED_OUT

            await eventually(timed_out, what="the stuck run's timeout", timeout_seconds=60)
            await handle.trigger()  # the next action: not skipped as an overlap any more
            actions = await eventually(lambda: _at_least(runs, 2), what="the next scheduled run")
            second = temporal_client.get_workflow_handle(actions[1].workflow_id, run_id=actions[1].first_execution_run_id)
            assert actions[1].workflow_id != first.workflow_id
            await eventually(lambda: _started(started, actions[1].workflow_id), what="the next run's activity")
            assert (await second.describe()).status == WorkflowExecutionStatus.RUNNING
            release.set()
    finally:
        release.set()
        await handle.delete()


async def _at_least(probe: Any, count: int) -> list[Any] | None:
    found = await probe()
    return found if len(found) >= count else None


async def _started(started: list[str], workflow_id: str) -> bool:
    return workflow_id in started
