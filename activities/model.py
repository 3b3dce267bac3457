"""The model activities: one call to the configured provider, and context summaries.

A model call's input in workflow history carries references, not message bodies
(DESIGN.md, "How history stays small"): :func:`resolve_context` turns them back into
messages from the content store (Redis, then the durable store) and the bodies sent
inline (a step's new ones, stored here for the next call, which may also send its context
list as a change to this one's). The session wrote every other body it refers to before
the call (``store_message_bodies``, ``bodies_stored``), so the activity never queries it: a body
missing from both is a ``ContextBodiesMissingError`` (not retried; the session writes it
again and calls once more). Only calls of runs recorded before that (``bodies_stored``
false) still ask their session, with the ``get_message_bodies`` query, for what the store
does not have.
"""

from __future__ import annotations

import asyncio
import json
import logging
from datetime import timedelta
from typing import Any, Callable, TypeVar

from temporalio import activity
from temporalio.client import WorkflowQueryFailedError
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError, RPCStatusCode

from activities.heartbeat import beat, heartbeating
from activities.model_steps import ModelSteps
from hermes import names
from hermes.infra import cpu_pool, telemetry
from hermes.content.blobs import (
    BODIES,
    MAX_INLINE_ARGUMENTS_BYTES,
    BlobStore,
    arguments_stand_in,
    message_from_body,
    messages_of_refs,
    stored_preview,
    tools_of_ref,
    value_ref,
)
from hermes.content.events import PUBLISH_TIMEOUT_SECONDS, EventLog, model_call_events
from hermes.errors import (
    ContextBodiesMissingError,
    ContextTooLongError,
    ModelRequestError,
    ModelUnavailableError,
    ScriptExhaustedError,
    failed_to_replay,
)
from hermes.content import usage
from hermes.models import (
    CallModelInput,
    CallModelResult,
    CountTokensInput,
    Degradation,
    Message,
    StoreBodiesInput,
    SummarizeInput,
    Summary,
    TurnStartOutcome,
)
from hermes.content.previews import head_and_tail
from hermes.providers.base import ModelProvider
from hermes.infra.redis_writes import report_skipped
from hermes.content.tokens import DEFAULT_ENCODING, TokenCounter
from hermes.tools.arguments import MAX_NESTING, _nesting

log = logging.getLogger("hermes.activities.model")

T = TypeVar("T")

MAX_REPLY_BYTES = 256_000
"""A model reply larger than this (UTF-8) is stored by reference; the session keeps a
preview (activity results must stay under Temporal's 2 MB payload limit)."""
SESSION_QUERY_PATIENCE_SECONDS = 60.0
"""How long a model call keeps asking its session for context it cannot find in the
content store (Redis down or flushed) before the attempt fails: a Redis outage of
20-30 s, or a session whose worker is busy or was just killed, costs the turn a wait,
not its answer. The call heartbeats meanwhile; ``model_timeout_seconds`` (120 s) still
bounds it."""
SESSION_QUERY_RPC_SECONDS = 10.0
"""Each query's own RPC deadline."""
_FINAL_QUERY_STATUSES = frozenset(
    {
        RPCStatusCode.NOT_FOUND,
        RPCStatusCode.INVALID_ARGUMENT,
        RPCStatusCode.PERMISSION_DENIED,
        RPCStatusCode.UNAUTHENTICATED,
        RPCStatusCode.UNIMPLEMENTED,
    }
)
"""Query failures that another try cannot change (the session is gone, or the request is
wrong); every other one (a timeout, an unavailable server, a workflow task in failed
state) is retried within :data:`SESSION_QUERY_PATIENCE_SECONDS`."""

SUMMARY_INSTRUCTION = (
    "You maintain the running summary of a conversation between a user and an assistant. "
    "Fold the previous summary and the conversation below into one new summary of at most "
    "{max_tokens} tokens. Keep what later turns may need: the user's facts, preferences, "
    "decisions, open tasks, names, numbers, dates and the results of tool calls. Write it in "
    "the conversation's language, as plain prose or short bullet points, without a preamble."
)


def _refuse_deep_arguments(result: CallModelResult) -> CallModelResult:
    """``result`` with each tool call nested deeper than ``MAX_NESTING`` turned into an
    arguments error (a code-1 result): the workflow decodes this payload with pydantic,
    whose JSON parser stops at 200 levels, and a payload it cannot decode fails
    every workflow task of the session."""
    calls = result.message.tool_calls
    if not any(_nesting(c.arguments, MAX_NESTING) > MAX_NESTING for c in calls):
        return result
    fixed = [
        c.model_copy(
            update={
                "arguments": {},
                "arguments_error": f"arguments: expected a JSON object nested at most {MAX_NESTING} levels deep",
            }
        )
        if _nesting(c.arguments, MAX_NESTING) > MAX_NESTING
        else c
        for c in calls
    ]
    return result.model_copy(update={"message": result.message.model_copy(update={"tool_calls": fixed})})


SMALL_REPLY_UNITS = 8192
"""A reply with at most this many characters of text and argument values (and nodes) is
checked inline: under the inline-arguments, reply and nesting limits by construction."""


def _is_small(result: CallModelResult, budget: int = SMALL_REPLY_UNITS) -> bool:
    """Whether the reply's text, reasoning and tool-call arguments come to at most
    ``budget`` characters and nodes; stops counting at the budget, so the check itself
    costs at most ``budget`` steps however large the reply is."""
    message = result.message
    used = len(message.content or "") + len(message.reasoning or "")
    stack: list[Any] = [c.arguments for c in message.tool_calls]
    while stack:
        if used > budget:
            return False
        value = stack.pop()
        used += 1
        if isinstance(value, str):
            used += len(value)
        elif isinstance(value, dict):
            used += sum(len(k) for k in value) if len(value) < budget else budget
            stack.extend(value.values())
        elif isinstance(value, list):
            stack.extend(value)
    # Characters are at most 4 UTF-8 bytes (6 as JSON escapes): far under the 64 KB
    # inline-arguments and 256 KB reply limits.
    return used <= budget


COUNT_IN_POOL_CHARS = 16_384
"""Texts at least this long are counted in the CPU pool (:mod:`hermes.infra.cpu_pool`),
shorter ones in a thread here. Measured on a 2-core machine: cl100k counts 10,000
characters in about 0.4 ms and 100,000 in about 5 ms (1 MB: 45 ms), and a pool round
trip of a short call costs about 0.2 ms plus the pickling of the text: under about 16 KB
the hop costs as much as the work, and the GIL is held for under a millisecond."""


async def _off_loop(large: bool, fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` off the event loop: in the CPU pool when ``large`` (see
    :data:`COUNT_IN_POOL_CHARS`), else in a thread of this process."""
    if large:
        return await cpu_pool.run_cpu(fn, *args)
    return await asyncio.to_thread(fn, *args)


def _count_text(encoding: str, text: str) -> int:
    """Tokens of ``text`` in ``encoding`` (a CPU pool child runs it)."""
    return TokenCounter.get_or_default(encoding).text(text)


def _large_arguments(calls: list[Any]) -> dict[int, tuple[str, str]]:
    """Index -> (reference, JSON text) of the tool calls whose arguments are over
    :data:`MAX_INLINE_ARGUMENTS_BYTES` (calls already refused or kept are skipped)."""
    large: dict[int, tuple[str, str]] = {}
    for index, call in enumerate(calls):
        if call.arguments_error is not None or call.arguments_ref is not None:
            continue
        text = json.dumps(call.arguments, ensure_ascii=False)
        if len(text.encode("utf-8", "surrogatepass")) > MAX_INLINE_ARGUMENTS_BYTES:
            large[index] = (value_ref(call.arguments), text)
    return large


def _bodies_missing(refs: list[str], why: str) -> ApplicationError:
    """The ``ContextBodiesMissingError`` (not retried) naming ``refs``, logged with ``why``
    (empty, or a clause ending in "; "): the session writes its context again and calls once more."""
    err = ContextBodiesMissingError(refs)
    session = activity.info().workflow_id if activity.in_activity() else "-"
    log.warning("%s (%ssession %s writes them again)", err, why, session)
    return ApplicationError(str(err), err.refs, type=type(err).__name__, non_retryable=True)


def _counted(result: CallModelResult, encoding: str) -> CallModelResult:
    """``result`` with the reply's tokens counted (``Message.tokens``) in the session's
    ``encoding``, so that the session never encodes a reply itself (its tool-call
    arguments may be megabytes); unchanged when the session sent no encoding."""
    if not encoding:
        return result
    tokens = TokenCounter.get_or_default(encoding).message(result.message)
    return result.model_copy(update={"message": result.message.model_copy(update={"tokens": tokens})})


PROVIDER_RETRY_FIRST_SECONDS = 0.5
"""First wait before a call the provider failed (429, 5xx, a dropped connection) is sent
again: the openai SDK's own first delay. It doubles per attempt up to
:data:`PROVIDER_RETRY_MAX_SECONDS`. A call whose worker died is retried sooner, after the
workflow's retry policy's 0.1 s: that wait is part of the time to the reply."""
PROVIDER_RETRY_MAX_SECONDS = 30.0


def provider_retry_delay(retry_after_seconds: float | None) -> timedelta:
    """How long the next attempt waits after the provider failed this one.

    Args:
        retry_after_seconds: the provider's ``Retry-After``, if it sent one (honoured as is).

    Returns:
        ``Retry-After`` when given, else 0.5 s x 2^(attempt - 1), at most 30 s (the attempt
        from :func:`temporalio.activity.info`; 1 outside an activity).
    """
    if retry_after_seconds is not None:
        return timedelta(seconds=retry_after_seconds)
    attempt = activity.info().attempt if activity.in_activity() else 1
    return timedelta(seconds=min(PROVIDER_RETRY_MAX_SECONDS, PROVIDER_RETRY_FIRST_SECONDS * 2 ** (attempt - 1)))


_BODIES_WHAT = "message bodies (the session sends them again)"
"""How a skipped write of a model call's bodies is reported."""


async def _begin_call(store: BlobStore, events: model_call_events, puts: dict[str, str]) -> None:
    """Write the bodies a model call carried inline (``puts``: the next call reads them in
    ``store``) and its attempt's step markers (:meth:`EventLog.queue_step_markers`) in one
    Redis round trip (issue 31: they were two on every model call); the events the markers
    call for go out when ``events`` is entered. Bodies that did not land are written again
    on their own (reported if they still do not); markers that did not are reported, never
    written again (a late answer may have written them)."""
    text, redis = events.text, store.redis
    if not puts or redis is None:
        return
    stored = False
    if text is not None and text.log.redis is redis:
        pipe = redis.pipeline(transaction=False)
        text.log.queue_step_markers(pipe, text.session_id, text.turn, text.step, text.attempt)
        marks = len(pipe)
        store.queue_puts(pipe, puts)
        try:
            async with asyncio.timeout(PUBLISH_TIMEOUT_SECONDS):
                answers = await pipe.execute(raise_on_error=False)
        except Exception as err:  # noqa: BLE001 - each part as said above
            events.marked = err
        else:
            events.marked = answers[:marks]
            stored = not any(isinstance(a, Exception) for a in answers[marks:])
            if stored:
                store.put_done(puts)
    if stored or await store.cache_or_report(puts, _BODIES_WHAT):
        BODIES.put(puts)  # the next call finds them (here, from memory)


class ModelActivities:
    """Holds the provider, the content store and the Temporal client (for the
    ``get_message_bodies`` query); ``call_model`` and ``summarize_context`` are
    registered on the worker."""

    def __init__(self, provider: ModelProvider, *, store: BlobStore | None = None, client: Any = None):
        self.provider = provider
        if getattr(provider, "on_chunk", False) is None:
            # A streaming provider heartbeats per chunk: a long generation is progress.
            provider.on_chunk = beat  # type: ignore[attr-defined]
        self.store = store or BlobStore(None)
        self.client = client
        self.events: EventLog | None = None
        """Where a session's model calls are published as turn events, if anywhere."""
        self.steps = ModelSteps(self.store.redis)
        """Leases and recorded results of the sessions' model steps."""
        self.turn_start: Any = None
        """The worker's :class:`activities.turn_start.TurnStartActivities`: a turn's first
        step's listing check and recall (``CallModelInput.turn_start``); None: such a
        call is not sent, and its session lists and searches with its own activities."""

    async def _store_get(self, refs: list[str]) -> dict[str, str]:
        try:
            return await self.store.get_many(refs)
        except Exception as err:  # noqa: BLE001 - a cache: any Redis failure is a miss
            log.warning("content store unavailable (%s); asking the session", err)
            return {}

    async def _store_put(self, items: dict[str, str]) -> bool:
        # A cache (the session writes a missing body again): never fails the call, but a
        # write that does not land is reported, not skipped silently.
        return await self.store.cache_or_report(items, _BODIES_WHAT)

    async def _ask_session(self, session_id: str, query: str, args: list[Any], result_type: Any) -> Any:
        """The session's answer to ``query``: transient failures (a query that timed out,
        Temporal unavailable) are retried with backoff, 0.5 s doubling to 5 s, for up to
        :data:`SESSION_QUERY_PATIENCE_SECONDS`.

        Raises:
            RPCError: a final failure (:data:`_FINAL_QUERY_STATUSES`), or the last one
                once the patience is spent.
            WorkflowQueryFailedError: the session's query handler refused (a worker's
                failure to replay the session, TMPRL1100, is retried like a timeout).
        """
        handle = self.client.get_workflow_handle(session_id)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + SESSION_QUERY_PATIENCE_SECONDS
        delay = 0.5
        while True:
            try:
                return await handle.query(
                    query, args=args, result_type=result_type, rpc_timeout=timedelta(seconds=SESSION_QUERY_RPC_SECONDS)
                )
            except RPCError as err:
                if err.status in _FINAL_QUERY_STATUSES or loop.time() + delay > deadline:
                    raise
                log.warning("session %s did not answer %s (%s); asking again in %.1f s", session_id, query, err, delay)
            except WorkflowQueryFailedError as err:
                # A worker failed to replay the session for the query: another attempt
                # may reach one that has it. Any other refusal is final.
                if not failed_to_replay(err.message) or loop.time() + delay > deadline:
                    raise
                log.warning("session %s failed to replay for %s (%s); asking again in %.1f s", session_id, query, err, delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 5.0)

    @activity.defn(name=names.STORE_MESSAGE_BODIES)
    async def store_message_bodies(self, request: StoreBodiesInput) -> bool:
        """Write the bodies a session's next model call refers to into the content store
        (a local activity, before the call; with the content TTL, refreshed by reads).

        Returns:
            True when written; False when this worker has no Redis, or Redis did not take
            them in two tries within 5 s (reported as a skipped write): the session then
            sends them inline.
        """
        if self.store.redis is None:
            return False
        stored = await self.store.cache_or_report(request.bodies, "read by the next model call (sent inline instead)")
        if stored:
            BODIES.put(request.bodies)  # the call, most likely on this worker, reads them from memory
        return stored

    async def from_store(self, refs: list[str], inline: dict[str, str], puts: dict[str, str] | None = None) -> dict[str, str]:
        """Texts of ``refs``: from ``inline``, then the content store (Redis, then the
        durable store); never from the session. ``inline`` is then written to the store
        (the next call reads it there), or added to ``puts`` for the caller to write.

        Raises:
            ApplicationError: ``ContextBodiesMissingError`` (not retried): one is in
                neither (the session writes it again and calls once more).
        """
        found = {r: inline[r] for r in refs if r in inline}
        rest = [r for r in dict.fromkeys(refs) if r not in found]
        cached = BODIES.get(rest)  # stored or read by this process before: never stale
        rest = [r for r in rest if r not in cached]
        if rest:
            try:
                read = await self.store.read_many(rest)
            except Exception as err:  # noqa: BLE001 - Redis down: as lost as a flushed body
                log.warning("content store unavailable (%s)", err)
            else:
                BODIES.put(read)
                found.update(read)
        if cached:
            found.update(cached)
            try:
                await self.store.touch(list(cached))  # hot bodies keep their Redis TTL
            except Exception as err:  # noqa: BLE001 - a TTL refresh only
                log.debug("content TTL not refreshed: %s", err)
        if inline and self.store.redis is not None:
            if puts is not None:
                puts.update(inline)
            elif await self._store_put(inline):
                BODIES.put(inline)  # the next call finds them (here, from memory)
        missing = [r for r in rest if r not in found]
        if missing:
            raise _bodies_missing(missing, "")
        return found

    async def _texts(
        self, request: CallModelInput | SummarizeInput, refs: list[str], puts: dict[str, str] | None = None
    ) -> dict[str, str]:
        if request.bodies_stored:
            return await self.from_store(refs, request.bodies, puts)
        return await self.resolve(request.session_id, refs)

    async def resolve(self, session_id: str, refs: list[str], *, keep_extra: bool = False) -> dict[str, str]:
        """Texts of ``refs``: from the store, then from the session (and stored; with
        ``keep_extra``, what else the session sent along is stored too).

        Raises:
            ApplicationError: ``ContextResolutionError`` (retried): neither has one of them.
        """
        found = await self._store_get(refs)
        missing = [r for r in dict.fromkeys(refs) if r not in found]
        if missing and self.client is not None:
            # Only calls of runs recorded before the model-context-stored patch get here.
            log.info("session %s (recorded before model-context-stored): asking it for %d bodies", session_id, len(missing))
            fetched: dict[str, str] = {}
            for start in range(0, len(missing), 500):
                answer = await self._ask_session(
                    session_id, names.GET_MESSAGE_BODIES, [missing[start : start + 500]], dict[str, str]
                )
                fetched.update(answer)
            found.update(fetched)
            await self._store_put(fetched if keep_extra else {r: fetched[r] for r in missing if r in fetched})
        still = [r for r in refs if r not in found]
        if still:
            raise ApplicationError(
                f"{len(still)} context item(s) not found in the content store or the session: {', '.join(still[:5])}",
                type="ContextResolutionError",
            )
        return found

    async def resolve_context(self, request: CallModelInput, puts: dict[str, str] | None = None) -> CallModelInput:
        """``request`` with ``messages`` and ``tools`` filled from its references (the
        bodies it carries inline written to the store, or added to ``puts``)."""
        message_refs = list(request.message_refs)
        if request.context_ref and request.bodies_stored and request.context_base:
            message_refs = await self._changed_context(request)
            # Stored with the call's new bodies, in one write: the next call's base.
            request = request.model_copy(update={"bodies": {**request.bodies, request.context_ref: json.dumps(message_refs)}})
        elif request.context_ref and request.bodies_stored:
            listed = await self.from_store([request.context_ref], request.bodies, puts)
            message_refs = json.loads(listed[request.context_ref])
        elif request.context_ref:
            try:
                listed = await self.resolve(request.session_id, [request.context_ref], keep_extra=True)
                message_refs = json.loads(listed[request.context_ref])
            except ApplicationError:
                message_refs = await self._current_context(request)
        refs = message_refs + ([request.tools_ref] if request.tools_ref else [])
        if not refs:
            return request
        texts = await self._texts(request, refs, puts)
        messages = await self._with_whole_arguments(messages_of_refs(message_refs, texts)) or request.messages
        tools = request.tools
        if request.tools_ref:
            tools = tools_of_ref(request.tools_ref, texts[request.tools_ref])
        return request.model_copy(update={"messages": messages, "tools": tools})

    async def _changed_context(self, request: CallModelInput) -> list[str]:
        """The message references of a context sent as a change to an earlier call's
        (``context_base``, ``context_parts``), checked against
        ``context_ref`` (the caller stores the list under it: the next call's base).

        Raises:
            ApplicationError: ``ContextBodiesMissingError`` (not retried): the base is in
                neither store, or the change does not give the list ``context_ref`` names
                (the session writes the whole list and calls once more).
        """
        assert request.context_ref is not None and request.context_base is not None
        base = await self.from_store([request.context_base], {})
        listed = json.loads(base[request.context_base])
        refs: list[str] = []
        for part in request.context_parts:
            if isinstance(part, str):
                refs.append(part)
            elif len(part) == 2:  # anything else adds nothing: the check below refuses it
                refs.extend(listed[part[0] : part[1]])
        if value_ref(refs) != request.context_ref:
            raise _bodies_missing([request.context_ref], f"its change to {request.context_base} gives another list; ")
        return refs

    async def _with_whole_arguments(self, messages: list[Message]) -> list[Message]:
        """``messages`` with the tool-call arguments kept by reference put back, so the
        provider sees the calls the model made. One the store has lost keeps its
        stand-in (the model then sees its size and preview)."""
        refs = [c.arguments_ref for m in messages for c in m.tool_calls if c.arguments_ref]
        if not refs:
            return messages
        try:
            found = await self.store.read_many(refs)
        except Exception as err:  # noqa: BLE001 - the stand-ins stay; the call still goes out
            log.warning("tool-call arguments kept by reference could not be read: %s", err)
            found = {}
        out = []
        for m in messages:
            if any(c.arguments_ref for c in m.tool_calls):
                calls = []
                for c in m.tool_calls:
                    if c.arguments_ref and c.arguments_ref in found:
                        c = c.model_copy(update={"arguments": json.loads(found[c.arguments_ref])})
                    elif c.arguments_ref:
                        log.warning("arguments %s of tool call %s are not in the content store", c.arguments_ref, c.tool_call_id)
                    calls.append(c)
                m = m.model_copy(update={"tool_calls": calls})
            out.append(m)
        return out

    async def _keep_large_arguments(self, result: CallModelResult) -> CallModelResult:
        """Tool calls whose arguments are over :data:`MAX_INLINE_ARGUMENTS_BYTES` keep them
        in the content store (``ToolCall.arguments_ref``) and carry a stand-in: the
        session never decodes megabytes. If the store cannot take them, the call is an
        arguments error (code 1 to the model), never run with a stand-in."""
        calls = result.message.tool_calls
        # Serialising and hashing megabytes: in a thread, so the event loop keeps heartbeating.
        large = await asyncio.to_thread(_large_arguments, calls) if calls else {}
        if not large:
            return result
        try:
            await self.store.keep_many({ref: text for ref, text in large.values()})
            stored = True
        except Exception as err:  # noqa: BLE001 - any store failure: the calls are refused, not lost silently
            log.warning("large tool-call arguments could not be stored: %s", err)
            stored = False
        fixed = []
        for index, call in enumerate(calls):
            if index in large:
                ref, text = large[index]
                size = len(text.encode("utf-8", "surrogatepass"))
                if stored:
                    call = call.model_copy(update={"arguments": arguments_stand_in(ref, text), "arguments_ref": ref})
                else:
                    call = call.model_copy(
                        update={
                            "arguments": {},
                            "arguments_error": (
                                f"arguments: {size} bytes, over the {MAX_INLINE_ARGUMENTS_BYTES} bytes a session holds, "
                                "and the content store could not keep them; pass large content in smaller pieces"
                            ),
                        }
                    )
            fixed.append(call)
        return result.model_copy(update={"message": result.message.model_copy(update={"tool_calls": fixed})})

    async def _current_context(self, request: CallModelInput) -> list[str]:
        """The references of the context the session has for this model call now (see
        the ``get_model_context`` query), when the recorded one is unknown to it.

        Raises:
            ApplicationError: ``ContextResolutionError`` (retried): the session has none.
        """
        refs = None
        if self.client is not None and request.step is not None:
            refs = await self._ask_session(
                request.session_id, names.GET_MODEL_CONTEXT, [request.turn, request.step], list[str] | None
            )
        if not refs:
            raise ApplicationError(
                f"the context {request.context_ref} of turn {request.turn} is not in the content store or the session",
                type="ContextResolutionError",
            )
        log.warning(
            "turn %d step %s: context %s rebuilt by the session; using its current one",
            request.turn, request.step, request.context_ref,
        )
        return refs

    @activity.defn(name=names.CALL_MODEL)
    async def call_model(self, request: CallModelInput) -> CallModelResult:
        """Ask the provider for the next assistant message, heartbeating while it waits
        (see :mod:`activities.heartbeat`); a session's step asks it once, whatever its
        attempts (see :mod:`activities.model_steps`).

        Raises:
            ApplicationError: ``type="ModelUnavailableError"`` (retried, honouring
                Retry-After), ``"ContextTooLongError"`` (the provider's context limit; not
                retried: the session compacts once and retries), ``"ModelRequestError"``
                or ``"ScriptExhaustedError"`` (not retried).
        """
        name = f"chat {request.model}" if request.model else "chat"
        with telemetry.span(name, telemetry.chat_attributes(request) if telemetry.enabled() else None) as span:
            # One provider request per step: an earlier attempt's recorded result, or a
            # wait on its worker while that lives (activities/model_steps.py).
            async with heartbeating():
                result = await self.steps.once(request, lambda: self._answer(request))
            if span is not None:
                telemetry.set_attributes(span, telemetry.chat_result_attributes(result))
                if not request.model and result.model:
                    # The session left the model to the worker: the one it asked for.
                    span.update_name(f"chat {result.model}")
                    span.set_attribute("gen_ai.request.model", result.model)
            return result

    async def _answer(self, request: CallModelInput) -> CallModelResult:
        """The provider's answer with the user's day tokens counted (once per step)."""
        result = await self._call_model(request)
        if result.turn_start is not None and not result.turn_start.sent:
            return result  # the provider was not asked: nothing to count
        day_tokens = await usage.record_for_activity(
            self.store.redis, request.usage_user_id, request.usage_day,
            result.usage.prompt_tokens + result.usage.completion_tokens,
        )
        if day_tokens is not None:
            result = result.model_copy(update={"user_day_tokens": day_tokens})
        return result

    async def _call_model(self, request: CallModelInput) -> CallModelResult:
        """:meth:`call_model` without its span; its result says when turn events of the
        call did not all reach Redis (a ``events`` degradation, issue 27)."""
        events = self._text_events(request)
        result = await self._call_model_with(request, events)
        text = events.text
        if text is not None and text.unpublished:
            detail = (
                f"{text.unpublished} turn event(s) of turn {request.turn} step {request.step} were not published "
                "(Redis): live views missed part of the turn; its result and transcript have it whole"
            )
            result = result.model_copy(update={"degraded": [*result.degraded, Degradation(kind="events", detail=detail)]})
        return result

    async def _call_model_with(self, request: CallModelInput, events: model_call_events) -> CallModelResult:
        # Heartbeats while waiting on the store and the provider: a dead worker's call
        # is retried after the heartbeat timeout (seconds), not the start-to-close one.
        async with heartbeating():
            puts: dict[str, str] = {}
            resolved = await self.resolve_context(request, puts)
            await _begin_call(self.store, events, puts)
            async with events as text:  # turn_started goes out now, before any search
                return await self._answered(request, resolved, events, text)

    async def _answered(
        self, request: CallModelInput, resolved: CallModelInput, events: model_call_events, text: Any
    ) -> CallModelResult:
        """The rest of :meth:`_call_model_with`, once the attempt's events have begun."""
        start = None
        if request.turn_start is not None:
            resolved, start = await self._start_turn(request, resolved)
            if self.turn_start is not None:
                await events.publish(self.turn_start.recall_events(request, start))
            if not start.sent:
                # Its attempt published no text: the step's next call has none to discard.
                await events.unsent()
                return CallModelResult(message=Message(role="assistant", content=""), turn_start=start)
        return await self._completed(request, resolved, text, start)

    async def _completed(self, request: CallModelInput, resolved: CallModelInput, text: Any, start: TurnStartOutcome | None) -> CallModelResult:
        """The provider's answer to ``resolved``, checked, counted and bounded (``text``:
        the step's text events; ``start``: its turn start, kept in the result)."""
        result = await self._complete(resolved)
        if start is not None:
            result = result.model_copy(update={"turn_start": start})
        if text is not None and not text.published and result.message.content:
            text.add(result.message.content)  # a provider that did not stream it
        if _is_small(result):
            # Most replies: a few kilobytes, checked and counted in well under a
            # millisecond; a thread hop would cost more than the work (bench/model_call.py).
            return _counted(_refuse_deep_arguments(result), request.encoding)
        # Checking and counting a reply is CPU work that grows with its size (a tool
        # call's arguments may be megabytes): in a thread, and the counting in another
        # process, so the event loop keeps sending heartbeats (a blocked loop, or a
        # thread holding the GIL, would make the worker look dead: issue 31).
        result = await asyncio.to_thread(_refuse_deep_arguments, result)
        result = await self._bounded(request.session_id, result)
        result = await _off_loop(not _is_small(result, COUNT_IN_POOL_CHARS), _counted, result, request.encoding)
        return await self._keep_large_arguments(result)

    async def _start_turn(self, request: CallModelInput, resolved: CallModelInput) -> tuple[CallModelInput, TurnStartOutcome]:
        """The turn start of a first step (:meth:`activities.turn_start.TurnStartActivities.prepare`)."""
        if self.turn_start is None:
            return resolved, TurnStartOutcome(why="this worker does not start turns in model calls")
        return await self.turn_start.prepare(request, resolved)

    def _text_events(self, request: CallModelInput) -> model_call_events:
        """Where the reply text of ``request`` is published as it arrives: a session's
        reply steps, when this worker publishes turn events (:mod:`hermes.content.events`)."""
        if self.events is None or request.purpose != "reply" or request.step is None:
            return model_call_events(None, request.session_id, request.turn, 0, "")
        info = activity.info() if activity.in_activity() else None
        attempt = f"{request.step}.{info.activity_id if info else '-'}.{info.attempt if info else 1}"
        return model_call_events(self.events, request.session_id, request.turn, request.step, attempt)

    @activity.defn(name=names.COUNT_TOKENS)
    async def count_tokens(self, request: CountTokensInput) -> int:
        """Exact tokens of ``request.text`` as plain text, with the session's encoding
        (a local activity: workflow code counts only bounded texts).

        Returns:
            Tokens, ``>= 0``.
        """
        return await _off_loop(len(request.text) >= COUNT_IN_POOL_CHARS, _count_text, request.encoding, request.text)

    async def _complete(self, request: CallModelInput) -> CallModelResult:
        """The provider's answer to ``request``, its errors as Temporal sees them.

        Raises:
            ApplicationError: ``ModelUnavailableError`` (retried, after ``Retry-After``
                when the provider sent one); ``ContextTooLongError``, ``ModelRequestError``
                or ``ScriptExhaustedError`` (not retried).
        """
        try:
            return await self.provider.complete(request)
        except ModelUnavailableError as err:
            raise ApplicationError(
                str(err), type=type(err).__name__, next_retry_delay=provider_retry_delay(err.retry_after_seconds)
            ) from None
        except (ContextTooLongError, ModelRequestError, ScriptExhaustedError) as err:
            raise ApplicationError(str(err), type=type(err).__name__, non_retryable=True) from None

    async def _bounded(self, session_id: str, result: CallModelResult) -> CallModelResult:
        """Keep a huge reply out of history: stored by reference, a preview returned."""
        content = result.message.content or ""
        if len(content.encode("utf-8", "surrogatepass")) <= MAX_REPLY_BYTES:
            return result
        ref = value_ref(content)
        try:
            # Kept for good (the durable store, then Redis): the reply has no other copy.
            await self.store.keep_many({ref: content})
        except Exception as err:  # noqa: BLE001
            report_skipped("content_store", f"a {len(content)}-character reply (it is cut to its head and tail)", err)
            text = "[reply cut: over the limit, and it could not be kept by reference]\n" + head_and_tail(
                content, MAX_REPLY_BYTES // 4, max_bytes=MAX_REPLY_BYTES // 2, how_to_read="it is not kept anywhere"
            ).text
        else:
            text = stored_preview(content, ref, "reply")
        return result.model_copy(update={"message": result.message.model_copy(update={"content": text})})

    @activity.defn(name=names.SUMMARIZE_CONTEXT)
    async def summarize_context(self, request: SummarizeInput) -> Summary:
        """Fold the referenced messages and the previous summary into a new summary of at
        most ``request.max_tokens`` tokens (seed 002 §2.2: about 800), heartbeating.

        Returns:
            The summary (its text may be empty: the session then keeps the messages).

        Raises:
            ApplicationError: as :meth:`call_model` (the session retries later).
        """
        attributes = None
        if telemetry.enabled():
            attributes = {
                "gen_ai.operation.name": "chat", "gen_ai.request.model": request.model, "hermes.model.purpose": "summary",
                "hermes.session_id": request.session_id, "hermes.summary.upto_turn": request.upto_turn,
            }
        with telemetry.span("hermes.summary", attributes) as span:
            async with heartbeating():
                summary = await self._summarize(request)
            if summary.usage is not None:
                day_tokens = await usage.record_for_activity(
                    self.store.redis, request.usage_user_id, request.usage_day,
                    summary.usage.prompt_tokens + summary.usage.completion_tokens,
                )
                if day_tokens is not None:
                    summary = summary.model_copy(update={"user_day_tokens": day_tokens})
            telemetry.set_attributes(span, {"hermes.summary.tokens": summary.tokens})
            return summary

    async def _summarize(self, request: SummarizeInput) -> Summary:
        """:meth:`summarize_context` without its heartbeats."""
        counter = TokenCounter.get(request.encoding or DEFAULT_ENCODING)
        texts = await self._texts(request, list(request.message_refs))
        # Token counting of up to the whole input budget: in another process, so that this
        # one's event loop keeps sending the worker's heartbeats meanwhile.
        large = sum(len(t) for t in texts.values()) >= COUNT_IN_POOL_CHARS
        call, upto = await _off_loop(large, _summary_request_in, request, texts, counter.encoding_name)
        # One provider request per summary, as per reply step (activities/model_steps.py).
        result = await self.steps.once(call, lambda: self._complete(call))
        text = counter.truncate((result.message.content or "").strip(), request.max_tokens)
        return Summary(text=text, upto_turn=upto, tokens=counter.text(text) if text else 0, usage=result.usage)


def _summary_request_in(request: SummarizeInput, texts: dict[str, str], encoding: str) -> tuple[CallModelInput, int]:
    """:func:`_summary_request` with the counter of ``encoding`` (a CPU pool child runs it)."""
    return _summary_request(request, texts, TokenCounter.get(encoding))


def _summary_request(request: SummarizeInput, texts: dict[str, str], counter: TokenCounter) -> tuple[CallModelInput, int]:
    """The summary's model request from the referenced messages, and the turn it covers up to."""
    lines: list[tuple[int, str]] = []
    # No one message may crowd out the rest (or, after a provider refused a context
    # for one huge message, make the summary request too long as well).
    per_message = max(200, request.max_input_tokens // 8)
    turns = request.message_turns if len(request.message_turns) == len(request.message_refs) else None
    for index, ref in enumerate(request.message_refs):
        m = message_from_body(texts[ref])
        turn = turns[index] if turns else request.upto_turn
        if m.role == "tool":
            # Head and tail: a tool's errors and totals are usually at its end.
            lines.append((turn, f"tool result ({m.name or 'tool'}): {head_and_tail(m.content or '', 600).text}"))
        elif m.role == "assistant" and m.tool_calls:
            calls = ", ".join(f"{c.name}({json.dumps(c.arguments, ensure_ascii=False)[:200]})" for c in m.tool_calls)
            lines.append((turn, f"assistant called: {calls}"))
        elif m.content:
            text = counter.truncate(m.content, per_message)
            cut = " [cut]" if len(text) < len(m.content) else ""
            lines.append((turn, f"{m.role}: {text}{cut}"))
    # Oldest first, whole turns only, within the input budget: the summary covers what
    # it was shown, and turns left out stay in the context for the next summary.
    kept: list[tuple[int, str]] = []
    upto, used = request.upto_turn, 0
    for turn, line in lines:
        cost = counter.text(line) + 1
        if used + cost > request.max_input_tokens and kept:
            if turns:
                whole = [item for item in kept if item[0] < turn]
                # At least one turn, even cut, so that the summary always moves on.
                kept, upto = (whole, turn - 1) if whole else (kept, turn)
            break
        kept.append((turn, line))
        used += cost
    conversation = "\n".join(line for _, line in kept)
    prompt = []
    if request.previous_summary:
        prompt.append(f"Previous summary:\n{request.previous_summary}\n")
    prompt.append(f"Conversation up to turn {upto}:\n{conversation}")
    call = CallModelInput(
        session_id=request.session_id,
        turn=request.upto_turn,
        messages=[
            Message(role="system", content=SUMMARY_INSTRUCTION.format(max_tokens=request.max_tokens)),
            Message(role="user", content="\n".join(prompt)),
        ],
        model=request.model,
        profile=request.profile,
        purpose="summary",
        max_output_tokens=request.max_tokens,
    )
    return call, upto

