"""An MCP server whose ``crash`` tool kills the process in the middle of the call."""

from __future__ import annotations

import os
import sys

from mcp.server.mcpserver import MCPServer

server = MCPServer("crashy")


@server.tool()
def ok() -> str:
    """Answers normally."""
    return "ok"


@server.tool()
def crash() -> str:
    """Exits the whole server (code 3) before answering."""
    sys.stderr.write("crashy: about to die mid-call\n")
    sys.stderr.flush()
    os._exit(3)


if __name__ == "__main__":
    server.run()
