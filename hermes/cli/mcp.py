"""``hermes mcp``: the MCP servers of HERMES_MCP_CONFIG; list them, call a tool once."""

from __future__ import annotations

import asyncio
import json
import logging
import os
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape

from hermes.cli.errors import EXIT_REFUSED, EXIT_UNAVAILABLE, fail, failing_on
from hermes.cli.output import print_table
from hermes.cli.root import HermesTyper, JsonOption, app
from hermes.cli.running import load_settings
from hermes.errors import HermesError

if TYPE_CHECKING:
    from hermes.settings import Settings

__all__ = ["mcp_app", "mcp_call", "mcp_list"]

mcp_app = HermesTyper(help="MCP servers of HERMES_MCP_CONFIG: list them, call a tool.", no_args_is_help=True)
app.add_typer(mcp_app, name="mcp")


def _mcp_config(settings: Settings) -> Any:
    """The loaded MCP configuration; a clear exit (2) when it is missing or wrong."""
    from hermes.mcp.config import load_mcp_config

    # The manager's warnings are for a worker's log; here the command reports what failed.
    logging.getLogger("hermes.mcp").setLevel(logging.ERROR)

    if settings.mcp_config is None:
        raise fail("no MCP configuration: set HERMES_MCP_CONFIG to an mcpServers JSON/YAML file", EXIT_UNAVAILABLE)
    with failing_on(HermesError, code=EXIT_UNAVAILABLE):
        return load_mcp_config(settings.mcp_config, environ=os.environ)


@mcp_app.command("list")
def mcp_list(as_json: JsonOption = False) -> None:
    """Start each configured server, list its tools (after allow/deny) and its status."""
    from hermes.mcp.manager import McpManager

    settings = load_settings()
    config = _mcp_config(settings)

    async def main() -> list[dict[str, Any]]:
        rows = []
        async with McpManager(config, environ=os.environ) as manager:
            for name, server in config.servers.items():
                tools: list[str] = []
                error = None
                if server.enabled:
                    try:
                        tools = [t.name for t in await manager.list_tools(name)]
                    except Exception as err:  # noqa: BLE001 - reported per server
                        error = str(err)
                status = next((s for s in manager.status() if s.name == name), None)
                rows.append(
                    {
                        "server": name,
                        "transport": server.transport,
                        "enabled": server.enabled,
                        "state": status.state if status else "disabled",
                        "tools": tools,
                        "error": error or (status.last_error if status else None),
                    }
                )
        return rows

    rows = asyncio.run(main())
    if as_json:
        typer.echo(json.dumps(rows, ensure_ascii=False, indent=2))
    else:
        print_table(
            ("server", "transport", "state", "tools", "error"),
            (
                (
                    escape(row["server"]), row["transport"], row["state"] if row["enabled"] else "disabled",
                    escape(", ".join(row["tools"])), escape(row["error"] or ""),
                )
                for row in rows
            ),
            title=f"MCP servers ({settings.mcp_config})",
        )
    if any(row["error"] for row in rows):
        raise typer.Exit(EXIT_REFUSED)


@mcp_app.command("call")
def mcp_call(
    server: Annotated[str, typer.Argument(help="Server name in the config.")],
    tool: Annotated[str, typer.Argument(help="The tool's own name on that server.")],
    arguments: Annotated[str, typer.Argument(help="Arguments as a JSON object.")] = "{}",
) -> None:
    """Call one tool once, outside any session, and print the result as Hermes would
    give it to the model ({code, message, data}); exit 1 unless code is 0."""
    from hermes.mcp.manager import McpManager
    from hermes.mcp.output import output_mismatch
    from hermes.mcp.tools import call_result

    settings = load_settings()
    config = _mcp_config(settings)
    try:
        parsed = json.loads(arguments)
    except ValueError as err:
        raise fail(f"ARGUMENTS: expected a JSON object, received {arguments[:200]!r} ({err})", EXIT_REFUSED) from None
    if not isinstance(parsed, dict):
        raise fail(f"ARGUMENTS: expected a JSON object, received {arguments[:200]!r}", EXIT_REFUSED)
    if server not in config.servers:
        raise fail(f"no MCP server {server!r} in {settings.mcp_config}; configured: {', '.join(config.servers)}", EXIT_REFUSED)

    async def main() -> Any:
        async with McpManager(config, environ=os.environ) as manager:
            # The listed output schema, so an answer off it gets the model's warning too.
            listed = next((t for t in await manager.list_tools(server) if t.name == tool), None)
            result = await manager.call_tool(server, tool, parsed)
            return call_result(result, warning=output_mismatch(getattr(listed, "output_schema", None), result))

    with failing_on(HermesError, code=EXIT_UNAVAILABLE):
        result = asyncio.run(main())
    typer.echo(result.model_dump_json(indent=2))
    if result.code != 0:
        raise typer.Exit(EXIT_REFUSED)
