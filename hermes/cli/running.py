"""How a command runs its async part: one event loop, Ctrl-C, a quiet client connection.

:func:`run_command` is the bridge from a synchronous Typer command to the client: it
runs a coroutine in a fresh loop under :func:`hermes.cli.errors.reported_errors`, so
every command reports failures and interruptions the same way.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import signal
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from hermes.cli.errors import EXIT_INTERRUPTED, EXIT_UNAVAILABLE, CliError, fail, reported_errors
from hermes.cli.output import err_console

if TYPE_CHECKING:
    from temporalio.runtime import Runtime

    from hermes.client import HermesClient
    from hermes.settings import Settings

__all__ = [
    "QUERY_TIMEOUT_SECONDS",
    "answer",
    "connect",
    "load_settings",
    "worker_hint",
    "quiet_orphaned_futures",
    "quiet_runtime",
    "run_command",
    "console_logging",
]

QUERY_TIMEOUT_SECONDS = 15.0
"""How long a command waits for a session to answer a query (a worker must be running)."""
SLOW_QUERY_EXTRA_SECONDS = 45.0
"""How much longer a command waits for a session's answer when a worker polls its task
queue (the session is slow, not unserved: a starved or busy worker)."""

_T = TypeVar("_T")

log = logging.getLogger("hermes.cli")


def load_settings() -> Settings:
    """The settings of a command: :class:`hermes.settings.Settings` from the environment.

    Imported here, when a command runs, so that ``hermes --help`` does not load pydantic
    models or Temporal's SDK.

    Raises:
        pydantic.ValidationError: a bad ``HERMES_*`` variable or ``.env`` entry (the CLI
            root prints one line per setting).
    """
    from hermes.settings import Settings

    return Settings()


def quiet_orphaned_futures(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    """Loop exception handler: the Temporal SDK leaves the update future of a failed
    update-with-start (e.g. a closed session) unretrieved; the error was already reported
    to the user, so asyncio's "exception was never retrieved" traceback is only noise."""
    if "never retrieved" in str(context.get("message", "")):
        log.debug("unretrieved future: %s", context.get("exception"))
        return
    loop.default_exception_handler(context)


class _OneLine(logging.Formatter):
    """``warning: <message> (<ExceptionType>: <text>)``: a library's warning on the
    terminal, without its traceback (the log file keeps it)."""

    def format(self, record: logging.LogRecord) -> str:
        text = f"{record.levelname.lower()}: {record.getMessage()}"
        exc = record.exc_info[1] if record.exc_info else None
        if exc is not None:
            detail = str(exc).splitlines()[0] if str(exc) else ""
            text += f" ({type(exc).__name__}: {detail})" if detail else f" ({type(exc).__name__})"
        return text


class _LazyFileHandler(logging.FileHandler):
    """A file handler that makes its directory only when the first record comes."""

    def _open(self):  # type: ignore[no-untyped-def]
        Path(self.baseFilename).parent.mkdir(parents=True, exist_ok=True)
        return super()._open()


def not_a_cancelled_attempt(record: logging.LogRecord) -> bool:
    """False for the SDK's "Completing activity as failed" of an attempt that was
    cancelled (a heartbeat timeout on a loaded machine, a turn cancelled): Temporal starts
    it again or the session reports the outcome, so on the terminal it only reads as a
    failure of the demo (the log file still has it)."""
    if record.name.startswith("temporalio.activity") and record.getMessage().startswith("Completing activity as failed"):
        from temporalio.exceptions import CancelledError

        err = record.exc_info[1] if record.exc_info else None
        return not isinstance(err, (asyncio.CancelledError, CancelledError))
    return True


def console_logging(log_file: Path | None = None) -> None:
    """Logging for a command's own process, unless the user configured logging already.

    On the terminal: warnings and errors, one line each, never a traceback (an activity
    retried under load logs one, and a user of ``hermes demo`` should not read it as a
    failure); the Temporal SDK core's warnings among them, plain
    (:func:`hermes.infra.sdk_logs.install_default_runtime`). With ``log_file`` (commands that run a worker in their process): everything
    from INFO, tracebacks included, appended there.
    """
    from hermes.infra.sdk_logs import install_default_runtime

    # The SDK core's own warnings too, as plain lines of this logging (not its ANSI colours).
    install_default_runtime()
    root = logging.getLogger()
    if root.handlers:
        return
    console = logging.StreamHandler(sys.stderr)
    console.setLevel(logging.WARNING)
    console.setFormatter(_OneLine())
    console.addFilter(not_a_cancelled_attempt)
    root.addHandler(console)
    if log_file is not None:
        detailed = _LazyFileHandler(log_file, encoding="utf-8", delay=True)
        detailed.setLevel(logging.INFO)
        detailed.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        root.addHandler(detailed)
        root.setLevel(logging.INFO)


def run_command(main: Callable[[], Awaitable[_T]], settings: Settings, *, log_file: Path | None = None) -> _T:
    """Run ``main()`` in a fresh event loop. SIGINT and SIGTERM cancel it (once: a second
    signal does not interrupt the clean-up); cancellation exits with 130 unless ``main``
    handled it (see :func:`hermes.infra.process.wait_until_interrupted`). Logging goes through
    :func:`console_logging` (``log_file``: where the full log of an in-process worker goes)."""
    console_logging(log_file)
    signals: list[int] = []

    async def guarded() -> _T:
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(quiet_orphaned_futures)
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

    with reported_errors(settings):
        try:
            return asyncio.run(guarded())
        except (asyncio.CancelledError, KeyboardInterrupt):
            raise fail("interrupted", EXIT_INTERRUPTED) from None


async def answer(
    awaitable: Awaitable[_T],
    settings: Settings,
    hermes: HermesClient | None = None,
    *,
    timeout_seconds: float = QUERY_TIMEOUT_SECONDS,
) -> _T:
    """Await a query; a session only answers while a worker serves its task queue.

    Raises:
        CliError: no answer within ``timeout_seconds``; the message says whether a worker
            polls the task queue (asked of Temporal through ``hermes``).
    """
    task = asyncio.ensure_future(awaitable)
    waited = timeout_seconds
    try:
        return await asyncio.wait_for(asyncio.shield(task), timeout_seconds)
    except asyncio.TimeoutError:
        workers = None if hermes is None else await hermes.count_workers()
        if workers:
            # A worker polls: the session is slow (a starved or busy worker), not unserved;
            # a query is cheap to wait for, and giving up adds nothing but a retry.
            waited += SLOW_QUERY_EXTRA_SECONDS
            try:
                return await asyncio.wait_for(asyncio.shield(task), SLOW_QUERY_EXTRA_SECONDS)
            except asyncio.TimeoutError:
                pass
        task.cancel()
        hint = await worker_hint(hermes, settings)
        raise CliError(f"the session did not answer within {waited:g} s: {hint}", EXIT_UNAVAILABLE) from None


async def worker_hint(hermes: HermesClient | None, settings: Settings) -> str:
    """Why a session may not have answered, from the pollers of its task queue.

    "Is a worker running?" only when Temporal lists none (or cannot say); with a worker
    polling, the session is slow, not unserved.
    """
    workers = None if hermes is None else await hermes.count_workers()
    queue = settings.task_queue
    if workers is None:
        return f"is a worker running for task queue {queue!r}? Start one with `hermes dev` or `hermes worker`"
    if workers == 0:
        return f"no worker polls task queue {queue!r}: start one with `hermes dev` or `hermes worker`"
    return (
        f"{workers} worker(s) poll task queue {queue!r}, so the session is slow rather than unserved "
        "(a long workflow task or a loaded machine); try again"
    )


@functools.cache
def quiet_runtime() -> Runtime:
    """The Temporal runtime of the commands' client connections: the SDK's Rust core logs
    only errors. By default it prints a ``WARN ... gRPC call ... retried N times`` line on
    stderr for every retry while a server is unreachable; a command reports the failure
    itself, in one line. ``hermes dev`` and ``hermes worker`` keep the default runtime."""
    from temporalio.runtime import Runtime, TelemetryConfig

    from hermes.infra.sdk_logs import core_logging

    return Runtime(telemetry=TelemetryConfig(logging=core_logging("ERROR")))


async def connect(settings: Settings) -> HermesClient:
    """A client of the settings' Temporal and Redis, on :func:`quiet_runtime`."""
    from hermes.client import HermesClient

    return await HermesClient.connect(settings, runtime=quiet_runtime())
