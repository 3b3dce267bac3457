"""An MCP server whose answers the mcp SDK's client would drop, for ``tests/test_mcp_outputs.py``.

Every call appends a line ``<tool> ran`` to the file ``argv[1]`` (the test counts the
runs there, on the server's side).

- ``report``: lists an ``outputSchema`` (an object with an integer ``total``) but answers
  text only, as servers of older SDKs do.
- ``wrong_report``: lists the same schema and answers text with structured content that
  does not match it (``total`` is a string).
- ``crash_once``: ``idempotentHint: true``; its first call (no ``<file>.crashed`` yet)
  creates that marker and kills the server (``os._exit(3)``) before answering; a later
  call answers ``recovered``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from mcp.server.mcpserver import MCPServer
from mcp_types import CallToolResult, ListToolsResult, TextContent, ToolAnnotations

LEDGER = Path(sys.argv[1])
REPORT_SCHEMA = {"type": "object", "properties": {"total": {"type": "integer"}}, "required": ["total"]}
REPORT_TEXT = "rows: 42\ntotal: 42 (all rows read)"


class Declaring(MCPServer):
    """Lists ``REPORT_SCHEMA`` as the output schema of the report tools (whose functions
    declare none, so this server does not check what they return against it)."""

    async def _handle_list_tools(self, ctx: Any, params: Any) -> ListToolsResult:
        listed = await super()._handle_list_tools(ctx, params)
        for tool in listed.tools:
            if tool.name in ("report", "wrong_report"):
                tool.output_schema = REPORT_SCHEMA
        return listed


server = Declaring("outputs")


def ran(tool: str) -> None:
    with LEDGER.open("a", encoding="utf-8") as ledger:
        ledger.write(f"{tool} ran\n")


@server.tool()
def report() -> CallToolResult:
    """Counts the rows; answers text only."""
    ran("report")
    return CallToolResult(content=[TextContent(type="text", text=REPORT_TEXT)])


@server.tool()
def wrong_report() -> CallToolResult:
    """Counts the rows; its structured content has the total as a string."""
    ran("wrong_report")
    return CallToolResult(content=[TextContent(type="text", text=REPORT_TEXT)], structured_content={"total": "42"})


@server.tool(annotations=ToolAnnotations(read_only_hint=False, destructive_hint=False, idempotent_hint=True))
def crash_once() -> str:
    """Synchronise; the first call kills the server before answering."""
    marker = LEDGER.with_name(LEDGER.name + ".crashed")
    if not marker.exists():
        marker.write_text("crashed once\n", encoding="utf-8")
        sys.stderr.write("outputs: crash_once dies mid-call\n")
        sys.stderr.flush()
        os._exit(3)
    ran("crash_once")
    return "recovered"


if __name__ == "__main__":
    server.run()
