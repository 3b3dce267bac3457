"""``hermes encryption-key`` and ``hermes command-key``: new keys for encrypting payloads at
rest (issue 17) and for proving who sent a command to a session (issue 26)."""

from __future__ import annotations

from typing import Annotated

import typer

from hermes.cli.errors import EXIT_REFUSED, fail
from hermes.cli.root import app
from hermes.cli.output import err_console

__all__ = ["command_key", "encryption_key"]


@app.command("encryption-key")
def encryption_key(
    key_id: Annotated[
        str, typer.Option("--id", help="The key's id, stored beside every payload it encrypts (letters, digits, . _ -).")
    ] = "k1",
) -> None:
    """Print a new random 256-bit key as `<id>:<base64>`, for HERMES_ENCRYPTION_KEYS (or, with
    a space for the colon, a line of HERMES_ENCRYPTION_KEY_FILE). The first key listed
    encrypts; keep older keys after it while sessions written with them live."""
    _print_key(key_id, "Put it first in HERMES_ENCRYPTION_KEYS on every client, worker and codec server")


@app.command("command-key")
def command_key(
    key_id: Annotated[
        str, typer.Option("--id", help="The key's id, named in every proof it makes (letters, digits, . _ -).")
    ] = "c1",
) -> None:
    """Print a new random 256-bit command key as `<id>:<base64>`, for HERMES_COMMAND_KEYS (or,
    with a space for the colon, a line of HERMES_COMMAND_KEY_FILE): the key that proves to a
    session who sent each command. The first key listed signs; keep older keys after it
    while sessions with commands signed by them are open."""
    _print_key(key_id, "Put it first in HERMES_COMMAND_KEYS on every worker, API server and client")


def _print_key(key_id: str, where: str) -> None:
    """Print ``<key_id>:<new 32-byte key>`` on stdout and where to put it on stderr; a bad
    id exits 1."""
    from hermes.security.keyfiles import KEY_ID_RE, new_key

    if not KEY_ID_RE.match(key_id):
        raise fail(f"--id {key_id!r}: expected 1-64 letters, digits, '.', '_' or '-'", EXIT_REFUSED)
    typer.echo(f"{key_id}:{new_key()}")
    err_console.print(f"{where}; it is shown only this once.", style="dim")
