"""Large inputs (issue 5): a user message or a tool result over its size limit is kept
by reference in the content store (Redis) with a preview in the session, or refused
with a clear error; no payload ever comes near Temporal's 2 MB limit, and the session
always takes the next message."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from google.protobuf.message import Message as ProtoMessage
from temporalio.api.common.v1 import Payload
from temporalio.client import Client, WorkflowHistory
from temporalio.service import RPCError, RPCStatusCode

from activities.tools import ToolActivities, cap_result, idempotency_key, to_tool_result
from hermes.content.blobs import BlobStore, value_ref
from hermes.client import MAX_STORED_MESSAGE_BYTES, HermesClient, message_by_reference
from hermes.errors import MessageRejectedError
from hermes.models import CallModelInput, CallModelResult, Message, ToolCall, ToolResult, ToolResultCode
from hermes.providers.scripted import ScriptedModel
from hermes.tools.builtin import READ_MAX_CHARS, read_stored_content, register_builtins
from hermes.tools.registry import ToolContext, ToolRegistry

TEMPORAL_PAYLOAD_LIMIT_BYTES = 2 * 1024 * 1024
REF_IN_PREVIEW = re.compile(r"kept by reference as (b:[0-9a-f]{32})")
MIXED_TEXT = "长文 Ünïcödé 🌏👩‍👩‍👧 <|endoftext|> \"quoted\" \\ tab\t"


def mixed_text(min_bytes: int) -> str:
    """Numbered lines of CJK, emoji, quotes and control characters, at least ``min_bytes``
    of UTF-8 (every line different, so that a wrong slice cannot match by chance)."""
    lines, size, n = [], 0, 0
    while size < min_bytes:
        line = f"{n:07d} {MIXED_TEXT}\n"
        lines.append(line)
        size += len(line.encode("utf-8"))
        n += 1
    return "".join(lines)


def payloads_of(message: Any) -> list[Payload]:
    """Every ``Payload`` inside a protobuf message (fields, lists and maps, recursively)."""
    if isinstance(message, Payload):
        return [message]
    found: list[Payload] = []
    for field, value in message.ListFields():
        if field.type != field.TYPE_MESSAGE:
            continue
        if field.message_type.GetOptions().map_entry:
            items = [v for v in value.values() if hasattr(v, "ListFields")]
        elif isinstance(value, ProtoMessage):
            items = [value]
        else:  # a repeated field
            items = list(value)
        for item in items:
            found += payloads_of(item)
    return found


async def histories(temporal_client: Client, session_id: str) -> list[WorkflowHistory]:
    """The histories of every run of a session, newest first (back through continue-as-new)."""
    runs = []
    run_id: str | None = None
    while True:
        history = await temporal_client.get_workflow_handle(session_id, run_id=run_id).fetch_history()
        runs.append(history)
        run_id = history.events[0].workflow_execution_started_event_attributes.continued_execution_run_id or None
        if run_id is None:
            return runs


async def assert_history_payloads_small(temporal_client: Client, session_id: str) -> None:
    """No event payload of any run reaches 2 MB, nor do all of them together: the large
    input never entered history, not even in pieces."""
    sizes = [
        payload.ByteSize()
        for history in await histories(temporal_client, session_id)
        for event in history.events
        for payload in payloads_of(event)
    ]
    assert sizes, "no payloads found: the history walk is broken"
    assert max(sizes) < TEMPORAL_PAYLOAD_LIMIT_BYTES
    assert sum(sizes) < TEMPORAL_PAYLOAD_LIMIT_BYTES, f"{sum(sizes)} bytes of payloads in history"


class Recorded(ScriptedModel):
    """The scripted model, noting the largest request it was sent."""

    largest_request_bytes = 0

    async def complete(self, request: CallModelInput) -> CallModelResult:
        self.largest_request_bytes = max(self.largest_request_bytes, len(request.model_dump_json().encode("utf-8")))
        return await super().complete(request)


TWO_REPLIES = {"turns": [{"steps": [{"reply": "I have the long text."}]}, {"steps": [{"reply": "And this one."}]}]}


# ------------------------------------------------------------------ user messages


async def test_a_3_mb_message_is_kept_by_reference_and_the_session_takes_the_next_message(
    run_worker, session_id, temporal_client
):
    text = mixed_text(3 * 1024 * 1024)
    size = len(text.encode("utf-8"))
    model = Recorded.from_dict(TWO_REPLIES)
    async with run_worker(model) as hermes:
        limit = hermes.config.max_message_bytes
        first = await hermes.send_message(session_id, text, user_id="alice")
        assert (first.status, first.reply) == ("completed", "I have the long text.")
        second = await hermes.send_message(session_id, "a short one", user_id="alice")
        assert (second.status, second.reply) == ("completed", "And this one.")

        users = [m for m in await hermes.get_transcript(session_id) if m.role == "user"]
        assert [m.content for m in users][1:] == ["a short one"]
        preview = users[0].content or ""
        assert len(preview.encode("utf-8")) <= limit
        assert f"message of {size} bytes" in preview and text[:1000] in preview
        (ref,) = REF_IN_PREVIEW.findall(preview)
        assert ref == value_ref(text)
        stored = await hermes.get_stored_content(ref)
        assert stored is not None and stored.encode("utf-8") == text.encode("utf-8")
        assert (await hermes.get_state(session_id)).turn_count == 2
    assert model.largest_request_bytes < 200_000
    await assert_history_payloads_small(temporal_client, session_id)


async def test_a_3_mb_message_from_a_client_without_redis_is_refused_naming_its_size_and_the_session_goes_on(
    run_worker, session_id, temporal_client
):
    text = "refused: " + mixed_text(3 * 1024 * 1024)
    size = len(text.encode("utf-8"))
    async with run_worker(Recorded.from_dict(TWO_REPLIES)) as hermes:
        without_redis = HermesClient(temporal_client, task_queue=hermes.task_queue)
        limit = without_redis.config.max_message_bytes
        expected = rf"the message is {size} bytes; the limit is {limit} bytes .*Redis"

        # A new session: refused before anything is sent, so no session exists.
        with pytest.raises(MessageRejectedError, match=expected):
            await without_redis.send_message(f"{session_id}-new", text)
        with pytest.raises(RPCError) as raised:
            await temporal_client.get_workflow_handle(f"{session_id}-new").describe()
        assert raised.value.status == RPCStatusCode.NOT_FOUND

        # An existing session: refused, nothing recorded, and it takes the next message.
        assert (await without_redis.send_message(session_id, "hello")).reply == "I have the long text."
        with pytest.raises(MessageRejectedError, match=expected):
            await without_redis.send_message(session_id, text)
        assert (await without_redis.send_message(session_id, "still there?")).reply == "And this one."
        users = [m.content for m in await hermes.get_transcript(session_id) if m.role == "user"]
        assert users == ["hello", "still there?"]
        assert await hermes.get_stored_content(value_ref(text)) is None


async def test_a_message_over_the_hard_cap_is_refused_even_with_redis_and_nothing_is_stored(
    run_worker, session_id, temporal_client, redis
):
    text = "x" * (MAX_STORED_MESSAGE_BYTES + 1)
    async with run_worker(Recorded.from_dict(TWO_REPLIES)) as hermes:
        with pytest.raises(MessageRejectedError, match=rf"{MAX_STORED_MESSAGE_BYTES + 1} bytes; .*64 MB"):
            await hermes.send_message(session_id, text)
    assert await redis.exists(f"hermes:blob:{value_ref(text)}") == 0
    with pytest.raises(RPCError) as raised:
        await temporal_client.get_workflow_handle(session_id).describe()
    assert raised.value.status == RPCStatusCode.NOT_FOUND


@pytest.mark.parametrize("limit", [300, 2_000, 256 * 1024])
def test_the_preview_standing_for_a_message_always_fits_the_limit(limit):
    text = ("🌏\"长" * 20_000) + "the end"
    preview, stored = message_by_reference(text, max_message_bytes=limit)
    assert len(preview.encode("utf-8")) <= limit
    assert stored.ref == value_ref(text) and stored.ref in preview
    assert stored.size_bytes == len(text.encode("utf-8"))
    assert preview.endswith(stored.preview)
    if limit >= 2_000:  # room for a head and a tail: both shown, around the marker
        head, marker, tail = stored.preview.partition("\n[... ")
        assert marker and text.startswith(head) and tail.endswith("]\n" + text[-len(tail.partition("]\n")[2]) :])
        assert tail.endswith("the end")


def test_a_limit_too_small_for_any_preview_refuses_the_message_clearly():
    with pytest.raises(MessageRejectedError, match="too small even for a preview"):
        message_by_reference("x" * 10_000, max_message_bytes=50)


# ------------------------------------------------------------------ tool results


def log_lines(min_bytes: int) -> list[str]:
    return mixed_text(min_bytes).splitlines()


def logs_registry(lines: list[str], runs: list[str] | None = None) -> ToolRegistry:
    registry = register_builtins(ToolRegistry())

    def dump_logs() -> dict[str, Any]:
        """Every line of the service's logs."""
        return {"service": "billing", "lines": lines}

    def export_logs() -> dict[str, Any]:
        """Export the logs (a side effect: runs at most once)."""
        if runs is not None:
            runs.append("export")
        return {"exported": lines}

    registry.register(dump_logs)
    registry.register(export_logs, idempotent=False, permission="read")
    return registry


class ReadsTheMiddle:
    """A scripted stand-in for a model: calls the tool named in the user message, then
    reads ``length`` characters from the middle of the result kept by reference, then
    answers; any other message gets a plain answer."""

    name = "test"

    def __init__(self, length: int = 1000) -> None:
        self.length = length
        self.largest_request_bytes = 0
        self.reads: list[dict[str, Any]] = []
        self.previews: list[dict[str, Any]] = []

    async def complete(self, request: CallModelInput) -> CallModelResult:
        self.largest_request_bytes = max(self.largest_request_bytes, len(request.model_dump_json().encode("utf-8")))
        last = request.messages[-1]

        def say(content: str | None = None, calls: list[ToolCall] | None = None) -> CallModelResult:
            return CallModelResult(message=Message(role="assistant", content=content, tool_calls=calls or []), provider=self.name)

        if last.role == "user":
            tool = next((t for t in ("dump_logs", "export_logs") if t in (last.content or "")), None)
            if tool is None:
                return say(f"answer {request.turn}")
            return say(calls=[ToolCall(tool_call_id=f"t{request.turn}", name=tool)])
        result = json.loads(last.content or "{}")
        if last.name == "read_stored_content":
            self.reads.append(result)
            return say("read the middle")
        self.previews.append(result)
        data = result["data"]
        arguments = {"ref": data["ref"], "offset": data["size_chars"] // 2, "length": self.length}
        return say(calls=[ToolCall(tool_call_id=f"r{request.turn}", name="read_stored_content", arguments=arguments)])


async def test_a_6_mb_tool_result_is_kept_by_reference_and_the_model_reads_its_middle(
    run_worker, session_id, temporal_client
):
    lines = log_lines(6 * 1024 * 1024)
    model = ReadsTheMiddle(length=1000)
    async with run_worker(model, registry=logs_registry(lines)) as hermes:
        turn = await hermes.send_message(session_id, "dump_logs please")
        assert (turn.status, turn.reply) == ("completed", "read the middle")
        dump, read = turn.tool_calls
        assert dump.name == "dump_logs" and dump.result.ok
        data = dump.result.data
        assert data["truncated"] is True and data["size_bytes"] > 6 * 1024 * 1024
        assert data["ref"] in dump.result.message and "read_stored_content" in dump.result.message

        # The whole result, byte for byte, is in the store under the reference.
        whole = await hermes.get_stored_content(data["ref"])
        assert whole is not None and len(whole.encode("utf-8")) == data["size_bytes"] and len(whole) == data["size_chars"]
        assert json.loads(whole)["data"] == {"service": "billing", "lines": lines}

        # The model saw the preview, its head and its tail (the log's last line), then the
        # middle slice it asked for.
        assert model.previews[0]["data"]["ref"] == data["ref"]
        preview = model.previews[0]["data"]["preview"]
        assert preview.startswith('{"service":"billing","lines":["') and preview.endswith(whole[-300:-1])
        head = preview.partition("\n[... ")[0]
        assert f"offset={whole.index(head) + len(head)}, length=8000" in preview  # where the cut starts
        middle = data["size_chars"] // 2
        assert read.name == "read_stored_content" and read.result.ok
        assert model.reads[0]["data"]["text"] == whole[middle : middle + 1000] == read.result.data["text"]
        assert model.reads[0]["data"]["more"] is True and model.reads[0]["data"]["next_offset"] == middle + 1000
        assert model.largest_request_bytes < 200_000

        tool_messages = [m for m in await hermes.get_transcript(session_id) if m.role == "tool"]
        assert all(len(m.content or "") < 16_000 for m in tool_messages)
        assert json.loads(tool_messages[0].content or "")["data"]["ref"] == data["ref"]

        nxt = await hermes.send_message(session_id, "thanks")
        assert (nxt.status, nxt.reply) == ("completed", "answer 2")
    await assert_history_payloads_small(temporal_client, session_id)


async def test_a_large_result_of_a_tool_that_runs_at_most_once_is_recorded_by_reference(
    run_worker, session_id, temporal_client, redis
):
    runs: list[str] = []
    lines = log_lines(3 * 1024 * 1024)
    model = ReadsTheMiddle(length=500)
    async with run_worker(model, registry=logs_registry(lines, runs)) as hermes:
        turn = await hermes.send_message(session_id, "export_logs now")
        assert turn.reply == "read the middle" and runs == ["export"]
        data = turn.tool_calls[0].result.data
        whole = await hermes.get_stored_content(data["ref"])
        assert whole is not None and json.loads(whole)["data"] == {"exported": lines}
        assert turn.tool_calls[1].result.data["text"] == whole[len(whole) // 2 : len(whole) // 2 + 500]
        # The exactly-once record holds the small result that names the reference.
        keys = [k async for k in redis.scan_iter(match=idempotency_key(f"{session_id}:*"))]
        assert len(keys) == 1
        record = await redis.get(keys[0])
        assert len(record) < 64_000 and json.loads(record)["result"]["data"]["ref"] == data["ref"]
        assert (await hermes.send_message(session_id, "ok")).reply == "answer 2"
    await assert_history_payloads_small(temporal_client, session_id)


async def test_a_large_result_with_redis_is_kept_whole_and_its_preview_fits_the_model(redis):
    registry = register_builtins(ToolRegistry())
    result = to_tool_result({"rows": ['"quoted" \\ ' + MIXED_TEXT] * 20_000})
    bounded = await ToolActivities(registry, redis, tier_seconds=lambda tier: 15.0).bounded(result)
    ref = bounded.data["ref"]
    assert ref == value_ref(result.model_dump_json())
    assert (await BlobStore(redis).get_many([ref]))[ref] == result.model_dump_json()
    assert len(bounded.model_dump_json()) < 12_500 and bounded.data["preview"].startswith('{"rows":["\\"quoted\\"')
    small = to_tool_result({"rows": [1, 2, 3]})
    assert await ToolActivities(registry, redis, tier_seconds=lambda tier: 15.0).bounded(small) == small


class BrokenRedis:
    """A Redis whose every command fails (a store outage)."""

    def pipeline(self, **kwargs: Any) -> Any:
        raise ConnectionError("redis is down")


@pytest.mark.parametrize("store", [None, BrokenRedis()], ids=["no redis", "redis down"])
async def test_a_large_result_without_a_working_store_is_a_preview_that_says_the_rest_is_not_kept(store):
    registry = register_builtins(ToolRegistry())
    result = to_tool_result({"rows": [MIXED_TEXT] * 20_000})
    bounded = await ToolActivities(registry, store, tier_seconds=lambda tier: 15.0).bounded(result)
    assert bounded.ok and bounded.data["truncated"] is True and "ref" not in bounded.data
    assert "the rest is not kept" in bounded.message and "result truncated" in bounded.message
    assert len(bounded.model_dump_json().encode("utf-8")) < 64_000
    assert bounded == cap_result(result, 64_000)


# ------------------------------------------------------------------ read_stored_content


@pytest.fixture
def context(redis) -> ToolContext:
    return ToolContext(session_id="s", user_id="u", tool_call_id="c", turn=1, redis=redis)


async def stored(redis: Any, text: str) -> str:
    ref = value_ref(text)
    await BlobStore(redis).put_many({ref: text})
    return ref


@pytest.mark.parametrize(
    "ref", ["", "b:", "b:xyz", "m:" + "0" * 32, "b:" + "0" * 31, "b:" + "0" * 33, "B:" + "a" * 32, "b:" + "G" * 32]
)
async def test_reading_a_malformed_reference_is_a_bad_argument_naming_it(context, ref):
    result = await read_stored_content(ref, context)
    assert result.code == ToolResultCode.BAD_ARGUMENTS
    assert repr(ref) in result.message and '"b:" followed by 32' in result.message


async def test_reading_an_unknown_reference_is_a_bad_argument_naming_it(context):
    ref = "b:" + "0123456789abcdef" * 2
    result = await read_stored_content(ref, context)
    assert result.code == ToolResultCode.BAD_ARGUMENTS and ref in result.message


async def test_stored_content_is_read_in_slices_of_characters_not_bytes(context, redis):
    text = "🌏长\"é👩‍👩‍👧" * 10 + "末尾"
    ref = await stored(redis, text)
    first = await read_stored_content(ref, context, offset=3, length=5)
    assert first.ok and first.data["text"] == text[3:8]
    assert (first.data["more"], first.data["next_offset"]) == (True, 8)
    assert (first.data["total_chars"], first.data["total_bytes"]) == (len(text), len(text.encode("utf-8")))
    last = await read_stored_content(ref, context, offset=len(text) - 2, length=100)
    assert (last.data["text"], last.data["more"], last.data["next_offset"]) == ("末尾", False, None)

    pieces, offset = [], 0
    while True:
        piece = (await read_stored_content(ref, context, offset=offset, length=7)).data
        pieces.append(piece["text"])
        if not piece["more"]:
            break
        offset = piece["next_offset"]
    assert "".join(pieces) == text and len(pieces) == -(-len(text) // 7)


async def test_a_slice_of_quote_heavy_content_stays_readable_by_the_model(context, redis):
    text = '"' * 30_000
    ref = await stored(redis, text)
    result = await read_stored_content(ref, context, offset=0, length=READ_MAX_CHARS)
    assert result.ok and 0 < len(result.data["text"]) < READ_MAX_CHARS
    assert result.data["next_offset"] == len(result.data["text"])
    assert len(result.model_dump_json()) < 16_000


@pytest.mark.parametrize(
    ("offset", "length", "field"), [(-1, 10, "offset"), (11, 10, "offset"), (0, 0, "length"), (0, READ_MAX_CHARS + 1, "length")]
)
async def test_an_offset_or_length_out_of_range_is_a_bad_argument(context, redis, offset, length, field):
    ref = await stored(redis, "0123456789")
    result = await read_stored_content(ref, context, offset=offset, length=length)
    assert result.code == ToolResultCode.BAD_ARGUMENTS and result.message.startswith(f"{field}: ")


async def test_reading_at_the_very_end_returns_nothing_more(context, redis):
    ref = await stored(redis, "0123456789")
    result = await read_stored_content(ref, context, offset=10)
    assert result.ok and (result.data["text"], result.data["more"]) == ("", False)


async def test_read_stored_content_is_a_read_only_idempotent_query_tool():
    tool = register_builtins(ToolRegistry()).get("read_stored_content")
    assert (tool.permission, tool.idempotency, tool.tier) == ("read", "idempotent", "query")
    assert tool.parameters_schema["required"] == ["ref"]
    assert "kept by" in tool.description


def test_a_result_kept_by_reference_is_still_one_code_message_data_object():
    capped = cap_result(ToolResult(data="x" * 100_000), 64_000, ref="b:" + "1" * 32)
    assert set(json.loads(capped.model_dump_json())) == {"code", "message", "data"}
