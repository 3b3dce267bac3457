"""The state of a session run, in one place: what it carries across continue-as-new
(:meth:`SessionCore.carry`), what the ``get_state`` query answers
(:meth:`SessionCore.state`), and the flags its handlers share.

Plain Python; nothing here knows of Temporal: times and history figures come in as
arguments, and the parts (:class:`Transcript`, :class:`ReplyBook`, :class:`ApprovalBook`,
:class:`ContextPlanner`) are unit-tested without a server.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

from hermes.infra import telemetry
from hermes.memory.models import ExtractMemoriesInput, WorkingItem
from hermes.memory.rules import Triggers
from hermes.models import (
    Message,
    SessionCarry,
    SessionIndexEntry,
    SessionInput,
    SessionState,
    Summary,
    TakenMessage,
    ToolSpec,
    TraceStep,
    TurnStartRequest,
)
from hermes.sessions.turn_start import BeginTurnResult

from workflows.session import patches
from workflows.session.approvals import ApprovalBook
from workflows.session.commands import CommandGate
from workflows.session.context_plan import ContextPlanner
from workflows.session.degradations import note_degradation
from workflows.session.payloads import MAX_DECISIONS, MAX_SETTLED, MAX_TRACE
from workflows.session.replies import ReplyBook, taken_messages
from workflows.session.transcript import Transcript
from workflows.session.turn import BudgetExceeded, budget_stop


class SessionCore:
    """Everything a session run holds (see :class:`hermes.models.SessionCarry` for the
    carried fields' meaning), built from the run's input.

    Args:
        inp: the run's input (its ``carry`` from the previous run, if any).
        now: the workflow's time (the session's creation time when it is new).
        first_run_id: the chain's first run id (the session's ``chain_id`` when new).
        patched: whether the run has a patch (:mod:`workflows.session.patches`); asked
            only when a decision depends on it.
    """

    def __init__(self, inp: SessionInput, *, now: datetime, first_run_id: str, patched: Callable[[str], bool]) -> None:
        carry = inp.carry or SessionCarry()
        self.inp, self.cfg = inp, inp.config
        self.patched = patched
        self.encoding = carry.encoding
        self.planner = ContextPlanner()
        self.transcript = Transcript(carry.messages, carry.archived_messages, self.count_fn())
        self.transcript.head_and_tail = lambda: patched(patches.PREVIEW_HEAD_TAIL)
        self.replies = ReplyBook(
            carry.completed, carry.answered_ids, max_completed=self.cfg.max_completed_ids, max_answered=self.cfg.max_answered_ids
        )
        self.book = ApprovalBook(
            session_id=inp.session_id, user_id=inp.user_id, decisions=carry.decisions,
            settled=carry.settled_tool_call_ids, unknown=carry.unknown_outcomes,
            audit_enabled=lambda: patched(patches.AUDIT_LOG),
            identities=lambda: patched(patches.IDENTITY),
        )
        self.turn_count, self.token_estimate, self.title = carry.turn_count, carry.token_estimate, carry.title
        self.tokens_used, self.user_day, self.user_day_tokens = carry.tokens_used, carry.user_day, carry.user_day_tokens
        self.created_at = carry.created_at or now
        self.last_active_at = carry.last_active_at or self.created_at
        self.trace: list[TraceStep] = list(carry.trace)
        self.run_index, self.notices = carry.run_index, list(carry.notices)
        self.gate = CommandGate(session_id=inp.session_id, user_id=inp.user_id, notices=self.notices, seen=carry.seen_proofs)
        self.turn_sender: str | None = None
        """Who sent the running turn's message when not the session's user (an admin)."""
        self.system_prompt = carry.system_prompt or self.cfg.system_prompt
        self.chain_id = carry.chain_id or first_run_id
        self.last_groups: list[str] | None = carry.tool_groups
        self.summary: Summary | None = carry.summary
        self.summary_retry_turn, self.last_summary_turn = carry.summary_retry_turn, carry.last_summary_turn
        self.token_correction, self.context_tokens = carry.token_correction, carry.context_tokens
        # Long-term memory: this turn's recall as shown, working memory, extractions.
        self.memories: list[str] = []
        self.working: list[WorkingItem] = list(carry.working_memory)
        self.last_extracted_turn = carry.last_extracted_turn
        self.carried_extractions: list[ExtractMemoriesInput] = list(carry.pending_extractions)
        self.memory_served = False
        if carry.context is not None:
            self.planner.take_over(carry.context)
            self.memory_served = carry.context.listing is not None and carry.context.listing.memory
        self.turn_triggers: Triggers | None = None
        self.early_recall: BeginTurnResult | None = None
        """This turn's ``begin_turn`` result, when its recall came with the listing."""
        self.turn_start: TurnStartRequest | None = None
        """What this turn's first model call does first, when it lists and recalls
        (``patches.START_IN_CALL``); None once that call returned."""
        # The run's flags.
        self.idle_marked, self.archived_state = carry.status == "idle", False
        self.lifecycle_not_before = self.created_at
        self.status = "active"
        self.in_flight_ids: set[str] = set()
        self.queued = self.updates_this_run = 0
        self.draining = self.cancel_requested = False
        self.early_archive_failed = False
        """An archive before a reply failed in this run: the next ones wait for the reply."""
        self.current_turn: int | None = None
        self.all_specs: dict[str, ToolSpec] = {}
        self.warnings: list[str] = []

    # ---------------------------------------------------------------- counting

    def degraded(self, kind: str, detail: str, now: datetime) -> None:
        """Record a degradation of this turn: a notice (one per kind, counted:
        :func:`workflows.session.degradations.note_degradation`) and the
        ``hermes.degradations`` metric; nothing in runs without the patch."""
        if self.patched(patches.DEGRADATION_NOTICES):
            note_degradation(self.notices, kind, detail, now)
            telemetry.count_degradation(kind)

    def counter(self) -> Any:
        """The session's token counter (:meth:`ContextPlanner.counter`)."""
        return self.planner.counter(self.encoding, self.patched(patches.BOUNDED_WORK))

    def count_fn(self) -> Callable[[Message], int] | None:
        """Tokens of a message by the session's counter; None while its encoding is unknown."""
        return (lambda m: self.counter().message(m)) if self.encoding else None

    # ------------------------------------------------------------------ trace

    def add_trace(
        self, turn: int, action_type: str, started: datetime, now: datetime, *, provider: str = "",
        tool_name: str | None = None, tokens: int = 0, status: str = "ok",
    ) -> None:
        """One step of the trace (the newest ``MAX_TRACE`` are kept)."""
        self.trace.append(
            TraceStep(
                session_id=self.inp.session_id, turn=turn, step=(self.trace[-1].step + 1) if self.trace else 1,
                action_type=action_type,  # type: ignore[arg-type]
                provider=provider, tool_name=tool_name, latency_ms=(now - started).total_seconds() * 1000,
                tokens=tokens, status=status,
            )
        )
        del self.trace[:-MAX_TRACE]

    # ----------------------------------------------------------------- reading

    def knows(self, cid: str | None, *, bounded_work: bool) -> bool:
        """Whether message ``cid`` was taken by this session: running or queued now, or
        answered (its reply cached, its turn number kept (``bounded_work``: runs with
        that patch; a validator passes the decided patches, since it may issue no
        command), or its turn still in the transcript this run holds)."""
        if cid is None:
            return False
        if cid in self.replies.completed or cid in self.in_flight_ids:
            return True
        if cid in self.replies.answered and bounded_work:
            return True
        return self.transcript.knows_message(cid)

    def taken(self, prefix: str) -> list[TakenMessage]:
        """The messages taken whose client message ids start with ``prefix``
        (:func:`workflows.session.replies.taken_messages`)."""
        return taken_messages(prefix, running=self.in_flight_ids, replies=self.replies, messages=self.transcript.messages)

    def session_status(self) -> str:
        if self.status == "closed":
            return "closed"
        if self.archived_state:
            return "archived"
        if self.book.halted_on:
            return "halted"
        return "idle" if self.idle_marked else self.status

    def idle(self, locked: bool) -> bool:
        """No turn runs (``locked``: the turn lock is held) and none waits."""
        return not locked and self.queued == 0

    def budget_stop(self, today: str) -> BudgetExceeded | None:
        """Why no model call may start now (:func:`turn.budget_stop` of this session's
        use on ``today``, the UTC day ``YYYY-MM-DD``), or None."""
        return budget_stop(self.cfg, tokens_used=self.tokens_used, user_day=self.user_day,
                           user_day_tokens=self.user_day_tokens, today=today)

    def count_usage(self, tokens: int, day: str | None, day_tokens: int | None) -> None:
        """Add a model call's tokens to the session's (``tokens_used``), and keep the
        user's day total it reported when it is the newest (other sessions of the user
        count too: the highest total of the latest day wins)."""
        self.tokens_used += max(0, tokens)
        if day and day_tokens is not None and (day > self.user_day or (day == self.user_day and day_tokens > self.user_day_tokens)):
            self.user_day, self.user_day_tokens = day, day_tokens

    def carry(self, *, context: bool = False) -> SessionCarry:
        """What the next run starts from (continue-as-new input, or the archive's snapshot);
        ``context``: with what the context planner hands over (continue-as-new only)."""
        return SessionCarry(
            messages=self.transcript.messages, turn_count=self.turn_count, created_at=self.created_at,
            last_active_at=self.last_active_at, token_estimate=self.token_estimate,
            completed=self.replies.completed, answered_ids=self.replies.answered, trace=self.trace[-MAX_TRACE:],
            decisions=self.book.decisions[-MAX_DECISIONS:], title=self.title, run_index=self.run_index + 1,
            system_prompt=self.system_prompt, settled_tool_call_ids=self.book.settled[-MAX_SETTLED:],
            archived_messages=self.transcript.archived, notices=self.notices, unknown_outcomes=self.book.unknown,
            tool_groups=self.last_groups, chain_id=self.chain_id, summary=self.summary,
            summary_retry_turn=self.summary_retry_turn, last_summary_turn=self.last_summary_turn,
            encoding=self.encoding, token_correction=self.token_correction, context_tokens=self.context_tokens,
            status="idle" if self.idle_marked else "active", working_memory=self.working,
            last_extracted_turn=self.last_extracted_turn, pending_extractions=self.carried_extractions,
            tokens_used=self.tokens_used, user_day=self.user_day, user_day_tokens=self.user_day_tokens,
            seen_proofs=self.gate.seen,
            context=self.planner.handover(memory=self.memory_served, encoding=self.encoding) if context else None,
        )

    def carry_bytes(self) -> int:
        """Bytes of the continue-as-new input: the carry and the configuration, as JSON;
        without the planner's context (:class:`ContextCarry`: at most
        ``MAX_CARRIED_CONTEXT_BYTES`` more, never counted against ``max_carry_bytes``, so
        that what a run archives and trims does not depend on it)."""
        return len(self.carry().model_dump_json().encode("utf-8", "surrogatepass")) + len(self.cfg.model_dump_json())

    def index_entry(self, finished: tuple[int, str] | None = None) -> SessionIndexEntry:
        """The session index row (:meth:`SessionIndexEntry.from_state` of :meth:`state`,
        without building the whole state); ``finished``: (turn, status) of the turn that
        just ended."""
        return SessionIndexEntry(
            finished_turn=finished[0] if finished else None, finished_status=finished[1] if finished else None,
            session_id=self.inp.session_id, user_id=self.inp.user_id, channel=self.inp.channel,
            status=self.session_status(),  # type: ignore[arg-type]
            title=self.title, created_at=self.created_at, last_active_at=self.last_active_at, turn_count=self.turn_count,
        )

    def state(self, *, history_length: int, history_bytes: int) -> SessionState:
        """The answer of the ``get_state`` query (``history_*``: the run's, from Temporal)."""
        return SessionState(
            session_id=self.inp.session_id, user_id=self.inp.user_id, channel=self.inp.channel,
            status=self.session_status(),  # type: ignore[arg-type]
            title=self.title, created_at=self.created_at, last_active_at=self.last_active_at,
            turn_count=self.turn_count, token_estimate=self.token_estimate, system_prompt=self.system_prompt,
            busy=self.current_turn is not None, queued_messages=self.queued,
            pending_approvals=list(self.book.pending.values()), decisions=self.book.decisions,
            run_index=self.run_index, updates_this_run=self.updates_this_run, history_length=history_length,
            archived_messages=self.transcript.archived, chain_id=self.chain_id, notices=self.notices,
            summary=self.summary, context_tokens=self.context_tokens, history_size_bytes=history_bytes,
            tokens_used=self.tokens_used, token_budget=self.cfg.token_budget, user_daily_token_budget=self.cfg.user_daily_token_budget,
            user_day=self.user_day, user_day_tokens=self.user_day_tokens,
        )
