"""SessionWorkflow: one durable conversation per ``session_id``.

User turns arrive as the ``send_message`` update and run one at a time in arrival
order; approvals, cancel, system-prompt changes and close are signals; state,
transcript, pending approvals and trace are queries. Each turn is the agent loop:
model call -> tool calls -> tool results -> model, until a final answer or
``max_iterations``. The workflow continues as new (carrying its state) when Temporal
suggests it or after ``max_updates_per_run`` messages, only when no handler is running.
"""

from __future__ import annotations

import asyncio
import json
from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError, ChildWorkflowError, FailureError

with workflow.unsafe.imports_passed_through():
    import hashlib

    from hermes import names
    from hermes.models import (
        ApprovalAuditBatch,
        CountTokensInput,
        ApprovalAuditEntry,
        ApprovalDecision,
        ApprovalPolicy,
        CompositeInput,
        ArchiveMessagesInput,
        CallModelInput,
        CallModelResult,
        DecisionRecord,
        ListToolsInput,
        ListToolsResult,
        Message,
        PendingApproval,
        RunToolInput,
        SendMessageInput,
        SessionCarry,
        SessionIndexEntry,
        SessionInput,
        SessionState,
        SnapshotInput,
        Summary,
        SummarizeInput,
        ToolCall,
        ToolCallRecord,
        ToolResult,
        ToolResultCode,
        ToolSpec,
        TraceStep,
        TurnResult,
        ValidateToolCallResult,
    )
    from hermes.blobs import body_json, message_ref, value_ref
    from hermes.memory.models import (
        ConversationExcerpt,
        ExtractMemoriesInput,
        ExtractMemoriesResult,
        ForgetReport,
        MemoryCandidate,
        SearchMemoriesInput,
        SearchMemoriesResult,
    )
    from hermes.memory.rules import Triggers, detect_triggers, extract_by_rules
    from hermes.memory.working import REFERENCE_SCAN_CHARS, add_items, items_from_tool_result, note_references
    from hermes.context import BuiltContext, ContextOverBudget, ContextPolicy, build_context
    from hermes.tokens import BOUNDED_COUNT_CHARS, DEFAULT_ENCODING, BoundedCounter, TokenCounter, usage_correction
    from hermes.tools.arguments import argument_descriptions
    from hermes.tools.routing import offered_tools, route_groups

    from workflows.tool_calls import failure_text, result_from_failure, tool_activity_options

    # Loaded here, outside the sandbox: tiktoken finds its encodings by importing plugin
    # modules and takes locks, which workflow code may not do.
    TokenCounter.get(DEFAULT_ENCODING)

_MAX_TRACE = 100
"""Trace steps a run holds (and carries): the newest, about 30 turns of them. Every cached
session holds its state in the worker's memory (issue 12: resident state, not history, is
what a worker's memory grows with), so what it keeps for inspection stays small."""
_MAX_DECISIONS = 200
_MAX_SETTLED = 1000
_MAX_RESULT_CHARS = 16_000
"""Largest tool-result text handed back to the model (the full result stays in the record)."""


class _TurnCancelled(Exception):
    pass


class _ContextTooLarge(Exception):
    pass


_ARCHIVE_CHUNK_BYTES = 1_000_000
_MAX_CARRY_PAYLOAD_BYTES = 1_800_000
"""Continue-as-new is not attempted with a larger state: Temporal refuses inputs over 2 MB."""
_MAX_CACHED_RESULT_BYTES = 64_000
_MAX_CACHE_BYTES = 128_000
"""Byte budget of the replies kept for resends (with ``SessionConfig.max_completed_ids``):
held in memory by every cached session and carried across continue-as-new."""


def _json_bytes(value: Any) -> int:
    return len(json.dumps(value, ensure_ascii=False).encode("utf-8", "surrogatepass"))


def _message_bytes(m: Message) -> int:
    """Serialized size of a message in bytes, as JSON with its escapes (a control
    character takes 6 bytes), since payload limits apply to the JSON."""
    size = 160 + _json_bytes(m.content or "") + (_json_bytes(m.reasoning) if m.reasoning else 0)
    for call in m.tool_calls:
        size += 160 + _json_bytes(call.name) + _json_bytes(call.arguments) + _json_bytes(call.tool_call_id)
    return size


class _ModelFailed(Exception):
    pass


class _SessionClosedMidTurn(Exception):
    pass


class _ArgumentsExhausted(Exception):
    def __init__(self, call: ToolCall, result: ToolResult, spec: ToolSpec | None):
        self.call, self.result, self.spec = call, result, spec
        super().__init__(result.message)


_MAX_TURN_RESULT_BYTES = 1_000_000
"""A reply is an update result: under Temporal's 2 MB payload limit whatever the turn did."""


def _slim(result: TurnResult, limit: int, *, cut_reply: bool = True) -> TurnResult:
    """``result`` within ``limit`` bytes of JSON: first the tool calls' arguments and
    data are left out (their code and message stay; the transcript has them), then the
    messages are cut, then (``cut_reply``) the reply."""
    if len(result.model_dump_json()) <= limit:
        return result
    note = "tool-call arguments and data were left out of this reply for its size; the transcript has them"
    slim = result.model_copy(
        update={
            "tool_calls": [
                r.model_copy(update={"arguments": {}, "result": r.result.model_copy(update={"data": None})})
                for r in result.tool_calls
            ],
            "warnings": [*result.warnings, note],
        }
    )
    if len(slim.model_dump_json()) <= limit:
        return slim
    slim.tool_calls = [
        r.model_copy(update={"result": r.result.model_copy(update={"message": r.result.message[:200]})})
        for r in slim.tool_calls
    ]
    slim.warnings = [w[:2000] for w in slim.warnings[-20:]]
    if cut_reply and len(slim.model_dump_json()) > limit:
        slim.reply = slim.reply[: limit // 8] + " [reply cut for its size; the transcript has it whole]"
    return slim


def _fingerprint(call: ToolCall) -> str:
    """Identity of a call by tool and arguments, to recognise the same call again."""
    identity = [call.name, call.arguments] + ([call.arguments_ref] if call.arguments_ref else [])
    text = json.dumps(identity, sort_keys=True, ensure_ascii=False, default=str)
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:32]


_MAX_UNKNOWN = 200
_PATCH_AUDIT_LOG = "approval-audit-log"
"""Approval requests, decisions and verdicts are also written to the audit log in Redis."""
_PATCH_STOP_ON_CLOSE = "stop-turn-on-close"
"""A close signal stops the running turn at the next tool call or model step."""
_PATCH_TOOL_LAYER_V2 = "tool-layer-v2"
"""Checks a gated call before asking, and asks for a whole step's approvals at once."""
_SUMMARY_GRACE = timedelta(seconds=5)
"""How long continue-as-new, close or archive wait for a running summary before cancelling it."""
_PATCH_BOUNDED_CONTEXT = "bounded-context"
"""Token-budgeted layered context, running summaries, forced compaction, idle and
archive timers, and the history-size budget (issue 5)."""
_PATCH_MEMORY = "long-term-memory"
"""Memories recalled before a turn's model calls and written after its reply, working
memory, "forget me" (issue 6)."""
_PATCH_BOUNDED_WORK = "bounded-workflow-work"
"""Workflow code does only bounded work and a run replays in bounded time (issue 12):
tokens of replies, tool schemas and long user messages are counted by activities, other
texts by :class:`hermes.tokens.BoundedCounter`; the run continues as new on a replay
budget (``SessionConfig.replay_budget_events``)."""
_PATCH_ARCHIVE_SUMMARIZED = "archive-summarized-turns"
"""At continue-as-new, turns the running summary covers go to the transcript archive
(they are no longer in any context), so a long session's state stays about
``context_history_turns`` plus one run of turns, not up to ``max_carry_bytes`` (issue 12:
a worker's memory grows with what its cached sessions hold)."""
_PATCHES = (
    _PATCH_TOOL_LAYER_V2,
    _PATCH_STOP_ON_CLOSE,
    _PATCH_AUDIT_LOG,
    _PATCH_BOUNDED_CONTEXT,
    _PATCH_MEMORY,
    _PATCH_BOUNDED_WORK,
    _PATCH_ARCHIVE_SUMMARIZED,
)
_EXTRACTION_GRACE = timedelta(0)
"""Continue-as-new does not wait for a running memory extraction: it is carried over to the
next run, which sends it again (a candidate delivered twice is written once), so messages
are never held up by a model call they do not need."""
_EXTRACTION_GRACE_FINAL = timedelta(seconds=60)
"""How long close and archive wait for memory extractions (the run ends after)."""


@workflow.defn(name=names.SESSION_WORKFLOW)
class SessionWorkflow:
    @workflow.init
    def __init__(self, inp: SessionInput) -> None:
        carry = inp.carry or SessionCarry()
        self._inp = inp
        self._cfg = inp.config
        self._messages: list[Message] = list(carry.messages)
        self._turn_count = carry.turn_count
        self._created_at = carry.created_at or workflow.now()
        self._last_active_at = carry.last_active_at or self._created_at
        self._token_estimate = carry.token_estimate
        self._completed: dict[str, TurnResult] = dict(carry.completed)
        self._answered: dict[str, int] = dict(carry.answered_ids)
        self._trace: list[TraceStep] = list(carry.trace)
        self._decisions: list[DecisionRecord] = list(carry.decisions)
        self._settled: list[str] = list(carry.settled_tool_call_ids)
        self._title = carry.title
        self._run_index = carry.run_index
        self._system_prompt = carry.system_prompt or self._cfg.system_prompt
        self._archived = carry.archived_messages
        self._chain_id = carry.chain_id or workflow.info().first_execution_run_id
        self._live_bytes = sum(_message_bytes(m) for m in self._messages)
        """Size of the transcript held in the state, kept up to date once per turn."""
        self._notices: list[str] = list(carry.notices)
        self._unknown: dict[str, str] = dict(carry.unknown_outcomes)
        self._last_groups: list[str] | None = carry.tool_groups
        self._halted_on: set[str] = set()
        self._completed_bytes: dict[str, int] = {cid: len(r.model_dump_json()) for cid, r in self._completed.items()}
        self._summary: Summary | None = carry.summary
        self._summary_retry_turn = carry.summary_retry_turn
        self._last_summary_turn = carry.last_summary_turn
        self._encoding = carry.encoding
        self._token_correction = carry.token_correction
        self._memories: list[str] = []
        """Long-term memories injected into the context: this turn's recall, as shown."""
        self._working = list(carry.working_memory)
        self._last_extracted_turn = carry.last_extracted_turn
        self._carried_extractions: list[ExtractMemoriesInput] = list(carry.pending_extractions)
        self._extractions: list[tuple[ExtractMemoriesInput, asyncio.Task[None]]] = []
        self._memory_served = False
        self._turn_triggers: Triggers | None = None
        self._by_ref: dict[str, Message] = {}
        """Transcript messages by content reference (answers ``get_message_bodies``)."""
        for m in self._messages:
            self._index_message(m)
        self._synthetic: dict[str, str] = {}
        """Bodies of what a context adds around the transcript (system prompt, summary,
        memories) and of offered tool lists, by reference, for ``get_message_bodies``."""
        self._context_tokens = carry.context_tokens
        self._inflight_context: tuple[int, int, list[str]] | None = None
        self._tool_lists: dict[tuple[Any, ...], tuple[str, int]] = {}
        self._tools_generation = 0
        self._listing: tuple[str, dict[str, ToolSpec], list[Any]] | None = None
        """The last full tool listing of this run: its reference, tools and groups."""
        """Counts tool listings: a cached tool list is one of the same listing."""
        self._tool_bodies: dict[str, str] = {}
        self._bounded_counter: BoundedCounter | None = None
        self._idle_marked = carry.status == "idle"
        self._archived_state = False
        self._summarizing = False
        self._summary_task: asyncio.Task[None] | None = None
        self._lifecycle_not_before = self._created_at

        self._status = "active"
        self._lock = asyncio.Lock()
        self._in_flight_ids: set[str] = set()
        self._queued = 0
        self._updates_this_run = 0
        self._draining = False
        self._current_turn: int | None = None
        self._cancel_requested = False
        self._pending: dict[str, PendingApproval] = {}
        self._verdicts: dict[str, ApprovalDecision] = {}
        self._background: list[asyncio.Task[None]] = []
        self._all_specs: dict[str, ToolSpec] = {}
        self._warnings: list[str] = []
        self._audit_seq = 0
        self._audit_buffer: list[ApprovalAuditEntry] = []
        self._patches: dict[str, bool] = {}

    # ------------------------------------------------------------------ run

    @workflow.run
    async def run(self, inp: SessionInput) -> SessionState:
        # Every patch is decided once, in the run's first workflow task: a run recorded
        # before a change replays it without the change to its end, and a patch marker's
        # position never depends on when local activities (validation, audit) resolved.
        self._patched(_PATCH_TOOL_LAYER_V2)
        if self._carried_extractions and self._patched(_PATCH_MEMORY):
            carried, self._carried_extractions = self._carried_extractions, []
            for extraction in carried:
                self._start_extraction(extraction)
        workflow.upsert_search_attributes(
            [
                names.SA_USER_ID.value_set(inp.user_id),
                names.SA_CHANNEL.value_set(inp.channel),
                names.SA_STATUS.value_set("active"),
                names.SA_PENDING_APPROVALS.value_set(0),
            ]
        )
        while True:
            try:
                await workflow.wait_condition(
                    lambda: self._status == "closed"
                    or self._must_roll_over()
                    or (self._should_roll_over() and self._idle())
                    or (bool(self._audit_buffer) and self._idle()),
                    timeout=self._lifecycle_timeout(),
                    timeout_summary="idle check",
                )
            except asyncio.TimeoutError:
                if self._lifecycle_due():
                    final = await self._archive_session()
                    if final is not None:
                        return final
                continue
            if self._audit_buffer and self._status != "closed" and not self._must_roll_over():
                # Decisions that arrived between turns; under the turn lock, so this write
                # never interleaves with a turn's local activities.
                async with self._lock:
                    await self._flush_audit()
                if not (self._should_roll_over() and self._idle()):
                    continue
            self._draining = True
            await workflow.wait_condition(lambda: workflow.all_handlers_finished() and self._idle())
            if self._status == "closed":
                workflow.upsert_search_attributes([names.SA_STATUS.value_set("closed")])
                await self._flush_audit()
                self._schedule_index_update()
                self._extract_at_end("close")
                await self._drain_background(final=True)
                return self._state()
            await self._flush_audit()
            await self._drain_background()
            if self._status == "closed":
                continue  # closed while the index writes drained: close, do not roll over
            if not await self._archive_for_carry():
                # The transcript is too large to carry and could not be archived: keep this
                # run going (messages are taken again) and try later, rather than emit a
                # continue-as-new the server would refuse.
                self._draining = False
                await workflow.sleep(timedelta(seconds=60))
                continue
            workflow.continue_as_new(
                SessionInput(
                    session_id=inp.session_id,
                    user_id=inp.user_id,
                    channel=inp.channel,
                    config=self._cfg,
                    carry=self._carry(),
                )
            )

    def _lifecycle_timeout(self) -> timedelta | None:
        """Time until the session turns idle, or (idle) until it is archived (seed 000
        §1.3: idle after 30 min, archived after 7 days); None before the patch or closed."""
        if self._status == "closed" or not self._patched(_PATCH_BOUNDED_CONTEXT):
            return None
        after = self._cfg.archive_after_seconds if self._idle_marked else self._cfg.idle_after_seconds
        due = max(self._last_active_at + timedelta(seconds=after), self._lifecycle_not_before)
        return max(due - workflow.now(), timedelta(seconds=1))

    def _lifecycle_due(self) -> bool:
        """On the idle timer: mark the session idle; True when it is due for archiving."""
        if not self._idle() or self._pending or self._status == "closed" or workflow.now() < self._lifecycle_not_before:
            return False
        quiet = (workflow.now() - self._last_active_at).total_seconds()
        if quiet >= self._cfg.archive_after_seconds:
            return True
        if quiet >= self._cfg.idle_after_seconds and not self._idle_marked:
            self._idle_marked = True
            if not self._halted_on:
                workflow.upsert_search_attributes([names.SA_STATUS.value_set("idle")])
            self._schedule_index_update()
        return False

    async def _archive_session(self) -> SessionState | None:
        """Write the final snapshot and end the run (the next message resumes from it).

        Returns:
            The final state (with ``snapshot``), or None when archiving must wait (a
            message arrived, the session closed, or the state is too large to carry).
        """
        self._draining = True
        await workflow.wait_condition(lambda: workflow.all_handlers_finished() and self._idle())
        if self._status == "closed" or self._queued or self._updates_pending_since_idle():
            self._draining = False
            return None
        await self._flush_audit()
        self._extract_at_end("archive")
        await self._drain_background(final=True)
        if not await self._archive_for_carry():
            self._draining = False
            self._lifecycle_not_before = workflow.now() + timedelta(minutes=10)
            return None
        snapshot = self._carry()
        snapshot.status = "archived"
        try:
            await workflow.execute_activity(
                names.SAVE_SNAPSHOT,
                SnapshotInput(session_id=self._inp.session_id, carry=snapshot),
                start_to_close_timeout=timedelta(seconds=30),
                # A few seconds at most: messages wait (busy) while the run drains.
                retry_policy=RetryPolicy(maximum_interval=timedelta(seconds=2), maximum_attempts=3),
                summary="session snapshot",
            )
        except ActivityError:
            # Redis is down: stay open (taking messages) and try again later, rather than
            # end without the snapshot's second copy.
            workflow.logger.warning("session snapshot not written; archiving again in 10 minutes")
            self._draining = False
            self._lifecycle_not_before = workflow.now() + timedelta(minutes=10)
            return None
        self._archived_state = True
        workflow.upsert_search_attributes([names.SA_STATUS.value_set("archived")])
        self._schedule_index_update()
        await self._drain_background()
        return self._state().model_copy(update={"snapshot": snapshot})

    def _updates_pending_since_idle(self) -> bool:
        # A message that came in while this run was draining for the archive (it was
        # refused as busy and will be retried) makes the session active again.
        return (workflow.now() - self._last_active_at).total_seconds() < self._cfg.idle_after_seconds

    async def _archive_for_carry(self) -> bool:
        """Make the state carried across continue-as-new fit ``max_carry_bytes``, and
        leave out the turns the running summary covers.

        Moves the turns the summary covers, and when over the budget the oldest whole
        turns until the messages fit half of it (all of them if needed: no turn runs now),
        to the transcript archive, and trims the resend cache and the trace if the rest is
        still too large. Sizes are measured as the
        JSON the payload will be, escapes included.

        Returns:
            False if the state is still over Temporal's payload limit (archiving failed):
            the caller must not continue as new yet.
        """
        budget = self._cfg.max_carry_bytes
        summarized = self._summarized_prefix()
        over_budget = self._carry_bytes() > budget
        if not over_budget and not summarized:
            return True
        sizes = [_message_bytes(m) for m in self._messages]
        starts = [i for i, m in enumerate(self._messages) if m.role == "user"] + [len(self._messages)]
        remaining = sum(sizes)
        cut = 0
        for boundary in starts if over_budget else ():
            if remaining <= budget // 2:
                break
            remaining -= sum(sizes[cut:boundary])
            cut = boundary
        cut = max(cut, summarized)
        if cut and self._patched(_PATCH_BOUNDED_CONTEXT):
            # Turns leaving the state leave the model's context too: fold them into the
            # summary first, so nothing disappears from what the model knows. (If the
            # summary fails they are archived anyway: the payload limit leaves no choice.)
            last = self._messages[cut - 1].turn
            if last > (self._summary.upto_turn if self._summary else 0):
                await self._summarize(self._turn_count, last)
        archived_upto = 0
        try:
            while archived_upto < cut:
                end, size = archived_upto, 0
                while end < cut and (end == archived_upto or size + sizes[end] <= _ARCHIVE_CHUNK_BYTES):
                    size += sizes[end]
                    end += 1
                await workflow.execute_activity(
                    names.ARCHIVE_MESSAGES,
                    ArchiveMessagesInput(
                        session_id=self._inp.session_id,
                        chain_id=self._chain_id,
                        first_index=self._archived + archived_upto,
                        messages=self._messages[archived_upto:end],
                    ),
                    start_to_close_timeout=timedelta(seconds=30),
                    retry_policy=RetryPolicy(maximum_attempts=5),
                    summary="archive transcript",
                )
                archived_upto = end
        except ActivityError:
            workflow.logger.warning("transcript archive failed; not continuing as new yet", exc_info=True)
        # Drop only whole archived turns (a failed chunk may have ended mid-turn; its
        # messages are written again, by index, next time).
        drop = max((b for b in starts if b <= archived_upto), default=0)
        if drop:
            self._archived += drop
            self._live_bytes -= sum(sizes[:drop])
            for m in self._messages[:drop]:
                if m.ref is not None and self._by_ref.get(m.ref) is m:
                    del self._by_ref[m.ref]
            del self._messages[:drop]
        excess = self._carry_bytes() - budget
        while excess > 0 and self._completed:
            oldest = next(iter(self._completed))
            self._completed.pop(oldest)
            excess -= self._completed_bytes.pop(oldest, 0)
        if excess > 0:
            del self._trace[:-50]
        return self._carry_bytes() <= _MAX_CARRY_PAYLOAD_BYTES

    def _summarized_prefix(self) -> int:
        """How many of the oldest held messages are whole turns the summary covers (0
        without the patch or a summary with text): the context never sends them again,
        so they can leave the state for the transcript archive."""
        if self._summary is None or not self._summary.text.strip() or not self._patched(_PATCH_ARCHIVE_SUMMARIZED):
            return 0
        covered = self._summary.upto_turn
        last_user = 0
        for i, m in enumerate(self._messages):
            if m.turn > covered:
                # Cut right before the first newer turn when it starts there, else before
                # the last covered turn's user message (whole turns only, never part of one).
                return i if m.role == "user" else last_user
            if m.role == "user":
                last_user = i
        return 0  # every held message is covered: nothing newer to keep beside it

    def _carry_bytes(self) -> int:
        return len(self._carry().model_dump_json().encode("utf-8", "surrogatepass")) + len(
            self._cfg.model_dump_json()
        )

    def _idle(self) -> bool:
        return not self._lock.locked() and self._queued == 0

    def _should_roll_over(self) -> bool:
        # The transcript too: past it, archiving at the next continue-as-new keeps the
        # state (and the transcript query's answer) well under the 2 MB payload limit.
        return (
            self._updates_this_run >= self._cfg.max_updates_per_run
            or workflow.info().is_continue_as_new_suggested()
            or self._live_bytes > self._cfg.max_carry_bytes * 3 // 2
            or self._history_over(1)
            or self._replay_budget_spent()
        )

    def _replay_budget_spent(self) -> bool:
        """This run's history has ``replay_budget_events`` events: a worker taking the
        session over (after a crash, a deploy or a cache eviction) replays the run, so
        its length bounds the time to resume, at turn 10 as at turn 10,000."""
        return (
            self._cfg.replay_budget_events > 0
            and workflow.info().get_current_history_length() >= self._cfg.replay_budget_events
            and self._patched(_PATCH_BOUNDED_WORK)
        )

    def _history_over(self, times: int) -> bool:
        """This run's history is past ``times`` x ``max_history_bytes`` (capped at 40 MB,
        under Temporal's 50 MB hard limit)."""
        if not self._patched(_PATCH_BOUNDED_CONTEXT):
            return False
        limit = min(self._cfg.max_history_bytes * times, 40_000_000)
        return workflow.info().get_current_history_size() >= limit

    def _must_roll_over(self) -> bool:
        # Under constant load the session is never idle; stop taking messages well before
        # Temporal's hard caps (2,000 updates, 51,200 events per run).
        return (
            self._updates_this_run >= min(3 * self._cfg.max_updates_per_run, 1500)
            or workflow.info().get_current_history_length() >= 30_000
            or self._history_over(3)
        )

    def _carry(self) -> SessionCarry:
        return SessionCarry(
            messages=self._messages,
            turn_count=self._turn_count,
            created_at=self._created_at,
            last_active_at=self._last_active_at,
            token_estimate=self._token_estimate,
            completed=self._completed,
            answered_ids=self._answered,
            trace=self._trace[-_MAX_TRACE:],
            decisions=self._decisions[-_MAX_DECISIONS:],
            title=self._title,
            run_index=self._run_index + 1,
            system_prompt=self._system_prompt,
            settled_tool_call_ids=self._settled[-_MAX_SETTLED:],
            archived_messages=self._archived,
            notices=self._notices,
            unknown_outcomes=self._unknown,
            tool_groups=self._last_groups,
            chain_id=self._chain_id,
            summary=self._summary,
            summary_retry_turn=self._summary_retry_turn,
            last_summary_turn=self._last_summary_turn,
            encoding=self._encoding,
            token_correction=self._token_correction,
            context_tokens=self._context_tokens,
            status="idle" if self._idle_marked else "active",
            working_memory=self._working,
            last_extracted_turn=self._last_extracted_turn,
            pending_extractions=self._carried_extractions,
        )

    async def _drain_background(self, *, final: bool = False) -> None:
        """Wait for the background writes, and for a running summary at most
        ``_SUMMARY_GRACE``: then it is cancelled (the next run summarises again), so
        continue-as-new, close and archive never wait long on a model call. Memory
        extractions get ``_EXTRACTION_GRACE`` (``_EXTRACTION_GRACE_FINAL`` when the session
        ends); one still running is cancelled and carried to the next run."""
        await self._drain_extractions(_EXTRACTION_GRACE_FINAL if final else _EXTRACTION_GRACE)
        task = self._summary_task
        if task is not None and not task.done():
            try:
                await workflow.wait_condition(task.done, timeout=_SUMMARY_GRACE, timeout_summary="summary to finish")
            except asyncio.TimeoutError:
                pass
        if task is not None and not task.done():
            task.cancel()
        if task is not None:
            try:
                await task
            except (asyncio.CancelledError, ActivityError):
                pass
        self._summary_task = None
        self._summarizing = False
        while self._background:
            task = self._background.pop()
            await task

    # ------------------------------------------------------------- updates

    @workflow.update(name=names.SEND_MESSAGE)
    async def send_message(self, inp: SendMessageInput) -> TurnResult:
        """Run one user turn and return the reply.

        Args:
            inp: the user's text and an optional client message id; a resend with an id
                already answered returns that answer and runs no second turn.

        Returns:
            The assistant's reply with the tool calls it made.
        """
        self._updates_this_run += 1
        cid = inp.client_message_id
        if cid is not None:
            if cid in self._completed:
                return self._completed[cid]
            if cid in self._in_flight_ids:
                await workflow.wait_condition(lambda: cid in self._completed or cid not in self._in_flight_ids)
                if cid in self._completed:
                    return self._completed[cid]
                raise ApplicationError(
                    "the first copy of this message failed before it was answered; send it again with a new id",
                    type="MessageFailedError",
                    non_retryable=True,
                )
            answered = self._answer_from_transcript(cid)
            if answered is not None:
                return answered
            if cid in self._answered and self._patched(_PATCH_BOUNDED_WORK):
                turn = self._answered[cid]
                return TurnResult(
                    session_id=self._inp.session_id,
                    turn=turn,
                    reply="",
                    client_message_id=cid,
                    warnings=[
                        f"This message was already answered in turn {turn}; the reply is no longer held by the "
                        "session, read it in the transcript. It was not run again."
                    ],
                )
            self._in_flight_ids.add(cid)
        self._queued += 1
        try:
            async with self._lock:
                self._queued -= 1
                result = await self._run_turn(inp)
        finally:
            if cid is not None:
                self._in_flight_ids.discard(cid)
        if cid is not None:
            result.client_message_id = cid
            self._remember(cid, result)
        return _slim(result, _MAX_TURN_RESULT_BYTES)

    def _knows(self, cid: str | None) -> bool:
        """Whether message ``cid`` was taken by this session: running or queued now, or
        answered (its reply cached, or its turn still in the transcript this run holds)."""
        if cid is None:
            return False
        if cid in self._completed or cid in self._in_flight_ids:
            return True
        # Runs without the patch answer only what they hold (the handler would run an
        # evicted one again); read from the decided patches: a validator issues no command.
        if cid in self._answered and self._patches.get(_PATCH_BOUNDED_WORK, False):
            return True
        return any(m.role == "user" and m.client_message_id == cid for m in self._messages)

    def _answer_from_transcript(self, cid: str) -> TurnResult | None:
        """The reply to a message already answered whose cached reply was evicted:
        rebuilt from the transcript, so a late resend never runs a second turn."""
        turn = next((m.turn for m in self._messages if m.role == "user" and m.client_message_id == cid), None)
        if turn is None:
            return None
        in_turn = [m for m in self._messages if m.turn == turn]
        results = {m.tool_call_id: m.content or "" for m in in_turn if m.role == "tool"}
        records = []
        for m in in_turn:
            for call in m.tool_calls:
                try:
                    result = ToolResult.model_validate_json(results.get(call.tool_call_id, ""))
                except ValueError:
                    result = ToolResult(message=results.get(call.tool_call_id, "")[:500])
                records.append(ToolCallRecord(tool_call_id=call.tool_call_id, name=call.name, arguments=call.arguments, result=result))
        replies = [m for m in in_turn if m.role == "assistant" and not m.tool_calls]
        return TurnResult(
            session_id=self._inp.session_id,
            turn=turn,
            reply=(replies[-1].content or "") if replies else "",
            tool_calls=records,
            client_message_id=cid,
        )

    def _remember(self, cid: str, result: TurnResult) -> None:
        """Keep a reply for resends, within a count and a byte budget (it is carried
        across continue-as-new, so it must stay far below the 2 MB payload limit)."""
        self._answered[cid] = result.turn
        while len(self._answered) > self._cfg.max_answered_ids:
            self._answered.pop(next(iter(self._answered)))
        cached = _slim(result, _MAX_CACHED_RESULT_BYTES, cut_reply=False)
        size = len(cached.model_dump_json())
        self._completed[cid] = cached
        self._completed_bytes[cid] = size
        while len(self._completed) > self._cfg.max_completed_ids or (
            len(self._completed) > 1 and sum(self._completed_bytes.values()) > _MAX_CACHE_BYTES
        ):
            oldest = next(iter(self._completed))
            self._completed.pop(oldest)
            self._completed_bytes.pop(oldest, None)

    @send_message.validator
    def _validate_send_message(self, inp: SendMessageInput) -> None:
        # A resend of a message this session knows is always taken, even while closing,
        # rolling over or halted: its handler only waits for or returns the first reply.
        # So a refusal (busy, closed, halted) always means "never taken", and a client
        # that resends under a new id after it never gets the turn twice. Only which
        # updates are accepted changes, never the commands of an accepted one: replay-safe.
        if inp.client_message_id is not None and inp.client_message_id in self._completed:
            return
        if self._status == "closed" or self._draining or self._halted_on:
            if self._knows(inp.client_message_id):
                return
        if self._status == "closed":
            raise ApplicationError("the session is closed", type="SessionClosedError", non_retryable=True)
        if not inp.text or not inp.text.strip():
            raise ApplicationError("the message is empty", type="MessageRejectedError", non_retryable=True)
        size = len(inp.text.encode("utf-8"))
        if size > self._cfg.max_message_bytes:
            raise ApplicationError(
                f"the message is {size} bytes; the limit is {self._cfg.max_message_bytes} bytes",
                type="MessageRejectedError",
                non_retryable=True,
            )
        if self._draining:
            raise ApplicationError(
                "the session is continuing as new; retry in a moment", type="SessionBusyError"
            )
        if self._halted_on:
            waiting = ", ".join(
                f"{p.tool_name} ({p.tool_call_id})" for p in self._pending.values() if p.tool_call_id in self._halted_on
            )
            raise ApplicationError(
                f"the session is halted until a human approves or rejects: {waiting}",
                type="SessionHaltedError",
                non_retryable=True,
            )

    @workflow.update(name=names.SETTLE_MESSAGE)
    def settle_message(self, client_message_id: str) -> bool:
        """Whether this session took message ``client_message_id``: asked by a client
        about to report it busy after refusals that came from Temporal, not from this
        session (10 updates in flight, the run closing).

        Such a refusal does not prove the message was never taken: the server aborts
        admitted updates ("workflow update was aborted") and retries them, the SDK retries
        such failures without telling its caller, and an attempt the worker had already
        been sent can still be accepted after the refusal. Temporal delivers updates in
        the order it admitted them, so this question reaches the session after every copy
        sent before it: the validator's refusal (no history written) settles the message
        as never taken; acceptance means it was taken (running, queued or answered).

        Returns:
            True (taken: resend it under the same id for its reply).
        """
        return True

    @settle_message.validator
    def _validate_settle_message(self, client_message_id: str) -> None:
        if not self._knows(client_message_id):
            raise ApplicationError("the session has not taken this message", type="MessageNotTaken", non_retryable=True)

    # ------------------------------------------------------------- signals

    @workflow.signal(name=names.APPROVE_TOOL_CALL)
    def approve_tool_call(self, decision: ApprovalDecision) -> None:
        """Approve a pending tool call. Unknown or already settled ids change nothing."""
        self._decide(decision.model_copy(update={"approved": True}))

    @workflow.signal(name=names.REJECT_TOOL_CALL)
    def reject_tool_call(self, decision: ApprovalDecision) -> None:
        """Reject a pending tool call; the model is told it was denied."""
        self._decide(decision.model_copy(update={"approved": False}))

    @workflow.signal(name=names.SET_SYSTEM_PROMPT)
    def set_system_prompt(self, system_prompt: str) -> None:
        """Replace the system prompt from the next model call on; one over
        ``max_system_prompt_bytes`` is refused and listed in the state's ``notices``."""
        size = len(system_prompt.encode("utf-8", "surrogatepass"))
        if size > self._cfg.max_system_prompt_bytes:
            self._notices.append(
                f"{workflow.now().isoformat(timespec='seconds')}: system prompt of {size} bytes refused "
                f"(limit {self._cfg.max_system_prompt_bytes}); the previous one stays"
            )
            del self._notices[:-20]
            return
        self._system_prompt = system_prompt

    @workflow.signal(name=names.CANCEL_TURN)
    def cancel_turn(self) -> None:
        """Stop the current turn at once; queued messages still run."""
        if self._current_turn is not None:
            self._cancel_requested = True

    @workflow.signal(name=names.CLOSE_SESSION)
    def close_session(self) -> None:
        """Close the session: pending approvals are denied, new messages refused."""
        self._status = "closed"

    def _decide(self, decision: ApprovalDecision) -> None:
        tcid = decision.tool_call_id
        detail = ""
        if tcid in self._pending:
            refusal = self._pending[tcid].may_decide(decision.approver)
            if tcid in self._verdicts:
                outcome = "already_decided"
            elif refusal is not None:
                outcome, detail = "not_allowed", refusal
            else:
                outcome = "applied"
                self._verdicts[tcid] = decision
        elif tcid in self._settled:
            outcome = "already_decided"
        else:
            outcome = "unknown_tool_call"
        self._decisions.append(
            DecisionRecord(
                tool_call_id=tcid,
                approved=decision.approved,
                approver=decision.approver,
                reason=decision.reason,
                outcome=outcome,
                at=workflow.now(),
                detail=detail,
            )
        )
        del self._decisions[:-_MAX_DECISIONS]
        about = self._pending.get(tcid) or PendingApproval(
            tool_call_id=tcid, tool_name="", arguments={}, permission="write", turn=0,
            requested_at=workflow.now(), expires_at=workflow.now(), requester=self._inp.user_id,
        )
        self._audit(
            "decision", about, approver=decision.approver, approved=decision.approved,
            outcome=outcome, detail=detail, reason=decision.reason,
        )

    # ------------------------------------------------------------- queries

    @workflow.query(name=names.GET_STATE)
    def get_state(self) -> SessionState:
        return self._state()

    @workflow.query(name=names.GET_TRANSCRIPT)
    def get_transcript(self) -> list[Message]:
        return self._messages

    @workflow.query(name=names.GET_PENDING_APPROVALS)
    def get_pending_approvals(self) -> list[PendingApproval]:
        return list(self._pending.values())

    @workflow.query(name=names.GET_TRACE)
    def get_trace(self) -> list[TraceStep]:
        return self._trace

    @workflow.query(name=names.GET_MODEL_CONTEXT)
    def get_model_context(self, turn: int, step: int) -> list[str] | None:
        """The message references of the model call of ``turn`` and ``step``, if it is the
        one in flight. A copy of the session rebuilt from history (after a cache eviction
        or a worker restart) may have built that context a little differently from the
        recorded input (a summary or signal that arrived during a local activity applies
        a task earlier or later); the activity then sends this one, equally valid."""
        if self._inflight_context is None or self._inflight_context[:2] != (turn, step):
            return None
        return self._inflight_context[2]

    @workflow.query(name=names.GET_MESSAGE_BODIES)
    def get_message_bodies(self, refs: list[str]) -> dict[str, str]:
        """Bodies (:func:`hermes.blobs.body_json`) of the referenced messages and tool
        lists this session holds; references it does not hold are left out."""
        found: dict[str, str] = {}
        for ref in refs:
            message = self._by_ref.get(ref)
            if message is not None:
                found[ref] = body_json(message)
            elif ref in self._synthetic:
                found[ref] = self._synthetic[ref]
            elif ref in self._tool_bodies:
                found[ref] = self._tool_bodies[ref]
        if any(r in self._synthetic and r.startswith("b:") for r in refs) and self._messages:
            # Asked for a context list: add the newest turn's bodies, which the content
            # store cannot have yet, and save the activity a second query.
            newest = self._messages[-1].turn
            for m in reversed(self._messages):
                if m.turn != newest:
                    break
                if m.ref is not None and not m.internal:
                    found.setdefault(m.ref, body_json(m))
        return found

    def _state(self) -> SessionState:
        return SessionState(
            session_id=self._inp.session_id,
            user_id=self._inp.user_id,
            channel=self._inp.channel,
            status=self._session_status(),  # type: ignore[arg-type]
            title=self._title,
            created_at=self._created_at,
            last_active_at=self._last_active_at,
            turn_count=self._turn_count,
            token_estimate=self._token_estimate,
            system_prompt=self._system_prompt,
            busy=self._current_turn is not None,
            queued_messages=self._queued,
            pending_approvals=list(self._pending.values()),
            decisions=self._decisions,
            run_index=self._run_index,
            updates_this_run=self._updates_this_run,
            history_length=workflow.info().get_current_history_length(),
            archived_messages=self._archived,
            chain_id=self._chain_id,
            notices=self._notices,
            summary=self._summary,
            context_tokens=self._context_tokens,
            history_size_bytes=workflow.info().get_current_history_size(),
        )

    def _patched(self, patch: str) -> bool:
        """Whether this run has ``patch``; all patches are decided together, at the first
        call, which :meth:`run` makes in the first workflow task (a handler that runs
        before it, in the same first activation, decides the same)."""
        if not self._patches:
            self._patches = {name: workflow.patched(name) for name in _PATCHES}
        return self._patches[patch]

    def _closed_mid_turn(self) -> bool:
        # The patch check only once closed: histories without a mid-turn close are unchanged.
        return self._status == "closed" and self._patched(_PATCH_STOP_ON_CLOSE)

    def _session_status(self) -> str:
        if self._status == "closed":
            return "closed"
        if self._archived_state:
            return "archived"
        if self._halted_on:
            return "halted"
        return "idle" if self._idle_marked else self._status

    # ---------------------------------------------------------- the turn

    async def _run_turn(self, inp: SendMessageInput) -> TurnResult:
        first_new = len(self._messages)
        try:
            return await self._run_turn_inner(inp)
        finally:
            self._live_bytes += sum(_message_bytes(m) for m in self._messages[first_new:])

    async def _run_turn_inner(self, inp: SendMessageInput) -> TurnResult:
        self._turn_count += 1
        turn = self._turn_count
        now = workflow.now()
        self._last_active_at = now
        if self._idle_marked:
            self._idle_marked = False
            if not self._halted_on and self._status != "closed":
                workflow.upsert_search_attributes([names.SA_STATUS.value_set("active")])
        user_message = Message(
            role="user", content=inp.text, turn=turn, created_at=now, client_message_id=inp.client_message_id
        )
        self._add_message(user_message)
        if not self._title:
            self._title = " ".join(inp.text.split())[:60]
            # In the memo too, so a session index rebuilt from visibility keeps the title.
            workflow.upsert_memo({names.MEMO_TITLE: self._title})
        if self._status == "closed":
            reply = "The session was closed before this message could be answered."
            self._add_notice(turn, reply)
            return TurnResult(session_id=self._inp.session_id, turn=turn, reply=reply, status="closed")

        self._current_turn = turn
        self._cancel_requested = False
        self._warnings = []
        self._memories = []
        self._turn_triggers = None
        records: list[ToolCallRecord] = []
        status = "completed"
        groups: list[str] | None = None
        try:
            specs, tool_groups = await self._list_tools()
            self._all_specs = specs
            await self._count_exactly(user_message)
            if self._memory_active():
                await self._recall(turn, inp.text)
            if self._cfg.tool_routing == "keywords":
                groups = route_groups(
                    inp.text, tool_groups, specs.values(), max_groups=self._cfg.max_routed_groups, previous=self._last_groups
                )
            self._last_groups = groups
            suggested: set[str] = set()
            bad_arguments: dict[str, int] = {}
            for iteration in range(self._cfg.max_iterations):
                offered = offered_tools(specs, groups, suggested)
                result = await self._call_model(turn, offered, iteration)
                assistant = result.message.model_copy(
                    update={
                        "turn": turn,
                        "created_at": workflow.now(),
                        "tool_calls": self._unique_tool_call_ids(result.message.tool_calls, turn, iteration),
                    }
                )
                self._add_message(assistant)
                if not assistant.tool_calls:
                    reply = assistant.content or ""
                    if not reply.strip():
                        reply = "The model returned an empty answer. Ask again, or rephrase the question."
                        self._add_notice(turn, reply)
                    break
                await self._run_step(turn, assistant.tool_calls, specs, records)
                for call, record in zip(assistant.tool_calls, records[-len(assistant.tool_calls):]):
                    spec = specs.get(call.name)
                    if spec is not None and record.result.ok:
                        suggested.update(spec.next_possible_tools)
                    if record.result.code == ToolResultCode.BAD_ARGUMENTS:
                        bad_arguments[call.name] = bad_arguments.get(call.name, 0) + 1
                        if bad_arguments[call.name] > self._cfg.max_argument_retries:
                            raise _ArgumentsExhausted(call, record.result, spec)
                if self._closed_mid_turn():
                    raise _SessionClosedMidTurn()
            else:
                status = "max_iterations"
                reply = (
                    f"I stopped after {self._cfg.max_iterations} model/tool steps without reaching "
                    "a final answer. Tell me how to continue, or ask a narrower question."
                )
                self._add_notice(turn, reply)
        except _SessionClosedMidTurn:
            status = "closed"
            reply = "The session was closed while this turn ran; it stopped here."
            self._close_open_tool_calls(turn, records)
            self._add_notice(turn, reply)
        except _ArgumentsExhausted as err:
            status = "invalid_arguments"
            reply = self._ask_user_for_arguments(err)
            self._close_open_tool_calls(turn, records)
            self._add_notice(turn, reply)
        except _TurnCancelled:
            status = "cancelled"
            reply = "This turn was cancelled."
            self._close_open_tool_calls(turn, records)
            self._add_notice(turn, reply)
        except _ContextTooLarge as err:
            status = "context_too_large"
            reply = f"I cannot send this to the model: {err}. Ask for less at once, or start a new session."
            self._close_open_tool_calls(turn, records)
            self._add_notice(turn, reply)
        except _ModelFailed as err:
            status = "model_error"
            reply = f"The model could not answer ({err}). Your message is kept; send it again to retry."
            self._close_open_tool_calls(turn, records)
            self._add_notice(turn, reply)
        finally:
            self._current_turn = None
            self._cancel_requested = False

        await self._flush_audit()
        self._last_active_at = workflow.now()
        self._schedule_index_update()
        upto = self._summary_due(turn)
        if upto is not None:
            # Not blocking the reply: the summary runs while the user reads it.
            self._summarizing = True
            self._summary_task = asyncio.create_task(self._summarize_in_background(turn, upto))
        if self._memory_active():
            try:
                self._after_reply(turn, inp.text, reply, status, records)
            except Exception:  # noqa: BLE001 - memory must never cost the user the reply
                workflow.logger.exception("memory write path failed for turn %d", turn)
                self._warnings.append("This message could not be considered for long-term memory (an internal error).")
        return TurnResult(
            session_id=self._inp.session_id,
            turn=turn,
            reply=reply,
            status=status,  # type: ignore[arg-type]
            tool_calls=records,
            tool_groups=groups,
            warnings=list(self._warnings),
            memories=list(self._memories),
        )

    def _unique_tool_call_ids(self, calls: list[ToolCall], turn: int, iteration: int) -> list[ToolCall]:
        """The model's tool calls, each with an id unique in this session.

        Some OpenAI-compatible servers send the same id (``call_0``) in every response, or
        an empty one; approvals, results and the exactly-once record are keyed by the id,
        so a reused id is replaced by one minted here (and the model sees that id from
        then on, with its result)."""
        used = {c.tool_call_id for m in self._messages for c in m.tool_calls}
        used.update(self._settled)
        unique: list[ToolCall] = []
        for index, call in enumerate(calls):
            tcid = call.tool_call_id
            if not tcid or len(tcid) > 128 or tcid in used:
                tcid = f"hc_{turn}_{iteration}_{index}"
                while tcid in used:
                    tcid += "_"
                call = call.model_copy(update={"tool_call_id": tcid})
            used.add(tcid)
            unique.append(call)
        return unique

    # ------------------------------------------------------------ memory

    def _memory_active(self) -> bool:
        """Long-term memory is on for this turn: the session wants it, the worker serves
        it, and the run has the patch (runs recorded before it replay without)."""
        return self._cfg.memory_enabled and self._memory_served and self._patched(_PATCH_MEMORY)

    async def _recall(self, turn: int, text: str) -> None:
        """The read path: the user's memories for this message, injected into the system
        context of every model call of the turn (seed 000 §4.3). A failure costs the turn
        its memories, never the turn."""
        self._turn_triggers = detect_triggers(text)
        if self._turn_triggers.forget_me:
            await self._forget_me()
            return
        if self._cfg.memory_max_injected == 0:
            return
        started = workflow.now()
        try:
            result = await workflow.execute_local_activity(
                names.SEARCH_MEMORIES,
                SearchMemoriesInput(
                    user_id=self._inp.user_id,
                    query=text[:2000],
                    session_id=self._inp.session_id,
                    limit=self._cfg.memory_max_injected,
                    max_chars=self._cfg.memory_max_chars,
                ),
                result_type=SearchMemoriesResult,
                start_to_close_timeout=timedelta(seconds=15),
                retry_policy=RetryPolicy(maximum_attempts=2),
                summary="recall memories",
            )
        except FailureError as err:
            self._warnings.append(f"Long-term memory was not available for this message ({failure_text(err)}).")
            return
        if result.error:
            self._warnings.append(f"Long-term memory was not searched: {result.error}")
        self._memories = [m.line() for m in result.memories]
        if result.memories or result.error:
            self._add_trace(turn, "memory", started, provider="recall", status="error" if result.error else f"{len(result.memories)} memories")

    async def _forget_me(self) -> None:
        """The user asked to be forgotten: every memory row of theirs goes (and what is
        still waiting to be written), and the session's working memory."""
        self._working = []
        self._memories = []
        try:
            report = await workflow.execute_activity(
                names.FORGET_USER_MEMORIES,
                self._inp.user_id,
                result_type=ForgetReport,
                start_to_close_timeout=timedelta(seconds=60),
                heartbeat_timeout=self._model_heartbeat(),
                retry_policy=RetryPolicy(maximum_attempts=3),
                summary="forget the user",
            )
        except ActivityError as err:
            self._warnings.append(f"Your long-term memories could not be deleted now ({failure_text(err)}); ask again.")
            return
        self._warnings.append(
            f"All long-term memories of {self._inp.user_id} were deleted "
            f"({report.deleted} stored, {report.pending_dropped} waiting to be written)."
        )

    def _after_reply(self, turn: int, text: str, reply: str, status: str, records: list[ToolCallRecord]) -> None:
        """The write path, after the reply (seed 000 §4.2, seed 004 §6.2): rule candidates
        at once; a model extraction on the design's triggers (remember, a preference, a
        correction, a stated fact, a task's conclusion, every 8 turns); working memory
        counted and promoted. Delivered in the background: the reply never waits."""
        triggers = self._turn_triggers or detect_triggers(text)
        if triggers.forget_me:
            return
        now = workflow.now()
        candidates = [
            MemoryCandidate(
                user_id=self._inp.user_id,
                kind=rc.kind,
                subject=rc.subject,
                value=rc.value,
                text=rc.text,
                importance=rc.importance,
                confidence=rc.confidence,
                source="remember" if rc.explicit else "rules",
                source_session=self._inp.session_id,
                source_turn=turn,
                created_at=now,
                valid_until=now + timedelta(days=rc.valid_until_days) if rc.valid_until_days else None,
            )
            for rc in extract_by_rules(text)
        ]
        for record in records:
            spec = self._all_specs.get(record.name)
            if record.result.ok and spec is not None and spec.permission == "read":
                self._working = add_items(self._working, items_from_tool_result(record.name, record.result.data, turn))
        scan = REFERENCE_SCAN_CHARS if self._patched(_PATCH_BOUNDED_WORK) else None
        for item in note_references(self._working, [text, reply], turn, self._cfg.memory_promote_after_refs, scan):
            candidates.append(
                MemoryCandidate(
                    user_id=self._inp.user_id,
                    kind="fact",
                    text=item.text,
                    importance=0.6,
                    confidence=0.9,
                    source="promotion",
                    source_session=self._inp.session_id,
                    source_turn=turn,
                    created_at=now,
                )
            )
        reasons = [name for name in ("explicit", "preference", "correction", "fact") if getattr(triggers, name)]
        # A task's conclusion: a side effect that happened (seed 004 §7.2: the results of
        # write tools go to long-term memory; those of queries to working memory).
        if status == "completed" and any(
            r.result.ok and (spec := self._all_specs.get(r.name)) is not None and spec.permission != "read" for r in records
        ):
            reasons.append("conclusion")
        if turn - self._last_extracted_turn >= self._cfg.memory_extract_every_turns:
            reasons.append(f"every_{self._cfg.memory_extract_every_turns}_turns")
        use_model = bool(reasons) and not (triggers.small_talk and not candidates)
        if not candidates and not use_model:
            return
        excerpt = self._excerpt(self._last_extracted_turn, turn) if use_model else []
        if use_model:
            self._last_extracted_turn = turn
        self._start_extraction(
            ExtractMemoriesInput(
                user_id=self._inp.user_id,
                session_id=self._inp.session_id,
                turn=turn,
                created_at=now,
                rule_candidates=candidates,
                excerpt=excerpt,
                use_model=use_model,
                model=self._cfg.model,
                min_confidence=self._cfg.memory_min_confidence,
                reasons=reasons,
            )
        )

    def _excerpt(self, after_turn: int, upto_turn: int, max_turns: int = 8) -> list[ConversationExcerpt]:
        """The user's messages and the final replies of turns ``after_turn + 1`` to
        ``upto_turn`` (the newest ``max_turns`` of them)."""
        first = max(after_turn + 1, upto_turn - max_turns + 1)
        lines = []
        for m in self._messages:
            if m.internal or m.turn < first or m.turn > upto_turn or not m.content:
                continue
            if m.role == "user" or (m.role == "assistant" and not m.tool_calls):
                lines.append(ConversationExcerpt(turn=m.turn, role=m.role, text=m.content[:2000]))  # type: ignore[arg-type]
        return lines

    def _extract_at_end(self, reason: str) -> None:
        """The session closes or is archived: the turns no extraction has seen yet go to one."""
        if not self._memory_active() or self._turn_count <= self._last_extracted_turn:
            return
        excerpt = self._excerpt(self._last_extracted_turn, self._turn_count)
        self._last_extracted_turn = self._turn_count
        if not excerpt:
            return
        self._start_extraction(
            ExtractMemoriesInput(
                user_id=self._inp.user_id,
                session_id=self._inp.session_id,
                turn=self._turn_count,
                created_at=workflow.now(),
                excerpt=excerpt,
                use_model=True,
                model=self._cfg.model,
                min_confidence=self._cfg.memory_min_confidence,
                reasons=[reason],
            )
        )

    def _start_extraction(self, inp: ExtractMemoriesInput) -> None:
        async def run() -> None:
            try:
                result = await workflow.execute_activity(
                    names.EXTRACT_MEMORIES,
                    inp,
                    result_type=ExtractMemoriesResult,
                    start_to_close_timeout=timedelta(seconds=self._cfg.model_timeout_seconds + 30),
                    heartbeat_timeout=self._model_heartbeat(),
                    # Until delivered: the candidates are in this input, nowhere else.
                    retry_policy=RetryPolicy(initial_interval=timedelta(seconds=2), maximum_interval=timedelta(seconds=60)),
                    summary=f"memories of turn {inp.turn} ({', '.join(inp.reasons) or 'rules'})",
                )
            except ActivityError:
                workflow.logger.warning("memory extraction of turn %d failed", inp.turn, exc_info=True)
                return
            if result.error:
                workflow.logger.warning("memory extraction of turn %d: %s", inp.turn, result.error)

        self._extractions = [(i, t) for i, t in self._extractions if not t.done()]
        self._extractions.append((inp, asyncio.create_task(run())))

    async def _drain_extractions(self, grace: timedelta) -> None:
        running = [(i, t) for i, t in self._extractions if not t.done()]
        if running and grace > timedelta(0):
            try:
                await workflow.wait_condition(
                    lambda: all(t.done() for _, t in running), timeout=grace, timeout_summary="memory extraction"
                )
            except asyncio.TimeoutError:
                pass
        for inp, task in self._extractions:
            if not task.done():
                task.cancel()
                self._carried_extractions.append(inp)
            try:
                await task
            except (asyncio.CancelledError, ActivityError):
                pass
        self._extractions = []

    def _add_message(self, message: Message) -> None:
        """Append to the transcript, with the body's content reference (and its tokens,
        once the session's encoding is known)."""
        self._messages.append(message)
        self._index_message(message)

    def _index_message(self, message: Message) -> None:
        if message.ref is None:
            message.ref = message_ref(message)
        if message.tokens is None and self._encoding and not message.internal:
            message.tokens = self._counter().message(message)
        self._by_ref[message.ref] = message

    def _add_notice(self, turn: int, text: str) -> None:
        """A reply written by Hermes, not the model: kept in the transcript, never sent
        to the model as if it had said it."""
        self._add_message(Message(role="assistant", content=text, turn=turn, created_at=workflow.now(), internal=True))

    def _append_tool_result(self, turn: int, call: ToolCall, result: ToolResult) -> None:
        content = result.model_dump_json()
        if len(content) > _MAX_RESULT_CHARS:
            # Still one {code, message, data} object: cut text is not JSON the model can read.
            preview = json.dumps(result.data, ensure_ascii=False, default=str)
            keep = _MAX_RESULT_CHARS // 2
            while True:
                content = ToolResult(
                    code=result.code,
                    message=f"{result.message[:1000]} (shortened for the model: {len(preview)} characters of data)",
                    data={"truncated": True, "preview": preview[:keep]},
                ).model_dump_json()
                if len(content) <= _MAX_RESULT_CHARS or keep == 0:
                    break
                keep //= 2
        self._add_message(
            Message(
                role="tool",
                content=content,
                tool_call_id=call.tool_call_id,
                name=call.name,
                turn=turn,
                created_at=workflow.now(),
            )
        )

    def _close_open_tool_calls(self, turn: int, records: list[ToolCallRecord]) -> None:
        """Give every tool call of the last assistant message a result: never an orphan."""
        last = next((m for m in reversed(self._messages) if m.role == "assistant"), None)
        if last is None or last.turn != turn:
            return
        answered = {m.tool_call_id for m in self._messages if m.role == "tool" and m.turn == turn}
        for call in last.tool_calls:
            if call.tool_call_id in answered:
                continue
            result = ToolResult(
                code=ToolResultCode.DENIED_BY_HUMAN,
                message="the turn ended before this tool call ran; it was not run",
            )
            records.append(ToolCallRecord(tool_call_id=call.tool_call_id, name=call.name, arguments=call.arguments, result=result, approval="cancelled"))
            self._append_tool_result(turn, call, result)

    async def _cancellable(self, task: asyncio.Task[Any]) -> Any:
        await workflow.wait_condition(lambda: task.done() or self._cancel_requested)
        if not task.done():
            task.cancel()
            try:
                await task
            except BaseException:  # noqa: BLE001 - the turn is cancelled whatever the task did
                pass
            raise _TurnCancelled()
        return await task

    async def _list_tools(self) -> tuple[dict[str, ToolSpec], list[Any]]:
        # Recorded in history once per turn, so replay never depends on a worker's registry;
        # an unchanged list is recorded as its reference only. A local activity (it cannot
        # heartbeat; a worker dying during it is noticed at the workflow task timeout, as
        # during any workflow task): it is cached and bounded (hermes.mcp.tools, 8 s per
        # MCP server), and a regular one would add three events and a server round trip
        # to every turn.
        bounded = self._patched(_PATCH_BOUNDED_CONTEXT)
        result = await workflow.execute_local_activity(
            names.LIST_TOOLS,
            *(
                [
                    ListToolsInput(
                        known_ref=self._listing[0] if self._listing else None,
                        encoding=self._encoding if self._patched(_PATCH_BOUNDED_WORK) else "",
                    )
                ]
                if bounded
                else []
            ),
            result_type=ListToolsResult,
            start_to_close_timeout=timedelta(seconds=10),
        )
        if result.unchanged and self._listing is not None and result.ref == self._listing[0]:
            _, specs, groups = self._listing
        else:
            specs, groups = {spec.name: spec for spec in result.tools}, result.groups
            self._tools_generation += 1
            if bounded and result.ref:
                self._listing = (result.ref, specs, groups)
        self._memory_served = result.memory
        if not self._encoding and result.encoding and bounded:
            self._encoding = result.encoding  # fixed for the session's life: counts stay comparable
            for m in self._messages:
                if m.tokens is None and not m.internal:
                    m.tokens = self._counter().message(m)
        return specs, groups

    def _model_heartbeat(self) -> timedelta | None:
        """Heartbeat timeout of the model activities (calls, summaries, extraction): an
        attempt on a dead worker is retried after it. Only an activity option: the
        commands, and so replay, are the same with or without it."""
        seconds = self._cfg.model_heartbeat_seconds
        return timedelta(seconds=seconds) if seconds > 0 else None

    async def _call_model(self, turn: int, tools: list[ToolSpec], step: int = 0) -> CallModelResult:
        """One model step. The context goes by reference; a provider's "context too long"
        triggers one forced compaction and one retry (never a loop).

        Raises:
            _ContextTooLarge: the current turn alone does not fit the budget, or the
                provider refused the context again after compaction.
            _ModelFailed, _TurnCancelled.
        """
        compacted = False
        while True:
            started = workflow.now()
            request = self._model_request(turn, tools, step)
            handle = workflow.start_activity(
                names.CALL_MODEL,
                request,
                result_type=CallModelResult,
                start_to_close_timeout=timedelta(seconds=self._cfg.model_timeout_seconds),
                # A call on a worker that died is retried after seconds, not the timeout.
                heartbeat_timeout=self._model_heartbeat(),
                retry_policy=RetryPolicy(
                    # After a worker crash (a heartbeat timeout) this wait is part of the
                    # time to the reply; a provider's failure sets its own longer wait
                    # (activities.model.provider_retry_delay: 0.5 s doubling, Retry-After).
                    initial_interval=timedelta(milliseconds=100),
                    backoff_coefficient=2.0,
                    maximum_interval=timedelta(seconds=30),
                    maximum_attempts=self._cfg.model_max_attempts,
                    non_retryable_error_types=["ModelRequestError", "ScriptExhaustedError", "ContextTooLongError"],
                ),
                summary=f"model, turn {turn}, step {step + 1}",
            )
            try:
                result: CallModelResult = await self._cancellable(handle)
            except _TurnCancelled:
                self._add_trace(turn, "model", started, status="cancelled")
                raise
            except ActivityError as err:
                too_long = isinstance(err.cause, ApplicationError) and err.cause.type == "ContextTooLongError"
                self._add_trace(turn, "model", started, status="context_too_long" if too_long else "error")
                if too_long and self._patched(_PATCH_BOUNDED_CONTEXT):
                    if not compacted:
                        compacted = True
                        if await self._compact(turn, refused_tokens=request.context_tokens):
                            continue
                        why = "and compacting the earlier conversation did not help"
                    else:
                        why = "even after the earlier conversation was compacted"
                    raise _ContextTooLarge(f"the model refused the context as too long, {why} ({failure_text(err)})") from None
                raise _ModelFailed(failure_text(err)) from None
            break
        self._token_estimate = result.usage.prompt_tokens + result.usage.completion_tokens
        if self._patched(_PATCH_BOUNDED_CONTEXT) and request.context_tokens and result.usage.prompt_tokens:
            self._token_correction = usage_correction(
                self._token_correction, request.context_tokens, result.usage.prompt_tokens
            )
        self._add_trace(
            turn, "model", started, provider=result.provider, tokens=self._token_estimate
        )
        return result

    def _model_request(self, turn: int, tools: list[ToolSpec], step: int) -> CallModelInput:
        """The model call's input: references to the context's messages and tool list."""
        if not self._patched(_PATCH_BOUNDED_CONTEXT):
            # Runs recorded before: the same commands (activity inputs are not replayed).
            return CallModelInput(
                session_id=self._inp.session_id, turn=turn, messages=self._legacy_context(turn), tools=tools,
                model=self._cfg.model, profile=self._cfg.model_profile,
            )
        tools_ref, tool_tokens = self._tool_list(tools)
        built = self._build_context(turn, tools, tool_tokens)
        refs = []
        for m in built.messages:
            if m.ref is not None and m.ref in self._by_ref:
                refs.append(m.ref)
                continue
            ref = message_ref(m)
            self._synthetic.setdefault(ref, body_json(m))
            refs.append(ref)
        self._context_tokens = built.tokens
        # One reference for the whole list: the input's size does not grow with the context.
        refs_json = json.dumps(refs)
        context_ref = value_ref(refs)
        self._synthetic[context_ref] = refs_json
        self._inflight_context = (turn, step, refs)
        return CallModelInput(
            session_id=self._inp.session_id,
            turn=turn,
            model=self._cfg.model,
            profile=self._cfg.model_profile,
            context_ref=context_ref,
            tools_ref=tools_ref,
            step=step,
            context_tokens=built.tokens,
            encoding=self._encoding if self._patched(_PATCH_BOUNDED_WORK) else "",
        )

    def _tool_list(self, tools: list[ToolSpec]) -> tuple[str | None, int]:
        """The content reference of the offered tool list and its tokens (computed once
        per distinct list: a turn offers the same list at most steps)."""
        if not tools:
            return None, 0
        key = (self._tools_generation, *(t.name for t in tools))
        cached = self._tool_lists.get(key)
        if cached is None:
            tools_json = [t.model_dump(mode="json") for t in tools]
            ref = value_ref(tools_json)
            if len(self._tool_lists) > 16:
                self._tool_lists.clear()
                self._tool_bodies.clear()
            self._tool_bodies[ref] = json.dumps(tools_json, ensure_ascii=False)
            cached = (ref, self._counter().tools(tools))
            self._tool_lists[key] = cached
        return cached

    def _counter(self) -> TokenCounter | BoundedCounter:
        """The session's token counter: bounded in cost per text (runs with the
        ``bounded-workflow-work`` patch), or exact (runs recorded before it)."""
        try:
            exact = TokenCounter.get(self._encoding or DEFAULT_ENCODING)
        except Exception:  # noqa: BLE001 - an encoding this worker cannot load offline
            exact = TokenCounter.get(DEFAULT_ENCODING)
        if not self._patched(_PATCH_BOUNDED_WORK):
            return exact
        if self._bounded_counter is None or self._bounded_counter.counter is not exact:
            self._bounded_counter = BoundedCounter(exact)
        return self._bounded_counter

    async def _count_exactly(self, message: Message) -> None:
        """Set the exact tokens of a user message too long to count in workflow code,
        from a local activity (recorded, so a replay does not count it again). On a
        failure the bounded estimate stays."""
        text = message.content or ""
        if not self._encoding or len(text) <= BOUNDED_COUNT_CHARS or not self._patched(_PATCH_BOUNDED_WORK):
            return
        try:
            tokens = await workflow.execute_local_activity(
                names.COUNT_TOKENS,
                CountTokensInput(text=text, encoding=self._encoding),
                result_type=int,
                start_to_close_timeout=timedelta(seconds=10),
                retry_policy=RetryPolicy(maximum_attempts=2),
                summary="count tokens",
            )
        except FailureError:
            workflow.logger.warning("exact token count of turn %d's message failed; estimated", message.turn)
            return
        message.tokens = self._counter().message(message.model_copy(update={"content": "", "tokens": None})) + tokens

    def _build_context(self, turn: int, tools: list[ToolSpec], tool_tokens: int | None = None) -> BuiltContext:
        """System prompt, memories, summary and the recent turns that fit the token budget
        (:func:`hermes.context.build_context`).

        Raises:
            _ContextTooLarge: the system prompt and the newest user message alone do not fit.
        """
        counter = self._counter()
        if len(self._synthetic) > 64:
            self._synthetic = dict(list(self._synthetic.items())[-32:])
        try:
            built = build_context(
                self._messages,
                turn=turn,
                system_prompt=self._system_prompt,
                policy=ContextPolicy.from_config(self._cfg),
                counter=counter,
                summary=self._summary,
                memories=self._memories,
                tool_tokens=counter.tools(tools) if tool_tokens is None else tool_tokens,
                correction=self._token_correction,
            )
        except ContextOverBudget as err:
            raise _ContextTooLarge(str(err)) from None
        # The model must see its last step (its tool calls and their results): without
        # it, it would only ask for the same calls again.
        last_step = next(
            (m for m in reversed(self._messages) if m.role == "assistant" and m.tool_calls and m.turn == turn), None
        )
        if last_step is not None and not any(m is last_step for m in built.messages):
            raise _ContextTooLarge(
                f"the last tool step of this turn ({', '.join(c.name for c in last_step.tool_calls)}) "
                f"with its results does not fit the context budget of {built.budget} tokens"
            )
        return built

    def _legacy_context(self, turn: int) -> list[Message]:
        """The context of runs recorded before ``bounded-context``: the last 20 turns,
        whole, within 1.5 MB."""
        system = Message(role="system", content=self._system_prompt)
        by_turn: dict[int, list[Message]] = {}
        for m in self._messages:
            if not m.internal and m.turn > turn - 20:
                by_turn.setdefault(m.turn, []).append(m)
        budget = 1_500_000 - _message_bytes(system)
        current = by_turn.pop(turn, [])
        used = sum(_message_bytes(m) for m in current)
        if used > budget:
            raise _ContextTooLarge(f"this turn's context is about {used} bytes, more than one model call may carry")
        kept: list[list[Message]] = []
        for number in sorted(by_turn, reverse=True):
            size = sum(_message_bytes(m) for m in by_turn[number])
            if used + size > budget:
                break
            used += size
            kept.append(by_turn[number])
        return [system, *(m for group in reversed(kept) for m in group), *current]

    # ------------------------------------------------------------ summaries

    def _fold_refs(self, after_turn: int, upto_turn: int) -> tuple[list[str], list[int]]:
        """References and turns of the messages of turns ``after_turn + 1 .. upto_turn``."""
        folded = [
            m for m in self._messages if after_turn < m.turn <= upto_turn and not m.internal and m.ref is not None
        ]
        return [m.ref for m in folded if m.ref is not None], [m.turn for m in folded]

    def _summary_due(self, turn: int) -> int | None:
        """The turn a summary should now cover up to, or None (DESIGN.md: at most once
        every ``summary_every_turns`` turns; turns older than ``context_history_turns``)."""
        if not self._patched(_PATCH_BOUNDED_CONTEXT) or self._summarizing or self._status == "closed":
            return None
        covered = self._summary.upto_turn if self._summary else 0
        upto = turn - self._cfg.context_history_turns
        if upto - covered < self._cfg.summary_every_turns or turn < self._summary_retry_turn:
            return None
        return upto

    async def _summarize(self, turn: int, upto: int, *, forced: bool = False, max_input_tokens: int | None = None) -> bool:
        """Fold turns up to ``upto`` into the running summary (a model call in an
        activity). A failure or an empty summary keeps the messages as they are and
        is retried after ``summary_retry_turns`` turns.

        Returns:
            Whether the summary now covers more turns than before (all of them up to
            ``upto``, or as many whole turns as its input budget took).
        """
        covered = self._summary.upto_turn if self._summary else 0
        refs, turns = self._fold_refs(covered, upto)
        if not refs:
            return False
        self._summarizing = True
        started = workflow.now()
        policy = ContextPolicy.from_config(self._cfg)
        try:
            summary: Summary = await workflow.execute_activity(
                names.SUMMARIZE_CONTEXT,
                SummarizeInput(
                    session_id=self._inp.session_id,
                    message_refs=refs,
                    message_turns=turns,
                    previous_summary=self._summary.text if self._summary else "",
                    upto_turn=upto,
                    max_tokens=self._cfg.summary_max_tokens,
                    max_input_tokens=max_input_tokens or max(policy.budget - 2 * self._cfg.summary_max_tokens, 1000),
                    model=self._cfg.model,
                    profile=self._cfg.model_profile,
                    encoding=self._encoding,
                ),
                result_type=Summary,
                start_to_close_timeout=timedelta(seconds=self._cfg.model_timeout_seconds),
                heartbeat_timeout=self._model_heartbeat(),
                retry_policy=RetryPolicy(
                    initial_interval=timedelta(seconds=1),
                    maximum_interval=timedelta(seconds=30),
                    maximum_attempts=3,
                    non_retryable_error_types=["ModelRequestError", "ScriptExhaustedError", "ContextTooLongError"],
                ),
                summary=f"summary of turns {covered + 1}-{upto}" + (" (forced)" if forced else ""),
            )
        except ActivityError as err:
            workflow.logger.warning("summary of turns %d-%d failed: %s", covered + 1, upto, failure_text(err))
            self._summary_retry_turn = self._turn_count + self._cfg.summary_retry_turns
            self._add_trace(turn, "summary", started, status="error")
            return False
        finally:
            self._summarizing = False
        if not summary.text.strip():
            self._summary_retry_turn = self._turn_count + self._cfg.summary_retry_turns
            self._add_trace(turn, "summary", started, status="empty")
            return False
        advanced = self._summary is None or summary.upto_turn > self._summary.upto_turn
        if advanced:
            self._summary = summary.model_copy(update={"created_at": workflow.now()})
            self._last_summary_turn = turn
        self._add_trace(turn, "summary", started, tokens=summary.tokens)
        return advanced

    async def _summarize_in_background(self, turn: int, upto: int) -> None:
        self._summarizing = False
        await self._summarize(turn, upto)

    async def _compact(self, turn: int, *, refused_tokens: int = 0) -> bool:
        """Forced compaction after the provider refused a context of about
        ``refused_tokens`` as too long: every turn before this one goes into the summary,
        now, from a request well under that size."""
        if self._summarizing:
            await workflow.wait_condition(lambda: not self._summarizing)
        limit = max(1000, refused_tokens // 2) if refused_tokens else None
        return await self._summarize(turn, turn - 1, forced=True, max_input_tokens=limit)

    def _policy(self, call: ToolCall, spec: ToolSpec) -> tuple[ApprovalPolicy, str]:
        """What this call needs before it runs, and why (beyond its permission)."""
        policy = self._cfg.approval_policies.get(spec.permission) or ApprovalPolicy(action="approve")
        if not spec.idempotent and _fingerprint(call) in self._unknown and policy.action == "run":
            earlier = self._unknown[_fingerprint(call)]
            return policy.model_copy(update={"action": "confirm"}), (
                f"the same call ({earlier}) has an unknown outcome; it may already have happened"
            )
        return policy, ""

    async def _validate_call(self, turn: int, call: ToolCall, spec: ToolSpec) -> ValidateToolCallResult:
        return await workflow.execute_local_activity(
            names.VALIDATE_TOOL_CALL,
            self._run_tool_input(turn, call, spec),
            result_type=ValidateToolCallResult,
            start_to_close_timeout=timedelta(seconds=10),
            retry_policy=RetryPolicy(maximum_attempts=3),
            summary=f"validate {call.name}",
        )

    async def _run_step(self, turn: int, calls: list[ToolCall], specs: dict[str, ToolSpec], records: list[ToolCallRecord]) -> None:
        """Run the tool calls of one model step: exactly one result per call, in order.

        Calls that need a human are checked first and all put up for decision at once
        (the approver sees the whole step); calls that need nobody run in order
        meanwhile; a denied call is reported, never run."""
        early: dict[str, ToolResult] = {}
        gated: dict[str, PendingApproval] = {}
        prepared: dict[str, ToolCall] = {}
        lazy: dict[str, ApprovalPolicy] = {}
        # Sessions that began under the previous tool layer replay its command order:
        # no check before an approval, and approvals requested one at a time.
        try:
            for call in calls:
                spec = specs.get(call.name)
                if spec is None:
                    early[call.tool_call_id] = ToolResult(
                        code=ToolResultCode.BAD_ARGUMENTS,
                        message=f"unknown tool {call.name!r}; available tools: {', '.join(sorted(specs)) or 'none'}",
                    )
                    continue
                if call.arguments_error is not None:
                    early[call.tool_call_id] = ToolResult(code=ToolResultCode.BAD_ARGUMENTS, message=call.arguments_error)
                    continue
                policy, reason = self._policy(call, spec)
                if policy.action == "deny":
                    early[call.tool_call_id] = ToolResult(
                        code=ToolResultCode.PERMISSION_DENIED,
                        message=f"tools needing permission {spec.permission!r} are not allowed in this session",
                    )
                    continue
                if policy.action == "run" and spec.composite is None:
                    continue
                if not self._patched(_PATCH_TOOL_LAYER_V2):
                    lazy[call.tool_call_id] = policy
                    continue
                checked = await self._validate_call(turn, call, spec)
                if checked.error is not None:
                    early[call.tool_call_id] = checked.error
                    continue
                update: dict[str, Any] = {"arguments": checked.arguments}
                if call.arguments_ref is not None or checked.arguments_ref is not None:
                    update["arguments_ref"] = checked.arguments_ref
                prepared[call.tool_call_id] = call.model_copy(update=update)
                if policy.action != "run":
                    gated[call.tool_call_id] = self._request_approval(turn, prepared[call.tool_call_id], spec, policy, reason)
            await self._flush_audit()
            for call in calls:
                tcid = call.tool_call_id
                record = ToolCallRecord(tool_call_id=tcid, name=call.name, arguments=call.arguments, result=ToolResult())
                if tcid in early:
                    record.result = early[tcid]
                elif tcid not in gated and tcid not in lazy and self._closed_mid_turn():
                    record.approval = "cancelled"
                    record.result = ToolResult(
                        code=ToolResultCode.DENIED_BY_HUMAN, message="the session was closed before this tool call ran; it was not run"
                    )
                    self._add_trace(turn, "tool", workflow.now(), tool_name=call.name, status=f"code_{int(record.result.code)}")
                else:
                    spec = specs[call.name]
                    run_call = prepared.get(tcid, call)
                    if tcid in lazy:
                        gated[tcid] = self._request_approval(turn, call, spec, lazy[tcid], "")
                    if tcid in gated:
                        verdict, decision = await self._wait_verdict(turn, gated[tcid])
                        record.approval = verdict  # type: ignore[assignment]
                        record.approver = decision.approver if decision else None
                        if verdict != "approved":
                            why = {
                                "rejected": "the user rejected this tool call",
                                "expired": "nobody approved this tool call in time",
                                "cancelled": "the session closed before this tool call was approved",
                            }[verdict]
                            reason = f": {decision.reason}" if decision and decision.reason else ""
                            record.result = ToolResult(code=ToolResultCode.DENIED_BY_HUMAN, message=f"{why}{reason}; it was not run")
                    if record.approval in ("not_required", "approved"):
                        record.result, record.fallback = await self._run_with_fallback(turn, run_call, spec, specs)
                records.append(record)
                self._append_tool_result(turn, call, record.result)
        finally:
            for tcid, waiting in gated.items():
                if tcid in self._pending:
                    self._settle(tcid)
                    self._audit("verdict", waiting, outcome="cancelled", detail="the turn ended before a decision")
            await self._flush_audit()

    async def _run_with_fallback(
        self, turn: int, call: ToolCall, spec: ToolSpec, specs: dict[str, ToolSpec]
    ) -> tuple[ToolResult, str | None]:
        result = await self._run_tool(turn, call, spec)
        if not spec.idempotent and result.code == ToolResultCode.OUTCOME_UNKNOWN:
            self._warnings.append(
                f"{call.name} ({call.tool_call_id}) may or may not have run: {result.message[:300]} "
                "It will not be run again unless a human approves."
            )
            self._unknown[_fingerprint(call)] = call.tool_call_id
            while len(self._unknown) > _MAX_UNKNOWN:
                self._unknown.pop(next(iter(self._unknown)))
        elif not spec.idempotent and result.ok:
            self._unknown.pop(_fingerprint(call), None)
        fallback = specs.get(spec.fallback) if spec.fallback else None
        retry_safe_failure = result.code == ToolResultCode.DEPENDENCY_UNAVAILABLE or (
            result.code == ToolResultCode.OUTCOME_UNKNOWN and spec.idempotent
        )
        if fallback is None or not retry_safe_failure:
            return result, None
        fb_call = call.model_copy(update={"tool_call_id": f"{call.tool_call_id}.fallback", "name": fallback.name})
        fb_result = await self._run_tool(turn, fb_call, fallback)
        message = f"{spec.name} failed ({result.message[:300]}); this result is from the fallback {fallback.name}: {fb_result.message}"
        return fb_result.model_copy(update={"message": message[:2000]}), fallback.name

    def _request_approval(
        self, turn: int, call: ToolCall, spec: ToolSpec, policy: ApprovalPolicy, reason: str
    ) -> PendingApproval:
        now = workflow.now()
        timeout = policy.timeout_seconds or self._cfg.approval_timeout_seconds
        pending = PendingApproval(
            tool_call_id=call.tool_call_id,
            tool_name=call.name,
            arguments=call.arguments,
            permission=spec.permission,
            turn=turn,
            requested_at=now,
            expires_at=now + timedelta(seconds=timeout),
            session_id=self._inp.session_id,
            requester=self._inp.user_id,
            action="approve" if policy.action == "approve" else "confirm",
            approvers=list(policy.approvers),
            on_expiry=policy.on_expiry,
            reason=reason,
        )
        self._pending[call.tool_call_id] = pending
        workflow.upsert_search_attributes([names.SA_PENDING_APPROVALS.value_set(len(self._pending))])
        self._audit("requested", pending, reason=reason or None)
        return pending

    def _settle(self, tcid: str) -> None:
        if self._pending.pop(tcid, None) is None:
            return
        self._settled.append(tcid)
        del self._settled[:-_MAX_SETTLED]
        self._verdicts.pop(tcid, None)
        if tcid in self._halted_on:
            self._halted_on.discard(tcid)
        updates = [names.SA_PENDING_APPROVALS.value_set(len(self._pending))]
        if not self._halted_on and self._status != "closed":
            updates.append(names.SA_STATUS.value_set("active"))
        workflow.upsert_search_attributes(updates)

    async def _wait_verdict(self, turn: int, pending: PendingApproval) -> tuple[str, ApprovalDecision | None]:
        """Wait for a decision on ``pending`` until it expires; then deny, or halt the
        session (policy ``on_expiry="halt"``) and keep waiting for a human."""
        started = workflow.now()
        tcid = pending.tool_call_id

        def decided() -> bool:
            return tcid in self._verdicts or self._cancel_requested or self._status == "closed"

        def woken() -> bool:  # a decision, or audit entries (a refused decision) to write now
            return decided() or bool(self._audit_buffer)

        expired = False
        waited = False
        while not waited or not decided():
            waited = True
            remaining = (pending.expires_at - workflow.now()).total_seconds()
            if remaining <= 0 and not decided():
                expired = True
                break
            try:
                await workflow.wait_condition(
                    woken, timeout=timedelta(seconds=max(remaining, 0.001)), timeout_summary=f"approval of {pending.tool_name}"
                )
            except asyncio.TimeoutError:
                expired = True
                break
            await self._flush_audit()
        if expired:
            if pending.on_expiry != "halt":
                self._settle(tcid)
                self._audit("verdict", pending, outcome="expired")
                await self._flush_audit()
                self._add_trace(turn, "approval", started, tool_name=pending.tool_name, status="expired")
                return "expired", None
            pending.expired = True
            self._halted_on.add(tcid)
            workflow.upsert_search_attributes([names.SA_STATUS.value_set("halted")])
            self._audit("halted", pending, detail="expired with on_expiry=halt: the session waits for a human")
            await self._flush_audit()
            while not decided():
                await workflow.wait_condition(woken)
                await self._flush_audit()
        if tcid in self._verdicts:
            decision = self._verdicts[tcid]
            verdict = "approved" if decision.approved else "rejected"
        elif self._cancel_requested:
            self._settle(tcid)
            self._audit("verdict", pending, outcome="cancelled", detail="the turn was cancelled")
            await self._flush_audit()
            raise _TurnCancelled()
        else:
            decision, verdict = None, "cancelled"
        self._settle(tcid)
        self._audit(
            "verdict", pending, outcome=verdict,
            approver=decision.approver if decision else None,
            approved=decision.approved if decision else None,
            reason=decision.reason if decision else None,
        )
        await self._flush_audit()
        self._add_trace(turn, "approval", started, tool_name=pending.tool_name, status=verdict)
        return verdict, decision

    def _run_tool_input(self, turn: int, call: ToolCall, spec: ToolSpec | None) -> RunToolInput:
        return RunToolInput(
            session_id=self._inp.session_id,
            user_id=self._inp.user_id,
            turn=turn,
            tool_call=call,
            idempotent=spec.idempotent if spec is not None else True,
            mcp=spec.mcp if spec is not None else None,
            chain_id=self._chain_id,
        )

    async def _run_tool(self, turn: int, call: ToolCall, spec: ToolSpec) -> ToolResult:
        started = workflow.now()
        request = self._run_tool_input(turn, call, spec)
        if spec.composite is not None:
            task: asyncio.Task[Any] = asyncio.create_task(self._run_composite(request, spec))
        else:
            task = workflow.start_activity(
                names.RUN_TOOL,
                request,
                result_type=ToolResult,
                summary=f"tool {call.name}",
                **tool_activity_options(spec),
            )
        try:
            result: ToolResult = await self._cancellable(task)
        except _TurnCancelled:
            self._add_trace(turn, "tool", started, tool_name=call.name, status="cancelled")
            result = ToolResult(
                code=ToolResultCode.OUTCOME_UNKNOWN,
                message="the turn was cancelled while this tool call ran; its outcome is unknown",
            )
            self._append_tool_result(turn, call, result)
            raise
        except ActivityError as err:
            result = result_from_failure(err, spec)
        except ChildWorkflowError as err:
            result = ToolResult(code=ToolResultCode.DEPENDENCY_UNAVAILABLE, message=f"composite tool failed: {failure_text(err)}"[:2000])
        self._add_trace(turn, "tool", started, tool_name=call.name, status="ok" if result.ok else f"code_{int(result.code)}")
        return result

    async def _run_composite(self, request: RunToolInput, spec: ToolSpec) -> ToolResult:
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
                specs={s.tool: self._all_specs[s.tool] for s in steps if s.tool in self._all_specs},
            ),
            id=f"{request.session_id}/tool/{request.call_key}",
            result_type=ToolResult,
            static_summary=f"composite tool {spec.name}",
        )

    def _ask_user_for_arguments(self, err: _ArgumentsExhausted) -> str:
        """What the user is told when the model could not produce valid arguments."""
        data = err.result.data if isinstance(err.result.data, dict) else {}
        missing = [m for m in data.get("missing", []) if isinstance(m, str)]
        tries = self._cfg.max_argument_retries + 1
        if missing:
            descriptions = argument_descriptions(err.spec.parameters if err.spec else {}, missing)
            wanted = "; ".join(f"{name}: {text}" if text else name for name, text in descriptions.items())
            return f"To run {err.call.name} I need more information from you. Please tell me: {wanted}."
        return (
            f"I could not call {err.call.name} with valid arguments after {tries} tries "
            f"({err.result.message[:500]}). Could you rephrase or give the exact values?"
        )

    # ------------------------------------------------------------ helpers

    def _add_trace(
        self,
        turn: int,
        action_type: str,
        started: Any,
        *,
        provider: str = "",
        tool_name: str | None = None,
        tokens: int = 0,
        status: str = "ok",
    ) -> None:
        self._trace.append(
            TraceStep(
                session_id=self._inp.session_id,
                turn=turn,
                step=(self._trace[-1].step + 1) if self._trace else 1,
                action_type=action_type,  # type: ignore[arg-type]
                provider=provider,
                tool_name=tool_name,
                latency_ms=(workflow.now() - started).total_seconds() * 1000,
                tokens=tokens,
                status=status,
            )
        )
        del self._trace[:-_MAX_TRACE]

    def _audit(self, event: str, pending: PendingApproval, **fields: Any) -> None:
        """Buffer an entry for the approval audit log (written by :meth:`_flush_audit`)."""
        if not self._patched(_PATCH_AUDIT_LOG):
            return
        now = workflow.now()
        self._audit_seq += 1
        entry = ApprovalAuditEntry(
            entry_id=f"{pending.tool_call_id}:{event}:{int(now.timestamp() * 1_000_000)}:{self._audit_seq}",
            session_id=self._inp.session_id,
            tool_call_id=pending.tool_call_id,
            tool_name=pending.tool_name,
            event=event,  # type: ignore[arg-type]
            at=now,
            requester=pending.requester or self._inp.user_id,
            permission=pending.permission,
            arguments=pending.arguments if event == "requested" else {},
            **fields,
        )

        self._audit_buffer.append(entry)

    async def _flush_audit(self) -> None:
        """Write the buffered audit entries (one local activity, awaited in line: audit
        writes never interleave with the turn's other local activities, so the order of
        commands is the same on replay). A final failure is logged; the state's decision
        list stays the record."""
        if not self._audit_buffer:
            return
        batch, self._audit_buffer = self._audit_buffer, []
        try:
            await workflow.execute_local_activity(
                names.RECORD_APPROVAL_AUDIT,
                ApprovalAuditBatch(entries=batch),
                start_to_close_timeout=timedelta(seconds=5),
                retry_policy=RetryPolicy(maximum_attempts=5),
                summary="approval audit",
            )
        except FailureError:
            workflow.logger.warning("approval audit: %d entries not written", len(batch), exc_info=True)

    def _schedule_index_update(self) -> None:
        # The index is a cache: Temporal stays the source of truth, `hermes sessions`
        # rebuilds it. A Redis outage must not fail a turn.
        entry = SessionIndexEntry.from_state(self._state())
        self._in_background(names.UPDATE_SESSION_INDEX, entry, summary="session index", attempts=3)

    def _in_background(self, activity: str, arg: Any, *, summary: str, attempts: int) -> None:
        """Run a cheap, idempotent Redis write as a local activity (DESIGN.md: cache writes
        fit local activities) without holding up the turn; drained before the run ends.
        A final failure is logged, never fails the session (a local activity's final
        failure arrives as the ApplicationError itself, not wrapped in ActivityError)."""

        async def run() -> None:
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

        self._background = [t for t in self._background if not t.done()]
        self._background.append(asyncio.create_task(run()))
