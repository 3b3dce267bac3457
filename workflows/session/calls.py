"""The activities a session starts, each with its timeouts and retry policy.

Workflow code (it calls ``workflow.execute_activity`` and friends) but no decisions: the
session shell decides what to call and when; this module says how each call is made.
Changing an option here (a timeout, a retry policy) changes no command, so replay is
unaffected; changing which activity runs, or its order, needs ``workflow.patched()``.

Timeouts (DESIGN.md, tiered): local activities for cheap Redis writes and checks
(5-15 s); model calls ``SessionConfig.model_timeout_seconds`` with a heartbeat of
``model_heartbeat_seconds`` (issue 12: a call on a dead worker is retried in seconds).
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, FailureError, TimeoutError, TimeoutType

MOVE_TO_CURRENT_BUILD = workflow.ContinueAsNewVersioningBehavior.AUTO_UPGRADE
"""How a long-lived run (a session, a memory writer) continues as new: its next run starts
on the deployment's current build, not the build this run is pinned to, so an old build
drains as its runs roll over (README "Rolling deploys"). An unversioned worker's runs are
unaffected. A continue-as-new's options are not compared on replay: no patch."""

with workflow.unsafe.imports_passed_through():
    from hermes import names
    from hermes.infra import sinks
    from hermes.memory.models import ExtractMemoriesInput, ExtractMemoriesResult, ForgetReport, SearchMemoriesInput, SearchMemoriesResult
    from hermes.models import (
        ApprovalAuditBatch,
        ArchiveMessagesInput,
        CallModelInput,
        CallModelResult,
        CompositeInput,
        CountTokensInput,
        ListToolsInput,
        ListToolsResult,
        RunToolInput,
        SessionConfig,
        SessionIndexEntry,
        SnapshotInput,
        StoreBodiesInput,
        Summary,
        SummarizeInput,
        ToolResult,
        ToolSpec,
        ValidateToolCallResult,
    )

    from hermes.sessions.turn_start import BeginTurnInput, BeginTurnResult

    from workflows.session.turn import TurnCancelled
    from workflows.tool_calls import tool_activity_options

_MODEL_ERRORS_NOT_RETRIED = ["ModelRequestError", "ScriptExhaustedError", "ContextTooLongError"]

MODEL_REISSUES = 3
"""How many times a model step is started again after every attempt of it ended in a
heartbeat timeout (:func:`worker_lost`), each time with twice the heartbeat timeout
(1 s, then 2, 4 and 8 s by default). A dead worker is still noticed after the first,
short timeout; a live worker too busy to heartbeat in time (the issue 12 soak: one
worker left with 50 sessions on a loaded machine spent a step's five attempts in about
seven seconds, and the turn ended "could not answer") gets slower beats allowed instead
of the turn being lost. Provider errors end a step as before: they are not heartbeat
timeouts."""


def model_heartbeat(cfg: SessionConfig, reissue: int = 0) -> timedelta | None:
    """Heartbeat timeout of the model activities (calls, summaries, extraction): an
    attempt on a dead worker is retried after it. ``reissue``: how many times this
    model step was started again after :func:`worker_lost` (doubles the timeout each
    time, at most the call's start-to-close timeout). Only an activity option: the
    commands, and so replay, are the same with or without it."""
    if cfg.model_heartbeat_seconds <= 0:
        return None
    seconds = min(cfg.model_heartbeat_seconds * 2**reissue, max(cfg.model_timeout_seconds, cfg.model_heartbeat_seconds))
    return timedelta(seconds=seconds)


def worker_lost(err: ActivityError) -> bool:
    """Whether an activity's final failure is a heartbeat timeout: its last attempt's
    worker stopped reporting (dead, or too busy to heartbeat), not that the work failed."""
    return isinstance(err.cause, TimeoutError) and err.cause.type == TimeoutType.HEARTBEAT


async def list_tools(inp: ListToolsInput | None) -> ListToolsResult:
    """The worker's tools (a local activity: cached and bounded, 8 s per MCP server;
    it cannot heartbeat, and a regular activity would add three events and a server
    round trip to every turn). ``inp`` None: runs recorded before bounded-context sent
    no argument."""
    return await workflow.execute_local_activity(
        names.LIST_TOOLS,
        *([inp] if inp is not None else []),
        result_type=ListToolsResult,
        start_to_close_timeout=timedelta(seconds=10),
    )


async def begin_turn(inp: BeginTurnInput) -> BeginTurnResult:
    """The turn's tool listing and memory recall (a local activity, 15 s as the recall's,
    one attempt: on a failure the session lists and searches apart, as before)."""
    return await workflow.execute_local_activity(
        names.BEGIN_TURN,
        inp,
        result_type=BeginTurnResult,
        start_to_close_timeout=timedelta(seconds=15),
        retry_policy=RetryPolicy(maximum_attempts=1),
        summary="list tools, recall memories",
    )


async def count_tokens(text: str, encoding: str) -> int:
    """Exact tokens of a text too long to count in workflow code (a local activity,
    recorded, so a replay does not count it again)."""
    return await workflow.execute_local_activity(
        names.COUNT_TOKENS,
        CountTokensInput(text=text, encoding=encoding),
        result_type=int,
        start_to_close_timeout=timedelta(seconds=10),
        retry_policy=RetryPolicy(maximum_attempts=2),
        summary="count tokens",
    )


async def store_bodies(inp: StoreBodiesInput) -> bool:
    """Write the bodies a model call will read into the content store (a local activity:
    its input, the bodies, is not recorded in history, only its result).

    Returns:
        True when the store took them; False when it has no Redis, did not take them (the
        activity tries twice within 5 s) or the activity failed (logged): the call then
        carries them inline.
    """
    try:
        return await workflow.execute_local_activity(
            names.STORE_MESSAGE_BODIES,
            inp,
            result_type=bool,
            start_to_close_timeout=timedelta(seconds=10),
            # The activity retries the write itself; on anything else the bodies go inline.
            retry_policy=RetryPolicy(maximum_attempts=1),
            summary=f"store {len(inp.bodies)} bodies",
        )
    except FailureError:
        workflow.logger.warning("%d bodies not written to the content store; sent inline", len(inp.bodies), exc_info=True)
        return False


def start_model_call(
    cfg: SessionConfig, request: CallModelInput, turn: int, step: int, reissue: int = 0
) -> workflow.ActivityHandle[CallModelResult]:
    """Start one model step (``reissue``: the how-many-th time it is started again after
    :func:`worker_lost`; 0 the first time)."""
    return workflow.start_activity(
        names.CALL_MODEL,
        request,
        result_type=CallModelResult,
        start_to_close_timeout=timedelta(seconds=cfg.model_timeout_seconds),
        # A call on a worker that died is retried after seconds, not the timeout.
        heartbeat_timeout=model_heartbeat(cfg, reissue),
        retry_policy=RetryPolicy(
            # After a worker crash (a heartbeat timeout) this wait is part of the time to
            # the reply; a provider's failure sets its own longer wait
            # (activities.model.provider_retry_delay: 0.5 s doubling, Retry-After).
            initial_interval=timedelta(milliseconds=100),
            backoff_coefficient=2.0,
            maximum_interval=timedelta(seconds=30),
            maximum_attempts=cfg.model_max_attempts,
            non_retryable_error_types=_MODEL_ERRORS_NOT_RETRIED,
        ),
        summary=f"model, turn {turn}, step {step + 1}" + (f" (started again: {reissue})" if reissue else ""),
    )


async def summarize(cfg: SessionConfig, inp: SummarizeInput, *, summary: str) -> Summary:
    """Fold turns into the running summary (a model call)."""
    return await workflow.execute_activity(
        names.SUMMARIZE_CONTEXT,
        inp,
        result_type=Summary,
        start_to_close_timeout=timedelta(seconds=cfg.model_timeout_seconds),
        heartbeat_timeout=model_heartbeat(cfg),
        retry_policy=RetryPolicy(
            initial_interval=timedelta(seconds=1),
            maximum_interval=timedelta(seconds=30),
            maximum_attempts=3,
            non_retryable_error_types=_MODEL_ERRORS_NOT_RETRIED,
        ),
        summary=summary,
    )


async def search_memories(inp: SearchMemoriesInput) -> SearchMemoriesResult:
    """The user's memories for a message (a local activity, 15 s, two attempts)."""
    return await workflow.execute_local_activity(
        names.SEARCH_MEMORIES,
        inp,
        result_type=SearchMemoriesResult,
        start_to_close_timeout=timedelta(seconds=15),
        retry_policy=RetryPolicy(maximum_attempts=2),
        summary="recall memories",
    )


RECALL_RETRY_TIMEOUT = timedelta(seconds=60)
"""How long a recall searched again after its local search failed may take in all (three
attempts of at most 30 s each): the turn waits that long at most before it goes on without
memories, which a user sees as the agent forgetting."""


async def search_memories_again(inp: SearchMemoriesInput) -> SearchMemoriesResult:
    """The same search as a normal activity (any worker of the task queue may take it):
    at most ``RECALL_RETRY_TIMEOUT`` in all, attempts of 30 s. A search only reads, so it
    is safe to run again."""
    return await workflow.execute_activity(
        names.SEARCH_MEMORIES,
        inp,
        result_type=SearchMemoriesResult,
        start_to_close_timeout=timedelta(seconds=30),
        schedule_to_close_timeout=RECALL_RETRY_TIMEOUT,
        retry_policy=RetryPolicy(initial_interval=timedelta(seconds=1), maximum_attempts=3),
        summary="recall memories (again)",
    )


async def forget_user(cfg: SessionConfig, user_id: str) -> ForgetReport:
    """Delete every memory of ``user_id`` (and what still waits to be written)."""
    return await workflow.execute_activity(
        names.FORGET_USER_MEMORIES,
        user_id,
        result_type=ForgetReport,
        start_to_close_timeout=timedelta(seconds=60),
        heartbeat_timeout=model_heartbeat(cfg),
        retry_policy=RetryPolicy(maximum_attempts=3),
        summary="forget the user",
    )


async def extract_memories(cfg: SessionConfig, inp: ExtractMemoriesInput) -> ExtractMemoriesResult:
    """Deliver a turn's memory candidates (and run the model extraction): retried until
    delivered, since the candidates are in this input and nowhere else."""
    return await workflow.execute_activity(
        names.EXTRACT_MEMORIES,
        inp,
        result_type=ExtractMemoriesResult,
        start_to_close_timeout=timedelta(seconds=cfg.model_timeout_seconds + 30),
        heartbeat_timeout=model_heartbeat(cfg),
        retry_policy=RetryPolicy(initial_interval=timedelta(seconds=2), maximum_interval=timedelta(seconds=60)),
        summary=f"memories of turn {inp.turn} ({', '.join(inp.reasons) or 'rules'})",
    )


async def validate_tool_call(request: RunToolInput, name: str) -> ValidateToolCallResult:
    """Check a gated call's arguments before a human is asked (a local activity)."""
    return await workflow.execute_local_activity(
        names.VALIDATE_TOOL_CALL,
        request,
        result_type=ValidateToolCallResult,
        start_to_close_timeout=timedelta(seconds=10),
        retry_policy=RetryPolicy(maximum_attempts=3),
        summary=f"validate {name}",
    )


def start_tool(request: RunToolInput, spec: ToolSpec) -> workflow.ActivityHandle[ToolResult]:
    """Start a tool call, with its tier's timeouts and its idempotency's retries."""
    return workflow.start_activity(
        names.RUN_TOOL, request, result_type=ToolResult, summary=f"tool {request.tool_call.name}", **tool_activity_options(spec)
    )


async def run_composite(request: RunToolInput, spec: ToolSpec, specs: dict[str, ToolSpec]) -> ToolResult:
    """A composite tool: its steps in a child workflow, one per call."""
    steps = spec.composite or []
    return await workflow.execute_child_workflow(
        names.COMPOSITE_TOOL_WORKFLOW,
        CompositeInput(
            session_id=request.session_id,
            user_id=request.user_id,
            turn=request.turn,
            chain_id=request.chain_id,
            tool_call=request.tool_call,
            steps=steps,
            specs={s.tool: specs[s.tool] for s in steps if s.tool in specs},
        ),
        id=f"{request.session_id}/tool/{request.call_key}",
        result_type=ToolResult,
        static_summary=f"composite tool {spec.name}",
    )


EARLY_ARCHIVE_SECONDS = 10
"""Start-to-close timeout of the one attempt of an archive made before a reply: a store
that fails costs that reply at most this, and the run archives after it, with retries."""


async def archive_messages(inp: ArchiveMessagesInput, *, before_reply: bool = False) -> None:
    """Write a chunk of the transcript to the archive (by index: a retry rewrites it);
    ``before_reply``: once, within :data:`EARLY_ARCHIVE_SECONDS` (a reply waits on it)."""
    await workflow.execute_activity(
        names.ARCHIVE_MESSAGES,
        inp,
        start_to_close_timeout=timedelta(seconds=EARLY_ARCHIVE_SECONDS if before_reply else 30),
        retry_policy=RetryPolicy(maximum_attempts=1 if before_reply else 5),
        summary="archive transcript",
    )


async def save_snapshot(inp: SnapshotInput) -> None:
    """The archived session's final state (a few seconds at most: messages wait, busy,
    while the run drains)."""
    await workflow.execute_activity(
        names.SAVE_SNAPSHOT,
        inp,
        start_to_close_timeout=timedelta(seconds=30),
        retry_policy=RetryPolicy(maximum_interval=timedelta(seconds=2), maximum_attempts=3),
        summary="session snapshot",
    )


async def record_audit(batch: ApprovalAuditBatch) -> bool:
    """Write approval audit entries (a local activity); False after a final failure
    (logged: the state's decision list stays the record)."""
    try:
        await workflow.execute_local_activity(
            names.RECORD_APPROVAL_AUDIT,
            batch,
            start_to_close_timeout=timedelta(seconds=5),
            retry_policy=RetryPolicy(maximum_attempts=5),
            summary="approval audit",
        )
    except FailureError:
        workflow.logger.warning("approval audit: %d entries not written", len(batch.entries), exc_info=True)
        return False
    return True


def write_index(entry: SessionIndexEntry, *, by_sink: bool) -> asyncio.Task[None] | None:
    """Write the session index row ``entry``: through the worker's sink when the activation
    ends (``by_sink``: the run's ``index-through-sink`` patch; :mod:`hermes.infra.sinks`),
    else by a local activity, whose task is returned for the session to drain."""
    if not by_sink:
        return asyncio.create_task(cache_write(names.UPDATE_SESSION_INDEX, entry, summary="session index", attempts=3))
    if not sinks.emit(names.SESSION_INDEX_SINK, entry):
        workflow.logger.warning("session index row not written: this worker's workflow runner takes no sink calls")
    return None


async def cache_write(activity: str, arg: Any, *, summary: str, attempts: int) -> None:
    """A cheap, idempotent Redis write as a local activity (DESIGN.md: cache writes fit
    local activities). A final failure is logged, never fails the session (a local
    activity's final failure arrives as the ApplicationError itself, not wrapped in
    ActivityError)."""
    try:
        await workflow.execute_local_activity(
            activity,
            arg,
            start_to_close_timeout=timedelta(seconds=5),
            retry_policy=RetryPolicy(maximum_attempts=attempts),
            summary=summary,
        )
    except FailureError:
        workflow.logger.warning("%s failed", summary, exc_info=True)


async def cancellable(task: Any, cancelled: Any) -> Any:
    """Await ``task`` (an activity handle or task) unless ``cancelled()`` turns true
    first: then it is cancelled, awaited, and :class:`TurnCancelled` is raised."""
    await workflow.wait_condition(lambda: task.done() or cancelled())
    if not task.done():
        task.cancel()
        try:
            await task
        except BaseException:  # noqa: BLE001 - the turn is cancelled whatever the task did
            pass
        raise TurnCancelled()
    return await task
