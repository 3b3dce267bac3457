"""Per-turn overhead of SessionWorkflow over a minimal hand-written workflow.

    python bench/turn_overhead.py            # N=200 turns per series
    python bench/turn_overhead.py --quick    # N=40, under a minute on 2 cores
    python bench/turn_overhead.py --breakdown  # also variants that locate the overhead

Both workflows run on one worker (built by ``worker.build_worker``, plus the baseline
workflow) against one Temporal dev server and one Redis, and call the *same*
registered activities with the same payload types: ``call_model`` (a scripted model that
always calls ``calculate`` and then replies), ``run_tool`` (the built-in ``calculate``),
``call_model`` again. A turn is therefore model -> tool -> model in both; what differs is
the session's own work: its per-turn ``begin_turn`` local activity (the tool listing and
the memory recall; ``list_tools`` and ``search_memories`` apart in a run's first turn),
the session-index write (a worker sink), the transcript it carries into every model call, state
bookkeeping, update validation, and update-with-start on the client side.

Series (turns interleaved in blocks, so machine noise hits all alike):

* ``session``: one session, every turn through ``HermesClient.send_message``
  (update-with-start), as a user's client sends them. Its transcript grows turn by turn,
  as in real use.
* ``session_update``: a second session, turns through a plain ``execute_update`` on its
  handle: the same workflow without the update-with-start client path.
* ``baseline``: one ``TurnOverheadBaselineWorkflow``, turns through ``execute_update``;
  its update handler runs model -> tool -> model and returns. Each model call carries
  the system prompt, the current turn's messages and the same tool list as the session.

With ``--breakdown``, bench-only subclasses of SessionWorkflow (workflow code unchanged)
add series that each remove one piece: ``no_index`` (no session-index write),
``tools_once`` (the tools listed once per run instead of per turn; the recall then runs
alone), ``turn_only`` (model calls carry only the current turn, not the transcript),
``lean`` (all three).

Printed per series: median / p95 / min / max of the per-turn wall-clock time; CPU per
turn of this process (worker + client) and of the dev server; history events and bytes
per turn (first and last block) and any continue-as-new. Then: the transcript effect
(first vs last quarter), update-with-start vs execute_update, the baseline's turn
anatomy from server timestamps, and the session/baseline CPU ratio.

Reading the figures: on the dev server here a turn's wall-clock time is dominated by
task dispatch (workflow-task schedule-to-start, four per turn, after the first ~10
updates of a run), identical for both workflows; the CPU figures show the work the
session adds even when the wall-clock ratio does not.

Last line: ``turn_overhead_ratio=<session median / baseline median, 2 decimals>``.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    if not workflow.unsafe.in_sandbox():  # the sandbox re-imports this file; the host set the path
        sys.path.insert(0, str(Path(__file__).resolve().parent))
    import _common  # also puts the repository root on sys.path
    from pydantic import BaseModel

    from hermes import names
    from hermes.security import command_auth
    from hermes.models import (
        CallModelInput,
        CallModelResult,
        Message,
        RunToolInput,
        SendMessageInput,
        SessionConfig,
        SessionInput,
        SessionState,
        ToolResult,
        ToolSpec,
        TurnResult,
    )

from workflows.session import SessionWorkflow

BASELINE_WORKFLOW = "TurnOverheadBaselineWorkflow"
BASELINE_TURN = "turn"
BASELINE_STOP = "stop"

SCRIPT: dict[str, Any] = {
    "turns": [
        {
            "match": ".",
            "steps": [
                {"tool_calls": [{"name": "calculate", "arguments": {"expression": "(17 + 25) * 3"}}]},
                {"reply": "It is {{ last_tool_result.data.value }}."},
            ],
        }
    ]
}
"""Every user message: one ``calculate`` call, then a reply quoting its value."""


# ---------------------------------------------------------------------- baseline


class BaselineInput(BaseModel):
    session_id: str
    user_id: str
    system_prompt: str
    tools: list[ToolSpec]
    """The same tool list the session sends to the model (fetched once, by the bench)."""
    model_timeout_seconds: float = 120.0


@workflow.defn(name=BASELINE_WORKFLOW)
class BaselineWorkflow:
    """The least a durable turn needs: an update that runs model -> tool -> model."""

    @workflow.init
    def __init__(self, inp: BaselineInput) -> None:
        self._inp = inp
        self._turn = 0
        self._stop = False

    @workflow.run
    async def run(self, inp: BaselineInput) -> int:
        await workflow.wait_condition(lambda: self._stop and workflow.all_handlers_finished())
        return self._turn

    @workflow.signal(name=BASELINE_STOP)
    def stop(self) -> None:
        self._stop = True

    @workflow.update(name=BASELINE_TURN)
    async def turn(self, text: str) -> str:
        self._turn += 1
        turn = self._turn
        inp = self._inp
        system = Message(role="system", content=inp.system_prompt)
        user = Message(role="user", content=text, turn=turn)
        first = await self._model([system, user], turn)
        call = first.message.tool_calls[0]
        result = await workflow.execute_activity(
            names.RUN_TOOL,
            RunToolInput(session_id=inp.session_id, user_id=inp.user_id, turn=turn, tool_call=call),
            result_type=ToolResult,
            start_to_close_timeout=timedelta(seconds=15),
            heartbeat_timeout=timedelta(seconds=5),
        )
        answer = Message(
            role="tool", content=result.model_dump_json(), tool_call_id=call.tool_call_id, name=call.name, turn=turn
        )
        final = await self._model([system, user, first.message, answer], turn)
        return final.message.content or ""

    async def _model(self, messages: list[Message], turn: int) -> CallModelResult:
        return await workflow.execute_activity(
            names.CALL_MODEL,
            CallModelInput(session_id=self._inp.session_id, turn=turn, messages=messages, tools=self._inp.tools),
            result_type=CallModelResult,
            start_to_close_timeout=timedelta(seconds=self._inp.model_timeout_seconds),
        )


# ------------------------------------------------- breakdown variants (bench only)


class _NoIndexMixin:
    def _schedule_index_update(self, finished: tuple[int, str] | None = None) -> None:
        # The Redis session index (and, at a turn's end, its turn_finished event): skipped.
        return None


class _ToolsOnceMixin:
    _bench_specs: dict[str, ToolSpec] | None = None

    async def _list_tools(self, turn: int, text: str) -> Any:  # once per run, not per turn
        if self._bench_specs is None:
            self._bench_specs = await super()._list_tools(turn, text)  # type: ignore[misc]
            return self._bench_specs
        self._s.early_recall = None  # type: ignore[attr-defined]  # the recall: its own local activity
        return self._bench_specs


class _TurnOnlyMixin:
    _s: Any
    _model: Any

    async def _run_turn_inner(self, inp: SendMessageInput) -> Any:
        # The model sees this turn only: each model request is planned over the turn's
        # messages; the transcript itself is kept whole and restored.
        steps = self._model
        if not getattr(steps, "_bench_turn_only", False):
            planned = steps.model_request

            def turn_only_request(turn: int, tools: list[ToolSpec], step: int) -> CallModelInput:
                transcript = self._s.transcript
                whole = transcript.messages
                transcript.messages = [m for m in whole if m.turn == turn]
                try:
                    return planned(turn, tools, step)
                finally:
                    transcript.messages = whole

            steps.model_request = turn_only_request
            steps._bench_turn_only = True
        return await super()._run_turn_inner(inp)  # type: ignore[misc]


@workflow.defn(name="TurnOverheadNoIndexSession")
class NoIndexSession(_NoIndexMixin, SessionWorkflow):
    @workflow.run
    async def run(self, inp: SessionInput) -> SessionState:
        return await super().run(inp)


@workflow.defn(name="TurnOverheadToolsOnceSession")
class ToolsOnceSession(_ToolsOnceMixin, SessionWorkflow):
    @workflow.run
    async def run(self, inp: SessionInput) -> SessionState:
        return await super().run(inp)


@workflow.defn(name="TurnOverheadTurnOnlySession")
class TurnOnlySession(_TurnOnlyMixin, SessionWorkflow):
    @workflow.run
    async def run(self, inp: SessionInput) -> SessionState:
        return await super().run(inp)


@workflow.defn(name="TurnOverheadLeanSession")
class LeanSession(_NoIndexMixin, _ToolsOnceMixin, _TurnOnlyMixin, SessionWorkflow):
    @workflow.run
    async def run(self, inp: SessionInput) -> SessionState:
        return await super().run(inp)


VARIANTS: dict[str, type] = {
    "no_index": NoIndexSession,
    "tools_once": ToolsOnceSession,
    "turn_only": TurnOnlySession,
    "lean": LeanSession,
}


# ---------------------------------------------------------------------- the run


class Series:
    """One way of running turns, its samples and its history growth."""

    def __init__(self, name: str, workflow_id: str, run_turn: Callable[[int], Awaitable[str]] | None = None):
        self.name = name
        self.cpu_blocks: list[tuple[int, float]] = []
        """(turns, CPU seconds of this process: worker + client) per measured block."""
        self.cpu_server_seconds = 0.0
        """CPU of the Temporal dev server over the same spans."""
        self.workflow_id = workflow_id
        self.run_turn = run_turn
        self.samples: list[float] = []
        self.history: list[tuple[int, int, int, str]] = []
        """(measured turns so far, events, bytes, run id) at each block boundary."""
        self.busy_retries = 0

    async def turns(self, count: int, *, record: bool, server_pids: Sequence[int] = ()) -> None:
        """Run ``count`` turns one after another; with ``record``, keep their times and CPU."""
        assert self.run_turn is not None
        cpu_bench = time.process_time()
        cpu_server = sum(_common.cpu_seconds(pid) for pid in server_pids)
        for _ in range(count):
            began = time.perf_counter()
            reply = await self.run_turn(len(self.samples))
            elapsed = time.perf_counter() - began
            if not reply.startswith("It is 126"):
                raise RuntimeError(f"{self.name}: unexpected reply {reply!r}")
            if record:
                self.samples.append(elapsed)
        if record:
            self.cpu_blocks.append((count, time.process_time() - cpu_bench))
            self.cpu_server_seconds += sum(_common.cpu_seconds(pid) for pid in server_pids) - cpu_server


async def _settled_history(client: Any, workflow_id: str) -> tuple[int, int, str]:
    """(events, bytes, run id) once no activity of the workflow is pending (bounded wait)."""
    handle = client.get_workflow_handle(workflow_id)
    for _ in range(200):
        desc = await handle.describe()
        raw = desc.raw_description
        if not raw.pending_activities:
            break
        await asyncio.sleep(0.01)
    info = raw.workflow_execution_info
    return int(info.history_length), int(info.history_size_bytes), desc.run_id or ""


async def _snapshot(client: Any, series: Series, turns: int) -> None:
    events, size, run_id = await _settled_history(client, series.workflow_id)
    series.history.append((turns, events, size, run_id))


async def _anatomy(client: Any, workflow_id: str, after_event_id: int) -> dict[str, tuple[float, int]]:
    """Mean durations (ms) and counts of the steps of a workflow's turns, from its history.

    Args:
        after_event_id: only events after this one (the measured turns) are read.

    Returns:
        ``{"workflow task schedule-to-start": (mean_ms, count), ...}``.
    """
    from temporalio.api.enums.v1 import EventType

    pairs = {
        (EventType.EVENT_TYPE_WORKFLOW_TASK_SCHEDULED, EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED): "workflow task schedule-to-start",
        (EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED, EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED): "workflow task processing",
        (EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED, EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED): "activity start-to-close",
    }
    spans: dict[str, list[float]] = {name: [] for name in pairs.values()}
    events = [e async for e in client.get_workflow_handle(workflow_id).fetch_history_events() if e.event_id > after_event_id]
    for a, b in zip(events, events[1:]):
        name = pairs.get((a.event_type, b.event_type))
        if name:
            spans[name].append((b.event_time.ToDatetime() - a.event_time.ToDatetime()).total_seconds() * 1000)
    return {name: (statistics.fmean(v) if v else 0.0, len(v)) for name, v in spans.items()}


def _growth(points: list[tuple[int, int, int, str]]) -> list[tuple[int, int, int]]:
    """(turns, events, bytes) added between consecutive snapshots of the same run.

    A pair spanning a continue-as-new is left out: the new run's history starts over.
    """
    return [
        (t1 - t0, e1 - e0, b1 - b0)
        for (t0, e0, b0, r0), (t1, e1, b1, r1) in zip(points, points[1:])
        if r0 == r1 and t1 > t0
    ]


def _rollovers(points: list[tuple[int, int, int, str]]) -> list[tuple[int, int]]:
    """(events, bytes) of each run at the last snapshot before it continued as new."""
    return [(e0, b0) for (_, e0, b0, r0), (_, _, _, r1) in zip(points, points[1:]) if r0 != r1]


async def main() -> None:
    p = _common.parser(__doc__.splitlines()[0])
    p.add_argument("-n", "--turns", type=int, help="measured turns per series (default 200, --quick 40)")
    p.add_argument("--breakdown", action="store_true", help="add bench-only variants that locate the overhead")
    p.add_argument(
        "--tracing", action="store_true",
        help="add session_traced: the session with OpenTelemetry traces and metrics on (in-memory exporter)",
    )
    p.add_argument(
        "--encryption", action="store_true",
        help="add session_encrypted: the session with payloads (and Redis bodies) encrypted; with --tracing "
        "also session_traced_encrypted, both on",
    )
    args = p.parse_args()
    n = args.turns or (40 if args.quick else 200)
    # Per workflow run, the first ~10 updates on this dev server are dispatched about 3x
    # faster than all later ones (measured: ~50 ms vs ~150 ms per baseline turn, the
    # difference being workflow-task schedule-to-start). Warm every series past that.
    warmup = 15
    block = 5 if args.quick else 10

    from temporalio.worker import Worker

    from hermes.client import HermesClient
    from hermes.providers.scripted import ScriptedModel
    from hermes.settings import Settings
    from hermes.tools.builtin import register_builtins
    from hermes.tools.registry import ToolRegistry
    from hermes.infra.process import freeze_startup_heap
    from worker import build_worker, set_deadlock_timeout

    async with _common.bench_stack() as stack:
        client = stack.client
        task_queue = f"bench-turn-overhead-{uuid.uuid4()}"
        settings = Settings(data_dir=stack.data_dir, redis_url=stack.redis_url, task_queue=task_queue, temporal_address="unused:0")
        registry = register_builtins(ToolRegistry())
        # build_worker's exact configuration, plus the bench's workflows. The template is
        # built on another task queue (one worker per queue per process) and never run.
        template = build_worker(
            client,
            settings,
            task_queue=f"{task_queue}-template",
            provider=ScriptedModel.from_dict(SCRIPT, source="bench"),
            registry=registry,
            redis=stack.redis,
        )
        config = template.config()
        config["task_queue"] = task_queue

        def make_worker(variant_client: Any, queue: str) -> Any:
            # A variant's activities use its client (an encrypted session's model activity
            # queries the session with the encrypting converter), as in production.
            return build_worker(variant_client, settings, task_queue=queue,
                                provider=ScriptedModel.from_dict(SCRIPT, source="bench"), registry=registry, redis=stack.redis)

        async with template:  # started and shut down, so its native half is released cleanly
            pass
        extra = [BaselineWorkflow, *(VARIANTS.values() if args.breakdown else [])]
        config["workflows"] = [*config["workflows"], *extra]
        worker = Worker(**config)
        set_deadlock_timeout(worker, settings.workflow_deadlock_seconds)  # as build_worker does
        session_config = SessionConfig()
        hermes = HermesClient(client, task_queue=task_queue, redis=stack.redis, config=session_config)
        specs = [
            t.spec(tier_seconds=settings.tier_seconds, heartbeat_timeout_seconds=settings.tool_heartbeat_seconds)
            for t in registry
        ]
        tag = uuid.uuid4().hex[:8]
        text = "What is (17 + 25) * 3?"

        async with worker:
            # As run_worker does once its worker runs (hermes.infra.process): the start-up
            # heap out of the garbage collector's passes; every series shares it.
            freeze_startup_heap()
            session_id = f"bench-session-{tag}"

            async def session_turn(_: int) -> str:
                return (await hermes.send_message(session_id, text, user_id="bench")).reply

            plain_id = f"bench-session-update-{tag}"
            await hermes.send_message(plain_id, text, user_id="bench")  # created; then plain updates
            plain = client.get_workflow_handle(plain_id)

            async def plain_turn(_: int) -> str:
                # Signed as every client's message is (hermes.security.command_auth): sessions refuse others.
                message = command_auth.signed(
                    SendMessageInput(text=text, client_message_id=f"msg-{uuid.uuid4()}"), names.SEND_MESSAGE, plain_id,
                    sender="bench",
                )
                return await _retry_busy(
                    by_name["session_update"],
                    lambda: plain.execute_update(names.SEND_MESSAGE, message, result_type=TurnResult),
                )

            baseline_id = f"bench-baseline-{tag}"
            baseline = await client.start_workflow(
                BASELINE_WORKFLOW,
                BaselineInput(
                    session_id=baseline_id,
                    user_id="bench",
                    system_prompt=session_config.system_prompt,
                    tools=specs,
                    model_timeout_seconds=session_config.model_timeout_seconds,
                ),
                id=baseline_id,
                task_queue=task_queue,
            )

            async def baseline_turn(_: int) -> str:
                return await baseline.execute_update(BASELINE_TURN, text, result_type=str)

            series = [
                Series("session", session_id, session_turn),
                Series("baseline", baseline_id, baseline_turn),
                Series("session_update", plain_id, plain_turn),
            ]
            # With --tracing or --encryption, session_control is the same session on its own
            # worker with both off: each variant is compared with it (same setup, same run).
            traced = _start_tracing() if args.tracing else None
            for tracing, encrypting in ((False, False), (True, False), (False, True), (True, True)):
                if (args.tracing or args.encryption) and (args.tracing or not tracing) and (args.encryption or not encrypting):
                    series.append(await _variant_series(client, make_worker, task_queue, text, tag, session_config,
                                                        stack.redis, tracing=traced if tracing else None,
                                                        encrypting=encrypting))
            by_name = {s.name: s for s in series}
            if args.breakdown:
                for name, cls in VARIANTS.items():
                    wid = f"bench-{name}-{tag}"
                    wf_name = f"TurnOverhead{cls.__name__}"
                    variant = Series(name, wid)
                    variant.run_turn = _variant_turn(client, task_queue, wf_name, wid, text, session_config, variant)
                    series.append(variant)

            server_pids = _common.child_pids("temporal")
            began = time.perf_counter()
            for s in series:
                await s.turns(warmup, record=False)
            for s in series:
                await _snapshot(client, s, 0)
            done = 0
            rounds = 0
            while done < n:
                count = min(block, n - done)
                # Rotate the order each block, so no series always follows the same one.
                order = series[rounds % len(series) :] + series[: rounds % len(series)]
                for s in order:
                    await s.turns(count, record=True, server_pids=server_pids)
                done += count
                rounds += 1
                for s in series:
                    await _snapshot(client, s, done)
            elapsed = time.perf_counter() - began
            anatomy = await _anatomy(client, baseline_id, by_name["baseline"].history[0][1])
            await baseline.signal(BASELINE_STOP)
            await baseline.result()
            for s in series:
                if isinstance(s, VariantSeries):
                    await s.close()
            if traced is not None:
                from hermes.infra import telemetry

                telemetry.shutdown()

        _report(args, n, warmup, block, config, series, elapsed, anatomy)


class VariantSeries(Series):
    """The session with telemetry and/or payload encryption on: its own worker, on a
    client with the OpenTelemetry plugin and/or the encryption codec, on its own task
    queue; spans to an in-memory exporter through the batch processor production uses,
    metrics to an in-memory reader. Telemetry and the content store's key ring are
    process-wide (:mod:`hermes.infra.telemetry`, :func:`hermes.security.encryption.activate`), so they
    are switched on for this series' turns only: the other series run with them off.
    (Background work a turn leaves, the session-index write, may run in the next series'
    turn either way.)"""

    def __init__(self, name: str, workflow_id: str, worker: Any, on: Any, spans: Any, keyring: Any):
        super().__init__(name, workflow_id)
        self.worker, self.on, self.spans, self.keyring = worker, on, spans, keyring

    async def turns(self, count: int, *, record: bool, server_pids: Sequence[int] = ()) -> None:
        from hermes.infra import telemetry
        from hermes.security import encryption

        telemetry._current = self.on  # noqa: SLF001 - the bench switches it per series
        encryption.activate(self.keyring)
        try:
            await super().turns(count, record=record, server_pids=server_pids)
        finally:
            telemetry._current = None  # noqa: SLF001
            encryption.activate(None)

    async def close(self) -> None:
        if self.on is not None:
            self.on.span_processor.force_flush()
            self.exported = len(self.spans.get_finished_spans())
        await self.worker.__aexit__(None, None, None)


def _start_tracing() -> tuple[Any, Any, list[Any]]:
    """Telemetry for the traced series: spans to one in-memory exporter, metrics to an
    in-memory reader, and their clients' plugins; left off between their turns
    (:class:`VariantSeries` switches it)."""
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from hermes.infra import telemetry

    spans = InMemorySpanExporter()
    on = telemetry.start(span_exporters=[spans], metric_readers=[InMemoryMetricReader()])
    plugins = telemetry.plugins()
    telemetry._current = None  # noqa: SLF001 - on only during the traced series' turns
    return on, spans, plugins


async def _variant_series(
    client: Any, make_worker: Callable[[Any, str], Any], task_queue: str, text: str, tag: str,
    session_config: SessionConfig, redis: Any, *, tracing: tuple[Any, Any, list[Any]] | None, encrypting: bool,
) -> VariantSeries:
    """``session_control``, ``session_traced``, ``session_encrypted`` or
    ``session_traced_encrypted`` (see :class:`VariantSeries`), its worker started.
    ``tracing``: the telemetry and span exporter of :func:`_start_tracing`, or None."""
    import base64

    from temporalio.client import Client

    from hermes.security import encryption
    from hermes.client import HermesClient
    from hermes.security.keyfiles import new_key

    on, spans, plugins = tracing or (None, None, [])
    keyring = None
    if encrypting:
        keyring = encryption.KeyRing({"bench": base64.b64decode(new_key())}, "bench")
    converter = encryption.data_converter(keyring) if keyring is not None else client.data_converter
    variant = Client(client.service_client, namespace=client.namespace, data_converter=converter, plugins=plugins)
    name = ("session" + ("_traced" if tracing else "") + ("_encrypted" if encrypting else "")) if tracing or encrypting \
        else "session_control"
    queue = f"{task_queue}-{name}"
    worker = make_worker(variant, queue)
    await worker.__aenter__()
    hermes = HermesClient(variant, task_queue=queue, redis=redis, config=session_config)
    session_id = f"bench-{name.replace('_', '-')}-{tag}"
    series = VariantSeries(name, session_id, worker, on, spans, keyring)

    async def variant_turn(_: int) -> str:
        return (await hermes.send_message(session_id, text, user_id="bench")).reply

    series.run_turn = variant_turn
    return series


def _variant_turn(
    client: Any, task_queue: str, wf_name: str, wid: str, text: str, config: SessionConfig, counter: Series
) -> Callable[[int], Awaitable[str]]:
    """Turns of a breakdown variant through update-with-start, like ``send_message``."""
    from temporalio.client import WithStartWorkflowOperation
    from temporalio.common import WorkflowIDConflictPolicy

    from hermes.models import SessionInput

    async def turn(_: int) -> str:
        cid = f"msg-{uuid.uuid4()}"

        def send() -> Awaitable[TurnResult]:
            start = WithStartWorkflowOperation(  # single-use: a new one per attempt
                wf_name,
                command_auth.signed(
                    SessionInput(session_id=wid, user_id="bench", channel="cli", config=config), names.START_SESSION, wid,
                    sender="bench",
                ),
                id=wid,
                task_queue=task_queue,
                id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
            )
            return client.execute_update_with_start_workflow(
                names.SEND_MESSAGE,
                command_auth.signed(SendMessageInput(text=text, client_message_id=cid), names.SEND_MESSAGE, wid, sender="bench"),
                start_workflow_operation=start,
                result_type=TurnResult,
            )

        return await _retry_busy(counter, send)

    return turn


async def _retry_busy(counter: Series, send: Callable[[], Awaitable[TurnResult]]) -> str:
    """Send a message, retrying while the session continues as new, as HermesClient does.

    Raises:
        RuntimeError: the session stayed busy for 100 attempts.
        WorkflowUpdateFailedError: any other refusal.
    """
    from temporalio.client import WorkflowUpdateFailedError

    delay = 0.05
    for _ in range(100):
        try:
            return (await send()).reply
        except WorkflowUpdateFailedError as err:
            if getattr(err.cause, "type", None) != "SessionBusyError":
                raise
        counter.busy_retries += 1
        await asyncio.sleep(delay)
        delay = min(delay * 2, 2.0)
    raise RuntimeError(f"{counter.name}: the session stayed busy")


def _cpu_ms(blocks: list[tuple[int, float]]) -> float:
    """Mean CPU milliseconds per turn over (turns, CPU seconds) blocks."""
    return sum(c for _, c in blocks) / max(sum(t for t, _ in blocks), 1) * 1000


def _report(
    args: Any,
    n: int,
    warmup: int,
    block: int,
    config: dict[str, Any],
    series: list[Series],
    elapsed: float,
    anatomy: dict[str, tuple[float, int]],
) -> None:
    """Print the figures; the last line is the headline ``turn_overhead_ratio=...``."""
    sticky = config.get("sticky_queue_schedule_to_start_timeout")
    runner = config.get("workflow_runner")
    print(
        f"turn_overhead: N={n} measured turns per series, warm-up {warmup}, blocks of {block} interleaved"
        f"{' (quick)' if args.quick else ''}; {elapsed:.1f} s of turns"
    )
    print(
        "worker: one worker for all series (worker.build_worker's config + the bench workflows): "
        f"max_cached_workflows={config.get('max_cached_workflows')}, "
        f"sticky_queue_schedule_to_start_timeout={sticky.total_seconds() if sticky else None} s, "
        f"max_concurrent_activities={config.get('max_concurrent_activities')}, "
        f"workflow runner={type(runner).__name__ if runner else 'default'}, "
        f"eager activities={'off' if config.get('disable_eager_activity_execution') else 'on'}"
    )
    print("turn = model (calls calculate) -> tool calculate -> model (reply); time = client wall-clock per turn")
    for s in series:
        growth = _growth(s.history)
        turns = sum(g[0] for g in growth) or 1
        early = growth[0][2] / growth[0][0] if growth else 0.0
        late = growth[-1][2] / growth[-1][0] if growth else 0.0
        print(f"  {s.name:<15} {_common.describe_ms(s.samples)}")
        print(
            f"  {'':<15} CPU per turn: {_cpu_ms(s.cpu_blocks):.1f} ms worker+client process, "
            f"{s.cpu_server_seconds / max(len(s.samples), 1) * 1000:.1f} ms Temporal dev server"
        )
        print(
            f"  {'':<15} history per turn: {sum(g[1] for g in growth) / turns:.1f} events, "
            f"{sum(g[2] for g in growth) / turns / 1024:.1f} KiB "
            f"(first block {early / 1024:.1f} KiB/turn, last block {late / 1024:.1f} KiB/turn)"
        )
        rolls = _rollovers(s.history)
        if rolls:
            at = ", ".join(f"{e} events/{b / 2**20:.1f} MiB" for e, b in rolls)
            print(f"  {'':<15} continued as new {len(rolls)} times; last seen size of each run: {at}")
        if s.busy_retries:
            print(f"  {'':<15} {s.busy_retries} updates refused as busy (continuing as new) and retried")

    by_name = {s.name: s for s in series}
    session, base, plain = by_name["session"], by_name["baseline"], by_name["session_update"]
    session_median = statistics.median(session.samples)
    base_median = statistics.median(base.samples)
    plain_median = statistics.median(plain.samples)
    quarter = max(len(session.samples) // 4, 1)
    qblocks = max(len(session.cpu_blocks) // 4, 1)

    def med_ms(samples: list[float]) -> float:
        return statistics.median(samples) * 1000

    print(
        f"transcript effect (first vs last quarter of measured turns): session median "
        f"{med_ms(session.samples[:quarter]):.1f} -> {med_ms(session.samples[-quarter:]):.1f} ms, "
        f"CPU {_cpu_ms(session.cpu_blocks[:qblocks]):.1f} -> {_cpu_ms(session.cpu_blocks[-qblocks:]):.1f} ms/turn; "
        f"baseline {med_ms(base.samples[:quarter]):.1f} -> {med_ms(base.samples[-quarter:]):.1f} ms, "
        f"CPU {_cpu_ms(base.cpu_blocks[:qblocks]):.1f} -> {_cpu_ms(base.cpu_blocks[-qblocks:]):.1f} ms/turn "
        "(the session's transcript grows 4 messages a turn; each model call carries one reference to its context, built within a token budget)"
    )
    print(
        f"update-with-start vs execute_update (session): median {session_median * 1000:.1f} vs "
        f"{plain_median * 1000:.1f} ms; execute_update session / baseline = {plain_median / base_median:.2f}"
    )
    turns = max(len(base.samples), 1)
    print(
        "baseline turn anatomy (server timestamps): "
        + ", ".join(f"{name} {mean:.1f} ms x {count / turns:.1f}/turn" for name, (mean, count) in anatomy.items())
        + " -- the wall-clock floor is mostly task dispatch, not work"
    )
    cpu = {s.name: _cpu_ms(s.cpu_blocks) for s in series}
    print(
        f"CPU per turn, worker+client process: session / baseline = {cpu['session'] / cpu['baseline']:.2f} "
        f"({cpu['session']:.1f} vs {cpu['baseline']:.1f} ms)"
    )
    print(f"cpu_ratio={cpu['session'] / cpu['baseline']:.2f}")  # issue 31's target: at most 1.5
    control = by_name.get("session_control")
    control_median = statistics.median(control.samples) if control is not None else session_median
    for name, what, figure in (
        ("session_traced", "tracing", "tracing_overhead_ratio"),
        ("session_encrypted", "encryption", "encryption_overhead_ratio"),
        ("session_traced_encrypted", "tracing and encryption", "traced_encrypted_overhead_ratio"),
    ):
        variant = by_name.get(name)
        if variant is None:
            continue
        median = statistics.median(variant.samples)
        measured = max(len(variant.samples) + 15, 1)
        # The traced series share one in-memory exporter (telemetry is process-wide).
        traced_series = max(sum("traced" in s.name for s in series), 1)
        exported = (f"; {getattr(variant, 'exported', 0) / measured / traced_series:.1f} spans per turn exported"
                    if "traced" in name else "")
        print(
            f"{what} on / off (session on its own worker vs session_control, side by side): median "
            f"{median * 1000:.1f} vs {control_median * 1000:.1f} ms = {median / control_median:.2f}; CPU per turn "
            f"{cpu[name]:.1f} vs {cpu['session_control']:.1f} ms = {cpu[name] / cpu['session_control']:.2f}{exported}"
        )
        print(f"{figure}={median / control_median:.2f}")
    for s in series[3:]:
        if isinstance(s, VariantSeries):
            continue
        m = statistics.median(s.samples)
        print(
            f"breakdown: {s.name:<11} median {m * 1000:.1f} ms ({m / base_median:.2f} x baseline); "
            f"CPU {cpu[s.name]:.1f} ms/turn, {cpu['session'] - cpu[s.name]:.1f} ms less than the session"
        )
    _common.headline("turn_overhead_ratio", f"{session_median / base_median:.2f}")


if __name__ == "__main__":
    asyncio.run(main())
