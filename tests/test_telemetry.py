"""OpenTelemetry traces and metrics (issue 17), on a real Temporal server and Redis.

Spans go to an ``InMemorySpanExporter`` and metrics to an ``InMemoryMetricReader``
(:func:`hermes.infra.telemetry.start`); the worker's client carries
``OpenTelemetryPlugin`` as :func:`worker.connect_client` gives it with telemetry on, and
its Temporal runtime the ``MetricBuffer`` that brings Temporal's SDK metrics along.
The turn is the approval tests' (``save_note``, a ``write`` tool the user confirms).
"""

from __future__ import annotations

import asyncio
import gc
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer

from hermes.client import HermesClient
from hermes.infra import telemetry, telemetry_setup
from hermes.infra.durable import DurableStore
from hermes.models import ToolResultCode
from hermes.providers.scripted import ScriptedModel
from hermes.settings import Settings
from tests.conftest import builtin_registry
from tests.support import eventually
from worker import build_worker
from workflows.session import SessionWorkflow

pytestmark = pytest.mark.timeout(180)

NOTE_SCRIPT: dict[str, Any] = {
    "turns": [
        {
            "match": "(?i)note",
            "steps": [
                {"tool_calls": [{"name": "save_note", "arguments": {"title": "Shopping", "text": "milk"}}]},
                {"reply": "saved: {{ last_tool_result.message }}"},
            ],
        }
    ]
}


@pytest.fixture
def traced() -> Iterator[tuple[InMemorySpanExporter, InMemoryMetricReader]]:
    """Telemetry on for this test, spans exported as they end; off afterwards."""
    spans, metrics = InMemorySpanExporter(), InMemoryMetricReader()
    telemetry.start(span_exporters=[spans], metric_readers=[metrics], batch=False)
    try:
        yield spans, metrics
    finally:
        telemetry.shutdown()


@pytest.fixture
def user_id() -> str:
    return f"user-{uuid.uuid4()}"


@asynccontextmanager
async def traced_worker(
    temporal_client: Client, settings: Settings, redis: Any, *, script: dict[str, Any] = NOTE_SCRIPT, memory: bool = False, **kwargs: Any
) -> AsyncIterator[HermesClient]:
    """A worker (and a client) on a connection made as connect_client makes it with
    telemetry on: the OpenTelemetry plugin and the runtime with the metric buffer."""
    client = await Client.connect(
        temporal_client.service_client.config.target_host,
        namespace=temporal_client.namespace,
        data_converter=pydantic_data_converter,
        plugins=telemetry.plugins(),
        runtime=telemetry.runtime(),
    )
    await telemetry.start_metrics_export()
    worker = build_worker(
        client, settings, provider=ScriptedModel.from_dict(script), registry=builtin_registry(), redis=redis,
        memory=memory, **kwargs,
    )
    async with worker:
        if memory:
            assert await worker.hermes_memory.wait_open(240), "the memory store did not open"
        yield HermesClient(client, task_queue=settings.task_queue, redis=redis, durable=DurableStore(settings.resolved_memory_uri))


def of_session(spans: InMemorySpanExporter, session_id: str) -> list[ReadableSpan]:
    """The spans of ``session_id``'s turns: its turn spans and everything in their traces."""
    finished = spans.get_finished_spans()
    traces = {s.context.trace_id for s in finished if s.name == "hermes.turn" and s.attributes.get("hermes.session_id") == session_id}
    return [s for s in finished if s.context.trace_id in traces]


def metric_points(reader: InMemoryMetricReader) -> dict[str, list[Any]]:
    """Metric name -> its data points, from one collection."""
    data = reader.get_metrics_data()
    found: dict[str, list[Any]] = {}
    for resource in data.resource_metrics if data else []:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                found.setdefault(metric.name, []).extend(metric.data.data_points)
    return found


async def approved_turn(hermes: HermesClient, session_id: str, user_id: str) -> Any:
    turn = asyncio.ensure_future(hermes.send_message(session_id, "Please note my shopping list", user_id=user_id))
    try:
        pending = await hermes.wait_for_approval(session_id, timeout_seconds=30)
        await hermes.approve(session_id, pending.tool_call_id, approver=user_id)
        return await asyncio.wait_for(turn, 60)
    finally:
        turn.cancel()


def assert_one_complete_turn_trace(spans: list[ReadableSpan], session_id: str) -> dict[str, ReadableSpan]:
    """One turn span, the root of its trace; every span ended and its parent in the trace."""
    [root] = [s for s in spans if s.name == "hermes.turn"]
    ids = {s.context.span_id for s in spans}
    assert all(s.end_time is not None and s.end_time >= s.start_time for s in spans)
    assert root.parent is None or root.parent.span_id not in ids
    dangling = [s.name for s in spans if s is not root and (s.parent is None or s.parent.span_id not in ids)]
    assert not dangling, f"spans whose parent was never exported: {dangling}"
    assert len(ids) == len(spans), "a span exported twice"
    return {s.name: s for s in spans}


@pytest.mark.parametrize("max_cached_workflows", [1000, 0], ids=["cached", "replayed"])
async def test_a_turn_with_a_tool_call_and_an_approval_is_one_trace_with_genai_attributes_and_metrics(
    traced, temporal_client, settings, redis, session_id, user_id, max_cached_workflows
):
    # Without a workflow cache every workflow task replays the turn so far: the turn and
    # approval spans are started again on each and ended once, by the task that ends them.
    spans, metrics = traced
    async with traced_worker(temporal_client, settings, redis, max_cached_workflows=max_cached_workflows) as hermes:
        result = await approved_turn(hermes, session_id, user_id)
    assert result.status == "completed" and result.tool_calls[0].result.code == ToolResultCode.OK
    tool_call_id = result.tool_calls[0].tool_call_id

    trace = of_session(spans, session_id)
    by_name = assert_one_complete_turn_trace(trace, session_id)
    turn = by_name["hermes.turn"]
    model = "scripted:<dict>"  # the scripted model's name for a script given as a dict
    chats = [s for s in trace if s.name == f"chat {model}"]
    assert len(chats) == 2, sorted(s.name for s in trace)
    for direct in [*chats, by_name["execute_tool save_note"], by_name["hermes.approval_wait"]]:
        assert direct.parent.span_id == turn.context.span_id, direct.name

    assert turn.attributes["hermes.session_id"] == session_id
    assert turn.attributes["hermes.turn"] == 1
    assert turn.attributes["hermes.turn.status"] == "completed"
    assert turn.attributes["hermes.tool_calls"] == 1
    first = min(chats, key=lambda s: s.start_time)
    assert first.attributes["gen_ai.operation.name"] == "chat"
    assert first.attributes["gen_ai.request.model"] == model
    assert first.attributes["gen_ai.usage.input_tokens"] > 0
    assert first.attributes["gen_ai.usage.output_tokens"] >= 0
    assert (first.attributes["hermes.session_id"], first.attributes["hermes.turn"]) == (session_id, 1)
    tool = by_name["execute_tool save_note"]
    assert tool.attributes["gen_ai.operation.name"] == "execute_tool"
    assert tool.attributes["gen_ai.tool.name"] == "save_note"
    assert tool.attributes["gen_ai.tool.call.id"] == tool_call_id
    assert tool.attributes["hermes.tool.result_code"] == 0
    approval = by_name["hermes.approval_wait"]
    assert approval.attributes["gen_ai.tool.call.id"] == tool_call_id
    assert approval.attributes["hermes.approval.verdict"] == "approved"
    assert approval.start_time < tool.start_time, "the tool ran before its approval"
    # No message text without HERMES_TELEMETRY_MESSAGE_TEXT.
    texts = ("shopping", "milk", "saved:")
    leaked = [(s.name, k) for s in trace for k, v in s.attributes.items() if isinstance(v, str) and any(t in v.lower() for t in texts)]
    assert not leaked

    points = metric_points(metrics)
    assert [(p.attributes["hermes.turn.status"], p.value) for p in points["hermes.turns"]] == [("completed", 1)]
    assert [(p.attributes["gen_ai.tool.name"], p.attributes["hermes.tool.result_code"], p.value) for p in points["hermes.tool.results"]] == [
        ("save_note", 0, 1)
    ]
    tokens = {(p.attributes["hermes.user_id"], p.attributes["gen_ai.token.type"]): p.value for p in points["hermes.tokens"]}
    assert tokens[(user_id, "input")] == sum(c.attributes["gen_ai.usage.input_tokens"] for c in chats)
    assert [p.value for p in points["hermes.approvals.pending"]] == [0]
    [wait] = points["hermes.approval.wait"]
    assert (wait.attributes["hermes.approval.verdict"], wait.count) == ("approved", 1)
    # Temporal's own SDK metrics, drained from the runtime's buffer (once a second).
    temporal = await eventually(
        lambda: _async([n for n in metric_points(metrics) if n.startswith("temporal_")]), what="Temporal SDK metrics"
    )
    assert "temporal_request" in temporal or any("workflow" in n for n in temporal), temporal


async def _async(value: Any) -> Any:
    return value


async def test_replaying_a_traced_turn_adds_no_spans(traced, temporal_client, settings, redis, session_id, user_id):
    spans, _ = traced
    async with traced_worker(temporal_client, settings, redis) as hermes:
        await approved_turn(hermes, session_id, user_id)
        history = await hermes.client.get_workflow_handle(session_id).fetch_history()
    before = len(spans.get_finished_spans())
    assert of_session(spans, session_id)

    replayer = Replayer(workflows=[SessionWorkflow], data_converter=pydantic_data_converter, plugins=telemetry.plugins())
    result = await replayer.replay_workflow(history)

    assert result.replay_failure is None
    assert len(spans.get_finished_spans()) == before


async def test_a_worker_stopped_mid_turn_leaves_no_dangling_span(traced, temporal_client, settings, redis, session_id, user_id):
    # The first worker stops while the turn waits for the approval: its cached run is torn
    # down (a cancelled task, not an ended span); the second replays it and ends the turn.
    spans, metrics = traced
    async with traced_worker(temporal_client, settings, redis, max_cached_workflows=1000) as first:
        turn = asyncio.ensure_future(first.send_message(session_id, "Please note my shopping list", user_id=user_id))
        pending = await first.wait_for_approval(session_id, timeout_seconds=30)
    assert not turn.done()
    gc.collect()  # should the stopped worker's run be closed now (collected), its spans stay open
    assert not of_session(spans, session_id), "a turn span was exported before the turn ended"
    assert not [s.name for s in spans.get_finished_spans() if s.name == "hermes.approval_wait"], "an approval span ended by the stopped worker"
    async with traced_worker(temporal_client, settings, redis, max_cached_workflows=1000) as second:
        await second.approve(session_id, pending.tool_call_id, approver=user_id)
        result = await asyncio.wait_for(turn, 60)
    assert result.status == "completed"

    trace = of_session(spans, session_id)
    by_name = assert_one_complete_turn_trace(trace, session_id)
    assert [s.name for s in trace].count("hermes.approval_wait") == 1
    assert "error.type" not in by_name["hermes.turn"].attributes
    assert by_name["hermes.approval_wait"].attributes["hermes.approval.verdict"] == "approved"
    assert sum(p.value for p in metric_points(metrics)["hermes.approvals.pending"]) == 0


@pytest.mark.timeout(400)
async def test_memory_search_and_write_are_traced_and_writes_counted_without_message_text(
    traced, temporal_client, settings, redis, session_id, user_id
):
    spans, metrics = traced
    text = "Hi! My name is Lin Wei and I live in Bern."
    async with traced_worker(temporal_client, settings, redis, script={"turns": [], "fallback": "Noted."}, memory=True) as hermes:
        result = await hermes.send_message(session_id, text, user_id=user_id)
        assert result.status == "completed"
        writes = await eventually(
            lambda: _async([s for s in spans.get_finished_spans() if s.name == "hermes.memory.write" and s.attributes.get("hermes.memory.inserted")]),
            what="the memory write span", timeout_seconds=60,
        )

    trace = of_session(spans, session_id)
    by_name = assert_one_complete_turn_trace(trace, session_id)
    search = by_name["hermes.memory.search"]
    assert search.parent.span_id == by_name["hermes.turn"].context.span_id
    assert (search.attributes["hermes.session_id"], search.attributes["hermes.turn"]) == (session_id, 1)
    assert writes[0].attributes["hermes.memory.inserted"] >= 2  # the name and the city
    every = spans.get_finished_spans()
    assert not [(s.name, k) for s in every for k, v in s.attributes.items() if isinstance(v, str) and ("Bern" in v or "Lin Wei" in v)]
    points = metric_points(metrics)
    inserted = sum(p.value for p in points["hermes.memory.writes"] if p.attributes["hermes.memory.outcome"] == "inserted")
    assert inserted == writes[0].attributes["hermes.memory.inserted"]


def test_message_text_goes_into_spans_only_when_switched_on():
    class Session:
        session_id, user_id = "s-1", "u-1"

    try:
        telemetry.start(message_text=False)
        assert "hermes.user_message" not in telemetry.turn_attributes(Session, 1, "my secret plan")
        telemetry.start(message_text=True)
        assert telemetry.turn_attributes(Session, 1, "my secret plan")["hermes.user_message"] == "my secret plan"
    finally:
        telemetry.shutdown()


def test_telemetry_off_gives_no_plugin_no_runtime_and_a_shared_no_op_span():
    telemetry.shutdown()
    assert telemetry.plugins(Settings(telemetry_enabled=False)) == []
    assert telemetry.runtime() is None
    assert telemetry.span("hermes.turn", {"a": 1}) is telemetry.span("x")
    with telemetry.span("hermes.turn") as span:
        assert span is None
    telemetry.count_turn("completed")  # a no-op, no error


def test_unknown_otel_exporters_and_grpc_are_refused_at_start_up():
    from hermes.errors import ConfigError

    for environ, key in (
        ({"OTEL_TRACES_EXPORTER": "jaeger"}, "OTEL_TRACES_EXPORTER"),
        ({"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, "OTEL_EXPORTER_OTLP_PROTOCOL"),
    ):
        with pytest.raises(ConfigError) as caught:
            telemetry_setup.from_env(Settings(telemetry_enabled=True), environ=environ)
        assert caught.value.key == key
    assert not telemetry.enabled()
    assert telemetry_setup.from_env(Settings(telemetry_enabled=True), environ={"OTEL_SDK_DISABLED": "true"}) is None


def test_the_worker_serves_hermes_metrics_to_prometheus_when_asked(monkeypatch):
    import urllib.request

    from hermes.infra.stack import free_port

    port = free_port()
    for key, value in {"OTEL_TRACES_EXPORTER": "none", "OTEL_METRICS_EXPORTER": "prometheus", "OTEL_EXPORTER_PROMETHEUS_PORT": str(port)}.items():
        monkeypatch.setenv(key, value)
    telemetry.shutdown()
    try:
        assert telemetry.configure(Settings(telemetry_enabled=True), service_name="hermes-worker", prometheus=True)
        telemetry.count_turn("completed")
        telemetry.count_tool_result("calculate", 0)
        with urllib.request.urlopen(f"http://localhost:{port}/metrics", timeout=10) as answer:
            page = answer.read().decode()
    finally:
        telemetry.shutdown()
    assert 'hermes_turns_total{hermes_turn_status="completed"' in page
    assert "hermes_tool_results_total" in page
