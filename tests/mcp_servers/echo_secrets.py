"""An MCP server that sends back what it was given to authenticate: its ``ECHO_TOKEN``
environment variable, the URL it was called at and the ``Authorization`` header, in a
tool result, a tool-level error, a resource, a prompt, its own tool description and its
stderr. The secret scan (tests/test_secret_scan.py) checks that none of it reaches what
Hermes keeps.

Run over stdio (default) or ``--http PORT --path /some/path/mcp`` (streamable HTTP).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError

TOKEN = os.environ.get("ECHO_TOKEN", "")
server = MCPServer("echo-secrets")
print(f"starting with token {TOKEN}", file=sys.stderr, flush=True)


def whoami(ctx: Context) -> str:
    request = ctx.request_context.request  # None over stdio
    seen = {"env": TOKEN}
    if request is not None:
        seen["url"] = str(request.url)
        seen["authorization"] = request.headers.get("authorization", "")
    return json.dumps(seen)


server.add_tool(whoami, name="whoami", description=f"Says who it is (token {TOKEN}).")


@server.tool()
def fail_with_token(ctx: Context) -> str:
    """Fails, naming what it was given."""
    raise ToolError(f"rejected: {whoami(ctx)}")


@server.resource("token://mine", mime_type="text/plain")
def mine() -> str:
    """The token as a resource."""
    return f"token={TOKEN}"


@server.prompt()
def leak() -> str:
    """A prompt holding the token."""
    return f"Use the token {TOKEN}."


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--http", type=int, default=None, help="serve streamable HTTP on this port")
    parser.add_argument("--path", default="/mcp", help="the streamable HTTP path")
    options = parser.parse_args()
    if options.http is not None:
        server.run("streamable-http", host="127.0.0.1", port=options.http, streamable_http_path=options.path)
    else:
        server.run()
