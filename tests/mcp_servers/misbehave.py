"""An MCP server that misbehaves the way public bug reports describe, for the failure tests.

Tools: ``echo``, ``pid`` and ``block`` (never answers; the test kills the process during
the call). Options (any combination):

- ``--http PORT`` / ``--sse PORT``: serve streamable HTTP at ``/mcp`` or the older SSE
  transport at ``/sse`` on 127.0.0.1 (default: stdio).
- ``--paginate-forever``: ``tools/list``, ``resources/list`` and ``prompts/list`` answer
  the same page with the same ``nextCursor`` every time, however often they are asked.
- ``--paginate-endless``: ``tools/list`` answers page ``n`` with one new tool,
  ``generated_<n>``, and the cursor of page ``n + 1``, without end.
- ``--count-file PATH``: append one line per list request (its method) to ``PATH``, so
  a test can count the requests the client sent.
- ``--refuse STATUS`` (HTTP only): answer every POST carrying a JSON-RPC request whose
  method is ``--refuse-method`` (default ``tools/call``; ``*`` for every request, the
  handshake included) with ``STATUS`` and ``--refuse-body`` (default a short JSON object)
  as ``--refuse-type`` (default ``application/json``), as an auth proxy or gateway does.
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

import anyio
import normal  # tests/mcp_servers/normal.py, beside this script (its server is not run)
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.prompts import Prompt
from mcp_types import ListPromptsResult, ListResourcesResult, ListToolsResult, Tool


class Misbehaving(MCPServer):
    paginate_forever = False
    paginate_endless = False
    count_file: str | None = None

    def _page(self, method: str, result: Any) -> Any:
        """Count the request; under ``--paginate-forever``, point to a next page that is
        this one again."""
        if self.count_file:
            with open(self.count_file, "a", encoding="utf-8") as f:
                f.write(method + "\n")
        if self.paginate_forever:
            result.next_cursor = "page-2"
        return result

    async def _handle_list_tools(self, ctx: Any, params: Any) -> ListToolsResult:
        if self.paginate_endless:
            page = int(params.cursor) if params is not None and params.cursor else 1
            tool = Tool(name=f"generated_{page}", input_schema={"type": "object"})
            return self._page("tools/list", ListToolsResult(tools=[tool], next_cursor=str(page + 1)))
        return self._page("tools/list", await super()._handle_list_tools(ctx, params))

    async def _handle_list_resources(self, ctx: Any, params: Any) -> ListResourcesResult:
        return self._page("resources/list", await super()._handle_list_resources(ctx, params))

    async def _handle_list_prompts(self, ctx: Any, params: Any) -> ListPromptsResult:
        return self._page("prompts/list", await super()._handle_list_prompts(ctx, params))


server = Misbehaving("misbehave")
# The well-behaved tools, resource and prompt are normal.py's own.
server.add_tool(normal.echo)
server.add_tool(normal.pid)
server.add_prompt(Prompt.from_function(normal.greet))


@server.tool()
async def block() -> str:
    """Never answers (the process is meant to be killed meanwhile)."""
    await anyio.sleep_forever()
    return "unreachable"


@server.resource("note://one", mime_type="text/plain")
def note() -> str:
    """A fixed note."""
    return "one"


def refusing(app: Any, status: int, method: str, body: bytes, content_type: str) -> Any:
    """``app`` behind a gate that answers matching JSON-RPC requests with ``status``."""

    async def gate(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            await app(scope, receive, send)
            return
        chunks = []
        while True:
            message = await receive()
            chunks.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        raw = b"".join(chunks)
        try:
            sent = json.loads(raw)
        except ValueError:
            sent = None
        if isinstance(sent, dict) and "id" in sent and (method == "*" or sent.get("method") == method):
            await send(
                {
                    "type": "http.response.start",
                    "status": status,
                    "headers": [(b"content-type", content_type.encode()), (b"content-length", str(len(body)).encode())],
                }
            )
            await send({"type": "http.response.body", "body": body})
            return
        replayed = False

        async def replay() -> dict[str, Any]:
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": raw, "more_body": False}

        await app(scope, replay, send)

    return gate


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--http", type=int, default=None)
    parser.add_argument("--sse", type=int, default=None)
    parser.add_argument("--paginate-forever", action="store_true")
    parser.add_argument("--paginate-endless", action="store_true")
    parser.add_argument("--count-file", default=None)
    parser.add_argument("--refuse", type=int, default=None)
    parser.add_argument("--refuse-method", default="tools/call")
    parser.add_argument("--refuse-body", default='{"error": "insufficient_scope", "error_description": "token lacks tools:call"}')
    parser.add_argument("--refuse-type", default="application/json")
    options = parser.parse_args()
    server.paginate_forever = options.paginate_forever
    server.paginate_endless = options.paginate_endless
    server.count_file = options.count_file
    if options.http is None and options.sse is None:
        server.run()
    else:
        import uvicorn

        if options.http is not None:
            app, port = server.streamable_http_app(), options.http
        else:
            app, port = server.sse_app(), options.sse
        if options.refuse is not None:
            app = refusing(app, options.refuse, options.refuse_method, options.refuse_body.encode(), options.refuse_type)
        uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")
