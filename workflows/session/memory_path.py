"""The durable side of a session's long-term memory: recall before a turn's model calls,
"forget me", and the extractions started after a reply and at the end.

Workflow code, called by :class:`SessionWorkflow`. What is given to memory is decided
by :mod:`workflows.session.memory_hooks`; the triggers by :mod:`hermes.memory.rules`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.exceptions import ActivityError, FailureError

with workflow.unsafe.imports_passed_through():
    from hermes.memory.models import ExtractMemoriesInput, SearchMemoriesInput, SearchMemoriesResult, recall_warning
    from hermes.sessions.turn_start import BeginTurnResult
    from hermes.memory.rules import detect_triggers
    from hermes.models import ToolCallRecord

    from workflows.session import calls, memory_hooks, patches
    from workflows.session.state import SessionCore
    from workflows.tool_calls import failure_text

EXTRACTION_GRACE = timedelta(0)
"""Continue-as-new does not wait for a running memory extraction: it is carried over to the
next run, which sends it again (a candidate delivered twice is written once), so messages
are never held up by a model call they do not need."""
EXTRACTION_GRACE_FINAL = timedelta(seconds=60)
"""How long close and archive wait for memory extractions (the run ends after)."""


class MemoryPath:
    """A session's long-term memory hooks (``core``: the session's state)."""

    def __init__(self, core: SessionCore) -> None:
        self.core = core
        self.extractions: list[tuple[ExtractMemoriesInput, asyncio.Task[None]]] = []

    def active(self) -> bool:
        """Long-term memory is on for this turn: the session wants it, the worker serves
        it, and the run has the patch (runs recorded before it replay without)."""
        core = self.core
        return core.cfg.memory_enabled and core.memory_served and core.patched(patches.MEMORY)

    def resume_carried(self) -> None:
        """Send again the extractions the previous run did not finish (runs with the patch)."""
        core = self.core
        if core.carried_extractions and core.patched(patches.MEMORY):
            carried, core.carried_extractions = core.carried_extractions, []
            for extraction in carried:
                self.start(extraction)

    def early_search(self, turn: int, text: str) -> SearchMemoriesInput | None:
        """The recall's search when it can go with the turn's tool listing
        (:meth:`ModelSteps.begin_turn`): memory is active as the last listing said, the
        message does not say "forget me", and memories are injected; else None."""
        core = self.core
        if not self.active():
            return None
        core.turn_triggers = detect_triggers(text, everyday=core.patched(patches.EVERYDAY_FACTS))
        if core.turn_triggers.forget_me or core.cfg.memory_max_injected == 0:
            return None
        return self._search(turn, text)

    def _search(self, turn: int, text: str) -> SearchMemoriesInput:
        core = self.core
        return SearchMemoriesInput(
            user_id=core.inp.user_id, query=text[:2000], session_id=core.inp.session_id, turn=turn,
            limit=core.cfg.memory_max_injected, max_chars=core.cfg.memory_max_chars,
        )

    async def recall(self, turn: int, text: str) -> None:
        """The read path: the user's memories for this message, injected into the system
        context of every model call of the turn (seed 000 §4.3), as searched with the
        turn's listing (``core.early_recall``) or now, or by the turn's first model call
        (``core.turn_start``: :meth:`took_recall` records it then). A failure costs the
        turn its memories, never the turn. "Forget me" deletes them all instead."""
        core = self.core
        if core.turn_start is not None and core.turn_start.recall is not None:
            return
        early = core.early_recall
        if early is None:
            core.turn_triggers = detect_triggers(text, everyday=core.patched(patches.EVERYDAY_FACTS))
            if core.turn_triggers.forget_me:
                await self._forget_me()
                return
            if core.cfg.memory_max_injected == 0:
                return
        started = workflow.now()
        result = await self._or_noted(turn, self._searched(turn, self._search(turn, text), early))
        if result is not None:
            self._record(turn, started, result)

    async def took_recall(self, turn: int, search: SearchMemoriesInput, found: SearchMemoriesResult | None, failed: str) -> None:
        """Record the recall of the turn's first model call (``core.turn_start``): what it
        ``found``, else (it ``failed``, or was not made) a search again as a normal activity."""
        started = workflow.now()
        if found is None:
            found = await self._or_noted(turn, self._again(turn, search, failed))
        if found is not None:
            self._record(turn, started, found)

    async def _or_noted(self, turn: int, searching: Awaitable[SearchMemoriesResult]) -> SearchMemoriesResult | None:
        """``searching``'s result; None when its activity failed, which the turn's warnings
        and the session's degradations then say."""
        try:
            return await searching
        except FailureError as err:
            self.core.warnings.append(f"Long-term memory was not available for this message ({failure_text(err)}).")
            self.core.degraded("memory", f"memories were not searched for turn {turn}: {failure_text(err)}", workflow.now())
            return None

    def _record(self, turn: int, started: Any, result: SearchMemoriesResult) -> None:
        """Keep the memories ``result`` found for the turn's model calls, with its
        warnings and trace step."""
        core = self.core
        if result.error:
            core.warnings.append(recall_warning(result.error))  # the same text as the search's event
            core.degraded("memory", f"memories were not searched for turn {turn}: {result.error}", workflow.now())
        core.memories = [m.line() for m in result.memories]
        if result.memories or result.error:
            status = "error" if result.error else f"{len(result.memories)} memories"
            core.add_trace(turn, "memory", started, workflow.now(), provider="recall", status=status)

    async def _searched(self, turn: int, search: SearchMemoriesInput, early: BeginTurnResult | None) -> SearchMemoriesResult:
        """The recall's result: the one that came with the listing, else a local search; a
        failed one is searched again as a normal activity (runs with the recall-retry patch).

        Raises:
            FailureError: the search failed (again).
        """
        if early is not None:
            if early.recall is not None:
                return early.recall
            why = early.recall_failed or "no search was made"
        else:
            try:
                return await calls.search_memories(search)
            except FailureError as err:
                if not self.core.patched(patches.RECALL_RETRY):
                    raise
                why = failure_text(err)
        return await self._again(turn, search, why)

    async def _again(self, turn: int, search: SearchMemoriesInput, why: str) -> SearchMemoriesResult:
        # A starved or lost worker: search again where any worker may take it, rather
        # than answer this message as if the user had no memories.
        workflow.logger.warning("the recall of turn %d failed locally (%s); searching again", turn, why)
        return await calls.search_memories_again(search)

    async def _forget_me(self) -> None:
        core = self.core
        core.working, core.memories = [], []
        try:
            report = await calls.forget_user(core.cfg, core.inp.user_id)
        except ActivityError as err:
            core.warnings.append(f"Your long-term memories could not be deleted now ({failure_text(err)}); ask again.")
            return
        core.warnings.append(
            f"All long-term memories of {core.inp.user_id} were deleted "
            f"({report.deleted} stored, {report.pending_dropped} waiting to be written)."
        )

    def after_reply(self, turn: int, text: str, reply: str, status: str, records: list[ToolCallRecord]) -> None:
        """The write path (:func:`memory_hooks.after_reply`), delivered in the background:
        the reply never waits."""
        core = self.core
        everyday = core.patched(patches.EVERYDAY_FACTS)
        planned = memory_hooks.after_reply(
            core.cfg, user_id=core.inp.user_id, session_id=core.inp.session_id, turn=turn, text=text, reply=reply,
            status=status, records=records, specs=core.all_specs,
            triggers=core.turn_triggers or detect_triggers(text, everyday=everyday),
            working=core.working, last_extracted_turn=core.last_extracted_turn, transcript=core.transcript,
            now=workflow.now(), bounded_work=core.patched(patches.BOUNDED_WORK), everyday=everyday,
        )
        core.working, core.last_extracted_turn = planned.working, planned.last_extracted_turn
        if planned.extraction is not None:
            self.start(planned.extraction)

    def at_end(self, reason: str) -> None:
        """The session closes or is archived: the turns no extraction has seen yet go to one."""
        core = self.core
        if not self.active():
            return
        core.last_extracted_turn, extraction = memory_hooks.at_end(
            core.cfg, user_id=core.inp.user_id, session_id=core.inp.session_id, turn_count=core.turn_count,
            last_extracted_turn=core.last_extracted_turn, transcript=core.transcript, reason=reason, now=workflow.now(),
        )
        if extraction is not None:
            self.start(extraction)

    def start(self, inp: ExtractMemoriesInput) -> None:
        core = self.core
        if core.cfg.token_budget is not None or core.cfg.user_daily_token_budget is not None:
            # Its model call counts against the token budgets; past one, the rules' candidates alone.
            today = workflow.now().date().isoformat()
            update: dict[str, Any] = {"use_model": inp.use_model and core.budget_stop(today) is None}
            if core.cfg.user_daily_token_budget is not None:
                update["usage_day"] = today
            inp = inp.model_copy(update=update)

        async def run() -> None:
            try:
                result = await calls.extract_memories(self.core.cfg, inp)
            except ActivityError:
                workflow.logger.warning("memory extraction of turn %d failed", inp.turn, exc_info=True)
                return
            core.count_usage(result.prompt_tokens + result.completion_tokens, inp.usage_day, result.user_day_tokens)
            if result.error:
                workflow.logger.warning("memory extraction of turn %d: %s", inp.turn, result.error)

        self.extractions = [(i, t) for i, t in self.extractions if not t.done()]
        self.extractions.append((inp, asyncio.create_task(run())))

    def running(self) -> bool:
        """An extraction of this run has not finished (or not started yet)."""
        return any(not task.done() for _, task in self.extractions)

    async def drain(self, *, final: bool) -> None:
        """Wait for running extractions ``EXTRACTION_GRACE`` (``EXTRACTION_GRACE_FINAL``
        when the session ends); one still running is cancelled and carried to the next run."""
        grace = EXTRACTION_GRACE_FINAL if final else EXTRACTION_GRACE
        running = [(i, t) for i, t in self.extractions if not t.done()]
        if running and grace > timedelta(0):
            try:
                await workflow.wait_condition(
                    lambda: all(t.done() for _, t in running), timeout=grace, timeout_summary="memory extraction"
                )
            except asyncio.TimeoutError:
                pass
        for inp, task in self.extractions:
            if not task.done():
                task.cancel()
                self.core.carried_extractions.append(inp)
            try:
                await task
            except (asyncio.CancelledError, ActivityError):
                pass
        self.extractions = []
