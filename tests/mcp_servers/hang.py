"""An MCP server whose ``hang`` tool blocks the whole process (no ping answered either)."""

from __future__ import annotations

import time

from mcp.server.mcpserver import MCPServer

server = MCPServer("hang")


@server.tool()
def ok() -> str:
    """Answers normally."""
    return "ok"


@server.tool()
async def hang() -> str:
    """Never returns; blocks the event loop (a sync sleep in an async tool), so the server
    stops answering anything, pings included."""
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    server.run()
