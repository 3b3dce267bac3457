"""Memory activities: search (a local activity before a turn's model calls), extraction (a
model call after the reply), batched writes, forgetting and consolidation.

The store is opened lazily, once per worker, in a thread (loading the embedding model takes
0.1-1 s). LanceDB calls are synchronous: every one runs in a thread, so the worker's event
loop never waits on them.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import threading
import uuid
from collections.abc import AsyncIterator
from datetime import datetime, timezone
from typing import Any, Callable

from temporalio import activity
from temporalio.client import Client, WithStartWorkflowOperation
from temporalio.common import WorkflowIDConflictPolicy
from temporalio.exceptions import ApplicationError

from activities.heartbeat import heartbeating
from hermes import names
from hermes.content import usage
from hermes.infra import telemetry
from hermes.security import command_auth
from hermes.content.events import EventLog, TurnEvent
from hermes.errors import ContextTooLongError, ModelRequestError, ModelUnavailableError, ScriptExhaustedError
from hermes.memory.extraction import EXTRACTION_INSTRUCTION, extraction_prompt, parse_extraction
from hermes.memory.judge import (
    JUDGE_INSTRUCTION,
    JudgeMemoriesInput,
    JudgeReport,
    applied_verdict,
    judge_prompt,
    parse_verdict,
)
from hermes.memory.models import (
    ConsolidateInput,
    ConsolidationReport,
    ExtractMemoriesInput,
    ExtractMemoriesResult,
    ForgetReport,
    MEMORY_HEARTBEAT_SECONDS,
    MemoryBatch,
    MemoryWriterInput,
    SearchMemoriesInput,
    SearchMemoriesResult,
    WriteMemoriesInput,
    WriteReport,
    recall_warning,
)
from hermes.memory.store import EmbeddingModelMismatch, MemoryStore, MemoryStoreError
from hermes.models import CallModelInput, Message

log = logging.getLogger("hermes.memory")

_WRITE_OUTCOMES = tuple(f"hermes.memory.{o}" for o in ("inserted", "updated", "superseded", "unchanged", "dropped"))
"""Span attributes of a written batch's counts, in ``count_memory_writes``' order."""

STORE_WAIT_SECONDS = 5.0
"""How long a search waits for a store that is still opening before its turn goes on
without memories (the session's search is a local activity of 15 s)."""
HIT_FLUSH_SECONDS = 1.0
"""Hit statistics are written at most this often, after the search that produced them."""
CHANGE_MARK_SECONDS = 600
"""How long a change of a user's rows in progress keeps searches off the cache at most:
a worker killed mid-change (or an attempt cancelled while its thread still commits) never
ends its mark, and the user's searches read LanceDB itself until it expires."""


async def judge_pairs(store: MemoryStore, provider: Any, inp: JudgeMemoriesInput, *, now: datetime | None = None,
                      run: Callable[..., Any] | None = None) -> JudgeReport:
    """Decide ``inp.pairs`` and apply the verdicts to ``store`` (what ``judge_memories``
    does; the bench calls it as the activity would).

    The first ``inp.max_calls`` pairs whose rows are both still active are put to
    ``provider`` (the extraction model: one call each, JSON ``{"verdict": ...}``); the
    others, and any whose call fails or answers no verdict, get the rules' verdict
    (``JudgePair.fallback``). A ``same`` the rules ruled out is applied as ``update`` where
    the rules' own verdict is ``update``, else as ``different`` (:func:`applied_verdict`).

    Args:
        store: the memory store.
        provider: a model provider (``complete(CallModelInput)``), or None (rules only).
        inp: the pairs, the budget, the model name.
        now: when (default: now).
        run: runs a store call in a thread (the activity's heartbeating runner); default: inline.
    """
    now = now or datetime.now(timezone.utc)

    async def call(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        if run is not None:
            return await run(lambda s: fn(s, *args, **kwargs))
        return fn(store, *args, **kwargs)

    report = JudgeReport()
    for pair in inp.pairs:
        verdict = None
        if provider is not None and report.asked < inp.max_calls:
            texts = await call(MemoryStore.pair_texts, pair)
            if texts is None:
                report.kept += 1
                continue
            request = CallModelInput(
                session_id=f"memory-judge:{inp.user_id}"[:200],
                turn=0,
                messages=[Message(role="system", content=JUDGE_INSTRUCTION), Message(role="user", content=judge_prompt(*texts))],
                model=inp.model,
                purpose="memory_judge",
                max_output_tokens=30,
            )
            report.asked += 1
            try:
                answer = await provider.complete(request)
                verdict = parse_verdict(answer.message.content or "")
            except Exception as err:  # noqa: BLE001 - a failed judgement falls back to the rules, never loses the write
                report.errors.append(f"{pair.older_id}|{pair.newer_id}: {type(err).__name__}: {err}"[:200])
        if verdict is None:
            report.by_rules += 1
        decided = applied_verdict(pair, verdict)
        outcome = await call(MemoryStore.apply_verdict, inp.user_id, pair, decided, now=now, record=verdict is not None)
        if outcome == "merged":
            report.merged.append(pair.newer_id)
        elif outcome == "superseded":
            report.superseded.append(pair.older_id)
        else:
            report.kept += 1
    return report


def consolidate_and_judge(store: MemoryStore, inp: ConsolidateInput, *, judge: bool) -> ConsolidationReport:
    """One user's consolidation (:meth:`MemoryStore.consolidate_user`), then the judge's
    pass over the rows left (:meth:`MemoryStore.judge_pass`): the rules' verdicts applied,
    and with ``judge`` the pairs for the model in ``judge_pairs`` (at most
    ``inp.max_judge_pairs``). Synchronous: run in a thread."""
    report = store.consolidate_user(inp.user_id, inp.now, inp.archive_after_days)
    details, pairs = store.judge_pass(inp.user_id, inp.now, judge=judge, max_pairs=inp.max_judge_pairs)
    report.merged += sum(d.startswith("merged") for d in details)
    report.superseded += sum(d.startswith("superseded") for d in details)
    report.details = (report.details + details)[:200]
    report.judge_pairs = pairs
    return report



READ_THREADS = 4
"""Threads of a worker's memory searches (:meth:`MemoryActivities._run` with ``read``),
apart from the default executor the writes, consolidations and other blocking calls share."""
_read_pool: concurrent.futures.ThreadPoolExecutor | None = None
_read_pool_lock = threading.Lock()


def _read_executor() -> concurrent.futures.ThreadPoolExecutor:
    """The process's executor for memory searches (made on first use)."""
    global _read_pool
    with _read_pool_lock:
        if _read_pool is None:
            _read_pool = concurrent.futures.ThreadPoolExecutor(READ_THREADS, thread_name_prefix="hermes-memory-read")
        return _read_pool

class MemoryActivities:
    """The memory activities of one worker.

    Args:
        store_factory: opens the store (called once, in a thread, on first use).
        provider: the model used for extraction (the session's chat model).
        client: the Temporal client (extraction delivers to the user's memory writer).
        task_queue: where memory writers run.
        batch_size: ``batch_size`` / ``batch_seconds`` for writers this worker starts.
        redis: a ``redis.asyncio.Redis`` (optional): the read path's generation tokens.
        heartbeat_seconds: ``heartbeat_seconds`` for writers this worker starts.
        judge_max_calls: ``max_judge_calls`` for writers this worker starts.
    """

    def __init__(
        self,
        store_factory: Callable[[], MemoryStore],
        *,
        provider: Any = None,
        client: Client | None = None,
        task_queue: str = names.DEFAULT_TASK_QUEUE,
        batch_size: int = 10,
        batch_seconds: float = 5.0,
        redis: Any = None,
        heartbeat_seconds: float = MEMORY_HEARTBEAT_SECONDS,
        judge_max_calls: int = 0,
    ) -> None:
        self.judge_max_calls = judge_max_calls
        """Model calls of the memory judge per batch, for the writers this worker starts (0: rules only)."""
        self.heartbeat_seconds = heartbeat_seconds
        """Heartbeat timeout the writers this worker starts set on their store activities."""
        self.redis = redis
        """Keeps each user's rows generation (``hermes:memory:generation:<user>``): searches
        of a user whose rows did not change are answered from memory, in any worker."""
        self.events: EventLog | None = None
        """Where recalls are published as turn events, if anywhere."""
        self._factory = store_factory
        self._store: MemoryStore | None = None
        self._store_lock = threading.Lock()
        self._opened = threading.Event()
        self._opening: threading.Thread | None = None
        self._opening_lock = threading.Lock()
        """Guards ``_opening`` only: the store lock is held for the whole open (38 s at
        load 15), and a search on the event loop must never wait on it."""
        self._open_error: str = ""
        self.provider = provider
        self.client = client
        self.task_queue = task_queue
        self.batch_size = batch_size
        self.batch_seconds = batch_seconds
        self._hits: dict[str, datetime] = {}
        self._hit_task: asyncio.Task[None] | None = None

    def store(self) -> MemoryStore:
        """The store, opened on first use (thread-safe)."""
        with self._store_lock:
            if self._store is None:
                self._store = self._factory()
                self._opened.set()
            return self._store

    def open_in_background(self) -> None:
        """Start opening the store (and loading its embedding model) in a thread, if it is
        neither open nor opening: a worker calls it when it is built, so that its first
        turns do not wait on it. Opening a new store took 2-4 s on a quiet 2-core machine
        and 38 s (plus 26 s for the embedding model) at load 15. A failure is logged and
        kept for :meth:`search_memories` to report; the next use tries again."""
        with self._opening_lock:
            if self._store is not None or (self._opening is not None and self._opening.is_alive()):
                return

            def open_store() -> None:
                try:
                    self.store()
                    self._open_error = ""
                except Exception as err:  # noqa: BLE001 - reported by the searches; writes retry
                    self._open_error = f"{type(err).__name__}: {err}"
                    log.warning("the memory store could not be opened: %s", err, exc_info=True)

            self._opening = threading.Thread(target=open_store, name="hermes-memory-open", daemon=True)
            self._opening.start()

    async def wait_open(self, timeout_seconds: float) -> bool:
        """Start opening the store if needed and wait for it at most ``timeout_seconds``;
        True once it is open (False: still opening, or it failed: see the searches)."""
        self.open_in_background()
        return await asyncio.to_thread(self._opened.wait, timeout_seconds)

    async def _run(self, fn: Callable[..., Any], *args: Any, read: bool = False, **kwargs: Any) -> Any:
        """``fn(store, *args, **kwargs)`` in a thread, heartbeating meanwhile (writes and
        consolidations can take minutes; a dead worker's are retried in seconds).

        ``read``: a turn's search, run on the reads' own threads (:data:`READ_THREADS`),
        never queued behind writes and consolidations in the loop's default executor: on
        object storage a write takes seconds, and with three workers at load a search
        waited out its 15 s timeout behind them (``bench/scale.py``, 236 timed-out
        searches in one run), so turns went on without their memories."""

        def call() -> Any:
            return fn(self.store(), *args, **kwargs)

        async with heartbeating():
            if read:
                return await asyncio.get_running_loop().run_in_executor(_read_executor(), call)
            return await asyncio.to_thread(call)

    # -------------------------------------------------------------- read

    @activity.defn(name=names.SEARCH_MEMORIES)
    async def search_memories(self, inp: SearchMemoriesInput) -> SearchMemoriesResult:
        """The user's memories for ``inp.query`` (see :meth:`MemoryStore.search`).

        A store that refuses the search (rows of another embedding model, a bad user id)
        gives an empty result with the reason, never an error: the turn goes on without
        memories. Hit statistics are written afterwards, off the turn's path. For a
        session's turn, ``turn_started`` and then ``memories_recalled`` (or a ``warning``)
        are published as turn events.
        """
        result = await self.search_quietly(inp)
        await self.publish_recall(inp, result)
        return result

    async def search_quietly(self, inp: SearchMemoriesInput, *, announce: bool = True) -> SearchMemoriesResult:
        """:meth:`search_memories` publishing ``turn_started`` (unless not ``announce``: a
        model call published it) but not yet what it found (:meth:`publish_recall`):
        ``begin_turn`` publishes that only once its listing is done too, since a listing
        that fails sends the turn to search again."""
        if announce and self.events is not None and inp.session_id and inp.turn is not None:
            await self.events.begin_turn(inp.session_id, inp.turn)
        attributes = None
        if telemetry.enabled():
            attributes = {"hermes.session_id": inp.session_id, "hermes.turn": inp.turn, "hermes.memory.limit": inp.limit}
            if telemetry.message_text():
                attributes["hermes.memory.query"] = inp.query
        with telemetry.span("hermes.memory.search", attributes) as span:
            result = await self._search(inp)
            telemetry.set_attributes(span, {"hermes.memory.found": len(result.memories), "hermes.memory.error": result.error and result.error[:200]})
        return result

    async def publish_recall(self, inp: SearchMemoriesInput, result: SearchMemoriesResult) -> None:
        """Publish what a session's search found (:meth:`recall_events`)."""
        events = self.recall_events(inp, result)
        if events and self.events is not None:
            await self.events.publish_quietly(events)

    def recall_events(self, inp: SearchMemoriesInput, result: SearchMemoriesResult) -> list[TurnEvent]:
        """The event saying what a session's search found (``memories_recalled``), or its
        warning; none when this worker publishes no turn events or the search is no turn's."""
        if self.events is None or not inp.session_id or inp.turn is None:
            return []
        if result.error:
            # Worded as the turn result's warning: one warning, not two wordings of it.
            return [TurnEvent(type="warning", session_id=inp.session_id, turn=inp.turn, data={"text": recall_warning(result.error)})]
        memories = [{"id": m.memory_id, "kind": m.kind, "text": m.text} for m in result.memories]
        return [TurnEvent(type="memories_recalled", session_id=inp.session_id, turn=inp.turn, data={"memories": memories})]

    async def _search(self, inp: SearchMemoriesInput) -> SearchMemoriesResult:
        if self._store is None:
            # Never hold a turn on a cold store: a search waits a moment for it, then the
            # turn goes on without memories (its writes wait: they are not on a turn's path).
            if not await self.wait_open(STORE_WAIT_SECONDS):
                why = f"it could not be opened ({self._open_error})" if self._open_error else "it is still opening on this worker"
                return SearchMemoriesResult(error=f"the memory store was not searched: {why}")
        now = datetime.now(timezone.utc)
        generation = await self._generation(inp.user_id)
        try:
            found = await self._run(
                lambda s: s.search(
                    inp.user_id, inp.query, limit=inp.limit, kinds=inp.kinds, now=now, max_chars=inp.max_chars,
                    generation=generation,
                ),
                read=True,
            )
        except (EmbeddingModelMismatch, MemoryStoreError) as err:
            return SearchMemoriesResult(error=str(err))
        self._note_hits([m.memory_id for m in found], now)
        return SearchMemoriesResult(memories=found)

    @staticmethod
    def generation_key(user_id: str) -> str:
        """The Redis hash of ``user_id``'s rows generation: ``gen`` (a random token, new at
        every change) and ``writing`` (changes in progress: searches cache nothing then)."""
        return f"hermes:memory:generation:{user_id}"

    async def _generation(self, user_id: str) -> str | None:
        """The user's rows generation, or None: no caching (no Redis, or a change of the
        user's rows in progress, whose commit may land at any moment)."""
        if self.redis is None:
            return None
        key = self.generation_key(user_id)
        try:
            value, writing = await self.redis.hmget(key, ["gen", "writing"])
            if writing is not None and int(writing) > 0:
                return None
            if value is None:
                # First search since Redis knew this user: start a generation (a write that
                # set one meanwhile wins: HSETNX), so the next searches are answered from memory.
                await self.redis.hsetnx(key, "gen", uuid.uuid4().hex)
                value = await self.redis.hget(key, "gen")
        except Exception:  # noqa: BLE001 - Redis down costs speed, never the search
            return None
        if value is None:
            return None
        return value.decode() if isinstance(value, bytes) else value

    async def _begin_change(self, user_id: str) -> None:
        """A change of the user's rows starts: searches read LanceDB itself until it ends
        (:meth:`_changed`), or for ``CHANGE_MARK_SECONDS`` at most (a worker that died
        mid-change never ends it)."""
        if self._store is not None:
            self._store.forget_cached(user_id)
        if self.redis is None:
            return
        key = self.generation_key(user_id)
        try:
            await self.redis.hincrby(key, "writing", 1)
            await self.redis.expire(key, CHANGE_MARK_SECONDS)
        except Exception:  # noqa: BLE001
            log.warning("memory change of %r not marked; searches may serve cached rows until it ends", user_id)

    async def _changed(self, user_id: str, *, ended: bool = False) -> None:
        """The user's rows changed: a new generation (a random token, so a Redis that lost
        its data can never make an old cache look current). ``ended``: a change marked by
        :meth:`_begin_change` is over."""
        if self._store is not None:
            self._store.forget_cached(user_id)
        if self.redis is None:
            return
        key = self.generation_key(user_id)
        try:
            if ended and int(await self.redis.hincrby(key, "writing", -1)) < 0:
                await self.redis.hset(key, "writing", 0)
            await self.redis.hset(key, "gen", uuid.uuid4().hex)
        except Exception:  # noqa: BLE001
            log.warning("memory generation of %r not updated; its cached rows expire within a minute", user_id)

    def _note_hits(self, ids: list[str], now: datetime) -> None:
        if not ids:
            return
        for mid in ids:
            self._hits[mid] = now
        if self._hit_task is None or self._hit_task.done():
            self._hit_task = asyncio.get_running_loop().create_task(self._flush_hits())

    async def _flush_hits(self) -> None:
        await asyncio.sleep(HIT_FLUSH_SECONDS)
        while self._hits:
            batch, self._hits = self._hits, {}
            try:
                await self._run(lambda s: s.record_hits(batch.keys(), max(batch.values())))
            except Exception:  # noqa: BLE001 - statistics only: a lost hit costs nothing else
                log.warning("memory hit statistics not written for %d memories", len(batch), exc_info=True)

    async def flush_hits(self) -> None:
        """Write pending hit statistics now (worker shutdown, tests)."""
        if self._hit_task is not None:
            await self._hit_task

    # ------------------------------------------------------------ write

    @activity.defn(name=names.EXTRACT_MEMORIES)
    async def extract_memories(self, inp: ExtractMemoriesInput) -> ExtractMemoriesResult:
        """Ask the model for memories in ``inp.excerpt`` (when ``use_model``), keep those at
        or above ``min_confidence`` (0.75), and deliver them with the rule candidates to the
        user's memory writer (signal-with-start: it batches 10 items or 5 s).

        A model failure or an unreadable answer delivers the rule candidates alone and says
        so in ``error``; a delivery failure raises (the activity is retried; a candidate
        delivered twice is written once). Heartbeats throughout.
        """
        async with heartbeating():
            return await self._extract(inp)

    async def _extract(self, inp: ExtractMemoriesInput) -> ExtractMemoriesResult:
        """:meth:`extract_memories` without its heartbeats."""
        result = ExtractMemoriesResult()
        candidates = list(inp.rule_candidates)
        if inp.use_model and inp.excerpt and self.provider is not None:
            request = CallModelInput(
                session_id=inp.session_id,
                turn=inp.turn,
                messages=[
                    Message(role="system", content=EXTRACTION_INSTRUCTION),
                    Message(role="user", content=extraction_prompt(inp.excerpt)),
                ],
                model=inp.model,
                purpose="memory_extraction",
                max_output_tokens=800,
            )
            try:
                answer = await self.provider.complete(request)
            except ModelUnavailableError as err:
                if activity.info().attempt < 3:
                    raise ApplicationError(str(err), type=type(err).__name__) from None
                result.error = f"model unavailable: {err}"
            except (ContextTooLongError, ModelRequestError, ScriptExhaustedError) as err:
                result.error = f"model refused the extraction: {err}"
            except Exception as err:  # noqa: BLE001 - a provider's own bug must not cost the rule candidates
                if activity.info().attempt < 3:
                    raise
                result.error = f"model extraction failed: {type(err).__name__}: {err}"
            else:
                found, dropped, problems = parse_extraction(
                    answer.message.content or "",
                    user_id=inp.user_id,
                    session_id=inp.session_id,
                    turn=inp.turn,
                    created_at=inp.created_at,
                    min_confidence=inp.min_confidence,
                )
                result.model_candidates = len(found)
                result.dropped_low_confidence = dropped
                result.prompt_tokens, result.completion_tokens = answer.usage.prompt_tokens, answer.usage.completion_tokens
                result.user_day_tokens = await usage.record_for_activity(
                    self.redis, inp.user_id, inp.usage_day, result.prompt_tokens + result.completion_tokens
                )
                if problems:
                    result.error = "; ".join(problems)[:500]
                known = {" ".join(c.text.split()).casefold() for c in candidates}
                candidates += [c for c in found if " ".join(c.text.split()).casefold() not in known]
        kept = [c for c in candidates if c.confidence >= inp.min_confidence]
        result.dropped_low_confidence += len(candidates) - len(kept)
        if kept:
            await self._deliver(inp.user_id, MemoryBatch(candidates=kept))
        result.delivered = len(kept)
        return result

    async def _deliver(self, user_id: str, batch: MemoryBatch) -> None:
        if self.client is None:
            raise ApplicationError("no Temporal client to deliver memories with", non_retryable=True)
        # Signed as the session's user by this worker's command key (hermes.security.command_auth):
        # the writer takes no batch and no start without a proof.
        writer_id = names.memory_writer_id(user_id)
        await self.client.start_workflow(
            names.MEMORY_WRITER_WORKFLOW,
            command_auth.signed(self._writer_input(user_id), names.START_MEMORY_WRITER, writer_id, sender=user_id),
            id=writer_id,
            task_queue=self.task_queue,
            start_signal=names.ADD_MEMORIES,
            start_signal_args=[command_auth.signed(batch, names.ADD_MEMORIES, writer_id, sender=user_id)],
        )

    def _writer_input(self, user_id: str) -> MemoryWriterInput:
        return MemoryWriterInput(
            user_id=user_id,
            batch_size=self.batch_size,
            batch_seconds=self.batch_seconds,
            heartbeat_seconds=self.heartbeat_seconds,
            max_judge_calls=self.judge_max_calls,
        )

    @activity.defn(name=names.WRITE_MEMORIES)
    async def write_memories(self, inp: WriteMemoriesInput) -> WriteReport:
        """Write one batch (see :meth:`MemoryStore.write`); idempotent. A retried attempt
        reports what the batch's write did (inserted, updated, superseded), also when an
        earlier attempt applied it and failed before returning (issue 27).

        Raises:
            ApplicationError: ``EmbeddingModelMismatch`` (not retried: the writer keeps the
                batch and tries again later), or a store failure (retried).
        """
        try:
            with telemetry.span("hermes.memory.write", {"hermes.memory.candidates": len(inp.candidates)} if telemetry.enabled() else None) as span:
                async with self._changing(inp.user_id):
                    # A retry may follow an attempt whose write landed: it reports what that did.
                    retried = activity.in_activity() and activity.info().attempt > 1
                    report: WriteReport = await self._run(
                        lambda s: s.write(inp.candidates, judge=inp.judge and self.provider is not None, retried=retried)
                    )
                counts = (len(report.inserted), len(report.updated), len(report.superseded), report.unchanged, report.dropped)
                telemetry.set_attributes(span, dict(zip(_WRITE_OUTCOMES, counts)))
                telemetry.count_memory_writes(*counts)
                return report
        except EmbeddingModelMismatch as err:
            raise ApplicationError(str(err), type="EmbeddingModelMismatch", non_retryable=True) from None
        except MemoryStoreError as err:
            raise ApplicationError(str(err), type=type(err).__name__) from None

    @contextlib.asynccontextmanager
    async def _changing(self, user_id: str) -> AsyncIterator[None]:
        """Around a change of ``user_id``'s rows: on leaving, start a new rows generation
        (:meth:`_changed`) whatever the change reported, and also when it failed or was
        cancelled.

        Why always: an attempt of this activity cancelled after its commit (a heartbeat
        timeout on a loaded machine) never started the new generation, and its retry finds
        the rows already written and reports nothing changed; searches then kept serving
        the rows cached before the write (the demo's second session did not recall the
        user's city on a loaded machine). A generation too many costs one uncached search.

        And on entering, the change is marked (:meth:`_begin_change`): between a commit and
        the new generation, a search answered from the rows cached before the change (with
        three workers on object storage, a user who saw the move in the store was told the
        old city: ``bench/scale.py``). While marked, searches read LanceDB itself, which
        sees every commit. A cancelled attempt leaves the mark in place (its thread may
        still be about to commit) until it expires.
        """
        await asyncio.shield(self._begin_change(user_id))
        ended = False
        try:
            yield
            ended = True
        except asyncio.CancelledError:
            raise
        except BaseException:
            ended = True
            raise
        finally:
            await asyncio.shield(self._changed(user_id, ended=ended))

    @activity.defn(name=names.FORGET_MEMORIES)
    async def forget_memories(self, user_id: str) -> int:
        """Delete every row of ``user_id`` (memories and archive); returns how many."""
        try:
            async with self._changing(user_id):
                deleted = await self._run(lambda s: s.forget_user(user_id))
        except MemoryStoreError as err:
            raise ApplicationError(str(err), type=type(err).__name__, non_retryable=True) from None
        return deleted

    @activity.defn(name=names.FORGET_USER_MEMORIES)
    async def forget_user_memories(self, user_id: str) -> ForgetReport:
        """From a session: the user's writer drops what is pending and deletes every row
        (the writer's ``forget`` update, started if it is not running)."""
        if self.client is None:
            raise ApplicationError("no Temporal client", non_retryable=True)
        writer_id = names.memory_writer_id(user_id)
        operation = WithStartWorkflowOperation(
            names.MEMORY_WRITER_WORKFLOW,
            command_auth.signed(self._writer_input(user_id), names.START_MEMORY_WRITER, writer_id, sender=user_id),
            id=writer_id,
            task_queue=self.task_queue,
            id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
        )
        async with heartbeating():  # waits for the writer, which may be writing a batch
            proof = command_auth.proof_now(names.FORGET_USER, writer_id, None, sender=user_id)
            return await self.client.execute_update_with_start_workflow(
                names.FORGET_USER, proof, start_workflow_operation=operation, result_type=ForgetReport
            )

    # ------------------------------------------------------ consolidation

    @activity.defn(name=names.LIST_MEMORY_USERS)
    async def list_memory_users(self) -> list[str]:
        return await self._run(lambda s: s.users())

    @activity.defn(name=names.CONSOLIDATE_MEMORIES)
    async def consolidate_memories(self, inp: ConsolidateInput) -> ConsolidationReport:
        """Consolidate one user's rows (see :meth:`MemoryStore.consolidate_user`)."""
        judge = inp.judge and self.provider is not None
        try:
            async with self._changing(inp.user_id):
                return await self._run(lambda s: consolidate_and_judge(s, inp, judge=judge))
        except EmbeddingModelMismatch as err:
            raise ApplicationError(str(err), type="EmbeddingModelMismatch", non_retryable=True) from None
        except MemoryStoreError as err:
            raise ApplicationError(str(err), type=type(err).__name__, non_retryable=True) from None

    @activity.defn(name=names.JUDGE_MEMORIES)
    async def judge_memories(self, inp: JudgeMemoriesInput) -> JudgeReport:
        """Put the pairs a write batch or a consolidation left to the model before it and
        apply the verdicts (see :func:`judge_pairs`); off the reply path (the memory writer
        and the consolidation run it). A store failure raises (retried; verdicts already
        applied find their rows gone and change nothing)."""
        try:
            # Heartbeating also while the model answers (found by a break-it review: only the
            # store calls beat, so a judge call longer than the timeout was run and paid again).
            async with self._changing(inp.user_id), heartbeating():
                return await judge_pairs(self.store(), self.provider, inp, run=self._run)
        except MemoryStoreError as err:
            raise ApplicationError(str(err), type=type(err).__name__) from None

    @activity.defn(name=names.OPTIMIZE_MEMORIES)
    async def optimize_memories(self) -> None:
        """Fold new rows into the indexes (end of a consolidation run)."""
        await self._run(lambda s: s.optimize())

    def activities(self) -> list[Callable[..., Any]]:
        return [
            self.search_memories,
            self.extract_memories,
            self.write_memories,
            self.forget_memories,
            self.forget_user_memories,
            self.list_memory_users,
            self.consolidate_memories,
            self.judge_memories,
            self.optimize_memories,
        ]

