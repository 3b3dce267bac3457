"""``hermes tools``: the tools a worker started with these settings would serve."""

from __future__ import annotations

import json

import typer
from rich.markup import escape

from hermes.cli.errors import EXIT_UNAVAILABLE, failing_on
from hermes.cli.output import print_table
from hermes.cli.root import JsonOption, app
from hermes.cli.running import load_settings
from hermes.errors import HermesError

__all__ = ["tools_command"]


@app.command("tools")
def tools_command(as_json: JsonOption = False) -> None:
    """List the tools a worker started with these settings would serve (built-ins,
    HERMES_TOOL_MODULES, HERMES_TOOL_FILES), with tier, idempotency and permission."""
    from worker import load_registry

    settings = load_settings()
    with failing_on(HermesError, code=EXIT_UNAVAILABLE):
        registry = load_registry(settings)
    specs = [t.spec(tier_seconds=settings.tier_seconds, heartbeat_timeout_seconds=settings.tool_heartbeat_seconds) for t in registry]
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
                spec.idempotency or "",
                spec.permission,
                escape(spec.description.splitlines()[0][:100]),
            )
            for spec in specs
        ),
        title="tools",
    )
