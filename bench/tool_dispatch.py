"""Per-call overhead of Hermes' tool layer over a bare Temporal activity running the same function.

    python bench/tool_dispatch.py            # N=40 measured turns per series, K=20 calls a turn
    python bench/tool_dispatch.py --quick    # N=8, under a minute on 2 cores
    python bench/tool_dispatch.py -k 10 -n 60

One worker (``worker.build_worker``'s configuration, plus the bench's baseline workflow
and bare activity), one Temporal dev server, one Redis. A bench-only model provider
(:class:`DispatchModel`, deterministic, no I/O) answers a user message ``calls=<k>``
with ONE assistant message of ``k`` tool calls, then, once their results are in, a reply
that counts the successful results and sums their data (checked by the bench, so a
call that did not run, or ran with other arguments, fails the run). The calls alternate
between two registered tools that run the same function, :func:`lookup`:

* ``lookup``: ``idempotency="idempotent"``, permission ``read``;
* ``lookup_once``: ``idempotency="none"``, permission ``read`` (runs without approval):
  every call goes through the exactly-once ledger in Redis (``SET NX`` before the call,
  the result written after it).

So half of the calls of every turn (call 0, 2, 4, ...) are idempotent and half go
through the ledger.

Two workflows, each driven with two kinds of turn:

* ``hermes``: one ``SessionWorkflow``, every turn through ``HermesClient.send_message``.
  A tool call is the whole tool layer: the workflow's per-call handling (permission
  policy, the activity options from the tool's spec, the trace, the tool message in the
  transcript) and the ``run_tool`` activity (argument coercion and validation, the
  ledger for ``lookup_once``, the heartbeat wrapper, the result in ``{code, message,
  data}`` form, capped).
* ``bare``: ``ToolDispatchBaselineWorkflow``, defined here, turns through
  ``execute_update``: model -> K bare activities, one after another as the session runs
  them, each calling :func:`lookup` with the model's arguments (no validation, no
  ledger, no policy, no heartbeat, no trace) -> model. It calls the same ``call_model``
  activity with the same provider and the same tool list.

Each workflow runs ``K``-call turns (``calls=K``, the figure of interest) and 2-call
reference turns (``calls=2``: one ``lookup``, one ``lookup_once``) in the same run, so
the transcript the session carries is the same for both. The per-call time of a series
is ``(median K-call turn - median 2-call turn) / (K - 2)``: the two turns have the same
shape (two model calls, one list of tools, one index write for the session) and differ
only by K - 2 tool calls, half of each kind. The four series run in interleaved blocks,
rotating their order, so machine noise hits all alike.

Printed: per series the median / p95 / min / max turn time and CPU per turn (this
process: worker + client; and the dev server); per workflow the per-call time and CPU
per call; the same per-call time read from server timestamps (the median interval
between the scheduling of consecutive tool activities of a turn) as a cross-check; the
whole-turn ratio.

Last line: ``tool_dispatch_ratio=<hermes per-call / bare per-call, 2 decimals>``
(target: at most 1.3; printed, not asserted).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
import statistics
import sys
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

from temporalio import activity, workflow

with workflow.unsafe.imports_passed_through():
    if not workflow.unsafe.in_sandbox():  # the sandbox re-imports this file; the host set the path
        sys.path.insert(0, str(Path(__file__).resolve().parent))
    import _common  # also puts the repository root on sys.path
    from pydantic import BaseModel

    from hermes import names
    from hermes.models import CallModelInput, CallModelResult, Message, ToolCall, ToolResult, ToolSpec

BASELINE_WORKFLOW = "ToolDispatchBaselineWorkflow"
BASELINE_TURN = "turn"
BASELINE_STOP = "stop"
BARE_ACTIVITY = "bench_bare_lookup"
TARGET_RATIO = 1.3
"""The issue's target for ``tool_dispatch_ratio`` (at most)."""
REFERENCE_CALLS = 2
"""Tool calls of a reference turn: one ``lookup``, one ``lookup_once``."""
TOOL_NAMES = ("lookup", "lookup_once")
"""Call ``i`` of a turn goes to ``TOOL_NAMES[i % 2]``."""


# ---------------------------------------------------------------------- the tool


def lookup(order_id: int, verbose: bool = False) -> dict[str, Any]:
    """Look up an order by its number.

    Args:
        order_id: the order number, e.g. 1001.
        verbose: also list the order's line items.

    Returns:
        The order's status and total in cents (and its items when verbose).
    """
    digest = hashlib.sha256(f"order:{order_id}".encode()).digest()
    order: dict[str, Any] = {
        "order_id": order_id,
        "status": ("open", "paid", "shipped")[digest[0] % 3],
        "total_cents": int.from_bytes(digest[1:4], "big") % 100_000,
    }
    if verbose:
        order["items"] = [{"sku": f"sku-{b:03d}", "quantity": 1 + b % 4} for b in digest[4:7]]
    return order


def arguments_of(turn: int, index: int) -> dict[str, Any]:
    """The arguments the model sends with call ``index`` of turn ``turn``."""
    return {"order_id": 1000 + (turn * 37 + index) % 9000, "verbose": index % 4 == 0}


def expected_reply(turn: int, calls: int) -> str:
    """The reply :class:`DispatchModel` gives when all ``calls`` ran with its arguments."""
    total = sum(lookup(**arguments_of(turn, i))["total_cents"] for i in range(calls))
    return f"{calls}/{calls} ok, total {total}"


# ---------------------------------------------------------------------- the model


_CALLS_RE = re.compile(r"calls=(\d+)")


class DispatchModel:
    """A bench-only :class:`~hermes.providers.base.ModelProvider`.

    The user message ``calls=<k>`` is answered by one assistant message with ``k`` tool
    calls (``TOOL_NAMES`` alternating, arguments from :func:`arguments_of`), then, when
    the current turn has tool results, by ``"<ok>/<k> ok, total <sum of total_cents>"``.
    Stateless: the position comes from the messages, like ``ScriptedModel``.
    """

    name = "bench-dispatch"

    async def complete(self, request: CallModelInput) -> CallModelResult:
        messages = request.messages
        last_user = max(i for i, m in enumerate(messages) if m.role == "user")
        match = _CALLS_RE.search(messages[last_user].content or "")
        calls = int(match.group(1)) if match else 0
        answered = [m for m in messages[last_user + 1 :] if m.role == "tool"]
        if calls and not answered:
            tool_calls = [
                ToolCall(tool_call_id=f"t{request.turn}_{i}", name=TOOL_NAMES[i % 2], arguments=arguments_of(request.turn, i))
                for i in range(calls)
            ]
            return CallModelResult(message=Message(role="assistant", tool_calls=tool_calls), provider=self.name)
        ok, total = 0, 0
        for m in answered:
            result = json.loads(m.content or "{}")
            if result.get("code") == 0 and isinstance(result.get("data"), dict):
                ok += 1
                total += int(result["data"].get("total_cents", 0))
        text = f"{ok}/{len(answered)} ok, total {total}"
        return CallModelResult(message=Message(role="assistant", content=text), provider=self.name)


# ---------------------------------------------------------------------- baseline


class BareLookupInput(BaseModel):
    arguments: dict[str, Any]
    """The model's arguments, passed to :func:`lookup` as they are."""


@activity.defn(name=BARE_ACTIVITY)
async def bare_lookup(inp: BareLookupInput) -> dict[str, Any]:
    """The same function as the ``lookup`` tools, with nothing around it."""
    return lookup(**inp.arguments)


class BaselineInput(BaseModel):
    session_id: str
    system_prompt: str
    tools: list[ToolSpec]
    """The same tool list the session sends to the model (built once, by the bench)."""
    model_timeout_seconds: float = 120.0


@workflow.defn(name=BASELINE_WORKFLOW)
class BaselineWorkflow:
    """The least a durable tool-calling turn needs: model -> K bare activities -> model."""

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
        """One turn; returns ``"<turn number>|<reply>"``."""
        self._turn += 1
        turn = self._turn
        messages = [Message(role="system", content=self._inp.system_prompt), Message(role="user", content=text, turn=turn)]
        first = await self._model(messages, turn)
        messages.append(first.message)
        for call in first.message.tool_calls:  # one after another, as the session runs them
            data = await workflow.execute_activity(
                BARE_ACTIVITY,
                BareLookupInput(arguments=call.arguments),
                result_type=dict,
                start_to_close_timeout=timedelta(seconds=15),
                summary=f"tool {call.name}",  # as the session labels its tool activities
            )
            messages.append(
                Message(
                    role="tool",
                    content=ToolResult(data=data).model_dump_json(),
                    tool_call_id=call.tool_call_id,
                    name=call.name,
                    turn=turn,
                )
            )
        final = await self._model(messages, turn)
        return f"{turn}|{final.message.content or ''}"

    async def _model(self, messages: list[Message], turn: int) -> CallModelResult:
        return await workflow.execute_activity(
            names.CALL_MODEL,
            CallModelInput(session_id=self._inp.session_id, turn=turn, messages=messages, tools=self._inp.tools),
            result_type=CallModelResult,
            start_to_close_timeout=timedelta(seconds=self._inp.model_timeout_seconds),
        )


# ---------------------------------------------------------------------- the run


class Series:
    """Turns of one kind (``calls`` tool calls each) on one workflow: times and CPU."""

    def __init__(self, name: str, kind: str, calls: int, run_turn: Callable[[str], Awaitable[tuple[int, str]]]):
        self.name = name
        self.workflow = kind
        """``hermes`` or ``bare``."""
        self.calls = calls
        self.run_turn = run_turn
        """Sends one user message; returns the turn's number and its reply."""
        self.samples: list[float] = []
        self.cpu_seconds = 0.0
        """CPU of this process (worker + client) over the measured turns."""
        self.cpu_server_seconds = 0.0
        """CPU of the Temporal dev server over the same spans."""

    async def turns(self, count: int, *, record: bool, server_pids: Sequence[int] = ()) -> None:
        """Run ``count`` turns one after another, checking every reply.

        Raises:
            RuntimeError: a reply shows a tool call that did not run, or ran with other arguments.
        """
        cpu_bench = time.process_time()
        cpu_server = sum(_common.cpu_seconds(pid) for pid in server_pids)
        for _ in range(count):
            began = time.perf_counter()
            turn, reply = await self.run_turn(f"calls={self.calls}")
            elapsed = time.perf_counter() - began
            if reply != expected_reply(turn, self.calls):
                raise RuntimeError(
                    f"{self.name}: turn {turn}: reply {reply!r}, expected {expected_reply(turn, self.calls)!r}"
                )
            if record:
                self.samples.append(elapsed)
        if record:
            self.cpu_seconds += time.process_time() - cpu_bench
            self.cpu_server_seconds += sum(_common.cpu_seconds(pid) for pid in server_pids) - cpu_server

    def median(self) -> float:
        return statistics.median(self.samples)

    def cpu_per_turn(self) -> float:
        return self.cpu_seconds / max(len(self.samples), 1)

    def server_cpu_per_turn(self) -> float:
        return self.cpu_server_seconds / max(len(self.samples), 1)


def _register_tools(registry: Any) -> None:
    """``lookup`` (idempotent) and ``lookup_once`` (idempotency ``none``), both read-only."""
    for name, once in (("lookup", False), ("lookup_once", True)):
        try:
            registry.register(lookup, name=name, idempotency="none" if once else "idempotent", permission="read")
        except TypeError:  # a registry from before ``idempotency=``
            registry.register(lookup, name=name, idempotent=not once, permission="read")


async def _history_mark(client: Any, workflow_id: str) -> tuple[str, int]:
    """(run id, last event id) of a workflow now, once no activity of it is pending (bounded wait)."""
    handle = client.get_workflow_handle(workflow_id)
    for _ in range(200):
        desc = await handle.describe()
        if not desc.raw_description.pending_activities:
            break
        await asyncio.sleep(0.01)
    return desc.run_id or "", int(desc.raw_description.workflow_execution_info.history_length)


class HistoryFigures:
    """Per-call figures of one workflow read from its history (server timestamps)."""

    def __init__(self) -> None:
        self.intervals: list[float] = []
        """Seconds from the scheduling of one tool activity to the next one's, within a turn."""
        self.start_to_close: dict[str, list[float]] = {}
        """Seconds from start to completion of each tool activity, by tool name."""
        self.task_schedule_to_start: list[float] = []
        """Seconds each workflow task waited for the worker to pick it up."""
        self.task_processing: list[float] = []
        """Seconds from a workflow task's start to its completion."""
        self.later_run = False
        """The workflow continued as new during the measured turns: only its last run was read."""


async def _history_figures(client: Any, workflow_id: str, tool_activity: str, mark: tuple[str, int]) -> HistoryFigures:
    """Read per-call times of ``tool_activity`` from a workflow's history.

    An interval counts only when no other activity (a model call) was scheduled between
    the two tool activities, and only events after ``mark`` count (all events of a later
    run). A tool activity is labelled by its summary, ``tool <name>`` (set by the session
    and by the baseline alike), without the ``tool `` prefix.
    """
    from temporalio.api.enums.v1 import EventType

    handle = client.get_workflow_handle(workflow_id)
    desc = await handle.describe()
    figures = HistoryFigures()
    figures.later_run = desc.run_id != mark[0]
    after = 0 if figures.later_run else mark[1]
    last_scheduled: Any = None
    kind: dict[int, str] = {}
    started_at: dict[int, Any] = {}
    previous: Any = None
    async for e in handle.fetch_history_events():
        if e.event_id <= after:
            continue
        if previous is not None:
            pair = (previous.event_type, e.event_type)
            seconds = (e.event_time.ToDatetime() - previous.event_time.ToDatetime()).total_seconds()
            if pair == (EventType.EVENT_TYPE_WORKFLOW_TASK_SCHEDULED, EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED):
                figures.task_schedule_to_start.append(seconds)
            elif pair == (EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED, EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED):
                figures.task_processing.append(seconds)
        previous = e
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            attrs = e.activity_task_scheduled_event_attributes
            if attrs.activity_type.name == tool_activity:
                label = tool_activity
                if e.user_metadata.HasField("summary"):
                    try:
                        label = str(json.loads(e.user_metadata.summary.data)).removeprefix("tool ")
                    except ValueError:
                        pass
                kind[e.event_id] = label
                if last_scheduled is not None:
                    figures.intervals.append((e.event_time.ToDatetime() - last_scheduled).total_seconds())
                last_scheduled = e.event_time.ToDatetime()
            else:
                last_scheduled = None
        elif e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
            started_at[e.event_id] = e.event_time.ToDatetime()
        elif e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
            attrs = e.activity_task_completed_event_attributes
            label = kind.get(attrs.scheduled_event_id)
            began = started_at.get(attrs.started_event_id)
            if label is not None and began is not None:
                seconds = (e.event_time.ToDatetime() - began).total_seconds()
                figures.start_to_close.setdefault(label, []).append(seconds)
    return figures


async def _count_keys(redis: Any, pattern: str) -> int:
    """How many Redis keys match ``pattern``."""
    return sum([1 async for _ in redis.scan_iter(match=pattern, count=1000)])


async def main() -> None:
    p = _common.parser(__doc__.splitlines()[0])
    p.add_argument("-n", "--turns", type=int, help="measured turns per series (default 40, --quick 8)")
    p.add_argument("-k", "--calls", type=int, default=20, help="tool calls in one model step (default 20)")
    args = p.parse_args()
    n = args.turns or (8 if args.quick else 40)
    k = args.calls
    if k <= REFERENCE_CALLS:
        p.error(f"--calls must be more than {REFERENCE_CALLS}, the reference turn's calls")
    block = 2 if args.quick else 5
    warmup_reference, warmup_k = (10, 1) if args.quick else (15, 3)

    from temporalio.worker import Worker

    from hermes.client import HermesClient
    from hermes.models import SessionConfig
    from hermes.settings import Settings
    from activities.tools import idempotency_key
    from hermes.tools.registry import ToolRegistry
    from hermes.infra.process import freeze_startup_heap
    from worker import build_worker, set_deadlock_timeout

    started = time.perf_counter()
    async with _common.bench_stack() as stack:
        client = stack.client
        task_queue = f"bench-tool-dispatch-{uuid.uuid4()}"
        settings = Settings(data_dir=stack.data_dir, redis_url=stack.redis_url, task_queue=task_queue, temporal_address="unused:0")
        registry = ToolRegistry()
        _register_tools(registry)
        # build_worker's exact configuration, plus the bench's workflow and activity. The
        # template is built on another task queue (one worker per queue per process) and
        # never run.
        template = build_worker(
            client, settings, task_queue=f"{task_queue}-template", provider=DispatchModel(), registry=registry, redis=stack.redis
        )
        config = template.config()
        config["task_queue"] = task_queue
        async with template:  # started and shut down, so its native half is released cleanly
            pass
        config["workflows"] = [*config["workflows"], BaselineWorkflow]
        config["activities"] = [*config["activities"], bare_lookup]
        worker = Worker(**config)
        set_deadlock_timeout(worker, settings.workflow_deadlock_seconds)  # as build_worker does
        session_config = SessionConfig()
        hermes = HermesClient(client, task_queue=task_queue, redis=stack.redis, config=session_config)
        specs = [
            t.spec(tier_seconds=settings.tier_seconds, heartbeat_timeout_seconds=settings.tool_heartbeat_seconds)
            for t in registry
        ]
        tag = uuid.uuid4().hex[:8]

        async with worker:
            # As run_worker does once its worker runs (hermes.infra.process): the start-up
            # heap out of the garbage collector's passes; every series shares it.
            freeze_startup_heap()
            session_id = f"bench-tool-dispatch-session-{tag}"

            async def hermes_turn(text: str) -> tuple[int, str]:
                result = await hermes.send_message(session_id, text, user_id="bench")
                if result.status != "completed" or any(not r.result.ok for r in result.tool_calls):
                    bad = next((r.result for r in result.tool_calls if not r.result.ok), None)
                    raise RuntimeError(f"hermes: turn {result.turn} {result.status}: {bad or result.reply}")
                return result.turn, result.reply

            baseline_id = f"bench-tool-dispatch-bare-{tag}"
            baseline = await client.start_workflow(
                BASELINE_WORKFLOW,
                BaselineInput(
                    session_id=baseline_id,
                    system_prompt=session_config.system_prompt,
                    tools=specs,
                    model_timeout_seconds=session_config.model_timeout_seconds,
                ),
                id=baseline_id,
                task_queue=task_queue,
            )

            async def bare_turn(text: str) -> tuple[int, str]:
                turn, _, reply = (await baseline.execute_update(BASELINE_TURN, text, result_type=str)).partition("|")
                return int(turn), reply

            series = [
                Series(f"hermes calls={k}", "hermes", k, hermes_turn),
                Series(f"bare calls={k}", "bare", k, bare_turn),
                Series(f"hermes calls={REFERENCE_CALLS}", "hermes", REFERENCE_CALLS, hermes_turn),
                Series(f"bare calls={REFERENCE_CALLS}", "bare", REFERENCE_CALLS, bare_turn),
            ]
            # Per workflow run, the first ~10 updates on the dev server are dispatched
            # faster than later ones (see turn_overhead.py): warm each workflow past that.
            for s in series:
                await s.turns(warmup_reference if s.calls == REFERENCE_CALLS else warmup_k, record=False)
            marks = {wid: await _history_mark(client, wid) for wid in (session_id, baseline_id)}
            server_pids = _common.child_pids("temporal")
            began = time.perf_counter()
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
            elapsed = time.perf_counter() - began
            history = {
                "hermes": await _history_figures(client, session_id, names.RUN_TOOL, marks[session_id]),
                "bare": await _history_figures(client, baseline_id, BARE_ACTIVITY, marks[baseline_id]),
            }
            await baseline.signal(BASELINE_STOP)
            await baseline.result()
            ledger = await _count_keys(stack.redis, idempotency_key("*"))
    once_calls = sum(
        (warmup_reference if s.calls == REFERENCE_CALLS else warmup_k) * (s.calls // 2) + len(s.samples) * (s.calls // 2)
        for s in series
        if s.workflow == "hermes"
    )
    if ledger < once_calls:
        raise RuntimeError(f"{once_calls} lookup_once calls but only {ledger} exactly-once records in Redis")
    _report(args, n, k, block, config, series, history, (ledger, once_calls), elapsed, time.perf_counter() - started)


def _report(
    args: Any,
    n: int,
    k: int,
    block: int,
    config: dict[str, Any],
    series: list[Series],
    history: dict[str, HistoryFigures],
    ledger: tuple[int, int],
    elapsed: float,
    total: float,
) -> None:
    """Print the figures; the last line is the headline ``tool_dispatch_ratio=...``."""
    marginal = k - REFERENCE_CALLS
    print(
        f"tool_dispatch: K={k} tool calls per turn (reference turns: {REFERENCE_CALLS}), N={n} measured turns per "
        f"series, blocks of {block} interleaved{' (quick)' if args.quick else ''}; "
        f"{elapsed:.1f} s of measured turns, {total:.1f} s in all"
    )
    print(
        "worker: one worker for both (worker.build_worker's config + the bench workflow and activity): "
        f"max_concurrent_activities={config.get('max_concurrent_activities')}, "
        f"eager activities={'off' if config.get('disable_eager_activity_execution') else 'on'}"
    )
    print(
        "tools: calls alternate lookup (idempotency idempotent) / lookup_once (idempotency none: Redis ledger), "
        "both permission read, same function; bare: one plain activity calling it"
    )
    print(f"exactly-once ledger: {ledger[0]} records in Redis for the session's {ledger[1]} lookup_once calls")
    for s in series:
        print(f"  {s.name:<16} {_common.describe_ms(s.samples)}")
        print(
            f"  {'':<16} CPU per turn: {s.cpu_per_turn() * 1000:.1f} ms worker+client process, "
            f"{s.server_cpu_per_turn() * 1000:.1f} ms Temporal dev server"
        )
    by = {(s.workflow, s.calls): s for s in series}
    per_call: dict[str, float] = {}
    for wf in ("hermes", "bare"):
        big, ref = by[(wf, k)], by[(wf, REFERENCE_CALLS)]
        per_call[wf] = (big.median() - ref.median()) / marginal
        cpu = (big.cpu_per_turn() - ref.cpu_per_turn()) / marginal
        server = (big.server_cpu_per_turn() - ref.server_cpu_per_turn()) / marginal
        intervals = history[wf].intervals
        from_history = (
            f"median {statistics.median(intervals) * 1000:.1f} ms, p95 {_common.percentile(intervals, 0.95) * 1000:.1f} ms "
            f"(n={len(intervals)})"
            if intervals
            else "no samples"
        )
        spans = ", ".join(
            f"{label} {statistics.median(v) * 1000:.2f} ms (n={len(v)})" for label, v in sorted(history[wf].start_to_close.items())
        )
        print(
            f"per call, {wf:<6}: {per_call[wf] * 1000:.2f} ms wall-clock "
            f"((median calls={k} - median calls={REFERENCE_CALLS}) / {marginal}); "
            f"CPU {cpu * 1000:.2f} ms worker+client, {server * 1000:.2f} ms server"
        )
        if history[wf].later_run:
            from_history += " (it continued as new during the measured turns: its last run only)"
        print(f"  {'':<14} server timestamps: tool activity scheduled to the next one scheduled: {from_history}")
        print(f"  {'':<14} server timestamps: activity start-to-close, median: {spans or 'no samples'}")
        tasks = history[wf]
        if tasks.task_schedule_to_start and tasks.task_processing:
            print(
                f"  {'':<14} server timestamps: workflow task schedule-to-start median "
                f"{statistics.median(tasks.task_schedule_to_start) * 1000:.1f} ms, processing median "
                f"{statistics.median(tasks.task_processing) * 1000:.1f} ms (n={len(tasks.task_processing)})"
            )
    hist = {wf: statistics.median(h.intervals) if h.intervals else float("nan") for wf, h in history.items()}
    cpu_ratio = (by[("hermes", k)].cpu_per_turn() - by[("hermes", REFERENCE_CALLS)].cpu_per_turn()) / max(
        by[("bare", k)].cpu_per_turn() - by[("bare", REFERENCE_CALLS)].cpu_per_turn(), 1e-9
    )
    print(
        f"ratios hermes / bare: per call {per_call['hermes'] / per_call['bare']:.2f} (wall-clock), "
        f"{hist['hermes'] / hist['bare']:.2f} (server timestamps), {cpu_ratio:.2f} (CPU worker+client); "
        f"whole turn calls={k}: {by[('hermes', k)].median() / by[('bare', k)].median():.2f}; "
        f"target per call <= {TARGET_RATIO}"
    )
    print(f"cpu_ratio={cpu_ratio:.2f}")  # per call, worker+client; issue 31's target: at most 1.5
    _common.headline("tool_dispatch_ratio", f"{per_call['hermes'] / per_call['bare']:.2f}")


if __name__ == "__main__":
    _common.run(main)  # leaves with os._exit: temporalio/sdk-python#300
