"""The consolidation schedule: one owner, changed only by newer settings, runs bounded.

Every worker that starts calls :func:`ensure_consolidation_schedule`. Before issue 28
each one rewrote the global schedule, so the last worker to start won and a rolling
deploy flipped the schedule between the old and the new settings. Now the schedule's
action carries a stamp in its memo (:class:`ScheduleStamp`): the
``HERMES_MEMORY_CONSOLIDATION_SCHEDULE_VERSION`` its writer had and a hash of the
settings it was written from, and :func:`schedule_decision` lets a worker write it only
when the schedule is missing, unstamped, or stamped with a lower version. A settings hash
alone cannot say which of two settings is the newer one; the version can: the operator
raises it with the change, and workers still running the old settings (a lower version)
never write it back. Two workers with different settings at the same version leave the
schedule as the first wrote it and log a warning naming the setting to raise.

A run that hangs (a stuck activity, a store that does not answer) no longer blocks the
schedule for good under its overlap policy (skip): each run has a run timeout and an
execution timeout (``memory_consolidation_run_timeout_seconds`` /
``_execution_timeout_seconds``, by default 90% of the interval), after which Temporal
ends it and the next action starts.
"""

from __future__ import annotations

import hashlib
import json
import logging
import uuid
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Literal

from hermes import names
from hermes.settings import Settings

__all__ = ["ScheduleStamp", "consolidation_stamp", "ensure_consolidation_schedule", "schedule_decision"]

log = logging.getLogger("hermes.memory.schedule")

VERSION_MEMO_KEY = "hermes_schedule_version"
SETTINGS_MEMO_KEY = "hermes_schedule_settings_sha256"

Decision = Literal["create", "update", "keep", "keep-newer", "keep-conflict"]
"""What a worker does with the schedule: ``create`` it (missing), ``update`` it (unstamped
or an older version), ``keep`` it (same version and settings), ``keep-newer`` (a newer
version wrote it), ``keep-conflict`` (same version, other settings: warned)."""


@dataclass(frozen=True)
class ScheduleStamp:
    """Who wrote the schedule: the schedule version of its writer and its settings' hash."""

    version: int
    """``memory_consolidation_schedule_version`` of the writer (1, 2, ...)."""
    settings_sha256: str
    """Hex SHA-256 of the schedule's settings (:func:`consolidation_stamp`)."""


def schedule_decision(current: ScheduleStamp | None, mine: ScheduleStamp, *, exists: bool = True) -> Decision:
    """What a worker with stamp ``mine`` does with a schedule stamped ``current``.

    Args:
        current: the stamp in the schedule's memo; None when the schedule has none (one
            written before stamps, or by hand) or does not exist.
        mine: this worker's stamp.
        exists: whether the schedule exists.

    Returns:
        A :data:`Decision`; only ``create`` and ``update`` write the schedule.
    """
    if not exists:
        return "create"
    if current is None or current.version < mine.version:
        return "update"
    if current.version > mine.version:
        return "keep-newer"
    return "keep" if current.settings_sha256 == mine.settings_sha256 else "keep-conflict"


def consolidation_timeouts(settings: Settings) -> tuple[timedelta, timedelta]:
    """The (run, execution) timeouts of one scheduled consolidation: the settings, or 90%
    of the interval (so a run that hits them ends before the next action is due)."""
    execution = settings.memory_consolidation_execution_timeout_seconds
    if execution is None:
        execution = 0.9 * settings.memory_consolidation_every_seconds
    run = settings.memory_consolidation_run_timeout_seconds
    if run is None or run > execution:
        run = execution
    return timedelta(seconds=run), timedelta(seconds=execution)


def consolidation_stamp(settings: Settings, task_queue: str) -> ScheduleStamp:
    """This worker's stamp: its schedule version and the hash of everything the schedule
    is made of (interval, timeouts, task queue, the consolidation input's settings)."""
    run, execution = consolidation_timeouts(settings)
    made_of = {
        "every_seconds": settings.memory_consolidation_every_seconds,
        "run_timeout_seconds": run.total_seconds(),
        "execution_timeout_seconds": execution.total_seconds(),
        "task_queue": task_queue,
        "archive_after_days": settings.archive_after_days,
        "heartbeat_seconds": settings.memory_heartbeat_seconds,
        "max_judge_calls": settings.resolved_memory_judge_max_calls,
    }
    digest = hashlib.sha256(json.dumps(made_of, sort_keys=True).encode()).hexdigest()
    return ScheduleStamp(settings.memory_consolidation_schedule_version, digest)


def _schedule(settings: Settings, task_queue: str, stamp: ScheduleStamp, schedule_id: str, state: Any = None) -> Any:
    from temporalio.client import (
        Schedule,
        ScheduleActionStartWorkflow,
        ScheduleIntervalSpec,
        ScheduleOverlapPolicy,
        SchedulePolicy,
        ScheduleSpec,
        ScheduleState,
    )

    from hermes.memory.models import ConsolidationInput
    from hermes.security import command_auth

    run_timeout, execution_timeout = consolidation_timeouts(settings)
    return Schedule(
        action=ScheduleActionStartWorkflow(
            names.MEMORY_CONSOLIDATION_WORKFLOW,
            # Signed once, good at any age: the schedule starts every run with this input
            # (signed again whenever a worker writes the schedule).
            command_auth.signed(
                ConsolidationInput(
                    archive_after_days=settings.archive_after_days, heartbeat_seconds=settings.memory_heartbeat_seconds,
                    max_judge_calls=settings.resolved_memory_judge_max_calls,
                ),
                names.START_CONSOLIDATION, names.CONSOLIDATION_TARGET, sender="hermes-worker", roles=["admin"],
            ),
            id=f"{schedule_id}-run",
            task_queue=task_queue,
            run_timeout=run_timeout,
            execution_timeout=execution_timeout,
            memo={VERSION_MEMO_KEY: stamp.version, SETTINGS_MEMO_KEY: stamp.settings_sha256},
        ),
        spec=ScheduleSpec(intervals=[ScheduleIntervalSpec(every=timedelta(seconds=settings.memory_consolidation_every_seconds))]),
        policy=SchedulePolicy(overlap=ScheduleOverlapPolicy.SKIP),
        state=state or ScheduleState(),
    )


async def _current(client: Any, schedule_id: str) -> tuple[bool, ScheduleStamp | None, Any, bytes]:
    """(exists, its stamp, its state, its conflict token) as the server has them now."""
    from temporalio.api.workflowservice.v1 import DescribeScheduleRequest
    from temporalio.client import ScheduleState
    from temporalio.service import RPCError, RPCStatusCode

    try:
        raw = await client.workflow_service.describe_schedule(
            DescribeScheduleRequest(namespace=client.namespace, schedule_id=schedule_id), retry=True
        )
    except RPCError as err:
        if err.status == RPCStatusCode.NOT_FOUND:
            return False, None, None, b""
        raise
    state = ScheduleState(paused=raw.schedule.state.paused, note=raw.schedule.state.notes or None)
    fields = raw.schedule.action.start_workflow.memo.fields
    stamp = None
    if VERSION_MEMO_KEY in fields and SETTINGS_MEMO_KEY in fields:
        # Decoded with the client's converter: the memo is encrypted when payloads are.
        try:
            version, digest = await client.data_converter.decode([fields[VERSION_MEMO_KEY], fields[SETTINGS_MEMO_KEY]])
            stamp = ScheduleStamp(int(version), str(digest))
        except Exception:  # noqa: BLE001 - a key this worker lacks, a foreign memo: as unstamped
            log.warning("the consolidation schedule's stamp cannot be read; treated as unstamped", exc_info=True)
    return True, stamp, state, raw.conflict_token


WRITE_ATTEMPTS = 5
"""How many times a worker reads, decides and writes the schedule before it gives up
(another worker created or updated it in between)."""


async def ensure_consolidation_schedule(
    client: Any,
    settings: Settings,
    *,
    task_queue: str | None = None,
    schedule_id: str = names.MEMORY_CONSOLIDATION_SCHEDULE,
) -> str:
    """Create the Temporal Schedule that runs the consolidation every
    ``memory_consolidation_every_seconds`` (hourly, overlap skipped, each run bounded by
    :func:`consolidation_timeouts`), or update it when this worker's
    ``memory_consolidation_schedule_version`` is higher than the one that wrote it (see
    the module docstring); otherwise leave it. An update keeps the schedule paused if an
    operator paused it, and is conditional on the schedule not having changed since it was
    read (Temporal's conflict token), so two workers starting at once cannot undo each
    other.

    Args:
        client: a connected Temporal client.
        settings: the consolidation settings.
        task_queue: where its runs go; default ``settings.task_queue``.
        schedule_id: default :data:`hermes.names.MEMORY_CONSOLIDATION_SCHEDULE` (tests use
            their own).

    Returns:
        The schedule id.

    Raises:
        temporalio.service.RPCError: Temporal refused or could not be reached.
    """
    from temporalio.api.workflowservice.v1 import UpdateScheduleRequest
    from temporalio.client import ScheduleAlreadyRunningError

    queue = task_queue or settings.task_queue
    mine = consolidation_stamp(settings, queue)
    for _ in range(WRITE_ATTEMPTS):
        exists, current, state, token = await _current(client, schedule_id)
        decision = schedule_decision(current, mine, exists=exists)
        if decision == "keep-newer":
            log.info("consolidation schedule left as is: written by schedule version %s (this worker's: %s)",
                     current.version if current else "?", mine.version)
            return schedule_id
        if decision == "keep-conflict":
            log.warning(
                "the consolidation schedule was written with other settings at the same "
                "HERMES_MEMORY_CONSOLIDATION_SCHEDULE_VERSION (%s); left as is. To change it, raise "
                "HERMES_MEMORY_CONSOLIDATION_SCHEDULE_VERSION with the new settings", mine.version)
            return schedule_id
        if decision == "keep":
            return schedule_id
        schedule = _schedule(settings, queue, mine, schedule_id, state)
        if decision == "create":
            try:
                await client.create_schedule(schedule_id, schedule)
                return schedule_id
            except ScheduleAlreadyRunningError:
                continue  # another worker made it meanwhile: decide again on what it wrote
        # The SDK's ScheduleHandle.update sends no conflict token; the request does.
        await client.workflow_service.update_schedule(
            UpdateScheduleRequest(
                namespace=client.namespace, schedule_id=schedule_id, schedule=await schedule._to_proto(client),
                conflict_token=token, identity=client.identity, request_id=str(uuid.uuid4()),
            ),
            retry=True,
        )
        # A stale token makes the server drop the update without an error: read it back.
        _, written, _, _ = await _current(client, schedule_id)
        if written == mine:
            log.info("consolidation schedule updated to schedule version %s", mine.version)
            return schedule_id
    log.warning("consolidation schedule not written after %d attempts: other workers kept changing it", WRITE_ATTEMPTS)
    return schedule_id
