"""OpenTelemetry traces and metrics (issue 17): the light side, used on every hot path.

Off unless ``HERMES_TELEMETRY_ENABLED`` (:class:`hermes.settings.Settings`): then
:func:`span` is a shared ``nullcontext`` and every ``count_*`` / ``record_*`` helper
returns at once; no plugin is given to the Temporal client, no provider is made, and
nothing of the OpenTelemetry SDK is imported (this module imports only the standard
library; the SDK side is :mod:`hermes.infra.telemetry_setup`, imported by :func:`configure`).

On, a turn is one trace (span names and attributes after OpenTelemetry's GenAI semantic
conventions, https://opentelemetry.io/docs/specs/semconv/gen-ai/)::

    hermes.turn                 workflow code, through the replay-safe tracer provider
      chat <model>              call_model activity (gen_ai.operation.name=chat)
      execute_tool <tool>       run_tool activity (gen_ai.operation.name=execute_tool);
                                an MCP tool's call too, with mcp.method.name=tools/call
      hermes.approval_wait      workflow code, from the request to the verdict
      hermes.memory.search      search_memories activity
      hermes.summary            summarize_context activity (gen_ai.operation.name=chat)
    hermes.memory.write         write_memories activity, in the memory writer's trace

Every span has ``hermes.session_id`` and ``hermes.turn`` where it has a session.
Context flows from the workflow to its activities through Temporal headers
(``temporalio.contrib.opentelemetry.OpenTelemetryPlugin``). Message text goes into spans
only with ``HERMES_TELEMETRY_MESSAGE_TEXT``.

Replay and crashes: workflow spans come from ``create_tracer_provider()``'s provider,
whose spans are not ended while history is replayed and whose ids come from the
workflow's seeded random (the ids of a replayed span equal the original's). A span left
by an exception that is not an ``Exception`` (``asyncio.CancelledError``: a workflow run
evicted from a stopping worker's cache, an activity cancelled on shutdown) is never
ended, so never exported half-open: the run replays on another worker and ends it there.
An ``Exception`` ends the span with status ERROR and ``error.type``. Spans touch no
workflow command: tracing on or off, a run emits the same commands (no patch).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hermes.infra.telemetry_setup import Telemetry
    from hermes.settings import Settings

__all__ = [
    "configure",
    "count_degradation",
    "count_memory_writes",
    "count_skipped_redis_write",
    "count_tokens",
    "count_tool_result",
    "count_turn",
    "enabled",
    "message_text",
    "plugins",
    "approval_pending",
    "record_event_loop_lag",
    "approval_settled",
    "runtime",
    "set_attributes",
    "shutdown",
    "span",
    "start",
]

_current: Telemetry | None = None
"""The process's telemetry while it is on (:func:`configure`, :func:`start`)."""

_OFF = contextlib.nullcontext()


def enabled() -> bool:
    """Whether telemetry is on in this process."""
    return _current is not None


def message_text() -> bool:
    """Whether message text may go into spans (``HERMES_TELEMETRY_MESSAGE_TEXT``)."""
    return _current is not None and _current.message_text


def configure(settings: Settings, *, service_name: str = "hermes", prometheus: bool = False) -> bool:
    """Switch telemetry on in this process if ``settings.telemetry_enabled`` (once: later
    calls change nothing), exporters from the ``OTEL_*`` environment variables.

    Args:
        settings: ``telemetry_enabled`` and ``telemetry_message_text`` are read.
        service_name: ``service.name`` when ``OTEL_SERVICE_NAME`` is unset.
        prometheus: serve ``OTEL_METRICS_EXPORTER=prometheus`` here (a worker does; a
            client process never binds the port).

    Returns:
        Whether telemetry is on.

    Raises:
        ConfigError: an ``OTEL_*`` value Hermes cannot honour (unknown exporter, the
            OTLP ``grpc`` protocol, a bad Prometheus port).
    """
    if _current is not None:
        return True
    if not settings.telemetry_enabled:
        return False
    from hermes.infra import telemetry_setup

    on = telemetry_setup.from_env(settings, service_name=service_name, prometheus=prometheus)
    if on is not None:
        _switch_on(on)
    return on is not None


def start(**kwargs: Any) -> Telemetry:
    """Switch telemetry on with the given exporters, replacing any that were on (tests,
    benchmarks; a deployment uses :func:`configure`).

    Args:
        **kwargs: as :func:`hermes.infra.telemetry_setup.build` (``span_exporters``,
            ``metric_readers``, ``message_text``, ``resource``, ``batch``).

    Returns:
        The telemetry now on.
    """
    from hermes.infra import telemetry_setup

    shutdown()
    return _switch_on(telemetry_setup.build(**kwargs))


def _switch_on(on: Telemetry) -> Telemetry:
    global _current
    _current = on
    return on


def shutdown() -> None:
    """Flush and switch telemetry off (the global tracer provider stays, with no exporter)."""
    global _current
    current, _current = _current, None
    if current is not None:
        current.close()


def plugins(settings: Settings | None = None) -> list[Any]:
    """The Temporal client plugins: ``[OpenTelemetryPlugin()]`` when telemetry is on,
    else ``[]`` (configured from ``settings`` first when given).

    Raises:
        ConfigError: as :func:`configure`.
    """
    if settings is not None:
        configure(settings)
    if _current is None:
        return []
    from temporalio.contrib.opentelemetry import OpenTelemetryPlugin

    return [OpenTelemetryPlugin()]


def runtime() -> Any:
    """The Temporal ``Runtime`` whose SDK metrics go through OpenTelemetry (a
    ``MetricBuffer`` drained by ``MetricsExporter``), or None (the SDK's default) when
    telemetry is off."""
    return None if _current is None else _current.temporal_runtime()


async def start_metrics_export() -> None:
    """Start draining Temporal's metric buffer into the meter provider (once; a no-op
    when telemetry is off). Called by :func:`worker.connect_client`, in a running loop."""
    if _current is not None:
        _current.start_metrics_export()


def span(name: str, attributes: Mapping[str, Any] | None = None) -> contextlib.AbstractContextManager[Any]:
    """A span around a block, child of the current span (the turn's, through Temporal
    headers, in an activity); ``as`` gives the span (None when off).

    Args:
        name: the span name (``chat gpt-4o-mini``, ``execute_tool save_note``, ...).
        attributes: its attributes; None values are left out.

    Returns:
        A context manager. Off: a shared ``nullcontext``.
    """
    if _current is None:
        return _OFF
    return _span(_current, name, attributes)


@contextlib.contextmanager
def _span(t: Telemetry, name: str, attributes: Mapping[str, Any] | None) -> Iterator[Any]:
    clean = {k: v for k, v in (attributes or {}).items() if v is not None}
    in_workflow = t.in_workflow()
    started = t.tracer.start_span(name, attributes=clean)
    token = t.attach(started)
    try:
        yield started
    except Exception as err:
        if in_workflow and (not t.in_workflow() or t.task_failure(err)):
            # Workflow code torn down outside its event loop (the run of a stopped worker,
            # closed when collected), or a workflow task failure (the task is retried):
            # not ended here; the run's next execution ends it.
            raise
        t.detach(token)
        started.set_attribute("error.type", type(err).__name__)
        started.set_status(t.error_status(type(err).__name__))
        started.end()
        raise
    except BaseException:
        # A cancelled or closed task (an evicted run, a stopping worker): the span stays
        # unended, never exported half-open (module docstring), and the context is left
        # to the dying task (torn down from another context, it could not be detached).
        raise
    if in_workflow and not t.in_workflow():
        return  # torn down, as above
    t.detach(token)
    started.end()


def set_attributes(target: Any, attributes: Mapping[str, Any]) -> None:
    """Set ``attributes`` (None values left out) on ``target``, a span from :func:`span`
    or None (off)."""
    if target is not None:
        target.set_attributes({k: v for k, v in attributes.items() if v is not None})


# ------------------------------------------------------------------ metrics
# Recorded from workflow code too: the meter is ReplaySafeMeterProvider's, which drops a
# workflow's recordings while it replays history (first execution only).


def count_turn(status: str) -> None:
    """One finished turn, by its status (``completed``, ``max_iterations``, ...)."""
    if _current is not None:
        _current.turns.add(1, {"hermes.turn.status": status})


def count_tokens(model: str | None, user_id: str | None, input_tokens: int, output_tokens: int) -> None:
    """A model call's usage, by model and user (``hermes.tokens``, attribute
    ``gen_ai.token.type`` ``input`` / ``output``)."""
    if _current is None:
        return
    base = {"gen_ai.request.model": model or "", "hermes.user_id": user_id or ""}
    if input_tokens:
        _current.tokens.add(input_tokens, {**base, "gen_ai.token.type": "input"})
    if output_tokens:
        _current.tokens.add(output_tokens, {**base, "gen_ai.token.type": "output"})


def count_tool_result(tool: str, code: int, mcp_server: str | None = None) -> None:
    """One tool call's result, by tool and result code (0 ok ... 5 denied by a human)."""
    if _current is not None:
        attributes = {"gen_ai.tool.name": tool, "hermes.tool.result_code": int(code)}
        if mcp_server:
            attributes["hermes.mcp.server"] = mcp_server
        _current.tool_results.add(1, attributes)


def approval_pending(delta: int) -> None:
    """Approvals waiting for a human: +1 when one is asked for (-1: :func:`approval_settled`)."""
    if _current is not None:
        _current.approvals_pending.add(delta)


def approval_settled(seconds: float, verdict: str) -> None:
    """An approval no longer pending (-1 in ``hermes.approvals.pending``) and how long it
    waited (``seconds``, workflow time), by verdict."""
    if _current is not None:
        _current.approvals_pending.add(-1)
        _current.approval_wait.record(seconds, {"hermes.approval.verdict": verdict})


def count_memory_writes(inserted: int, updated: int, superseded: int, unchanged: int, dropped: int) -> None:
    """A written memory batch: candidates by outcome (``updated``: merged into a
    near-duplicate row; ``superseded``: replaced a contradicted one)."""
    if _current is None:
        return
    for outcome, n in (
        ("inserted", inserted), ("updated", updated), ("superseded", superseded), ("unchanged", unchanged), ("dropped", dropped)
    ):
        if n:
            _current.memory_writes.add(n, {"hermes.memory.outcome": outcome})


def record_event_loop_lag(seconds: float) -> None:
    """How late the worker's event loop woke from one of :mod:`hermes.infra.loop_lag`'s
    sleeps (``hermes.worker.event_loop_lag``, seconds): its heartbeats were as late."""
    if _current is not None:
        _current.event_loop_lag.record(seconds)


def count_mcp_restart(server: str) -> None:
    """An MCP server started again after it failed (crashed, hung, refused to start), by server name."""
    if _current is not None:
        _current.mcp_restarts.add(1, {"hermes.mcp.server": server})


def count_refused_command(command: str) -> None:
    """A command (signal, update or start) a session refused: no valid proof of its sender
    (:mod:`hermes.security.command_auth`), by command name."""
    if _current is not None:
        _current.commands_refused.add(1, {"hermes.command": command})


def count_skipped_redis_write(kind: str, items: int = 1) -> None:
    """Items of a promised Redis write that did not land (:mod:`hermes.infra.redis_writes`), by
    kind (``content_store``, ``turn_events``, ``session_index``)."""
    if _current is not None:
        _current.redis_writes_skipped.add(items, {"hermes.redis.write": kind})


def count_degradation(kind: str) -> None:
    """A turn a session ran degraded (also a notice in its state), by kind (``tokenizer``,
    ``memory``, ``events``, ``mcp``): ``hermes.degradations``, attribute ``hermes.degradation.kind``."""
    if _current is not None:
        _current.degradations.add(1, {"hermes.degradation.kind": kind})


# --------------------------------------------------------------- attributes
# GenAI semantic conventions (https://opentelemetry.io/docs/specs/semconv/gen-ai/gen-ai-spans/)
# plus hermes.*; built only when telemetry is on (callers pass them to span()).


def chat_attributes(request: Any) -> dict[str, Any]:
    """A model call's span attributes from its ``CallModelInput`` (no message text)."""
    return {
        "gen_ai.operation.name": "chat",
        "gen_ai.request.model": request.model,
        "gen_ai.request.max_tokens": request.max_output_tokens,
        "hermes.session_id": request.session_id,
        "hermes.turn": request.turn,
        "hermes.step": request.step,
        "hermes.model.purpose": request.purpose,
    }


def chat_result_attributes(result: Any) -> dict[str, Any]:
    """A model call's span attributes from its ``CallModelResult`` (the answer's text
    only with ``HERMES_TELEMETRY_MESSAGE_TEXT``)."""
    message = result.message
    attributes: dict[str, Any] = {
        "gen_ai.provider.name": result.provider,
        "gen_ai.response.model": result.model,
        "gen_ai.usage.input_tokens": result.usage.prompt_tokens,
        "gen_ai.usage.output_tokens": result.usage.completion_tokens,
        "gen_ai.response.finish_reasons": ["tool_calls"] if message.tool_calls else ["stop"],
        "hermes.tool_calls": len(message.tool_calls or []),
    }
    if message_text() and message.content:
        attributes["hermes.output_text"] = message.content
    return attributes


def tool_attributes(request: Any) -> dict[str, Any]:
    """A tool call's span attributes from its ``RunToolInput`` (no arguments)."""
    call, mcp = request.tool_call, request.mcp
    attributes = {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": call.name,
        "gen_ai.tool.call.id": call.tool_call_id,
        "hermes.session_id": request.session_id,
        "hermes.turn": request.turn,
        "hermes.tool.idempotent": request.idempotent,
    }
    if mcp is not None:
        attributes.update({"mcp.method.name": "tools/call", "hermes.mcp.server": mcp.server, "hermes.mcp.tool": mcp.tool})
    return attributes


def turn_attributes(session: Any, turn: int, text: str) -> dict[str, Any]:
    """A turn's span attributes (``session``: the ``SessionInput``; the user's text only
    with ``HERMES_TELEMETRY_MESSAGE_TEXT``)."""
    attributes = {
        "gen_ai.operation.name": "invoke_agent",
        "gen_ai.conversation.id": session.session_id,
        "hermes.session_id": session.session_id,
        "hermes.user_id": session.user_id,
        "hermes.turn": turn,
        "hermes.message.chars": len(text),
    }
    if message_text():
        attributes["hermes.user_message"] = text
    return attributes


def turn_result_attributes(result: Any) -> dict[str, Any]:
    """A finished turn's span attributes from its ``TurnResult``."""
    attributes = {"hermes.turn.status": result.status, "hermes.tool_calls": len(result.tool_calls)}
    if message_text():
        attributes["hermes.reply"] = result.reply
    return attributes
