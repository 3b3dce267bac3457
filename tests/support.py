"""Helpers shared by the tests: polling for a condition, the histories of a session's runs."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from temporalio.client import Client, WorkflowHistory

T = TypeVar("T")


async def eventually(
    probe: Callable[[], Awaitable[T]],
    *,
    what: str = "the condition",
    timeout_seconds: float = 60.0,
    poll_seconds: float = 0.05,
) -> T:
    """Poll ``probe`` until it returns something truthy (and return that); fail with an
    AssertionError naming ``what`` after ``timeout_seconds``. No fixed sleeps in tests."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_seconds
    while True:
        value = await probe()
        if value:
            return value
        if loop.time() > deadline:
            raise AssertionError(f"timed out after {timeout_seconds} s waiting for {what}; last value {value!r}")
        await asyncio.sleep(poll_seconds)


async def run_histories(client: Client, session_id: str, first_run_id: str) -> list[WorkflowHistory]:
    """The histories of every run of a session, first to last, by following the
    continued-as-new chain from its first run (``SessionState.chain_id``)."""
    histories: list[WorkflowHistory] = []
    run_id: str | None = first_run_id
    while run_id:
        history = await client.get_workflow_handle(session_id, run_id=run_id).fetch_history()
        histories.append(history)
        last = history.events[-1]
        run_id = (
            last.workflow_execution_continued_as_new_event_attributes.new_execution_run_id
            if last.HasField("workflow_execution_continued_as_new_event_attributes")
            else None
        )
    return histories


def raw_insert(store: Any, c: Any, *, updated_at: Any, mentions: int = 1, valid_until: Any = None) -> str:
    """Insert memory candidate ``c`` as an active row without the write path (no dedupe,
    no conflict check), as two sessions writing at the same moment could leave it."""
    row = store.new_row(c, c.text, store.embedder.embed_passages([c.text])[0], updated_at)
    row.update(created_at=c.created_at, mentions=mentions, valid_until=valid_until)
    store.insert_rows([row])
    return c.candidate_id


def decoded_history(history_json: str) -> str:
    """The history's JSON plus every payload decoded (payload data is base64 in it)."""
    texts = [history_json]

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if isinstance(node.get("data"), str) and isinstance(node.get("metadata"), dict):
                try:
                    texts.append(base64.b64decode(node["data"]).decode("utf-8", "replace"))
                except ValueError:
                    pass
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(json.loads(history_json))
    return "\n".join(texts)


def signed(command: str, session_id: str, payload: Any, sender: str = "anonymous", roles: tuple[str, ...] = ()) -> Any:
    """``payload`` with a proof (:mod:`hermes.security.command_auth`) by this process' command key
    that ``sender`` sends ``command``: what a Hermes client attaches to each command."""
    from hermes.security import command_auth

    return command_auth.signed(payload, command, session_id, sender=sender, roles=roles)

