"""Tool activities: list the registry, run one tool call.

A non-idempotent tool runs at most once per ``session_id:tool_call_id``: before it
runs, a record is set in Redis with ``SET NX``; a later attempt that finds the record
returns the stored result, or, if the first attempt never finished, reports the
outcome as unknown instead of running the tool again.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from typing import Any

from pydantic_core import to_jsonable_python
from temporalio import activity
from temporalio.exceptions import ApplicationError

from hermes import names
from hermes.errors import ToolArgumentsError
from hermes.models import ListToolsResult, RunToolInput, ToolResult, ToolResultCode
from hermes.tools.registry import ToolContext, ToolRegistry

log = logging.getLogger("hermes.tools")

IDEMPOTENCY_TTL_SECONDS = 30 * 24 * 3600
_MAX_MESSAGE_CHARS = 2000


def idempotency_key(call_key: str) -> str:
    """Redis key of the exactly-once record of one tool call (see ``RunToolInput.call_key``)."""
    return f"hermes:toolcall:{call_key}"


def cap_result(result: ToolResult, max_bytes: int) -> ToolResult:
    """``result`` with its data cut to a preview when its JSON exceeds ``max_bytes``.

    A tool result is an activity result, stored in history and sent to the model:
    above Temporal's 2 MB payload limit it would fail the call, and well below it, it
    would still fill the context window.
    """
    text = result.model_dump_json()
    size = len(text.encode("utf-8"))
    if size <= max_bytes:
        return result
    data_text = json.dumps(result.data, ensure_ascii=False, default=str)
    preview = data_text.encode("utf-8")[: max(max_bytes // 2, 256)].decode("utf-8", "ignore")
    return result.model_copy(
        update={
            "message": f"{result.message[:500]} (result truncated: {size} bytes, limit {max_bytes}; the data is a preview)",
            "data": {"truncated": True, "preview": preview},
        }
    )


def to_tool_result(value: Any) -> ToolResult:
    """Whatever a tool returned, in the ``{code, message, data}`` shape, JSON-safe.

    Data that JSON cannot carry (datetimes, sets, bytes, arbitrary objects) is converted
    here, with ``str`` as the last resort, so that a tool which did its work is never
    reported as failed because its return value could not be serialized.
    """
    if not isinstance(value, ToolResult):
        value = ToolResult(data=value)
    message = str(value.message)
    if len(message) > _MAX_MESSAGE_CHARS:
        message = message[:_MAX_MESSAGE_CHARS] + "..."
    data = to_jsonable_python(value.data, fallback=str, bytes_mode="base64")
    return ToolResult(code=value.code, message=message, data=data)


class ToolActivities:
    """Runs the tools of a registry.

    Args:
        registry: the tools this worker serves.
        redis: a ``redis.asyncio.Redis``; needed for non-idempotent tools.
        max_result_bytes: larger tool results are cut to a preview (see :func:`cap_result`).
        tier_seconds: tier name -> timeout in seconds.
        heartbeat_timeout_seconds: heartbeat timeout the workflow sets on tool calls.
    """

    def __init__(
        self,
        registry: ToolRegistry,
        redis: Any,
        *,
        tier_seconds,
        heartbeat_timeout_seconds: float = 5.0,
        max_result_bytes: int = 64_000,
    ):
        self.registry = registry
        self.redis = redis
        self.max_result_bytes = max_result_bytes
        self.tier_seconds = tier_seconds
        self.heartbeat_timeout_seconds = heartbeat_timeout_seconds

    @activity.defn(name=names.LIST_TOOLS)
    async def list_tools(self) -> ListToolsResult:
        return ListToolsResult(
            tools=[
                t.spec(tier_seconds=self.tier_seconds, heartbeat_timeout_seconds=self.heartbeat_timeout_seconds)
                for t in self.registry
            ]
        )

    @activity.defn(name=names.RUN_TOOL)
    async def run_tool(self, request: RunToolInput) -> ToolResult:
        """Validate the arguments and run one tool call.

        Returns:
            The tool's result; bad arguments are a result with code 1, not an error.

        Raises:
            ApplicationError: an idempotent tool raised (retried by Temporal); the
                workflow reports the final failure to the model as code 2.
        """
        call = request.tool_call
        tool = self.registry.get(call.name)
        if tool is None:
            return ToolResult(code=ToolResultCode.BAD_ARGUMENTS, message=f"unknown tool {call.name!r}")
        try:
            arguments = tool.validate(call.arguments)
        except ToolArgumentsError as err:
            return ToolResult(
                code=ToolResultCode.BAD_ARGUMENTS,
                message=str(err)[:_MAX_MESSAGE_CHARS],
                data={"problems": err.problems},
            )
        info = activity.info()
        context = ToolContext(
            session_id=request.session_id,
            user_id=request.user_id,
            tool_call_id=call.tool_call_id,
            turn=request.turn,
            attempt=info.attempt,
            redis=self.redis,
            call_key=request.call_key,
        )
        if tool.idempotent:
            try:
                return cap_result(to_tool_result(await self._with_heartbeat(tool.call(arguments, context))), self.max_result_bytes)
            except ApplicationError:
                raise
            except Exception as err:  # noqa: BLE001 - any tool failure is reported, then retried
                raise ApplicationError(f"{type(err).__name__}: {err}"[:_MAX_MESSAGE_CHARS], type=type(err).__name__) from err
        return await self._run_at_most_once(request, tool, arguments, context)

    async def _run_at_most_once(self, request: RunToolInput, tool, arguments, context: ToolContext) -> ToolResult:
        key = idempotency_key(request.call_key)
        if self.redis is None:
            return ToolResult(
                code=ToolResultCode.DEPENDENCY_UNAVAILABLE,
                message="no idempotency store (Redis) is configured; a non-idempotent tool is not run without one",
            )
        started = json.dumps({"state": "started", "attempt": context.attempt})
        claimed = await self.redis.set(key, started, nx=True, ex=IDEMPOTENCY_TTL_SECONDS)
        if not claimed:
            record = json.loads(await self.redis.get(key) or "{}")
            if record.get("state") == "done":
                return ToolResult.model_validate(record["result"])
            log.warning("tool call %s started before and never finished; not running it again", key)
            return ToolResult(
                code=ToolResultCode.OUTCOME_UNKNOWN,
                message=(
                    f"{tool.name} started on attempt {record.get('attempt', '?')} but its worker stopped before "
                    "reporting; its outcome is unknown and it was not run again. Check before retrying."
                ),
            )
        try:
            result = cap_result(to_tool_result(await self._with_heartbeat(tool.call(arguments, context))), self.max_result_bytes)
        except Exception as err:  # noqa: BLE001 - the tool said it failed; record and report
            result = ToolResult(
                code=ToolResultCode.DEPENDENCY_UNAVAILABLE, message=f"{type(err).__name__}: {err}"[:_MAX_MESSAGE_CHARS]
            )
        await self.redis.set(
            key, json.dumps({"state": "done", "result": result.model_dump(mode="json")}), ex=IDEMPOTENCY_TTL_SECONDS
        )
        return result

    async def _with_heartbeat(self, coro: Any) -> Any:
        """Await ``coro`` while heartbeating, so a crashed worker is noticed in seconds."""
        interval = max(self.heartbeat_timeout_seconds / 3, 0.2)

        async def beat() -> None:
            while True:
                activity.heartbeat()
                await asyncio.sleep(interval)

        beater = asyncio.create_task(beat())
        try:
            return await coro
        finally:
            beater.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await beater
