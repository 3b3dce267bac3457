"""A model call never queries its own session (issue 31, item 4): the session writes the
bodies it refers to into the content store before the call, or sends them inline, and a
body the store lost is written again, not asked for."""

from __future__ import annotations

import uuid

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest

from hermes.content.blobs import BODIES
from temporalio import workflow
from temporalio import client as temporal_client_module
from temporalio.client import Client
from temporalio.worker import (
    HandleQueryInput,
    Interceptor,
    WorkflowInboundInterceptor,
    WorkflowInterceptorClassInput,
)

from hermes.client import HermesClient
from hermes.infra.durable import DurableStore
from hermes.models import CallModelInput, CallModelResult, Message, SessionConfig, ToolCall
from tests.conftest import builtin_registry
from worker import build_worker


class QueryCounter(temporal_client_module.Interceptor, Interceptor):
    """Counts, by name, every query the worker's workflows answer (whoever sent it): a
    client interceptor that is also a worker's is used by the worker built on the client."""

    def __init__(self) -> None:
        self.queries: list[str] = []

    def workflow_interceptor_class(self, input: WorkflowInterceptorClassInput) -> type[WorkflowInboundInterceptor]:
        input.unsafe_extern_functions["count_query"] = self.queries.append

        class Counting(WorkflowInboundInterceptor):
            async def handle_query(self, input: HandleQueryInput) -> Any:
                workflow.extern_functions()["count_query"](input.query)
                return await super().handle_query(input)

        return Counting


class CalculatesThenAnswers:
    """Calls `calculate` once per turn, then answers with the tool's result; records
    every context it is sent."""

    name = "test"

    def __init__(self) -> None:
        self.calls: list[CallModelInput] = []

    async def complete(self, request: CallModelInput) -> CallModelResult:
        self.calls.append(request)
        if request.purpose == "summary":
            return CallModelResult(message=Message(role="assistant", content="the user asked for multiples of 7"), provider=self.name)
        last = request.messages[-1]
        if last.role == "user":
            call = ToolCall(tool_call_id=f"c{request.turn}", name="calculate", arguments={"expression": f"{request.turn}*7"})
            return CallModelResult(message=Message(role="assistant", tool_calls=[call]), provider=self.name)
        value = json.loads(last.content or "{}")["data"]["value"]
        return CallModelResult(message=Message(role="assistant", content=f"turn {request.turn}: {value}"), provider=self.name)


@asynccontextmanager
async def counted_worker(
    temporal_client: Client, settings: Any, redis: Any, provider: Any, config: SessionConfig | None = None, **kwargs: Any
) -> AsyncIterator[tuple[HermesClient, QueryCounter]]:
    """A worker whose client counts the queries its workflows answer."""
    counter = QueryCounter()
    client_config = temporal_client.config()
    client_config["interceptors"] = [counter]
    client = Client(**client_config)
    async with build_worker(client, settings, provider=provider, registry=builtin_registry(), redis=redis, **kwargs):
        yield (
            HermesClient(
                temporal_client, task_queue=settings.task_queue, redis=redis, config=config,
                durable=DurableStore(settings.resolved_memory_uri),
            ),
            counter,
        )


async def _blob_keys(redis: Any) -> list[Any]:
    return [key async for key in redis.scan_iter(match="hermes:blob:*")]


@pytest.mark.timeout(240)
async def test_ten_turns_with_tool_calls_are_answered_without_one_workflow_query(temporal_client, settings, redis, session_id):
    model = CalculatesThenAnswers()
    async with counted_worker(temporal_client, settings, redis, model, memory=False) as (hermes, counter):
        for turn in range(1, 11):
            result = await hermes.send_message(session_id, f"question {turn}")
            assert result.reply == f"turn {turn}: {turn * 7}", result
        model_calls = len(model.calls)
        assert model_calls == 20
        history = await temporal_client.get_workflow_handle(session_id).fetch_history()
        print(
            f"queries_per_model_call={len(counter.queries) / model_calls:.2f} "
            f"history_per_turn={len(history.events) / 10:.1f} events, {sum(e.ByteSize() for e in history.events) / 10:.0f} bytes"
        )
        assert counter.queries == []
    # The model saw the whole context: earlier turns' answers and this turn's tool result.
    last = [(m.role, m.content) for m in model.calls[-1].messages]
    assert ("user", "question 10") in last and ("assistant", "turn 9: 63") in last
    assert json.loads(model.calls[-1].messages[-1].content)["data"]["value"] == 70


@pytest.mark.timeout(240)
async def test_a_running_summary_is_made_without_a_workflow_query(temporal_client, settings, redis, session_id):
    model = CalculatesThenAnswers()
    config = SessionConfig(context_history_turns=1, summary_every_turns=2)
    async with counted_worker(temporal_client, settings, redis, model, config=config, memory=False) as (hermes, counter):
        for turn in range(1, 5):
            result = await hermes.send_message(session_id, f"question {turn}")
            assert result.reply == f"turn {turn}: {turn * 7}", result
        state = await hermes.get_state(session_id)
        summaries = [c for c in model.calls if c.purpose == "summary"]
        # only the state query above, which the test sent
        assert counter.queries == ["get_state"]
    assert summaries and state.summary is not None and state.summary.text == "the user asked for multiples of 7"
    assert "question 1" in summaries[0].messages[-1].content


@pytest.mark.timeout(240)
async def test_a_turn_whose_context_the_store_lost_is_answered_after_the_session_writes_it_again(
    temporal_client, settings, redis, session_id
):
    model = CalculatesThenAnswers()
    async with counted_worker(temporal_client, settings, redis, model, memory=False, max_cached_workflows=0) as (hermes, counter):
        first = await hermes.send_message(session_id, "question 1")
        assert first.reply == "turn 1: 7"
        # Redis lost every body (an eviction, a FLUSHALL, a restart without persistence):
        # the session still believes it wrote them.
        keys = await _blob_keys(redis)
        assert keys
        await redis.delete(*keys)
        # ... and the next step runs on a worker process that never held them (this
        # process's body cache would answer, as it does for a worker that stays up).
        BODIES.clear()
        second = await hermes.send_message(session_id, "question 2")
        assert second.reply == "turn 2: 14", second
        assert counter.queries == []
        trace = await hermes.get_trace(session_id)
    statuses = [s.status for s in trace if s.action_type == "model" and s.turn == 2]
    assert statuses[0] == "context_missing" and statuses[-1] == "ok", statuses
    assert [m.content for m in model.calls[-1].messages if m.role == "user"] == ["question 1", "question 2"]


@pytest.mark.timeout(240)
async def test_a_store_that_loses_the_context_again_ends_the_turn_with_an_error_and_the_session_stays_usable(
    temporal_client, settings, redis, session_id, monkeypatch
):
    from hermes.content.blobs import BlobStore

    async def forgets(self: BlobStore, refs: list[str]) -> dict[str, str]:
        return {}

    model = CalculatesThenAnswers()
    async with counted_worker(temporal_client, settings, redis, model, memory=False) as (hermes, counter):
        with monkeypatch.context() as patched:
            patched.setattr(BlobStore, "read_many", forgets)
            patched.setattr(BODIES, "get", lambda refs: {})  # nor does this process keep them
            failed = await hermes.send_message(session_id, "question 1")
        assert failed.status == "model_error" and "not in the content store" in failed.reply, failed
        answered = await hermes.send_message(session_id, "question 2")
        assert answered.reply == "turn 2: 14", answered
        assert counter.queries == []
        trace = await hermes.get_trace(session_id)
    assert [s.status for s in trace if s.action_type == "model" and s.turn == 1] == ["context_missing", "error"]
    assert len(model.calls) == 2  # the provider was never asked without its context


@pytest.mark.timeout(240)
async def test_bodies_the_store_does_not_take_go_inline_and_the_turn_is_answered(
    temporal_client, settings, redis, session_id, monkeypatch
):
    from redis.exceptions import ConnectionError as RedisConnectionError

    from hermes.content.blobs import BlobStore

    async def refused(self: BlobStore, items: dict[str, str], *, expire: bool = True) -> None:
        raise RedisConnectionError("Redis refuses writes (test)")

    monkeypatch.setattr(BlobStore, "put_many", refused)
    model = CalculatesThenAnswers()
    async with counted_worker(temporal_client, settings, redis, model, memory=False) as (hermes, counter):
        for turn in (1, 2):
            result = await hermes.send_message(session_id, f"question {turn}")
            assert result.reply == f"turn {turn}: {turn * 7}", result
        assert counter.queries == []
    inline = model.calls[-1].bodies
    assert model.calls[-1].bodies_stored and any('"question 2"' in body for body in inline.values())


async def test_a_model_call_of_a_session_that_stored_its_bodies_never_queries_and_names_what_is_missing():
    from temporalio.exceptions import ApplicationError

    from activities.model import ModelActivities
    from hermes.content.blobs import BlobStore

    class NoQueries:
        def get_workflow_handle(self, session_id: str) -> Any:
            raise AssertionError("a model call queried its session")

    activities = ModelActivities(CalculatesThenAnswers(), store=BlobStore(None), client=NoQueries())
    request = CallModelInput(session_id="s", turn=1, step=0, context_ref="b:" + "1" * 32, bodies_stored=True)
    with pytest.raises(ApplicationError) as raised:
        await activities.call_model(request)
    assert raised.value.type == "ContextBodiesMissingError" and raised.value.non_retryable
    assert raised.value.details == (["b:" + "1" * 32],)


async def test_a_summary_of_a_session_that_stored_its_bodies_reads_its_input_and_never_queries():
    from temporalio.exceptions import ApplicationError

    from activities.model import ModelActivities
    from hermes.content.blobs import BlobStore, body_json, message_ref
    from hermes.models import SummarizeInput

    class NoQueries:
        def get_workflow_handle(self, session_id: str) -> Any:
            raise AssertionError("a summary queried its session")

    model = CalculatesThenAnswers()
    activities = ModelActivities(model, store=BlobStore(None), client=NoQueries())
    said = Message(role="user", content="my cat is called Miso")
    request = SummarizeInput(
        session_id="s", message_refs=[message_ref(said)], message_turns=[1], upto_turn=1, bodies_stored=True,
        bodies={message_ref(said): body_json(said)},
    )
    summary = await activities.summarize_context(request)
    assert summary.text == "the user asked for multiples of 7"
    assert "my cat is called Miso" in model.calls[-1].messages[-1].content
    with pytest.raises(ApplicationError) as raised:
        await activities.summarize_context(request.model_copy(update={"bodies": {}}))
    assert raised.value.type == "ContextBodiesMissingError"


async def test_bodies_this_process_stored_are_read_from_memory_and_its_cache_stays_bounded(redis):
    from temporalio.exceptions import ApplicationError

    from activities.model import ModelActivities
    from hermes.content.blobs import BlobStore, BodyCache
    from hermes.models import StoreBodiesInput

    store = BlobStore(redis)
    activities = ModelActivities(CalculatesThenAnswers(), store=store)
    assert await activities.store_message_bodies(StoreBodiesInput(session_id="s", bodies={"m:kept-here": "alpha"}))
    await redis.flushall()  # a body in memory is the same text: its reference is its hash
    assert await activities.from_store(["m:kept-here"], {}) == {"m:kept-here": "alpha"}
    assert await store.get_many(["m:kept-here"]) == {}  # the store itself says what Redis holds
    with pytest.raises(ApplicationError):
        await activities.from_store(["m:never"], {})

    cache = BodyCache(max_chars=100)
    cache.put({f"m:{i}": str(i) * 25 for i in range(1, 5)})
    cache.get(["m:1"])  # used: the least recently used is now m:2
    cache.put({"m:5": "5" * 25, "m:huge": "h" * 26})  # over a quarter of the cache: not kept
    assert set(cache.get([f"m:{i}" for i in range(1, 6)] + ["m:huge"])) == {"m:1", "m:3", "m:4", "m:5"}


def test_decoded_context_messages_are_shared_and_their_cache_stays_bounded(monkeypatch: pytest.MonkeyPatch):
    from hermes.content import blobs
    from hermes.content.blobs import BodyCache, body_json, message_of_ref, message_ref

    called = Message(role="assistant", content="x", tool_calls=[ToolCall(tool_call_id="c1", name="f", arguments={"a": [1]})])
    # Decoded once per process: every step reading it gets the same (read-only) message.
    assert message_of_ref(message_ref(called), body_json(called)) is message_of_ref(message_ref(called), body_json(called))

    decoded = BodyCache(64 * 200, max_item_chars=200, size=lambda held: held[1])
    monkeypatch.setattr(blobs, "DECODED", decoded)
    refs = []
    for i in range(300):
        said = Message(role="user", content=f"message {i:03d}")
        refs.append(message_ref(said))
        message_of_ref(refs[-1], body_json(said))
    held = decoded.get(refs)
    assert sum(size for _, size in held.values()) == decoded.chars <= 64 * 200
    assert refs[-1] in held and refs[0] not in held


def test_a_context_decoded_in_one_go_gives_each_reference_its_shared_message_in_order():
    from hermes.content.blobs import body_json, message_of_ref, message_ref, messages_of_refs

    said = [Message(role="user", content=f"one-go {i} {uuid.uuid4()}") for i in range(3)]
    called = Message(role="assistant", content="", tool_calls=[ToolCall(tool_call_id="c9", name="f", arguments={"b": 2})])
    texts = {message_ref(m): body_json(m) for m in [*said, called]}
    refs = [message_ref(said[0]), message_ref(called), message_ref(said[0]), message_ref(said[2])]
    known = message_of_ref(refs[1], texts[refs[1]])  # decoded before, by the one-by-one path
    messages = messages_of_refs(refs, texts)
    assert [m.content for m in messages] == [said[0].content, "", said[0].content, said[2].content]
    assert messages[1] is known and messages[0] is messages[2]
    assert messages_of_refs(refs, texts)[3] is messages[3] is message_of_ref(refs[3], texts[refs[3]])


@pytest.mark.parametrize("profile", ["openai", "deepseek", "ollama", "scripted"])
async def test_no_model_call_changes_the_shared_decoded_context(profile: str, redis: Any):
    """The decoded messages of a context and its tool list are shared by every step of
    every session in the process (``message_of_ref``, ``tools_of_ref``): a provider, a profile's dialect or the activity's own
    handling (tool-call arguments kept by reference, streamed or not) must leave them as
    they were decoded, or another session's next step would send changed messages."""
    from activities.model import ModelActivities
    from hermes.content.blobs import DECODED, TOOL_LISTS, BlobStore, body_json, message_from_body, message_ref, value_ref
    from hermes.providers.openai import OpenAIProvider
    from hermes.providers.scripted import ScriptedModel
    from tests.fake_providers import TOOLS, FakeProvider, opening_messages, tool_messages

    store = BlobStore(redis)
    fake = FakeProvider("openai" if profile == "scripted" else profile)
    with fake:
        plain = OpenAIProvider(model="m", base_url=fake.base_url, api_key="k", profile="openai" if profile == "scripted" else profile, stream=False)
        calls = (await plain.complete(CallModelInput(session_id="s", turn=1, messages=opening_messages()))).message
        calls = calls.model_copy(update={"reasoning": "thinking it over", "turn": 1})
        kept = calls.tool_calls[0]
        arguments_ref = value_ref(json.dumps(kept.arguments))
        await store.put_many({arguments_ref: json.dumps(kept.arguments)})
        # One call's arguments are kept by reference: the activity puts them back (on a copy).
        calls.tool_calls[0] = kept.model_copy(update={"arguments": {}, "arguments_ref": arguments_ref})
        context = [*opening_messages(), calls, *tool_messages(calls)]
        refs = [message_ref(m) for m in context]
        bodies = {r: body_json(m) for r, m in zip(refs, context, strict=True)}
        context_ref = value_ref(refs)
        bodies[context_ref] = json.dumps(refs)
        tools_json = [t.model_dump(mode="json") for t in TOOLS]
        tools_ref = value_ref(tools_json)  # the tool list by reference, as a session sends it
        bodies[tools_ref] = json.dumps(tools_json, ensure_ascii=False)
        providers: list[Any] = (
            [ScriptedModel.from_dict({"turns": [{"match": ".", "steps": [{"reply": "first"}, {"reply": "second"}]}]})]
            if profile == "scripted"
            else [plain, OpenAIProvider(model="m", base_url=fake.base_url, api_key="k", profile=profile)]
        )
        for step, provider in enumerate(providers):
            activities = ModelActivities(provider, store=store)
            request = CallModelInput(
                session_id="s", turn=1, step=step, context_ref=context_ref, tools_ref=tools_ref, bodies=bodies, bodies_stored=True
            )
            before = {r: held[0].model_dump() for r, held in DECODED.get(refs).items()}
            result = await activities.call_model(request)
            assert result.message.content or result.message.tool_calls
            after = DECODED.get(refs)
            assert set(after) == set(refs)
            assert {r: held[0].model_dump() for r, held in after.items() if r in before} == before
            assert {r: held[0].model_dump() for r, held in after.items()} == {r: message_from_body(bodies[r]).model_dump() for r in refs}
            assert [spec.model_dump(mode="json") for spec in TOOL_LISTS.get([tools_ref])[tools_ref][0]] == tools_json


def _store_markers(history: Any) -> int:
    """``store_message_bodies`` local activities in a history (their markers)."""
    from hermes import names

    return sum(
        names.STORE_MESSAGE_BODIES.encode()
        in b"".join(p.data for v in e.marker_recorded_event_attributes.details.values() for p in v.payloads)
        for e in history.events
        if e.HasField("marker_recorded_event_attributes")
    )


@pytest.mark.timeout(240)
async def test_a_steps_new_bodies_ride_with_the_model_call_and_no_local_activity_writes_them(
    temporal_client, settings, redis, session_id
):
    model = CalculatesThenAnswers()
    async with counted_worker(temporal_client, settings, redis, model, memory=False) as (hermes, counter):
        for turn in range(1, 6):
            result = await hermes.send_message(session_id, f"question {turn}")
            assert result.reply == f"turn {turn}: {turn * 7}", result
        history = await temporal_client.get_workflow_handle(session_id).fetch_history()
        assert counter.queries == []
    # Only the first call offering each tool list wrote bodies first (a tool list never
    # goes inline: kilobytes of schemas). Every other call sent its few new bodies inline
    # and its context list as a change to the previous call's.
    firsts = {c.tools_ref: c for c in reversed(model.calls)}
    assert _store_markers(history) == len(firsts) <= 3
    changed = [c for c in model.calls if c not in firsts.values()]
    assert len(changed) >= 7 and all(c.context_base and c.context_parts for c in changed)
    # ... and every model call still saw its whole context, in order.
    last = [(m.role, m.content) for m in model.calls[-1].messages if m.role in ("user", "assistant") and m.content]
    assert last == [(r, t) for n in range(1, 5) for r, t in (("user", f"question {n}"), ("assistant", f"turn {n}: {n * 7}"))] + [
        ("user", "question 5")
    ]


@pytest.mark.timeout(240)
async def test_large_new_bodies_are_written_by_the_local_activity_not_recorded_inline(
    temporal_client, settings, redis, session_id
):
    from workflows.session.context_plan import INLINE_BODIES_CHARS

    model = CalculatesThenAnswers()
    async with counted_worker(temporal_client, settings, redis, model, memory=False) as (hermes, _):
        assert (await hermes.send_message(session_id, "question 1")).reply == "turn 1: 7"
        assert (await hermes.send_message(session_id, "question 2")).reply == "turn 2: 14"
        before = _store_markers(await temporal_client.get_workflow_handle(session_id).fetch_history())
        big = "question 3 " + "x" * (INLINE_BODIES_CHARS + 100)
        assert (await hermes.send_message(session_id, big)).reply == "turn 3: 21"
        history = await temporal_client.get_workflow_handle(session_id).fetch_history()
    assert _store_markers(history) == before + 1  # the call with the large message only
    step0, step1 = [c for c in model.calls if c.turn == 3]
    assert not step0.context_base and step1.context_base
    assert step0.messages[-1].content == big


async def test_a_context_sent_as_a_change_is_checked_stored_and_its_lost_base_named(redis):
    from temporalio.exceptions import ApplicationError

    from activities.model import ModelActivities
    from hermes.content.blobs import BlobStore, body_json, message_ref, value_ref

    first, second = Message(role="user", content="one"), Message(role="user", content="two")
    base = [message_ref(first)]
    base_ref, new = value_ref(base), [message_ref(first), message_ref(second)]
    store = BlobStore(redis)
    await store.put_many({base_ref: json.dumps(base), message_ref(first): body_json(first)})
    BODIES.clear()
    model = CalculatesThenAnswers()
    activities = ModelActivities(model, store=store)
    request = CallModelInput(
        session_id="s", turn=1, step=0, context_ref=value_ref(new), bodies_stored=True, context_base=base_ref,
        context_parts=[[0, 1], message_ref(second)], bodies={message_ref(second): body_json(second)},
    )
    resolved = await activities.resolve_context(request)
    assert [m.content for m in resolved.messages] == ["one", "two"]
    BODIES.clear()
    # The list is stored under its own reference: a retry or the next call reads it whole.
    assert json.loads((await store.get_many([value_ref(new)]))[value_ref(new)]) == new
    wrong = request.model_copy(update={"context_parts": [[0, 0], message_ref(second)]})  # ["two"]: not the list named
    with pytest.raises(ApplicationError) as raised:
        await activities.resolve_context(wrong)
    assert raised.value.type == "ContextBodiesMissingError" and raised.value.details == ([value_ref(new)],)
    await redis.delete(f"hermes:blob:{base_ref}")
    BODIES.clear()
    with pytest.raises(ApplicationError) as raised:
        await activities.resolve_context(request)
    assert raised.value.type == "ContextBodiesMissingError" and raised.value.details == ([base_ref],)
    assert raised.value.non_retryable and not model.calls  # the provider never asked without its context


def test_a_context_list_is_sent_as_runs_of_the_previous_one_and_new_references():
    from workflows.session.context_plan import list_change

    def applied(base: list[str], parts: list[Any]) -> list[str]:
        return [r for p in parts for r in ([p] if isinstance(p, str) else base[p[0] : p[1]])]

    system, turns = ["sys"], [[f"u{t}", f"c{t}", f"r{t}", f"a{t}"] for t in range(40)]
    base = system + [r for t in turns[:30] for r in t]
    cases = {
        "a step's new messages": base + ["u30"],
        "the oldest turn dropped": system + [r for t in turns[1:31] for r in t],
        "an older turn's tool step dropped": system + [r for t in turns[:30] for r in (t if t is not turns[5] else [t[0], t[3]])],
        "a summary in front": ["sys", "summary"] + base[5:] + ["u30"],
        "the same list": list(base),
        "a list with repeats": base + ["sys", "u0", "c0"],
    }
    for name, new in cases.items():
        parts = list_change(base, new)
        assert parts is not None and applied(base, parts) == new, name
        assert len(parts) <= 6, (name, parts)
    assert list_change(base, [f"x{i}" for i in range(17)]) is None  # too many new references
    assert list_change(base, base[::2]) is None  # too many runs
    assert list_change([], ["a"]) == ["a"] and list_change(["a"], []) == []
