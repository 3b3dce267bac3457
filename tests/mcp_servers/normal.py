"""A well-behaved MCP server: echo, a failing tool, a growing tool list, a resource, a prompt.

Run over stdio (default), ``--http PORT`` (streamable HTTP at ``/mcp`` on 127.0.0.1) or
``--sse PORT`` (the older SSE transport at ``/sse``).
"""

from __future__ import annotations

import argparse
import os
import sys

from mcp.server.mcpserver import Context, MCPServer

server = MCPServer("normal")
_grown = 0


@server.tool()
def echo(text: str) -> str:
    """Return ``text`` unchanged."""
    return text


@server.tool()
def pid() -> str:
    """This server's process id."""
    return str(os.getpid())


@server.tool()
def fail(reason: str) -> str:
    """Always fails (a tool-level error, reported as ``is_error``)."""
    raise ValueError(f"failed on purpose: {reason}")


@server.tool()
def shout(kilobytes: int) -> str:
    """Write ``kilobytes`` KiB to stderr (more than a pipe buffer holds), then answer."""
    chunk = "x" * 1023 + "\n"
    for _ in range(kilobytes):
        sys.stderr.write(chunk)
    sys.stderr.flush()
    return "shouted"


@server.tool()
async def grow(ctx: Context) -> str:
    """Add a tool named ``extra_<n>`` and tell the client the tool list changed."""
    global _grown
    _grown += 1
    name = f"extra_{_grown}"

    def extra() -> str:
        return name

    server.add_tool(extra, name=name, description="added at run time")
    await ctx.session.send_tool_list_changed()
    return name


@server.resource("note://greeting", mime_type="text/plain")
def greeting() -> str:
    """A fixed note."""
    return "hello from a resource ✓"


@server.prompt()
def greet(name: str) -> str:
    """A prompt greeting ``name``."""
    return f"Say hello to {name}."


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--http", type=int, default=None, help="serve streamable HTTP on this port")
    parser.add_argument("--sse", type=int, default=None, help="serve the older SSE transport on this port")
    options = parser.parse_args()
    if options.http is not None:
        server.run("streamable-http", host="127.0.0.1", port=options.http)
    elif options.sse is not None:
        server.run("sse", host="127.0.0.1", port=options.sse)
    else:
        server.run()
