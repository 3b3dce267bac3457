"""Session commands: ``hermes sessions`` (the Redis index), ``hermes show``, ``hermes close`` and
``hermes repair``."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Annotated, Any

import typer
from rich.markup import escape

from hermes.cli.errors import CliError
from hermes.cli.output import Column, out, print_fields, print_table
from hermes.cli.root import JsonOption, UserOption, app, default_user
from hermes.cli.running import answer, connect, load_settings, run_command
from hermes.errors import SessionClosedError, SessionNotFoundError

__all__ = ["close", "repair", "sessions", "show"]


@app.command()
def sessions(
    user: UserOption = default_user(),
    as_json: JsonOption = False,
    limit: Annotated[int, typer.Option("--limit", min=1, max=1000, help="At most this many.")] = 50,
    rebuild: Annotated[
        bool, typer.Option("--rebuild", help="First add sessions that Temporal knows and the Redis index lacks.")
    ] = False,
) -> None:
    """List a user's sessions, most recently active first (from the Redis index)."""
    settings = load_settings()

    async def main() -> list[Any]:
        hermes = await connect(settings)
        try:
            return await hermes.list_sessions(user, limit=limit, rebuild=rebuild)
        finally:
            await hermes.redis.aclose()

    entries = run_command(main, settings)
    if as_json:
        typer.echo(json.dumps([e.model_dump(mode="json") for e in entries], ensure_ascii=False, indent=2))
        return
    if not entries:
        out.print(f"No sessions for user {escape(user)}.")
        return
    print_table(
        [
            Column("session id", no_wrap=True),
            Column("status", overflow="ellipsis"),
            Column("turns", overflow="ellipsis", justify="right"),
            Column("last active (UTC)", overflow="ellipsis"),
            Column("title", overflow="ellipsis"),
        ],
        (
            (
                escape(entry.session_id),
                entry.status,
                str(entry.turn_count),
                f"{entry.last_active_at:%Y-%m-%d %H:%M:%S}",
                escape(entry.title),
            )
            for entry in entries
        ),
        title=f"sessions of {escape(user)}",
    )


@app.command()
def show(
    session_id: Annotated[str, typer.Argument(help="The session.")],
    as_json: JsonOption = False,
) -> None:
    """Show a session: state, pending approvals, decisions, transcript and trace."""
    settings = load_settings()

    async def main() -> tuple[Any, Any, Any]:
        hermes = await connect(settings)
        try:
            state = await answer(hermes.get_state(session_id), settings, hermes)
            transcript = await answer(hermes.get_transcript(session_id, include_archived=True), settings, hermes)
            trace = await answer(hermes.get_trace(session_id), settings, hermes)
            return state, transcript, trace
        except SessionNotFoundError:
            raise CliError(f"no session {session_id!r} in namespace {settings.temporal_namespace!r}") from None
        finally:
            await hermes.redis.aclose()

    state, transcript, trace = run_command(main, settings)
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
    print_fields(
        [
            ("user", escape(state.user_id)),
            ("channel", escape(state.channel)),
            ("status", state.status + (" (turn running)" if state.busy else "")),
            ("title", escape(state.title)),
            ("created", f"{state.created_at:%Y-%m-%d %H:%M:%S} UTC"),
            ("last active", f"{state.last_active_at:%Y-%m-%d %H:%M:%S} UTC"),
            ("turns", str(state.turn_count)),
            ("context tokens", f"~{state.token_estimate}"),
            ("tokens used", token_usage(state)),
            ("history", f"{state.history_length} events (run {state.run_index})"),
        ]
    )

    out.print()
    if state.pending_approvals:
        print_table(
            ("tool_call_id", "tool", "permission", "arguments", "expires (UTC)"),
            (
                (
                    escape(p.tool_call_id),
                    escape(p.tool_name),
                    p.permission,
                    escape(json.dumps(p.arguments, ensure_ascii=False)),
                    f"{p.expires_at:%H:%M:%S}",
                )
                for p in state.pending_approvals
            ),
            title="pending approvals",
        )
        out.print(f"decide with: hermes approve {escape(session_id)} TOOL_CALL_ID  (or hermes reject)", style="dim")
    else:
        out.print("pending approvals: none")
    if state.decisions:
        print_table(
            ("tool_call_id", "verdict", "approver", "outcome", "at (UTC)"),
            (
                (
                    escape(d.tool_call_id),
                    "approved" if d.approved else "rejected",
                    escape(d.approver),
                    d.outcome,
                    f"{d.at:%H:%M:%S}",
                )
                for d in state.decisions
            ),
            title="decisions",
        )

    from hermes.cli.chat_view import print_message

    out.rule("transcript")
    for message in transcript:
        print_message(out, message)

    out.rule("trace")
    numeric = ("step", "turn", "latency ms", "tokens")
    print_table(
        [
            Column(c, overflow="ellipsis", justify="right" if c in numeric else "left")
            for c in ("step", "turn", "action", "tool", "provider", "latency ms", "tokens", "status")
        ],
        (
            (
                str(t.step),
                str(t.turn),
                t.action_type,
                escape(t.tool_name or ""),
                escape(t.provider),
                f"{t.latency_ms:.0f}",
                str(t.tokens),
                escape(t.status),
            )
            for t in trace
        ),
    )


@app.command()
def close(session_id: Annotated[str, typer.Argument(help="The session.")]) -> None:
    """Close a session: its pending approvals are denied, new messages refused (exit 1
    when it is closed already or does not exist)."""
    settings = load_settings()

    async def main() -> None:
        hermes = await connect(settings)
        try:
            await hermes.close(session_id)
        except SessionNotFoundError:
            raise CliError(f"no session {session_id!r} in namespace {settings.temporal_namespace!r}") from None
        except SessionClosedError:
            raise CliError(f"session {session_id!r} is closed already; nothing changed") from None
        finally:
            await hermes.redis.aclose()

    run_command(main, settings)
    typer.echo(f"closed: session {session_id} (its pending approvals are denied, new messages refused)")


@app.command()
def repair(session_id: Annotated[str, typer.Argument(help="The session.")]) -> None:
    """Mend a session whose workflow task keeps failing because its history does not replay
    where an update (a message) was accepted: reset it to the task before (later messages
    and decisions are added again). Any other session is left as it is."""
    settings = load_settings()

    async def main() -> Any:
        from temporalio.service import RPCError, RPCStatusCode  # not at import: `hermes --help` stays fast

        from hermes.sessions.repair import repair_session
        from workflows.session import SessionWorkflow

        hermes = await connect(settings)
        try:
            return await repair_session(hermes.client, session_id, [SessionWorkflow])
        except RPCError as err:
            if err.status == RPCStatusCode.NOT_FOUND:
                raise CliError(f"no session {session_id!r} in namespace {settings.temporal_namespace!r}") from None
            raise
        finally:
            await hermes.redis.aclose()

    result = run_command(main, settings)
    typer.echo(f"{'repaired' if result.reset else 'unchanged'}: session {session_id}: {result.reason}")


def token_usage(state: Any) -> str:
    """The session's token use against its budgets, for ``hermes show``: ``1,234`` or
    ``1,234 of 50,000 (session); user today 8,000 of 100,000``."""
    text = f"{state.tokens_used:,}" + (f" of {state.token_budget:,} (session budget)" if state.token_budget else "")
    if state.user_daily_token_budget:
        today = datetime.now(timezone.utc).date().isoformat()
        used = state.user_day_tokens if state.user_day == today else 0
        text += f"; user today {used:,} of {state.user_daily_token_budget:,} (daily budget, UTC)"
    return text
