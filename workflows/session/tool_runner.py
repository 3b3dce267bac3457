"""The durable side of a model step's tool calls: checks, approvals, tool activities,
fallbacks, and the approval audit log, in the order a recorded history holds.

Workflow code, called by :class:`SessionWorkflow` (it starts activities, waits on
timers and signals, writes search attributes). What to do with each call is decided by
the plain parts: :func:`tool_step.screen`, :class:`ApprovalBook`,
:func:`tool_step.fallback_for`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.exceptions import ActivityError, ChildWorkflowError

with workflow.unsafe.imports_passed_through():
    from hermes import names
    from hermes.infra import telemetry
    from hermes.models import (
        ApprovalAuditBatch,
        ApprovalDecision,
        ApprovalPolicy,
        PendingApproval,
        RunToolInput,
        ToolCall,
        ToolCallRecord,
        ToolResult,
        ToolResultCode,
        ToolSpec,
    )

    from workflows.session import calls, patches
    from workflows.session.approvals import denial
    from workflows.session.state import SessionCore
    from workflows.session.tool_step import cancelled_while_running, checked_call, closed_before_run, screen
    from workflows.session.tool_step import fallback_call, fallback_for, fallback_result
    from workflows.session.turn import TurnCancelled
    from workflows.tool_calls import failure_text, result_from_failure


class ToolRunner:
    """Runs the tool calls of a session's model steps.

    Args:
        core: the session's state.
        closed_mid_turn: whether the session was closed while this turn runs (and the run
            stops turns on close).
    """

    def __init__(self, core: SessionCore, closed_mid_turn: Callable[[], bool]) -> None:
        self.core = core
        self.closed_mid_turn = closed_mid_turn

    def _trace(self, turn: int, kind: str, started: Any, **fields: Any) -> None:
        self.core.add_trace(turn, kind, started, workflow.now(), **fields)

    async def run_step(self, turn: int, step: list[ToolCall], specs: dict[str, ToolSpec], records: list[ToolCallRecord]) -> None:
        """Run the tool calls of one model step: exactly one result per call, in order.

        Calls that need a human are checked first and all put up for decision at once
        (the approver sees the whole step); calls that need nobody run in order
        meanwhile (:meth:`_run_meanwhile`); a denied call is reported, never run. The
        results go to ``records`` and the transcript in the model's order. Runs recorded
        before tool-layer-v2 replay its command order: no check before an approval, and
        approvals requested one at a time (:data:`tool_step.Screen`); runs recorded
        before free-calls-meanwhile run every call in the model's order, a free call
        after a gated one waiting for its verdict."""
        core = self.core
        early: dict[str, ToolResult] = {}
        gated: dict[str, PendingApproval] = {}
        prepared: dict[str, ToolCall] = {}
        lazy: dict[str, ApprovalPolicy] = {}
        try:
            for call in step:
                spec = specs.get(call.name)
                policy, reason = core.book.policy(call, spec, core.cfg.approval_policies) if spec else (None, "")
                screening = screen(call, spec, specs, policy, v2=core.patched(patches.TOOL_LAYER_V2))
                if screening.screen == "refused":
                    early[call.tool_call_id] = screening.result  # type: ignore[assignment]
                elif screening.screen == "ask_later":
                    lazy[call.tool_call_id] = policy  # type: ignore[assignment]
                elif screening.screen == "check":
                    assert spec is not None and policy is not None
                    checked = await calls.validate_tool_call(self.tool_input(turn, call, spec), call.name)
                    if checked.error is not None:
                        early[call.tool_call_id] = checked.error
                        continue
                    prepared[call.tool_call_id] = checked_call(call, checked.arguments, checked.arguments_ref)
                    if policy.action != "run":
                        gated[call.tool_call_id] = self.request_approval(turn, prepared[call.tool_call_id], spec, policy, reason)
            await self.flush_audit()
            if core.patched(patches.FREE_CALLS_MEANWHILE):
                await self._run_meanwhile(turn, step, specs, records, early, gated, prepared)
                return
            await self.flush_audit()
            for call in step:
                tcid = call.tool_call_id
                record = ToolCallRecord(tool_call_id=tcid, name=call.name, arguments=call.arguments, result=ToolResult())
                if tcid in early:
                    record.result = early[tcid]
                elif tcid not in gated and tcid not in lazy and self.closed_mid_turn():
                    record.approval, record.result = "cancelled", closed_before_run()
                    self._trace(turn, "tool", workflow.now(), tool_name=call.name, status=f"code_{int(record.result.code)}")
                else:
                    spec = specs[call.name]
                    if tcid in lazy:
                        gated[tcid] = self.request_approval(turn, call, spec, lazy[tcid], "")
                    if tcid in gated:
                        verdict, decision = await self.wait_verdict(turn, gated[tcid])
                        record.approval = verdict  # type: ignore[assignment]
                        record.approver = decision.approver if decision else None
                        if verdict != "approved":
                            record.result = denial(verdict, decision)
                    if record.approval in ("not_required", "approved"):
                        record.result, record.fallback = await self.run_with_fallback(turn, prepared.get(tcid, call), spec, specs)
                records.append(record)
                core.transcript.tool_result(turn, call, record.result, workflow.now(), core.count_fn())
        finally:
            for tcid, waiting in gated.items():
                if self.settle(tcid):
                    core.book.audit("verdict", waiting, now=workflow.now(), outcome="cancelled", detail="the turn ended before a decision")
            await self.flush_audit()

    async def _run_meanwhile(
        self, turn: int, step: list[ToolCall], specs: dict[str, ToolSpec], records: list[ToolCallRecord],
        early: dict[str, ToolResult], gated: dict[str, PendingApproval], prepared: dict[str, ToolCall],
    ) -> None:
        """The second half of :meth:`run_step` with the free-calls-meanwhile patch: the
        free calls run in the model's order in one task while the gated calls' verdicts
        are awaited (and each approved call run) in the model's order; once all are done
        (or the turn stops), the results are recorded in the model's order. A call that
        was running when the turn was cancelled gets an unknown outcome, one that never
        ran is answered as not run (:meth:`Transcript.not_run`).

        Raises:
            TurnCancelled: the turn was cancelled meanwhile.
        """
        core = self.core
        done: dict[str, ToolCallRecord] = {}
        running: dict[str, ToolCallRecord] = {}

        def record_of(call: ToolCall) -> ToolCallRecord:
            return ToolCallRecord(tool_call_id=call.tool_call_id, name=call.name, arguments=call.arguments, result=ToolResult())

        async def run(call: ToolCall, record: ToolCallRecord) -> None:
            running[call.tool_call_id] = record
            record.result, record.fallback = await self.run_with_fallback(
                turn, prepared.get(call.tool_call_id, call), specs[call.name], specs, note_cancel=False
            )
            running.pop(call.tool_call_id, None)

        async def run_free() -> None:
            for call in step:
                if call.tool_call_id in early or call.tool_call_id in gated:
                    continue
                record = record_of(call)
                if self.closed_mid_turn():
                    record.approval, record.result = "cancelled", closed_before_run()
                    self._trace(turn, "tool", workflow.now(), tool_name=call.name, status=f"code_{int(record.result.code)}")
                else:
                    await run(call, record)
                done[call.tool_call_id] = record

        free = asyncio.create_task(run_free())
        try:
            for call in step:
                tcid = call.tool_call_id
                if tcid in early:
                    done[tcid] = record_of(call)
                    done[tcid].result = early[tcid]
                elif tcid in gated:
                    record = record_of(call)
                    verdict, decision = await self.wait_verdict(turn, gated[tcid])
                    record.approval = verdict  # type: ignore[assignment]
                    record.approver = decision.approver if decision else None
                    if verdict == "approved":
                        await run(call, record)
                    else:
                        record.result = denial(verdict, decision)
                    done[tcid] = record
            await free
        finally:
            if not free.done() and not core.cancel_requested:
                free.cancel()  # the turn stopped while free calls ran: they stop with it
            # A cancelled turn's free calls stop by themselves (``calls.cancellable``); their
            # error is the turn's, already on its way.
            with contextlib.suppress(BaseException):
                await free
            for call in step:
                if call.tool_call_id in done:
                    records.append(done[call.tool_call_id])
                    core.transcript.tool_result(turn, call, done[call.tool_call_id].result, workflow.now(), core.count_fn())
                elif call.tool_call_id in running:  # in the turn's result too, with its approval
                    record = running[call.tool_call_id]
                    record.result, record.fallback = cancelled_while_running(), None
                    records.append(record)
                    core.transcript.tool_result(turn, call, record.result, workflow.now(), core.count_fn())
                else:  # the turn stopped first
                    core.transcript.not_run(turn, call, records, workflow.now(), core.count_fn())

    async def run_with_fallback(
        self, turn: int, call: ToolCall, spec: ToolSpec, specs: dict[str, ToolSpec], *, note_cancel: bool = True
    ) -> tuple[ToolResult, str | None]:
        """Run ``call``; then its fallback tool if the failure allows (the result says so).
        ``note_cancel``: as in :meth:`run_tool`."""
        result = await self.run_tool(turn, call, spec, note_cancel=note_cancel)
        warning = self.core.book.note_result(call, spec, result)
        if warning is not None:
            self.core.warnings.append(warning)
        fallback = fallback_for(result, spec, specs)
        if fallback is None:
            return result, None
        fb_result = await self.run_tool(turn, fallback_call(call, fallback), fallback, note_cancel=note_cancel)
        return fallback_result(spec, fallback, result, fb_result), fallback.name

    def request_approval(self, turn: int, call: ToolCall, spec: ToolSpec, policy: ApprovalPolicy, reason: str) -> PendingApproval:
        book = self.core.book
        pending = book.request(
            turn, call, spec, policy, reason, now=workflow.now(), default_timeout_seconds=self.core.cfg.approval_timeout_seconds,
            requested_by=self.core.turn_sender,
        )
        workflow.upsert_search_attributes([names.SA_PENDING_APPROVALS.value_set(len(book.pending))])
        return pending

    def settle(self, tcid: str) -> bool:
        """Settle ``tcid`` in the book and update the search attributes; False if it was
        not pending."""
        book = self.core.book
        if not book.settle(tcid):
            return False
        updates = [names.SA_PENDING_APPROVALS.value_set(len(book.pending))]
        if not book.halted_on and self.core.status != "closed":
            updates.append(names.SA_STATUS.value_set("active"))
        workflow.upsert_search_attributes(updates)
        return True

    async def wait_verdict(self, turn: int, pending: PendingApproval) -> tuple[str, ApprovalDecision | None]:
        """Wait for a decision on ``pending`` until it expires; then deny, or halt the
        session (policy ``on_expiry="halt"``) and keep waiting for a human. Traced as
        ``hermes.approval_wait`` and counted in ``hermes.approvals.pending`` and
        ``hermes.approval.wait`` (:mod:`hermes.infra.telemetry`; no command).

        Raises:
            TurnCancelled: the turn was cancelled while it waited.
        """
        attributes = None
        if telemetry.enabled():
            attributes = {
                "hermes.session_id": self.core.inp.session_id, "hermes.turn": turn, "gen_ai.tool.name": pending.tool_name,
                "gen_ai.tool.call.id": pending.tool_call_id, "hermes.approval.on_expiry": pending.on_expiry,
            }
        started = workflow.now()
        telemetry.approval_pending(1)
        # Counted down on a verdict or an error, not on a cancelled task (a run evicted
        # from a stopping worker): the worker that replays it counts it down.
        try:
            with telemetry.span("hermes.approval_wait", attributes) as span:
                verdict, decision = await self._wait_verdict(turn, pending)
                telemetry.set_attributes(span, {"hermes.approval.verdict": verdict})
        except Exception:
            telemetry.approval_settled((workflow.now() - started).total_seconds(), "cancelled")
            raise
        telemetry.approval_settled((workflow.now() - started).total_seconds(), verdict)
        return verdict, decision

    async def _wait_verdict(self, turn: int, pending: PendingApproval) -> tuple[str, ApprovalDecision | None]:
        """:meth:`wait_verdict` without its telemetry."""
        core, book = self.core, self.core.book
        # The approval's trace step runs from its request (its expiry counts from there),
        # not from when this wait began (after the request's own audit and events).
        started = min(pending.requested_at, workflow.now())
        tcid = pending.tool_call_id

        def decided() -> bool:
            return book.decided(tcid) or core.cancel_requested or core.status == "closed"

        def woken() -> bool:  # a decision, or audit entries (a refused decision) to write now
            return decided() or bool(book.audit_buffer)

        expired = waited = False
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
            await self.flush_audit()
        if expired:
            if pending.on_expiry != "halt":
                self.settle(tcid)
                book.audit("verdict", pending, now=workflow.now(), outcome="expired")
                await self.flush_audit()
                self._trace(turn, "approval", started, tool_name=pending.tool_name, status="expired")
                return "expired", None
            book.halt(pending, workflow.now())
            workflow.upsert_search_attributes([names.SA_STATUS.value_set("halted")])
            await self.flush_audit()
            while not decided():
                await workflow.wait_condition(woken)
                await self.flush_audit()
        decision: ApprovalDecision | None = None
        if book.decided(tcid):
            decision = book.verdicts[tcid]
            verdict = "approved" if decision.approved else "rejected"
        elif core.cancel_requested:
            self.settle(tcid)
            book.audit("verdict", pending, now=workflow.now(), outcome="cancelled", detail="the turn was cancelled")
            await self.flush_audit()
            raise TurnCancelled()
        else:
            verdict = "cancelled"
        self.settle(tcid)
        book.audit(
            "verdict", pending, now=workflow.now(), outcome=verdict, approver=decision.approver if decision else None,
            approved=decision.approved if decision else None, reason=decision.reason if decision else None,
        )
        await self.flush_audit()
        self._trace(turn, "approval", started, tool_name=pending.tool_name, status=verdict)
        return verdict, decision

    def tool_input(self, turn: int, call: ToolCall, spec: ToolSpec | None) -> RunToolInput:
        core = self.core
        return RunToolInput(
            session_id=core.inp.session_id, user_id=core.inp.user_id, turn=turn, tool_call=call,
            idempotent=spec.idempotent if spec is not None else True, mcp=spec.mcp if spec is not None else None,
            chain_id=core.chain_id,
        )

    async def run_tool(self, turn: int, call: ToolCall, spec: ToolSpec, *, note_cancel: bool = True) -> ToolResult:
        """One tool call (a composite one as a child workflow), cancellable with the turn.
        ``note_cancel``: a cancelled call's unknown outcome goes to the transcript here
        (False: the caller puts it there, in the step's order).

        Raises:
            TurnCancelled: its result is then recorded as an unknown outcome.
        """
        core = self.core
        started = workflow.now()
        request = self.tool_input(turn, call, spec)
        if spec.composite is not None:
            task: Any = asyncio.create_task(calls.run_composite(request, spec, core.all_specs))
        else:
            task = calls.start_tool(request, spec)
        try:
            result: ToolResult = await calls.cancellable(task, lambda: core.cancel_requested)
        except TurnCancelled:
            self._trace(turn, "tool", started, tool_name=call.name, status="cancelled")
            if note_cancel:
                core.transcript.tool_result(turn, call, cancelled_while_running(), workflow.now(), core.count_fn())
            raise
        except ActivityError as err:
            result = result_from_failure(err, spec)
        except ChildWorkflowError as err:
            result = ToolResult(code=ToolResultCode.DEPENDENCY_UNAVAILABLE, message=f"composite tool failed: {failure_text(err)}"[:2000])
        self._trace(turn, "tool", started, tool_name=call.name, status="ok" if result.ok else f"code_{int(result.code)}")
        return result

    async def flush_audit(self) -> None:
        """Write the buffered audit entries (one local activity, awaited in line: audit
        writes never interleave with the turn's other local activities, so the order of
        commands is the same on replay)."""
        if self.core.book.audit_buffer:
            await calls.record_audit(ApprovalAuditBatch(entries=self.core.book.take_audit()))
