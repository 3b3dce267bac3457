"""An MCP server that ignores SIGTERM and spawns a grandchild that ignores SIGTERM too.

The grandchild's pid is in the ``grandchild`` tool's answer; it sleeps forever.
"""

from __future__ import annotations

import signal
import subprocess
import sys

from mcp.server.mcpserver import MCPServer

signal.signal(signal.SIGTERM, signal.SIG_IGN)
_GRANDCHILD = subprocess.Popen(
    [sys.executable, "-c", "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nwhile True: time.sleep(3600)"],
    stdin=subprocess.DEVNULL,
    stdout=subprocess.DEVNULL,
)
server = MCPServer("stubborn")


@server.tool()
def grandchild() -> str:
    """The pid of the grandchild process."""
    return str(_GRANDCHILD.pid)


if __name__ == "__main__":
    server.run()
