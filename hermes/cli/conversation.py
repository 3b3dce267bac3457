"""Commands that talk to a session: ``hermes chat`` and ``hermes send``.

A message that may have reached the session before a failure (an outage, Ctrl-C) is
never resent under a new id: ``send`` prints the command that resends it under the same
``--message-id``, and ``chat`` offers ``/retry``; either returns the first reply instead
of starting a second turn.
"""

from __future__ import annotations

import asyncio
import contextlib
import shlex
import sys
import uuid
from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape

from hermes.cli.errors import (
    EXIT_INTERRUPTED,
    EXIT_REFUSED,
    EXIT_UNAVAILABLE,
    CliError,
    explain,
    print_error,
    reported_errors,
)
from hermes.cli.output import err_console, out
from hermes.cli.root import JsonOption, UserOption, app, default_user
from hermes.cli.running import answer, connect, load_settings, quiet_orphaned_futures, run_command
from hermes.errors import (
    MessageRejectedError,
    SessionBusyError,
    SessionHaltedError,
    SessionNotFoundError,
    SessionUnavailableError,
)

if TYPE_CHECKING:
    from hermes.client import HermesClient
    from hermes.models import TurnResult
    from hermes.settings import Settings

__all__ = ["chat", "send"]


_UNCERTAIN_STATUSES = frozenset({"UNAVAILABLE", "DEADLINE_EXCEEDED", "CANCELLED", "UNKNOWN", "INTERNAL"})
"""Names of the ``RPCStatusCode`` of a request that may have reached the server before it failed."""


def _may_have_been_taken(err: BaseException) -> bool:
    """Whether a send that failed with ``err`` may still have been recorded by the session."""
    from temporalio.client import WorkflowUpdateRPCTimeoutOrCancelledError
    from temporalio.service import RPCError

    if isinstance(err, SessionUnavailableError):
        return err.may_have_been_taken
    if isinstance(err, WorkflowUpdateRPCTimeoutOrCancelledError):
        return True
    return isinstance(err, RPCError) and err.status.name in _UNCERTAIN_STATUSES


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
    from temporalio.client import WorkflowUpdateRPCTimeoutOrCancelledError

    if err is None:
        cause, code = "interrupted", EXIT_INTERRUPTED
    elif isinstance(err, WorkflowUpdateRPCTimeoutOrCancelledError):
        cause, code = (
            f"the session did not confirm the message in time: is a worker running for task queue "
            f"{settings.task_queue!r}? Start one with `hermes dev` or `hermes worker`",
            EXIT_UNAVAILABLE,
        )
    else:
        cause, code = explain(err, settings) or (str(err), EXIT_UNAVAILABLE)
    return (
        f"{cause}. The message may have been taken: to get its reply without starting a second "
        f"turn, rerun with the same message id: {resend}",
        code,
    )


@app.command()
def chat(
    session: Annotated[
        str | None, typer.Option("--session", "-s", help="Continue this session (default: a new one).")
    ] = None,
    user: UserOption = default_user(),
) -> None:
    """Talk to a session interactively. /quit exits, /close closes the session, /retry
    resends a message whose reply was lost in an outage (under the same id)."""
    settings = load_settings()
    _keep_undecodable_input()
    with reported_errors(settings), asyncio.Runner() as runner:
        runner.get_loop().set_exception_handler(quiet_orphaned_futures)
        hermes = runner.run(connect(settings))
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
    from hermes.cli.chat_view import ChatView, ConsoleTurnView, print_message
    from hermes.client import check_message_text
    from hermes.sessions.live_view import send_watched

    session_id = session or f"chat-{uuid.uuid4().hex[:12]}"
    existing = False
    if session:
        try:
            transcript = runner.run(answer(hermes.get_transcript(session_id, include_archived=True), settings, hermes))
            existing = True
        except SessionNotFoundError:
            pass
    if existing:
        out.rule(f"session {session_id}")
        for message in transcript:
            print_message(out, message)
        state = runner.run(answer(hermes.get_state(session_id), settings, hermes))
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
    view = ChatView(out, session_id, user)
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
                print_error("no message to retry")
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
            print_error(str(err))
            continue
        except SessionUnavailableError as err:
            explained, _ = explain(err, settings) or (str(err), EXIT_UNAVAILABLE)
            if err.may_have_been_taken:
                unconfirmed = (text, message_id)
                explained += "; the message may have been taken: type /retry to resend it under the same id"
            print_error(explained)
            continue
        unconfirmed = None
        view.finish_reply(result)


@app.command()
def send(
    session_id: Annotated[str, typer.Argument(help="The session (created if new).")],
    text: Annotated[str, typer.Argument(help="The message.")],
    user: UserOption = default_user(),
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
    settings = load_settings()
    # Known before sending, so that a send cut off by an outage can be repeated safely.
    client_message_id = message_id or f"msg-{uuid.uuid4()}"

    async def main() -> TurnResult:
        from hermes.cli.chat_view import ConsoleTurnView
        from hermes.client import check_message_text
        from hermes.sessions.live_view import send_watched

        check_message_text(text)
        hermes = await connect(settings)
        try:
            view = ConsoleTurnView(err_console, session_id, stream_text=False)
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

    result = run_command(main, settings)
    if as_json:
        typer.echo(result.model_dump_json(indent=2))
    else:
        typer.echo(result.reply)
    if result.status != "completed":
        raise typer.Exit(EXIT_REFUSED)
