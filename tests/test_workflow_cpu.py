"""Workflow code does only bounded work (issue 12): the worst inputs a session takes
(megabyte tool-call arguments and tool results, contexts of about 100k tokens) never make
a workflow task slow enough for the SDK's 2 s deadlock detector, even with every workflow
task replaying the whole history (``max_cached_workflows=0``) and a CPU hog on every core.

Reported: a turn whose tool-call arguments were about 1.3 MB had their tokens counted in
workflow code; on a busy machine the task passed the deadlock detector (TMPRL1101), was
retried ten times over eight minutes and the session stayed stuck.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from temporalio.api.enums.v1 import EventType

from hermes.models import CallModelInput, CallModelResult, Message, ToolCall, ToolResult, Usage
from hermes.tools.builtin import register_builtins
from hermes.tools.registry import ToolContext, ToolRegistry
from tests.test_large_inputs import histories, mixed_text

ONE_MB = 1024 * 1024


@pytest.fixture
def cpu_hog() -> Iterator[None]:
    """Busy loops on every core (and one more) for the test's duration."""
    hogs = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for _ in range((os.cpu_count() or 2) + 1)
    ]
    try:
        yield
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()


def heavy_registry() -> ToolRegistry:
    registry = register_builtins(ToolRegistry())

    @registry.tool(tier="query", idempotency="idempotent", permission="read")
    async def ingest(rows: list[dict[str, Any]], context: ToolContext) -> ToolResult:
        """Take rows of text and say how many arrived.

        Args:
            rows: the rows, each {"id", "text"}.
        """
        return ToolResult(message=f"{len(rows)} rows", data={"rows": len(rows)})

    @registry.tool(tier="query", idempotency="idempotent", permission="read")
    async def export(context: ToolContext) -> ToolResult:
        """Return every row (a result of about a megabyte)."""
        return ToolResult(message="exported", data={"text": mixed_text(ONE_MB)})

    return registry


class HeavyModel:
    """Turn 1 calls ``ingest`` with about 1.3 MB of arguments, turn 2 calls ``export``
    (a 1 MB result); every other turn, and every second step, is a short reply."""

    name = "heavy"

    def __init__(self) -> None:
        self.requests: list[CallModelInput] = []
        self.rows = [{"id": i, "text": line} for i, line in enumerate(mixed_text(1_300_000).splitlines())]

    async def complete(self, request: CallModelInput) -> CallModelResult:
        self.requests.append(request)
        last = request.messages[-1] if request.messages else None
        calls: list[ToolCall] = []
        if request.purpose == "reply" and last is not None and last.role == "user":
            if "ingest" in (last.content or ""):
                calls = [ToolCall(tool_call_id=f"in-{request.turn}", name="ingest", arguments={"rows": self.rows})]
            elif "export" in (last.content or ""):
                calls = [ToolCall(tool_call_id=f"ex-{request.turn}", name="export", arguments={})]
        content = None if calls else f"done with turn {request.turn}"
        return CallModelResult(
            message=Message(role="assistant", content=content, tool_calls=calls),
            usage=Usage(prompt_tokens=1000, completion_tokens=10),
            provider=self.name,
            model="heavy-1",
        )


@pytest.mark.timeout(900)
async def test_megabyte_arguments_results_and_a_100k_token_context_under_cpu_load_fail_no_workflow_task(
    run_worker, session_id, temporal_client, cpu_hog
):
    model = HeavyModel()
    async with run_worker(model, registry=heavy_registry(), max_cached_workflows=0, memory=False) as hermes:
        try:
            async with asyncio.timeout(600):  # a wedged session would wait here forever
                await run_heavy_turns(hermes, session_id, model)
        finally:
            failures = await workflow_task_failures(temporal_client, session_id)
    assert failures == [], failures


async def workflow_task_failures(temporal_client: Any, session_id: str) -> list[tuple[int, str, str]]:
    return [
        (event.event_id, EventType.Name(event.event_type), str(event.workflow_task_failed_event_attributes.failure.message)[:300])
        for history in await histories(temporal_client, session_id)
        for event in history.events
        if event.event_type in (EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED, EventType.EVENT_TYPE_WORKFLOW_TASK_TIMED_OUT)
    ]


async def run_heavy_turns(hermes: Any, session_id: str, model: HeavyModel) -> None:
    big = mixed_text(64_000)  # about 34k tokens each; three make a context of about 100k tokens
    first = await hermes.send_message(session_id, "please ingest these rows", user_id="u")
    assert [c.name for c in first.tool_calls] == ["ingest"]
    assert first.tool_calls[0].result.ok, first.tool_calls[0].result
    # The whole arguments reached the tool, though the session held only a stand-in.
    assert first.tool_calls[0].result.data == {"rows": len(model.rows)}
    assert first.tool_calls[0].arguments.get("kept_by_reference", "").startswith("b:")
    second = await hermes.send_message(session_id, "now export everything", user_id="u")
    assert [c.name for c in second.tool_calls] == ["export"]
    assert second.tool_calls[0].result.ok
    for n in range(3):
        reply = await hermes.send_message(session_id, f"part {n}\n{big}", user_id="u")
        assert reply.status == "completed", reply
    last = await hermes.send_message(session_id, "are you still there?", user_id="u")
    assert last.status == "completed" and last.reply == f"done with turn {last.turn}"
    assert max(r.context_tokens for r in model.requests) > 90_000, "the context never reached about 100k tokens"
