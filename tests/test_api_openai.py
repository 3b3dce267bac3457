"""The OpenAI-compatible endpoint (hermes/api/openai_compat.py) driven by the `openai`
Python client over real HTTP: models, a completion, a streamed completion whose text is the answer
alone (tool progress only when asked, as reasoning_content or text), an approval wait reported and then decided, and the errors an OpenAI
client raises from (no session id, another user's session, a request's own tools)."""

from __future__ import annotations

import asyncio
import uuid

import openai
import pytest

from hermes.infra.stack import free_port
from hermes.providers.scripted import ScriptedModel
from hermes.settings import Settings
from tests.test_api import api_server, assert_problem, auth, keys  # noqa: F401 - the fixture
from tests.test_cli import NOTE_MESSAGE
from tests.test_events import STREAMING_SCRIPT


def _client(http, key: str, session_id: str | None) -> openai.AsyncOpenAI:
    headers = {"X-Hermes-Session-Id": session_id} if session_id else {}
    return openai.AsyncOpenAI(base_url=f"{http.base_url}/v1", api_key=key, default_headers=headers, max_retries=0)


@pytest.mark.timeout(900)
async def test_an_openai_client_talks_to_a_durable_session(run_worker, settings, keys):  # noqa: F811
    async with run_worker(STREAMING_SCRIPT, memory=False) as hermes, api_server(settings, keys["path"], hermes) as http:
        sid = f"oai-{uuid.uuid4().hex[:8]}"
        client = _client(http, keys["alice"], sid)
        assert [m.id for m in (await client.models.list()).data] == ["hermes"]

        done = await client.chat.completions.create(model="hermes", messages=[{"role": "user", "content": "now talk"}])
        assert done.object == "chat.completion" and done.model == "hermes"
        assert done.choices[0].message.content == "Plain words streamed one by one to the caller."
        assert done.choices[0].finish_reason == "stop"

        # Streamed; earlier messages of the request are ignored (the session holds the history).
        stream = await client.chat.completions.create(
            model="hermes", stream=True, stream_options={"include_usage": True},
            messages=[{"role": "user", "content": "ignored"}, {"role": "assistant", "content": "ignored"},
                      {"role": "user", "content": "please add these"}],
        )
        pieces, finishes = [], []
        async for chunk in stream:
            for choice in chunk.choices:
                pieces.append(choice.delta.content or "")
                finishes.append(choice.finish_reason)
        # By default the streamed content is the answer's text, with no tool progress in it.
        assert "".join(pieces) == "The sum of nineteen and twenty-three is 42, as the calculator says."
        assert len([p for p in pieces if p]) > 1 and finishes[-1] == "stop"  # streamed, not in one piece

        # Asked for, tool progress comes apart from the answer, as reasoning_content lines.
        stream = await client.chat.completions.create(
            model="hermes", stream=True, messages=[{"role": "user", "content": "please add these again"}],
            extra_headers={"X-Hermes-Tool-Progress": "reasoning"},
        )
        pieces, progress = [], []
        async for chunk in stream:
            for choice in chunk.choices:
                pieces.append(choice.delta.content or "")
                progress.append(getattr(choice.delta, "reasoning_content", None) or "")
        assert "".join(pieces) == "The sum of nineteen and twenty-three is 42, as the calculator says."
        lines = "".join(progress)
        assert '> tool calculate {"expression": "19+23"}' in lines and "> calculate: code 0" in lines
        users = [m.content for m in await hermes.get_transcript(sid) if m.role == "user"]
        assert users == ["now talk", "please add these", "please add these again"]
        assert (await hermes.get_state(sid)).user_id == "alice"

        # Errors an OpenAI client raises, with the reason.
        with pytest.raises(openai.BadRequestError, match="X-Hermes-Session-Id"):
            await _client(http, keys["alice"], None).chat.completions.create(model="hermes", messages=[{"role": "user", "content": "hi"}])
        with pytest.raises(openai.NotFoundError, match="no session"):
            await _client(http, keys["bob"], sid).chat.completions.create(model="hermes", messages=[{"role": "user", "content": "hi"}])
        with pytest.raises(openai.UnprocessableEntityError, match="tools"):
            await client.chat.completions.create(
                model="hermes", messages=[{"role": "user", "content": "hi"}],
                tools=[{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
            )
        with pytest.raises(openai.UnprocessableEntityError, match="the user's"):
            await client.chat.completions.create(model="hermes", messages=[{"role": "assistant", "content": "hi"}])
        with pytest.raises(openai.AuthenticationError):
            await _client(http, "hk_wrong", sid).models.list()
        with pytest.raises(openai.BadRequestError, match="X-Hermes-Tool-Progress"):
            await client.chat.completions.create(
                model="hermes", stream=True, messages=[{"role": "user", "content": "hi"}],
                extra_headers={"X-Hermes-Tool-Progress": "loud"},
            )
        assert (await hermes.get_state(sid)).turn_count == 3


@pytest.mark.timeout(900)
async def test_a_streamed_completion_reports_an_approval_wait_and_goes_on_once_decided(run_worker, settings, keys):  # noqa: F811
    async with run_worker(ScriptedModel.demo(), memory=False) as hermes, api_server(settings, keys["path"], hermes) as http:
        sid = f"oai-{uuid.uuid4().hex[:8]}"
        client = _client(http, keys["alice"], sid)
        stream = await client.chat.completions.create(
            model="hermes", stream=True, messages=[{"role": "user", "content": NOTE_MESSAGE}],
            extra_headers={"X-Hermes-Tool-Progress": "content"},
        )
        text = ""
        async for chunk in stream:
            text += "".join(c.delta.content or "" for c in chunk.choices)
            if "> waiting for approval of save_note" in text and "approved" not in text:
                [pending] = await hermes.get_pending_approvals(sid)
                assert f"approvals/{pending.tool_call_id}/approve" in text
                r = await http.post(f"/v1/sessions/{sid}/approvals/{pending.tool_call_id}/approve", headers=auth(keys["alice"]))
                assert r.status_code == 200, r.text
                text += "[approved]"
        assert "> save_note: approved by alice" in text and "> save_note: code 0" in text
        assert text.rstrip().endswith("已保存。")
        await asyncio.sleep(0)


@pytest.mark.timeout(120)
async def test_a_completion_request_is_strict_and_a_field_that_would_change_the_contract_is_a_422_naming_it(keys):  # noqa: F811
    # Validation comes before Temporal: no server behind this app, so a request that
    # passes it is answered 503.
    nowhere = Settings(temporal_address=f"127.0.0.1:{free_port()}", redis_url=f"redis://127.0.0.1:{free_port()}/0")
    base = {"model": "hermes", "messages": [{"role": "user", "content": "hi"}]}
    headers = {**auth(keys["alice"]), "X-Hermes-Session-Id": "oai-strict"}
    function = {"name": "f", "parameters": {"type": "object"}}
    refused = [
        ({"functions": [function]}, "functions"),
        ({"function_call": "auto"}, "function_call"),
        ({"function_call": {"name": "f"}}, "function_call"),
        ({"tools": [{"type": "function", "function": function}]}, "tools"),
        ({"tool_choice": "none"}, "tool_choice"),
        ({"response_format": {"type": "json_object"}}, "response_format"),
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {}}}}, "response_format"),
        ({"n": 2}, "n"),
        ({"logprobs": True}, "logprobs"),
        ({"modalities": ["text", "audio"]}, "modalities"),
        # Strict types: these used to be coerced ("yes" and 1 to true).
        ({"stream": "yes"}, "stream"),
        ({"stream": 1}, "stream"),
        ({"stream": True, "stream_options": {"include_usage": "true"}}, "stream_options.include_usage"),
        ({"temperature": "0.5"}, "temperature"),
        ({"not_an_openai_field": 1}, "not_an_openai_field"),
        ({"messages": [{"role": "user", "content": 7}]}, "messages.0.content"),
    ]
    accepted = [
        {"temperature": 0.2, "top_p": 1, "max_tokens": 50, "stop": ["\n\n"], "seed": 1, "metadata": {"a": "b"}},
        {"n": 1, "response_format": {"type": "text"}, "logprobs": False, "modalities": ["text"], "user": "oai-strict"},
        {"tools": [], "functions": [], "stream": False, "stream_options": {"include_usage": True}, "store": False},
    ]
    async with api_server(nowhere, keys["path"]) as http:
        for extra, field in refused:
            r = await http.post("/v1/chat/completions", json={**base, **extra}, headers=headers)
            doc = assert_problem(r, 422, "validation-failed")
            assert doc["error"]["param"].startswith(field), (extra, doc)  # (a union adds its member)
            assert field.split(".")[0] in doc["error"]["message"], (extra, doc)
        for extra in accepted:
            r = await http.post("/v1/chat/completions", json={**base, **extra}, headers=headers)
            assert r.status_code == 503, (extra, r.text)  # past validation: Temporal is needed
        # Through the OpenAI SDK: it raises the 422 with the field's name.
        client = _client(http, keys["alice"], "oai-strict")
        with pytest.raises(openai.UnprocessableEntityError, match="response_format"):
            await client.chat.completions.create(
                model="hermes", messages=[{"role": "user", "content": "hi"}], response_format={"type": "json_object"}
            )
