"""How a workflow runs one tool call as an activity, shared by the session and the
composite-tool workflow: timeouts from the tool's tier, retries from its idempotency,
and activity failures turned into ``{code, message, data}`` results."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError, TimeoutError

with workflow.unsafe.imports_passed_through():
    from hermes.models import ToolResult, ToolResultCode, ToolSpec

MAX_ERROR_CHARS = 2000

MCP_RETRY_FIRST = timedelta(milliseconds=500)
"""First retry interval of an MCP tool (then doubled): its three attempts span 1.5 s, more
than the 1 s an MCP server waits before its first restart
(:data:`hermes.mcp.manager.BACKOFF_FIRST_SECONDS`), so a retry after a dropped connection
is not spent inside that backoff (issue 27); each attempt also waits for the relaunch
within its own deadline."""


def tool_activity_options(spec: ToolSpec) -> dict[str, Any]:
    """``start_activity`` keyword arguments for a call of ``spec``.

    Idempotent and keyed tools retry with 200 ms x2 backoff, 3 attempts (seed 004 §4.3);
    an MCP server's tools from :data:`MCP_RETRY_FIRST` (500 ms) x2.
    A non-idempotent tool runs once: later attempts (after a worker crash) only read
    its exactly-once record (Redis, then the durable store) and report the stored result
    or "outcome unknown".
    """
    retry = RetryPolicy(
        initial_interval=MCP_RETRY_FIRST if spec.mcp is not None else timedelta(milliseconds=200),
        backoff_coefficient=2.0,
        maximum_attempts=3,
        non_retryable_error_types=["ToolArgumentsError"],
    )
    return {
        "start_to_close_timeout": timedelta(seconds=spec.timeout_seconds),
        "heartbeat_timeout": timedelta(seconds=spec.heartbeat_timeout_seconds),
        "retry_policy": retry,
    }


def failure_text(err: BaseException) -> str:
    """The most specific human-readable reason inside an activity failure chain."""
    cause: BaseException | None = err
    text = str(err)
    while cause is not None:
        if isinstance(cause, TimeoutError):
            return f"timed out ({cause.type.name.lower().replace('_', '-')})" if cause.type else "timed out"
        if isinstance(cause, ApplicationError):
            return cause.message or text
        text = str(cause) or text
        cause = cause.__cause__
    return text


def result_from_failure(err: ActivityError, spec: ToolSpec) -> ToolResult:
    """The result the model sees when the tool activity failed for good."""
    text = failure_text(err)
    if isinstance(err.cause, TimeoutError):
        if spec.idempotent:
            return ToolResult(code=ToolResultCode.OUTCOME_UNKNOWN, message=f"the tool {text}")
        return ToolResult(
            code=ToolResultCode.OUTCOME_UNKNOWN,
            message=f"the tool did not report back ({text}); its outcome is unknown and it was not run again",
            data={"outcome": "unknown"},
        )
    return ToolResult(code=ToolResultCode.DEPENDENCY_UNAVAILABLE, message=text[:MAX_ERROR_CHARS])
