"""The ``hermes`` command line.

    hermes demo                  # offline demo: embedded stack + scripted model, checked
    hermes dev                   # embedded Temporal (with Web UI) + Redis + a worker
    hermes worker                # just the worker, against configured servers
    hermes codec-server          # the Web UI shows the messages behind content references
    hermes chat [--session ID]   # talk to a session; approve tool calls inline
    hermes send ID TEXT          # one message, prints the reply (--json: the TurnResult)
    hermes sessions [--user U]   # the user's sessions (Redis index)
    hermes show ID               # state, pending approvals, transcript, trace
    hermes approve ID TOOL_CALL_ID / hermes reject ID TOOL_CALL_ID
    hermes approvals             # every pending approval across sessions
    hermes tools                 # the tools a worker would serve (checks tool files)
    hermes mcp list / hermes mcp call SERVER TOOL '{"arg": 1}'

Every command reads :class:`hermes.settings.Settings` (``HERMES_*``, ``TEMPORAL_ADDRESS``,
``REDIS_URL``, a ``.env`` file). Expected failures print one line starting with
``error:`` on stderr, never a traceback, and exit with:

* 1: Hermes refused the request or a check failed (empty or too large message, closed
  or busy session, unknown session, a decision that was not applied, a demo step);
* 2: the servers could not be reached or started, or the configuration is wrong;
* 130: interrupted (Ctrl-C) before the command finished. ``hermes dev``, ``hermes
  worker`` and ``hermes demo --keep`` treat Ctrl-C / SIGTERM as their normal stop (0).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import functools
import getpass
import json
import logging
import os
import re
import shlex
import signal
import sys
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import TYPE_CHECKING, Annotated, Any, NoReturn, TypeVar

from pydantic import ValidationError
import typer
from rich.console import Console
from rich.markup import escape
from rich.prompt import Confirm
from rich.table import Table
from rich.text import Text
from temporalio.client import (
    WorkflowQueryFailedError,
    WorkflowUpdateFailedError,
    WorkflowUpdateRPCTimeoutOrCancelledError,
)
from temporalio.service import RPCError, RPCStatusCode

from hermes import names
from hermes.client import HermesClient, check_message_text
from hermes.demo import (
    ConsoleTurnView,
    DemoFailed,
    Verdict,
    decide,
    local_servers,
    print_message,
    print_reply,
    run_demo,
    send_watched,
    wait_until_interrupted,
)
from hermes.errors import (
    ConfigError,
    HermesError,
    MessageFailedError,
    MessageRejectedError,
    SessionBusyError,
    SessionClosedError,
    SessionHaltedError,
    SessionNotFoundError,
    SessionUnavailableError,
    TemporalRequestError,
)
from hermes.models import PendingApproval, TurnResult
from hermes.process import exit_now
from hermes.settings import Settings
from hermes.stack import StackAlreadyRunning, StackError, ensure_search_attributes

if TYPE_CHECKING:
    from temporalio.runtime import Runtime

__all__ = ["app", "main"]

EXIT_REFUSED = 1
EXIT_UNAVAILABLE = 2
EXIT_INTERRUPTED = 130

_QUERY_TIMEOUT_SECONDS = 15.0
"""How long a command waits for a session to answer a query (a worker must be running)."""

_T = TypeVar("_T")

log = logging.getLogger("hermes.cli")

class _HermesTyper(typer.Typer):
    """A Typer app whose process exit skips interpreter finalization.

    The Temporal SDK's Rust threads can call into Python while CPython finalizes and
    abort the process ("Fatal Python error: PyGILState_Release", exit -6) after the
    command has succeeded: temporalio/sdk-python#300, seen here in about one run in
    twenty. So, like other short-lived Temporal clients, the CLI runs the ``atexit``
    handlers, flushes its output and leaves with ``os._exit``. Only the process entry
    point (``hermes`` / ``python -m hermes.cli``) goes through here; Typer's test
    runner calls the command directly.
    """

    def __call__(self, *args: Any, **kwargs: Any) -> NoReturn:
        try:
            super().__call__(*args, **kwargs)
            code: Any = 0
        except SystemExit as exit_:
            code = exit_.code
        except ValidationError as err:
            if err.title != "Settings":
                sys.excepthook(*sys.exc_info())
                code = 1
            else:
                # A bad setting (HERMES_* variable or .env): say which and why, not a traceback.
                for problem in err.errors(include_url=False):
                    where = ".".join(str(p) for p in problem.get("loc", ()))
                    got = problem.get("input")
                    print(f"error: setting HERMES_{where.upper()}: {problem.get('msg')} (got {got!r})", file=sys.stderr)
                code = 2
        except BaseException:  # noqa: BLE001 - printed like an uncaught exception
            sys.excepthook(*sys.exc_info())
            code = 1
        _exit_now(code)


def _exit_now(code: Any) -> NoReturn:
    exit_now(code)


app = _HermesTyper(
    name="hermes",
    help="Hermes Agent: durable AI agent sessions on Temporal.",
    no_args_is_help=True,
    add_completion=False,
    # Locals may hold API keys; never print them in a traceback.
    pretty_exceptions_show_locals=False,
)

out = Console(highlight=False)
err_console = Console(stderr=True, highlight=False)


def _default_user() -> str:
    try:
        return getpass.getuser() or "anonymous"
    except Exception:  # noqa: BLE001 - no login name in some containers
        return "anonymous"


UserOption = Annotated[
    str,
    typer.Option("--user", "-u", envvar="HERMES_USER", help="User id (default: $HERMES_USER or your login name)."),
]
JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON instead of text.")]


# --------------------------------------------------------------------------- errors


class CliError(Exception):
    """An expected failure: printed as one line, exits with ``code``."""

    def __init__(self, message: str, code: int = EXIT_REFUSED):
        self.message = message
        self.code = code
        super().__init__(message)


def _hide_password(url: str) -> str:
    return re.sub(r"://[^@/]*@", "://***@", url)


def _connect_reason(text: str) -> str:
    if "Connection refused" in text or "ConnectionRefused" in text:
        return "connection refused"
    if "timed out" in text.lower() or "deadline" in text.lower():
        return "timed out"
    return text.split(": ", 1)[-1][:200]


def _explain(err: BaseException, settings: Settings) -> tuple[str, int] | None:
    """The one-line message and exit code of an expected failure, or None."""
    import redis.exceptions

    temporal = settings.resolved_temporal_address
    if isinstance(err, CliError):
        return err.message, err.code
    if isinstance(err, MessageRejectedError):
        return f"message rejected: {err}", EXIT_REFUSED
    if isinstance(err, (SessionClosedError, SessionBusyError, SessionHaltedError, SessionNotFoundError)):
        return str(err), EXIT_REFUSED
    if isinstance(err, SessionUnavailableError):
        return (
            f"Temporal at {temporal} (or the session's worker) did not answer within "
            f"{settings.client_retry_seconds:g} s (HERMES_CLIENT_RETRY_SECONDS; last error: {err.last_error})",
            EXIT_UNAVAILABLE,
        )
    if isinstance(err, TemporalRequestError):
        if "no mapping defined for search attribute" in str(err):
            return (
                f"{err}: the Hermes search attributes are not registered on {temporal}; "
                "`hermes dev` and `hermes worker` register them on start",
                EXIT_UNAVAILABLE,
            )
        return str(err), EXIT_REFUSED
    if isinstance(err, MessageFailedError):
        return f"the session failed the message: {err.reason}", EXIT_REFUSED
    if isinstance(err, DemoFailed):
        return f"demo failed: {err}", EXIT_REFUSED
    if isinstance(err, StackAlreadyRunning):
        return (
            f"{err}. Stop it first (Ctrl-C in its terminal), use it (it serves the same addresses), "
            "or set HERMES_DATA_DIR to another directory.",
            EXIT_UNAVAILABLE,
        )
    if isinstance(err, StackError):
        return f"cannot start the embedded stack: {err}", EXIT_UNAVAILABLE
    if isinstance(err, ConfigError):
        return f"configuration error: {err}", EXIT_UNAVAILABLE
    if isinstance(err, RuntimeError) and str(err).startswith("Failed client connect"):
        return (
            f"cannot connect to Temporal at {temporal} ({_connect_reason(str(err))}): start the embedded "
            "stack with `hermes dev`, or set TEMPORAL_ADDRESS to your server",
            EXIT_UNAVAILABLE,
        )
    if isinstance(err, (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError)):
        return (
            f"cannot connect to Redis at {_hide_password(settings.resolved_redis_url)} "
            f"({_connect_reason(str(err))}): start the embedded stack with `hermes dev`, or set REDIS_URL",
            EXIT_UNAVAILABLE,
        )
    if isinstance(err, WorkflowUpdateRPCTimeoutOrCancelledError):
        return (
            f"the session did not take the message in time: is a worker running for task queue "
            f"{settings.task_queue!r}? Start one with `hermes dev` or `hermes worker`",
            EXIT_UNAVAILABLE,
        )
    if isinstance(err, RPCError):
        if "no mapping defined for search attribute" in err.message:
            return (
                f"{err.message}: the Hermes search attributes are not registered on {temporal}; "
                "`hermes dev` and `hermes worker` register them on start",
                EXIT_UNAVAILABLE,
            )
        if err.status == RPCStatusCode.NOT_FOUND:
            return f"no such session ({err.message})", EXIT_REFUSED
        if err.status in (RPCStatusCode.UNAVAILABLE, RPCStatusCode.DEADLINE_EXCEEDED):
            return f"Temporal at {temporal} did not answer ({err.status.name}): {err.message}", EXIT_UNAVAILABLE
        return f"Temporal refused the request ({err.status.name}): {err.message}", EXIT_REFUSED
    if isinstance(err, WorkflowUpdateFailedError):
        return f"the session failed the message: {err.cause}", EXIT_REFUSED
    if isinstance(err, WorkflowQueryFailedError):
        return f"the session failed the query: {err}", EXIT_REFUSED
    if isinstance(err, ConnectionRefusedError):
        return f"connection refused: {err}", EXIT_UNAVAILABLE
    return None


_UNCERTAIN_STATUSES = frozenset(
    {
        RPCStatusCode.UNAVAILABLE,
        RPCStatusCode.DEADLINE_EXCEEDED,
        RPCStatusCode.CANCELLED,
        RPCStatusCode.UNKNOWN,
        RPCStatusCode.INTERNAL,
    }
)
"""Statuses of a request that may have reached the server before it failed."""


def _may_have_been_taken(err: BaseException) -> bool:
    """Whether a send that failed with ``err`` may still have been recorded by the session."""
    if isinstance(err, SessionUnavailableError):
        return err.may_have_been_taken
    if isinstance(err, WorkflowUpdateRPCTimeoutOrCancelledError):
        return True
    return isinstance(err, RPCError) and err.status in _UNCERTAIN_STATUSES


def _resend_command(session_id: str, text: str, message_id: str, *, user: str, as_json: bool) -> str:
    """The ``hermes send`` command that resends a message under the same message id.

    A message that cannot be shown on one line (a line break, a control character, more
    than 200 characters) is written as ``<the same message>``.
    """
    shown = shlex.quote(text) if text.isprintable() and len(text) <= 200 else "<the same message>"
    parts = ["hermes", "send", shlex.quote(session_id), shown, "--message-id", shlex.quote(message_id)]
    parts += ["--user", shlex.quote(user)]
    if as_json:
        parts.append("--json")
    return " ".join(parts)


def _uncertain_send_message(err: BaseException | None, settings: Settings, resend: str) -> tuple[str, int]:
    """The error line of a send cut off after the message may have reached the session.

    Args:
        err: what cut it off; None: the user interrupted it.
        settings: for the addresses in the message.
        resend: the command that resends it under the same message id (``_resend_command``).

    Returns:
        The message and the exit code.
    """
    if err is None:
        cause, code = "interrupted", EXIT_INTERRUPTED
    elif isinstance(err, WorkflowUpdateRPCTimeoutOrCancelledError):
        cause, code = (
            f"the session did not confirm the message in time: is a worker running for task queue "
            f"{settings.task_queue!r}? Start one with `hermes dev` or `hermes worker`",
            EXIT_UNAVAILABLE,
        )
    else:
        cause, code = _explain(err, settings) or (str(err), EXIT_UNAVAILABLE)
    return (
        f"{cause}. The message may have been taken: to get its reply without starting a second "
        f"turn, rerun with the same message id: {resend}",
        code,
    )


def _fail(message: str, code: int) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(code)


@contextlib.contextmanager
def _reported_errors(settings: Settings) -> Iterator[None]:
    """Turn expected failures into one line on stderr and an exit code."""
    try:
        yield
    except (typer.Exit, typer.Abort):
        raise
    except Exception as err:  # noqa: BLE001 - unknown ones are re-raised below
        explained = _explain(err, settings)
        if explained is None:
            raise
        raise _fail(*explained) from None


def _quiet_orphaned_futures(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    """Loop exception handler: the Temporal SDK leaves the update future of a failed
    update-with-start (e.g. a closed session) unretrieved; the error was already reported
    to the user, so asyncio's "exception was never retrieved" traceback is only noise."""
    if "never retrieved" in str(context.get("message", "")):
        log.debug("unretrieved future: %s", context.get("exception"))
        return
    loop.default_exception_handler(context)


def _run(main: Callable[[], Awaitable[_T]], settings: Settings) -> _T:
    """Run ``main()`` in a fresh event loop. SIGINT and SIGTERM cancel it (once: a second
    signal does not interrupt the clean-up); cancellation exits with 130 unless ``main``
    handled it (see :func:`hermes.demo.wait_until_interrupted`)."""
    signals: list[int] = []

    async def guarded() -> _T:
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(_quiet_orphaned_futures)
        task = asyncio.current_task()
        assert task is not None

        def on_signal(sig: int) -> None:
            if signals:
                err_console.print("still stopping...", style="dim")
                return
            signals.append(sig)
            task.cancel()

        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                loop.add_signal_handler(sig, on_signal, sig)
        return await main()

    with _reported_errors(settings):
        try:
            return asyncio.run(guarded())
        except (asyncio.CancelledError, KeyboardInterrupt):
            raise _fail("interrupted", EXIT_INTERRUPTED) from None


async def _answer(awaitable: Awaitable[_T], settings: Settings) -> _T:
    """Await a query; a session only answers while a worker serves its task queue."""
    try:
        return await asyncio.wait_for(awaitable, _QUERY_TIMEOUT_SECONDS)
    except asyncio.TimeoutError:
        raise CliError(
            f"the session did not answer within {_QUERY_TIMEOUT_SECONDS:.0f} s: is a worker running "
            f"for task queue {settings.task_queue!r}? Start one with `hermes dev` or `hermes worker`",
            EXIT_UNAVAILABLE,
        ) from None


@functools.cache
def _quiet_runtime() -> Runtime:
    """The Temporal runtime of the commands' client connections: the SDK's Rust core logs
    only errors. By default it prints a ``WARN ... gRPC call ... retried N times`` line on
    stderr for every retry while a server is unreachable; a command reports the failure
    itself, in one line. ``hermes dev`` and ``hermes worker`` keep the default runtime."""
    from temporalio.runtime import LoggingConfig, Runtime, TelemetryConfig, TelemetryFilter

    return Runtime(
        telemetry=TelemetryConfig(
            logging=LoggingConfig(filter=TelemetryFilter(core_level="ERROR", other_level="ERROR"))
        )
    )


async def _connect(settings: Settings) -> HermesClient:
    return await HermesClient.connect(settings, runtime=_quiet_runtime())


def _describe_model(settings: Settings, provider: Any) -> str:
    if getattr(provider, "name", "") == "scripted":
        return f"scripted stand-in ({getattr(provider, 'source', 'script')})"
    base = settings.openai_base_url or "api.openai.com"
    return f"{settings.model} via {base}"


# --------------------------------------------------------------------------- dev / worker / demo


@app.command()
def dev() -> None:
    """Run the embedded Temporal server (with Web UI), Redis and a worker until Ctrl-C.

    With TEMPORAL_ADDRESS / REDIS_URL set, those servers are used instead of starting them.
    Data stays in HERMES_DATA_DIR (default .hermes/).
    """
    settings = Settings()
    _run(lambda: _dev(settings), settings)


async def _dev(settings: Settings) -> None:
    from hermes.providers import make_provider
    from worker import load_registry, open_mcp

    # Configuration mistakes fail before anything is started.
    provider = make_provider(settings)
    registry = load_registry(settings)
    mcp = open_mcp(settings, registry)
    try:
        await _dev_with(settings, provider, registry, mcp)
    finally:
        if mcp is not None:
            await mcp.manager.aclose()  # every MCP server process (tree) goes with the worker


async def _dev_with(settings: Settings, provider: Any, registry: Any, mcp: Any) -> None:
    from hermes.codec_server import endpoint_url
    from worker import build_worker, connect_client, connect_redis

    codec_url = endpoint_url("127.0.0.1", settings.codec_port)
    async with local_servers(settings, ui=True, ui_codec_endpoint=codec_url) as servers:
        resolved = settings.model_copy(
            update={"temporal_address": servers.temporal_address, "redis_url": servers.redis_url}
        )
        client = await connect_client(resolved)
        await ensure_search_attributes(client, names.SEARCH_ATTRIBUTES, resolved.temporal_namespace)
        redis = connect_redis(servers.redis_url)
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
    out.print("Stopped.")


@contextlib.asynccontextmanager
async def _dev_codec_server(settings: Settings, redis: Any) -> AsyncIterator[str | None]:
    """The codec server of ``hermes dev`` on ``settings.codec_port``, in this process.

    Yields its URL, or None when the port is taken: the worker and the stack are more
    use than the codec server, so that is a warning in the banner, not a failure.
    """
    from hermes.blobs import BlobStore
    from hermes.codec_server import default_ui_origins, running_codec_server

    server = running_codec_server(
        BlobStore(redis), host="127.0.0.1", port=settings.codec_port, ui_origins=default_ui_origins(settings.ui_port)
    )
    async with contextlib.AsyncExitStack() as stack:
        try:
            url: str | None = await stack.enter_async_context(server)
        except OSError:
            log.debug("codec server not started", exc_info=True)
            url = None
        yield url


def _print_dev_banner(settings: Settings, servers: Any, model: str, codec_url: str | None = None) -> None:
    table = Table.grid(padding=(0, 2))
    table.add_column(style="bold")
    table.add_column()
    mine = "embedded" if servers.stack is not None else "yours"
    temporal_is_mine = servers.stack is not None and settings.temporal_address is None
    redis_is_mine = servers.stack is not None and settings.redis_url is None
    table.add_row(
        "Temporal",
        f"{servers.temporal_address} (namespace {servers.namespace}, {'embedded' if temporal_is_mine else 'yours'})",
    )
    table.add_row("Web UI", servers.ui_url or "(your Temporal's Web UI)")
    table.add_row(
        "Redis", f"{_hide_password(servers.redis_url)} ({'embedded' if redis_is_mine else 'yours'})"
    )
    table.add_row("Worker", f"task queue {settings.task_queue}, model {model}")
    if codec_url is None:
        table.add_row(
            "Codec server",
            Text(
                f"not started: port {settings.codec_port} is in use (set HERMES_CODEC_PORT); "
                "the Web UI shows message references instead of messages",
                style="yellow",
            ),
        )
    elif temporal_is_mine:
        table.add_row("Codec server", f"{codec_url} (the Web UI decodes message references through it)")
    else:
        table.add_row("Codec server", f"{codec_url} (set it as your Web UI's codec endpoint)")
    if servers.stack is not None:
        table.add_row("Data", str(servers.stack.data_dir))
    out.rule(f"hermes dev ({mine} servers)")
    out.print(table)
    out.print("Ready. In another terminal: hermes chat · hermes demo · hermes sessions. Ctrl-C to stop.")


@app.command("worker")
def worker_command() -> None:
    """Run just the worker against the configured servers until Ctrl-C.

    Uses TEMPORAL_ADDRESS / REDIS_URL, or the embedded addresses of `hermes dev`.
    """
    settings = Settings()

    async def main() -> None:
        from worker import connect_redis, run_worker

        redis = connect_redis(settings.resolved_redis_url)
        try:
            await redis.ping()
        finally:
            await redis.aclose()
        out.print(
            f"Worker: task queue {settings.task_queue} · Temporal {settings.resolved_temporal_address} · "
            f"Redis {_hide_password(settings.resolved_redis_url)} · model provider {settings.model_provider}. "
            "Ctrl-C to stop."
        )
        await run_worker(settings)
        out.print("Stopped.")

    _run(main, settings)


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
    settings = Settings()
    origins = [origin.rstrip("/") for origin in ui_origin or []]
    for origin in origins:
        if not re.fullmatch(r"https?://[^/\s]+", origin):
            raise _fail(
                f"--ui-origin {origin!r} is not an origin: expected scheme://host[:port], e.g. http://localhost:8233",
                EXIT_UNAVAILABLE,
            )
    listen_port = settings.codec_port if port is None else port

    def ready(url: str) -> None:
        from hermes.codec_server import default_ui_origins

        shown = ", ".join(origins or default_ui_origins(settings.ui_port))
        out.print(
            f"Codec server on {url} · content store Redis {_hide_password(settings.resolved_redis_url)} · "
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

        from hermes.codec_server import serve

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

    _run(main, settings)


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
    settings = Settings()
    _run(lambda: run_demo(settings, console=out, keep=keep), settings)


# --------------------------------------------------------------------------- conversations


class _ChatView(ConsoleTurnView):
    """Asks the person at the terminal to approve or reject pending tool calls."""

    def __init__(self, console: Console, session_id: str, user_id: str):
        super().__init__(console, session_id)
        self.user_id = user_id

    async def approval_needed(self, pending: PendingApproval) -> Verdict | None:
        refusal = pending.may_decide(self.user_id)
        if refusal is not None:
            # e.g. an `admin` call: the requester may not approve it; someone else must.
            self.console.print(Text(f"    {refusal}.", style="magenta"))
            return await super().approval_needed(pending)
        self.print_pending(pending)
        # The event loop's SIGINT handler only cancels the turn, which a blocking prompt
        # never notices; while asking, Ctrl-C interrupts the prompt at once.
        previous = signal.signal(signal.SIGINT, signal.default_int_handler)
        try:
            approved = Confirm.ask(
                f"    Run [bold]{escape(pending.tool_name)}[/] with these arguments?", console=self.console
            )
        except EOFError:
            return await super().approval_needed(pending)
        finally:
            signal.signal(signal.SIGINT, previous)
        reason = None if approved else f"rejected by {self.user_id} in chat"
        return Verdict(approved=approved, approver=self.user_id, reason=reason)


@app.command()
def chat(
    session: Annotated[
        str | None, typer.Option("--session", "-s", help="Continue this session (default: a new one).")
    ] = None,
    user: UserOption = _default_user(),
) -> None:
    """Talk to a session interactively. /quit exits, /close closes the session, /retry
    resends a message whose reply was lost in an outage (under the same id)."""
    settings = Settings()
    _keep_undecodable_input()
    with _reported_errors(settings), asyncio.Runner() as runner:
        runner.get_loop().set_exception_handler(_quiet_orphaned_futures)
        hermes = runner.run(_connect(settings))
        try:
            _chat_loop(runner, hermes, settings, session, user)
        finally:
            if hermes.redis is not None:
                runner.run(hermes.redis.aclose())


def _keep_undecodable_input() -> None:
    """Read stdin with ``surrogateescape``: a line with a byte that is not UTF-8 then
    arrives as text that :func:`check_message_text` refuses in one error line, and the
    chat goes on, instead of a ``UnicodeDecodeError`` ending it."""
    reconfigure = getattr(sys.stdin, "reconfigure", None)
    if reconfigure is not None:
        with contextlib.suppress(Exception):
            reconfigure(errors="surrogateescape")


def _chat_loop(
    runner: asyncio.Runner, hermes: HermesClient, settings: Settings, session: str | None, user: str
) -> None:
    session_id = session or f"chat-{uuid.uuid4().hex[:12]}"
    existing = False
    if session:
        try:
            transcript = runner.run(_answer(hermes.get_transcript(session_id, include_archived=True), settings))
            existing = True
        except SessionNotFoundError:
            pass
    if existing:
        out.rule(f"session {session_id}")
        for message in transcript:
            print_message(out, message)
        state = runner.run(_answer(hermes.get_state(session_id), settings))
        if state.status == "closed":
            raise CliError(f"session {session_id!r} is closed; start a new one with `hermes chat`")
        for pending in state.pending_approvals:
            view = ConsoleTurnView(out, session_id)
            view.print_pending(pending)
        if state.pending_approvals:
            out.print("    (your next message asks for a decision; or use hermes approve / hermes reject)", style="dim")
        out.rule()
    else:
        out.print(f"New session [bold]{escape(session_id)}[/] (continue later with: hermes chat --session {escape(session_id)})")
    out.print("Type a message. /quit exits, /close closes the session.", style="dim")
    view = _ChatView(out, session_id, user)
    unconfirmed: tuple[str, str] | None = None
    """A message (text, id) that may have been taken without a reply: /retry resends it
    under the same id, which returns its reply instead of running it twice."""
    while True:
        try:
            text = out.input("[bold cyan]you › [/]").strip()
        except (EOFError, KeyboardInterrupt):
            out.print()
            return
        if not text:
            continue
        if text == "/quit":
            return
        if text == "/close":
            runner.run(hermes.close(session_id))
            out.print(f"Session {escape(session_id)} closed.")
            return
        if text == "/retry":
            if unconfirmed is None:
                err_console.print("error: no message to retry", style="red")
                continue
            text, message_id = unconfirmed
        else:
            message_id = f"msg-{uuid.uuid4()}"
        try:
            check_message_text(text)
            result = runner.run(
                send_watched(hermes, session_id, text, view, user_id=user, client_message_id=message_id)
            )
        except KeyboardInterrupt:
            out.print(
                "(interrupted: the session finishes this turn on its own; "
                f"see it with `hermes show {escape(session_id)}`)",
                style="yellow",
            )
            continue
        except (MessageRejectedError, SessionBusyError, SessionHaltedError) as err:
            err_console.print(f"error: {escape(str(err))}", style="red")
            continue
        except SessionUnavailableError as err:
            explained, _ = _explain(err, settings) or (str(err), EXIT_UNAVAILABLE)
            if err.may_have_been_taken:
                unconfirmed = (text, message_id)
                explained += "; the message may have been taken: type /retry to resend it under the same id"
            err_console.print(f"error: {escape(explained)}", style="red")
            continue
        unconfirmed = None
        print_reply(out, result)


@app.command()
def send(
    session_id: Annotated[str, typer.Argument(help="The session (created if new).")],
    text: Annotated[str, typer.Argument(help="The message.")],
    user: UserOption = _default_user(),
    as_json: JsonOption = False,
    message_id: Annotated[
        str | None, typer.Option("--message-id", help="De-duplication id: a resend returns the first reply.")
    ] = None,
) -> None:
    """Send one message and print the reply (exit 1 if the turn did not complete).

    Tool calls and approval hints go to stderr; stdout has only the reply (or JSON).
    If the connection is lost or the command is interrupted after the message was
    sent, the error line gives the command that resends it with the same
    ``--message-id``: that returns the first reply instead of starting a second turn.
    """
    settings = Settings()
    # Known before sending, so that a send cut off by an outage can be repeated safely.
    client_message_id = message_id or f"msg-{uuid.uuid4()}"

    async def main() -> TurnResult:
        check_message_text(text)
        hermes = await _connect(settings)
        try:
            view = ConsoleTurnView(err_console, session_id)
            try:
                return await send_watched(
                    hermes, session_id, text, view, user_id=user, client_message_id=client_message_id
                )
            except asyncio.CancelledError:
                uncertain: BaseException | None = None
            except Exception as err:  # noqa: BLE001 - only uncertain outcomes are rewritten
                if not _may_have_been_taken(err):
                    raise
                uncertain = err
            resend = _resend_command(session_id, text, client_message_id, user=user, as_json=as_json)
            raise CliError(*_uncertain_send_message(uncertain, settings, resend))
        finally:
            await hermes.redis.aclose()

    result = _run(main, settings)
    if as_json:
        typer.echo(result.model_dump_json(indent=2))
    else:
        typer.echo(result.reply)
    if result.status != "completed":
        raise typer.Exit(EXIT_REFUSED)


# --------------------------------------------------------------------------- reading


@app.command()
def sessions(
    user: UserOption = _default_user(),
    as_json: JsonOption = False,
    limit: Annotated[int, typer.Option("--limit", min=1, max=1000, help="At most this many.")] = 50,
    rebuild: Annotated[
        bool, typer.Option("--rebuild", help="First add sessions that Temporal knows and the Redis index lacks.")
    ] = False,
) -> None:
    """List a user's sessions, most recently active first (from the Redis index)."""
    settings = Settings()

    async def main() -> list[Any]:
        hermes = await _connect(settings)
        try:
            return await hermes.list_sessions(user, limit=limit, rebuild=rebuild)
        finally:
            await hermes.redis.aclose()

    entries = _run(main, settings)
    if as_json:
        typer.echo(json.dumps([e.model_dump(mode="json") for e in entries], ensure_ascii=False, indent=2))
        return
    if not entries:
        out.print(f"No sessions for user {escape(user)}.")
        return
    table = Table(title=f"sessions of {escape(user)}", title_justify="left")
    table.add_column("session id", overflow="fold", no_wrap=True)
    table.add_column("status")
    table.add_column("turns", justify="right")
    table.add_column("last active (UTC)")
    table.add_column("title", overflow="ellipsis")
    for entry in entries:
        table.add_row(
            escape(entry.session_id),
            entry.status,
            str(entry.turn_count),
            f"{entry.last_active_at:%Y-%m-%d %H:%M:%S}",
            escape(entry.title),
        )
    out.print(table)


@app.command()
def show(
    session_id: Annotated[str, typer.Argument(help="The session.")],
    as_json: JsonOption = False,
) -> None:
    """Show a session: state, pending approvals, decisions, transcript and trace."""
    settings = Settings()

    async def main() -> tuple[Any, Any, Any]:
        hermes = await _connect(settings)
        try:
            state = await _answer(hermes.get_state(session_id), settings)
            transcript = await _answer(hermes.get_transcript(session_id, include_archived=True), settings)
            trace = await _answer(hermes.get_trace(session_id), settings)
            return state, transcript, trace
        except SessionNotFoundError:
            raise CliError(f"no session {session_id!r} in namespace {settings.temporal_namespace!r}") from None
        finally:
            await hermes.redis.aclose()

    state, transcript, trace = _run(main, settings)
    if as_json:
        typer.echo(
            json.dumps(
                {
                    "state": state.model_dump(mode="json"),
                    "transcript": [m.model_dump(mode="json") for m in transcript],
                    "trace": [t.model_dump(mode="json") for t in trace],
                },
                ensure_ascii=False,
                indent=2,
            )
        )
        return
    out.rule(f"session {escape(session_id)}")
    info = Table.grid(padding=(0, 2))
    info.add_column(style="bold")
    info.add_column()
    info.add_row("user", escape(state.user_id))
    info.add_row("channel", escape(state.channel))
    info.add_row("status", state.status + (" (turn running)" if state.busy else ""))
    info.add_row("title", escape(state.title))
    info.add_row("created", f"{state.created_at:%Y-%m-%d %H:%M:%S} UTC")
    info.add_row("last active", f"{state.last_active_at:%Y-%m-%d %H:%M:%S} UTC")
    info.add_row("turns", str(state.turn_count))
    info.add_row("context tokens", f"~{state.token_estimate}")
    info.add_row("history", f"{state.history_length} events (run {state.run_index})")
    out.print(info)

    out.print()
    if state.pending_approvals:
        table = Table(title="pending approvals", title_justify="left")
        for column in ("tool_call_id", "tool", "permission", "arguments", "expires (UTC)"):
            table.add_column(column, overflow="fold")
        for p in state.pending_approvals:
            table.add_row(
                escape(p.tool_call_id),
                escape(p.tool_name),
                p.permission,
                escape(json.dumps(p.arguments, ensure_ascii=False)),
                f"{p.expires_at:%H:%M:%S}",
            )
        out.print(table)
        out.print(f"decide with: hermes approve {escape(session_id)} TOOL_CALL_ID  (or hermes reject)", style="dim")
    else:
        out.print("pending approvals: none")
    if state.decisions:
        table = Table(title="decisions", title_justify="left")
        for column in ("tool_call_id", "verdict", "approver", "outcome", "at (UTC)"):
            table.add_column(column, overflow="fold")
        for d in state.decisions:
            table.add_row(
                escape(d.tool_call_id),
                "approved" if d.approved else "rejected",
                escape(d.approver),
                d.outcome,
                f"{d.at:%H:%M:%S}",
            )
        out.print(table)

    out.rule("transcript")
    for message in transcript:
        print_message(out, message)

    out.rule("trace")
    table = Table()
    for column in ("step", "turn", "action", "tool", "provider", "latency ms", "tokens", "status"):
        table.add_column(column, justify="right" if column in ("step", "turn", "latency ms", "tokens") else "left")
    for t in trace:
        table.add_row(
            str(t.step),
            str(t.turn),
            t.action_type,
            escape(t.tool_name or ""),
            escape(t.provider),
            f"{t.latency_ms:.0f}",
            str(t.tokens),
            escape(t.status),
        )
    out.print(table)


# --------------------------------------------------------------------------- approvals


def _decide_command(session_id: str, tool_call_id: str, *, approved: bool, approver: str, reason: str | None) -> None:
    settings = Settings()

    async def main() -> tuple[Any, list[str]]:
        hermes = await _connect(settings)
        try:
            try:
                record = await decide(
                    hermes, session_id, tool_call_id, approved=approved, approver=approver, reason=reason,
                    timeout_seconds=_QUERY_TIMEOUT_SECONDS,
                )
            except asyncio.TimeoutError:
                raise CliError(
                    f"the session did not record the decision within {_QUERY_TIMEOUT_SECONDS:.0f} s: is a worker "
                    f"running for task queue {settings.task_queue!r}?",
                    EXIT_UNAVAILABLE,
                ) from None
            pending = [p.tool_call_id for p in await _answer(hermes.get_pending_approvals(session_id), settings)]
            return record, pending
        except SessionNotFoundError:
            raise CliError(f"no session {session_id!r} in namespace {settings.temporal_namespace!r}") from None
        finally:
            await hermes.redis.aclose()

    record, pending = _run(main, settings)
    verb = "approved" if approved else "rejected"
    if record.outcome == "applied":
        typer.echo(f"applied: {verb} tool call {tool_call_id} of session {session_id} (by {record.approver})")
        return
    if record.outcome == "unknown_tool_call":
        detail = f"session {session_id} has no pending tool call {tool_call_id!r} (pending: {', '.join(pending) or 'none'})"
    elif record.outcome == "not_allowed":
        detail = f"{record.detail}; tool call {tool_call_id!r} is still pending"
    else:
        detail = f"tool call {tool_call_id!r} of session {session_id} was already decided; nothing changed"
    raise _fail(f"{record.outcome}: {detail}", EXIT_REFUSED)


ApproverOption = Annotated[
    str, typer.Option("--approver", "-a", envvar="HERMES_USER", help="Who decides (for the audit record).")
]
ReasonOption = Annotated[str | None, typer.Option("--reason", "-r", help="Why (shown to the model on a rejection).")]


@app.command()
def approve(
    session_id: Annotated[str, typer.Argument(help="The session.")],
    tool_call_id: Annotated[str, typer.Argument(help="From `hermes show` or the chat prompt.")],
    approver: ApproverOption = _default_user(),
    reason: ReasonOption = None,
) -> None:
    """Approve a pending tool call and report what the session did with the decision."""
    _decide_command(session_id, tool_call_id, approved=True, approver=approver, reason=reason)


@app.command()
def reject(
    session_id: Annotated[str, typer.Argument(help="The session.")],
    tool_call_id: Annotated[str, typer.Argument(help="From `hermes show` or the chat prompt.")],
    approver: ApproverOption = _default_user(),
    reason: ReasonOption = None,
) -> None:
    """Reject a pending tool call (the model is told) and report the outcome."""
    _decide_command(session_id, tool_call_id, approved=False, approver=approver, reason=reason)


@app.command()
def approvals(
    user: Annotated[str | None, typer.Option("--user", "-u", help="Only sessions of this user (the requester).")] = None,
    approver: Annotated[
        str | None, typer.Option("--approver", "-a", help="Mark which approvals this person may decide.")
    ] = None,
    audit: Annotated[
        bool, typer.Option("--audit", help="Show the audit log instead: requests, decisions, verdicts.")
    ] = False,
    session: Annotated[str | None, typer.Option("--session", "-s", help="With --audit: only this session.")] = None,
    limit: Annotated[int, typer.Option("--limit", min=1, max=10000, help="With --audit: the newest this many.")] = 100,
    as_json: JsonOption = False,
) -> None:
    """List every pending approval across sessions (Temporal visibility), oldest first;
    with --audit, who asked for what, who decided and when."""
    settings = Settings()

    async def main() -> list[Any]:
        hermes = await _connect(settings)
        try:
            if audit:
                return await hermes.get_approval_audit(session_id=session, limit=limit)
            return await _answer(hermes.list_pending_approvals(user_id=user), settings)
        finally:
            await hermes.redis.aclose()

    if audit:
        entries = _run(main, settings)
        if as_json:
            typer.echo(json.dumps([e.model_dump(mode="json") for e in entries], ensure_ascii=False, indent=2))
            return
        if not entries:
            out.print("No approval audit entries.")
            return
        log_table = Table(title="approval audit", title_justify="left")
        for column in ("at (UTC)", "session", "tool call id", "tool", "event", "by", "outcome", "detail"):
            log_table.add_column(column, overflow="fold")
        for e in entries:
            by = e.approver if e.event == "decision" or e.approver else e.requester
            log_table.add_row(
                f"{e.at:%Y-%m-%d %H:%M:%S}", escape(e.session_id), escape(e.tool_call_id), escape(e.tool_name),
                e.event, escape(by or ""), escape(e.outcome), escape(e.detail or e.reason or ""),
            )
        out.print(log_table)
        return
    pending = _run(main, settings)
    if as_json:
        typer.echo(json.dumps([p.model_dump(mode="json") for p in pending], ensure_ascii=False, indent=2))
        return
    if not pending:
        out.print("No pending approvals.")
        return
    table = Table(title="pending approvals", title_justify="left")
    for column in ("session", "tool call id", "tool", "permission", "requester", "expires (UTC)", "arguments"):
        table.add_column(column, overflow="fold")
    if approver is not None:
        table.add_column("you may decide")
    for p in pending:
        expires = f"{p.expires_at:%Y-%m-%d %H:%M:%S}" + (" (expired: session halted)" if p.expired else "")
        row = [
            escape(p.session_id),
            escape(p.tool_call_id),
            escape(p.tool_name),
            f"{p.permission} ({p.action})",
            escape(p.requester),
            expires,
            escape(json.dumps(p.arguments, ensure_ascii=False)[:200]),
        ]
        if approver is not None:
            why_not = p.may_decide(approver)
            row.append("yes" if why_not is None else escape(f"no: {why_not}"))
        table.add_row(*row)
    out.print(table)


@app.command("tools")
def tools_command(as_json: JsonOption = False) -> None:
    """List the tools a worker started with these settings would serve (built-ins,
    HERMES_TOOL_MODULES, HERMES_TOOL_FILES), with tier, idempotency and permission."""
    from worker import load_registry

    settings = Settings()
    try:
        registry = load_registry(settings)
    except HermesError as err:
        raise _fail(str(err), EXIT_UNAVAILABLE) from None
    specs = [t.spec(tier_seconds=settings.tier_seconds, heartbeat_timeout_seconds=settings.tool_heartbeat_seconds) for t in registry]
    if as_json:
        typer.echo(json.dumps([s.model_dump(mode="json", exclude_none=True) for s in specs], ensure_ascii=False, indent=2))
        return
    table = Table(title="tools", title_justify="left")
    for column in ("name", "group", "tier", "timeout s", "idempotency", "permission", "description"):
        table.add_column(column, overflow="fold")
    for spec in specs:
        table.add_row(
            escape(spec.name),
            escape(spec.group or "-"),
            spec.tier,
            f"{spec.timeout_seconds:g}",
            spec.idempotency or "",
            spec.permission,
            escape(spec.description.splitlines()[0][:100]),
        )
    out.print(table)


mcp_app = typer.Typer(help="MCP servers of HERMES_MCP_CONFIG: list them, call a tool.", no_args_is_help=True)
app.add_typer(mcp_app, name="mcp")


def _mcp_config(settings: Settings) -> Any:
    from hermes.mcp.config import load_mcp_config

    # The manager's warnings are for a worker's log; here the command reports what failed.
    logging.getLogger("hermes.mcp").setLevel(logging.ERROR)

    if settings.mcp_config is None:
        raise _fail("no MCP configuration: set HERMES_MCP_CONFIG to an mcpServers JSON/YAML file", EXIT_UNAVAILABLE)
    try:
        return load_mcp_config(settings.mcp_config, environ=os.environ)
    except HermesError as err:
        raise _fail(str(err), EXIT_UNAVAILABLE) from None


@mcp_app.command("list")
def mcp_list(as_json: JsonOption = False) -> None:
    """Start each configured server, list its tools (after allow/deny) and its status."""
    from hermes.mcp.manager import McpManager

    settings = Settings()
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
        table = Table(title=f"MCP servers ({settings.mcp_config})", title_justify="left")
        for column in ("server", "transport", "state", "tools", "error"):
            table.add_column(column, overflow="fold")
        for row in rows:
            table.add_row(
                escape(row["server"]), row["transport"], row["state"] if row["enabled"] else "disabled",
                escape(", ".join(row["tools"])), escape(row["error"] or ""),
            )
        out.print(table)
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
    from hermes.mcp.tools import call_result

    settings = Settings()
    config = _mcp_config(settings)
    try:
        parsed = json.loads(arguments)
    except ValueError as err:
        raise _fail(f"ARGUMENTS: expected a JSON object, received {arguments[:200]!r} ({err})", EXIT_REFUSED) from None
    if not isinstance(parsed, dict):
        raise _fail(f"ARGUMENTS: expected a JSON object, received {arguments[:200]!r}", EXIT_REFUSED)
    if server not in config.servers:
        raise _fail(f"no MCP server {server!r} in {settings.mcp_config}; configured: {', '.join(config.servers)}", EXIT_REFUSED)

    async def main() -> Any:
        async with McpManager(config, environ=os.environ) as manager:
            return call_result(await manager.call_tool(server, tool, parsed))

    try:
        result = asyncio.run(main())
    except HermesError as err:
        raise _fail(str(err), EXIT_UNAVAILABLE) from None
    typer.echo(result.model_dump_json(indent=2))
    if result.code != 0:
        raise typer.Exit(EXIT_REFUSED)


memory_app = typer.Typer(
    help="Long-term memory (LanceDB at HERMES_MEMORY_URI, default .hermes/memory): search, add, list, forget, consolidate, reembed.",
    no_args_is_help=True,
)
app.add_typer(memory_app, name="memory")
UserOption = Annotated[str, typer.Option("--user", "-u", help="The user whose memories these are.")]


def _memory_store(settings: Settings) -> Any:
    """The store of the settings; a clear exit when it cannot be opened or searched."""
    from hermes.memory.service import open_store
    from hermes.memory.store import MemoryStoreError

    try:
        store = open_store(settings)
        store.check_model()
    except (HermesError, MemoryStoreError, OSError) as err:
        raise _fail(str(err), EXIT_UNAVAILABLE) from None
    return store


def _print_memory_rows(rows: list[dict[str, Any]], title: str) -> None:
    table = Table(title=title, title_justify="left")
    for column in ("memory_id", "kind", "status", "updated (UTC)", "hits", "said", "text"):
        table.add_column(column, overflow="fold")
    for r in rows:
        status = r["status"] + (f" by {r['superseded_by']}" if r.get("superseded_by") else "")
        table.add_row(
            r["memory_id"], r["kind"], escape(status), f"{r['updated_at']:%Y-%m-%d %H:%M}",
            str(r["hit_count"]), str(r["mentions"]), escape(r["text"]),
        )
    out.print(table)


@memory_app.command("search")
def memory_search(
    query: Annotated[str, typer.Argument(help="What to look for (any language).")],
    user: UserOption,
    limit: Annotated[int, typer.Option(min=1, max=5, help="At most this many (1-5).")] = 5,
    as_json: JsonOption = False,
) -> None:
    """The memories a session of USER would be given for QUERY: prefilter, vector top-20
    plus full-text, rerank (0.5 similarity, 0.2 recency, 0.2 importance, 0.1 frequency)."""
    from hermes.memory.store import MemoryStoreError

    settings = Settings()
    store = _memory_store(settings)
    try:
        found = store.search(user, query, limit=limit)
    except MemoryStoreError as err:
        raise _fail(str(err), EXIT_REFUSED) from None
    if as_json:
        typer.echo(json.dumps([m.model_dump(mode="json") for m in found], ensure_ascii=False, indent=2))
        return
    if not found:
        out.print(f"no memory of {escape(user)} matches", style="dim")
        return
    table = Table(title=f"memories of {escape(user)} for {escape(query[:60])!r}", title_justify="left")
    for column in ("score", "similarity", "updated", "memory_id", "text"):
        table.add_column(column, overflow="fold")
    for m in found:
        table.add_row(f"{m.score:.3f}", f"{m.similarity:.3f}", f"{m.updated_at:%Y-%m-%d}", m.memory_id, escape(m.text))
    out.print(table)


@memory_app.command("list")
def memory_list(
    user: UserOption,
    archived: Annotated[bool, typer.Option("--archived", help="The archive table's rows (merged, expired, unused).")] = False,
    limit: Annotated[int, typer.Option(min=1)] = 100,
    as_json: JsonOption = False,
) -> None:
    """USER's memories, newest first, superseded ones included (with what replaced them)."""
    from hermes.memory.store import MemoryStoreError

    settings = Settings()
    store = _memory_store(settings)
    statuses = ("merged", "archived", "expired", "superseded", "active") if archived else ("active", "superseded")
    try:
        rows = store.list(user, statuses=statuses, archived=archived, limit=limit)
    except MemoryStoreError as err:
        raise _fail(str(err), EXIT_REFUSED) from None
    if as_json:
        typer.echo(json.dumps(rows, ensure_ascii=False, indent=2, default=str))
        return
    _print_memory_rows(rows, f"{'archived ' if archived else ''}memories of {escape(user)} ({len(rows)})")


@memory_app.command("add")
def memory_add(
    text: Annotated[str, typer.Argument(help="The memory, as a sentence about the user.")],
    user: UserOption,
    kind: Annotated[str, typer.Option(help="fact, preference or episode.")] = "fact",
    subject: Annotated[str, typer.Option(help="Key of a single-valued fact (home_city): a new value supersedes the old.")] = "",
    value: Annotated[str, typer.Option(help="The subject's value (Zurich).")] = "",
    importance: Annotated[float, typer.Option(min=0.0, max=1.0)] = 0.7,
    as_json: JsonOption = False,
) -> None:
    """Write one memory through USER's memory writer (deduplicated and checked for
    conflicts like any other; needs a worker)."""
    from datetime import datetime, timezone

    from pydantic import ValidationError

    from hermes.memory.models import MemoryCandidate
    from hermes.memory.store import MemoryStoreError, check_id

    settings = Settings()
    try:
        check_id(user)
        candidate = MemoryCandidate(
            user_id=user, kind=kind, subject=subject, value=value, text=text, importance=importance,
            confidence=1.0, source="cli", source_session="cli", created_at=datetime.now(timezone.utc),
        )
    except (ValidationError, MemoryStoreError) as err:
        message = err.errors()[0]["msg"] if isinstance(err, ValidationError) else str(err)
        raise _fail(f"memory refused: {message}", EXIT_REFUSED) from None

    async def main() -> Any:
        hermes = await _connect(settings)
        return await _answer(hermes.add_memories(user, [candidate]), settings)

    report = _run(main, settings)
    if as_json:
        typer.echo(report.model_dump_json(indent=2))
        return
    if report.error:
        raise _fail(report.error, EXIT_UNAVAILABLE)
    for mid in report.inserted:
        out.print(f"added {mid}")
    for mid in report.updated:
        out.print(f"already known: refreshed {mid}")
    for mid in report.superseded:
        out.print(f"superseded {mid}")
    if report.unchanged:
        out.print("already written")
    if report.refused:
        raise _fail("memory refused: " + "; ".join(report.refused), EXIT_REFUSED)


@memory_app.command("forget")
def memory_forget(
    user: UserOption,
    yes: Annotated[bool, typer.Option("--yes", help="Do not ask for confirmation.")] = False,
) -> None:
    """Delete every memory of USER (memories and archive), and what is waiting to be
    written. Needs a worker."""
    settings = Settings()
    if not yes and not typer.confirm(f"Delete every memory of {user!r}?"):
        raise typer.Exit(EXIT_REFUSED)

    async def main() -> Any:
        hermes = await _connect(settings)
        return await _answer(hermes.forget_user(user), settings)

    report = _run(main, settings)
    out.print(f"deleted {report.deleted} memories of {escape(user)} ({report.pending_dropped} pending dropped)")


@memory_app.command("consolidate")
def memory_consolidate(
    user: Annotated[list[str] | None, typer.Option("--user", "-u", help="Only these users (repeatable).")] = None,
    as_json: JsonOption = False,
) -> None:
    """Run the consolidation now (the schedule runs it hourly): merge near-duplicates,
    resolve conflicts, expire, archive unused rows; print what changed. Needs a worker."""
    settings = Settings()

    async def main() -> Any:
        hermes = await _connect(settings)
        return await hermes.consolidate_memories(archive_after_days=settings.archive_after_days, users=user or None)

    report = _run(main, settings)
    if as_json:
        typer.echo(report.model_dump_json(indent=2))
        return
    out.print(
        f"{report.users} users: {report.merged} merged, {report.superseded} superseded, "
        f"{report.expired} expired, {report.archived} archived ({report.rows_before} -> {report.rows_after} rows)"
    )
    for line in report.details:
        out.print(f"  {escape(line)}", style="dim")


@memory_app.command("reembed")
def memory_reembed() -> None:
    """Embed every memory again with HERMES_MEMORY_EMBEDDER (after changing the model or
    its dimension). Stop the workers first; a stopped run is finished on the next start."""
    from hermes.memory.service import embedder_from_settings
    from hermes.memory.store import reembed

    settings = Settings()
    try:
        embedder = embedder_from_settings(settings)
    except HermesError as err:
        raise _fail(str(err), EXIT_UNAVAILABLE) from None
    done = reembed(settings.resolved_memory_uri, embedder, progress=lambda t, n, total: err_console.print(f"{t}: {n}/{total}", style="dim"))
    out.print(f"re-embedded with {embedder.model_id}: " + ", ".join(f"{t} {n} rows" for t, n in done.items()))


def main() -> None:
    """Entry point for ``python -m hermes.cli``."""
    app()


if __name__ == "__main__":
    main()
