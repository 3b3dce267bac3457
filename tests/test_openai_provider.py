"""The OpenAI-compatible provider against a local server speaking the chat-completions wire.

The server (stdlib ``http.server`` in a thread, on 127.0.0.1) answers from a list of
scripted responses and records every request, so a test can count HTTP requests per
activity attempt and read exactly what was sent. Temporal owns retries: the SDK's own are
off, 5xx / 429 are retried by the activity's retry policy (honouring ``Retry-After``), and
other 4xx are not retried at all.
"""

from __future__ import annotations

import dataclasses
import email.utils
import json
import re
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from temporalio.exceptions import ApplicationError

from temporalio.testing import ActivityEnvironment

from activities.model import ModelActivities, provider_retry_delay
from hermes.errors import ConfigError, ModelRequestError, ModelUnavailableError
from hermes.models import CallModelInput, Message, ToolResultCode
from hermes.providers import make_provider
from hermes.providers.openai import OpenAIProvider
from hermes.settings import Settings
from hermes.infra.stack import free_port
from hermes.tools.builtin import register_builtins
from hermes.tools.registry import ToolRegistry
from tests.fake_providers import Call, FakeProvider, Step, cut_before_arguments, cut_in_text

MODEL = "fake-model"


def completion(content: str | None = None, tool_calls: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """A chat-completions response body."""
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if tool_calls:
        message["tool_calls"] = tool_calls
    return {
        "id": "chatcmpl-test",
        "object": "chat.completion",
        "created": 1_700_000_000,
        "model": MODEL,
        "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls" if tool_calls else "stop"}],
        "usage": {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18},
    }


def error_body(message: str, kind: str = "invalid_request_error") -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": None, "code": None}}


class FakeOpenAI(FakeProvider):
    """A chat-completions endpoint that plays scripted responses and records requests.

    Responses are ``(status, headers, body)``; when the list is used up every further
    request gets ``default``. A request that asks to stream gets a 200 answer as OpenAI
    streams it (:class:`tests.fake_providers.FakeProvider` with raw answers).
    """

    def __init__(self) -> None:
        super().__init__("openai")
        self.responses = self.scripted
        self.default = completion("default reply")

    def start(self) -> FakeOpenAI:
        super().start()
        return self

    def then(self, status: int, body: dict[str, Any], **headers: str) -> FakeOpenAI:
        self.responses.append((status, {k.replace("_", "-"): v for k, v in headers.items()}, body))
        return self


@pytest.fixture
def fake_openai() -> Iterator[FakeOpenAI]:
    server = FakeOpenAI().start()
    try:
        yield server
    finally:
        server.stop()


def provider_for(server: FakeOpenAI) -> OpenAIProvider:
    return OpenAIProvider(model=MODEL, base_url=server.base_url, api_key="test")


def request(text: str = "hi") -> CallModelInput:
    return CallModelInput(
        session_id="s-openai",
        turn=1,
        messages=[Message(role="system", content="be brief"), Message(role="user", content=text)],
    )


# ------------------------------------------------------- provider, directly


async def test_a_plain_answer_is_parsed_with_usage_and_the_request_is_on_the_wire(fake_openai):
    fake_openai.then(200, completion("你好 👋"))
    result = await provider_for(fake_openai).complete(request("你好"))
    assert result.message.role == "assistant" and result.message.content == "你好 👋"
    assert (result.usage.prompt_tokens, result.usage.completion_tokens) == (11, 7)
    assert (result.provider, result.model) == ("openai", MODEL)
    [sent] = fake_openai.requests
    assert sent["path"] == "/v1/chat/completions"
    assert sent["headers"]["authorization"] == "Bearer test"
    assert sent["body"]["model"] == MODEL
    assert sent["body"]["messages"] == [{"role": "system", "content": "be brief"}, {"role": "user", "content": "你好"}]
    assert "tools" not in sent["body"]


async def test_an_endpoint_that_ignores_stream_and_answers_json_is_read_as_it_is(fake_openai):
    # Some gateways in front of OpenAI-compatible servers drop `stream`: a JSON answer to a
    # streamed request is the answer, not a broken stream (it was a model_error per turn).
    fake_openai.ignores_stream = True
    fake_openai.then(200, completion("whole answer"))
    result = await provider_for(fake_openai).complete(request())
    assert fake_openai.requests[0]["body"]["stream"] is True
    assert result.message.content == "whole answer"
    assert result.usage is not None and result.usage.completion_tokens > 0


async def test_lone_surrogates_from_the_wire_become_replacement_characters_not_a_failing_retry(fake_openai):
    fake_openai.then(
        200,
        completion(
            "half \ud800 a pair",
            tool_calls=[{"id": "c1", "type": "function", "function": {"name": "calculate", "arguments": '{"expression": "1\udfff"}'}}],
        ),
    )
    message = (await provider_for(fake_openai).complete(request())).message
    assert message.content == "half \ufffd a pair"
    assert message.tool_calls[0].arguments == {"expression": "1\ufffd"}
    message.model_dump_json().encode("utf-8")  # storable: no lone surrogate left


async def test_the_sdk_does_not_retry_on_its_own(fake_openai):
    fake_openai.then(500, error_body("boom", "server_error")).then(429, error_body("slow down"), retry_after="1")
    provider = provider_for(fake_openai)
    with pytest.raises(ModelUnavailableError) as first:
        await provider.complete(request())
    assert first.value.status_code == 500
    assert len(fake_openai.requests) == 1, "the SDK retried a 500 by itself"
    with pytest.raises(ModelUnavailableError) as second:
        await provider.complete(request())
    assert second.value.status_code == 429 and second.value.retry_after_seconds == 1.0
    assert len(fake_openai.requests) == 2, "the SDK retried a 429 by itself"
    assert (await provider.complete(request())).message.content == "default reply"
    assert len(fake_openai.requests) == 3


async def test_a_refused_request_is_a_model_request_error_with_the_status_and_reason(fake_openai):
    fake_openai.then(401, error_body("Incorrect API key provided", "invalid_api_key"))
    with pytest.raises(ModelRequestError) as info:
        await provider_for(fake_openai).complete(request())
    assert info.value.status_code == 401
    assert "401" in str(info.value) and "Incorrect API key provided" in str(info.value)
    assert len(fake_openai.requests) == 1


async def test_an_unreachable_endpoint_is_a_retryable_error_without_sdk_retries():
    provider = OpenAIProvider(model=MODEL, base_url=f"http://127.0.0.1:{free_port()}/v1", api_key="test")
    with pytest.raises(ModelUnavailableError, match="cannot reach"):
        await provider.complete(request())


@pytest.mark.parametrize(
    ("status", "headers", "error_type", "retryable", "delay"),
    [
        (429, {"retry_after": "1"}, "ModelUnavailableError", True, timedelta(seconds=1)),
        (429, {"retry_after_ms": "1500"}, "ModelUnavailableError", True, timedelta(seconds=1.5)),
        # No Retry-After: the activity's own backoff, 0.5 s at the first attempt (a worker
        # crash is retried after the policy's shorter 0.1 s).
        (503, {}, "ModelUnavailableError", True, timedelta(seconds=0.5)),
        (408, {}, "ModelUnavailableError", True, timedelta(seconds=0.5)),
        (409, {}, "ModelUnavailableError", True, timedelta(seconds=0.5)),
        (401, {}, "ModelRequestError", False, None),
        (400, {}, "ModelRequestError", False, None),
        (404, {}, "ModelRequestError", False, None),
    ],
)
async def test_the_activity_maps_http_status_to_retryable_or_not_and_honours_retry_after(
    fake_openai, status, headers, error_type, retryable, delay
):
    fake_openai.then(status, error_body(f"status {status}"), **headers)
    activities = ModelActivities(provider_for(fake_openai))
    with pytest.raises(ApplicationError) as info:
        await activities.call_model(request())
    err = info.value
    assert err.type == error_type
    assert err.non_retryable is (not retryable)
    assert err.next_retry_delay == delay
    assert str(status) in err.message
    assert len(fake_openai.requests) == 1


@pytest.mark.parametrize("hint", ["soon", "nan", "inf", "86400"])
async def test_an_unusable_retry_after_leaves_the_backoff_to_the_activity(fake_openai, hint):
    # Unparsable, non-finite or absurdly long hints must not break the error mapping
    # nor park the session: the call stays retryable with the activity's own backoff.
    fake_openai.then(429, error_body("rate limited"), retry_after=hint)
    with pytest.raises(ApplicationError) as info:
        await ModelActivities(provider_for(fake_openai)).call_model(request())
    assert info.value.type == "ModelUnavailableError"
    assert info.value.non_retryable is False
    assert info.value.next_retry_delay == timedelta(seconds=0.5)


def test_without_retry_after_the_wait_doubles_per_attempt_up_to_30_s():
    def delay_at(attempt: int, retry_after: float | None = None) -> timedelta:
        env = ActivityEnvironment()
        env.info = dataclasses.replace(env.info, attempt=attempt)
        return env.run(provider_retry_delay, retry_after)

    assert [delay_at(n).total_seconds() for n in (1, 2, 3, 4)] == [0.5, 1.0, 2.0, 4.0]
    assert delay_at(12) == timedelta(seconds=30)
    assert delay_at(3, retry_after=7.0) == timedelta(seconds=7)  # the provider's word wins


async def test_a_retry_after_http_date_becomes_the_delay_until_that_date(fake_openai):
    fake_openai.then(429, error_body("rate limited"), retry_after=email.utils.formatdate(time.time() + 10, usegmt=True))
    with pytest.raises(ModelUnavailableError) as info:
        await provider_for(fake_openai).complete(request())
    assert info.value.retry_after_seconds is not None and 8 <= info.value.retry_after_seconds <= 10


async def test_tool_calls_on_the_wire_are_parsed_with_their_json_string_arguments(fake_openai):
    fake_openai.then(
        200,
        completion(
            None,
            tool_calls=[
                {"id": "call_ok", "type": "function", "function": {"name": "calculate", "arguments": '{"expression": "6 * 7"}'}},
                {"id": "call_bad", "type": "function", "function": {"name": "calculate", "arguments": "{not json"}},
                {"id": "call_empty", "type": "function", "function": {"name": "current_time", "arguments": ""}},
            ],
        ),
    )
    message = (await provider_for(fake_openai).complete(request())).message
    ok, bad, empty = message.tool_calls
    assert (ok.tool_call_id, ok.name, ok.arguments, ok.arguments_error) == ("call_ok", "calculate", {"expression": "6 * 7"}, None)
    assert bad.tool_call_id == "call_bad" and bad.arguments == {}
    assert bad.arguments_error is not None and "expected a JSON object" in bad.arguments_error
    assert (empty.arguments, empty.arguments_error) == ({}, None)


def cut_answer(body: dict[str, Any], finish_reason: str | None) -> dict[str, Any]:
    body["choices"][0]["finish_reason"] = finish_reason
    return body


@pytest.mark.parametrize("finish_reason", [None, ""])
async def test_an_answer_without_a_finish_reason_fails_the_attempt_as_retryable_and_is_not_the_reply(
    fake_openai, finish_reason
):
    fake_openai.then(200, cut_answer(completion("The transfer of 5,000 EUR was NOT"), finish_reason))
    provider = OpenAIProvider(model=MODEL, base_url=fake_openai.base_url, api_key="test", stream=False)
    with pytest.raises(ApplicationError) as info:
        await ModelActivities(provider).call_model(request())
    assert info.value.type == "ModelUnavailableError" and info.value.non_retryable is False
    assert "cut: no finish_reason, it ended after 33 characters of text" in info.value.message
    assert info.value.next_retry_delay == timedelta(seconds=0.5)


async def test_a_tool_call_cut_by_the_output_limit_is_retryable_but_text_cut_by_it_is_kept(fake_openai):
    half = {"id": "call_half", "type": "function", "function": {"name": "calculate", "arguments": '{"expression": "6 *'}}
    fake_openai.then(200, cut_answer(completion(None, tool_calls=[half]), "length"))
    fake_openai.then(200, cut_answer(completion("A long answer, cut by max_tok"), "length"))
    provider = OpenAIProvider(model=MODEL, base_url=fake_openai.base_url, api_key="test", stream=False)
    with pytest.raises(ModelUnavailableError, match=r"finish_reason 'length' .* tool call 'calculate' \(call_half, 19 characters\)"):
        await provider.complete(request())
    # Plain text at the output limit is a whole answer, truncated as asked: kept as before.
    assert (await provider.complete(request())).message.content == "A long answer, cut by max_tok"


async def test_a_stream_whose_connection_is_reset_mid_answer_fails_the_attempt_as_retryable(fake_openai):
    fake_openai.then(200, completion("The transfer of 5,000 EUR was NOT sent.")).then(200, completion("Whole."))
    fake_openai.reset_streams.append(lambda events: cut_in_text(events) + 3)
    with pytest.raises(ApplicationError) as info:
        await ModelActivities(provider_for(fake_openai)).call_model(request())
    assert info.value.type == "ModelUnavailableError" and info.value.non_retryable is False
    assert re.search(r"connection dropped mid-answer \(\w+\) after \d+ characters of text; it is retried", info.value.message)
    assert (await provider_for(fake_openai).complete(request())).message.content == "Whole."


def test_the_openai_provider_without_key_or_base_url_is_a_config_error(monkeypatch, tmp_path):
    for name in ("OPENAI_API_KEY", "HERMES_OPENAI_API_KEY", "OPENAI_BASE_URL", "HERMES_OPENAI_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)  # no stray .env file
    with pytest.raises(ConfigError) as info:
        make_provider(Settings(model_provider="openai"))
    assert info.value.key == "openai_api_key"
    assert "OPENAI_API_KEY" in str(info.value)
    # Either one is enough: a local server needs no key.
    assert isinstance(make_provider(Settings(model_provider="openai", openai_base_url="http://127.0.0.1:1/v1")), OpenAIProvider)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    assert isinstance(make_provider(Settings(model_provider="openai")), OpenAIProvider)


# ------------------------------------------------------ through a session


async def test_a_500_then_200_is_retried_by_temporal_and_the_turn_succeeds(run_worker, fake_openai, session_id):
    fake_openai.then(500, error_body("upstream hiccup", "server_error")).then(200, completion("Hello from the model"))
    async with run_worker(provider_for(fake_openai)) as hermes:
        result = await hermes.send_message(session_id, "hello")
    assert result.status == "completed"
    assert result.reply == "Hello from the model"
    assert len(fake_openai.requests) == 2
    assert fake_openai.requests[0]["body"] == fake_openai.requests[1]["body"]


@pytest.mark.parametrize("how", ["cut_streams", "reset_streams"])
async def test_a_stream_cut_mid_sentence_is_retried_and_only_the_whole_reply_is_stored(run_worker, fake_openai, session_id, how):
    whole = "The transfer of 5,000 EUR was NOT sent: the account is locked."
    fake_openai.then(200, completion(whole)).then(200, completion(whole))
    # Ended cleanly by a proxy's timeout, or dropped with a reset: "The transfer of 5,000 EUR was NOT"
    getattr(fake_openai, how).append(lambda events: cut_in_text(events) + 10)
    async with run_worker(provider_for(fake_openai), memory=False) as hermes:
        result = await hermes.send_message(session_id, "did the transfer go through?")
        transcript = await hermes.get_transcript(session_id)
    assert (result.status, result.reply) == ("completed", whole)
    assert len(fake_openai.requests) == 2 and getattr(fake_openai, how) == []
    assert [m.content for m in transcript if m.role == "assistant"] == [whole]


@pytest.mark.timeout(120)
async def test_a_stream_cut_inside_a_tool_call_never_runs_that_call_and_the_retry_runs_it_whole(run_worker, session_id):
    def answer(body: dict[str, Any]) -> Step:
        if any(m["role"] == "tool" for m in body["messages"]):
            return Step(content="It is morning in Tokyo.")
        return Step(calls=[Call("current_time", '{"timezone": "Asia/Tokyo"}')])

    with FakeProvider("openai", answer=answer) as fake:
        # Cut after the call's name, before its arguments: kept, it ran with none (UTC).
        fake.cut_streams.append(cut_before_arguments)
        provider = OpenAIProvider(model=MODEL, base_url=fake.base_url, api_key="test")
        async with run_worker(provider, registry=register_builtins(ToolRegistry()), memory=False) as hermes:
            result = await hermes.send_message(session_id, "what time is it in Tokyo?")
    assert (result.status, result.reply) == ("completed", "It is morning in Tokyo.")
    [record] = result.tool_calls
    assert (record.name, record.arguments, record.result.code) == ("current_time", {"timezone": "Asia/Tokyo"}, ToolResultCode.OK)
    assert len(fake.requests) == 3 and fake.cut_streams == []


async def test_a_401_is_not_retried_and_the_session_stays_usable(run_worker, fake_openai, session_id):
    fake_openai.then(401, error_body("Incorrect API key provided", "invalid_api_key"))
    async with run_worker(provider_for(fake_openai)) as hermes:
        failed = await hermes.send_message(session_id, "first question")
        assert len(fake_openai.requests) == 1, "a 401 was retried"
        assert failed.status == "model_error"
        assert failed.reply.startswith("The model could not answer")
        assert "401" in failed.reply and "Incorrect API key" in failed.reply

        fake_openai.default = completion("Second answer")
        ok = await hermes.send_message(session_id, "second question")
        state = await hermes.get_state(session_id)

    assert ok.status == "completed" and ok.reply == "Second answer"
    assert len(fake_openai.requests) == 2
    assert state.turn_count == 2 and not state.busy
    sent = fake_openai.requests[1]["body"]["messages"]
    assert [m["content"] for m in sent if m["role"] == "user"] == ["first question", "second question"]


async def test_a_429_is_retried_after_its_retry_after_delay(run_worker, fake_openai, session_id):
    # 2 s: longer than the policy's own first interval (1 s), so the gap shows which one won.
    fake_openai.then(429, error_body("rate limited", "rate_limit_exceeded"), retry_after="2").then(200, completion("done"))
    async with run_worker(provider_for(fake_openai)) as hermes:
        result = await hermes.send_message(session_id, "hi")
    assert result.reply == "done"
    first, second = fake_openai.requests
    assert second["at"] - first["at"] >= 1.9


async def test_a_tool_call_from_the_model_runs_and_its_result_goes_back_with_the_same_id(
    run_worker, fake_openai, session_id
):
    fake_openai.then(
        200,
        completion(
            None,
            tool_calls=[{"id": "call_abc123", "type": "function", "function": {"name": "calculate", "arguments": '{"expression": "6 * 7"}'}}],
        ),
    ).then(200, completion("6 × 7 = 42"))
    async with run_worker(provider_for(fake_openai), registry=register_builtins(ToolRegistry()), memory=False) as hermes:  # reads every model request: no memory extraction calls
        result = await hermes.send_message(session_id, "what is 6 times 7?")

    assert result.reply == "6 × 7 = 42"
    [record] = result.tool_calls
    assert (record.tool_call_id, record.name, record.arguments) == ("call_abc123", "calculate", {"expression": "6 * 7"})
    assert record.result.code == ToolResultCode.OK and record.result.data["value"] == 42

    first, second = (r["body"] for r in fake_openai.requests)
    tools = {t["function"]["name"]: t for t in first["tools"]}
    assert set(tools) >= {"calculate", "current_time", "save_note", "list_notes"}
    assert tools["calculate"]["type"] == "function"
    assert tools["calculate"]["function"]["parameters"]["required"] == ["expression"]
    assert second["tools"] == first["tools"]

    assistant = next(m for m in second["messages"] if m["role"] == "assistant")
    [wire_call] = assistant["tool_calls"]
    assert wire_call["id"] == "call_abc123"
    assert wire_call["function"] == {"name": "calculate", "arguments": '{"expression": "6 * 7"}'}
    [tool_message] = [m for m in second["messages"] if m["role"] == "tool"]
    assert tool_message["tool_call_id"] == "call_abc123"
    content = json.loads(tool_message["content"])
    assert content["code"] == 0 and content["data"]["value"] == 42
    assert [m["role"] for m in second["messages"]] == ["system", "user", "assistant", "tool"]


def context_too_long_body() -> dict[str, Any]:
    """What OpenAI answers for a context over the model's window (HTTP 400)."""
    return {
        "error": {
            "message": "This model's maximum context length is 8192 tokens. However, your messages resulted in "
            "9000 tokens. Please reduce the length of the messages.",
            "type": "invalid_request_error",
            "param": "messages",
            "code": "context_length_exceeded",
        }
    }


@pytest.mark.parametrize(
    ("status", "body"),
    [
        (400, context_too_long_body()),
        (400, error_body("Input is too long for requested model.")),
        (413, error_body("Request Entity Too Large")),
    ],
    ids=["openai-code", "message-only", "http-413"],
)
async def test_a_context_over_the_window_is_a_context_too_long_error_not_retried(fake_openai, status, body):
    fake_openai.then(status, body)
    activities = ModelActivities(provider_for(fake_openai))
    with pytest.raises(ApplicationError) as info:
        await activities.call_model(request())
    assert info.value.type == "ContextTooLongError" and info.value.non_retryable


async def test_a_context_too_long_answer_compacts_the_conversation_once_and_the_retry_answers(
    run_worker, fake_openai, session_id
):
    from hermes.models import SessionConfig

    config = SessionConfig(summary_every_turns=100)  # no summary before the provider refuses
    async with run_worker(provider_for(fake_openai), config=config, memory=False) as hermes:  # reads every model request: no memory extraction calls
        for n in range(3):
            fake_openai.then(200, completion(f"answer {n}"))
            await hermes.send_message(session_id, f"my fact number {n} is {n * 7}")
        before = len(fake_openai.requests)
        fake_openai.then(400, context_too_long_body())
        fake_openai.then(200, completion("Summary: facts 0, 7 and 14."))
        fake_openai.then(200, completion("answer after compaction"))
        result = await hermes.send_message(session_id, "what were my facts?")
        assert (result.status, result.reply) == ("completed", "answer after compaction")
        refused, summary_request, retried = fake_openai.requests[before:]
        assert "my fact number 1 is 7" in json.dumps(summary_request["body"]["messages"], ensure_ascii=False)
        sent = retried["body"]["messages"]
        assert any("Summary: facts 0, 7 and 14." in (m.get("content") or "") for m in sent if m["role"] == "system")
        assert [m["content"] for m in sent if m["role"] == "user"] == ["what were my facts?"]
        state = await hermes.get_state(session_id)
        assert state.summary is not None and state.summary.upto_turn == 3
        assert len((await hermes.get_transcript(session_id))) == 8  # nothing dropped from the session
        # a second refusal after the compaction ends the turn clearly: no loop
        fake_openai.then(400, context_too_long_body()).then(400, context_too_long_body())
        count = len(fake_openai.requests)
        failed = await hermes.send_message(session_id, "and now?")
        assert failed.status == "context_too_large" and "too long" in failed.reply
        assert len(fake_openai.requests) - count <= 3
        fake_openai.then(200, completion("fine again"))
        assert (await hermes.send_message(session_id, "ok?")).reply == "fine again"
