"""An MCP server that takes ``argv[1]`` seconds (default 2) before it reads its input, like a
server importing a heavy SDK or ``npx -y`` fetching a package on a loaded machine."""

from __future__ import annotations

import sys
import time

from mcp.server.mcpserver import MCPServer

server = MCPServer("slow-start")


@server.tool()
def ok() -> str:
    """Answers normally."""
    return "ok"


if __name__ == "__main__":
    time.sleep(float(sys.argv[1]) if len(sys.argv) > 1 else 2.0)
    server.run()
