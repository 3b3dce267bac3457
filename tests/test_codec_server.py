"""The codec server (``hermes codec-server``): the Web UI sees the messages behind the
content references of model calls.

A real HTTP server on a free port (uvicorn in the test's loop), the real Redis fixture
as the content store, payloads made by the data converter the workers use, and one
real session whose workflow history is decoded.
"""

from __future__ import annotations

import asyncio
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
from hermes.content.blobs import BLOB_KEY, BlobStore, body_json, message_ref, value_ref
from hermes.infra.stack import EmbeddedStack, free_port
from hermes.models import CallModelInput, Message, ToolSpec
from hermes.security.codec_server import (
    ANSWER_CAP_BYTES,
    BODY_CAP_BYTES,
    CONTENT_CAP_BYTES,
    MISSING,
    OMITTED,
    default_ui_origins,
    running_codec_server,
)
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


def json_payload(data: bytes) -> dict[str, Any]:
    """A ``json/plain`` payload carrying ``data`` as it is (any bytes, valid JSON or not)."""
    return {"metadata": {"encoding": b64(b"json/plain")}, "data": b64(data)}


def added_bytes(as_sent: list[dict[str, Any]], decoded: list[dict[str, Any]]) -> int:
    """How many bytes of data the answer has beyond what was sent (before base64)."""
    return sum(len(base64.b64decode(d.get("data", ""))) - len(base64.b64decode(s.get("data", ""))) for s, d in zip(as_sent, decoded))


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
        (b'{"payloads": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "nested too deeply to parse"),
        (b'{"payloads": [{"data": "e30=", "x": ' + b"[" * 900 + b"]" * 900 + b"}]}", "payloads[0] is nested more than"),
    ],
)
async def test_a_malformed_body_is_refused_with_400_naming_the_problem(codec, body, named):
    for path in ("/decode", "/encode"):
        response = await codec.post(path, content=body, headers={"content-type": "application/json"})
        assert response.status_code == 400
        assert named in response.json()["error"]


async def test_past_the_answer_cap_each_kind_of_reference_is_shown_as_omitted(codec, store):
    tag = uuid.uuid4().hex
    (big,) = messages("x" * 900_000)  # under the cap of one value; a few fill the answer's
    (big_ref,) = await store_messages(store, [big])
    (small_ref,) = await store_messages(store, messages("small"))
    tools_ref = await store_tools(store, [{"name": f"t_{tag}", "description": "d" * 900_000, "parameters": {}}])
    content = f"{tag} " + "c" * 900_000
    content_ref = value_ref(content)
    context = [f"m:{i:032x}" for i in range(25_000)]  # a 975 KB list of references
    context_ref = value_ref(context)
    await store.put_many({content_ref: content, context_ref: json.dumps(context)})
    as_sent = [
        wire({"message_refs": [big_ref] * 200}),  # 8 KB asking for 180 MB
        wire({"tools_ref": tools_ref}),
        wire({"truncated": True, "ref": content_ref}),
        wire({"context_ref": context_ref}),
        wire({"message_refs": [small_ref]}),
    ]

    decoded = await decode(codec, as_sent)

    assert added_bytes(as_sent, decoded) <= ANSWER_CAP_BYTES
    shown = data_of(decoded[0])["messages"]
    assert len(shown) == 200
    body = json.loads(body_json(big))
    count = shown.index({"ref": big_ref, "omitted": OMITTED})
    assert count >= 2 and shown[:count] == [body] * count
    assert shown[count:] == [{"ref": big_ref, "omitted": OMITTED}] * (200 - count)
    assert data_of(decoded[1])["tools"] == {"ref": tools_ref, "omitted": OMITTED}
    assert data_of(decoded[2]) == {"truncated": True, "ref": content_ref, "omitted": OMITTED}
    assert data_of(decoded[3]) == {"context_ref": context_ref, "messages": {"ref": context_ref, "omitted": OMITTED}}
    # A small value still fits after a large one did not.
    assert data_of(decoded[4])["messages"][0]["content"].startswith("small")


async def test_a_message_body_or_tool_list_over_the_value_cap_is_shown_as_omitted_with_its_size(codec, store):
    (huge,) = messages("h" * CONTENT_CAP_BYTES)
    (huge_ref,) = await store_messages(store, [huge])
    huge_tools = [{"name": f"t_{uuid.uuid4().hex}", "description": "d" * CONTENT_CAP_BYTES, "parameters": {}}]
    tools_ref = await store_tools(store, huge_tools)

    (decoded,) = await decode(codec, [wire({"message_refs": [huge_ref], "tools_ref": tools_ref})])

    value = data_of(decoded)
    for ref, shown, size in [
        (huge_ref, value["messages"][0], len(body_json(huge).encode())),
        (tools_ref, value["tools"], len(json.dumps(huge_tools))),
    ]:
        assert set(shown) == {"ref", "omitted"} and shown["ref"] == ref
        assert f"{size:,} bytes" in shown["omitted"] and BLOB_KEY.format(ref=ref) in shown["omitted"]


async def test_a_value_kept_by_reference_too_large_to_read_whole_is_shown_from_its_first_bytes(codec, store):
    text = "é" * 8_500_000  # 17 MB stored, more than one answer reads
    ref = value_ref(f"huge {uuid.uuid4()}")
    await store.put_many({ref: text})
    try:
        (decoded,) = await decode(codec, [wire({"truncated": True, "ref": ref})])
    finally:
        await store.redis.delete(BLOB_KEY.format(ref=ref))

    value = data_of(decoded)
    assert value["content"] == "é" * (CONTENT_CAP_BYTES // 2)
    assert f"{CONTENT_CAP_BYTES:,} of {2 * len(text):,} bytes" in value["content_note"]


async def test_a_payload_whose_references_do_not_fit_even_as_markers_comes_back_as_it_came(codec, store):
    refs = await store_messages(store, messages("still shown"))
    unknown = [f"m:{i:032x}" for i in range(60_000)]  # 60,000 missing markers: past the cap
    as_sent = [wire({"message_refs": unknown}), wire({"message_refs": refs})]

    decoded = await decode(codec, as_sent)

    assert decoded[0] == as_sent[0]
    assert data_of(decoded[1])["messages"][0]["content"].startswith("still shown")


async def test_a_payload_whose_json_would_be_written_back_past_the_cap_comes_back_as_it_came(codec, store):
    # 1E15 is written back as 1000000000000000.0: 4.5 times longer.
    data = b'{"tools_ref": "%s", "n": [' % value_ref(tool_list()).encode() + b",".join([b"1E15"] * 1_000_000) + b"]}"
    as_sent = [json_payload(data)]

    assert await decode(codec, as_sent) == as_sent


async def test_json_too_deep_to_walk_or_write_comes_back_unchanged_and_a_deep_stored_body_is_flagged(codec, store):
    deep_ref = f"m:{uuid.uuid4().hex}"
    await store.put_many({deep_ref: "[" * 5_000 + "]" * 5_000})
    as_sent = [
        json_payload(b'{"message_refs": ["%s"], "d": ' % deep_ref.encode() + b"[" * 50_000 + b"]" * 50_000 + b"}"),
        json_payload(b'{"tools_ref": "%s", "d": ' % deep_ref.encode() + b"[" * 990 + b"]" * 990 + b"}"),
        json_payload(b"\xff\xfe not UTF-8"),
        wire({"message_refs": [deep_ref]}),
    ]

    decoded = await decode(codec, as_sent)

    assert decoded[:3] == as_sent[:3]
    assert data_of(decoded[3])["messages"] == [{"ref": deep_ref, "unreadable": "the stored value is nested too deeply to show"}]


async def http_exchange(url: str, head: bytes, chunks: list[bytes]) -> tuple[int, dict[str, Any]]:
    """Send ``head`` and ``chunks`` on a raw connection; the status and JSON body of the answer."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(head)
        for chunk in chunks:
            writer.write(chunk)
            await writer.drain()
        headers = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 30)
        status = int(headers.split(b" ", 2)[1])
        length = next(int(line.split(b":")[1]) for line in headers.lower().split(b"\r\n") if line.startswith(b"content-length:"))
        body = await asyncio.wait_for(reader.readexactly(length), 30)
    finally:
        writer.close()
    return status, json.loads(body)


async def test_a_request_body_over_the_size_limit_is_refused_with_413_without_reading_it(codec):
    url = str(codec.base_url).rstrip("/")
    for path in ("/decode", "/default/encode"):
        # Declared too large: answered at once, though no byte of the body is sent.
        head = f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        status, answer = await http_exchange(url, f"{head}Content-Length: {BODY_CAP_BYTES + 1}\r\n\r\n".encode(), [])
        assert status == 413 and f"{BODY_CAP_BYTES:,}-byte limit" in answer["error"]

        # Chunked, with no length: refused once what was sent passes the limit.
        piece = b" " * 1_000_000
        chunks = [b"%x\r\n%s\r\n" % (len(piece), piece)] * (BODY_CAP_BYTES // len(piece)) + [b"1\r\n \r\n"]
        status, answer = await http_exchange(url, f"{head}Transfer-Encoding: chunked\r\n\r\n".encode(), chunks)
        assert status == 413 and f"{BODY_CAP_BYTES:,}-byte limit" in answer["error"]

    # The server still answers.
    assert (await codec.post("/encode", json={"payloads": []})).json() == {"payloads": []}


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
    assert other.status_code == 403 and "cors" not in other.text  # not decoded for another origin


async def test_the_codec_server_takes_the_bearer_scheme_in_any_case_as_the_api_does(store):
    async with running_codec_server(store, port=free_port(), ui_origins=default_ui_origins(8233), token="tok-1") as url:
        async with httpx.AsyncClient(base_url=url, timeout=30.0) as client:
            body = {"payloads": []}
            for scheme in ("Bearer", "bearer", "BEARER"):
                answer = await client.post("/decode", json=body, headers={"Authorization": f"{scheme} tok-1"})
                assert answer.status_code == 200, (scheme, answer.text)
            for header in ("Bearer tok-2", "Basic tok-1", "tok-1", "Bearertok-1"):
                assert (await client.post("/decode", json=body, headers={"Authorization": header})).status_code == 401


async def test_every_codec_answer_carries_the_security_headers_and_cors_still_serves_the_web_ui(codec):
    from hermes.security.http_security import CODEC_CSP

    preflight = await codec.options("/decode", headers={
        "Origin": UI_ORIGIN, "Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "content-type",
    })
    assert preflight.status_code == 200 and preflight.headers["access-control-allow-origin"] == UI_ORIGIN
    answers = [
        preflight,
        await codec.post("/decode", json={"payloads": []}, headers={"Origin": UI_ORIGIN}),
        await codec.post("/decode", content=b"{", headers={"Origin": UI_ORIGIN}),  # 400
        await codec.post("/decode", json={"payloads": []}, headers={"Origin": "http://evil.example"}),  # 403
    ]
    assert answers[1].headers["access-control-allow-origin"] == UI_ORIGIN
    for answer in answers:
        assert answer.headers["content-security-policy"] == CODEC_CSP, answer.status_code
        assert answer.headers["x-frame-options"] == "DENY" and answer.headers["x-content-type-options"] == "nosniff"
        assert answer.headers["referrer-policy"] == "no-referrer"


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
    # History carries one reference to the context, not the conversation (at most the
    # messages since the previous call, its reply and the second message here, ride with
    # the call: history holds them once already, in that call's result and the update)...
    assert raw.get("context_ref"), "the call_model input has no context_ref: the workflow still sends bodies"
    assert not raw.get("messages") and not raw.get("message_refs")
    assert first not in json.dumps(raw)
    assert all('"Noted."' in body or second in body for body in raw.get("bodies", {}).values()), raw.get("bodies")
    assert len(json.dumps(raw)) < 1500

    (decoded,) = await decode(codec, as_sent)

    # ...and the Web UI, through the codec server, shows the real messages.
    shown = data_of(decoded)["messages"]
    assert len(shown) == len(data_of(decoded)["message_refs"]) >= 3
    contents = [m.get("content") for m in shown]
    assert first in contents and second in contents
    assert contents.index(first) < contents.index("Noted.") < contents.index(second)
    assert not [m for m in shown if m.get("missing")]
