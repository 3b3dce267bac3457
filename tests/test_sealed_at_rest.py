"""What the README's "Encryption at rest" says is sealed is sealed (issue 26, item 3).

With a key ring active, one session carries a unique marker in each place user content
goes: the message, an HTTP tool's URL path and query string (both built from arguments,
examples/tools/weather.yaml against a local endpoint), the JSON body and result of a write
tool that waits for an approval (so the approval audit is written), a non-idempotent
built-in (so the exactly-once ledger keeps its result), an MCP tool over stdio, and the
approvals' reasons. Then no marker is found in any Redis key or value, in Redis' append-only
file (this test's own Redis, in its own directory), in any log record of any logger at
DEBUG, nor in the session's raw history (payload bytes base64-decoded, not decrypted).
The suite's real Temporal, a real Redis, worker, MCP server and HTTP endpoint."""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import os
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis
from pydantic import SecretStr
from temporalio.client import Client

from hermes.security import encryption
from hermes.client import HermesClient
from hermes.infra.durable import DurableStore
from hermes.errors import SessionNotFoundError
from hermes.mcp.config import parse_mcp_config
from hermes.mcp.manager import McpManager
from hermes.mcp.tools import McpToolset
from hermes.settings import Settings
from hermes.infra.stack import EmbeddedStack, free_port
from hermes.tools.files import register_tool_file
from tests.conftest import builtin_registry
from tests.support import decoded_history, eventually
from tests.test_mcp_session import results_json
from tests.test_secret_scan import files_text, redis_text
from tests.test_tool_files import EXAMPLE, Endpoint, endpoint  # noqa: F401 - endpoint: the fixture
from tests.test_tool_layer import Steps
from worker import build_worker

KEYS = f"k1:{base64.b64encode(b'k' * 32).decode()}"
NORMAL = Path(__file__).resolve().parent / "mcp_servers" / "normal.py"


async def find_order(order: str) -> dict[str, Any]:
    """Look an order up by its reference."""
    raise LookupError(f"no order {order} in this shop")  # an error quoting its argument


def marker(place: str) -> str:
    """A marker no other test writes: letters and digits only, so it looks the same
    URL-encoded, JSON-escaped and in a query string."""
    return f"mk{place}{uuid.uuid4().hex[:12]}"


@pytest.fixture
async def own_redis(tmp_path: Path) -> AsyncIterator[tuple[Any, Path]]:
    """A Redis of this test alone (appendonly yes, in its own directory): the client and
    the directory its append-only file is in."""
    stack = EmbeddedStack(tmp_path / "redis", start_temporal=False, redis_port=free_port(), ui=False)
    await stack.start_async()
    client = aioredis.Redis.from_url(stack.redis_url)
    try:
        yield client, tmp_path / "redis"
    finally:
        await client.aclose()
        await stack.stop_async()


@pytest.fixture
def keyring_off_after() -> Iterator[None]:
    yield
    encryption.activate(None)


async def approve_each(hermes: HermesClient, session_id: str, count: int, reason: str) -> None:
    """Approve ``count`` tool calls of ``session_id`` one after another, as they come."""
    decided: set[str] = set()
    while len(decided) < count:

        async def undecided() -> Any:
            try:
                pending = [p for p in await hermes.get_pending_approvals(session_id) if p.tool_call_id not in decided]
            except SessionNotFoundError:
                return None  # the message that starts the session is still on its way
            return pending[0] if pending else None

        pending = await eventually(undecided, what="a pending approval")
        await hermes.approve(session_id, pending.tool_call_id, approver="alice", reason=reason)
        decided.add(pending.tool_call_id)


@pytest.mark.timeout(240)
async def test_no_message_argument_or_result_is_in_redis_its_aof_the_logs_or_the_raw_history_with_encryption_on(
    endpoint: Endpoint, own_redis: tuple[Any, Path], temporal_client: Client, settings: Settings, session_id: str,
    caplog: pytest.LogCaptureFixture, keyring_off_after: None,
) -> None:
    caplog.set_level(logging.DEBUG)
    redis, redis_dir = own_redis
    markers = {place: marker(place) for place in ("message", "path", "query", "body", "note", "mcp", "reason", "failure")}
    ring = encryption.keyring_from_settings(settings.model_copy(update={"encryption_keys": SecretStr(KEYS)}))
    encryption.activate(ring)
    client = Client(temporal_client.service_client, namespace=temporal_client.namespace,
                    data_converter=encryption.data_converter(ring))
    registry = builtin_registry()
    register_tool_file(registry, EXAMPLE)
    registry.register(find_order, idempotent=True)
    config = parse_mcp_config(
        {"mcpServers": {"local": {"command": sys.executable, "args": [str(NORMAL)], "idempotency": "idempotent"}}},
        environ=dict(os.environ),
    )
    manager = McpManager(config, environ=dict(os.environ))
    model = Steps(
        [("get_weather", {"city": markers["path"]}), ("get_forecast", {"city": markers["query"], "days": 2}),
         ("local_echo", {"text": markers["mcp"]}), ("find_order", {"order": markers["failure"]})],
        [("subscribe_weather_alert", {"city": markers["body"], "kinds": ["storm"]})],
        [("save_note", {"title": "groceries", "text": markers["note"]})],
        results_json,
    )
    try:
        worker = build_worker(client, settings, provider=model,
                              registry=registry, redis=redis, memory=False,
                              mcp=McpToolset(config, manager, reserved=set(registry.names())))
        async with worker:
            hermes = HermesClient(client, task_queue=settings.task_queue, redis=redis,
                                  durable=DurableStore(settings.resolved_memory_uri))
            turn = asyncio.ensure_future(hermes.send_message(session_id, f"plan {markers['message']}", user_id="alice"))
            await approve_each(hermes, session_id, 2, reason=f"ok {markers['reason']}")
            result = await asyncio.wait_for(turn, 120)
            audit = await hermes.get_approval_audit(session_id=session_id)
            transcript = await hermes.get_transcript(session_id)
    finally:
        await manager.aclose()

    # The markers went where they should: to the endpoint, the tools, the audit, the reply.
    assert [c.name for c in result.tool_calls] == [
        "get_weather", "get_forecast", "local_echo", "find_order", "subscribe_weather_alert", "save_note"]
    assert [c.result.ok for c in result.tool_calls] == [True, True, True, False, True, True], result.tool_calls
    assert markers["failure"] in result.tool_calls[3].result.message  # the model still sees why
    sent = json.dumps(endpoint.requests)
    assert all(markers[p] in sent for p in ("path", "query", "body"))
    assert markers["path"] in result.reply and markers["mcp"] in result.reply
    assert any(markers["body"] in json.dumps(e.arguments) for e in audit)  # read back through the seal
    assert any(markers["reason"] in (e.reason or "") for e in audit)
    assert markers["message"] in transcript[0].content

    history = await temporal_client.get_workflow_handle(session_id).fetch_history()  # no codec: ciphertext
    places = {
        "redis keys and values": await redis_text(redis),
        "redis aof and files": files_text(redis_dir).decode("utf-8", "replace"),
        "log records": caplog.text + "\n".join(repr(r.__dict__) for r in caplog.records),
        "raw history": decoded_history(history.to_json()),
    }
    assert "appendonly" in " ".join(str(p) for p in redis_dir.rglob("*"))  # the AOF is there to scan
    assert base64.b64encode(b"binary/encrypted").decode() in places["raw history"]
    found = sorted((where, place) for where, text in places.items() for place, mark in markers.items() if mark in text)
    assert found == [], found


# ------------------------------------------------------------- each store's reader


async def test_each_sealed_redis_copy_is_read_back_and_one_under_a_key_no_longer_configured_is_missing_not_an_error(
    redis: Any, keyring_off_after: None, caplog: pytest.LogCaptureFixture
) -> None:
    from datetime import datetime, timezone

    from temporalio.testing import ActivityEnvironment

    from activities.audit import read_audit, write_audit
    from activities.tools import ToolActivities, idempotency_key
    from activities.transcript import SNAPSHOT_KEY, TranscriptActivities, read_archive, read_snapshot
    from hermes.models import (
        ApprovalAuditEntry, ArchiveMessagesInput, Message, RunToolInput, SessionCarry, SnapshotInput, ToolCall,
        ToolResultCode,
    )
    from hermes.tools.registry import ToolRegistry

    secret = marker("store")
    session = f"s-{uuid.uuid4().hex[:8]}"
    runs: list[str] = []

    def send_payment(memo: str) -> dict[str, Any]:
        """Send a payment (runs at most once)."""
        runs.append(memo)
        return {"paid": memo}

    registry = ToolRegistry()
    registry.register(send_payment, idempotent=False)
    tools = ToolActivities(registry, redis, tier_seconds=lambda tier: 15.0)
    call = RunToolInput(session_id=session, user_id="u", turn=1, chain_id="c", idempotent=False,
                        tool_call=ToolCall(tool_call_id="t1", name="send_payment", arguments={"memo": secret}))
    entry = ApprovalAuditEntry(entry_id="e1", session_id=session, tool_call_id="t1", tool_name="send_payment",
                               event="requested", at=datetime.now(timezone.utc), arguments={"memo": secret})
    carry = SessionCarry(messages=[Message(role="user", content=secret)], title=secret)

    encryption.activate(encryption.parse_keys(KEYS, source="test", separator=","))
    assert (await ActivityEnvironment().run(tools.run_tool, call)).data == {"paid": secret}
    await write_audit(redis, entry)
    transcript = TranscriptActivities(redis)
    await transcript.archive_messages(ArchiveMessagesInput(session_id=session, chain_id="c", first_index=0,
                                                           messages=carry.messages))
    await transcript.save_snapshot(SnapshotInput(session_id=session, carry=carry))

    assert secret not in await redis_text(redis)
    assert await read_audit(redis, session_id=session) == [entry]
    assert [e for e in await read_audit(redis, limit=100_000) if e.session_id == session] == [entry]
    assert await read_archive(redis, session, "c") == carry.messages
    assert await read_snapshot(redis, session) == carry
    again = await ActivityEnvironment().run(tools.run_tool, call)
    assert again.data == {"paid": secret} and runs == [secret]  # the sealed ledger answered

    other = base64.b64encode(b"o" * 32).decode()
    encryption.activate(encryption.parse_keys(f"k2:{other}", source="test", separator=","))
    caplog.set_level(logging.WARNING, logger="hermes")
    assert await read_audit(redis, session_id=session) == []
    assert [e for e in await read_audit(redis, limit=100_000) if e.session_id == session] == []
    assert await read_archive(redis, session, "c") == []
    assert await read_snapshot(redis, session) is None
    unknown = await ActivityEnvironment().run(tools.run_tool, call)
    assert unknown.code == ToolResultCode.OUTCOME_UNKNOWN and runs == [secret]  # never run twice
    assert "cannot be decrypted here" in caplog.text and secret not in caplog.text
    assert await redis.exists(SNAPSHOT_KEY.format(session_id=session), idempotency_key(call.call_key)) == 2


def test_library_log_lines_keep_their_constant_words_and_lose_tool_call_content(
    caplog: pytest.LogCaptureFixture, keyring_off_after: None
) -> None:
    from hermes.security import redaction

    secret = marker("log")
    caplog.set_level(logging.DEBUG)
    request_line = 'HTTP Request: %s %s "%s %d %s"'
    with redaction.request_shown_as("${API}/orders/{order}"):  # always, encryption or not
        logging.getLogger("httpx2").info(request_line, "GET", f"https://api/orders/{secret}?q={secret}", "HTTP/1.1", 200, "OK")
        logging.getLogger("httpcore2.http11").debug(f"receive_response_headers.complete return_value=[(b'x', b'{secret}')]")
    logging.getLogger("httpx2").info(request_line, "POST", "https://model/v1/chat/completions", "HTTP/1.1", 200, "OK")
    logging.getLogger("openai._base_client").debug("Request options: %s", {"messages": [secret]})
    assert 'HTTP Request: GET ${API}/orders/{order} "HTTP/1.1 200 OK"' in caplog.text
    assert "receive_response_headers.complete (details withheld" in caplog.text
    assert "https://model/v1/chat/completions" in caplog.text  # outside a tool request: as it was
    assert f"Request options: {{'messages': ['{secret}']}}" in caplog.text  # encryption off: as it was
    caplog.clear()

    encryption.activate(encryption.parse_keys(KEYS, source="test", separator=","))
    logging.getLogger("openai._base_client").debug("Request options: %s", {"messages": [secret]})
    logging.getLogger("mcp.client.stdio").debug(f"Received message: {secret}")
    try:
        raise LookupError(f"no order {secret}")
    except LookupError:
        logging.getLogger("temporalio.activity").warning("Completing activity as failed", exc_info=True)
    assert secret not in caplog.text and "Request options: (details withheld" in caplog.text
    assert "Received (details withheld" in caplog.text
    assert "Completing activity as failed" in caplog.text and "LookupError (message withheld" in caplog.text
