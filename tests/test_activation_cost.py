"""Less CPU per workflow activation (issue 31 item 6, :mod:`hermes.infra.activation` and
:mod:`hermes.infra.run_cache`): no payload walks that cannot change a payload, payload
models and pydantic passed through the sandbox, and a run-cache hook that reads nothing of
an ordinary activation. The CPU figures are benchmarks (``bench/turn_overhead.py``,
``bench/tool_dispatch.py``); these tests pin the behaviour that yields them."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

from temporalio import workflow
from temporalio.api.common.v1 import Payload
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.converter import PayloadCodec
from temporalio.worker import Worker
from temporalio.worker._command_aware_visitor import CommandAwarePayloadVisitor

with workflow.unsafe.imports_passed_through():
    import dataclasses

    from hermes.client import HermesClient
    from hermes.infra.activation import PASSTHROUGH_MODULES, walks_are_idle
    from hermes.infra.durable import DurableStore
    from hermes.infra.run_cache import MovedRunEviction
    from hermes.providers.scripted import ScriptedModel
    from hermes.tools.builtin import register_builtins
    from hermes.tools.registry import ToolRegistry
    from worker import build_worker

from workflows.session import patches as workflow_module
from hermes.models import SessionConfig


class _Identity(PayloadCodec):
    async def encode(self, payloads: Sequence[Payload]) -> list[Payload]:
        return list(payloads)

    async def decode(self, payloads: Sequence[Payload]) -> list[Payload]:
        return list(payloads)


def test_payload_walks_are_idle_only_without_codec_and_external_storage():
    assert walks_are_idle(pydantic_data_converter)
    assert not walks_are_idle(dataclasses.replace(pydantic_data_converter, payload_codec=_Identity()))


async def test_a_worker_without_codec_walks_no_payloads_and_its_session_answers(
    temporal_client, settings, redis, session_id, monkeypatch
):
    walks = 0
    visit = CommandAwarePayloadVisitor.visit

    async def counted(self: Any, *args: Any, **kwargs: Any) -> Any:
        nonlocal walks
        walks += 1
        return await visit(self, *args, **kwargs)

    monkeypatch.setattr(CommandAwarePayloadVisitor, "visit", counted)
    worker = build_worker(
        temporal_client, settings, provider=ScriptedModel.demo(), registry=register_builtins(ToolRegistry()), redis=redis
    )
    hermes = HermesClient(
        temporal_client, task_queue=settings.task_queue, redis=redis, durable=DurableStore(settings.resolved_memory_uri)
    )
    async with worker:
        result = await hermes.send_message(session_id, "What is (17 + 25) * 3?")
    assert (result.status, "126" in (result.reply or "")) == ("completed", True)
    assert walks == 0


@workflow.defn(name="PassthroughProbe")
class PassthroughProbe:
    @workflow.run
    async def run(self) -> list[int]:
        import pydantic

        return [id(SessionConfig), id(pydantic.BaseModel), id(workflow_module)]


async def test_the_sandbox_takes_payload_models_and_pydantic_from_the_worker_and_imports_workflow_code_afresh(
    temporal_client, settings, redis
):
    import pydantic

    runner = build_worker(
        temporal_client, settings, provider=ScriptedModel.demo(), registry=register_builtins(ToolRegistry()), redis=redis
    ).config()["workflow_runner"]
    assert {"pydantic", "hermes.models"} <= runner.restrictions.passthrough_modules
    assert set(PASSTHROUGH_MODULES) <= runner.restrictions.passthrough_modules
    queue = f"probe-{uuid.uuid4()}"
    async with Worker(temporal_client, task_queue=queue, workflows=[PassthroughProbe], workflow_runner=runner):
        seen = await temporal_client.execute_workflow(PassthroughProbe.run, id=f"probe-{uuid.uuid4()}", task_queue=queue)
    models, base_model, logic = seen
    assert (models, base_model) == (id(SessionConfig), id(pydantic.BaseModel))
    assert logic != id(workflow_module), "workflow code stays sandboxed (its non-determinism is still checked)"


async def test_each_run_executes_workflow_modules_afresh_from_code_compiled_once_per_process(
    temporal_client, settings, redis
):
    from hermes.infra.activation import _CodeCachingLoader, cache_workflow_code

    runner = build_worker(
        temporal_client, settings, provider=ScriptedModel.demo(), registry=register_builtins(ToolRegistry()), redis=redis
    ).config()["workflow_runner"]
    assert not cache_workflow_code(), "build_worker installs it (once per process)"
    queue = f"probe-{uuid.uuid4()}"
    seen = []
    async with Worker(temporal_client, task_queue=queue, workflows=[PassthroughProbe], workflow_runner=runner,
                      max_cached_workflows=0):
        for _ in range(3):
            seen.append(await temporal_client.execute_workflow(PassthroughProbe.run, id=f"probe-{uuid.uuid4()}", task_queue=queue))
            compiled = _CodeCachingLoader.compiled if len(seen) == 1 else compiled
    assert _CodeCachingLoader.compiled == compiled, "a later run compiled a workflow module again"
    assert all(logic != id(workflow_module) for _, _, logic in seen), "workflow code stays sandboxed"
    cached = [key for key in _CodeCachingLoader.codes if key[0].endswith("workflows/session/patches.py")]
    assert len(cached) == 1, "the sandbox's workflow modules go through the code cache"


class _Jobs:
    def __iter__(self) -> Any:
        raise AssertionError("the jobs of an ordinary activation were read")


async def test_the_run_cache_hook_hands_on_an_activation_of_a_cached_announced_run_without_reading_it():
    handled: list[Any] = []

    async def handle(act: Any) -> None:
        handled.append(act)

    async def poll() -> None:
        return None

    workflows = type(
        "Workflows", (), {"_handle_activation": staticmethod(handle), "_running_workflows": {"run-1": object()},
                          "_bridge_worker": staticmethod(lambda: None), "run": staticmethod(poll)}
    )()
    eviction = MovedRunEviction(type("W", (), {"_workflow_worker": workflows})(), redis=object())
    assert eviction.install()
    act = type("Act", (), {"run_id": "run-1", "jobs": _Jobs(), "is_replaying": False})()
    await workflows._handle_activation(act)
    assert handled == [act] and eviction.published == 0


def test_every_payload_type_is_built_at_import_never_lazily_inside_an_activation():
    """A pydantic model that names a type defined later in its module is built on its
    first use: inside a workflow's sandbox, in the middle of an activation (a schema
    build of milliseconds, seen in a profile of the turn-start fields)."""
    import pydantic

    from hermes import models
    from hermes.memory import models as memory_models
    from hermes.sessions import turn_start

    lazy = [
        f"{module.__name__}.{name}"
        for module in (models, memory_models, turn_start)
        for name, value in vars(module).items()
        if isinstance(value, type) and issubclass(value, pydantic.BaseModel) and value is not pydantic.BaseModel
        and not value.__pydantic_complete__
    ]
    assert not lazy, f"built lazily on first use: {lazy} (call model_rebuild() once the types they name are defined)"


@workflow.defn(name="BuiltinsProbe")
class BuiltinsProbe:
    @workflow.run
    async def run(self) -> list[bool]:
        import builtins
        from datetime import datetime

        stamp = workflow.now()
        # The builtins an activation runs with are the interpreter's own (no checking
        # wrappers), and an isinstance against a class the sandbox proxies still works.
        return [builtins.isinstance is _ISINSTANCE, builtins.issubclass is _ISSUBCLASS, isinstance(stamp, datetime)]


_ISINSTANCE, _ISSUBCLASS = isinstance, issubclass


async def test_an_activation_runs_with_the_plain_isinstance_and_the_sandbox_still_refuses_nondeterminism(
    temporal_client, settings, redis
):
    runner = build_worker(
        temporal_client, settings, provider=ScriptedModel.demo(), registry=register_builtins(ToolRegistry()), redis=redis
    ).config()["workflow_runner"]
    queue = f"probe-{uuid.uuid4()}"
    async with Worker(temporal_client, task_queue=queue, workflows=[BuiltinsProbe, ClockProbe], workflow_runner=runner):
        seen = await temporal_client.execute_workflow(BuiltinsProbe.run, id=f"probe-{uuid.uuid4()}", task_queue=queue)
        assert seen == [True, True, True]
        # The module restrictions stay: reading the wall clock still fails the task.
        handle = await temporal_client.start_workflow(ClockProbe.run, id=f"clock-{uuid.uuid4()}", task_queue=queue)
        failure = await _first_task_failure(temporal_client, handle)
    assert "RestrictedWorkflowAccessError" in failure or "datetime.datetime.now" in failure, failure


@workflow.defn(name="ClockProbe")
class ClockProbe:
    @workflow.run
    async def run(self) -> str:
        import datetime

        return datetime.datetime.now().isoformat()


async def _first_task_failure(client: Any, handle: Any) -> str:
    import asyncio

    from temporalio.api.enums.v1 import EventType

    for _ in range(200):
        async for event in handle.fetch_history_events():
            if event.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED:
                await handle.terminate()
                return event.workflow_task_failed_event_attributes.failure.message
        await asyncio.sleep(0.05)
    await handle.terminate()
    return "no workflow task failed"


def test_workflow_code_never_uses_the_builtins_the_sandbox_no_longer_checks():
    """The sandbox's checks of ``open``, ``input`` and ``breakpoint`` cost every
    activation (:data:`hermes.infra.activation.RESTRICTED_BUILTINS`): the workflow code,
    and the modules it takes from the worker, are checked here instead, statically."""
    import ast
    from pathlib import Path

    from hermes.infra.activation import RESTRICTED_BUILTINS

    root = Path(__file__).resolve().parent.parent
    files = sorted((root / "workflows").rglob("*.py"))
    for module in PASSTHROUGH_MODULES:
        if not module.startswith("hermes"):
            continue
        base = root.joinpath(*module.split("."))
        files += sorted(base.rglob("*.py")) if base.is_dir() else [base.with_suffix(".py")]
    assert len(files) > 20
    # Worker-side functions of modules the workflows share, which workflow code never
    # reaches: loading a tiktoken encoding (ContextPlanner.counter takes a loaded one).
    worker_side = {("hermes/content/tokens.py", "_cached_blob_ok")}
    used = []
    for path in files:
        tree = ast.parse(path.read_text(encoding="utf-8"))
        relative = str(path.relative_to(root))
        skipped = [
            range(node.lineno, (node.end_lineno or node.lineno) + 1)
            for node in ast.walk(tree)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and (relative, node.name) in worker_side
        ]
        used += [
            f"{relative}:{node.lineno} {node.id}"
            for node in ast.walk(tree)
            if isinstance(node, ast.Name) and node.id in RESTRICTED_BUILTINS and not any(node.lineno in r for r in skipped)
        ]
    assert not used, f"workflow code must not use {RESTRICTED_BUILTINS} (I/O, or a debugger stop): {used}"

