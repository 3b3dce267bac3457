"""Commands that run servers: ``hermes dev``, ``worker``, ``codec-server`` (``demo`` is in :mod:`hermes.cli.demo`).

``hermes dev``, ``hermes worker``, ``hermes codec-server`` and ``hermes demo --keep``
run until Ctrl-C / SIGTERM, which is their normal stop (exit 0). ``hermes dev
--no-worker`` runs the servers alone and prints the ``export`` lines that point
separately started ``hermes worker`` processes and clients at them; each ``hermes
worker`` prints what it serves (:func:`describe_worker`, no secrets).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.text import Text

from hermes.cli.errors import EXIT_UNAVAILABLE, CliError, fail, hide_password
from hermes.cli.output import out, print_fields
from hermes.cli.root import app
from hermes.cli.running import load_settings, run_command

if TYPE_CHECKING:
    from hermes.settings import Settings

__all__ = ["codec_server_command", "describe_worker", "dev", "worker_command", "worker_env"]

log = logging.getLogger("hermes.cli")


def _describe_model(settings: Settings, provider: Any) -> str:
    if getattr(provider, "name", "") == "scripted":
        return f"scripted stand-in ({getattr(provider, 'source', 'script')})"
    base = settings.openai_base_url or "api.openai.com"
    return f"{settings.model} via {base}"


# --------------------------------------------------------------------------- dev / worker / demo


DEV_PORTS = {
    "temporal_port": ("the embedded Temporal server's gRPC frontend", 7233),
    "ui_port": ("the embedded Temporal Web UI", 8233),
    "redis_port": ("the embedded Redis", 6379),
    "codec_port": ("the codec server", 8081),
}
"""The port settings (:class:`hermes.settings.Settings`, each ``HERMES_<NAME>``) ``hermes
dev`` takes as options: what listens there, and the setting's default (for the help,
which does not load the settings; tests/test_cli_options.py checks they agree)."""


def _port_option(setting: str) -> Any:
    """The ``hermes dev`` option of port setting ``setting`` (``--temporal-port`` for ``temporal_port``)."""
    what, default = DEV_PORTS[setting]
    flag = "--" + setting.replace("_", "-")
    return typer.Option(flag, min=1, max=65535, help=f"Port of {what} (default: $HERMES_{setting.upper()}, else {default}).")


@app.command()
def dev(
    no_worker: Annotated[
        bool,
        typer.Option(
            "--no-worker",
            help="Run only the servers and print the environment that points `hermes worker` "
            "processes and clients at them; run the workers yourself, in other terminals.",
        ),
    ] = False,
    temporal_port: Annotated[int | None, _port_option("temporal_port")] = None,
    ui_port: Annotated[int | None, _port_option("ui_port")] = None,
    redis_port: Annotated[int | None, _port_option("redis_port")] = None,
    codec_port: Annotated[int | None, _port_option("codec_port")] = None,
) -> None:
    """Run the embedded Temporal server (with Web UI), Redis and a worker until Ctrl-C.

    With TEMPORAL_ADDRESS / REDIS_URL set, those servers are used instead of starting them.
    Data stays in HERMES_DATA_DIR (default .hermes/). A port option wins over its
    HERMES_*_PORT variable.
    """
    given = {"temporal_port": temporal_port, "ui_port": ui_port, "redis_port": redis_port, "codec_port": codec_port}
    settings = load_settings().model_copy(update={k: v for k, v in given.items() if v is not None})
    if no_worker:
        if settings.temporal_address is not None and settings.redis_url is not None:
            raise fail(
                "hermes dev --no-worker has nothing to run: TEMPORAL_ADDRESS and REDIS_URL are set, so no "
                "server is started; run `hermes worker` against them",
                EXIT_UNAVAILABLE,
            )
        run_command(lambda: _dev_servers_only(settings), settings)
        return
    run_command(lambda: _dev(settings), settings, log_file=Path(settings.data_dir) / "hermes.log")


async def _dev(settings: Settings) -> None:
    from hermes.memory.location import check_memory_location
    from hermes.providers import make_provider
    from worker import load_registry, open_mcp

    # Configuration mistakes fail before anything is started.
    check_memory_location(settings)
    provider = make_provider(settings)
    registry = load_registry(settings)
    mcp = open_mcp(settings, registry)
    try:
        await _dev_with(settings, provider, registry, mcp)
    finally:
        if mcp is not None:
            await mcp.manager.aclose()  # every MCP server process (tree) goes with the worker


async def _dev_with(settings: Settings, provider: Any, registry: Any, mcp: Any) -> None:
    from hermes import names
    from hermes.infra.local_servers import local_servers
    from hermes.infra import cpu_pool
    from hermes.infra.process import wait_until_interrupted
    from hermes.infra.stack import ensure_search_attributes
    from hermes.security.codec_server import endpoint_url
    from worker import build_worker, connect_client, connect_redis

    codec_url = endpoint_url("127.0.0.1", settings.codec_port)
    async with local_servers(settings, ui=True, ui_codec_endpoint=codec_url) as servers:
        resolved = settings.model_copy(
            update={"temporal_address": servers.temporal_address, "redis_url": servers.redis_url}
        )
        client = await connect_client(resolved)
        await ensure_search_attributes(client, names.SEARCH_ATTRIBUTES, resolved.temporal_namespace)
        redis = connect_redis(servers.redis_url, settings)
        try:
            await redis.ping()
            worker = build_worker(client, resolved, provider=provider, registry=registry, redis=redis, mcp=mcp)
            if resolved.memory_enabled:
                from hermes.memory.service import ensure_consolidation_schedule

                await ensure_consolidation_schedule(client, resolved)
            async with worker, _dev_codec_server(settings, redis) as codec:
                _print_dev_banner(settings, servers, _describe_model(settings, provider), codec)
                await wait_until_interrupted()
                out.print("Stopping the worker" + (" and the embedded stack..." if servers.stack else "..."))
        finally:
            await redis.aclose()
            await asyncio.to_thread(cpu_pool.shutdown_shared)  # the worker's CPU pool children
    out.print("Stopped.")


async def _dev_servers_only(settings: Settings) -> None:
    from hermes import names
    from hermes.infra.local_servers import local_servers
    from hermes.infra.process import wait_until_interrupted
    from hermes.infra.stack import ensure_search_attributes
    from hermes.security.codec_server import endpoint_url
    from worker import connect_client, connect_redis

    codec_url = endpoint_url("127.0.0.1", settings.codec_port)
    async with local_servers(settings, ui=True, ui_codec_endpoint=codec_url) as servers:
        if servers.stack is None or settings.temporal_address is not None:
            # Only an embedded Temporal gets them at start; workers register them too.
            resolved = settings.model_copy(update={"temporal_address": servers.temporal_address})
            client = await connect_client(resolved)
            await ensure_search_attributes(client, names.SEARCH_ATTRIBUTES, resolved.temporal_namespace)
        redis = connect_redis(servers.redis_url, settings)
        try:
            await redis.ping()
            async with _dev_codec_server(settings, redis) as codec:
                _print_servers_banner(settings, servers, codec)
                await wait_until_interrupted()
                out.print("Stopping the servers...")
        finally:
            await redis.aclose()
    out.print("Stopped.")


def worker_env(settings: Settings, temporal_address: str, redis_url: str) -> list[str]:
    """The ``export`` lines that point ``hermes worker`` and the client commands at a
    ``hermes dev --no-worker``'s servers, to paste in another terminal.

    Args:
        settings: the settings of ``hermes dev`` (task queue, namespace, memory store).
        temporal_address: ``host:port`` of the Temporal frontend.
        redis_url: the Redis URL; one with credentials is printed commented out and
            masked (the user has it already: it is their REDIS_URL).

    Returns:
        POSIX shell lines, e.g. ``export TEMPORAL_ADDRESS=127.0.0.1:7233``.

    Raises:
        ConfigError: the command key file cannot be made.
    """
    import shlex

    values = {
        "TEMPORAL_ADDRESS": temporal_address,
        "REDIS_URL": redis_url,
        "HERMES_TASK_QUEUE": settings.task_queue,
    }
    if settings.temporal_namespace != "default":
        values["HERMES_TEMPORAL_NAMESPACE"] = settings.temporal_namespace
    # Absolute, so a worker started from another directory shares the long-term memory,
    # the transcript archive and the audit log (default: <data dir>/memory).
    values["HERMES_MEMORY_URI"] = settings.memory_uri or str((settings.data_dir / "memory").absolute())
    # The command keys too (hermes.security.command_auth): a worker elsewhere must check the proofs
    # the clients here sign. Keys given in HERMES_COMMAND_KEYS are the user's to pass on.
    if settings.command_keys is None or not settings.command_keys.get_secret_value():
        from hermes.security.command_auth import DEFAULT_KEY_FILE, default_key_file

        keys_file = settings.command_key_file
        if keys_file is None:
            keys_file = settings.data_dir / DEFAULT_KEY_FILE
            default_key_file(keys_file)  # made now: this process has no client to make it
        values["HERMES_COMMAND_KEY_FILE"] = str(Path(keys_file).expanduser().absolute())
    lines = []
    for name, value in values.items():
        shown = hide_password(value)
        if shown != value:
            lines.append(f"# export {name}={shlex.quote(shown)}   (credentials hidden: use your own {name})")
        else:
            lines.append(f"export {name}={shlex.quote(value)}")
    return lines


def _server_fields(settings: Settings, servers: Any) -> list[tuple[str, Any]]:
    """The Temporal, Web UI and Redis lines of the dev banners, each saying whose it is."""
    temporal_is_mine = servers.stack is not None and settings.temporal_address is None
    redis_is_mine = servers.stack is not None and settings.redis_url is None
    return [
        (
            "Temporal",
            f"{servers.temporal_address} (namespace {servers.namespace}, {'embedded' if temporal_is_mine else 'yours'})",
        ),
        ("Web UI", servers.ui_url or "(your Temporal's Web UI)"),
        ("Redis", f"{hide_password(servers.redis_url)} ({'embedded' if redis_is_mine else 'yours'})"),
    ]


def _print_servers_banner(settings: Settings, servers: Any, codec_url: str | None) -> None:
    fields = [
        *_server_fields(settings, servers),
        ("Codec server", codec_url or f"not started: port {settings.codec_port} is in use (set HERMES_CODEC_PORT)"),
        ("Workers", f"none in this process: start them with `hermes worker` (task queue {settings.task_queue})"),
    ]
    if servers.stack is not None:
        fields.append(("Data", str(servers.stack.data_dir)))
    out.rule("hermes dev --no-worker (servers only)")
    print_fields([(name, Text(str(value))) for name, value in fields])
    out.print("Point workers and clients at these servers: paste these lines in each terminal you start them in")
    out.print()
    for line in worker_env(settings, servers.temporal_address, servers.redis_url):
        out.print(line, markup=False, highlight=False, soft_wrap=True)
    out.print()
    out.print(
        "then run `hermes worker` in one or more of them (stop one: its sessions continue on another) and "
        "`hermes chat` in another.",
        markup=False,
        soft_wrap=True,
    )
    out.print("Ready. Ctrl-C to stop the servers.")


@contextlib.asynccontextmanager
async def _dev_codec_server(settings: Settings, redis: Any) -> AsyncIterator[str | None]:
    """The codec server of ``hermes dev`` on ``settings.codec_port``, in this process.

    Yields its URL, or None when the port is taken: the worker and the stack are more
    use than the codec server, so that is a warning in the banner, not a failure.
    """
    from hermes.content.blobs import BlobStore
    from hermes.errors import ConfigError
    from hermes.security.codec_server import (
        codec_keys,
        default_ui_origins,
        running_codec_server,
    )

    try:
        keyring, token = codec_keys(settings)
    except ConfigError:
        yield None  # keys without a token: it would decrypt for anyone; the banner says so
        return
    server = running_codec_server(
        BlobStore(redis), host="127.0.0.1", port=settings.codec_port, ui_origins=default_ui_origins(settings.ui_port),
        keyring=keyring, token=token,
    )
    async with contextlib.AsyncExitStack() as stack:
        try:
            url: str | None = await stack.enter_async_context(server)
        except OSError:
            log.debug("codec server not started", exc_info=True)
            url = None
        yield url


def _print_dev_banner(settings: Settings, servers: Any, model: str, codec_url: str | None = None) -> None:
    mine = "embedded" if servers.stack is not None else "yours"
    temporal_is_mine = servers.stack is not None and settings.temporal_address is None
    from hermes.memory.location import memory_location

    fields = [
        *_server_fields(settings, servers),
        ("Worker", f"task queue {settings.task_queue}, model {model}"),
        ("Memory store", memory_location(settings).describe()),
    ]
    encrypted = settings.encryption_keys is not None or settings.encryption_key_file is not None
    if codec_url is None and encrypted and settings.codec_token is None:
        fields.append(
            (
                "Codec server",
                Text(
                    "not started: payloads are encrypted and it would decrypt them for anyone; set "
                    "HERMES_CODEC_TOKEN (the Web UI then needs that bearer token to show messages)",
                    style="yellow",
                ),
            )
        )
    elif codec_url is None:
        fields.append(
            (
                "Codec server",
                Text(
                    f"not started: port {settings.codec_port} is in use (set HERMES_CODEC_PORT); "
                    "the Web UI shows message references instead of messages",
                    style="yellow",
                ),
            )
        )
    elif temporal_is_mine:
        fields.append(("Codec server", f"{codec_url} (the Web UI decodes message references through it)"))
    else:
        fields.append(("Codec server", f"{codec_url} (set it as your Web UI's codec endpoint)"))
    if servers.stack is not None:
        fields.append(("Data", str(servers.stack.data_dir)))
    out.rule(f"hermes dev ({mine} servers)")
    print_fields(fields)
    out.print("Ready. In another terminal: hermes chat · hermes demo · hermes sessions. Ctrl-C to stop.")


@app.command("worker")
def worker_command() -> None:
    """Run just the worker against the configured servers until Ctrl-C.

    Uses TEMPORAL_ADDRESS / REDIS_URL, or the embedded addresses of `hermes dev`.
    """
    from hermes.infra.process import tune_allocator

    tune_allocator()
    settings = load_settings()

    async def main() -> None:
        from hermes.memory.location import check_memory_location
        from worker import connect_redis, run_worker

        check_memory_location(settings)  # refused before any server is asked
        redis = connect_redis(settings=settings)
        try:
            await redis.ping()
        finally:
            await redis.aclose()

        def serving(provider: Any, registry: Any, mcp: Any) -> None:
            out.rule("hermes worker")
            print_fields([(name, Text(value)) for name, value in describe_worker(settings, provider, registry, mcp)])
            out.print("Serving. Ctrl-C to stop.")

        await run_worker(settings, on_serving=serving)
        out.print("Stopped.")

    run_command(main, settings, log_file=Path(settings.data_dir) / "hermes.log")


def describe_worker(settings: Settings, provider: Any, registry: Any, mcp: Any) -> list[tuple[str, str]]:
    """What a worker serves, as (name, value) lines for its start-up banner.

    Holds no secret: API keys are never read, URLs go through :func:`hide_password`
    (credentials and query values masked), MCP servers are named, not described (their
    ``env``, URL and headers may hold ``${ENV}`` secrets).

    Args:
        settings: the worker's settings.
        provider: its :class:`hermes.providers.ModelProvider`.
        registry: its :class:`hermes.tools.registry.ToolRegistry`.
        mcp: its :class:`hermes.mcp.tools.McpToolset`, or None.

    Returns:
        Model, Tool modules, Tool files, Tools, MCP servers, Memory, Memory store (where
        memories and the durable store live, and whether every worker shares it), Task
        queue, Temporal (with how it is secured: plain, TLS, mTLS, + API key) and Redis,
        in that order.
    """
    from hermes.infra.connections import describe_temporal_security
    from hermes.memory.location import memory_location

    if getattr(provider, "name", "") == "scripted":
        packaged = " (the packaged demo script)" if settings.script is None else ""
        model = f"scripted stand-in, script {getattr(provider, 'source', settings.script)}{packaged}"
    else:
        base = hide_password(settings.openai_base_url or "https://api.openai.com/v1")
        model = f"{settings.model_provider} {settings.model} via {base} (profile {settings.model_profile})"
    mcp_names = list(mcp.config.enabled_servers()) if mcp is not None else []
    if settings.memory_enabled:
        memory = f"on (embedder {settings.memory_embedder}, store {hide_password(settings.resolved_memory_uri)})"
    else:
        memory = "off"
    return [
        ("Model", model),
        ("Tool modules", ", ".join(settings.tool_modules) or "none"),
        ("Tool files", ", ".join(str(path) for path in settings.tool_files) or "none"),
        ("Tools", f"{len(list(registry))} registered" + (" (and the MCP servers' tools)" if mcp_names else "")),
        ("MCP servers", ", ".join(mcp_names) or "none"),
        ("Memory", memory),
        ("Memory store", memory_location(settings).describe()),
        ("Task queue", settings.task_queue),
        (
            "Temporal",
            f"{hide_password(settings.resolved_temporal_address)} (namespace {settings.temporal_namespace}, "
            f"{describe_temporal_security(settings)})",
        ),
        ("Redis", hide_password(settings.resolved_redis_url)),
    ]


@app.command("codec-server")
def codec_server_command(
    host: Annotated[str, typer.Option("--host", help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[
        int | None, typer.Option("--port", help="Port to listen on (default: HERMES_CODEC_PORT, 8081).")
    ] = None,
    ui_origin: Annotated[
        list[str] | None,
        typer.Option(
            "--ui-origin",
            help="Origin of a Temporal Web UI allowed to call it, e.g. http://localhost:8233 "
            "(repeatable; default: localhost and 127.0.0.1 on HERMES_UI_PORT).",
        ),
    ] = None,
) -> None:
    """Serve a Temporal codec server, so the Web UI shows the messages of model calls.

    Model calls carry content references of their messages in workflow history; this
    server fills in the messages from Redis (REDIS_URL, or the embedded one) when the
    Web UI or `temporal workflow show --codec-endpoint` decodes payloads. `hermes dev`
    runs one itself.
    """
    settings = load_settings()
    origins = [origin.rstrip("/") for origin in ui_origin or []]
    for origin in origins:
        if not re.fullmatch(r"https?://[^/\s]+", origin):
            raise fail(
                f"--ui-origin {origin!r} is not an origin: expected scheme://host[:port], e.g. http://localhost:8233",
                EXIT_UNAVAILABLE,
            )
    listen_port = settings.codec_port if port is None else port

    def ready(url: str) -> None:
        from hermes.security.codec_server import default_ui_origins

        shown = ", ".join(origins or default_ui_origins(settings.ui_port))
        out.print(
            f"Codec server on {url} · content store Redis {hide_password(settings.resolved_redis_url)} · "
            f"Web UI origins {shown}. Ctrl-C to stop.",
            soft_wrap=True,
        )
        out.print(
            f"Give it to the Web UI: temporal server start-dev --ui-codec-endpoint {url} (or the UI's codec "
            f"server setting); to the Temporal CLI: temporal workflow show --codec-endpoint {url} ...",
            soft_wrap=True,
        )

    async def main() -> None:
        import socket

        from hermes.security.codec_server import serve

        try:
            await serve(settings, host, listen_port, origins or None, on_ready=ready)
        except OSError as err:
            cannot_bind = err.errno in (errno.EADDRINUSE, errno.EADDRNOTAVAIL, errno.EACCES)
            if not cannot_bind and not isinstance(err, socket.gaierror):
                raise
            raise CliError(
                f"cannot listen on {host}:{listen_port} ({err.strerror}): choose another port with --port",
                EXIT_UNAVAILABLE,
            ) from None
        out.print("Stopped.")

    run_command(main, settings)
