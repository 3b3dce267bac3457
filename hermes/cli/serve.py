"""``hermes serve`` (the HTTP API, :mod:`hermes.api`) and ``hermes keys add`` (its keys).

``hermes serve`` connects to the configured Temporal and Redis (``TEMPORAL_ADDRESS``,
``REDIS_URL``; unset: the embedded ones of ``hermes dev``) on the first request that
needs them, so it starts, and answers ``/health`` with 503, while they are down.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated

import typer

from hermes.cli.errors import EXIT_REFUSED, EXIT_UNAVAILABLE, fail, failing_on
from hermes.cli.output import err_console, out
from hermes.cli.root import HermesTyper, app
from hermes.cli.running import load_settings, run_command
from hermes.errors import ConfigError

__all__ = ["keys_add", "serve"]

keys_app = HermesTyper(help="API keys of `hermes serve` (HERMES_API_KEYS_FILE, default .hermes/api_keys.yaml).", no_args_is_help=True)
app.add_typer(keys_app, name="keys")

KeysFileOption = Annotated[
    Path | None,
    typer.Option("--keys-file", "--file", "-f", help="The key file (default: HERMES_API_KEYS_FILE, else <data dir>/api_keys.yaml)."),
]

_STOP_SECONDS = 10


@app.command()
def serve(
    host: Annotated[str, typer.Option("--host", help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", min=0, max=65535, help="Port to listen on (0: any free one).")] = 8080,
    keys_file: KeysFileOption = None,
) -> None:
    """Serve the HTTP API (sessions, messages, approvals, transcript, memory; OpenAPI at
    /openapi.json) until Ctrl-C. Requests need `Authorization: Bearer <key>` with a key
    from `hermes keys add`."""
    import uvicorn

    from hermes.api import KeyRing, create_app
    from hermes.api.serving import uvicorn_config

    settings = load_settings()
    if keys_file is not None:
        settings = settings.model_copy(update={"api_keys_file": keys_file})
    with failing_on(ConfigError, code=EXIT_UNAVAILABLE):
        keys = KeyRing(settings.resolved_api_keys_file)
        api = create_app(settings, keys=keys)

    class Server(uvicorn.Server):
        """Leaves SIGINT/SIGTERM to :func:`run_command`, which cancels the main task."""

        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            yield

    async def main() -> None:
        config = uvicorn_config(api, settings, host=host, port=port, log_config=None, timeout_graceful_shutdown=_STOP_SECONDS)
        server = Server(config)
        task = asyncio.create_task(server.serve())
        while not server.started:
            if task.done():
                task.result()
                raise fail(f"cannot listen on {host}:{port}", EXIT_UNAVAILABLE)
            await asyncio.sleep(0.05)
        bound = server.servers[0].sockets[0].getsockname()[1] if server.servers else port
        out.print(f"Hermes API on http://{host}:{bound} (OpenAPI: /openapi.json)")
        out.print(f"Temporal {settings.resolved_temporal_address}, Redis {settings.resolved_redis_url}", style="dim")
        if settings.resolved_temporal_ui_url is None:
            out.print("no Temporal Web UI link in the web chat: set HERMES_TEMPORAL_UI_URL to the Web UI of "
                      f"{settings.resolved_temporal_address} (e.g. http://temporal-ui.internal:8080)", style="dim")
        if len(keys) == 0:
            err_console.print(f"warning: no API keys in {keys.path}: add one with `hermes keys add --user USER`", style="yellow")
        else:
            out.print(f"{len(keys)} API key(s) from {keys.path}", style="dim")
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            server.should_exit = True
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await asyncio.wait_for(task, _STOP_SECONDS * 2)
            # Ctrl-C / SIGTERM is the normal stop of a server: exit 0.

    run_command(main, settings)


@keys_app.command("add")
def keys_add(
    user: Annotated[str, typer.Option("--user", "-u", help="The user id the key acts as.")],
    role: Annotated[
        list[str] | None,
        typer.Option("--role", "-r", help="user, approver or admin (repeatable; default: user)."),
    ] = None,
    label: Annotated[str, typer.Option("--label", help="A note for the operator: who holds the key, what for.")] = "",
    keys_file: KeysFileOption = None,
) -> None:
    """Make a random API key for USER, print it once (it is stored nowhere) and add its
    SHA-256 to the key file. A running `hermes serve` takes it at once."""
    from pydantic import ValidationError

    from hermes.api import add_key

    settings = load_settings()
    path = keys_file or settings.resolved_api_keys_file
    roles = role or ["user"]
    unknown = sorted(set(roles) - {"user", "approver", "admin"})
    if unknown:
        raise fail(f"unknown role(s) {', '.join(unknown)}: use user, approver or admin", EXIT_REFUSED)
    try:
        key = add_key(path, user, roles, label=label)  # type: ignore[arg-type]
    except ValidationError as err:
        raise fail(f"key refused: {err.errors()[0]['msg']}", EXIT_REFUSED) from None
    except ConfigError as err:
        raise fail(str(err), EXIT_UNAVAILABLE) from None
    except OSError as err:
        raise fail(f"cannot write {path}: {err}", EXIT_UNAVAILABLE) from None
    typer.echo(key)
    err_console.print(f"added a key for {user} ({', '.join(roles)}) to {path}; it is shown only this once", style="dim")
