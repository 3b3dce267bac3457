"""Tool activities: list the registry, validate a call, run one tool call.

Every call goes through the same layers: the tool exists; its arguments are coerced
and validated (structure, format); its checks pass (business rules, permission); then
it runs, with heartbeats. Whatever happens becomes a ``{code, message, data}`` result.

A non-idempotent tool runs at most once per ``session_id:tool_call_id``: before it
runs, a record is set in Redis with ``SET NX`` (the fast, atomic claim) and in the durable
ledger (:class:`hermes.infra.ledger.CallLedger`: the copy that survives a Redis loss, a
file created exclusively beside the durable store, or its LanceDB tables on an object
store; the result is written there by the claim's holder); a later attempt that finds
either record returns the stored result, or, if the first attempt never finished, reports
the outcome as unknown instead of running the tool again. Losing Redis therefore never
re-runs a side effect.

A result whose JSON is larger than ``max_result_bytes`` never enters history whole: the
whole result is kept by reference (:meth:`hermes.content.blobs.BlobStore.keep_many`: the durable
store, and Redis as the fast path) and the session gets a preview naming the reference,
which the model reads with the built-in ``read_stored_content`` tool; with no store, or
if keeping it fails, only the preview is kept (and it says so).

Why this module is long: one tool call's layers (arguments kept by reference, checks,
the exactly-once ledger with its running lease and durable copy, result bounds, turn
events) are one sequence over one call's state, and each failure path must answer with
what the others did; the ledger's parts are kept beside the call they guard.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import json
import logging
import operator
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from pydantic_core import to_jsonable_python
from redis.asyncio.cluster import RedisCluster
from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.call_lease import RunningLease, claim_for_attempt, open_record
from activities.heartbeat import heartbeating, with_heartbeat
from activities.model_steps import remaining_seconds
from hermes import names
from hermes.infra import telemetry
from hermes.security import encryption
from hermes.content.blobs import MAX_INLINE_ARGUMENTS_BYTES, BlobStore, arguments_stand_in, value_ref
from hermes.infra.connections import cancel_requests, raise_if_cancelled
from hermes.infra.durable import DurableStore, DurableStoreError
from hermes.infra.ledger import CallLedger
from hermes.errors import ToolArgumentsError, ToolFailure
from hermes.content.events import EVENT_ARGUMENTS_CHARS, DelayedEvent, EventLog, TurnEvent, preview_json
from hermes.models import (
    Degradation,
    ListToolsInput,
    ListToolsResult,
    RunToolInput,
    ToolResult,
    ToolResultCode,
    ToolSpec,
    ValidateToolCallResult,
)
from hermes.content.previews import head_and_tail
from hermes.infra.redis_writes import report_skipped
from hermes.tools.arguments import MAX_NESTING, _nesting, argument_descriptions
from hermes.tools.registry import FunctionTool, Tool, ToolContext, ToolRegistry, run_in_tool_thread
from hermes.content.tokens import PER_TOOL_SCHEMA_TOKENS, TokenCounter, schema_json

log = logging.getLogger("hermes.tools")

IDEMPOTENCY_TTL_SECONDS = 30 * 24 * 3600

STARTED_EVENT_DELAY_SECONDS = 0.25
"""How long a tool call runs before its ``tool_call_started`` turn event is published
(seconds): a call done sooner publishes ``started`` and ``finished`` in one Redis write
(one round trip a call less; issue 31), and a slower one shows as running after it."""

_AWAIT_POLL_SECONDS = 0.2
_MAX_RETRY_AFTER_SECONDS = 30.0
_MAX_MESSAGE_CHARS = 2000
STORED_PREVIEW_CHARS = 4000
"""Characters of data shown in the preview of a result kept by reference."""
_STORED_RESULT_MAX_CHARS = 12_000
"""Largest JSON of a result kept by reference, in characters: the session hands tool
results up to 16,000 characters to the model whole, so the reference stays readable."""
MAX_RESULT_NESTING = MAX_NESTING
"""Deepest nesting of lists and objects in the data of a result leaving ``run_tool`` (64,
as for arguments); deeper data is replaced by a preview (:func:`shallow_result`).

Pydantic's JSON parser refuses input nested deeper than 200 levels (its serializer 255),
and the session decodes this data inside bigger payloads: the activity result
(``ToolResult``: 1 level more), a composite tool's result (``{"steps", "result"}``: 1
more), the reply to the client (``TurnResult.tool_calls[i].result``: 3 more) and the state
carried across continue-as-new (7 more). 64 + 1 + 1 + 7 = 73 leaves more than 120 levels
of headroom; one payload the parser refuses fails every workflow task of the session."""
TRUNCATED_PREVIEW_CHARS = 4000
"""Characters of JSON text kept as the preview of data nested too deeply."""


def idempotency_key(call_key: str) -> str:
    """Redis key of the exactly-once record of one tool call (see ``RunToolInput.call_key``)."""
    return f"hermes:toolcall:{call_key}"


def _result_size(result: ToolResult) -> tuple[str | None, int]:
    """The JSON of ``result`` and its size in UTF-8 bytes (``None`` and an unknown size
    when it is nested past the serializer's depth limit)."""
    try:
        text = result.model_dump_json()
    except ValueError:
        return None, -1
    return text, len(text.encode("utf-8", "surrogatepass"))


def cap_result(result: ToolResult, max_bytes: int, *, ref: str | None = None, whole_json: str | None = None) -> ToolResult:
    """``result`` with its data cut to a preview when its JSON exceeds ``max_bytes``.

    A tool result is an activity result, stored in history and sent to the model:
    above Temporal's 2 MB payload limit it would fail the call, and well below it, it
    would still fill the context window.

    Args:
        result: the tool's whole result.
        max_bytes: the largest JSON kept whole, in UTF-8 bytes.
        ref: the content-store reference under which the whole result's JSON is kept
            (see :meth:`ToolActivities.bounded`); ``None``: it is not kept anywhere.
        whole_json: ``result.model_dump_json()``, when already made (what ``ref`` names).

    Returns:
        ``result`` itself if small enough; else a copy whose ``data`` is
        ``{"truncated": true, "preview": ...}`` (plus ``ref``, ``size_bytes`` and
        ``size_chars`` of the stored JSON when ``ref`` is given) and whose message says
        so and, with a reference, how to read the rest. The preview is the head and the
        tail of the data's JSON (:func:`hermes.content.previews.head_and_tail`: errors and totals
        are usually at the end) around a marker line saying how many characters, lines
        and bytes were cut, and, with a reference, the ``read_stored_content`` call that
        reads them (offsets into the stored result).
    """
    if whole_json is not None:
        text, size = whole_json, len(whole_json.encode("utf-8", "surrogatepass"))
    else:
        text, size = _result_size(result)
    if 0 <= size <= max_bytes:
        return result
    shown_size = f"{size} bytes" if size >= 0 else "nested too deeply to serialize"
    if ref is None or text is None:
        try:
            data_text = json.dumps(result.data, ensure_ascii=False, default=str)
        except (ValueError, RecursionError):
            data_text = "(the data is nested too deeply to show)"
        budget = max(max_bytes // 2, 256)
        preview = head_and_tail(data_text, budget, max_bytes=budget, how_to_read="it is not kept anywhere", json_text=True).text
        return result.model_copy(
            update={
                "message": f"{result.message[:500]} (result truncated: {shown_size}, limit {max_bytes}; "
                "the data is a preview of its head and tail and the rest is not kept)",
                "data": {"truncated": True, "preview": preview},
            }
        )
    # The preview is of the data's JSON as stored, so the marker's offsets are those
    # read_stored_content reads at.
    data_json, data_at = _stored_data(result, text)
    chars = len(text)
    message = (
        f"{result.message[:500]} (result truncated: {shown_size}, limit {max_bytes}; the whole result "
        f"({chars} characters of JSON) is kept by reference as {ref}: read it a slice at a time with "
        f"read_stored_content(ref=\"{ref}\", offset=0, length=8000); the data is a preview of its head and "
        "tail, and the marker between them says what was cut and where)"
    )
    how_to_read = f'read them with read_stored_content(ref="{ref}", offset={{start}}, length=8000)'
    budget_chars = min(_STORED_RESULT_MAX_CHARS, max(max_bytes, 256))
    keep = STORED_PREVIEW_CHARS
    while True:
        preview = head_and_tail(
            data_json, keep, max_bytes=max(max_bytes // 2, 256), how_to_read=how_to_read,
            offset_base=data_at, whole_chars=chars, json_text=True,
        ).text
        capped = result.model_copy(
            update={
                "message": message,
                "data": {"truncated": True, "ref": ref, "size_bytes": size, "size_chars": chars, "preview": preview},
            }
        )
        # Escaping (quotes, control characters) can make the preview's JSON much longer than it is.
        capped_json = capped.model_dump_json()
        if keep == 0 or (len(capped_json) <= budget_chars and len(capped_json.encode("utf-8", "surrogatepass")) <= max_bytes):
            return capped
        keep //= 2


def _stored_data(result: ToolResult, whole_json: str) -> tuple[str, int]:
    """The JSON of ``result.data`` as it appears in ``whole_json`` (the stored result) and
    the character offset where it starts there (0 and the data's own JSON when it is not
    found at the end, as pydantic writes it)."""
    data_json = result.model_dump_json(include={"data"})[len('{"data":') : -1]
    at = len(whole_json) - len(data_json) - 1
    if at >= 0 and whole_json.endswith(data_json + "}"):
        return data_json, at
    return data_json, 0


def arguments_result(err: ToolArgumentsError, tool: Tool | None = None) -> ToolResult:
    """Code 1 with every problem: which field, what was expected, what was received.

    When required arguments are missing the message tells the model to ask the user
    for them (described from the schema) rather than guess or send null."""
    problems = err.problems
    missing = [p["field"] for p in problems if p.get("missing")]
    message = str(err)
    data: dict[str, Any] = {"problems": problems}
    if missing:
        descriptions = argument_descriptions(tool.parameters_schema if tool else {}, missing)
        described = [f"{name} ({text})" if text else name for name, text in descriptions.items()]
        message = (
            f"missing required argument(s) for {err.tool_name}: {', '.join(described)}. Do not guess and do not "
            "send null: ask the user for them, then call again."
            + (f" Also: {message}" if len(missing) < len(problems) else "")
        )
        data.update(missing=missing, ask_user=True)
    return ToolResult(code=ToolResultCode.BAD_ARGUMENTS, message=message[:_MAX_MESSAGE_CHARS], data=data)


def failure_result(err: BaseException, *, in_check: bool = False) -> ToolResult:
    """A raised error as a result: ``ToolFailure`` keeps its code; from a check, a
    ``ValueError`` is code 1 and a ``PermissionError`` code 3; anything else is code 2."""
    text = str(err) or type(err).__name__
    if isinstance(err, ToolFailure):
        code, data = ToolResultCode(err.code), err.data
    elif isinstance(err, ToolArgumentsError):
        return arguments_result(err)
    elif isinstance(err, PermissionError):
        code, data = ToolResultCode.PERMISSION_DENIED, None
    elif in_check and isinstance(err, ValueError):
        code, data = ToolResultCode.BAD_ARGUMENTS, None
    else:
        code, data = ToolResultCode.DEPENDENCY_UNAVAILABLE, None
        text = f"{type(err).__name__}: {text}"
    # (to_tool_result makes the data JSON-safe and shallow: a ToolFailure's data may be
    # nested past the serializer's limit, and a check's result leaves run_tool as it is.)
    return to_tool_result(ToolResult(code=code, message=text[:_MAX_MESSAGE_CHARS], data=data))


def shallow_result(result: ToolResult) -> ToolResult:
    """``result`` with its data replaced by a preview when it is nested deeper than
    ``MAX_RESULT_NESTING`` levels (see there for why; code and message are kept).

    Returns:
        ``result`` itself when shallow enough; else a copy whose ``data`` is
        ``{"truncated": True, "reason": "nested deeper than 64 levels", "preview": <the
        first TRUNCATED_PREVIEW_CHARS characters of its JSON text>}``.
    """
    if _nesting(result.data, MAX_RESULT_NESTING) <= MAX_RESULT_NESTING:
        return result
    preview = _scrub_surrogates(_json_preview(result.data, TRUNCATED_PREVIEW_CHARS))
    reason = f"nested deeper than {MAX_RESULT_NESTING} levels"
    return result.model_copy(update={"data": {"truncated": True, "reason": reason, "preview": preview}})


_END = object()


def _json_preview(value: Any, max_chars: int) -> str:
    """The first ``max_chars`` characters of the JSON text of ``value``, written without
    recursion: any depth (or a cycle) costs only ``max_chars``. Values JSON cannot carry
    are written as the JSON string of their ``str``."""
    parts: list[str] = []
    size = 0
    frames: list[list[Any]] = []  # [iterator, closing bracket, is an object, first member]
    item, pending = value, True
    while size < max_chars:
        if pending:
            pending = False
            if isinstance(item, dict):
                text = "{"
                frames.append([iter(item.items()), "}", True, True])
            elif isinstance(item, (list, tuple, set, frozenset)):
                text = "["
                frames.append([iter(item), "]", False, True])
            elif item is None or isinstance(item, (bool, int, float)):
                try:
                    text = json.dumps(item)
                except ValueError:  # an int past Python's digit limit
                    text = json.dumps(f"<int of {item.bit_length()} bits>")
            else:
                text = json.dumps((item if isinstance(item, str) else str(item))[:max_chars], ensure_ascii=False)
        elif not frames:
            break
        else:
            frame = frames[-1]
            member = next(frame[0], _END)
            if member is _END:
                frames.pop()
                text = frame[1]
            else:
                text = "" if frame[3] else ", "
                frame[3] = False
                if frame[2]:
                    key, item = member
                    text += json.dumps(key if isinstance(key, str) else str(key), ensure_ascii=False) + ": "
                else:
                    item = member
                pending = True
        parts.append(text[: max_chars - size + 1])
        size += len(parts[-1])
    return "".join(parts)[:max_chars]


def to_tool_result(value: Any) -> ToolResult:
    """Whatever a tool returned, in the ``{code, message, data}`` shape, JSON-safe.

    Data that JSON cannot carry (datetimes, sets, bytes, arbitrary objects) is converted
    here, with ``str`` as the last resort, so that a tool which did its work is never
    reported as failed because its return value could not be serialized.
    """
    if not isinstance(value, ToolResult):
        value = ToolResult(data=value)
    # Deep data never reaches the serializer (it stops at 255 levels): kept as a preview.
    value = shallow_result(value)
    message = str(value.message)
    if len(message) > _MAX_MESSAGE_CHARS:
        message = message[:_MAX_MESSAGE_CHARS] + "..."
    try:
        data = _scrub_surrogates(to_jsonable_python(value.data, fallback=str, bytes_mode="base64"))
    except (ValueError, RecursionError):
        # Lone surrogates (file names that are not UTF-8, via os.fsdecode) or nesting past
        # the serializer's depth limit: the tool did its work, so report it, never fail it
        # (an idempotent tool would be run again).
        try:
            data = to_jsonable_python(_scrub_surrogates(value.data), fallback=str, bytes_mode="base64")
        except (ValueError, RecursionError) as err:
            data = {"unserializable": True, "reason": f"{type(err).__name__}: {err}"[:300]}
    return ToolResult(code=value.code, message=_scrub_surrogates(message), data=data)


def _scrub_surrogates(value: Any) -> Any:
    """``value`` with lone surrogates replaced by U+FFFD (the payload converter cannot
    encode them)."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return value.encode("utf-8", "surrogatepass").decode("utf-8", "replace")
        return value
    if isinstance(value, (list, tuple, set, frozenset)):
        return [_scrub_surrogates(v) for v in value]
    if isinstance(value, dict):
        return {_scrub_surrogates(k): _scrub_surrogates(v) for k, v in value.items()}
    return value


def schema_tokens(encoding: str, spec: ToolSpec) -> int:
    """Tokens ``spec``'s schema takes in a prompt (:meth:`hermes.content.tokens.TokenCounter.tools`)
    in ``encoding`` (the default one when this worker cannot load it offline); remembered
    per encoding and schema, since a session lists the same tools every turn."""
    return _schema_tokens(encoding, schema_json(spec))


@functools.lru_cache(maxsize=4096)
def _schema_tokens(encoding: str, schema_json: str) -> int:
    return TokenCounter.get_or_default(encoding).text(schema_json) + PER_TOOL_SCHEMA_TOKENS


def tool_event(
    request: RunToolInput, kind: str, result: ToolResult | None = None, seconds: float = 0.0, *, retrying: bool = False,
    attempt: int | None = None,
) -> TurnEvent:
    """A ``tool_call_started`` / ``tool_call_finished`` turn event of the call ``request``
    (arguments and data cut to :data:`EVENT_ARGUMENTS_CHARS` characters of JSON);
    ``attempt``: the activity's attempt (default: read from the running activity, which
    a plain thread cannot)."""
    call = request.tool_call
    data: dict[str, Any] = {"tool_call_id": call.tool_call_id, "name": call.name}
    if result is None:
        data["arguments"] = preview_json(call.arguments, EVENT_ARGUMENTS_CHARS)
    else:
        data.update(code=int(result.code), ok=result.ok, message=result.message[:EVENT_ARGUMENTS_CHARS], seconds=round(seconds, 3))
        if result.data is not None:
            data["data"] = preview_json(result.data, EVENT_ARGUMENTS_CHARS)
    data["attempt"] = attempt if attempt is not None else activity.info().attempt if activity.in_activity() else 1
    if retrying:
        data["retrying"] = True
    return TurnEvent(type=kind, session_id=request.session_id, turn=request.turn, data=data)  # type: ignore[arg-type]


class ToolActivities:
    """Runs the tools of a registry.

    Args:
        registry: the tools this worker serves.
        redis: a ``redis.asyncio.Redis``; needed for non-idempotent tools.
        max_result_bytes: larger tool results are cut to a preview (see :func:`cap_result`).
        tier_seconds: tier name -> timeout in seconds.
        heartbeat_timeout_seconds: heartbeat timeout the workflow sets on tool calls.
        durable: the durable store (tools' notes, results kept by reference, the
            exactly-once ledger's second copy); ``None``: Redis alone.
        encoding, encoding_fallback, memory: reported with each tool list (the session's
            encoding, why it is a fallback, whether memory is served).
    """

    def __init__(
        self,
        registry: ToolRegistry,
        redis: Any,
        *,
        tier_seconds,
        heartbeat_timeout_seconds: float = 5.0,
        max_result_bytes: int = 64_000,
        mcp: Any = None,
        encoding: str = "",
        encoding_fallback: str | None = None,
        memory: bool = False,
        durable: DurableStore | None = None,
    ):
        self.encoding_fallback = encoding_fallback
        """Why ``encoding`` is a fallback (:func:`hermes.content.tokens.encoding_fallback`), or None;
        reported with each tool list as a ``tokenizer`` degradation."""
        self.memory = memory
        """Whether this worker serves long-term memory (reported with the tool list)."""
        self.encoding = encoding
        """The tiktoken encoding sessions count tokens with (reported with the tool list)."""
        self.mcp = mcp
        """A :class:`hermes.mcp.tools.McpToolset`, when MCP servers are configured."""
        self.registry = registry
        self.redis = redis
        self.durable = durable
        self.ledger = CallLedger(durable) if durable is not None else None
        """The exactly-once ledger's durable copy (None without a durable store)."""
        self.store = BlobStore(redis, durable=durable)
        """Where results over ``max_result_bytes`` are kept whole (never expire: a session
        may read them months later)."""
        self.max_result_bytes = max_result_bytes
        self.tier_seconds = tier_seconds
        self.heartbeat_timeout_seconds = heartbeat_timeout_seconds
        self.events: EventLog | None = None
        """Where tool calls are published as turn events (:mod:`hermes.content.events`), if anywhere."""
        self._specs: dict[tuple[int, str], tuple[Tool, dict[str, Any], ToolSpec, dict[str, Any]]] = {}
        """(id(tool), encoding) -> (a registry tool, its fields then, its spec, the spec's JSON),
        at most one per registry tool and encoding (issue 31: listings rebuilt every spec)."""

    async def bounded(self, result: ToolResult) -> ToolResult:
        """``result``, or, when its JSON exceeds ``max_result_bytes``, a preview of it
        (:func:`cap_result`) with the whole result JSON kept in the content store under
        ``value_ref(json)``. With no store, or if keeping it fails, only the preview is
        kept (and it says so). Never raises for the store: a tool that did its work is
        never reported as failed because its result was large."""
        result = shallow_result(result)
        text, size = _result_size(result)
        if 0 <= size <= self.max_result_bytes:
            return result
        ref = None
        if text is not None and self.store.can_keep:
            ref = value_ref(text)
            try:
                await self.store.keep_many({ref: text})
            except Exception as err:  # noqa: BLE001 - the preview still goes on, and says the rest is not kept
                report_skipped("content_store", f"a tool result of {size} bytes (only its preview is kept)", err)
                ref = None
        return cap_result(result, self.max_result_bytes, ref=ref, whole_json=text)

    @activity.defn(name=names.LIST_TOOLS)
    async def list_tools(self, request: ListToolsInput | None = None) -> ListToolsResult:
        """Every tool a turn may offer: the registry's, then the MCP servers' (as they
        list them now; the result is recorded in the turn's history). When the list is
        the one ``request.known_ref`` names, only its reference is returned."""
        encoding = (request.encoding or self.encoding) if request is not None else ""  # empty: the worker's
        held = [self._spec_of(t, encoding) for t in self.registry]
        groups = self.registry.groups
        if self.mcp is not None:
            # Listed anew each time (new tool objects): made each time, never held.
            held += [self._spec_of(t, encoding, hold=False) for t in await self.mcp.discover()]
            known = {g.name for g in groups}
            groups = groups + [g for g in self.mcp.groups if g.name not in known]
        specs = [spec for spec, _ in held]
        ref = _LISTING_REFS.ref([j for _, j in held], [g.model_dump(mode="json") for g in groups], keep=self.mcp is None)
        if request is not None and request.known_ref == ref:
            return ListToolsResult(tools=[], ref=ref, unchanged=True, encoding=self.encoding, memory=self.memory, degraded=self._degraded())
        return ListToolsResult(tools=specs, groups=groups, ref=ref, encoding=self.encoding, memory=self.memory, degraded=self._degraded())

    def _spec_of(self, tool: Tool, encoding: str, *, hold: bool = True) -> tuple[ToolSpec, dict[str, Any]]:
        """``tool``'s spec (with its schema's tokens in ``encoding``, counted here so that
        workflow code never encodes schemas) and the spec's JSON. With ``hold`` (a registry
        tool) they are made once per tool object and encoding, and again only when a field
        of the tool is set anew (tools are read-only once registered: a schema changed in
        place is not seen). Specs are shared by the listings: read-only."""
        key = (id(tool), encoding)
        held = self._specs.get(key) if hold else None
        if held is None or held[0] is not tool or held[1] != vars(tool):
            spec = tool.spec(tier_seconds=self.tier_seconds, heartbeat_timeout_seconds=self.heartbeat_timeout_seconds)
            if encoding:
                spec = spec.model_copy(update={"tokens": schema_tokens(encoding, spec)})
            if not hold:
                return spec, spec.model_dump(mode="json")
            held = self._specs[key] = (tool, dict(vars(tool)), spec, spec.model_dump(mode="json"))
        return held[2], held[3]

    def _degraded(self) -> list[Degradation]:
        """What this worker does less well for the turn listing its tools (issue 27)."""
        found = [Degradation(kind="tokenizer", detail=self.encoding_fallback)] if self.encoding_fallback else []
        for server, why in sorted((self.mcp.unavailable if self.mcp is not None else {}).items()):
            found.append(Degradation(kind="mcp", detail=f"MCP server {server!r} is unavailable, its tools are not offered: {why}"))
        return found

    async def _lookup(self, request: RunToolInput) -> Tool | ToolResult:
        call = request.tool_call
        if request.mcp is not None:
            found = await self.mcp.tool_for(call.name, request.mcp) if self.mcp is not None else None
            if found is None:
                return ToolResult(
                    code=ToolResultCode.DEPENDENCY_UNAVAILABLE,
                    message=(
                        f"the tool {request.mcp.tool!r} of MCP server {request.mcp.server!r} is no longer offered "
                        "(the server changed its tool list, or is not configured on this worker)"
                    ),
                )
            return found
        tool = self.registry.get(call.name)
        if tool is None:
            return ToolResult(
                code=ToolResultCode.BAD_ARGUMENTS,
                message=f"unknown tool {call.name!r}; available tools: {', '.join(self.registry.names())}",
            )
        return tool

    async def _whole_arguments(self, call: Any) -> dict[str, Any] | ToolResult:
        """The call's arguments, read from the content store when they were kept by
        reference (``ToolCall.arguments_ref``), or the result that says they are gone."""
        if call.arguments_ref is None:
            return call.arguments
        try:
            text = (await self.store.read_many([call.arguments_ref])).get(call.arguments_ref)
        except Exception as err:  # noqa: BLE001 - the store is down: retry-safe for every tool (nothing ran)
            raise ApplicationError(
                f"the arguments of this call are kept by reference ({call.arguments_ref}) and the content store "
                f"is unavailable: {err}",
                type="ContentStoreUnavailable",
            ) from None
        if text is None:
            return ToolResult(
                code=ToolResultCode.DEPENDENCY_UNAVAILABLE,
                message=(
                    f"the arguments of this call were kept by reference ({call.arguments_ref}) and are no longer "
                    "in the content store; the tool was not run"
                ),
            )
        # Megabytes of JSON: parsed in a thread, so the event loop keeps heartbeating.
        return await asyncio.to_thread(json.loads, text)

    async def _prepare(self, request: RunToolInput) -> tuple[Tool, Any, ToolContext] | ToolResult:
        """Layers one to three: the tool exists, its arguments are valid, its checks pass."""
        call = request.tool_call
        tool = await self._lookup(request)
        if isinstance(tool, ToolResult):
            return tool
        whole = await self._whole_arguments(call)
        if isinstance(whole, ToolResult):
            return whole
        large = call.arguments_ref is not None
        call = call.model_copy(update={"arguments": whole, "arguments_ref": None})
        try:
            arguments = await asyncio.to_thread(tool.validate, call.arguments) if large else tool.validate(call.arguments)
        except ToolArgumentsError as err:
            return arguments_result(err, tool)
        info = activity.info() if activity.in_activity() else None
        context = ToolContext(
            session_id=request.session_id,
            user_id=request.user_id,
            tool_call_id=call.tool_call_id,
            turn=request.turn,
            attempt=info.attempt if info else 1,
            redis=self.redis,
            call_key=request.call_key,
            durable=self.durable,
        )
        try:
            await tool.run_checks(arguments, context)
        except Exception as err:  # noqa: BLE001 - every check failure becomes a result
            return failure_result(err, in_check=True)
        return tool, arguments, context

    @activity.defn(name=names.VALIDATE_TOOL_CALL)
    async def validate_tool_call(self, request: RunToolInput) -> ValidateToolCallResult:
        """Check a call before a human is asked about it (a local activity: cheap, no I/O
        beyond the tool's own checks). Returns the coerced arguments or the error result."""
        try:
            prepared = await self._prepare(request)
        except ApplicationError as err:  # the content store is down: nothing was run
            prepared = ToolResult(code=ToolResultCode.DEPENDENCY_UNAVAILABLE, message=err.message[:2000])
        if isinstance(prepared, ToolResult):
            return ValidateToolCallResult(arguments=request.tool_call.arguments, error=prepared)
        tool, arguments, _ = prepared
        dumped = tool.dump_arguments(arguments)
        if request.tool_call.arguments_ref is not None:
            text = json.dumps(dumped, ensure_ascii=False)
            if len(text.encode("utf-8", "surrogatepass")) > MAX_INLINE_ARGUMENTS_BYTES:
                # Large arguments stay out of the session (a local activity's result is
                # decoded by workflow code): the coerced ones are kept by reference too.
                ref = value_ref(dumped)
                try:
                    await self.store.keep_many({ref: text})
                except Exception as err:  # noqa: BLE001 - reported as the call's result; nothing ran
                    error = ToolResult(
                        code=ToolResultCode.DEPENDENCY_UNAVAILABLE,
                        message=f"the checked arguments ({len(text)} characters) could not be kept by reference: {err}"[:2000],
                    )
                    return ValidateToolCallResult(arguments=request.tool_call.arguments, error=error)
                return ValidateToolCallResult(arguments=arguments_stand_in(ref, text), arguments_ref=ref)
        return ValidateToolCallResult(arguments=dumped)

    @activity.defn(name=names.RUN_TOOL)
    async def run_tool(self, request: RunToolInput) -> ToolResult:
        """Validate the arguments, run the checks, and run one tool call.

        Returns:
            The tool's result in the ``{code, message, data}`` shape: bad arguments are
            code 1, a failed check code 1 or 3, a ``ToolFailure`` its own code, and a
            non-idempotent tool's exception code 2 (never an error of the workflow).

        Raises:
            ApplicationError: a retry-safe (idempotent or keyed) tool raised; Temporal
                retries it and the workflow reports the final failure as code 2.
        """
        # The one exit of every path (early answers, Python, HTTP and MCP tools, the
        # exactly-once ledger's stored results): nested at most MAX_RESULT_NESTING levels
        # and at most max_result_bytes, or the session could not decode it.
        # Heartbeats from the first moment, not only while the tool runs: reading and
        # checking megabytes of arguments on a busy machine takes longer than the
        # heartbeat timeout.
        name = request.tool_call.name
        with telemetry.span(f"execute_tool {name}", telemetry.tool_attributes(request) if telemetry.enabled() else None) as span:
            result = await self._run_tool_with_events(request)
            telemetry.set_attributes(span, {"hermes.tool.result_code": int(result.code)})
            telemetry.count_tool_result(name, result.code, request.mcp.server if request.mcp else None)
            return result

    async def _run_tool_with_events(self, request: RunToolInput) -> ToolResult:
        """:meth:`run_tool` without its span: heartbeats, the turn events, the bounds."""
        async with heartbeating():
            started = time.monotonic()
            events = self.events
            announced = DelayedEvent(
                (lambda: events.publish_quietly([tool_event(request, "tool_call_started")])) if events is not None else None,
                STARTED_EVENT_DELAY_SECONDS,
            )
            finished = _FinishedEvents(events, request, announced, started) if events is not None else None
            try:
                result = await self.bounded(await self._run_tool(request, finished))
            except Exception as err:
                # An attempt Temporal may retry: said, so a client does not wait on it.
                failed = ToolResult(code=ToolResultCode.DEPENDENCY_UNAVAILABLE, message=f"this attempt failed ({type(err).__name__}); it may be retried")
                if finished is not None and not finished.sent:  # (else its end was published with its record)
                    await finished.publish(failed, retrying=True)
                raise
            except BaseException:
                announced.cancel()
                raise
            if finished is not None and not finished.sent:  # (else sent with the call's ledger record)
                await finished.publish(result)
            return result

    async def _run_tool(self, request: RunToolInput, finished: _FinishedEvents | None = None) -> ToolResult:
        """:meth:`run_tool` before :meth:`bounded`; ``finished``: the call's last turn
        events, for a non-idempotent call to send with its ledger record, and for a
        synchronous idempotent one to send from its thread."""
        prepared = await self._prepare(request)
        if isinstance(prepared, ToolResult):
            return prepared
        tool, arguments, context = prepared
        if tool.idempotent:
            # A synchronous tool's end is published from its thread when the result needs
            # no content store (issue 31: no round trip of the event loop's for it).
            in_thread = finished is not None and finished.log.blocking is not None
            call = _sync_call(tool, arguments, context) if in_thread else None
            result: ToolResult | None = None
            try:
                if call is not None:
                    assert finished is not None
                    value, result = await with_heartbeat(
                        run_in_tool_thread(functools.partial(_call_and_announce, call, finished, self.max_result_bytes))
                    )
                else:
                    value = await with_heartbeat(tool.invoke(arguments, context))
            except ToolFailure as err:
                return failure_result(err)
            except Exception as err:  # noqa: BLE001 - any tool failure is reported, then retried
                # An endpoint's Retry-After (HTTP tools: 429/503) paces the next attempt, capped
                # so that the three attempts stay within the turn's patience.
                after = getattr(err, "retry_after_seconds", None)
                delay = timedelta(seconds=min(float(after), _MAX_RETRY_AFTER_SECONDS)) if isinstance(after, (int, float)) and after > 0 else None
                raise ApplicationError(
                    f"{type(err).__name__}: {err}"[:_MAX_MESSAGE_CHARS], type=type(err).__name__, next_retry_delay=delay
                ) from err
            if finished is not None and finished.sent:
                finished.announced.cancel()  # (sent from the thread: the timer has no use)
            return result if result is not None else to_tool_result(value)
        return await self._run_at_most_once(request, tool, arguments, context, finished)

    async def _run_at_most_once(
        self, request: RunToolInput, tool: Tool, arguments: Any, context: ToolContext, finished: _FinishedEvents | None = None
    ) -> ToolResult:
        """:meth:`_claim_and_run`, carried to its end when Temporal ends the attempt for a
        late heartbeat (see :func:`_finish_unless_cancelled`): from its claim on, a call
        that stopped halfway would be "outcome unknown" for ever."""
        work = asyncio.create_task(self._claim_and_run(request, tool, arguments, context, finished))
        return await _finish_unless_cancelled(work, f"{tool.name} ({idempotency_key(request.call_key)})")

    async def _claim_and_run(
        self, request: RunToolInput, tool: Tool, arguments: Any, context: ToolContext, finished: _FinishedEvents | None = None
    ) -> ToolResult:
        """Run a non-idempotent tool at most once per ``request.call_key``.

        The claim is a Redis ``SET NX`` (atomic across concurrent attempts; with the
        attempt's running lease, :func:`~activities.call_lease.claim_call`) and a durable
        record (inserted only if absent). A claim that Redis grants but the durable store
        already holds means Redis lost the record (flushed, evicted): the durable one
        decides, and the tool is not run again. While Redis is unreachable the durable
        record alone claims the call (Temporal runs one attempt at a time).

        Returns:
            The tool's result; a stored result for a call that finished before; code 4
            (outcome unknown) for one that started and never reported; code 2 when the
            claim could not be recorded (the tool did not run).
        """
        async with contextlib.AsyncExitStack() as leases:
            key = idempotency_key(request.call_key)
            if self.redis is None and self.ledger is None:
                return ToolResult(
                    code=ToolResultCode.DEPENDENCY_UNAVAILABLE,
                    message="no idempotency store (Redis or the durable store) is configured; a non-idempotent tool is not run without one",
                )
            lease = RunningLease(self.redis, key) if self.redis is not None else None
            started = json.dumps({"state": "started", "attempt": context.attempt, "tool": tool.name, "lease": lease and lease.token})
            record: dict[str, Any] | None = None
            if lease is not None:
                try:
                    record = await claim_for_attempt(lease, started, IDEMPOTENCY_TTL_SECONDS)
                except Exception as err:  # noqa: BLE001 - Redis down: the durable record claims alone
                    if self.ledger is None:
                        raise
                    log.warning("tool call %s: Redis unavailable (%s); claimed in the durable ledger alone", key, err)
                    lease = None
                if record is None and lease is not None:
                    lease.start()  # from the claim on, a later attempt waits for this one while it lives
                    leases.push_async_callback(lease.stop)
            redis_ok, claimed = lease is not None, record is None
            if record is None and self.ledger is not None:
                ran = _InThread(fallback=True)
                try:
                    # A synchronous tool: claimed, run and recorded in one hop to a thread.
                    call = _sync_call(tool, arguments, context)
                    if call is not None:
                        ran = await with_heartbeat(run_in_tool_thread(
                            functools.partial(_claim_and_call, self.ledger, request, started, call, self.max_result_bytes)))
                    record = await self.ledger.claim(request.call_key, request.session_id, started) if ran.fallback else ran.record
                    if record is not None:
                        log.warning("tool call %s: Redis had no record, the durable ledger had one", key)
                except DurableStoreError as err:
                    result = ToolResult(
                        code=ToolResultCode.DEPENDENCY_UNAVAILABLE,
                        message=f"{tool.name} was not run: its exactly-once record could not be kept ({err})",
                        data={"outcome": "not_run"},
                    )
                    # So that a retried attempt answers the same, never runs it.
                    await self._record(key, {"state": "done", "result": result.model_dump(mode="json")}, durable=None, redis=redis_ok)
                    return result
                if ran.result is not None:  # it ran (outside the try: a tool that ran is never "not run")
                    return await self._record_result(request, key, redis_ok, lease, finished, ran.result, written=ran.written)
            if record is not None and record.get("state") == "started" and lease is not None and not claimed:
                # An earlier attempt that claimed the call in Redis and still holds its lease
                # runs on a live worker (Temporal timed it out for a late heartbeat): its
                # result, not "unknown". (A claim of ours the durable store contradicts has
                # no earlier lease to wait for: Redis lost them both.)
                record = await self._await_earlier_attempt(key, lease) or record
            if record is not None and record.get("state") != "done" and self.ledger is not None:
                # Redis kept the claim only (the result's write failed or was cut): the
                # durable copy may hold the result its holder wrote.
                with contextlib.suppress(DurableStoreError):
                    record = await self.ledger.done(request.call_key) or record
            if record is not None:
                if record.get("state") == "done":
                    await self._record(key, record, durable=None, redis=redis_ok)
                    return ToolResult.model_validate(record["result"])
                log.warning("tool call %s started before and never finished; not running it again", key)
                record = {**record, "state": "unknown"}
                await self._record(key, record, durable=None, redis=redis_ok)
                return ToolResult(
                    code=ToolResultCode.OUTCOME_UNKNOWN,
                    message=(
                        f"{tool.name} started on attempt {record.get('attempt', '?')} but its worker stopped before "
                        "reporting; its outcome is unknown and it was not run again. Check before retrying: "
                        "running it again needs a human's approval."
                    ),
                    data={"outcome": "unknown", "ledger_key": key},
                )
            return await self._invoke_and_record(request, tool, arguments, context, key, redis_ok, lease, finished)

    async def _invoke_and_record(
        self, request: RunToolInput, tool: Tool, arguments: Any, context: ToolContext, key: str, redis_ok: bool,
        lease: RunningLease | None = None, finished: _FinishedEvents | None = None,
    ) -> ToolResult:
        """Run a claimed non-idempotent call and record its result ("done"); ``lease``:
        the call's running lease, given up in the same Redis round trip as the record,
        which also carries the call's ``finished`` turn events."""
        try:
            result = to_tool_result(await with_heartbeat(tool.invoke(arguments, context)))
        except (Exception, KeyboardInterrupt, SystemExit) as err:  # noqa: BLE001 - the tool failed; record and report
            # (KeyboardInterrupt / SystemExit raised by tool code, not by this process:
            # recorded as the tool's failure, never left looking like a crashed worker.)
            result = failure_result(err)
        return await self._record_result(request, key, redis_ok, lease, finished, result)

    async def _record_result(
        self, request: RunToolInput, key: str, redis_ok: bool, lease: RunningLease | None, finished: _FinishedEvents | None,
        result: ToolResult, *, written: bool = False,
    ) -> ToolResult:
        """Record a claimed call's ``result`` (see :meth:`_invoke_and_record`); ``written``:
        already bounded and in the durable ledger (:func:`_claim_and_call`)."""
        # (Outside the tool's try: storing a large result never turns a done call into a
        # failure. Bounded before it is recorded, so that a replay returns the same result.)
        result = result if written else await self.bounded(result)
        done = {"state": "done", "result": result.model_dump(mode="json")}
        if finished is not None and lease is not None and redis_ok:
            await finished.settle(result)
        else:
            finished = None
        durable = None if written else (request.call_key, request.session_id)
        await self._record(key, done, durable=durable, redis=redis_ok, lease=lease, finished=finished)
        return result

    async def _await_earlier_attempt(self, key: str, lease: RunningLease) -> dict[str, Any] | None:
        """The "done" record of an earlier attempt of this call, waited for while that
        attempt holds its lease (heartbeating meanwhile; ``lease``: this attempt's, whose
        token is never waited on); None once the lease lapsed with no result (its worker
        is gone) or Redis cannot tell."""
        assert self.redis is not None
        async with heartbeating():
            while True:
                asked = cancel_requests()  # this task may have handled a cancel before
                try:
                    raw = await self.redis.get(key)
                    record = open_record(raw, key)
                    if record.get("state") == "done":
                        return record
                    if record.get("state") != "started":
                        return None
                    if not await lease.held_by_another():
                        # Read again: its holder may have written "done" and dropped the lease
                        # between the two reads (else "unknown" would overwrite its result).
                        record = open_record(await self.redis.get(key), key)
                        return record if record.get("state") == "done" else None
                except Exception as err:  # noqa: BLE001 - no answer: the caller reports what it has
                    log.warning("tool call %s: cannot wait for its earlier attempt: %s", key, err)
                    return None
                raise_if_cancelled(asked)  # a cancelled attempt stops waiting (a cancel redis-py swallowed too)
                await asyncio.sleep(_AWAIT_POLL_SECONDS)

    async def _record(
        self, key: str, record: dict[str, Any], *, durable: tuple[str, str] | None, redis: bool,
        lease: RunningLease | None = None, finished: _FinishedEvents | None = None,
    ) -> None:
        """Write a ledger record to Redis and (``durable``: call key, session id) to the
        durable store. Failures are logged, not raised: the tool has run (or is reported
        as not run), and a missing "done" record costs only an "outcome unknown" later.
        ``lease``: the call's running lease, stopped first and dropped in the same round
        trip as the Redis record, after it, with the call's ``finished`` turn events after
        them (issue 31: two round trips a call less)."""
        text = json.dumps(record)
        if durable is not None and self.ledger is not None:
            try:
                # Only this attempt, the claim's holder, ever writes this key's result.
                await self.ledger.finish(durable[0], durable[1], text)
            except DurableStoreError as err:
                log.warning("tool call %s: the durable record not updated: %s", key, err)
        if redis and self.redis is not None:
            try:
                # Sealed when encryption is on: a done record holds the tool's result.
                sealed = encryption.seal(text)
                if lease is None:
                    await self.redis.set(key, sealed, ex=IDEMPOTENCY_TTL_SECONDS)
                else:
                    await _record_and_release(self.redis, key, sealed, lease, finished)
            except Exception as err:  # noqa: BLE001
                log.warning("tool call %s: the Redis record not updated: %s", key, err)


class _ListingRefs:
    """The references (``value_ref([spec JSONs, group JSONs])``) of the last few tool
    listings: a listing made of the same spec objects (a registry's, held per tool by
    :meth:`ToolActivities._spec_of`) and equal groups has the reference it had, without
    hashing every schema again at every turn's start (issue 31: about 0.1 ms of a turn's
    CPU with the built-in tools; more with many). Listings with an MCP server's tools (new
    spec objects each time) are hashed each time and not kept. One per process, on the
    event loop (activities that list tools are ``async``)."""

    def __init__(self, size: int = 8) -> None:
        self._known: collections.deque[tuple[list[dict[str, Any]], str, str]] = collections.deque(maxlen=size)

    def ref(self, specs: list[dict[str, Any]], groups: list[dict[str, Any]], *, keep: bool = True) -> str:
        """The listing's reference; ``keep`` False (a listing with MCP tools): hashed, not kept."""
        if not keep:
            return value_ref([specs, groups])
        grouped = json.dumps(groups, sort_keys=True, separators=(",", ":"), default=str)
        for known, known_groups, ref in self._known:
            if known_groups == grouped and len(known) == len(specs) and all(map(operator.is_, known, specs)):
                return ref
        ref = value_ref([specs, groups])
        self._known.append((list(specs), grouped, ref))
        return ref


_LISTING_REFS = _ListingRefs()


@dataclass
class _InThread:
    """What :func:`_claim_and_call` did: nothing (``fallback``: claim on the event loop);
    found the call's ``record`` (claimed before); or ran it: its ``result``, and whether
    that result is ``written`` to the durable ledger."""

    fallback: bool = False
    record: dict[str, Any] | None = None
    result: ToolResult | None = None
    written: bool = False


def _claim_and_call(ledger: CallLedger, request: RunToolInput, started: str, call: Any, max_result_bytes: int) -> _InThread:
    """In a thread of synchronous tools: the durable claim of a non-idempotent call, the
    call of its synchronous tool if the claim was granted, and its result's durable
    record when it needs no content store (within ``max_result_bytes``: as
    :meth:`ToolActivities.bounded` leaves it). One hop to a thread, not three (issue 31).

    Raises:
        DurableStoreError: the claim could not be kept (the tool did not run).
    """
    if not ledger.claims_without_io_wait():
        return _InThread(fallback=True)
    found = ledger.claim_in_thread(request.call_key, request.session_id, started)
    if found is not None:
        return _InThread(record=found)
    try:
        result = shallow_result(to_tool_result(call()))
    except (Exception, KeyboardInterrupt, SystemExit) as err:  # noqa: BLE001 - as in _invoke_and_record
        result = failure_result(err)
    size = _result_size(result)[1]
    if not 0 <= size <= max_result_bytes:
        return _InThread(result=result)  # bounded, and recorded, on the event loop
    try:
        ledger.finish_in_thread(request.call_key, request.session_id, json.dumps({"state": "done", "result": result.model_dump(mode="json")}))
    except DurableStoreError as err:
        log.warning("tool call %s: the durable record not updated: %s", request.call_key, err)
        return _InThread(result=result)  # tried again with the Redis record
    return _InThread(result=result, written=True)


def _sync_call(tool: Tool, arguments: Any, context: ToolContext) -> Any:
    """The call of ``tool``'s synchronous function (:meth:`FunctionTool.sync_call`), to run in
    a thread with what must happen there around it; None for a coroutine function and for
    a tool whose ``invoke`` is its own (a subclass, an MCP or HTTP tool)."""
    return tool.sync_call(arguments, context) if type(tool).invoke is FunctionTool.invoke else None  # type: ignore[attr-defined]


def _call_and_announce(call: Any, finished: _FinishedEvents, max_result_bytes: int) -> tuple[Any, ToolResult | None]:
    """In a thread of synchronous tools: an idempotent tool's ``call``, then, when its
    result needs no content store (within ``max_result_bytes``, as
    :meth:`ToolActivities.bounded` leaves it), the call's end events
    (:meth:`_FinishedEvents.publish_in_thread`).

    Returns:
        ``(value, result)``: what the tool returned, and its result, or None when the loop
        makes it (a value :func:`to_tool_result` refuses fails there as before).

    Raises:
        Exception: what the tool raised (the loop reports or retries it as before).
    """
    value = call()
    try:
        result = shallow_result(to_tool_result(value))
    except Exception:  # noqa: BLE001 - made again on the loop, which reports it
        return value, None
    if 0 <= _result_size(result)[1] <= max_result_bytes:
        finished.publish_in_thread(result)
    return value, result


class _FinishedEvents:
    """The turn events that end one tool call: ``tool_call_finished``, after
    ``tool_call_started`` if that is out, else with it in one write (a call done within
    :data:`STARTED_EVENT_DELAY_SECONDS`). Published on their own (:meth:`publish`) or, for
    a non-idempotent call, in the round trip of its ledger record
    (:func:`_record_and_release`); :attr:`sent` once queued there, so
    :meth:`ToolActivities.run_tool` does not publish them again."""

    def __init__(self, log_: EventLog, request: RunToolInput, announced: DelayedEvent, started: float) -> None:
        self.log = log_
        self.request = request
        self.announced = announced
        self.started = started
        self.attempt = activity.info().attempt if activity.in_activity() else 1
        self.events: list[TurnEvent] = []
        self.sent = False
        self._loop = asyncio.get_running_loop()

    async def settle(self, result: ToolResult, *, retrying: bool = False) -> None:
        """Wait for a ``tool_call_started`` already being published (it goes first), then
        make the events that say the call ended with ``result``."""
        seconds = time.monotonic() - self.started  # the call's, not the wait for its started event
        self.events = self._made(result, seconds, started=not await self.announced.settle(), retrying=retrying)

    def _made(self, result: ToolResult, seconds: float, *, started: bool, retrying: bool = False) -> list[TurnEvent]:
        """``tool_call_finished`` for ``result`` after ``seconds``, after ``tool_call_started``
        when ``started`` (not out yet); callable from any thread (the attempt is the one
        read on the loop)."""
        finished = tool_event(self.request, "tool_call_finished", result, seconds, retrying=retrying, attempt=self.attempt)
        return [tool_event(self.request, "tool_call_started", attempt=self.attempt), finished] if started else [finished]

    async def publish(self, result: ToolResult, *, retrying: bool = False) -> None:
        """:meth:`settle`, then publish the events in one write (best effort)."""
        await self.settle(result, retrying=retrying)
        await self.log.publish_quietly(self.events)

    def queue(self, pipe: Any) -> int:
        """Queue the events on ``pipe``; returns how many commands that took."""
        self.sent = True
        return self.log.queue(pipe, self.events)

    def publish_in_thread(self, result: ToolResult) -> None:
        """From the tool's thread (:func:`_call_and_announce`): unless ``tool_call_started``
        is already out or on its way (then the loop publishes the end after it, as
        :meth:`publish`), or the attempt was cancelled meanwhile (then nothing is), both
        events in one write (:meth:`EventLog.publish_in_thread`). Never raises: events that
        do not land are reported on the loop (:meth:`EventLog.report_unpublished`)."""
        if not self.announced.take():
            return
        self.sent = True
        try:
            self.events = self._made(result, time.monotonic() - self.started, started=True)
            failed = self.log.publish_in_thread(self.events)
        except Exception as err:  # noqa: BLE001 - an event never fails the call it describes
            failed = err
        if failed is not None:
            with contextlib.suppress(RuntimeError):  # (a closed loop: the worker is gone)
                self._loop.call_soon_threadsafe(EventLog.report_unpublished, self.events, failed)


async def _record_and_release(
    redis: Any, key: str, sealed: str, lease: RunningLease, finished: _FinishedEvents | None = None
) -> None:
    """The Redis record ``sealed`` of call ``key``, the drop of its running lease and the
    call's ``finished`` turn events, in that order, in one round trip (issue 31); the
    lease's renewals stop first. If the lease's drop fails or is cancelled, it is dropped
    again (a later attempt must not wait on it); events that do not land are reported and
    dropped (best effort, as every turn event).

    Raises:
        redis.RedisError: the record was not written.
    """
    lease.by_record = True
    # A cluster sends each node's part of a pipeline on its own: the lease (another slot)
    # is dropped only once the record is written (found by a break-it review).
    after = isinstance(redis, RedisCluster)
    try:
        await lease.stop()
        pipe = redis.pipeline(transaction=False)
        pipe.set(key, sealed, ex=IDEMPOTENCY_TTL_SECONDS)
        if not after:
            lease.queue_drop(pipe)
        if finished is not None and finished.events:
            finished.queue(pipe)
        answers = await pipe.execute(raise_on_error=False)
    except BaseException as err:
        await lease.drop()
        if finished is not None and finished.sent:
            EventLog.report_unpublished(finished.events, err if isinstance(err, Exception) else "cancelled")
        raise
    if after:
        answers.insert(1, None)
    if after or isinstance(answers[1], Exception):
        await lease.drop()
    failed = next((a for a in answers[2:] if isinstance(a, Exception)), None)
    if failed is not None and finished is not None:
        EventLog.report_unpublished(finished.events, failed)
    if isinstance(answers[0], Exception):
        raise answers[0]


async def _finish_unless_cancelled(work: asyncio.Task[ToolResult], what: str) -> ToolResult:
    """``work``'s result; a cancellation of the attempt stops ``work`` only when someone
    asked for it (the session cancelled the call, an operator paused or reset it) or the
    attempt's start-to-close timeout (the tool's own time limit) has run out.

    An attempt that Temporal ended for a late heartbeat (``not_found``, ``timed_out``
    before its start-to-close deadline) or whose worker is shutting down has a started
    side effect: it finishes, within what is left of its start-to-close timeout, and
    records its result, which a later attempt reads instead of reporting the outcome
    unknown (issue 31: "a non-idempotent MCP tool's at-most-once record write was cancelled
    and reported 'its worker stopped' while the worker lived").
    """
    loop = asyncio.get_running_loop()
    deadline: float | None = None
    while True:
        try:
            if deadline is None:
                return await asyncio.shield(work)
            return await asyncio.wait_for(asyncio.shield(work), max(0.0, deadline - loop.time()))
        except asyncio.TimeoutError:
            await _stopped(work)  # its start-to-close deadline: the tool's time is up
            raise asyncio.CancelledError() from None
        except asyncio.CancelledError:
            if work.done() and not work.cancelled():
                return work.result()
            details = activity.cancellation_details() if activity.in_activity() else None
            left = remaining_seconds(activity.info()) if activity.in_activity() else None
            if (details is None or details.cancel_requested or details.paused or details.reset
                    or (left is not None and left <= 0)):
                await _stopped(work)
                raise
            if deadline is None:
                log.warning("tool call %s: its attempt was ended (%s) while it ran; finishing it (%s s left) and "
                            "recording its result", what, details, "?" if left is None else f"{left:.1f}")
            if left is not None:
                deadline = loop.time() + left


async def _stopped(task: asyncio.Task[Any]) -> None:
    """Cancel ``task`` and wait for it to end."""
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
