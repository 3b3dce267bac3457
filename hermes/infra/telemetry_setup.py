"""OpenTelemetry traces and metrics (issue 17): the SDK side, imported only when on.

Reads the standard variables (https://opentelemetry.io/docs/specs/otel/configuration/sdk-environment-variables/):

- ``OTEL_TRACES_EXPORTER``: ``otlp`` (default), ``console``, ``none``, or a comma list;
- ``OTEL_METRICS_EXPORTER``: ``otlp`` (default), ``console``, ``prometheus``, ``none``;
- ``OTEL_EXPORTER_OTLP_ENDPOINT`` / ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` / ``..._HEADERS``
  ...: read by the OTLP exporters themselves (HTTP/protobuf; default
  ``http://localhost:4318``); ``OTEL_EXPORTER_OTLP_PROTOCOL=grpc`` is refused;
- ``OTEL_EXPORTER_PROMETHEUS_HOST`` / ``_PORT``: the worker's scrape endpoint
  (default ``localhost:9464``);
- ``OTEL_SERVICE_NAME``, ``OTEL_RESOURCE_ATTRIBUTES``: the resource;
- ``OTEL_METRIC_EXPORT_INTERVAL``: milliseconds between metric exports (default 60000);
- ``OTEL_SDK_DISABLED=true``: off, whatever Hermes' setting says.

The global tracer provider is set once per process (OpenTelemetry allows no second):
``create_tracer_provider()``'s replay-safe one, which ``OpenTelemetryPlugin`` requires,
with one processor whose exporters :func:`build` may replace (tests start telemetry more
than once). The meter provider is Hermes' own, wrapped in ``ReplaySafeMeterProvider``,
not the global one; Temporal's SDK metrics reach it through a ``MetricBuffer`` on the
process's Temporal ``Runtime`` and a ``MetricsExporter``.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Mapping, Sequence
from typing import Any

import opentelemetry.context
import opentelemetry.trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import MetricReader, PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    SimpleSpanProcessor,
    SpanExporter,
)
from opentelemetry.trace import Status, StatusCode
from temporalio import workflow
from temporalio.contrib.opentelemetry import (
    MetricsExporter,
    ReplaySafeMeterProvider,
    ReplaySafeTracerProvider,
    create_tracer_provider,
)
from temporalio.runtime import MetricBuffer, Runtime, TelemetryConfig

from hermes.errors import ConfigError
from hermes.infra.sdk_logs import core_logging
from hermes.settings import Settings

log = logging.getLogger("hermes.telemetry")

TRACER_NAME = "hermes"
METRIC_BUFFER_SIZE = 10_000
"""Temporal metric updates held between two drains (one a second); the SDK's example size."""


class _SwitchingProcessor(SpanProcessor):
    """The global provider's one span processor; :func:`build` points it at new exporters."""

    def __init__(self) -> None:
        self.inner: SpanProcessor | None = None

    def on_start(self, span: Span, parent_context: Any = None) -> None:
        if self.inner is not None:
            self.inner.on_start(span, parent_context)

    def on_end(self, span: ReadableSpan) -> None:
        if self.inner is not None:
            self.inner.on_end(span)

    def shutdown(self) -> None:
        if self.inner is not None:
            self.inner.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self.inner.force_flush(timeout_millis) if self.inner is not None else True


_provider: ReplaySafeTracerProvider | None = None
_switch = _SwitchingProcessor()
_runtime: Runtime | None = None
_buffer: MetricBuffer | None = None


def _tracer_provider(resource: Resource) -> ReplaySafeTracerProvider:
    global _provider
    if _provider is None:
        current = opentelemetry.trace.get_tracer_provider()
        if isinstance(current, ReplaySafeTracerProvider):
            _provider = current  # set by the application before Hermes: used as it is
        else:
            _provider = create_tracer_provider(resource=resource)
            opentelemetry.trace.set_tracer_provider(_provider)
        _provider.add_span_processor(_switch)
    return _provider


class Telemetry:
    """Telemetry while it is on: the tracer, the instruments, the exporters."""

    def __init__(self, span_processor: SpanProcessor | None, meter_provider: MeterProvider, *, message_text: bool, resource: Resource):
        self.message_text = message_text
        self.span_processor = span_processor
        self.meter_provider = meter_provider
        self.tracer = _tracer_provider(resource).get_tracer(TRACER_NAME)
        self.detach = opentelemetry.context.detach
        meter = ReplaySafeMeterProvider(meter_provider).get_meter(TRACER_NAME)
        self.turns = meter.create_counter("hermes.turns", unit="{turn}", description="Turns finished, by status")
        self.tokens = meter.create_counter(
            "hermes.tokens", unit="{token}", description="Model tokens of sessions' model calls, by model, user and type"
        )
        self.tool_results = meter.create_counter(
            "hermes.tool.results", unit="{call}", description="Tool call results, by tool and result code"
        )
        self.approvals_pending = meter.create_up_down_counter(
            "hermes.approvals.pending", unit="{approval}", description="Approvals waiting for a human"
        )
        self.approval_wait = meter.create_histogram(
            "hermes.approval.wait", unit="s", description="Time from an approval request to its verdict"
        )
        self.memory_writes = meter.create_counter(
            "hermes.memory.writes", unit="{memory}", description="Memory candidates written, by outcome (updated: merged)"
        )
        self.mcp_restarts = meter.create_counter(
            "hermes.mcp.restarts", unit="{start}", description="MCP server connections started again after a failure, by server"
        )
        self.commands_refused = meter.create_counter(
            "hermes.commands.refused", unit="{command}",
            description="Commands a session refused for want of a valid proof of their sender, by command",
        )
        self.redis_writes_skipped = meter.create_counter(
            "hermes.redis.writes_skipped", unit="{item}",
            description="Items of promised Redis writes (content store, turn events, session index) not written, by kind",
        )
        self.degradations = meter.create_counter(
            "hermes.degradations", unit="{turn}",
            description="Turns a session ran degraded (fallback tokenizer, memory not searched, events not published, MCP server unavailable), by kind",
        )
        self.event_loop_lag = meter.create_histogram(
            "hermes.worker.event_loop_lag", unit="s",
            description="How late the worker's event loop woke from a 0.25 s sleep: its heartbeats were as late",
            # Seconds, not the SDK's default millisecond-sized buckets; a heartbeat timeout is 1-10 s.
            explicit_bucket_boundaries_advisory=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
        )
        self._exporter: MetricsExporter | None = None
        self._exporter_task: asyncio.Task[None] | None = None

    @staticmethod
    def attach(span: Any) -> object:
        """Make ``span`` the current one; returns the token for :attr:`detach`."""
        return opentelemetry.context.attach(opentelemetry.trace.set_span_in_context(span))

    @staticmethod
    def in_workflow() -> bool:
        """Whether this runs in a workflow's event loop."""
        return workflow.in_workflow()

    @staticmethod
    def task_failure(err: BaseException) -> bool:
        """Whether ``err``, raised in workflow code, fails the workflow task (and not the
        workflow, an update or a turn): the SDK retries the task."""
        return workflow.in_workflow() and not workflow.is_failure_exception(err)

    @staticmethod
    def error_status(description: str) -> Status:
        return Status(StatusCode.ERROR, description)

    def temporal_runtime(self) -> Runtime:
        """The process's Temporal runtime with a metric buffer (made once)."""
        global _runtime, _buffer
        if _runtime is None:
            _buffer = MetricBuffer(METRIC_BUFFER_SIZE)
            _runtime = Runtime(telemetry=TelemetryConfig(metrics=_buffer, logging=core_logging()))
        return _runtime

    def start_metrics_export(self) -> None:
        """Drain the runtime's buffer into this meter provider (once, in the running loop)."""
        if self._exporter_task is not None or _buffer is None:
            return
        self._exporter = MetricsExporter(_buffer, self.meter_provider)
        self._exporter_task = asyncio.get_running_loop().create_task(self._exporter.run())

    def close(self) -> None:
        """Stop the metric drain, flush spans and metrics, drop the exporters."""
        if self._exporter is not None and self._exporter_task is not None and not self._exporter_task.done():
            # The drain loop stops at its next poll (within a second), draining once more.
            self._exporter._shutdown_event.set()  # noqa: SLF001 - shutdown() must be awaited
        if _switch.inner is self.span_processor and self.span_processor is not None:
            self.span_processor.shutdown()
            _switch.inner = None
        self.meter_provider.shutdown()


def build(
    *,
    span_exporters: Sequence[SpanExporter] = (),
    metric_readers: Sequence[MetricReader] = (),
    message_text: bool = False,
    resource: Resource | None = None,
    batch: bool = True,
) -> Telemetry:
    """Telemetry with these exporters (:func:`hermes.infra.telemetry.start` switches it on).

    Args:
        span_exporters: where spans go (an ``InMemorySpanExporter`` in tests).
        metric_readers: what reads the metrics (an ``InMemoryMetricReader`` in tests).
        message_text: message text in spans.
        resource: the resource; default ``Resource.create()`` (``OTEL_SERVICE_NAME``...).
        batch: spans exported in batches from a thread (``BatchSpanProcessor``); False:
            each span exported as it ends (tests, the console).

    Returns:
        The telemetry, its span processor the global provider's from now on.
    """
    resource = resource or Resource.create()
    processor: SpanProcessor | None = None
    if span_exporters:
        from opentelemetry.sdk.trace import SynchronousMultiSpanProcessor

        processor = SynchronousMultiSpanProcessor()
        for exporter in span_exporters:
            processor.add_span_processor(BatchSpanProcessor(exporter) if batch else SimpleSpanProcessor(exporter))
    current = Telemetry(processor, MeterProvider(metric_readers=list(metric_readers), resource=resource), message_text=message_text, resource=resource)
    _switch.inner = processor
    return current


def _choices(environ: Mapping[str, str], name: str, allowed: set[str]) -> list[str]:
    raw = environ.get(name, "otlp").strip().lower() or "otlp"
    values = [v.strip() for v in raw.split(",") if v.strip()]
    unknown = [v for v in values if v not in allowed]
    if unknown:
        raise ConfigError(f"unknown exporter {unknown[0]!r}; expected one of {', '.join(sorted(allowed))}", source="environment", key=name)
    return [v for v in values if v != "none"]


def from_env(
    settings: Settings, *, service_name: str = "hermes", prometheus: bool = False, environ: Mapping[str, str] | None = None
) -> Telemetry | None:
    """Switch telemetry on from the ``OTEL_*`` variables (module docstring).

    Args:
        settings: ``telemetry_message_text`` is read.
        service_name: ``service.name`` when ``OTEL_SERVICE_NAME`` is unset.
        prometheus: serve the Prometheus endpoint if ``OTEL_METRICS_EXPORTER`` asks.
        environ: default ``os.environ``.

    Returns:
        The telemetry to switch on, or None with ``OTEL_SDK_DISABLED=true``.

    Raises:
        ConfigError: an unknown exporter, ``OTEL_EXPORTER_OTLP_PROTOCOL=grpc``, a bad port.
    """
    env = os.environ if environ is None else environ
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    traces = _choices(env, "OTEL_TRACES_EXPORTER", {"otlp", "console", "none"})
    metrics = _choices(env, "OTEL_METRICS_EXPORTER", {"otlp", "console", "prometheus", "none"})
    for key in ("OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL"):
        if env.get(key, "http/protobuf").strip() not in ("http/protobuf", ""):
            raise ConfigError("only http/protobuf is supported (opentelemetry-exporter-otlp-proto-http)", source="environment", key=key)
    span_exporters: list[SpanExporter] = []
    if "otlp" in traces:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
            OTLPSpanExporter,
        )

        span_exporters.append(OTLPSpanExporter())
    if "console" in traces:
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        span_exporters.append(ConsoleSpanExporter())
    readers: list[MetricReader] = []
    if "otlp" in metrics:
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import (
            OTLPMetricExporter,
        )

        readers.append(PeriodicExportingMetricReader(OTLPMetricExporter()))
    if "console" in metrics:
        from opentelemetry.sdk.metrics.export import ConsoleMetricExporter

        readers.append(PeriodicExportingMetricReader(ConsoleMetricExporter()))
    if "prometheus" in metrics and prometheus:
        readers.append(_prometheus_reader(env))
    attributes = {} if env.get("OTEL_SERVICE_NAME") else {"service.name": service_name}
    log.info("telemetry on: traces to %s, metrics to %s", ",".join(traces) or "none", ",".join(metrics) or "none")
    return build(
        span_exporters=span_exporters, metric_readers=readers, message_text=settings.telemetry_message_text,
        resource=Resource.create(attributes), batch=traces != ["console"],
    )


def _prometheus_reader(env: Mapping[str, str]) -> MetricReader:
    """A Prometheus reader and its scrape endpoint (``OTEL_EXPORTER_PROMETHEUS_HOST`` /
    ``_PORT``, default ``localhost:9464``).

    Raises:
        ConfigError: a port that is not a number, or the optional package is missing.
    """
    host = env.get("OTEL_EXPORTER_PROMETHEUS_HOST", "localhost")
    raw = env.get("OTEL_EXPORTER_PROMETHEUS_PORT", "9464")
    try:
        port = int(raw)
    except ValueError:
        raise ConfigError(f"not a port number: {raw!r}", source="environment", key="OTEL_EXPORTER_PROMETHEUS_PORT") from None
    try:
        from opentelemetry.exporter.prometheus import PrometheusMetricReader
        from prometheus_client import start_http_server
    except ImportError:
        raise ConfigError(
            "the Prometheus exporter is not installed: pip install 'hermes-agent[prometheus]'",
            source="environment", key="OTEL_METRICS_EXPORTER",
        ) from None
    start_http_server(port, addr=host)
    log.info("Prometheus metrics at http://%s:%d/metrics", host, port)
    return PrometheusMetricReader()
