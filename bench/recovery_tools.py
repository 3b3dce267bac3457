"""The 1-second tool of ``bench/recovery.py``, loaded by its worker processes through
``HERMES_TOOL_MODULES=bench.recovery_tools`` (the tool goes into the default registry).

``recovery_work(label)`` first appends one JSON line ``{label, attempt, pid, at}`` (``at``:
Unix seconds) to the file named by ``HERMES_RECOVERY_MARKER_FILE``, so the bench knows
the call is running and on which process, then sleeps ``HERMES_RECOVERY_WORK_SECONDS``
(default 1 s) on *every* attempt: the retry after a crash costs the same second, which
the bench subtracts. Declared idempotent, so the session retries it on another worker
after its worker is killed (a non-idempotent tool would be reported "outcome unknown"
instead, without a retry).
"""

from __future__ import annotations

import asyncio
import json
import os
import time

from hermes.models import ToolResult
from hermes.tools.registry import ToolContext, tool

MARKER_FILE_ENV = "HERMES_RECOVERY_MARKER_FILE"
WORK_SECONDS_ENV = "HERMES_RECOVERY_WORK_SECONDS"


@tool(tier="query", idempotent=True, permission="read")
async def recovery_work(label: str, context: ToolContext) -> ToolResult:
    """Work for about a second (a benchmark's stand-in for a slow tool).

    Args:
        label: which measurement this call belongs to.
    """
    line = json.dumps({"label": label, "attempt": context.attempt, "pid": os.getpid(), "at": time.time()})
    with open(os.environ[MARKER_FILE_ENV], "a", encoding="utf-8") as marker:
        marker.write(line + "\n")
    await asyncio.sleep(float(os.environ.get(WORK_SECONDS_ENV, "1")))
    return ToolResult(message="worked", data={"label": label, "attempt": context.attempt})
