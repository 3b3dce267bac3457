"""Slow tools for the crash test (``tests/test_crash.py``).

A worker subprocess loads this module through ``HERMES_TOOL_MODULES=tests.crash_tools``;
the tools go into the default registry. Each call first appends one JSON line to the
file named by ``HERMES_CRASH_COUNTER_FILE`` (the side effect the test counts), then, on
its first attempt only, sleeps ``HERMES_CRASH_SLOW_SECONDS`` (default 30 s) so that the
test can kill the worker while the call runs. A later attempt returns at once, so a
wrongly repeated call shows up as a second line, not as a hung test.
"""

from __future__ import annotations

import asyncio
import json
import os
import time

from hermes.models import ToolResult
from hermes.tools.registry import ToolContext, tool

COUNTER_FILE_ENV = "HERMES_CRASH_COUNTER_FILE"
SLOW_SECONDS_ENV = "HERMES_CRASH_SLOW_SECONDS"


def _record_side_effect(tool_name: str, label: str, context: ToolContext) -> None:
    line = json.dumps(
        {
            "tool": tool_name,
            "label": label,
            "tool_call_id": context.tool_call_id,
            "attempt": context.attempt,
            "key": context.idempotency_key,
            "pid": os.getpid(),
            "at": time.time(),
        }
    )
    with open(os.environ[COUNTER_FILE_ENV], "a", encoding="utf-8") as counter:
        counter.write(line + "\n")
        counter.flush()
        os.fsync(counter.fileno())


async def _slow(tool_name: str, label: str, context: ToolContext) -> ToolResult:
    _record_side_effect(tool_name, label, context)
    if context.attempt == 1:
        await asyncio.sleep(float(os.environ.get(SLOW_SECONDS_ENV, "30")))
    return ToolResult(message=f"{tool_name} done", data={"label": label, "attempt": context.attempt})


@tool(tier="batch", idempotent=False, permission="read")
async def slow_side_effect(label: str, context: ToolContext) -> ToolResult:
    """Append a line to the counter file, then work slowly. Not idempotent: running it
    twice appends twice.

    Args:
        label: text recorded with the line.
    """
    return await _slow("slow_side_effect", label, context)


@tool(tier="batch", idempotent=True, permission="read")
async def slow_idempotent_side_effect(label: str, context: ToolContext) -> ToolResult:
    """Append a line to the counter file, then work slowly. Declared idempotent, so a
    retry after a crash may run it again.

    Args:
        label: text recorded with the line.
    """
    return await _slow("slow_idempotent_side_effect", label, context)


@tool(tier="batch", idempotency="keyed", permission="read")
async def slow_keyed_side_effect(label: str, context: ToolContext) -> ToolResult:
    """Append a line (with the call's idempotency key) to the counter file, then work
    slowly. Keyed: retried after a crash with the same key, for the backend to de-duplicate.

    Args:
        label: text recorded with the line.
    """
    return await _slow("slow_keyed_side_effect", label, context)
