"""The codec server (``hermes codec-server``): the Web UI sees the messages behind the
content references of model calls.

A real HTTP server on a free port (uvicorn in the test's loop), the real Redis fixture
as the content store, payloads made by the data converter the workers use, and one
real session whose workflow history is decoded.
"""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx2 as httpx
import pytest
import pytest_asyncio
from google.protobuf import json_format
from temporalio.api.enums.v1 import EventType
from temporalio.contrib.pydantic import pydantic_data_converter

from hermes import names
from hermes.blobs import BlobStore, body_json, message_ref, value_ref
from hermes.codec_server import CONTENT_CAP_BYTES, MISSING, default_ui_origins, running_codec_server
from hermes.models import CallModelInput, Message, ToolSpec
from hermes.stack import EmbeddedStack, free_port
from worker import connect_redis

UI_ORIGIN = "http://localhost:8233"


def wire(value: Any) -> dict[str, Any]:
    """``value`` as the Web UI sends it: the proto3 JSON of the payload the workers write."""
    (payload,) = pydantic_data_converter.payload_converter.to_payloads([value])
    return json_format.MessageToDict(payload)


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def data_of(payload: dict[str, Any]) -> Any:
    return json.loads(base64.b64decode(payload["data"]))


def messages(*texts: str) -> list[Message]:
    tag = uuid.uuid4().hex  # unique bodies, so no other test's entries are found
    roles = ["system", "user", "assistant"]
    return [Message(role=roles[i % 3], content=f"{text} [{tag}]", turn=1) for i, text in enumerate(texts)]


def tool_list() -> list[dict[str, Any]]:
    spec = ToolSpec(
        name=f"lookup_{uuid.uuid4().hex[:8]}",
        description="Looks something up.",
        parameters={"type": "object", "properties": {"q": {"type": "string"}}},
    )
    return [spec.model_dump(mode="json")]


async def store_messages(store: BlobStore, items: list[Message]) -> list[str]:
    await store.put_many({message_ref(m): body_json(m) for m in items})
    return [message_ref(m) for m in items]


async def store_tools(store: BlobStore, tools: list[dict[str, Any]]) -> str:
    ref = value_ref(tools)
    await store.put_many({ref: json.dumps(tools)})
    return ref


@pytest.fixture
def store(redis: Any) -> BlobStore:
    return BlobStore(redis)


@pytest_asyncio.fixture
async def codec(store: BlobStore) -> AsyncIterator[httpx.AsyncClient]:
    """A client of a codec server on a free port, reading the real Redis."""
    async with running_codec_server(
        store, host="127.0.0.1", port=free_port(), ui_origins=default_ui_origins(8233)
    ) as url:
        async with httpx.AsyncClient(base_url=url, timeout=30.0) as client:
            yield client


async def decode(client: httpx.AsyncClient, payloads: list[dict[str, Any]], path: str = "/decode") -> list[dict[str, Any]]:
    response = await client.post(path, json={"payloads": payloads}, headers={"X-Namespace": "default"})
    assert response.status_code == 200, response.text
    decoded = response.json()["payloads"]
    assert len(decoded) == len(payloads)
    return decoded


# --------------------------------------------------------------------------- decode


async def test_decode_fills_messages_and_tools_from_the_content_store_in_order(codec, store):
    context = messages("You are terse.", "What is 2+2?", "4.", "And 3+3?")
    refs = await store_messages(store, context)
    tools = tool_list()
    tools_ref = await store_tools(store, tools)
    # Out of order and repeated, as a context may reference a body twice.
    order = [refs[0], refs[3], refs[1], refs[2], refs[1]]
    call = CallModelInput(session_id="s-1", turn=2, message_refs=order, tools_ref=tools_ref, step=0)

    for path in ("/decode", "/default/decode"):  # the CLI's {namespace} endpoint template too
        (decoded,) = await decode(codec, [wire(call)], path)
        value = data_of(decoded)
        by_ref = dict(zip(refs, context))
        assert value["messages"] == [json.loads(body_json(by_ref[r])) for r in order]
        assert [m["content"] for m in value["messages"]][:2] == [context[0].content, context[3].content]
        assert value["tools"] == tools
        # The rest is untouched: the references stay beside what they stand for.
        assert value["message_refs"] == order and value["tools_ref"] == tools_ref
        assert (value["session_id"], value["turn"], value["step"]) == ("s-1", 2, 0)
        assert decoded["metadata"] == wire(call)["metadata"]


async def test_a_reference_missing_from_the_store_is_flagged_in_its_place(codec, store):
    present = messages("kept")
    refs = await store_messages(store, present)
    gone = message_ref(messages("never stored")[0])
    gone_tools = value_ref(tool_list())
    call = CallModelInput(session_id="s-2", turn=1, message_refs=[gone, refs[0]], tools_ref=gone_tools)

    (decoded,) = await decode(codec, [wire(call)])

    value = data_of(decoded)
    assert value["messages"] == [{"ref": gone, "missing": MISSING}, json.loads(body_json(present[0]))]
    assert value["tools"] == {"ref": gone_tools, "missing": MISSING}


async def test_references_nested_anywhere_in_a_payload_are_filled(codec, store):
    context = messages("nested")
    refs = await store_messages(store, context)
    wrapper = {"calls": [{"input": {"message_refs": refs, "messages": []}}], "other": {"message_refs": []}}

    (decoded,) = await decode(codec, [wire(wrapper)])

    value = data_of(decoded)
    assert value["calls"][0]["input"]["messages"] == [json.loads(body_json(context[0]))]
    assert value["other"] == {"message_refs": []}  # nothing referenced, nothing added


async def test_a_value_kept_by_reference_is_shown_and_cut_at_the_cap(codec, store):
    small_text = f"a long tool result {uuid.uuid4()} " * 10
    big_text = "é" * (CONTENT_CAP_BYTES)  # 2 bytes each: twice the cap
    small_ref, big_ref = value_ref(small_text), value_ref(big_text)
    await store.put_many({small_ref: json.dumps(small_text), big_ref: json.dumps(big_text)})
    gone_ref = value_ref(f"gone {uuid.uuid4()}")
    result = {
        "small": {"truncated": True, "ref": small_ref, "preview": small_text[:20]},
        "big": {"truncated": True, "ref": big_ref, "preview": "éé"},
        "gone": {"truncated": True, "ref": gone_ref},
    }

    (decoded,) = await decode(codec, [wire(result)])

    value = data_of(decoded)
    assert value["small"] == {**result["small"], "content": small_text}
    big = value["big"]
    assert big["content"] == "é" * (CONTENT_CAP_BYTES // 2)
    assert f"{CONTENT_CAP_BYTES:,} of {2 * CONTENT_CAP_BYTES:,} bytes" in big["content_note"]
    assert big_ref in big["content_note"]
    assert value["gone"] == {**result["gone"], "missing": MISSING}


async def test_payloads_that_are_not_plain_json_or_reference_nothing_come_back_as_they_came(codec, store):
    refs = await store_messages(store, messages("real"))
    as_sent = [
        {"metadata": {"encoding": b64(b"binary/null")}},
        {"metadata": {"encoding": b64(b"binary/plain")}, "data": b64(b'{"message_refs": ["%s"]}' % refs[0].encode())},
        {"metadata": {"encoding": b64(b"json/protobuf"), "messageType": b64(b"x.Y")}, "data": b64(b"{}")},
        {"metadata": {"encoding": b64(b"json/plain")}, "data": b64(b"not json {")},
        wire({"plain": "json", "count": 3}),
        wire(CallModelInput(session_id="s-3", turn=1, message_refs=refs)),
    ]

    decoded = await decode(codec, as_sent)

    assert decoded[:5] == as_sent[:5]
    assert data_of(decoded[5])["messages"][0]["content"].startswith("real")


async def test_encode_returns_the_payloads_unchanged(codec, store):
    refs = await store_messages(store, messages("stay a reference"))
    as_sent = [wire(CallModelInput(session_id="s-4", turn=1, message_refs=refs)), {"metadata": {"encoding": b64(b"binary/null")}}]

    response = await codec.post("/encode", json={"payloads": as_sent})

    assert response.status_code == 200
    assert response.json() == {"payloads": as_sent}


@pytest.mark.parametrize(
    ("body", "named"),
    [
        (b"{not json", "not JSON"),
        (b'{"payload": []}', '"payloads" list'),
        (b'{"payloads": {"data": ""}}', '"payloads" must be a list'),
        (b'{"payloads": ["e30="]}', "payloads[0] must be an object"),
        (b'{"payloads": [{"data": "e30="}, {"metadata": "json/plain"}]}', "payloads[1] is not a Temporal Payload"),
    ],
)
async def test_a_malformed_body_is_refused_with_400_naming_the_problem(codec, body, named):
    for path in ("/decode", "/encode"):
        response = await codec.post(path, content=body, headers={"content-type": "application/json"})
        assert response.status_code == 400
        assert named in response.json()["error"]


# --------------------------------------------------------------------------- CORS


async def test_cors_preflight_is_answered_for_the_web_ui_origin_and_not_for_another(codec, store):
    preflight = {
        "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "content-type,x-namespace,authorization",
    }
    for origin in default_ui_origins(8233):
        allowed = await codec.options("/decode", headers={"Origin": origin, **preflight})
        assert allowed.status_code == 200
        assert allowed.headers["access-control-allow-origin"] == origin
        assert "POST" in allowed.headers["access-control-allow-methods"]
        allowed_headers = allowed.headers["access-control-allow-headers"].lower()
        assert all(h in allowed_headers for h in ("content-type", "x-namespace", "authorization"))

    refused = await codec.options("/decode", headers={"Origin": "http://evil.example:8233", **preflight})
    assert "access-control-allow-origin" not in refused.headers
    assert refused.status_code >= 400

    refs = await store_messages(store, messages("cors"))
    payloads = [wire(CallModelInput(session_id="s-5", turn=1, message_refs=refs))]
    answer = await codec.post("/decode", json={"payloads": payloads}, headers={"Origin": UI_ORIGIN})
    assert answer.status_code == 200
    assert answer.headers["access-control-allow-origin"] == UI_ORIGIN
    other = await codec.post("/decode", json={"payloads": payloads}, headers={"Origin": "http://evil.example"})
    assert "access-control-allow-origin" not in other.headers


# --------------------------------------------------------------------------- Redis down


async def test_with_redis_down_payloads_come_back_undecoded_with_200():
    unreachable = connect_redis(f"redis://127.0.0.1:{free_port()}/0")  # nothing listens there
    try:
        async with running_codec_server(BlobStore(unreachable), port=free_port()) as url:
            async with httpx.AsyncClient(base_url=url, timeout=30.0) as client:
                as_sent = [wire(CallModelInput(session_id="s-6", turn=1, message_refs=["m:" + "0" * 32]))]
                decoded = await decode(client, as_sent)
    finally:
        await unreachable.aclose()
    assert decoded == as_sent


# --------------------------------------------------------------------------- the embedded Web UI


async def test_the_embedded_web_ui_is_configured_to_decode_through_the_codec_server(tmp_path):
    codec_url = f"http://127.0.0.1:{free_port()}"
    stack = EmbeddedStack(
        tmp_path / "data",
        temporal_port=free_port(),
        ui_port=free_port(),
        start_redis=False,
        ui=True,
        ui_codec_endpoint=codec_url,
    )
    await stack.start_async()
    try:
        async with httpx.AsyncClient(timeout=30.0) as client:
            # The Web UI's server reads its settings from the dev server's flags.
            settings = (await client.get(f"{stack.ui_url}/api/v1/settings")).json()
    finally:
        await stack.stop_async()
    assert settings["Codec"]["Endpoint"] == codec_url


# --------------------------------------------------------------------------- a real session


SCRIPT = {"turns": [{"steps": [{"reply": "Noted."}]}, {"steps": [{"reply": "Still noted."}]}]}


async def test_the_call_model_input_in_a_real_history_decodes_to_the_users_messages(run_worker, session_id, codec):
    first = f"remember the number {uuid.uuid4().int % 10_000}"
    second = f"and the colour {uuid.uuid4().hex[:6]}"
    async with run_worker(SCRIPT) as hermes:
        assert (await hermes.send_message(session_id, first, user_id="alice")).reply == "Noted."
        assert (await hermes.send_message(session_id, second, user_id="alice")).reply == "Still noted."
        history = await hermes.client.get_workflow_handle(session_id).fetch_history()

    scheduled = [
        event.activity_task_scheduled_event_attributes
        for event in history.events
        if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
        and event.activity_task_scheduled_event_attributes.activity_type.name == names.CALL_MODEL
    ]
    assert len(scheduled) >= 2
    as_sent = [json_format.MessageToDict(p) for p in scheduled[-1].input.payloads]
    raw = data_of(as_sent[0])
    # History carries one reference to the context, not the conversation...
    assert raw.get("context_ref"), "the call_model input has no context_ref: the workflow still sends bodies"
    assert not raw.get("messages") and not raw.get("message_refs")
    assert len(json.dumps(raw)) < 1000

    (decoded,) = await decode(codec, as_sent)

    # ...and the Web UI, through the codec server, shows the real messages.
    shown = data_of(decoded)["messages"]
    assert len(shown) == len(data_of(decoded)["message_refs"]) >= 3
    contents = [m.get("content") for m in shown]
    assert first in contents and second in contents
    assert contents.index(first) < contents.index("Noted.") < contents.index(second)
    assert not [m for m in shown if m.get("missing")]
