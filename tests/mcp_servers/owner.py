"""A stand-in worker: owns an ``McpManager`` with one stdio server, then waits to be killed.

argv[1]: the MCP config as JSON. Starts the server named ``stubborn`` by calling its
``grandchild`` tool, prints one JSON line ``{"group", "pid", "grandchild"}`` and sleeps
until killed (the test sends SIGKILL, so no cleanup code of ours runs).
"""

from __future__ import annotations

import asyncio
import json
import sys

from hermes.mcp.config import parse_mcp_config
from hermes.mcp.manager import McpManager


async def main() -> None:
    manager = McpManager(parse_mcp_config(json.loads(sys.argv[1])))
    result = await manager.call_tool("stubborn", "grandchild", {})
    status = next(s for s in manager.status() if s.name == "stubborn")
    grandchild = int(result.content[0].text)
    print(json.dumps({"group": status.process_group, "pid": status.pid, "grandchild": grandchild}), flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main())
