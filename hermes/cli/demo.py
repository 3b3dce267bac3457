"""``hermes demo``: the offline demo (:mod:`hermes.cli.offline_demo`), the one module that imports it."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from hermes.cli.errors import EXIT_REFUSED, CliError
from hermes.cli.output import out
from hermes.cli.root import app
from hermes.cli.running import load_settings, run_command

if TYPE_CHECKING:
    from hermes.cli.offline_demo import DemoSummary
    from hermes.settings import Settings

__all__ = ["demo"]


@app.command()
def demo(
    keep: Annotated[
        bool | None,
        typer.Option(
            "--keep/--no-keep",
            help="Keep the stack and worker running until Ctrl-C, so the Web UI link works. "
            "Default: keep when run in a terminal, stop when not (CI, scripts).",
        ),
    ] = None,
) -> None:
    """Play a checked multi-turn conversation on the embedded stack, offline, no API key.

    Uses the packaged scripted model (a stand-in that understands nothing); exits
    non-zero if any reply or tool result is not the expected one.
    """
    if keep is None:
        keep = sys.stdin.isatty() and sys.stdout.isatty()
    settings = load_settings()
    run_command(lambda: _checked_demo(settings, keep), settings, log_file=Path(settings.data_dir) / "hermes.log")


async def _checked_demo(settings: Settings, keep: bool) -> DemoSummary:
    """:func:`hermes.cli.offline_demo.run_demo`, with a failed check as a refusal (exit 1)."""
    from hermes.cli.offline_demo import DemoFailed, run_demo

    try:
        return await run_demo(settings, console=out, keep=keep)
    except DemoFailed as err:
        raise CliError(f"demo failed: {err}", EXIT_REFUSED) from err
