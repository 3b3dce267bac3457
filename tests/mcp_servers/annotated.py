"""An MCP server whose tools carry annotations (MCP ``ToolAnnotations``), for
``tests/test_mcp_annotations.py``.

- ``delete_all``: ``destructiveHint: true``; appends a line to the file ``argv[1]`` (the
  test reads it to see whether the tool ran).
- ``count``: ``readOnlyHint: true``; how many lines that file has.
- ``flaky_sync``: ``idempotentHint: true`` (not read-only, not destructive); its first call
  (no ``<file>.flaky`` yet) creates that marker and then hangs, so the client's timeout
  ends it; a later call answers at once.
- ``plain``: no annotations.
"""

from __future__ import annotations

import sys
from pathlib import Path

import anyio
from mcp.server.mcpserver import MCPServer
from mcp_types import ToolAnnotations

LEDGER = Path(sys.argv[1])
server = MCPServer("annotated")


@server.tool(annotations=ToolAnnotations(destructive_hint=True, read_only_hint=False))
def delete_all(scope: str) -> str:
    """Delete everything in ``scope``."""
    with LEDGER.open("a", encoding="utf-8") as ledger:
        ledger.write(f"deleted {scope}\n")
    return f"deleted {scope}"


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
def count() -> str:
    """How many deletions the ledger holds."""
    return str(len(LEDGER.read_text(encoding="utf-8").splitlines()) if LEDGER.exists() else 0)


@server.tool(annotations=ToolAnnotations(read_only_hint=False, destructive_hint=False, idempotent_hint=True))
async def flaky_sync() -> str:
    """Synchronise; the first call hangs (the client times it out), later ones answer."""
    marker = LEDGER.with_name(LEDGER.name + ".flaky")
    if not marker.exists():
        marker.write_text("hung once\n", encoding="utf-8")
        await anyio.sleep_forever()
    return "synced"


@server.tool()
def plain() -> str:
    """A tool with no annotations."""
    return "plain"


if __name__ == "__main__":
    server.run()
