"""SessionWorkflow: one durable conversation per ``session_id``, the durable shell.

User turns arrive as the ``send_message`` update and run one at a time in arrival
order; approvals, cancel, system-prompt changes and close are signals; state,
transcript, pending approvals and trace are queries. Each turn is the agent loop:
model call -> tool calls -> tool results -> model, until a final answer or
``max_iterations``. The workflow continues as new (carrying its state) when Temporal
suggests it or after ``max_updates_per_run`` messages, only when no handler is running.

This class holds the handlers, ``run`` (the idle / archive / continue-as-new loop) and
the turn's order of steps; the state is one :class:`SessionCore`, the decisions are in
plain modules, the tool calls, model calls and memory hooks in their durable helpers
(the package docstring has the map). The order of commands is what a recorded history
holds: change it only behind ``workflow.patched()``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError

with workflow.unsafe.imports_passed_through():
    from hermes import names
    from hermes.infra import telemetry
    from hermes.security import command_auth
    from hermes.models import (
        ApprovalDecision,
        ArchiveMessagesInput,
        CallModelResult,
        CommandProof,
        Message,
        PendingApproval,
        SendMessageInput,
        SessionConfig,
        SessionInput,
        SessionState,
        SnapshotInput,
        TakenMessage,
        ToolCallRecord,
        ToolSpec,
        TraceStep,
        TurnResult,
    )
    from hermes.content.tokens import DEFAULT_ENCODING, TokenCounter
    from hermes.tools.routing import offered_tools

    from workflows.session import calls, commands, lifecycle, patches
    from workflows.session import turn as turns
    from workflows.session.memory_path import MemoryPath
    from workflows.session.model_steps import ModelSteps
    from workflows.session.signals import SignalGuard
    from workflows.session.payloads import ARCHIVE_CHUNK_BYTES, MAX_CARRY_PAYLOAD_BYTES, MAX_TURN_RESULT_BYTES, slim
    from workflows.session.state import SessionCore
    from workflows.session.tool_runner import ToolRunner
    from workflows.session.tool_step import StepTally
    from workflows.session.transcript import Transcript

    # Loaded here, outside the sandbox: tiktoken finds its encodings by importing plugin
    # modules and takes locks, which workflow code may not do.
    TokenCounter.get(DEFAULT_ENCODING)


@workflow.defn(name=names.SESSION_WORKFLOW)
class SessionWorkflow:
    @workflow.init
    def __init__(self, inp: SessionInput) -> None:
        self._patches: dict[str, bool] = {}
        self._s = SessionCore(inp, now=workflow.now(), first_run_id=workflow.info().first_execution_run_id, patched=self._patched)
        self._lock = asyncio.Lock()
        self._background: list[asyncio.Task[None]] = []
        self._tools = ToolRunner(self._s, self._closed_mid_turn)
        self._memory = MemoryPath(self._s)
        self._model = ModelSteps(self._s, self._memory)
        self._guard = SignalGuard(self._s, self._patched)
        self._start_refused = self._guard.start_refusal(inp)
        self._held_figures: lifecycle.RunFigures | None = None

    @property
    def _cfg(self) -> SessionConfig:
        return self._s.cfg

    @_cfg.setter
    def _cfg(self, cfg: SessionConfig) -> None:
        self._s.cfg = cfg

    # ------------------------------------------------------------------ run

    @workflow.run
    async def run(self, inp: SessionInput) -> SessionState:
        # Every patch is decided once, in the run's first workflow task: a run recorded
        # before a change replays it without the change to its end, and a patch marker's
        # position never depends on when local activities (validation, audit) resolved.
        s = self._s
        self._patched(patches.TOOL_LAYER_V2)
        if self._start_refused is not None and self._patched(patches.COMMAND_AUTH):
            self._guard.count(names.START_SESSION, self._start_refused)
            raise ApplicationError(
                f"session start refused: {self._start_refused}", type="CommandRefusedError", non_retryable=True
            )
        self._memory.resume_carried()
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
                    lambda: s.status == "closed"
                    or self._must_roll_over()
                    or (self._idle() and (self._should_roll_over() or bool(s.book.audit_buffer))),
                    timeout=self._lifecycle_timeout(),
                    timeout_summary="idle check",
                )
            except asyncio.TimeoutError:
                if self._lifecycle_due():
                    final = await self._archive_session()
                    if final is not None:
                        return final
                continue
            if s.book.audit_buffer and s.status != "closed" and not self._must_roll_over():
                # Decisions that arrived between turns; under the turn lock, so this write
                # never interleaves with a turn's local activities.
                async with self._lock:
                    await self._tools.flush_audit()
                if not (self._should_roll_over() and self._idle()):
                    continue
            s.draining = True
            await workflow.wait_condition(lambda: workflow.all_handlers_finished() and self._idle())
            if s.status == "closed":
                workflow.upsert_search_attributes([names.SA_STATUS.value_set("closed")])
                await self._tools.flush_audit()
                self._schedule_index_update()
                self._memory.at_end("close")
                await self._drain_background(final=True)
                return self._state()
            await self._tools.flush_audit()
            await self._drain_background()
            if s.status == "closed":
                continue  # closed while the index writes drained: close, do not roll over
            if not await archive_for_carry(s, self._model, self._patched):
                # Too large to carry and not archived: keep this run going (messages are
                # taken again) and try later, not a continue-as-new the server refuses.
                s.draining = False
                await workflow.sleep(timedelta(seconds=60))
                continue
            workflow.continue_as_new(
                SessionInput(session_id=inp.session_id, user_id=inp.user_id, channel=inp.channel, config=s.cfg, carry=s.carry(context=True)),
                initial_versioning_behavior=calls.MOVE_TO_CURRENT_BUILD,
            )

    def _figures(self) -> lifecycle.RunFigures:
        """The run's figures, made again only when one changed (the run loop's condition
        reads them at every step of a turn; history grows only between activations)."""
        info, held = workflow.info(), self._held_figures
        length, updates, live = info.get_current_history_length(), self._s.updates_this_run, self._s.transcript.live_bytes
        if held is None or held.history_length != length or held.updates != updates or held.live_bytes != live:
            held = self._held_figures = lifecycle.RunFigures(
                updates=updates, history_length=length, history_bytes=info.get_current_history_size(),
                suggested=info.is_continue_as_new_suggested(), live_bytes=live,
            )
        return held

    def _should_roll_over(self) -> bool:
        return lifecycle.should_roll_over(
            self._s.cfg, self._figures(), bounded_context=self._patched(patches.BOUNDED_CONTEXT),
            bounded_work=self._patched(patches.BOUNDED_WORK),
        )

    def _must_roll_over(self) -> bool:
        return lifecycle.must_roll_over(self._s.cfg, self._figures(), bounded_context=self._patched(patches.BOUNDED_CONTEXT))

    def _idle(self) -> bool:
        return self._s.idle(self._lock.locked())

    def _quiet(self) -> bool:
        """Nothing runs beside the turn and nothing waits after it: no message queued, no
        memory extraction, summary or background write (the run continues as new as soon
        as the turn's handler returns)."""
        summary = self._model.summary_task
        return (
            not self._s.queued and self._s.status != "closed" and not self._memory.running()
            and (summary is None or summary.done()) and all(t.done() for t in self._background)
        )

    def _lifecycle_timeout(self) -> timedelta | None:
        """Time until the session turns idle, or (idle) until it is archived (seed 000
        §1.3); None before the patch or closed."""
        s = self._s
        if s.status == "closed" or not self._patched(patches.BOUNDED_CONTEXT):
            return None
        return lifecycle.idle_timeout(
            s.cfg, now=workflow.now(), last_active_at=s.last_active_at, idle_marked=s.idle_marked, not_before=s.lifecycle_not_before
        )

    def _lifecycle_due(self) -> bool:
        """On the idle timer: mark the session idle; True when it is due for archiving."""
        s, now = self._s, workflow.now()
        if not self._idle() or s.book.pending or s.status == "closed" or now < s.lifecycle_not_before:
            return False
        if lifecycle.due_for_archive(s.cfg, now, s.last_active_at):
            return True
        if lifecycle.turns_idle(s.cfg, now, s.last_active_at, s.idle_marked):
            s.idle_marked = True
            if not s.book.halted_on:
                workflow.upsert_search_attributes([names.SA_STATUS.value_set("idle")])
            self._schedule_index_update()
        return False

    async def _archive_session(self) -> SessionState | None:
        """Write the final snapshot and end the run (the next message resumes from it).

        Returns:
            The final state (with ``snapshot``), or None when archiving must wait (a
            message arrived, the session closed, or the state is too large to carry).
        """
        s = self._s
        s.draining = True
        await workflow.wait_condition(lambda: workflow.all_handlers_finished() and self._idle())
        if s.status == "closed" or s.queued or lifecycle.active_since_idle(s.cfg, workflow.now(), s.last_active_at):
            s.draining = False
            return None
        await self._tools.flush_audit()
        self._memory.at_end("archive")
        await self._drain_background(final=True)
        snapshot = None
        if await archive_for_carry(self._s, self._model, self._patched):
            snapshot = s.carry()
            snapshot.status = "archived"
            try:
                await calls.save_snapshot(SnapshotInput(session_id=s.inp.session_id, carry=snapshot))
            except ActivityError:
                # Redis is down: stay open (taking messages) and try again later, rather
                # than end without the snapshot's second copy.
                workflow.logger.warning("session snapshot not written; archiving again in 10 minutes")
                snapshot = None
        if snapshot is None:
            s.draining = False
            s.lifecycle_not_before = workflow.now() + timedelta(minutes=10)
            return None
        s.archived_state = True
        workflow.upsert_search_attributes([names.SA_STATUS.value_set("archived")])
        self._schedule_index_update()
        await self._drain_background()
        return self._state().model_copy(update={"snapshot": snapshot})

    async def _drain_background(self, *, final: bool = False) -> None:
        """Wait for the memory extractions (:meth:`MemoryPath.drain`), a running summary
        (:meth:`ModelSteps.drain_summary`) and the background writes."""
        await self._memory.drain(final=final)
        await self._model.drain_summary()
        while self._background:
            await self._background.pop()

    # ------------------------------------------------------------- updates

    @workflow.update(name=names.SEND_MESSAGE)
    async def send_message(self, inp: SendMessageInput) -> TurnResult:
        """Run one user turn (``inp``: the text and an optional client message id) and
        return the reply with its tool calls; a resend of an answered id returns that
        answer and runs no second turn."""
        s = self._s
        s.updates_this_run += 1
        cid = inp.client_message_id
        if cid is not None:
            if cid in s.replies.completed:
                return s.replies.completed[cid]
            if cid in s.in_flight_ids:
                await workflow.wait_condition(lambda: cid in s.replies.completed or cid not in s.in_flight_ids)
                if cid in s.replies.completed:
                    return s.replies.completed[cid]
                raise ApplicationError(
                    "the first copy of this message failed before it was answered; send it again with a new id",
                    type="MessageFailedError",
                    non_retryable=True,
                )
            answered = s.transcript.answer(s.inp.session_id, cid)
            if answered is None and cid in s.replies.answered and self._patched(patches.BOUNDED_WORK):
                answered = s.replies.already_answered(s.inp.session_id, cid)
            if answered is not None:
                return answered
            s.in_flight_ids.add(cid)
        s.queued += 1
        try:
            async with self._lock:
                s.queued -= 1
                result = await self._run_turn(inp)
        finally:
            if cid is not None:
                s.in_flight_ids.discard(cid)
        if cid is not None:
            result.client_message_id = cid
            s.replies.remember(cid, result)
        return slim(result, MAX_TURN_RESULT_BYTES)

    def _knows(self, cid: str | None) -> bool:
        # Read from the decided patches: a validator issues no command.
        return self._s.knows(cid, bounded_work=self._patches.get(patches.BOUNDED_WORK, False))

    @send_message.validator
    def _validate_send_message(self, inp: SendMessageInput) -> None:
        # Which messages are taken (commands.admission): only acceptance depends on it,
        # never an accepted update's commands, and validators are not run on replay.
        refusal = commands.admission(
            self._s, inp, knows=self._knows(inp.client_message_id), start_refused=self._start_refused,
            ring=command_auth.worker_ring(), now=workflow.now(),
        )
        if refusal is not None:
            if refusal[0] == "CommandRefusedError":
                self._guard.count(names.SEND_MESSAGE, refusal[1])
            raise ApplicationError(refusal[1], type=refusal[0], non_retryable=refusal[2])

    @workflow.update(name=names.SETTLE_MESSAGE)
    def settle_message(self, client_message_id: str) -> bool:
        """Whether this session took message ``client_message_id``, asked by a client about
        to report it busy after refusals from Temporal, not from this session: such a
        refusal does not prove it was never taken (aborted updates are retried, and an
        attempt already sent may still be accepted). Updates arrive in the order they were
        admitted, so the validator's refusal settles it as never taken; acceptance (True)
        means taken: resend it under the same id for its reply."""
        return True

    @settle_message.validator
    def _validate_settle_message(self, client_message_id: str) -> None:
        if not self._knows(client_message_id):
            raise ApplicationError("the session has not taken this message", type="MessageNotTaken", non_retryable=True)

    # ------------------------------------------------------------- signals

    # Signals parse their ``*args`` (SignalGuard.parse): refused and noted, never a failed task.
    @workflow.signal(name=names.APPROVE_TOOL_CALL)
    def approve_tool_call(self, *args: Any) -> None:
        """Approve a pending tool call (an :class:`ApprovalDecision`). Unknown or already settled ids change nothing."""
        self._decide(names.APPROVE_TOOL_CALL, args, approved=True)

    @workflow.signal(name=names.REJECT_TOOL_CALL)
    def reject_tool_call(self, *args: Any) -> None:
        """Reject a pending tool call (an :class:`ApprovalDecision`); the model is told it was denied."""
        self._decide(names.REJECT_TOOL_CALL, args, approved=False)

    def _decide(self, command: str, args: tuple[Any, ...], *, approved: bool) -> None:
        parsed = self._guard.parse(command, args, (ApprovalDecision,))
        if parsed is None:
            return
        decision: ApprovalDecision = parsed[0]
        refusal = self._guard.refusal(command, decision, decision.proof, sender=decision.approver)
        if refusal != "duplicate":  # a resend of a proof already taken changes nothing
            self._s.book.decide(decision.model_copy(update={"approved": approved}), workflow.now(), refusal=refusal)

    @workflow.signal(name=names.SET_SYSTEM_PROMPT)
    def set_system_prompt(self, *args: Any) -> None:
        """Replace the system prompt (a ``str``, then its proof) from the next model call on;
        one over ``max_system_prompt_bytes`` is refused and listed in the state's ``notices``."""
        s = self._s
        parsed = self._guard.parse(names.SET_SYSTEM_PROMPT, args, (str, CommandProof | None))
        if parsed is None or self._guard.refusal(names.SET_SYSTEM_PROMPT, parsed[0], parsed[1]):
            return
        size = len(parsed[0].encode("utf-8", "surrogatepass"))
        if size > s.cfg.max_system_prompt_bytes:
            s.gate.note(workflow.now(), f"system prompt of {size} bytes refused (limit {s.cfg.max_system_prompt_bytes}); the previous one stays")
            return
        s.system_prompt = parsed[0]

    @workflow.signal(name=names.CANCEL_TURN)
    def cancel_turn(self, *args: Any) -> None:
        """Stop the current turn at once (argument: its proof); queued messages still run."""
        parsed = self._guard.parse(names.CANCEL_TURN, args, (CommandProof | None,))
        if parsed is None or self._guard.refusal(names.CANCEL_TURN, None, parsed[0]):
            return
        if self._s.current_turn is not None:
            self._s.cancel_requested = True

    @workflow.signal(name=names.CLOSE_SESSION)
    def close_session(self, *args: Any) -> None:
        """Close the session (argument: its proof): pending approvals are denied, new messages refused."""
        parsed = self._guard.parse(names.CLOSE_SESSION, args, (CommandProof | None,))
        if parsed is not None and not self._guard.refusal(names.CLOSE_SESSION, None, parsed[0]):
            self._s.status = "closed"

    # ------------------------------------------------------------- queries

    @workflow.query(name=names.GET_STATE)
    def get_state(self) -> SessionState:
        return self._state()

    @workflow.query(name=names.GET_TRANSCRIPT)
    def get_transcript(self) -> list[Message]:
        return self._s.transcript.messages

    @workflow.query(name=names.GET_PENDING_APPROVALS)
    def get_pending_approvals(self) -> list[PendingApproval]:
        return list(self._s.book.pending.values())

    @workflow.query(name=names.GET_TRACE)
    def get_trace(self) -> list[TraceStep]:
        return self._s.trace

    @workflow.query(name=names.GET_MODEL_CONTEXT)
    def get_model_context(self, turn: int, step: int) -> list[str] | None:
        """The message references of the model call of ``turn`` and ``step`` if in flight
        (a copy rebuilt from history may have built it a little differently from the
        recorded input; the activity then sends this one, equally valid)."""
        return self._s.planner.inflight_refs(turn, step)

    @workflow.query(name=names.GET_TAKEN_MESSAGES)
    def get_taken_messages(self, prefix: str) -> list[TakenMessage]:
        return self._s.taken(prefix)  # A query issues no command: no patch.

    @workflow.query(name=names.GET_MESSAGE_BODIES)
    def get_message_bodies(self, refs: list[str]) -> dict[str, str]:
        """Bodies (:func:`hermes.content.blobs.body_json`) of the referenced messages and tool
        lists this session holds; references it does not hold are left out."""
        return self._s.planner.bodies(refs, self._s.transcript)

    def _state(self) -> SessionState:
        info = workflow.info()
        return self._s.state(history_length=info.get_current_history_length(), history_bytes=info.get_current_history_size())

    def _patched(self, patch: str) -> bool:
        """Whether this run has ``patch``; all patches are decided together, at the first
        call, which :meth:`run` makes in the first workflow task (a handler that runs
        before it, in the same first activation, decides the same)."""
        if not self._patches:
            self._patches = {name: workflow.patched(name) for name in patches.ALL}
        return self._patches[patch]

    def _closed_mid_turn(self) -> bool:
        # The patch check only once closed: histories without a mid-turn close are unchanged.
        return self._s.status == "closed" and self._patched(patches.STOP_ON_CLOSE)

    # ---------------------------------------------------------- the turn

    async def _run_turn(self, inp: SendMessageInput) -> TurnResult:
        result = await traced_turn(self._s, inp, self._run_turn_inner)
        s = self._s
        if not s.early_archive_failed and self._quiet() and self._should_roll_over() and self._patched(patches.ARCHIVE_AT_REPLY):
            # After the turn's messages are accounted (traced_turn): the archive drops some.
            s.early_archive_failed = not await archive_for_carry(s, self._model, self._patched, before_reply=True)
        return result

    async def _run_turn_inner(self, inp: SendMessageInput) -> TurnResult:
        s = self._s
        s.turn_count += 1
        turn = s.turn_count
        now = s.last_active_at = workflow.now()
        if s.idle_marked:
            s.idle_marked = False
            if not s.book.halted_on and s.status != "closed":
                workflow.upsert_search_attributes([names.SA_STATUS.value_set("active")])
        s.turn_sender = commands.CommandGate.sender_of(inp, s.inp.user_id)
        user_message = Message(
            role="user", content=inp.text, turn=turn, created_at=now, client_message_id=inp.client_message_id, sender=s.turn_sender
        )
        s.transcript.add(user_message, s.count_fn())
        if not s.title:
            s.title = turns.title_of(inp.text)
            # In the memo too, so a session index rebuilt from visibility keeps the title.
            workflow.upsert_memo({names.MEMO_TITLE: s.title})
        if s.status == "closed":
            self._notice(turn, turns.CLOSED_BEFORE_TURN)
            return TurnResult(session_id=s.inp.session_id, turn=turn, reply=turns.CLOSED_BEFORE_TURN, status="closed")
        s.current_turn, s.cancel_requested = turn, False
        s.warnings, s.memories, s.turn_triggers = [], [], None
        records: list[ToolCallRecord] = []
        status, groups = "completed", None
        try:
            specs, tool_groups = await self._list_tools(turn, inp.text)
            s.all_specs = specs
            await self._model.count_exactly(user_message)
            if self._memory.active():
                await self._memory.recall(turn, inp.text)
            groups = self._model.route(inp.text, tool_groups)
            tally = StepTally()
            for iteration in range(s.cfg.max_iterations):
                result: CallModelResult = await self._model.call_model(turn, lambda: offered_tools(s.all_specs, s.last_groups, tally.suggested), iteration)
                specs, groups = s.all_specs, s.last_groups  # a first call may have found the tools changed
                step = s.transcript.unique_tool_call_ids(result.message.tool_calls, turn, iteration, s.book.settled)
                assistant = result.message.model_copy(update={"turn": turn, "created_at": workflow.now(), "tool_calls": step})
                s.transcript.add(assistant, s.count_fn())
                if not step:
                    reply = assistant.content or ""
                    if not reply.strip():
                        reply = turns.EMPTY_ANSWER
                        self._notice(turn, reply)
                    break
                await self._tools.run_step(turn, step, specs, records)
                exhausted = tally.count(step, records[-len(step):], specs, s.cfg.max_argument_retries)
                if exhausted is not None:
                    raise turns.ArgumentsExhausted(*exhausted)
                if self._closed_mid_turn():
                    raise turns.SessionClosedMidTurn()
            else:
                status, reply = "max_iterations", turns.max_iterations_reply(s.cfg)
                self._notice(turn, reply)
        except turns.TurnStop as stop:
            status, reply = stop.status, stop.reply(s.cfg)
            s.transcript.close_open_tool_calls(turn, records, workflow.now(), s.count_fn())
            self._notice(turn, reply)
        finally:
            s.current_turn, s.cancel_requested = None, False

        await self._tools.flush_audit()
        s.last_active_at = workflow.now()
        self._schedule_index_update(finished=(turn, status))
        self._model.start_summary_if_due(turn)
        if self._memory.active():
            try:
                self._memory.after_reply(turn, inp.text, reply, status, records)
            except Exception:  # noqa: BLE001 - memory must never cost the user the reply
                workflow.logger.exception("memory write path failed for turn %d", turn)
                s.warnings.append("This message could not be considered for long-term memory (an internal error).")
        return TurnResult(
            session_id=s.inp.session_id, turn=turn, reply=reply, status=status,  # type: ignore[arg-type]
            tool_calls=records, tool_groups=groups, warnings=list(s.warnings), memories=list(s.memories),
        )

    async def _list_tools(self, turn: int, text: str) -> tuple[dict[str, ToolSpec], list[Any]]:
        """The worker's tools for this turn, with its recall when it can come along (:meth:`ModelSteps.begin_turn`)."""
        return await self._model.begin_turn(self._memory.early_search(turn, text) if self._patched(patches.BEGIN_TURN) else None)

    def _notice(self, turn: int, text: str) -> None:
        self._s.transcript.notice(turn, text, workflow.now(), self._s.count_fn())

    def _schedule_index_update(self, finished: tuple[int, str] | None = None) -> None:
        # The index is a cache: Temporal stays the source of truth, `hermes sessions`
        # rebuilds it. A Redis outage must not fail a turn. At a turn's end it also
        # publishes the turn_finished event (hermes.content.events).
        self._background = [t for t in self._background if not t.done()]
        task = calls.write_index(self._s.index_entry(finished), by_sink=self._patched(patches.INDEX_SINK))
        self._background.extend([task] if task is not None else [])


async def traced_turn(
    s: SessionCore, inp: SendMessageInput, run: Callable[[SendMessageInput], Awaitable[TurnResult]]
) -> TurnResult:
    """``run(inp)`` in the turn's span (:mod:`hermes.infra.telemetry`: replay-safe, issues no
    command; the turn's activities are its children through Temporal headers), the
    transcript's new messages accounted for afterwards whatever happens."""
    first_new = len(s.transcript.messages)
    attributes = telemetry.turn_attributes(s.inp, s.turn_count + 1, inp.text) if telemetry.enabled() else None
    with telemetry.span("hermes.turn", attributes) as span:
        try:
            result = await run(inp)
        finally:
            s.transcript.account(first_new)
        telemetry.set_attributes(span, telemetry.turn_result_attributes(result) if span is not None else {})
        telemetry.count_turn(result.status)
        return result


async def archive_for_carry(
    s: SessionCore, model: ModelSteps, patched: Callable[[str], bool], *, before_reply: bool = False
) -> bool:
    """Make the state carried across continue-as-new fit ``max_carry_bytes``, and
    leave out the turns the running summary covers (:meth:`Transcript.archive_cut`):
    they go to the transcript archive in chunks of at most 1 MB, folded into the
    summary first; if the rest is still too large, the resend cache and then the
    trace are trimmed. Sizes are the JSON the payload will be, escapes included.

    ``before_reply``: called at the end of the turn after which the run continues as new
    (``archive-at-reply`` patch), under the turn's lock, so that the roll-over needs no
    activity once the turn's reply is sent: the run continues as new in the workflow
    task that completes the message, and the next message lands on the new run instead
    of being refused as busy while this one archives (issue 31: two refused attempts and
    an update-with-start at every roll-over of a busy session). Only the summarized turns
    are archived then; a state over budget (which may need a summary, a model call) is
    left to the roll-over after the reply, as before.

    Returns:
        False if the state is still over Temporal's payload limit (archiving failed), or
        ``before_reply`` and over budget, or ``before_reply`` and the archive failed (its
        one attempt, :data:`calls.EARLY_ARCHIVE_SECONDS`): the caller must not continue as
        new yet (the run archives again after the reply, with retries).
    """
    transcript = s.transcript
    summarized = transcript.summarized_prefix(s.summary if patched(patches.ARCHIVE_SUMMARIZED) else None)
    over_budget = s.carry_bytes() > s.cfg.max_carry_bytes
    if not over_budget and not summarized:
        return True
    if before_reply and over_budget:
        return False
    messages = transcript.messages
    cut, sizes, starts = transcript.archive_cut(s.cfg.max_carry_bytes, over_budget, summarized)
    if cut and patched(patches.BOUNDED_CONTEXT):
        # Turns leaving the state leave the model's context too (if the summary fails
        # they are archived anyway: the payload limit leaves no choice).
        last = messages[cut - 1].turn
        if last > (s.summary.upto_turn if s.summary else 0):
            await model.summarize(s.turn_count, last)
    archived_upto, failed = 0, False
    try:
        for start, end in Transcript.chunks(sizes, cut, ARCHIVE_CHUNK_BYTES):
            await calls.archive_messages(
                ArchiveMessagesInput(
                    session_id=s.inp.session_id, chain_id=s.chain_id, first_index=transcript.archived + start,
                    messages=messages[start:end],
                ),
                before_reply=before_reply,
            )
            archived_upto = end
    except ActivityError:
        workflow.logger.warning("transcript archive failed; not continuing as new yet", exc_info=True)
        failed = True
    transcript.drop_archived(archived_upto, sizes, starts)
    if failed and before_reply:
        return False
    excess = s.carry_bytes() - s.cfg.max_carry_bytes
    while excess > 0 and s.replies.completed:
        excess -= s.replies.evict_oldest()
    if excess > 0:
        del s.trace[:-50]
    return s.carry_bytes() <= MAX_CARRY_PAYLOAD_BYTES
