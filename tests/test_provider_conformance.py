"""Provider conformance: one local fake per profile (tests/fake_providers.py), each
answering in its provider's documented shapes and refusing what that provider refuses.

The same two-turn tool conversation (two parallel tool calls, one of them without
arguments, Chinese text and an emoji) runs against every profile, streamed and not, and
the streamed results equal the unstreamed ones. Each quirk is also checked the other way:
with its handling taken out of the profile, the same conversation fails against that
provider's fake.
"""

from __future__ import annotations

import dataclasses
import json
import typing
from typing import Any

import openai
import pytest
from temporalio.testing import ActivityEnvironment

from activities.heartbeat import beat
from activities.model import ModelActivities
from hermes.content.blobs import body_json, message_from_body, message_ref
from hermes.errors import ConfigError, ModelRequestError, ModelUnavailableError
from hermes.models import CallModelInput, CallModelResult, Message, ProviderProfileName, SessionConfig, ToolResultCode
from hermes.providers import make_provider, openai as openai_provider
from hermes.providers import profiles as profiles_module
from hermes.providers.openai import OpenAIProvider
from hermes.providers.profiles import PROFILES, detect_profile, resolve_profile
from hermes.settings import Settings
from hermes.tools.builtin import register_builtins
from hermes.tools.registry import ToolRegistry
from tests.fake_providers import (
    PROFILES as FAKES,
    REASONING_FIELD,
    REPLY_1,
    REPLY_2,
    STEPS,
    TOOLS,
    USER_2,
    Call,
    FakeProvider,
    Step,
    cut_in_arguments,
    cut_in_text,
    opening_messages,
    tool_messages,
)

MAX_OUTPUT_TOKENS = 256


@pytest.fixture(params=FAKES)
def fake(request: pytest.FixtureRequest):
    with FakeProvider(request.param) as server:
        yield server


def provider_for(fake: FakeProvider, *, stream: bool = True, profile: str | None = None) -> OpenAIProvider:
    return OpenAIProvider(
        model="o3-mini" if fake.profile == "openai-reasoning" else "fake-model",
        base_url=fake.base_url,
        api_key="test",
        profile=profile or fake.profile,
        stream=stream,
    )


async def converse(provider: OpenAIProvider) -> list[CallModelResult]:
    """The conformance conversation, as a session would hold it: each reply is appended
    to the transcript as returned (reasoning included), tool results follow their calls."""
    messages = opening_messages()
    results = []

    async def step(turn: int, index: int) -> CallModelResult:
        request = CallModelInput(
            session_id="s-conformance", turn=turn, step=index, messages=list(messages), tools=TOOLS,
            max_output_tokens=MAX_OUTPUT_TOKENS,
        )
        result = await provider.complete(request)
        results.append(result)
        messages.append(result.message)
        return result

    first = await step(1, 0)
    messages.extend(tool_messages(first.message))
    await step(1, 1)
    messages.append(Message(role="user", content=USER_2))
    await step(2, 0)
    return results


def check_conversation(fake: FakeProvider, results: list[CallModelResult]) -> None:
    """What every profile must give: the calls, the replies, reasoning kept, usage."""
    calls, answer, thanks = (r.message for r in results)
    assert [c.name for c in calls.tool_calls] == ["get_weather", "list_notes"], "both parallel calls came back"
    assert [c.arguments for c in calls.tool_calls] == [{"city": "北京"}, {}]
    assert all(c.arguments_error is None for c in calls.tool_calls)
    ids = [c.tool_call_id for c in calls.tool_calls]
    assert all(ids) and len(set(ids)) == 2, f"tool-call ids must be non-empty and distinct: {ids}"
    assert calls.content is None
    assert (answer.content, thanks.content) == (REPLY_1, REPLY_2)
    returns_reasoning = fake.profile in REASONING_FIELD
    expected = [s.reasoning if returns_reasoning else None for s in STEPS]
    assert [m.reasoning for m in (calls, answer, thanks)] == expected
    for r in results:
        assert r.usage.prompt_tokens > 0 and r.usage.completion_tokens == 7, "usage reported"
    assert fake.refused == []


@pytest.mark.timeout(60)
async def test_the_tool_conversation_passes_against_every_profile_streamed_and_not_with_equal_results(fake):
    plain = await converse(provider_for(fake, stream=False))
    check_conversation(fake, plain)
    streamed = await converse(provider_for(fake, stream=True))
    check_conversation(fake, streamed)
    assert [r.model_dump() for r in streamed] == [r.model_dump() for r in plain]

    bodies = [r["body"] for r in fake.requests]
    assert [bool(b.get("stream")) for b in bodies] == [False] * 3 + [True] * 3
    profile = PROFILES[fake.profile]
    for body in bodies:
        assert body[profile.output_limit_parameter] == MAX_OUTPUT_TOKENS
        other = {"max_tokens", "max_completion_tokens"} - {profile.output_limit_parameter}
        assert not other & set(body)
        for m in body["messages"]:
            reasoning_keys = {"reasoning", "reasoning_content"} & set(m)
            if profile.reasoning_sent_back and m["role"] == "assistant" and m.get("tool_calls"):
                assert m["reasoning_content"] == STEPS[0].reasoning, "the thinking of a tool step goes back"
            else:
                assert not reasoning_keys, f"{fake.profile}: reasoning must stay out of {m}"


@pytest.mark.timeout(60)
async def test_a_stream_cut_inside_a_tool_call_or_mid_text_is_refused_as_retryable_against_every_profile(fake):
    # Each profile's stream without its last events (the finish_reason chunk, usage,
    # [DONE]), as a proxy's timeout ends one; the same request streamed whole then passes.
    provider = provider_for(fake)
    calls = CallModelInput(session_id="s-cut", turn=1, step=0, messages=opening_messages(), tools=TOOLS)
    fake.cut_streams.append(cut_in_arguments)
    with pytest.raises(ModelUnavailableError, match="cut: no finish_reason, it ended (inside the arguments of tool call 'get_weather'|after 1 tool call)"):
        await provider.complete(calls)
    whole = (await provider.complete(calls)).message
    assert [c.arguments for c in whole.tool_calls] == [{"city": "北京"}, {}]

    text = calls.model_copy(update={"step": 1, "messages": [*opening_messages(), whole, *tool_messages(whole)]})
    fake.cut_streams.append(cut_in_text)
    with pytest.raises(ModelUnavailableError, match="no finish_reason, it ended after 3 characters of text"):
        await provider.complete(text)
    assert (await provider.complete(text)).message.content == REPLY_1
    assert fake.cut_streams == [] and fake.refused == []


# Each quirk's handling taken out (profile field -> value without it), and what then fails.
WITHOUT_QUIRK = {
    "openai": {"stream_usage_option": False},  # a stream without include_usage reports no usage
    "openai-reasoning": {"output_limit_parameter": "max_tokens"},  # 400 Unsupported parameter
    "deepseek": {"reasoning_sent_back": None},  # 400 Missing `reasoning_content`
    "qwen": {"ask_parallel_tool_calls": False},  # one call per answer
    "moonshot": {"reasoning_sent_back": None},  # 400 reasoning_content is missing
    "ollama": {"null_content": True},  # 400 invalid message content type: <nil>
    "vllm": {"reasoning_fields": ("reasoning_content",)},  # the reasoning is lost
}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("profile", sorted(WITHOUT_QUIRK))
async def test_without_its_quirk_handling_the_conversation_fails_against_that_provider(profile, monkeypatch):
    broken = dataclasses.replace(PROFILES[profile], **WITHOUT_QUIRK[profile])
    monkeypatch.setitem(profiles_module.PROFILES, profile, broken)
    with FakeProvider(profile) as fake:
        with pytest.raises((ModelRequestError, AssertionError)):
            check_conversation(fake, await converse(provider_for(fake, stream=True)))


@pytest.mark.timeout(60)
async def test_without_stable_ids_llamacpp_tool_calls_have_empty_ids(monkeypatch):
    monkeypatch.setattr(openai_provider, "_stable_id", lambda request, position: "")
    with FakeProvider("llamacpp") as fake:
        with pytest.raises(AssertionError, match="non-empty and distinct"):
            check_conversation(fake, await converse(provider_for(fake, stream=False)))


@pytest.mark.timeout(60)
async def test_ids_made_for_empty_tool_call_ids_are_the_same_on_every_attempt():
    with FakeProvider("llamacpp") as fake:
        provider = provider_for(fake)
        request = CallModelInput(session_id="s", turn=4, step=2, messages=opening_messages(), tools=TOOLS)
        first, again = [await provider.complete(request) for _ in range(2)]
    assert [c.tool_call_id for c in first.message.tool_calls] == ["call_4_2_0", "call_4_2_1"]
    assert first.message.tool_calls == again.message.tool_calls


REFUSED = [
    ("deepseek", "drop_reasoning", 400, "Missing `reasoning_content` field in the assistant message at message index 2"),
    ("moonshot", "drop_reasoning", 400, "reasoning_content is missing in assistant tool call message"),
    ("ollama", "null_content", 400, "invalid message content type: <nil>"),
    ("openai-reasoning", "max_tokens", 400, "Unsupported parameter: 'max_tokens' is not supported with this model"),
    ("openai", "add_reasoning", 400, "Additional properties are not allowed ('reasoning_content' was unexpected)"),
    ("vllm", "orphan_tool_result", 400, "must be a response to a preceeding message with 'tool_calls'"),
]


@pytest.mark.timeout(30)
@pytest.mark.parametrize(("profile", "mistake", "status", "text"), REFUSED, ids=[f"{p}-{m}" for p, m, *_ in REFUSED])
async def test_each_fake_refuses_what_its_provider_refuses_with_its_status_and_body(profile, mistake, status, text):
    assistant = {
        "role": "assistant", "content": None, "reasoning_content": "想一想",
        "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "list_notes", "arguments": "{}"}}],
    }
    if mistake == "drop_reasoning":
        del assistant["reasoning_content"]
    if mistake != "add_reasoning" and profile == "openai":
        del assistant["reasoning_content"]
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "s"}, {"role": "user", "content": "u"}, assistant,
        {"role": "tool", "tool_call_id": "call_1", "content": "[]"},
    ]
    if mistake == "orphan_tool_result":
        messages = [messages[0], messages[1], messages[3]]
    kwargs: dict[str, Any] = {"model": "m", "messages": messages}
    if mistake == "max_tokens":
        kwargs["max_tokens"] = 10
    with FakeProvider(profile) as fake:
        client = openai.AsyncOpenAI(base_url=fake.base_url, api_key="test", max_retries=0)
        with pytest.raises(openai.APIStatusError) as info:
            await client.chat.completions.create(**kwargs)
    assert info.value.status_code == status
    assert text in info.value.message
    assert isinstance(info.value.body, dict) and info.value.body.get("type") == "invalid_request_error"


@pytest.mark.timeout(30)
async def test_qwen_answers_one_call_at_a_time_unless_parallel_tool_calls_is_asked_for():
    with FakeProvider("qwen") as fake:
        client = openai.AsyncOpenAI(base_url=fake.base_url, api_key="test", max_retries=0)
        tools = [t.to_openai() for t in TOOLS]
        messages = [{"role": "user", "content": "?"}]
        one = await client.chat.completions.create(model="qwen-plus", messages=messages, tools=tools)
        two = await client.chat.completions.create(model="qwen-plus", messages=messages, tools=tools, parallel_tool_calls=True)
    assert (len(one.choices[0].message.tool_calls), len(two.choices[0].message.tool_calls)) == (1, 2)


@pytest.mark.timeout(30)
async def test_tool_call_arguments_sent_as_an_object_are_taken_streamed_or_not():
    step = Step(calls=[Call("get_weather", {"city": "上海"}), Call("list_notes", {})])
    with FakeProvider("llamacpp", answer=lambda body: step) as fake:
        results = [await provider_for(fake, stream=s).complete(CallModelInput(session_id="s", turn=1, messages=opening_messages())) for s in (False, True)]
    for result in results:
        assert [(c.name, c.arguments, c.arguments_error) for c in result.message.tool_calls] == [
            ("get_weather", {"city": "上海"}, None), ("list_notes", {}, None)
        ]


@pytest.mark.timeout(30)
async def test_every_streamed_chunk_heartbeats_the_model_activity():
    with FakeProvider("deepseek") as fake:
        provider = provider_for(fake)
        activities = ModelActivities(provider)
        assert provider.on_chunk is beat
        beats: list[Any] = []
        env = ActivityEnvironment()
        env.on_heartbeat = lambda *details: beats.append(details)
        request = CallModelInput(session_id="s", turn=1, step=0, messages=opening_messages(), tools=TOOLS)
        result = await env.run(activities.call_model, request)
    assert len(result.message.tool_calls) == 2
    # The answer came in more than ten chunks; the background beat adds only one at the start.
    assert len(beats) >= 10


@pytest.mark.timeout(30)
async def test_streaming_off_sends_no_stream_and_gives_the_same_result():
    with FakeProvider("ollama") as fake:
        request = CallModelInput(session_id="s", turn=1, step=0, messages=opening_messages(), tools=TOOLS)
        off = await provider_for(fake, stream=False).complete(request)
        on = await provider_for(fake, stream=True).complete(request)
        no_stream_profile = dataclasses.replace(PROFILES["ollama"], stream=False)
        provider = provider_for(fake, stream=True)
        provider.profile_for = lambda request: no_stream_profile  # type: ignore[method-assign]
        unsupported = await provider.complete(request)
    assert off == on == unsupported
    assert [bool(r["body"].get("stream")) for r in fake.requests] == [False, True, False]


@pytest.mark.parametrize(
    ("base_url", "model", "profile"),
    [
        (None, "gpt-4o-mini", "openai"),
        ("https://api.openai.com/v1", "o3-mini", "openai-reasoning"),
        ("https://api.openai.com/v1", "gpt-5", "openai-reasoning"),
        ("https://api.openai.com/v1", "o1", "openai-reasoning"),
        ("https://api.deepseek.com", "deepseek-reasoner", "deepseek"),
        ("https://dashscope.aliyuncs.com/compatible-mode/v1", "qwen-plus", "qwen"),
        ("https://dashscope-intl.aliyuncs.com/compatible-mode/v1", "qwen3-max", "qwen"),
        ("https://api.moonshot.cn/v1", "kimi-k2-thinking", "moonshot"),
        ("https://api.moonshot.ai/v1", "kimi-k2.5", "moonshot"),
        ("http://localhost:11434/v1", "qwen3", "ollama"),
        ("http://gpu-box:8000/v1", "Qwen/Qwen3-8B", "openai"),  # vLLM and llama.cpp are never guessed
    ],
)
def test_the_profile_is_chosen_from_the_base_url_where_it_is_unambiguous(base_url, model, profile):
    assert detect_profile(base_url, model) == profile
    assert resolve_profile("auto", base_url, model).name == profile
    assert resolve_profile("vllm", base_url, model).name == "vllm"


def test_an_unknown_profile_is_a_config_error_naming_the_choices(monkeypatch, tmp_path):
    with pytest.raises(ConfigError, match="unknown model profile 'deepsek'.*deepseek"):
        resolve_profile("deepsek", None, None)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HERMES_MODEL_PROFILE", "llamacpp")
    monkeypatch.setenv("HERMES_MODEL_STREAM", "false")
    provider = make_provider(Settings(model_provider="openai", openai_base_url="http://127.0.0.1:1/v1"))
    assert (provider.profile, provider.stream) == ("llamacpp", False)
    monkeypatch.setenv("HERMES_MODEL_PROFILE", "nope")
    with pytest.raises(ValueError, match="model_profile"):
        Settings()
    with pytest.raises(ValueError, match="model_profile"):
        SessionConfig(model_profile="nope")
    assert set(typing.get_args(ProviderProfileName)) == set(PROFILES) == set(FAKES)


async def test_a_sessions_profile_overrides_the_workers():
    with FakeProvider("openai-reasoning") as fake:
        provider = OpenAIProvider(model="my-o-model", base_url=fake.base_url, api_key="t", stream=False)
        request = CallModelInput(session_id="s", turn=1, messages=opening_messages(), max_output_tokens=50)
        with pytest.raises(ModelRequestError, match="max_tokens"):
            await provider.complete(request)  # a local URL: the openai profile's max_tokens
        await provider.complete(request.model_copy(update={"profile": "openai-reasoning"}))
    assert "max_completion_tokens" in fake.requests[-1]["body"]


def test_reasoning_survives_the_content_store_and_old_bodies_keep_their_references():
    plain = Message(role="assistant", content="hi")
    assert "reasoning" not in body_json(plain)
    assert message_ref(plain) == message_ref(Message.model_validate({"role": "assistant", "content": "hi"}))
    thinking = plain.model_copy(update={"reasoning": "先想想"})
    assert message_from_body(body_json(thinking)).reasoning == "先想想"
    assert message_ref(thinking) != message_ref(plain)


# ------------------------------------------------------ through a session


@pytest.mark.timeout(120)
async def test_a_deepseek_thinking_tool_turn_completes_through_a_session_and_its_reasoning_goes_back(run_worker, session_id):
    def answer(body: dict[str, Any]) -> Step:
        done = sum(1 for m in body["messages"] if m["role"] == "assistant")
        if done == 0:
            return Step(reasoning="先算 6*7，再看时间。", calls=[Call("calculate", '{"expression": "6 * 7"}'), Call("current_time", "")])
        return Step(reasoning="结果是 42。", content="6 × 7 = 42。")

    with FakeProvider("deepseek", answer=answer) as fake:
        provider = OpenAIProvider(model="deepseek-reasoner", base_url=fake.base_url, api_key="t", profile="deepseek")
        registry = register_builtins(ToolRegistry())
        async with run_worker(provider, registry=registry, memory=False, config=SessionConfig(model_profile="deepseek")) as hermes:
            result = await hermes.send_message(session_id, "6 乘 7 是多少？现在几点？")
            transcript = await hermes.get_transcript(session_id)

    assert result.status == "completed", result.reply
    assert result.reply == "6 × 7 = 42。" and "先算" not in result.reply
    assert [r.result.code for r in result.tool_calls] == [ToolResultCode.OK, ToolResultCode.OK]
    thinking = [m.reasoning for m in transcript if m.role == "assistant"]
    assert thinking == ["先算 6*7，再看时间。", "结果是 42。"]
    assert fake.refused == []
    second = fake.requests[-1]["body"]
    [sent] = [m for m in second["messages"] if m["role"] == "assistant"]
    assert sent["reasoning_content"] == "先算 6*7，再看时间。"
    assert json.loads(next(m for m in second["messages"] if m["role"] == "tool")["content"])["code"] == 0


def test_reasoning_is_carried_across_continue_as_new_and_old_carries_still_decode():
    from hermes.models import SessionCarry

    carry = SessionCarry(messages=[Message(role="assistant", content="42", reasoning="6*7")])
    assert SessionCarry.model_validate_json(carry.model_dump_json()).messages[0].reasoning == "6*7"
    old = '{"messages": [{"role": "assistant", "content": "42", "tool_calls": []}], "turn_count": 1}'
    assert SessionCarry.model_validate_json(old).messages[0].reasoning is None
