"""The Hermes worker: runs SessionWorkflow and its activities on one task queue.

    python worker.py          # or: hermes worker

Settings come from the environment (see ``hermes/settings.py``): ``TEMPORAL_ADDRESS``,
``REDIS_URL``, ``HERMES_MODEL_PROVIDER``, ``HERMES_TOOL_MODULES``, ...
"""

from __future__ import annotations

import asyncio
import importlib
import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from temporalio.client import Client
from temporalio.worker import Worker

from activities.audit import AuditActivities
from activities.memory import MemoryActivities
from activities.model import ModelActivities
from activities.session_index import SessionIndexActivities
from activities.tools import ToolActivities
from activities.transcript import TranscriptActivities
from activities.turn_start import TurnStartActivities
from hermes import names
from hermes.security import command_auth
from hermes.content.blobs import BlobStore
from hermes.infra import cpu_pool
from hermes.infra.activation import SDK_DEADLOCK_SECONDS, cache_workflow_code, sink_runner, skip_idle_payload_walks
from hermes.infra.deploy import deployment_config
from hermes.infra.loop_lag import LoopLagMonitor, watch_loop_lag
from hermes.infra.tuning import describe_cpu_reading, worker_tuner
from hermes.infra.durable import DurableStore
from hermes.errors import ConfigError
from hermes.memory.embeddings import EMBEDDERS, warm_in_child
from hermes.content.events import EventLog
from hermes.providers import ModelProvider, make_provider
from hermes.infra.run_cache import MovedRunEviction
from hermes.settings import Settings, get_settings
from hermes.content.tokens import TokenCounter, encoding_fallback, encoding_name_for_model
from hermes.tools.builtin import register_builtins
from hermes.tools.files import register_tool_file
from hermes.tools.registry import ToolRegistry, default_registry
from workflows.composite import CompositeToolWorkflow
from workflows.memory import MemoryConsolidationWorkflow, MemoryWriterWorkflow
from workflows.session import SessionWorkflow

log = logging.getLogger("hermes.worker")


def load_registry(settings: Settings, registry: ToolRegistry | None = None) -> ToolRegistry:
    """The default registry with the built-in tools, those of ``settings.tool_modules``
    and those of ``settings.tool_files``, checked as a whole.

    Raises:
        ConfigError: a tool module that cannot be imported, or a wrong tool file.
        ToolRegistrationError: a duplicate name, or a fallback / next tool / composite
            step naming a tool that does not exist.
    """
    registry = registry if registry is not None else default_registry
    if "current_time" not in registry:
        register_builtins(registry)
    for module in settings.tool_modules:
        try:
            importlib.import_module(module)
        except Exception as err:  # noqa: BLE001 - any error while importing it (SyntaxError, a raise)
            raise ConfigError(
                f"cannot import tool module: {type(err).__name__}: {err}", source="HERMES_TOOL_MODULES", key=module
            ) from err
    for path in settings.tool_files:
        if not any(t.source == str(path) for t in registry):
            register_tool_file(registry, path)
    registry.check_references()
    return registry


async def connect_client(settings: Settings) -> Client:
    """A Temporal client with the pydantic data converter (encrypting payloads when
    ``HERMES_ENCRYPTION_KEYS`` / ``_KEY_FILE`` are set, :mod:`hermes.security.encryption`); with telemetry on
    (``HERMES_TELEMETRY_ENABLED``, :mod:`hermes.infra.telemetry`) also the OpenTelemetry plugin
    (workers made with it trace too) and the runtime whose SDK metrics go to OpenTelemetry.

    Where and how it connects (address, namespace, mTLS, a Temporal Cloud API key) is
    :func:`hermes.infra.connections.temporal_connect_args`.

    Raises:
        ConfigError: an ``OTEL_*`` value Hermes cannot honour, a bad encryption key
            setting, or a bad TLS setting (a missing certificate file, a key without its
            certificate, ...).
        TemporalTlsError: the TLS handshake with Temporal failed (which side, which setting).
    """
    from hermes.infra import telemetry
    from hermes.security import command_auth, encryption
    from hermes.infra.connections import connect_temporal

    command_auth.ensure(settings)  # the key ring commands are signed and checked with
    plugins = telemetry.plugins(settings)
    extra: dict[str, Any] = {}
    if plugins:
        extra = {"plugins": plugins, "runtime": telemetry.runtime()}
    client = await connect_temporal(
        settings,
        data_converter=encryption.converter_for(settings),  # payloads encrypted when keys are set
        **extra,
    )
    await telemetry.start_metrics_export()
    return client


def connect_redis(url: str | None = None, settings: Settings | None = None) -> Any:
    """A ``redis.asyncio.Redis`` with timeouts, so an unreachable Redis fails fast, and TLS
    for a ``rediss://`` URL (:func:`hermes.infra.connections.redis_client`).

    Args:
        url: default: ``settings.resolved_redis_url``.
        settings: the ``redis_tls_*`` settings; default :func:`get_settings`.

    Raises:
        ConfigError: a bad Redis TLS setting.
    """
    from hermes.infra.connections import redis_client

    return redis_client(settings or get_settings(), url)


def build_worker(
    client: Client,
    settings: Settings | None = None,
    *,
    task_queue: str | None = None,
    provider: ModelProvider | None = None,
    registry: ToolRegistry | None = None,
    redis: Any = None,
    max_cached_workflows: int | None = None,
    mcp: Any = None,
    memory: Any = True,
    durable: DurableStore | None = None,
) -> Worker:
    """A worker for sessions. Arguments left out come from ``settings``.

    Args:
        client: a connected Temporal client (with ``pydantic_data_converter``).
        settings: configuration; :func:`get_settings` when None.
        task_queue: overrides ``settings.task_queue``.
        provider: the model; by default the one the settings choose.
        registry: the tools; by default built-ins plus ``settings.tool_modules``.
        redis: a ``redis.asyncio.Redis``; by default one for ``settings.redis_url``.
        max_cached_workflows: overrides ``settings.max_cached_workflows``; 0 makes every
            workflow task replay from history.
        mcp: a :class:`hermes.mcp.tools.McpToolset` whose servers' tools are offered too
            (the caller closes its manager); see :func:`open_mcp`.
        memory: True: long-term memory as the settings say (``memory_enabled``, the store
            at ``resolved_memory_uri``, opened on first use); False: none; or a
            :class:`hermes.memory.store.MemoryStore` (or a callable returning one) to use.
        durable: the store of what must outlive Redis (notes, content kept by reference,
            the transcript archive, snapshots, the audit log, the exactly-once ledger); by
            default one at ``settings.resolved_memory_uri``, opened on first use.
    """
    settings = settings or get_settings()
    command_auth.ensure(settings)  # sessions check their commands' proofs with it
    provider = provider or make_provider(settings)
    if registry is None:
        registry = load_registry(settings)
    else:
        registry.check_references()
    redis = redis if redis is not None else connect_redis(settings=settings)
    durable = durable if durable is not None else DurableStore(settings.resolved_memory_uri)
    content_ttl = settings.redis_content_ttl_seconds
    model = ModelActivities(provider, store=BlobStore(redis, durable=durable, ttl_seconds=content_ttl), client=client)
    encoding = encoding_name_for_model(settings.model)
    TokenCounter.get(encoding)  # loaded now, outside the workflow sandbox
    tools = ToolActivities(
        registry,
        redis,
        tier_seconds=settings.tier_seconds,
        heartbeat_timeout_seconds=settings.tool_heartbeat_seconds,
        max_result_bytes=settings.tool_result_max_bytes,
        mcp=mcp,
        encoding=encoding,
        encoding_fallback=encoding_fallback(settings.model),
        durable=durable,
    )
    index = SessionIndexActivities(redis)
    tools.store.ttl_seconds = content_ttl
    transcript = TranscriptActivities(redis, durable, content_ttl_seconds=content_ttl)
    audit = AuditActivities(redis, durable)
    memory_activities = _memory_activities(settings, memory, provider, client, task_queue or settings.task_queue, redis)
    tools.memory = memory_activities is not None
    model.turn_start = TurnStartActivities(tools, memory_activities)
    _publish_events(settings, redis, model, tools, audit, index, memory_activities)
    runner = _workflow_runner(settings, index)
    worker = _validated(
        Worker,
        client,
        task_queue=task_queue or settings.task_queue,
        workflows=[SessionWorkflow, CompositeToolWorkflow, MemoryWriterWorkflow, MemoryConsolidationWorkflow],
        activities=[
            model.call_model,
            model.summarize_context,
            model.count_tokens,
            model.store_message_bodies,
            tools.list_tools,
            model.turn_start.begin_turn,
            tools.validate_tool_call,
            tools.run_tool,
            index.update_session_index,
            transcript.archive_messages,
            transcript.save_snapshot,
            audit.record_approval_audit,
            *(memory_activities.activities() if memory_activities is not None else []),
        ],
        max_cached_workflows=settings.max_cached_workflows if max_cached_workflows is None else max_cached_workflows,
        # The session writes its index row through a sink, not a local activity (hermes.infra.sinks).
        workflow_runner=runner,
        unsandboxed_workflow_runner=runner.unsandboxed(),
        # Slots: a saturated worker takes less work, the rest waits in the task queue.
        tuner=worker_tuner(settings),
        sticky_queue_schedule_to_start_timeout=timedelta(seconds=settings.sticky_schedule_to_start_seconds),
        # A heartbeat RPC at least every third of the heartbeat timeout (the SDK's own
        # 0.8 x leaves a fifth of it for a loaded machine's delays).
        max_heartbeat_throttle_interval=timedelta(seconds=settings.resolved_heartbeat_throttle_seconds),
        # On shutdown the worker stops polling at once, and the model and tool calls it
        # runs finish and report within this (a deploy must not call a provider twice);
        # only what is still running after it is cancelled, to be retried elsewhere.
        graceful_shutdown_timeout=timedelta(seconds=settings.resolved_worker_shutdown_seconds),
        # HERMES_DEPLOYMENT_NAME + HERMES_BUILD_ID: a versioned worker (README "Rolling deploys").
        deployment_config=deployment_config(settings),
    )
    if not set_deadlock_timeout(worker, settings.workflow_deadlock_seconds):
        runner.sink_calls.deadlock_seconds = SDK_DEADLOCK_SECONDS  # the SDK's bound stands: sink waits fit it
    # Runs this worker takes are announced on Redis, and this worker's stale copies of runs
    # taken elsewhere leave its cache (hermes.infra.run_cache).
    eviction = MovedRunEviction(worker, redis)
    worker.hermes_run_eviction = eviction if eviction.install() else None  # type: ignore[attr-defined]
    worker.hermes_memory = memory_activities  # type: ignore[attr-defined]
    worker.hermes_loop_lag = _watch_loop_lag(settings)  # type: ignore[attr-defined]
    _cpu_pool(settings, encoding, embedder=memory is True and memory_activities is not None)  # after the validation
    if memory_activities is not None:
        # Every way of running a worker (python worker.py, hermes worker/dev/demo, tests)
        # starts loading the store and its embedding model now, not in its first turns;
        # only after the SDK validated the workflows above, which imports their modules in
        # its sandbox: a thread importing meanwhile can make Python 3.11's import locks
        # fail that validation (KeyError(<thread id>), python/cpython#91351).
        memory_activities.open_in_background()
    return worker


def _workflow_runner(settings: Settings, index: SessionIndexActivities) -> Any:
    """The worker's workflow runner (:mod:`hermes.infra.activation`): sandboxed or not as
    ``settings`` say, the session index written through its sink, the workflow modules'
    code compiled once per process, and no payload walks when none could change a payload
    (no codec, no external storage)."""
    skip_idle_payload_walks()
    cache_workflow_code()
    return sink_runner(
        {names.SESSION_INDEX_SINK: index.write}, sandboxed=settings.workflow_sandbox,
        deadlock_seconds=settings.workflow_deadlock_seconds,
    )


def _publish_events(settings: Settings, redis: Any, *activities: Any) -> None:
    """Give ``activities`` (those not None) the turn-event log when events are enabled:
    turn events (:mod:`hermes.content.events`) are published by the activities that do
    the work, to Redis Streams, never into the session's history."""
    if not settings.events_enabled:
        return
    events = EventLog(redis, max_events=settings.events_max_per_session, marker_ttl_seconds=settings.events_marker_ttl_seconds)
    for owner in activities:
        if owner is not None:
            owner.events = events


def _cpu_pool(settings: Settings, encoding: str, *, embedder: bool) -> None:
    """Size the process's CPU pool (:mod:`hermes.infra.cpu_pool`: embeddings and large
    token counts, off the event loop that heartbeats), have its children load ``encoding``
    (and with ``embedder`` the settings' offline embedding model, which
    :func:`hermes.memory.service.embedder_from_settings` runs there), and start them in
    the background."""
    pool = cpu_pool.shared(settings.cpu_workers)
    if pool is not None:
        pool.add_warmer(TokenCounter.get, encoding)
        if embedder and settings.memory_embedder in EMBEDDERS:
            pool.add_warmer(warm_in_child, settings.memory_embedder)
        pool.start()


def _watch_loop_lag(settings: Settings) -> LoopLagMonitor | None:
    """The event-loop lag monitor of the running loop (:mod:`hermes.infra.loop_lag`),
    started if need be; None when the worker is built outside a running loop."""
    try:
        return watch_loop_lag(settings.event_loop_lag_warn_seconds)
    except RuntimeError:
        return None


VALIDATION_ATTEMPTS = 3
"""How many times a worker is made when the SDK's validation of the workflows failed on
Python's import locks (see :func:`_validated`)."""


def _import_lock_race(err: BaseException) -> bool:
    """Whether ``err`` is the SDK's "Failed validating workflow" caused by Python 3.11's
    module-lock race (a ``KeyError`` of a thread id from ``importlib._bootstrap``,
    python/cpython#91351), which another thread importing at the same time causes."""
    if not (isinstance(err, RuntimeError) and str(err).startswith("Failed validating workflow")):
        return False
    cause = err.__cause__
    while cause is not None:
        if isinstance(cause, KeyError):
            return True
        cause = cause.__cause__ or cause.__context__
    return False


def _validated(make: Any, *args: Any, **kwargs: Any) -> Worker:
    """``make(*args, **kwargs)``, made again (at most :data:`VALIDATION_ATTEMPTS` times)
    when the SDK's sandbox validation of the workflows, which imports their modules,
    failed on the import-lock race of :func:`_import_lock_race`. The validation only
    imports and checks, so making the worker again is safe; any other failure is raised.
    Seen in CI: one process made a worker while an earlier worker's memory store was
    still importing in its loading thread."""
    for attempt in range(1, VALIDATION_ATTEMPTS + 1):
        try:
            return make(*args, **kwargs)
        except RuntimeError as err:
            if attempt == VALIDATION_ATTEMPTS or not _import_lock_race(err):
                raise
            log.warning("workflow validation failed on the import-lock race (%r); making the worker again", err.__cause__)
            time.sleep(0.05 * attempt)
    raise AssertionError("unreachable")


def set_deadlock_timeout(worker: Worker, seconds: float) -> bool:
    """Set how long an activation of workflow code may run before the SDK fails its task
    as a deadlock (``Settings.workflow_deadlock_seconds``). The Python SDK fixes it at 2 s
    (only its debug mode, which also runs workflow code on the event loop, turns it off),
    so this sets the workflow worker's private attribute; returns False, changing nothing,
    if this SDK version has no such attribute or the worker runs no workflows."""
    workflows = getattr(worker, "_workflow_worker", None)
    if workflows is None or getattr(workflows, "_deadlock_timeout_seconds", None) is None:
        return False
    workflows._deadlock_timeout_seconds = seconds
    return True


def _memory_activities(
    settings: Settings, memory: Any, provider: Any, client: Client, task_queue: str, redis: Any
) -> MemoryActivities | None:
    if memory is False or (memory is True and not settings.memory_enabled):
        return None
    if memory is True:
        factory = PreloadedEmbedder(settings).open_store
    elif callable(memory):
        factory = memory
    else:
        factory = lambda: memory  # noqa: E731
    activities = MemoryActivities(
        factory,
        provider=provider,
        client=client,
        task_queue=task_queue,
        batch_size=settings.memory_batch_size,
        batch_seconds=settings.memory_batch_seconds,
        redis=redis,
        heartbeat_seconds=settings.memory_heartbeat_seconds,
        judge_max_calls=settings.resolved_memory_judge_max_calls,
    )
    return activities


class PreloadedEmbedder:
    """The memory embedder of ``settings``, made once and shared, its model loaded by
    :meth:`preload` (a worker calls it in a thread at start-up).

    Why: an embedding model that loads on first use (``use``: about 120 MB and 1-6 s)
    did so in whichever memory activity first needed it, in the middle of a turn and
    at an unforeseeable time: the first memory write this worker ran, or the first
    search it served while Redis was down (the hot path needs Redis' generation token).
    Loaded at start, the worker's footprint is reached before it serves many turns.
    """

    def __init__(self, settings: Settings):
        self._settings = settings
        self._embedder: Any = None
        self._warmed = False
        self._lock = threading.Lock()

    def get(self) -> Any:
        """The embedder (made on first call; one for every caller).

        Raises:
            ConfigError: as :func:`hermes.memory.service.embedder_from_settings`.
        """
        with self._lock:
            if self._embedder is None:
                from hermes.memory.service import embedder_from_settings

                self._embedder = embedder_from_settings(self._settings)
            return self._embedder

    def preload(self) -> None:
        """Make the embedder and load its model and the cross-language dictionary, once
        (later calls return at once); a failure is logged, not raised (the memory
        activities meet it again, as without a preload)."""
        try:
            embedder = self.get()
            with self._lock:
                if self._warmed:
                    return
                warm = getattr(embedder, "warm", None)
                if warm is not None:
                    warm()
                from hermes.memory import crosslingual

                crosslingual.warm()  # the dictionary of the lexical channel (about 0.5 s)
                _warm_reference_bank(embedder)
                self._warmed = True
        except Exception:  # noqa: BLE001 - the activities report it where it matters
            log.warning("memory embedder not preloaded", exc_info=True)

    def open_store(self) -> Any:
        """The memory store of the settings, with this embedder, its model loaded first
        (so that a search after it never waits on the model)."""
        from hermes.memory.service import open_store

        self.preload()
        return open_store(self._settings, self.get())


def open_mcp(settings: Settings, registry: ToolRegistry) -> Any:
    """The MCP toolset of ``settings.mcp_config``, or None when none is configured.

    Raises:
        ConfigError: the file is wrong, or names an unset environment variable.
    """
    if settings.mcp_config is None:
        return None
    from hermes.mcp.config import load_mcp_config
    from hermes.mcp.manager import McpManager
    from hermes.mcp.tools import McpToolset

    config = load_mcp_config(settings.mcp_config, environ=os.environ)
    return McpToolset(config, McpManager(config), reserved=set(registry.names()))


async def run_worker(
    settings: Settings | None = None,
    *,
    stop: asyncio.Event | None = None,
    on_serving: Callable[[ModelProvider, ToolRegistry, Any], None] | None = None,
) -> None:
    """Connect, register the search attributes, and serve until ``stop`` is set or a
    SIGTERM / SIGINT; then stop gracefully: no new work is taken, and the activities
    running finish and report (up to ``settings.resolved_worker_shutdown_seconds``).

    Args:
        settings: configuration; :func:`get_settings` when None.
        stop: set it to stop the worker (besides SIGTERM / SIGINT).
        on_serving: called once the worker polls its task queue, with the model
            provider, the tool registry and the MCP toolset (None without MCP servers)
            it serves (``hermes worker`` prints them).

    Raises:
        ConfigError: a wrong model, tool or MCP configuration (found before serving); a
            local memory store with a Temporal that serves other machines too and no
            ``HERMES_MEMORY_STORE_SCOPE`` (:func:`hermes.memory.location.check_memory_location`).
    """
    from hermes.memory.location import check_memory_location
    from hermes.names import SEARCH_ATTRIBUTES
    from hermes.infra.process import freeze_startup_heap
    from hermes.infra.stack import ensure_search_attributes

    from hermes.infra import telemetry

    settings = settings or get_settings()
    location = check_memory_location(settings)  # before anything connects: one memory for every worker
    telemetry.configure(settings, service_name="hermes-worker", prometheus=True)
    client = await connect_client(settings)
    await ensure_search_attributes(client, SEARCH_ATTRIBUTES, settings.temporal_namespace)
    provider = make_provider(settings)
    registry = load_registry(settings)
    mcp = open_mcp(settings, registry)
    worker = build_worker(client, settings, provider=provider, registry=registry, mcp=mcp)
    describe_cpu_reading(settings)  # what its tuner reads for CPU (a warning where it misleads)
    if settings.memory_enabled:
        from hermes.memory.service import ensure_consolidation_schedule

        await ensure_consolidation_schedule(client, settings)
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.add_signal_handler(sig, stop.set)
        except (NotImplementedError, RuntimeError):
            pass
    log.info(
        "worker serving task queue %s at %s; memories at %s; %s",
        worker.task_queue, settings.resolved_temporal_address, location.describe(),
        f"build {settings.build_id} of deployment {settings.deployment_name}" if settings.build_id else "unversioned",
    )
    try:
        async with worker:
            log.info("start-up heap frozen: %d objects out of the garbage collector's passes", freeze_startup_heap())
            if on_serving is not None:
                on_serving(provider, registry, mcp)
            await stop.wait()
            log.info(
                "worker stopping: taking no new work; running activities have up to %.0f s to finish",
                settings.resolved_worker_shutdown_seconds,
            )
    finally:
        if mcp is not None:
            await mcp.manager.aclose()  # every MCP server process (tree) goes with the worker
        await asyncio.to_thread(cpu_pool.shutdown_shared)  # the CPU pool's children too


def main() -> None:
    from hermes.infra.process import tune_allocator
    from hermes.infra.sdk_logs import install_default_runtime

    tune_allocator()  # before any thread: the worker's memory stays flat (issue 12)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    install_default_runtime()  # the SDK core's warnings as plain lines of this log
    asyncio.run(run_worker())


def _warm_reference_bank(embedder: Any) -> None:
    """Embed the read path's reference bank (:mod:`hermes.memory.relevance`) now: the
    first search of a worker otherwise embedded its hundred questions (3 s on an idle
    machine; past the search's 15 s timeout with eight busy processes per core, and the
    demo's recall came back empty)."""
    from hermes.memory import relevance

    if embedder.thresholds.retrieval_lift > -1.0:
        relevance.bank_for(embedder).matrix  # noqa: B018 - computed and kept on first read


if __name__ == "__main__":
    main()
