"""Memory workflows: one writer per user, and the scheduled consolidation.

The writer (:class:`MemoryWriterWorkflow`, id ``hermes-memory-writer:<user_id>``) receives
candidates from every session of its user and writes them in batches of 10 items or 5 s
(seed 004 §9). One writer per user serialises that user's writes, so deduplication and
conflict checks never race each other; the candidates are in its history until written, so
a worker crash loses none. A "forget me" goes through it too: what is pending is dropped
with the rows, and what arrives later from before the request is refused.

The consolidation (:class:`MemoryConsolidationWorkflow`) is started by a Temporal Schedule
(hourly, overlapping runs skipped): per user, it merges near-duplicates, resolves conflicts,
expires rows past ``valid_until`` and archives rows unused for N days, then reports.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError

with workflow.unsafe.imports_passed_through():
    from hermes import names
    from hermes.infra import telemetry
    from hermes.memory.judge import JudgeMemoriesInput, JudgeReport
    from hermes.memory.models import (
        ConsolidateInput,
        ConsolidationInput,
        ConsolidationReport,
        ForgetReport,
        MemoryBatch,
        MemoryCandidate,
        MemoryWriterInput,
        WriteMemoriesInput,
        WriteReport,
    )
    from hermes.security import command_auth
    from hermes.security.proof import CommandProof
    from workflows.session.calls import MOVE_TO_CURRENT_BUILD

COMMAND_AUTH_PATCH = "memory-command-auth"
"""Memory commands are applied only with a valid proof of their sender
(:mod:`hermes.security.command_auth`): a batch signal, a writer's or a consolidation's start
(issue 26). The updates are checked in their validators, which need no patch."""
_MAX_SEEN = 2000
_FLUSHES_PER_RUN = 200
_MISMATCH_RETRY = timedelta(minutes=10)
_JUDGE_RETRY = RetryPolicy(initial_interval=timedelta(seconds=1), maximum_interval=timedelta(seconds=30), maximum_attempts=5)
"""The judge's store work is retried a few times; a judgement that still fails leaves both
rows active (the next consolidation puts the pair before the judge again)."""
_WRITE_RETRY = RetryPolicy(initial_interval=timedelta(seconds=1), maximum_interval=timedelta(seconds=60))
"""Store writes retry without limit: a candidate is never dropped because LanceDB was down."""


def _refused(command: str, why: str) -> None:
    """Log and count a refused memory command (not again on replay)."""
    if not workflow.unsafe.is_replaying():
        workflow.logger.warning("%s refused %s: %s", workflow.info().workflow_id, command, why)
        telemetry.count_refused_command(command)


def _memory_proof_refusal(command: str, user_id: str, payload: Any, proof: Any) -> str | None:
    """Why a memory command of ``user_id``'s writer is not proven (None: it is): a valid
    proof by the user or an admin."""
    refusal = command_auth.verify(
        command_auth.worker_ring(), command, names.memory_writer_id(user_id), payload, proof, now=workflow.now()
    )
    if refusal is None and not command_auth.acts_for(proof, user_id):
        refusal = f"its proof is by {proof.sender!r}, who is neither {user_id!r} nor an admin"
    return refusal


def _heartbeat(seconds: float) -> timedelta | None:
    """The heartbeat timeout of a store activity (0: none)."""
    return timedelta(seconds=seconds) if seconds > 0 else None


@workflow.defn(name=names.MEMORY_WRITER_WORKFLOW)
class MemoryWriterWorkflow:
    @workflow.init
    def __init__(self, inp: MemoryWriterInput) -> None:
        self._inp = inp
        self._pending: list[MemoryCandidate] = list(inp.pending)
        self._seen: list[str] = list(inp.seen)
        self._seen_set = set(self._seen)
        self._forgotten_at = inp.forgotten_at
        self._first_pending_at = workflow.now() if self._pending else None
        self._forget_requests = 0
        self._forget_done = 0
        self._forget_report: ForgetReport | None = None
        self._write_now: list[tuple[int, list[MemoryCandidate]]] = []
        self._write_now_reports: dict[int, WriteReport] = {}
        self._requests = 0
        self._flushes = 0
        self._written = WriteReport()
        self._patch: bool | None = None
        self._start_refused = None if workflow.info().continued_run_id is not None else _memory_proof_refusal(
            names.START_MEMORY_WRITER, inp.user_id, inp, inp.proof
        )

    def _authenticated(self) -> bool:
        """Whether this run checks its commands' proofs (decided once, at the first ask)."""
        if self._patch is None:
            self._patch = workflow.patched(COMMAND_AUTH_PATCH)
        return self._patch

    def _accept(self, candidates: list[MemoryCandidate]) -> list[MemoryCandidate]:
        fresh = []
        for c in candidates:
            if c.user_id != self._inp.user_id or c.candidate_id in self._seen_set:
                continue
            if self._forgotten_at is not None and c.created_at <= self._forgotten_at:
                continue  # said before the user asked to be forgotten
            self._seen.append(c.candidate_id)
            self._seen_set.add(c.candidate_id)
            fresh.append(c)
        if len(self._seen) > _MAX_SEEN:
            drop = self._seen[: len(self._seen) - _MAX_SEEN]
            self._seen = self._seen[-_MAX_SEEN:]
            self._seen_set.difference_update(drop)
        return fresh

    @workflow.signal(name=names.ADD_MEMORIES)
    def add_memories(self, *args: Any) -> None:
        """Candidates to write (a :class:`MemoryBatch` with its proof); a batch without a
        valid proof, or whose arguments do not parse, is dropped, logged and counted."""
        parsed = command_auth.parse_args(args, (MemoryBatch,))
        if not isinstance(parsed, list):
            _refused(names.ADD_MEMORIES, parsed)
            return
        batch: MemoryBatch = parsed[0]
        if self._authenticated():
            refusal = _memory_proof_refusal(names.ADD_MEMORIES, self._inp.user_id, batch, batch.proof)
            if refusal is not None:
                _refused(names.ADD_MEMORIES, refusal)
                return
        fresh = self._accept(batch.candidates)
        if fresh and not self._pending:
            self._first_pending_at = workflow.now()
        self._pending.extend(fresh)

    @workflow.update(name=names.WRITE_MEMORIES_NOW)
    async def write_memories_now(self, batch: MemoryBatch) -> WriteReport:
        """Write ``batch`` with what is pending, now; returns what this batch did."""
        self._requests += 1
        key = self._requests
        self._write_now.append((key, self._accept(batch.candidates)))
        await workflow.wait_condition(lambda: key in self._write_now_reports)
        return self._write_now_reports.pop(key)

    @write_memories_now.validator
    def _validate_write_now(self, batch: MemoryBatch) -> None:
        # Validators are not run on replay: no patch needed.
        refusal = _memory_proof_refusal(names.WRITE_MEMORIES_NOW, self._inp.user_id, batch, batch.proof)
        if refusal is not None:
            _refused(names.WRITE_MEMORIES_NOW, refusal)
            raise ApplicationError(f"memory write refused: {refusal}", type="CommandRefusedError", non_retryable=True)
        others = {c.user_id for c in batch.candidates} - {self._inp.user_id}
        if others:
            raise ValueError(f"candidates of other users sent to {self._inp.user_id!r}'s writer: {sorted(others)[:3]}")

    @workflow.update(name=names.FORGET_USER)
    async def forget_user(self, proof: CommandProof | None = None) -> ForgetReport:
        """Drop the pending candidates and delete every row of the user (both tables);
        ``proof``: by the user or an admin."""
        self._forget_requests += 1
        wanted = self._forget_requests
        await workflow.wait_condition(lambda: self._forget_done >= wanted)
        assert self._forget_report is not None
        return self._forget_report

    @forget_user.validator
    def _validate_forget(self, proof: CommandProof | None = None) -> None:
        refusal = _memory_proof_refusal(names.FORGET_USER, self._inp.user_id, None, proof)
        if refusal is not None:
            _refused(names.FORGET_USER, refusal)
            raise ApplicationError(f"forget refused: {refusal}", type="CommandRefusedError", non_retryable=True)

    @workflow.query(name="get_pending")
    def get_pending(self) -> list[MemoryCandidate]:
        return list(self._pending)

    def _due(self) -> bool:
        if self._forget_requests > self._forget_done or self._write_now:
            return True
        if not self._pending:
            return False
        if len(self._pending) >= self._inp.batch_size:
            return True
        assert self._first_pending_at is not None
        return workflow.now() - self._first_pending_at >= timedelta(seconds=self._inp.batch_seconds)

    def _wait_timeout(self) -> timedelta:
        if self._pending and self._first_pending_at is not None:
            left = self._first_pending_at + timedelta(seconds=self._inp.batch_seconds) - workflow.now()
            return max(left, timedelta(milliseconds=1))
        return timedelta(seconds=self._inp.idle_seconds)

    @workflow.run
    async def run(self, inp: MemoryWriterInput) -> WriteReport:
        if self._start_refused is not None and self._authenticated():
            _refused(names.START_MEMORY_WRITER, self._start_refused)
            raise ApplicationError(f"memory writer start refused: {self._start_refused}", type="CommandRefusedError", non_retryable=True)
        while True:
            # An idle wait (its timeout is idle_seconds) also ends at the first candidate,
            # so the loop waits again with that candidate's batch_seconds.
            idle = not self._pending
            try:
                await workflow.wait_condition(
                    lambda: self._due() or (idle and bool(self._pending)),
                    timeout=self._wait_timeout(),
                    timeout_summary="next batch",
                )
            except asyncio.TimeoutError:
                if not self._pending and not self._write_now and self._forget_requests == self._forget_done:
                    await workflow.wait_condition(workflow.all_handlers_finished)
                    if not self._pending and not self._write_now:
                        return self._written
                    continue
                if not self._due():
                    continue
            if not self._due():
                continue
            if self._forget_requests > self._forget_done:
                await self._forget()
                continue
            await self._flush()
            if (self._flushes >= _FLUSHES_PER_RUN or workflow.info().is_continue_as_new_suggested()) and not self._write_now:
                await workflow.wait_condition(workflow.all_handlers_finished)
                workflow.continue_as_new(
                    MemoryWriterInput(
                        user_id=inp.user_id,
                        batch_size=inp.batch_size,
                        batch_seconds=inp.batch_seconds,
                        idle_seconds=inp.idle_seconds,
                        pending=self._pending,
                        seen=self._seen,
                        forgotten_at=self._forgotten_at,
                        heartbeat_seconds=inp.heartbeat_seconds,
                        max_judge_calls=inp.max_judge_calls,
                        judge_model=inp.judge_model,
                    ),
                    initial_versioning_behavior=MOVE_TO_CURRENT_BUILD,
                )

    async def _forget(self) -> None:
        target = self._forget_requests
        dropped = len(self._pending) + sum(len(c) for _, c in self._write_now)
        self._pending = []
        self._first_pending_at = None
        self._forgotten_at = workflow.now()
        for key, extra in self._write_now:
            self._write_now_reports[key] = WriteReport(dropped=len(extra), error="the user asked to be forgotten")
        self._write_now = []
        deleted = await workflow.execute_activity(
            names.FORGET_MEMORIES,
            self._inp.user_id,
            start_to_close_timeout=timedelta(seconds=60),
            heartbeat_timeout=_heartbeat(self._inp.heartbeat_seconds),
            retry_policy=_WRITE_RETRY,
            summary=f"forget {self._inp.user_id}",
        )
        self._forget_report = ForgetReport(user_id=self._inp.user_id, deleted=int(deleted), pending_dropped=dropped)
        self._forget_done = target

    async def _flush(self) -> None:
        now_requests, self._write_now = self._write_now, []
        batch = self._pending[: self._inp.batch_size] if not now_requests else list(self._pending)
        for _, extra in now_requests:
            batch.extend(extra)
        if not batch:
            for key, _ in now_requests:
                self._write_now_reports[key] = WriteReport()
            return
        try:
            report = await workflow.execute_activity(
                names.WRITE_MEMORIES,
                WriteMemoriesInput(user_id=self._inp.user_id, candidates=batch, judge=self._inp.max_judge_calls > 0),
                start_to_close_timeout=timedelta(seconds=120),
                heartbeat_timeout=_heartbeat(self._inp.heartbeat_seconds),
                retry_policy=_WRITE_RETRY,
                summary=f"{len(batch)} memories",
                result_type=WriteReport,
            )
        except ActivityError as err:
            cause = err.cause
            if isinstance(cause, ApplicationError) and cause.type == "EmbeddingModelMismatch":
                # The store holds another model's rows until `hermes memory reembed`: keep
                # the batch (nothing is lost) and try again later.
                workflow.logger.warning("memory writes wait for a re-embedding: %s", cause.message)
                self._pending = list(batch) + [c for c in self._pending if c not in batch]
                for key, _ in now_requests:
                    self._write_now_reports[key] = WriteReport(error=f"kept pending: {cause.message}")
                await workflow.sleep(_MISMATCH_RETRY)
                return
            raise
        if report.judge_pairs:
            # After the batch is stored, off every session's path: at most batch_size x 3
            # pairs, at most max_judge_calls model calls (the rest by rules).
            await _judge(self._inp.user_id, report.judge_pairs, self._inp.max_judge_calls, self._inp.judge_model,
                         self._inp.heartbeat_seconds)
            report = report.model_copy(update={"judge_pairs": []})
        self._flushes += 1
        written = {c.candidate_id for c in batch}
        self._pending = [c for c in self._pending if c.candidate_id not in written]
        self._first_pending_at = workflow.now() if self._pending else None
        self._written = self._written.merge(report)
        for key, _ in now_requests:
            self._write_now_reports[key] = report


async def _judge(user_id: str, pairs: list, max_calls: int, model: str | None, heartbeat_seconds: float) -> JudgeReport:
    """Run ``judge_memories`` on ``pairs``; a judge that keeps failing costs its pairs'
    judgement (both rows stay active), never the writer or the consolidation."""
    try:
        return await workflow.execute_activity(
            names.JUDGE_MEMORIES,
            JudgeMemoriesInput(user_id=user_id, pairs=pairs, max_calls=max_calls, model=model),
            start_to_close_timeout=timedelta(minutes=5),
            heartbeat_timeout=_heartbeat(heartbeat_seconds),
            retry_policy=_JUDGE_RETRY,
            summary=f"judge {len(pairs)} memory pairs",
            result_type=JudgeReport,
        )
    except ActivityError as err:
        workflow.logger.warning("memory judge of %s failed: %s", user_id, err.cause or err)
        return JudgeReport(errors=[str(err.cause or err)[:200]])


@workflow.defn(name=names.MEMORY_CONSOLIDATION_WORKFLOW)
class MemoryConsolidationWorkflow:
    """Consolidate every user's memories; returns what changed. Started by the schedule
    ``hermes-memory-consolidation`` (hourly, overlap skipped) or ``hermes memory
    consolidate``."""

    @workflow.run
    async def run(self, inp: ConsolidationInput) -> ConsolidationReport:
        if workflow.info().continued_run_id is None and workflow.patched(COMMAND_AUTH_PATCH):
            refusal = command_auth.verify(
                command_auth.worker_ring(), names.START_CONSOLIDATION, names.CONSOLIDATION_TARGET, inp, inp.proof,
                now=workflow.now(), any_age=True,
            )
            if refusal is None and not command_auth.acts_for(inp.proof, None):  # type: ignore[arg-type]
                refusal = f"its proof is by {inp.proof.sender!r}, not an admin"  # type: ignore[union-attr]
            if refusal is not None:
                _refused(names.START_CONSOLIDATION, refusal)
                raise ApplicationError(f"consolidation refused: {refusal}", type="CommandRefusedError", non_retryable=True)
        now = workflow.now()
        days = inp.archive_after_days if inp.archive_after_days is not None else 180.0
        users = inp.users
        if users is None:
            users = await workflow.execute_activity(
                names.LIST_MEMORY_USERS,
                start_to_close_timeout=timedelta(seconds=60),
                heartbeat_timeout=_heartbeat(inp.heartbeat_seconds),
                retry_policy=RetryPolicy(maximum_attempts=5),
                summary="users with memories",
                result_type=list[str],
            )
        report = inp.report
        done = inp.done_users
        judge_calls_left = inp.max_judge_calls
        for index in range(done, len(users)):
            user = users[index]
            try:
                part = await workflow.execute_activity(
                    names.CONSOLIDATE_MEMORIES,
                    ConsolidateInput(
                        user_id=user, now=now, archive_after_days=days,
                        judge=judge_calls_left > 0, max_judge_pairs=judge_calls_left,
                    ),
                    start_to_close_timeout=timedelta(minutes=5),
                    heartbeat_timeout=_heartbeat(inp.heartbeat_seconds),
                    retry_policy=RetryPolicy(maximum_attempts=5),
                    summary=f"consolidate {user}",
                    result_type=ConsolidationReport,
                )
            except ActivityError as err:
                report.details = (report.details + [f"user {user!r} skipped: {err.cause or err}"])[:200]
                continue
            if part.judge_pairs:
                judged = await _judge(user, part.judge_pairs, judge_calls_left, inp.judge_model, inp.heartbeat_seconds)
                judge_calls_left = max(0, judge_calls_left - judged.asked)
                part.merged += len(judged.merged)
                part.superseded += len(judged.superseded)
                part.judge_pairs = []
            report = report.merge(part)
            if workflow.info().is_continue_as_new_suggested() and index + 1 < len(users):
                workflow.continue_as_new(
                    ConsolidationInput(
                        archive_after_days=days,
                        users=users,
                        report=report,
                        done_users=index + 1,
                        heartbeat_seconds=inp.heartbeat_seconds,
                        max_judge_calls=judge_calls_left,
                        judge_model=inp.judge_model,
                    )
                )
        await workflow.execute_activity(
            names.OPTIMIZE_MEMORIES,
            start_to_close_timeout=timedelta(minutes=10),
            heartbeat_timeout=_heartbeat(inp.heartbeat_seconds),
            retry_policy=RetryPolicy(maximum_attempts=2),
            summary="refresh indexes",
        )
        return report
