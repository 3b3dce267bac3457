"""The durable side of a session's model calls: the tool listing, the model step with
its one forced compaction, and the running summary.

Workflow code, called by :class:`SessionWorkflow`. What a call is sent is decided by
:class:`ContextPlanner`; when a summary is due by :func:`lifecycle.summary_due`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError, FailureError

with workflow.unsafe.imports_passed_through():
    from hermes.errors import ContextBodiesMissingError
    from hermes.infra import telemetry
    from hermes.content.context import ContextPolicy
    from hermes.models import (
        CallModelInput, CallModelResult, ListToolsInput, ListToolsResult, Message, StoreBodiesInput, SummarizeInput, ToolSpec,
        TurnStartOutcome, TurnStartRequest,
    )
    from hermes.tools.routing import route_groups
    from hermes.content.tokens import BOUNDED_COUNT_CHARS, usage_correction
    from hermes.memory.models import SearchMemoriesInput
    from hermes.sessions.turn_start import BeginTurnInput

    from workflows.session import calls, lifecycle, patches
    from workflows.session.memory_path import MemoryPath
    from workflows.session.state import SessionCore
    from workflows.session.turn import BudgetExceeded, ContextTooLarge, ModelFailed, TurnCancelled
    from workflows.tool_calls import failure_text

SUMMARY_GRACE = timedelta(seconds=5)
"""How long continue-as-new, close or archive wait for a running summary before cancelling it."""


def bodies_missing(err: ActivityError) -> bool:
    """Whether a model activity failed because the content store lost a body it refers to."""
    return isinstance(err.cause, ApplicationError) and err.cause.type == ContextBodiesMissingError.__name__


class ModelSteps:
    """A session's model calls and summaries (``core``: the session's state; ``memory``:
    its memory path, which records a recall a turn's first model call made)."""

    def __init__(self, core: SessionCore, memory: MemoryPath | None = None) -> None:
        self.core = core
        self.memory = memory
        self.summarizing = False
        self.summary_task: asyncio.Task[None] | None = None
        self._routed: tuple[str, list[str] | None] = ("", None)

    def _trace(self, turn: int, kind: str, started: Any, **fields: Any) -> None:
        self.core.add_trace(turn, kind, started, workflow.now(), **fields)

    def take_listing(self, result: ListToolsResult) -> tuple[dict[str, ToolSpec], list[Any]]:
        """The tools of a listing (recorded in history once per turn, so replay never
        depends on a worker's registry; an unchanged list is recorded as its reference)."""
        core = self.core
        bounded = core.patched(patches.BOUNDED_CONTEXT)
        specs, groups = core.planner.take_listing(result, bounded=bounded)
        core.memory_served = result.memory
        for degradation in result.degraded:
            core.degraded(degradation.kind, degradation.detail, workflow.now())
        if not core.encoding and result.encoding and bounded:
            core.encoding = result.encoding  # fixed for the session's life: counts stay comparable
            core.transcript.count_all(core.counter().message)
        return specs, groups

    async def list_tools(self) -> tuple[dict[str, ToolSpec], list[Any]]:
        core = self.core
        if not core.patched(patches.BOUNDED_CONTEXT):
            return self.take_listing(await calls.list_tools(None))
        return self.take_listing(await calls.list_tools(self._listing_input()))

    def _listing_input(self) -> ListToolsInput:
        core = self.core
        encoding = core.encoding if core.patched(patches.BOUNDED_WORK) else ""
        return ListToolsInput(known_ref=core.planner.known_listing(), encoding=encoding)

    async def begin_turn(self, search: SearchMemoriesInput | None) -> tuple[dict[str, ToolSpec], list[Any]]:
        """This turn's tools (:meth:`list_tools`). With ``search`` (the turn's recall, runs
        with the begin-turn patch), one ``begin_turn`` local activity lists them and
        searches, and ``core.early_recall`` keeps its result for
        :meth:`MemoryPath.recall`; if it fails, the tools are listed apart and the recall
        searches later, as before. In a run with the turn-start-in-model-call patch that
        has listed its tools once, nothing runs now: the run's last listing is offered,
        and the turn's first model call checks it and searches (``core.turn_start``)."""
        core = self.core
        core.early_recall = core.turn_start = None
        held = core.planner.listing
        if held is not None and core.patched(patches.START_IN_CALL) and core.patched(patches.BOUNDED_CONTEXT):
            budget = ContextPolicy.from_config(core.cfg).budget
            core.turn_start = TurnStartRequest(listing=self._listing_input(), recall=search, budget=budget)
            return held[1], held[2]
        if search is not None:
            try:
                early = await calls.begin_turn(BeginTurnInput(listing=self._listing_input(), recall=search))
            except FailureError as err:
                workflow.logger.warning("turn %s: listing and recall together failed (%s); apart now", search.turn, failure_text(err))
            else:
                core.early_recall = early
                return self.take_listing(early.listing)
        return await self.list_tools()

    def route(self, text: str, groups: list[Any]) -> list[str] | None:
        """The tool groups to offer for this turn's message ``text`` (keyword routing, when
        the session routes), kept as ``core.last_groups``."""
        core = self.core
        self._routed = (text, core.last_groups)
        routed = None
        if core.cfg.tool_routing == "keywords":
            routed = route_groups(text, groups, core.all_specs.values(), max_groups=core.cfg.max_routed_groups, previous=core.last_groups)
        core.last_groups = routed
        return routed

    async def _took_start(self, turn: int, start: TurnStartRequest, outcome: TurnStartOutcome | None) -> None:
        """Take what the turn's first model call found (``start`` asked it to): the listing
        (new tools are offered from the next call on, routed again) and the recall (a
        failed one searches again). ``outcome`` None: a worker that does not know
        ``turn_start`` answered the call as it was; the recall is made now, for the
        turn's later steps, and the notice says the first went without it."""
        core = self.core
        if outcome is None:
            core.degraded("memory", f"turn {turn}'s first model call was answered without its memory recall (a worker "
                          "that does not search in model calls ran it); later calls of the turn have it", workflow.now())
        elif outcome.listing is None:
            workflow.logger.warning("turn %d: %s; listing apart", turn, outcome.why)
            core.all_specs, groups = await self.list_tools()
            self._route_again(groups)
        elif not outcome.listing.unchanged:
            core.all_specs, groups = self.take_listing(outcome.listing)
            self._route_again(groups)
        else:
            self.take_listing(outcome.listing)  # its degradations, and whether the worker serves memory
        if start.recall is not None and self.memory is not None:
            found = outcome.recall if outcome is not None else None
            failed = (outcome.recall_failed if outcome is not None else None) or "no search was made"
            await self.memory.took_recall(turn, start.recall, found, failed)

    def _route_again(self, groups: list[Any]) -> None:
        text, previous = self._routed
        self.core.last_groups = previous
        self.route(text, groups)

    async def count_exactly(self, message: Message) -> None:
        """Set the exact tokens of a user message too long to count in workflow code,
        from a local activity. On a failure the bounded estimate stays."""
        core = self.core
        text = message.content or ""
        if not core.encoding or len(text) <= BOUNDED_COUNT_CHARS or not core.patched(patches.BOUNDED_WORK):
            return
        try:
            tokens = await calls.count_tokens(text, core.encoding)
        except FailureError:
            workflow.logger.warning("exact token count of turn %d's message failed; estimated", message.turn)
            return
        message.tokens = core.counter().message(message.model_copy(update={"content": "", "tokens": None})) + tokens

    async def call_model(self, turn: int, tools: Callable[[], list[ToolSpec]], step: int = 0) -> CallModelResult:
        """One model step offering ``tools()``. The context goes by reference; a
        provider's "context too long" triggers one forced compaction and one retry (never
        a loop). A turn's first step may start the turn (``core.turn_start``): when that
        call comes back unsent (the tools changed, a search failed, the memories did not
        fit), the step is called again with what it found.

        Raises:
            ContextTooLarge: the current turn alone does not fit the budget, or the
                provider refused the context again after compaction.
            ModelFailed, TurnCancelled.
        """
        core = self.core
        compacted = rewritten = False
        while True:
            self.check_budget()
            started = workflow.now()
            request = self.model_request(turn, tools(), step)
            start = core.turn_start
            if start is not None:
                request.turn_start = start.model_copy(update={"correction": core.token_correction})
            refs = core.planner.call_refs(request.context_ref, request.tools_ref, turn, step)
            request = await self.with_bodies(request, refs)
            try:
                result = await self._call(request, turn, step)
            except TurnCancelled:
                self._trace(turn, "model", started, status="cancelled")
                raise
            except ActivityError as err:
                if bodies_missing(err) and not rewritten:
                    # The store lost a body (eviction, a flush, a restart): written again, once.
                    workflow.logger.warning("turn %d step %d: the content store lost context; written again", turn, step + 1)
                    self._trace(turn, "model", started, status="context_missing")
                    rewritten = True
                    core.planner.forget_stored()
                    continue
                too_long = isinstance(err.cause, ApplicationError) and err.cause.type == "ContextTooLongError"
                self._trace(turn, "model", started, status="context_too_long" if too_long else "error")
                if too_long and core.patched(patches.BOUNDED_CONTEXT):
                    if not compacted:
                        compacted = True
                        if await self.compact(turn, refused_tokens=request.context_tokens):
                            continue
                        why = "and compacting the earlier conversation did not help"
                    else:
                        why = "even after the earlier conversation was compacted"
                    raise ContextTooLarge(f"the model refused the context as too long, {why} ({failure_text(err)})") from None
                raise ModelFailed(failure_text(err)) from None
            if start is not None:
                core.turn_start = None  # answered (a failed call kept it for the call again)
                await self._took_start(turn, start, result.turn_start)
                if result.turn_start is not None and not result.turn_start.sent:
                    workflow.logger.info("turn %d: its first model call was not sent (%s); calling again", turn, result.turn_start.why)
                    continue
            break
        sent_tokens = request.context_tokens
        if result.turn_start is not None and result.turn_start.memories_tokens:
            sent_tokens = core.context_tokens = request.context_tokens + result.turn_start.memories_tokens
        core.token_estimate = result.usage.prompt_tokens + result.usage.completion_tokens
        core.count_usage(result.usage.prompt_tokens + result.usage.completion_tokens, request.usage_day, result.user_day_tokens)
        if core.patched(patches.BOUNDED_CONTEXT) and request.context_tokens and result.usage.prompt_tokens:
            core.token_correction = usage_correction(core.token_correction, sent_tokens, result.usage.prompt_tokens)
        self._trace(turn, "model", started, provider=result.provider, tokens=core.token_estimate)
        telemetry.count_tokens(result.model or request.model, core.inp.user_id, result.usage.prompt_tokens, result.usage.completion_tokens)
        for degradation in result.degraded:
            core.degraded(degradation.kind, degradation.detail, workflow.now())
        return result

    async def _call(self, request: CallModelInput, turn: int, step: int) -> CallModelResult:
        """Run one model step's activity; after a final heartbeat timeout (the worker
        stopped reporting, :func:`calls.worker_lost`) start it again with a longer
        heartbeat timeout, at most :data:`calls.MODEL_REISSUES` times.

        Raises:
            ActivityError: the step failed otherwise, or was lost too often.
            TurnCancelled.
        """
        core = self.core
        reissue = 0
        while True:
            try:
                return await calls.cancellable(
                    calls.start_model_call(core.cfg, request, turn, step, reissue), lambda: core.cancel_requested
                )
            except ActivityError as err:
                if reissue >= calls.MODEL_REISSUES or not calls.worker_lost(err) or not core.patched(patches.MODEL_REISSUE):
                    raise
                reissue += 1
                workflow.logger.warning(
                    "turn %d step %d: every attempt of the model call timed out on its heartbeat; started again (%d of %d)",
                    turn, step + 1, reissue, calls.MODEL_REISSUES,
                )

    async def with_bodies(self, request: Any, refs: list[str]) -> Any:
        """``request`` (a :class:`CallModelInput` or :class:`SummarizeInput`) once the
        bodies of ``refs`` the content store may lack are written to it, or inline in it
        when the store cannot take them; unchanged in runs recorded before the
        ``model-context-stored`` patch (their activity asks the session)."""
        core = self.core
        if not core.patched(patches.CONTEXT_STORED):
            return request
        planner = core.planner
        bodies = planner.unstored(refs, core.transcript)
        delta = None
        if isinstance(request, CallModelInput):
            if bodies and core.patched(patches.CONTEXT_DELTA):
                delta = planner.delta(request.context_ref, bodies)
            planner.mark_sent(request.context_ref)
        if delta is not None:
            # A step's few new bodies ride with the call (the activity stores them): no
            # local activity, no workflow activation for it.
            planner.mark_stored(list(bodies))
            return request.model_copy(update={**delta, "bodies_stored": True})
        if bodies and not await calls.store_bodies(StoreBodiesInput(session_id=core.inp.session_id, bodies=bodies)):
            return request.model_copy(update={"bodies": bodies, "bodies_stored": True})
        planner.mark_stored(list(bodies))
        return request.model_copy(update={"bodies_stored": True})

    # ------------------------------------------------------------ token budgets

    def usage_fields(self) -> dict[str, Any]:
        """A model call's ``usage_user_id`` / ``usage_day`` when a daily budget applies
        (the activity then counts the call for the user's UTC day), else nothing: calls
        of sessions without one are what they always were."""
        core = self.core
        if core.cfg.user_daily_token_budget is None:
            return {}
        return {"usage_user_id": core.inp.user_id, "usage_day": workflow.now().date().isoformat()}

    def check_budget(self) -> None:
        """Raise :class:`BudgetExceeded` when the session or the user's day has used its
        token budget (no model call is started then)."""
        stop = self.core.budget_stop(workflow.now().date().isoformat())
        if stop is not None:
            raise stop

    def model_request(self, turn: int, tools: list[ToolSpec], step: int) -> CallModelInput:
        """The model call's input: references to the context's messages and tool list.

        Raises:
            ContextTooLarge: the context does not fit (:meth:`ContextPlanner.build`).
        """
        core = self.core
        base: dict[str, Any] = dict(
            session_id=core.inp.session_id, turn=turn, model=core.cfg.model, profile=core.cfg.model_profile, **self.usage_fields()
        )
        if not core.patched(patches.BOUNDED_CONTEXT):
            # Runs recorded before: the same commands (activity inputs are not replayed).
            try:
                context = core.transcript.legacy_context(turn, core.system_prompt)
            except ValueError as err:
                raise ContextTooLarge(str(err)) from None
            return CallModelInput(**base, messages=context, tools=tools)
        counter = core.counter()
        tools_ref, tool_tokens = core.planner.tool_list(tools, counter)
        built = core.planner.build(
            core.transcript, core.cfg, turn=turn, system_prompt=core.system_prompt, counter=counter,
            summary=core.summary, memories=core.memories, tools=tools, tool_tokens=tool_tokens,
            correction=core.token_correction, mark_cuts=core.patched(patches.CONTEXT_CUT_NOTE),
        )
        core.context_tokens = built.tokens
        return CallModelInput(
            **base, context_ref=core.planner.context_ref(built, core.transcript, turn, step), tools_ref=tools_ref,
            step=step, context_tokens=built.tokens, encoding=core.encoding if core.patched(patches.BOUNDED_WORK) else "",
        )

    # ------------------------------------------------------------ summaries

    def start_summary_if_due(self, turn: int) -> None:
        """After a reply: fold older turns into the summary in the background when one
        is due (the reply does not wait)."""
        core = self.core
        if not core.patched(patches.BOUNDED_CONTEXT) or self.summarizing or core.status == "closed":
            return
        covered = core.summary.upto_turn if core.summary else 0
        upto = lifecycle.summary_due(core.cfg, turn, covered=covered, retry_turn=core.summary_retry_turn)
        if upto is not None:
            self.summarizing = True
            self.summary_task = asyncio.create_task(self._summarize_in_background(turn, upto))

    async def _summarize_in_background(self, turn: int, upto: int) -> None:
        self.summarizing = False
        await self.summarize(turn, upto)

    async def summarize(self, turn: int, upto: int, *, forced: bool = False, max_input_tokens: int | None = None) -> bool:
        """Fold turns up to ``upto`` into the running summary (a model call in an
        activity). A failure or an empty summary keeps the messages as they are and
        is retried after ``summary_retry_turns`` turns.

        Returns:
            Whether the summary now covers more turns than before.
        """
        core = self.core
        covered = core.summary.upto_turn if core.summary else 0
        refs, turns_of = core.transcript.fold_refs(covered, upto)
        if not refs:
            return False
        try:
            self.check_budget()
        except BudgetExceeded:
            return False  # a summary is a model call too: not past the budget
        counted = self.usage_fields()
        self.summarizing = True
        started = workflow.now()
        budget = ContextPolicy.from_config(core.cfg).budget
        inp = SummarizeInput(
            session_id=core.inp.session_id, message_refs=refs, message_turns=turns_of,
            previous_summary=core.summary.text if core.summary else "", upto_turn=upto,
            max_tokens=core.cfg.summary_max_tokens,
            max_input_tokens=max_input_tokens or max(budget - 2 * core.cfg.summary_max_tokens, 1000),
            model=core.cfg.model, profile=core.cfg.model_profile, encoding=core.encoding, **counted,
        )
        try:
            inp = await self.with_bodies(inp, refs)
            summary = await calls.summarize(
                core.cfg, inp, summary=f"summary of turns {covered + 1}-{upto}" + (" (forced)" if forced else "")
            )
        except ActivityError as err:
            if bodies_missing(err):
                core.planner.forget_stored()  # the next summary writes them again
            workflow.logger.warning("summary of turns %d-%d failed: %s", covered + 1, upto, failure_text(err))
            core.summary_retry_turn = core.turn_count + core.cfg.summary_retry_turns
            self._trace(turn, "summary", started, status="error")
            return False
        finally:
            self.summarizing = False
        if summary.usage is not None:
            used = summary.usage.prompt_tokens + summary.usage.completion_tokens
            core.count_usage(used, counted.get("usage_day"), summary.user_day_tokens)
            summary = summary.model_copy(update={"usage": None, "user_day_tokens": None})  # counted; not carried
        if not summary.text.strip():
            core.summary_retry_turn = core.turn_count + core.cfg.summary_retry_turns
            self._trace(turn, "summary", started, status="empty")
            return False
        advanced = core.summary is None or summary.upto_turn > core.summary.upto_turn
        if advanced:
            core.summary = summary.model_copy(update={"created_at": workflow.now()})
            core.last_summary_turn = turn
        self._trace(turn, "summary", started, tokens=summary.tokens)
        return advanced

    async def compact(self, turn: int, *, refused_tokens: int = 0) -> bool:
        """Forced compaction after the provider refused a context of about
        ``refused_tokens`` as too long: every turn before this one goes into the summary,
        now, from a request well under that size."""
        if self.summarizing:
            await workflow.wait_condition(lambda: not self.summarizing)
        limit = max(1000, refused_tokens // 2) if refused_tokens else None
        return await self.summarize(turn, turn - 1, forced=True, max_input_tokens=limit)

    async def drain_summary(self) -> None:
        """Wait for a running summary at most ``SUMMARY_GRACE``, then cancel it (the next
        run summarises again): continue-as-new, close and archive never wait long on a
        model call."""
        task = self.summary_task
        if task is not None and not task.done():
            try:
                await workflow.wait_condition(task.done, timeout=SUMMARY_GRACE, timeout_summary="summary to finish")
            except asyncio.TimeoutError:
                pass
        if task is not None and not task.done():
            task.cancel()
        if task is not None:
            try:
                await task
            except (asyncio.CancelledError, ActivityError):
                pass
        self.summary_task, self.summarizing = None, False
