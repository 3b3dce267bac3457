"""Repair a session whose history the worker cannot replay because of where an update was
accepted (issue 31: a starved session stuck on "Acceptance while in state Accepted").

What happened (``tests/histories/poisoned/overload_stuck_session.json``): on a starved
worker, a query of session ``s`` reached the worker as a legacy query task that carried new
history (a model call that had timed out). SDK Core applied it: the turn's code ran on and
made its next command (the model call started again) without sending it. Minutes later the
real workflow task came with a new message (an update) in it, and the worker sent both: the
history holds, inside one workflow task, ``ActivityTaskScheduled`` *then*
``WorkflowExecutionUpdateAccepted``. Replaying that task, Core gives the activity's result
and the update to the workflow in one activation, the Python SDK accepts the update first,
and the commands no longer match the history: ``Nondeterminism error: Update machine does
not handle this event: HistoryEvent(id: 49, ActivityTaskScheduled)``. Every later workflow
task that replays the history (a cache eviction, a new worker, the retry of a failed task)
fails; the first failure seen was the server refusing a second acceptance of that update.
The session takes no message again. No workflow code can prevent it (the acceptance is the
SDK's command, sent before the handler runs), so this module mends such a session.

The mend is Temporal's own for a workflow task that cannot complete: a reset to the
completion of the task whose commands do not replay (:class:`ResetPoint`). The new run
keeps the history before it, and the server adds the updates and signals that came after
it again (``WorkflowExecutionUpdateAdmitted``), where every replay sees them in the same
place; the turn then goes on from there (the model step recorded after the reset point is
made again: one more provider call). A client waiting for the message's reply gets an error
and sends it again under the same client message id, which the session answers once.

Which sessions: those whose history, replayed against the workflow code, fails with a
nondeterminism error that names an update (:func:`find_update_order_split`). A history that
fails to replay for another reason (workflow code changed without ``workflow.patched``) is
not reset: redoing its tasks would not mend it.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from temporalio.api.common.v1 import WorkflowExecution
from temporalio.api.enums.v1 import EventType
from temporalio.api.workflowservice.v1 import ResetWorkflowExecutionRequest
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.converter import DataConverter
from temporalio.worker import Replayer

__all__ = ["RepairResult", "ResetPoint", "find_update_order_split", "repair_session"]

_FAILING_EVENT = re.compile(r"HistoryEvent\(id: (\d+), (\w+)\)")
_UPDATE_NAMED = ("Update machine", "WorkflowExecutionUpdateAccepted", "update response", "UpdateResponse")


@dataclass(frozen=True)
class ResetPoint:
    """Where a session's history stops replaying, and where a reset mends it."""

    workflow_task_completed_event_id: int
    """The ``WorkflowTaskCompleted`` event of the task whose commands do not replay: the
    reset's ``workflow_task_finish_event_id`` (the new run keeps the events before it)."""
    failing_event_id: int
    """The event the replay could not match."""
    replay_error: str
    """The replay's nondeterminism error, as the SDK words it."""


@dataclass(frozen=True)
class RepairResult:
    """What :func:`repair_session` did."""

    session_id: str
    reset: bool
    """True when the session was reset (``new_run_id`` is then its new run)."""
    reason: str
    """Why it was or was not reset, for a person."""
    reset_point: ResetPoint | None = None
    new_run_id: str | None = None


async def find_update_order_split(
    history: WorkflowHistory, workflows: Sequence[type], *, data_converter: DataConverter = pydantic_data_converter
) -> ResetPoint | None:
    """Replay ``history`` against ``workflows``; where it fails on an update's place, the
    reset point that mends it.

    Args:
        history: A session's history (``WorkflowHandle.fetch_history``), complete or ending
            in a workflow task that keeps failing.
        workflows: The workflow classes a worker registers (``[SessionWorkflow]``); the
            process must have activated the command key ring the workers verify with
            (:func:`hermes.security.command_auth.activate`), or a start proof is refused on
            replay and the history looks broken for another reason.
        data_converter: The workers' converter.

    Returns:
        None when the history replays, or fails for another reason; else the reset point:
        the last ``WorkflowTaskCompleted`` before the event the replay could not match,
        checked to replay cleanly up to there.
    """
    replayer = Replayer(workflows=list(workflows), data_converter=data_converter)
    result = await replayer.replay_workflow(history, raise_on_replay_failure=False)
    failure = result.replay_failure
    if failure is None:
        return None
    message = str(failure)
    found = _FAILING_EVENT.search(message)
    if "Nondeterminism" not in message or found is None or not any(name in message for name in _UPDATE_NAMED):
        return None
    failing = int(found.group(1))
    completed = [
        e.event_id for e in history.events
        if e.event_id < failing and e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED
    ]
    if not completed:
        return None
    point = completed[-1]
    # The new run keeps the events before the reset point: they must replay, or the reset
    # would leave the session as stuck as before.
    prefix = WorkflowHistory(history.workflow_id, [e for e in history.events if e.event_id < point])
    if (await replayer.replay_workflow(prefix, raise_on_replay_failure=False)).replay_failure is not None:
        return None
    return ResetPoint(workflow_task_completed_event_id=point, failing_event_id=failing, replay_error=message)


Finder = Callable[..., Awaitable["ResetPoint | None"]]
"""How :func:`repair_session` finds the reset point: ``(history, workflows, *, data_converter)``."""


async def repair_session(
    client: Client, session_id: str, workflows: Sequence[type], *, find: Finder | None = None
) -> RepairResult:
    """Reset session ``session_id`` when its history cannot be replayed because of where an
    update was accepted (:func:`find_update_order_split`); otherwise change nothing.

    Safe to run on any session and more than once: the reset's request id is derived from
    the run and the reset point, so two repairs of one stuck run reset it once.

    Args:
        client: A client of the sessions' namespace.
        session_id: The session (its workflow id).
        workflows: As :func:`find_update_order_split`.
        find: The finder (:func:`find_update_order_split` when None; a test gives another).

    Returns:
        What was done and why.

    Raises:
        temporalio.service.RPCError: Temporal refused the describe, the history or the
            reset (not found, permission denied, unavailable).
    """
    handle = client.get_workflow_handle(session_id)
    description = await handle.describe()
    if description.status != WorkflowExecutionStatus.RUNNING:
        return RepairResult(session_id, False, "the session's run is not running; nothing to repair")
    run = client.get_workflow_handle(session_id, run_id=description.run_id)
    finder = find if find is not None else find_update_order_split
    point = await finder(await run.fetch_history(), workflows, data_converter=client.data_converter)
    if point is None:
        return RepairResult(session_id, False, "the session's history replays (or fails for a reason a reset does not mend)")
    response = await client.workflow_service.reset_workflow_execution(
        ResetWorkflowExecutionRequest(
            namespace=client.namespace,
            workflow_execution=WorkflowExecution(workflow_id=session_id, run_id=description.run_id),
            reason=f"hermes repair: an update accepted out of replay order (event {point.failing_event_id})",
            workflow_task_finish_event_id=point.workflow_task_completed_event_id,
            request_id=str(uuid.uuid5(uuid.NAMESPACE_URL, f"hermes-repair/{description.run_id}/{point.workflow_task_completed_event_id}")),
            identity=client.identity,
        )
    )
    return RepairResult(
        session_id, True,
        f"reset to workflow task {point.workflow_task_completed_event_id}: its commands did not replay at event "
        f"{point.failing_event_id}; later messages and decisions were added again",
        point, response.run_id,
    )
