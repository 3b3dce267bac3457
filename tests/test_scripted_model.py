"""The packaged scripted stand-in (``hermes/scripts/demo.yaml``) answers what was asked.

No server: the model is called directly with the messages a session would send. The
captures of a turn's ``match`` go into the tool call (the expression, the city, the note),
replies stay in the language of the message, and the fallback names only what it does.
"""

from __future__ import annotations

import json
import re

import pytest

from hermes.content.context import memories_message
from hermes.errors import ConfigError
from hermes.models import CallModelInput, Message, ToolCall
from hermes.providers.scripted import ScriptedModel


def _ask(model: ScriptedModel, text: str, *, before: list[Message] | None = None) -> Message:
    messages = [*(before or []), Message(role="user", content=text)]
    return model.next_message(CallModelInput(session_id="s", messages=messages, turn=1, step=0))


def _answer(model: ScriptedModel, text: str, results: list[dict], *, before: list[Message] | None = None) -> str:
    """The reply after the first step's tool calls returned ``results`` (ToolResult dicts)."""
    first = _ask(model, text, before=before)
    if not first.tool_calls:
        return first.content or ""
    messages = [*(before or []), Message(role="user", content=text), first]
    for call, result in zip(first.tool_calls, results, strict=True):
        messages.append(Message(role="tool", tool_call_id=call.tool_call_id, name=call.name, content=json.dumps(result)))
    reply = model.next_message(CallModelInput(session_id="s", messages=messages, turn=1, step=1))
    return reply.content or ""


def _calls(message: Message) -> list[tuple[str, dict]]:
    return [(c.name, c.arguments) for c in message.tool_calls]


@pytest.fixture(scope="module")
def demo() -> ScriptedModel:
    return ScriptedModel.demo()


@pytest.mark.parametrize(
    ("text", "expression"),
    [("What is 2 ** 10?", "2 ** 10"), ("What is (17 + 25) * 3?", "(17 + 25) * 3"), ("算一下 12×(3+4)", "12×(3+4)")],
)
def test_the_calculator_gets_the_expression_of_the_message(demo, text, expression):
    assert _calls(_ask(demo, text)) == [("calculate", {"expression": expression})]
    assert _answer(demo, text, [{"code": 0, "data": {"value": 7}}]) == f"{expression} = 7."


@pytest.mark.parametrize(
    ("text", "timezone"),
    [("What time is it in Tokyo?", "Asia/Tokyo"), ("现在伦敦几点？", "Europe/London"), ("你好！现在上海几点？", "Asia/Shanghai")],
)
def test_the_clock_gets_the_city_of_the_message(demo, text, timezone):
    assert _calls(_ask(demo, text)) == [("current_time", {"timezone": timezone})]


def test_two_cities_get_two_calls_and_the_reply_names_them(demo):
    text = "What time is it in London and Sydney?"
    assert _calls(_ask(demo, text)) == [
        ("current_time", {"timezone": "Europe/London"}), ("current_time", {"timezone": "Australia/Sydney"})
    ]
    reply = _answer(demo, text, [{"code": 0, "data": {"time": "09:00"}}, {"code": 0, "data": {"time": "19:00"}}])
    assert reply == "London: 09:00, Sydney: 19:00."


@pytest.mark.parametrize(
    ("text", "note"),
    [("Save a note: buy milk and eggs", "buy milk and eggs"), ("请帮我记一条笔记：周五交报告", "周五交报告")],
)
def test_a_note_saves_the_text_of_the_message(demo, text, note):
    assert _calls(_ask(demo, text)) == [("save_note", {"title": note, "text": note})]


def test_a_long_note_gets_a_title_cut_at_a_word_end(demo):
    text = "Save a note: call the plumber about the leaking kitchen tap before Friday"
    ((_, arguments),) = _calls(_ask(demo, text))
    assert arguments["text"] == "call the plumber about the leaking kitchen tap before Friday"
    assert arguments["title"] == "call the plumber about the leaking…"


def test_a_chinese_question_gets_a_chinese_reply_without_english_words(demo):
    time_reply = _answer(
        demo, "现在上海几点？", [{"code": 0, "data": {"time": "10:00", "date": "2025-06-02", "weekday": "Monday"}}]
    )
    assert time_reply == "上海现在是 10:00（2025-06-02，星期一）。"
    note_reply = _answer(demo, "记一条笔记：周五交报告", [{"code": 0, "message": "note saved", "data": {"title": "周五交报告"}}])
    assert note_reply == "保存笔记“周五交报告”：已保存。"
    for reply in (time_reply, note_reply):
        assert not re.search(r"[A-Za-z]{2,}", reply), reply


def test_the_memory_answer_is_a_sentence_not_a_list(demo):
    memories = [memories_message(["(2025-06-01, score 0.91) The user lives in Zurich."])]
    assert _answer(demo, "Where do I live?", [], before=memories) == "From what I remember: The user lives in Zurich."
    assert _answer(demo, "Where do I live?", []) == "From what I remember: nothing about you yet."


def test_every_example_the_fallback_offers_is_answered_by_a_turn(demo):
    fallback = demo.script.fallback or ""
    examples = re.findall(r'"([^"]+)"', fallback)
    assert len(examples) >= 4, fallback
    for example in examples:
        assert _ask(demo, example).content != fallback, example
    assert _ask(demo, "Please book me a flight to Rome").content == fallback


def test_a_template_filter_that_is_neither_builtin_nor_a_table_is_a_config_error():
    script = {"turns": [{"match": "(?P<x>.)", "steps": [{"reply": "{{ match.x | nosuch }}"}]}]}
    with pytest.raises(ConfigError, match="nosuch"):
        ScriptedModel.from_dict(script)


def test_a_script_without_captures_plays_its_fixed_arguments_as_before():
    model = ScriptedModel.from_dict(
        {"turns": [{"match": "calc", "steps": [{"tool_calls": [{"name": "calculate", "arguments": {"expression": "1 + 1", "n": 3}}]}]}]}
    )
    assert _calls(_ask(model, "calc please")) == [("calculate", {"expression": "1 + 1", "n": 3})]
    assert isinstance(_ask(model, "calc").tool_calls[0], ToolCall)


@pytest.mark.parametrize(
    ("text", "pieces_at_least"), [("What is 2 ** 10?", 3), ("现在东京几点？", 4)],
)
async def test_the_packaged_script_streams_a_reply_in_pieces_in_either_language(demo, text, pieces_at_least):
    # Issue 32: with the packaged script nothing visibly streamed (every reply at once).
    from hermes.content import events

    class Collect:
        def __init__(self) -> None:
            self.pieces: list[str] = []

        def add(self, piece: str) -> None:
            self.pieces.append(piece)

    first = _ask(demo, text)
    messages = [Message(role="user", content=text), first]
    for call in first.tool_calls:
        messages.append(Message(role="tool", tool_call_id=call.tool_call_id, name=call.name,
                                content=json.dumps({"code": 0, "data": {"value": 1024, "time": "15:00"}})))
    collect = Collect()
    token = events._current_text.set(collect)  # type: ignore[arg-type]
    try:
        result = await demo.complete(CallModelInput(session_id="s", messages=messages, turn=1, step=1))
    finally:
        events._current_text.reset(token)
    assert result.message.content and "".join(collect.pieces) == result.message.content
    assert len(collect.pieces) >= pieces_at_least, collect.pieces


async def test_the_reported_prompt_tokens_are_the_context_tokens_also_for_texts_seen_before_and_large_ones(demo):
    from hermes.content.tokens import count_message_tokens

    call = ToolCall(tool_call_id="c1", name="calculate", arguments={"expression": "1 + 1"})
    big = "数据 data " * 4_000  # counted in a thread: long enough
    contexts = [
        [Message(role="user", content="What is 1 + 1?")],
        [
            Message(role="user", content="What is 1 + 1?"),  # seen before: remembered
            Message(role="assistant", tool_calls=[call]),
            Message(role="tool", content='{"code": 0, "data": {"value": 2}}', tool_call_id="c1"),
            Message(role="user", content=big),
        ],
        [Message(role="user", content=big), Message(role="user", content=big + "!")],
    ]
    for messages in contexts:
        result = await demo.complete(CallModelInput(session_id="s", turn=1, messages=messages))
        assert result.usage is not None and result.usage.prompt_tokens == count_message_tokens(messages)
