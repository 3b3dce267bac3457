"""``hermes tools``: the tools a worker started with these settings would serve."""

from __future__ import annotations

import asyncio
import json
import re
from typing import TYPE_CHECKING

import typer
from rich.markup import escape

from hermes.cli.errors import EXIT_UNAVAILABLE, failing_on
from hermes.cli.output import print_table
from hermes.cli.root import JsonOption, app
from hermes.cli.running import load_settings
from hermes.errors import HermesError

if TYPE_CHECKING:
    from hermes.settings import Settings
    from hermes.tools.registry import Tool, ToolRegistry

__all__ = ["description_summary", "tools_command", "with_source"]

DESCRIPTION_CHARS = 160
"""The longest description ``hermes tools`` shows in its table (``--json`` has them whole)."""


def description_summary(description: str, limit: int = DESCRIPTION_CHARS) -> str:
    """The start of a tool description for one table cell, never cut mid-word.

    Takes the first paragraph (docstring line breaks joined), then as many whole sentences
    as fit in ``limit`` characters; when not even the first sentence fits, it is cut at a
    word end and ends with "…".

    Args:
        description: the tool's description (a docstring, several lines).
        limit: the most characters returned, the ellipsis included.

    Returns:
        One line of at most ``limit`` characters ("" for an empty description).
    """
    paragraph = " ".join(re.split(r"\n\s*\n", description.strip(), maxsplit=1)[0].split())
    if len(paragraph) <= limit:
        return paragraph
    sentences = re.findall(r".+?(?:[.!?。！？](?=\s|$)|$)\s*", paragraph)
    kept = ""
    for sentence in sentences:
        if len(kept + sentence.rstrip()) > limit:
            break
        kept += sentence
    if kept.strip():
        return kept.strip()
    cut = paragraph[: limit - 1]
    if " " in cut:
        cut = cut.rsplit(" ", 1)[0]
    return cut.rstrip(" ,;:") + "…"


def with_source(value: str, source: str | None) -> str:
    """A permission or idempotency for a table cell, with what set it when known
    (MCP tools: ``write (annotation)``; Hermes' own tools: the bare value)."""
    return f"{value} ({source})" if source else value


async def _mcp_tools(settings: Settings, registry: ToolRegistry) -> list[Tool]:
    """The MCP tools a worker would offer now: each configured server started, listed,
    then stopped (a server that cannot list in time is left out, with a warning)."""
    from worker import open_mcp

    toolset = open_mcp(settings, registry)
    if toolset is None:
        return []
    try:
        return list(await toolset.discover())
    finally:
        await toolset.manager.aclose()


@app.command("tools")
def tools_command(as_json: JsonOption = False) -> None:
    """List the tools a worker started with these settings would serve (built-ins,
    HERMES_TOOL_MODULES, HERMES_TOOL_FILES, and the MCP servers of HERMES_MCP_CONFIG,
    started to be listed), with tier, idempotency and permission; for an MCP tool, what
    set each of the last two: ``config``, ``annotation`` or ``default``."""
    from worker import load_registry

    settings = load_settings()
    with failing_on(HermesError, code=EXIT_UNAVAILABLE):
        registry = load_registry(settings)
        tools = [*registry, *asyncio.run(_mcp_tools(settings, registry))]
    specs = [t.spec(tier_seconds=settings.tier_seconds, heartbeat_timeout_seconds=settings.tool_heartbeat_seconds) for t in tools]
    if as_json:
        typer.echo(json.dumps([s.model_dump(mode="json", exclude_none=True) for s in specs], ensure_ascii=False, indent=2))
        return
    print_table(
        ("name", "group", "tier", "timeout s", "idempotency", "permission", "description"),
        (
            (
                escape(spec.name),
                escape(spec.group or "-"),
                spec.tier,
                f"{spec.timeout_seconds:g}",
                with_source(spec.idempotency or "", spec.idempotency_source),
                with_source(spec.permission, spec.permission_source),
                escape(description_summary(spec.description)),
            )
            for spec in specs
        ),
        title="tools",
    )
