"""The CLI's one error path: exit codes, and how an expected failure is printed.

An expected failure prints one line starting with ``error:`` on stderr, never a
traceback, and exits with:

* :data:`EXIT_REFUSED` (1): Hermes refused the request or a check failed;
* :data:`EXIT_UNAVAILABLE` (2): the servers could not be reached or started, or the
  configuration is wrong;
* :data:`EXIT_INTERRUPTED` (130): interrupted (Ctrl-C) before the command finished.

A command raises :class:`CliError` (or returns :func:`fail`'s ``typer.Exit``) for a
failure it finds itself; :func:`explain` maps the library's exceptions (``HermesError``
and its subclasses, ``ConfigError``, Temporal's RPC and update errors, Redis connection
errors) to a line and a code, and :func:`reported_errors` applies it around a command's
body; :func:`failing_on` reports a chosen exception's own message with a chosen code.
An unexpected exception is not caught here: it is printed as a traceback and exits 1
(see :class:`hermes.cli.root.HermesTyper`).
"""

from __future__ import annotations

import contextlib
import re
import sys
from collections.abc import Iterator

from typing import TYPE_CHECKING

import typer
from rich.markup import escape

from hermes.cli.output import err_console
from hermes.errors import (
    ConfigError,
    MessageFailedError,
    MessageRejectedError,
    SessionBusyError,
    SessionClosedError,
    SessionForbiddenError,
    SessionHaltedError,
    SessionNotFoundError,
    SessionUnavailableError,
    TemporalRequestError,
)

# The CLI root imports this module; Temporal's SDK, pydantic and the settings are imported
# where a command needs them, so `hermes --help` starts without them (tests/test_cli_startup.py).
if TYPE_CHECKING:
    from pydantic import ValidationError

    from hermes.settings import Settings

__all__ = [
    "EXIT_INTERRUPTED",
    "EXIT_REFUSED",
    "EXIT_UNAVAILABLE",
    "CliError",
    "explain",
    "fail",
    "failing_on",
    "hide_password",
    "print_error",
    "print_settings_error",
    "reported_errors",
]

EXIT_REFUSED = 1
EXIT_UNAVAILABLE = 2
EXIT_INTERRUPTED = 130


class CliError(Exception):
    """An expected failure: printed as one line, exits with ``code``."""

    def __init__(self, message: str, code: int = EXIT_REFUSED):
        self.message = message
        self.code = code
        super().__init__(message)


def hide_password(url: str) -> str:
    """``url`` safe to print: the credentials before ``@`` and every query parameter's
    value replaced by ``***`` (``redis://:pw@host/0?password=pw`` and
    ``https://host/v1?api-key=k`` carry secrets there).

    Args:
        url: any URL or ``host:port``; text that is not a URL comes back unchanged.

    Returns:
        e.g. ``redis://***@host:6379/0`` or ``https://host/v1?api-key=***``.
    """
    url = re.sub(r"://[^@/]*@", "://***@", url)
    return re.sub(r"([?&][^=&#]*)=[^&#]*", r"\1=***", url)


def connect_reason(text: str) -> str:
    """Why a connection failed, in a few words (``connection refused``, ``timed out``, or
    the end of ``text``)."""
    if "Connection refused" in text or "ConnectionRefused" in text or text.startswith("Error 111 "):
        return "connection refused"
    if "timed out" in text.lower() or "deadline" in text.lower():
        return "timed out"
    return text.split(": ", 1)[-1][:200]


def explain(err: BaseException, settings: Settings) -> tuple[str, int] | None:
    """The one-line message and exit code of an expected failure, or None.

    Args:
        err: what a command raised.
        settings: for the addresses and settings named in the message.

    Returns:
        (message without the ``error:`` prefix, exit code); None for an unexpected error.
    """
    import redis.exceptions
    from temporalio.client import (
        WorkflowQueryFailedError,
        WorkflowUpdateFailedError,
        WorkflowUpdateRPCTimeoutOrCancelledError,
    )
    from temporalio.service import RPCError, RPCStatusCode

    from hermes.infra.stack import StackAlreadyRunning, StackError

    temporal = settings.resolved_temporal_address
    if isinstance(err, CliError):
        return err.message, err.code
    if isinstance(err, MessageRejectedError):
        return f"message rejected: {err}", EXIT_REFUSED
    if isinstance(
        err, (SessionClosedError, SessionBusyError, SessionHaltedError, SessionNotFoundError, SessionForbiddenError)
    ):
        return str(err), EXIT_REFUSED
    if isinstance(err, SessionUnavailableError):
        return (
            f"Temporal at {temporal} (or the session's worker) did not answer within "
            f"{settings.client_retry_seconds:g} s (HERMES_CLIENT_RETRY_SECONDS; last error: {err.last_error})",
            EXIT_UNAVAILABLE,
        )
    if isinstance(err, TemporalRequestError):
        if "no mapping defined for search attribute" in str(err):
            return _unregistered_search_attributes(str(err), temporal)
        return str(err), EXIT_REFUSED
    if isinstance(err, MessageFailedError):
        return f"the session failed the message: {err.reason}", EXIT_REFUSED
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
            f"cannot connect to Temporal at {temporal} ({connect_reason(str(err))}): start the embedded "
            "stack with `hermes dev`, or set TEMPORAL_ADDRESS to your server",
            EXIT_UNAVAILABLE,
        )
    if isinstance(err, (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError)):
        return (
            f"cannot connect to Redis at {hide_password(settings.resolved_redis_url)} "
            f"({connect_reason(str(err))}): start the embedded stack with `hermes dev`, or set REDIS_URL",
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
            return _unregistered_search_attributes(err.message, temporal)
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


def fail(message: str, code: int) -> typer.Exit:
    """Print ``error: <message>`` on stderr; returns the ``typer.Exit(code)`` to raise."""
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(code)


@contextlib.contextmanager
def reported_errors(settings: Settings) -> Iterator[None]:
    """Turn expected failures into one line on stderr and an exit code."""
    try:
        yield
    except (typer.Exit, typer.Abort):
        raise
    except Exception as err:  # noqa: BLE001 - unknown ones are re-raised below
        explained = explain(err, settings)
        if explained is None:
            raise
        raise fail(*explained) from None


@contextlib.contextmanager
def failing_on(*errors: type[BaseException], code: int) -> Iterator[None]:
    """Report one of ``errors`` raised inside as ``error: <its message>`` and exit ``code``.

    For failures whose own message already says what is wrong (a tool file, an MCP
    config, a memory store): no prefix is added.
    """
    try:
        yield
    except errors as err:
        raise fail(str(err), code) from None


def print_error(message: str) -> None:
    """Print ``error: <message>`` in red on stderr and carry on (``hermes chat``'s loop)."""
    err_console.print(f"error: {escape(message)}", style="red")


def print_settings_error(err: ValidationError) -> int:
    """Print one ``error:`` line per bad setting (``HERMES_*`` variable or ``.env``).

    Returns:
        The exit code: :data:`EXIT_UNAVAILABLE`.
    """
    for problem in err.errors(include_url=False):
        where = ".".join(str(p) for p in problem.get("loc", ()))
        got = problem.get("input")
        print(f"error: setting HERMES_{where.upper()}: {problem.get('msg')} (got {got!r})", file=sys.stderr)
    return EXIT_UNAVAILABLE


def _unregistered_search_attributes(message: str, temporal: str) -> tuple[str, int]:
    """The message and exit code for a server without Hermes' search attributes."""
    return (
        f"{message}: the Hermes search attributes are not registered on {temporal}; "
        "`hermes dev` and `hermes worker` register them on start",
        EXIT_UNAVAILABLE,
    )
