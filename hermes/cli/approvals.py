"""Approval commands: ``hermes approve``, ``hermes reject`` and ``hermes approvals``."""

from __future__ import annotations

import asyncio
import json
from typing import Annotated, Any

import typer
from rich.markup import escape

from hermes.cli.errors import EXIT_REFUSED, EXIT_UNAVAILABLE, CliError, fail
from hermes.cli.output import Column, out, print_table
from hermes.cli.root import JsonOption, app, default_user
from hermes.cli.running import QUERY_TIMEOUT_SECONDS, answer, connect, load_settings, run_command, worker_hint
from hermes.errors import SessionClosedError, SessionNotFoundError

__all__ = ["approvals", "approve", "reject"]


def _decide_command(session_id: str, tool_call_id: str, *, approved: bool, approver: str, reason: str | None) -> None:
    settings = load_settings()

    async def main() -> tuple[Any, list[str]]:
        from hermes.sessions.approvals import decide

        hermes = await connect(settings)
        try:
            try:
                record = await decide(
                    hermes, session_id, tool_call_id, approved=approved, approver=approver, reason=reason,
                    timeout_seconds=QUERY_TIMEOUT_SECONDS,
                )
            except asyncio.TimeoutError:
                hint = await worker_hint(hermes, settings)
                raise CliError(
                    f"the session did not record the decision within {QUERY_TIMEOUT_SECONDS:.0f} s: {hint}",
                    EXIT_UNAVAILABLE,
                ) from None
            pending = [p.tool_call_id for p in await answer(hermes.get_pending_approvals(session_id), settings, hermes)]
            return record, pending
        except SessionNotFoundError:
            raise CliError(f"no session {session_id!r} in namespace {settings.temporal_namespace!r}") from None
        except SessionClosedError:
            raise CliError(
                f"session {session_id!r} is closed: it takes no decision (its pending tool calls were denied "
                "when it closed); nothing changed"
            ) from None
        finally:
            await hermes.redis.aclose()

    record, pending = run_command(main, settings)
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
    raise fail(f"{record.outcome}: {detail}", EXIT_REFUSED)


ApproverOption = Annotated[
    str, typer.Option("--approver", "-a", envvar="HERMES_USER", help="Who decides (for the audit record).")
]
ReasonOption = Annotated[str | None, typer.Option("--reason", "-r", help="Why (shown to the model on a rejection).")]


@app.command()
def approve(
    session_id: Annotated[str, typer.Argument(help="The session.")],
    tool_call_id: Annotated[str, typer.Argument(help="From `hermes show` or the chat prompt.")],
    approver: ApproverOption = default_user(),
    reason: ReasonOption = None,
) -> None:
    """Approve a pending tool call and report what the session did with the decision."""
    _decide_command(session_id, tool_call_id, approved=True, approver=approver, reason=reason)


@app.command()
def reject(
    session_id: Annotated[str, typer.Argument(help="The session.")],
    tool_call_id: Annotated[str, typer.Argument(help="From `hermes show` or the chat prompt.")],
    approver: ApproverOption = default_user(),
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
    settings = load_settings()

    async def main() -> list[Any]:
        hermes = await connect(settings)
        try:
            if audit:
                return await hermes.get_approval_audit(session_id=session, limit=limit)
            return await answer(hermes.list_pending_approvals(user_id=user), settings, hermes)
        finally:
            await hermes.redis.aclose()

    if audit:
        entries = run_command(main, settings)
        if as_json:
            typer.echo(json.dumps([e.model_dump(mode="json") for e in entries], ensure_ascii=False, indent=2))
            return
        if not entries:
            out.print("No approval audit entries.")
            return
        print_table(
            ("at (UTC)", "session", "tool call id", "tool", "event", "by", "outcome", "detail"),
            (
                (
                    f"{e.at:%Y-%m-%d %H:%M:%S}", escape(e.session_id), escape(e.tool_call_id), escape(e.tool_name),
                    e.event, escape((e.approver if e.event == "decision" or e.approver else e.requester) or ""),
                    escape(e.outcome), escape(e.detail or e.reason or ""),
                )
                for e in entries
            ),
            title="approval audit",
        )
        return
    pending = run_command(main, settings)
    if as_json:
        typer.echo(json.dumps([p.model_dump(mode="json") for p in pending], ensure_ascii=False, indent=2))
        return
    if not pending:
        out.print("No pending approvals.")
        return
    columns: list[Column | str] = ["session", "tool call id", "tool", "permission", "requester", "expires (UTC)", "arguments"]
    if approver is not None:
        columns.append(Column("you may decide", overflow="ellipsis"))
    rows = []
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
        rows.append(row)
    print_table(columns, rows, title="pending approvals")
