"""Less CPU per workflow activation: the sandbox's pass-through modules, and no payload
walks that cannot change a payload.

Why (issue 31 item 6, profiled in ``bench/README.md``): per turn a session's worker spent
more CPU in the SDK's machinery around each activation than in the workflow's own code.
Two of those costs are waste when nothing uses them:

* **Payload walks.** For every activation the SDK walks every payload of the activation
  three times (codec decode, external-storage retrieve, storage references) and every
  payload of the completion three times (codec encode, external-storage store,
  references), asking the workflow's sandbox for each command's serialization context on
  the way. With no payload codec and no external storage configured, every one of those
  walks returns each payload unchanged. :func:`skip_idle_payload_walks` skips them then,
  and only then: a worker whose client encrypts payloads (``HERMES_ENCRYPTION_KEYS``) or
  stores them externally walks them as before. What a skip loses: a payload that is an
  external-storage reference reaching a worker without external storage fails its
  workflow task on decoding (the payload's encoding is unknown) instead of with the
  SDK's ``TMPRL1105`` message; either way the task fails and is retried.
* **Sandbox re-imports.** The sandbox imports every module a workflow uses afresh for each
  new run (a session's first task, each continue-as-new, each run replayed after it
  left the cache, each composite-tool or memory child workflow), unless it is passed
  through. pydantic rebuilt the schema of every payload model each time.
  :data:`PASSTHROUGH_MODULES` are passed through: pydantic and its parts (as the SDK's
  ``temporalio.contrib.pydantic`` recommends) and the pure parts of ``hermes`` that
  workflow code calls (STYLE.md: "workflows/ imports temporalio, the standard library and
  the pure parts of hermes/"). The workflow modules themselves (``workflows.*``) stay
  sandboxed: the sandbox still checks the workflow code for non-determinism. What the
  pass-through gives up: the sandbox no longer checks those ``hermes`` modules' own calls
  at run time; the suite runs the session workflow with and without the sandbox and
  replays recorded histories, which is what catches a non-deterministic helper.

* **Sandbox compiles.** Those re-imports compile each workflow module from its source
  again when no bytecode is cached beside it (``PYTHONDONTWRITEBYTECODE=1``, as container
  images often set, or a read-only source tree): about 8 of the 11 ms a new session
  instance cost here, on the event loop that sends heartbeats. :func:`cache_workflow_code`
  keeps each workflow module's code object in memory once compiled; every instance still
  executes it afresh into its own module (the sandbox's isolation is unchanged).

This uses two private parts of the Temporal Python SDK (1.x, pinned below 2 in
pyproject.toml): ``temporalio.bridge.worker.decode_activation`` / ``encode_completion``
(called through the module by the workflow worker) and ``DataConverter.external_storage``.
If they are missing, :func:`skip_idle_payload_walks` returns False and changes nothing.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import importlib.abc
import importlib.machinery
import logging
import os
import sys
import threading
import time
from types import CodeType
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from temporalio.worker import UnsandboxedWorkflowRunner, WorkflowInstance, WorkflowInstanceDetails, WorkflowRunner
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner, SandboxRestrictions

from hermes.infra import sinks as sink_calls

log = logging.getLogger("hermes.activation")

PASSTHROUGH_MODULES: tuple[str, ...] = (
    "pydantic",
    "pydantic_core",
    "annotated_types",
    "typing_inspection",
    "hermes.models",
    "hermes.names",
    "hermes.errors",
    "hermes.memory.models",
    "hermes.security",
    "hermes.content",
    "hermes.memory.rules",
    "hermes.memory.working",
    "hermes.memory.judge",
    "hermes.tools.arguments",
    "hermes.tools.routing",
    "hermes.infra.telemetry",
    "hermes.infra.sinks",
)
"""Modules the workflow sandbox takes from the worker process instead of importing them
again for each run (a module and its submodules, when a workflow imports them): pydantic,
and the parts of ``hermes`` the workflows use: payload models, wire names, errors, and the
pure functions of context building, token counting, previews, memory rules and tool
arguments (no I/O, no clock, no randomness; each says so in its docstring)."""

_SKIPPING = "__hermes_skips_idle_walks__"


RESTRICTED_BUILTINS = ("open", "input", "breakpoint")
"""The builtins the SDK's default restrictions forbid in workflow code. Hermes checks
that its workflow code never calls them (``tests/test_activation_cost.py``) instead of
having the sandbox check every call: with any builtin restricted, the sandbox swaps
those builtins, ``isinstance`` and ``issubclass`` for checking wrappers at every
activation, and every ``isinstance`` call of the activation (the SDK's payload
converters, ``json``, pydantic) then costs three Python frames more (issue 31: about
5% of a session's activation CPU)."""


def sandbox_runner() -> SandboxedWorkflowRunner:
    """The SDK's sandboxed workflow runner with its default restrictions, but those on
    :data:`RESTRICTED_BUILTINS`, and :data:`PASSTHROUGH_MODULES` passed through.

    Returns:
        A runner for ``Worker(workflow_runner=...)``.
    """
    restrictions = SandboxRestrictions.default.with_passthrough_modules(*PASSTHROUGH_MODULES)
    members = restrictions.invalid_module_members
    children = {name: matcher for name, matcher in members.children.items() if name != "__builtins__"}
    members = dataclasses.replace(members, children=children)
    return SandboxedWorkflowRunner(restrictions=dataclasses.replace(restrictions, invalid_module_members=members))


Sink = Callable[[Any], Awaitable[Any]]
"""A sink's handler (:mod:`hermes.infra.sinks`): an idempotent coroutine function of one
value, which reports its own failures."""


SDK_DEADLOCK_SECONDS = 2.0
"""The Python SDK's bound on one activation (``[TMPRL1101]``) when nothing raises it."""

DEADLOCK_MARGIN_SECONDS = 0.5
"""What a sink wait leaves of the activation's deadlock bound (the SDK's own handling of
the completion runs within it too)."""


def sink_runner(
    sinks: Mapping[str, Sink], *, sandboxed: bool = True, deadlock_seconds: float = SDK_DEADLOCK_SECONDS
) -> WorkflowRunner:
    """The worker's workflow runner (:func:`sandbox_runner`, or the SDK's unsandboxed one),
    running each activation's sink calls (:mod:`hermes.infra.sinks`) once it ends.

    Args:
        sinks: handlers by name; they run on the event loop of the worker that made the
            workflow instance.
        sandboxed: False for the SDK's unsandboxed runner (``HERMES_WORKFLOW_SANDBOX``).
        deadlock_seconds: the worker's bound on one activation (the SDK's 2 s, or
            :func:`worker.set_deadlock_timeout`'s): the wait for the sink calls counts
            against it, so it is cut to what the activation left of it.

    Returns:
        A runner for ``Worker(workflow_runner=...)``, of the class it wraps (a
        ``SandboxedWorkflowRunner`` keeps its restrictions). Its ``unsandboxed()`` is the
        runner for ``Worker(unsandboxed_workflow_runner=...)``, with the same sinks.
    """
    calls = SinkCalls(sinks, deadlock_seconds=deadlock_seconds)
    if sandboxed:
        return _SandboxedSinkRunner(restrictions=sandbox_runner().restrictions, sink_calls=calls)
    return _UnsandboxedSinkRunner(calls)


class SinkCalls:
    """Runs an activation's sink calls on the worker's event loop, from the thread the
    activation ran on, and waits for them at most :data:`hermes.infra.sinks.SINK_WAIT_SECONDS`
    (and never past the activation's deadlock bound, less :data:`DEADLOCK_MARGIN_SECONDS`).

    Args:
        sinks: handlers by name.
        deadlock_seconds: the worker's bound on one activation.
    """

    def __init__(self, sinks: Mapping[str, Sink], *, deadlock_seconds: float = SDK_DEADLOCK_SECONDS):
        self.sinks = dict(sinks)
        self.deadlock_seconds = deadlock_seconds
        self.loop: asyncio.AbstractEventLoop | None = None
        self.loop_thread: int | None = None
        self.late = 0
        """Activations that ended before their sink calls did (those finished later)."""
        self.unfinished: set[concurrent.futures.Future[None]] = set()
        """Sink calls still running after their activation ended."""
        self._on_loop: set[asyncio.Task[None]] = set()

    def bind(self) -> None:
        """Take the running event loop (and its thread) as the one to run sink calls on:
        the SDK makes workflow instances on its worker's loop. Outside a loop, nothing
        changes."""
        try:
            self.loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        self.loop_thread = threading.get_ident()

    def run(self, calls: list[tuple[str, Any]], *, activation_seconds: float = 0.0) -> None:
        """Run ``calls`` (``(sink, value)`` in the order made), waiting for them at most
        ``SINK_WAIT_SECONDS`` and what the activation (which took ``activation_seconds``)
        left of its deadlock bound; never raises (each failure is logged)."""
        names = [name for name, _ in calls]
        loop = self.loop
        if loop is None or loop.is_closed():
            log.warning("sink calls %s dropped: their worker's event loop is not running", names)
            return
        if threading.get_ident() == self.loop_thread:
            # The SDK's debug mode activates on the loop's own thread: waiting would block it.
            task = loop.create_task(self._handle(calls))
            self._on_loop.add(task)  # held until done (the loop keeps only a weak reference)
            task.add_done_callback(self._on_loop.discard)
            return
        handling = self._handle(calls)
        try:
            future = asyncio.run_coroutine_threadsafe(handling, loop)
        except RuntimeError as err:  # the loop closed meanwhile: the worker is stopping
            handling.close()
            log.warning("sink calls %s dropped: %s", names, err)
            return
        wait = min(sink_calls.SINK_WAIT_SECONDS, self.deadlock_seconds - DEADLOCK_MARGIN_SECONDS - activation_seconds)
        try:
            future.result(timeout=max(wait, 0.0))
        except concurrent.futures.TimeoutError:
            self.late += 1
            self.unfinished.add(future)
            future.add_done_callback(self.unfinished.discard)
            log.warning(
                "sink calls %s still running after %.2f s (the activation took %.2f s); the workflow task "
                "completes, they finish meanwhile", names, max(wait, 0.0), activation_seconds,
            )
        except concurrent.futures.CancelledError:
            log.warning("sink calls %s cancelled: their worker is stopping", names)

    async def _handle(self, calls: list[tuple[str, Any]]) -> None:
        for name, value in calls:
            handler = self.sinks.get(name)
            if handler is None:
                log.warning("sink call to %r dropped: this worker has no such sink", name)
                continue
            try:
                await handler(value)
            except asyncio.CancelledError:
                log.warning("sink call to %r cancelled before it finished: its worker is stopping", name)
                raise
            except Exception:  # noqa: BLE001 - a sink is a projection: its failure never fails the task
                log.exception("sink %r failed", name)


class SinkInstance(WorkflowInstance):
    """A workflow instance whose activations' sink calls :class:`SinkCalls` runs when
    each activation ends in a successful completion (a failed one is run again, and
    calls its sinks then)."""

    def __init__(self, inner: WorkflowInstance, calls: SinkCalls):
        self._inner, self._calls = inner, calls

    def activate(self, act: Any) -> Any:
        began = time.monotonic()
        made = sink_calls.collect()
        try:
            completion = self._inner.activate(act)
        finally:
            sink_calls.stop_collecting()
        if made and completion.HasField("successful"):
            self._calls.run(made, activation_seconds=time.monotonic() - began)
        return completion

    def get_serialization_context(self, command_info: Any) -> Any:
        return self._inner.get_serialization_context(command_info)

    def get_external_store_context(self, command_info: Any) -> Any:
        return self._inner.get_external_store_context(command_info)

    def get_info(self) -> Any:
        return self._inner.get_info()

    def get_thread_id(self) -> int | None:
        return self._inner.get_thread_id()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


@dataclass(frozen=True)
class _SandboxedSinkRunner(SandboxedWorkflowRunner):
    sink_calls: SinkCalls | None = None

    def unsandboxed(self) -> WorkflowRunner:
        """The runner of this worker's ``sandboxed=False`` workflows, with the same sinks."""
        return UnsandboxedWorkflowRunner() if self.sink_calls is None else _UnsandboxedSinkRunner(self.sink_calls)

    def create_instance(self, det: WorkflowInstanceDetails) -> WorkflowInstance:
        instance = super().create_instance(det)
        if self.sink_calls is None:
            return instance
        self.sink_calls.bind()
        return SinkInstance(instance, self.sink_calls)


class _UnsandboxedSinkRunner(UnsandboxedWorkflowRunner):
    def __init__(self, calls: SinkCalls):
        self.sink_calls = calls

    def unsandboxed(self) -> WorkflowRunner:
        return self

    def create_instance(self, det: WorkflowInstanceDetails) -> WorkflowInstance:
        self.sink_calls.bind()
        return SinkInstance(super().create_instance(det), self.sink_calls)


def walks_are_idle(data_converter: Any) -> bool:
    """True when payload walks with ``data_converter`` cannot change a payload: it has no
    payload codec and no external storage.

    Args:
        data_converter: a ``temporalio.converter.DataConverter`` (the workflow worker's
            per-activation one included).
    """
    return getattr(data_converter, "payload_codec", None) is None and getattr(data_converter, "external_storage", None) is None


def skip_idle_payload_walks() -> bool:
    """Make the SDK's workflow worker skip the payload walks of an activation and of its
    completion when :func:`walks_are_idle` (for the whole process; idempotent).

    Returns:
        True if installed (now or before); False, changing nothing, when this SDK version
        has no such functions or its data converter no ``external_storage``.
    """
    import temporalio.bridge.worker as bridge
    import temporalio.converter as converter

    decode = getattr(bridge, "decode_activation", None)
    encode = getattr(bridge, "encode_completion", None)
    metrics = getattr(getattr(converter, "_extstore", None), "StorageOperationMetrics", None)
    if getattr(decode, _SKIPPING, False):
        return True
    if decode is None or encode is None or metrics is None or "external_storage" not in converter.DataConverter.__dataclass_fields__:
        log.warning("payload walks not skipped: this temporalio version's worker internals differ")
        return False

    async def decode_activation(activation: Any, data_converter: Any, *args: Any, **kwargs: Any) -> Any:
        if walks_are_idle(data_converter):
            return metrics()
        return await decode(activation, data_converter, *args, **kwargs)

    async def encode_completion(completion: Any, data_converter: Any, *args: Any, **kwargs: Any) -> Any:
        if walks_are_idle(data_converter):
            return metrics()
        return await encode(completion, data_converter, *args, **kwargs)

    setattr(decode_activation, _SKIPPING, True)
    bridge.decode_activation = decode_activation
    bridge.encode_completion = encode_completion
    _skip_idle_command_aware_converters()
    return True


def _skip_idle_command_aware_converters() -> None:
    """For each activation of a cached workflow the SDK builds a command-aware data
    converter (a new payload converter and its empty type-adapter cache: 5% of the
    worker's busy time in ``bench/tool_dispatch.py``) only to hand it to the walks
    :func:`skip_idle_payload_walks` skips. When the walks are idle the converter it is
    built from is handed over instead; otherwise the SDK's is built as before."""
    from temporalio.worker import _workflow

    aware = getattr(_workflow, "_CommandAwareDataConverter", None)
    create = getattr(aware, "create", None)
    if create is None or getattr(create, _SKIPPING, False):
        return

    def created(instance: Any, context_free_dc: Any, workflow_context_dc: Any, workflow_context: Any) -> Any:
        if walks_are_idle(workflow_context_dc):
            return workflow_context_dc
        return create(instance=instance, context_free_dc=context_free_dc,
                      workflow_context_dc=workflow_context_dc, workflow_context=workflow_context)

    setattr(created, _SKIPPING, True)
    aware.create = staticmethod(created)


WORKFLOW_PACKAGES = ("workflows",)
"""Top-level packages whose modules' code objects :func:`cache_workflow_code` keeps: the
workflow code the sandbox imports afresh for every run."""


class _CodeCachingLoader(importlib.machinery.SourceFileLoader):
    """A source loader whose compiled code is kept per (path, modification time, size): a
    module imported again (each sandboxed run) executes the same code object, compiled or
    read from its bytecode file once; an edited file is compiled again."""

    codes: dict[tuple[str, int, int], CodeType] = {}
    compiled = 0
    """Code objects made (compiled, or read from bytecode) since the process started."""

    def get_code(self, fullname: str) -> CodeType:
        path = self.get_filename(fullname)
        stat = os.stat(path)
        key = (path, stat.st_mtime_ns, stat.st_size)
        code = self.codes.get(key)
        if code is None:
            code = super().get_code(fullname)
            if code is None:  # pragma: no cover - a source loader always has code
                raise ImportError(f"no code for {fullname} at {path}")
            type(self).compiled += 1
            self.codes[key] = code
        return code


class _WorkflowCodeFinder(importlib.abc.MetaPathFinder):
    """Finds :data:`WORKFLOW_PACKAGES`' modules with the other finders, and hands their
    plain source files to :class:`_CodeCachingLoader`."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname.partition(".")[0] not in WORKFLOW_PACKAGES:
            return None
        for finder in sys.meta_path:
            if finder is self or isinstance(finder, _WorkflowCodeFinder):
                continue
            find = getattr(finder, "find_spec", None)
            spec = find(fullname, path, target) if find is not None else None
            if spec is None:
                continue
            if type(spec.loader) is importlib.machinery.SourceFileLoader and spec.origin:
                spec.loader = _CodeCachingLoader(fullname, spec.origin)
            return spec
        return None


def cache_workflow_code() -> bool:
    """Keep the code of workflow modules (:data:`WORKFLOW_PACKAGES`) in memory once
    compiled, for the sandbox's re-imports (for the whole process; idempotent).

    Returns:
        True if installed now, False if it was already.
    """
    if any(isinstance(finder, _WorkflowCodeFinder) for finder in sys.meta_path):
        return False
    sys.meta_path.insert(0, _WorkflowCodeFinder())
    return True
