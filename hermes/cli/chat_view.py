"""How a conversation shows on the console: :class:`ConsoleTurnView` prints a turn's
events with rich (``hermes send``, ``hermes demo``), :class:`ChatView` also asks the person
at the terminal to approve or reject pending tool calls (``hermes chat``), and
:func:`print_message` prints a stored transcript in the same style (``hermes show``).

A module of its own so that :mod:`hermes.cli.conversation` imports the console view (and
with it the client and Temporal's SDK) only when a chat starts, not for ``hermes --help``.
"""

from __future__ import annotations

import json
import signal
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.prompt import Confirm
from rich.text import Text

from hermes import names
from hermes.models import (
    DecisionRecord,
    Message,
    PendingApproval,
    ToolCall,
    ToolResult,
    ToolResultCode,
    TurnResult,
)
from hermes.sessions.live_view import TurnView, Verdict, tool_result_of

__all__ = ["ChatView", "ConsoleTurnView", "print_message", "print_reply", "print_user"]


def _arguments(arguments: dict[str, Any]) -> str:
    return json.dumps(arguments, ensure_ascii=False)


def _short(value: Any, limit: int = 160) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
    return text if len(text) <= limit else text[: limit - 1] + "…"


class ConsoleTurnView(TurnView):
    """Prints a turn's events with rich. Leaves approvals pending unless overridden.

    Args:
        console: where to print.
        session_id: used in the hint printed for a pending approval.
    """

    def __init__(self, console: Console, session_id: str, *, stream_text: bool = True):
        self.console = console
        self.session_id = session_id
        self.stream_text = stream_text
        """Print the model's text as it streams (``hermes send`` prints the reply alone, on stdout)."""
        self.streamed: dict[int, str] = {}
        """Text streamed per model step of the current turn."""
        self._open_step: int | None = None

    def turn_begins(self) -> None:
        self._close_line()
        self.streamed = {}

    def text(self, step: int, text: str) -> None:
        if not self.stream_text:
            return
        if self._open_step != step:
            self._close_line()
            self.console.print(Text("hermes › ", style="bold green"), end="", soft_wrap=True)
            self._open_step = step
        self.streamed[step] = self.streamed.get(step, "") + text
        # soft_wrap: the terminal wraps; rich would wrap each piece as if it began a line.
        self.console.print(Text(text), end="", soft_wrap=True)

    def text_discarded(self, step: int) -> None:
        if step in self.streamed:
            self._close_line()
            self.console.print(Text("  (the model's answer was cut off; it starts again)", style="dim"))
            del self.streamed[step]

    def _close_line(self) -> None:
        if self._open_step is not None:
            self.console.print()
            self._open_step = None

    def finish_reply(self, result: TurnResult) -> None:
        """Print ``result`` (as :func:`print_reply`), leaving out its reply if it already
        streamed whole; ready for the next turn."""
        streamed = self.streamed.get(max(self.streamed), "") if self.streamed else ""
        self._close_line()
        self.streamed = {}
        if streamed and streamed.strip() == result.reply.strip() and result.status == "completed":
            for warning in result.warnings:
                self.console.print(Text.assemble(("  ! ", "bold red"), warning))
            return
        print_reply(self.console, result)

    def tool_call(self, call: ToolCall) -> None:
        self._close_line()
        self.console.print(
            Text.assemble(("  → tool call ", "dim"), (call.name, "bold yellow"), " ", _arguments(call.arguments))
        )

    async def approval_needed(self, pending: PendingApproval) -> Verdict | None:
        self.print_pending(pending)
        if pending.action == "approve":
            self.console.print(Text(f"    needs an approver other than {pending.requester}", style="dim"))
        self.console.print(
            Text(
                f"    decide with: hermes approve {self.session_id} {pending.tool_call_id}"
                f"   (or: hermes reject ...)",
                style="dim",
            )
        )
        return None

    def print_pending(self, pending: PendingApproval) -> None:
        self._close_line()
        self.console.print(
            Text.assemble(
                ("  ⏸ approval needed ", "bold magenta"),
                (pending.tool_name, "bold yellow"),
                f" ({pending.permission} tool), tool_call_id {pending.tool_call_id}, "
                f"expires {pending.expires_at:%H:%M:%S} UTC",
            )
        )

    def decided(self, pending: PendingApproval, verdict: Verdict, record: DecisionRecord) -> None:
        word = "approved" if verdict.approved else "rejected"
        signal = names.APPROVE_TOOL_CALL if verdict.approved else names.REJECT_TOOL_CALL
        style = "green" if record.outcome == "applied" else "red"
        self.console.print(
            Text.assemble(
                (f"  {'✔' if verdict.approved else '✘'} {word} ", "bold " + style),
                f"by {verdict.approver} (signal {signal}): ",
                (record.outcome, style),
                (f" ({record.detail})" if record.detail else "", style),
            )
        )

    def tool_result(self, tool_call_id: str, name: str, result: ToolResult) -> None:
        self._close_line()
        code = int(result.code)
        style = "green" if code == ToolResultCode.OK else "red"
        detail = _short(result.data) if code == ToolResultCode.OK and result.data is not None else result.message
        self.console.print(
            Text.assemble(("  ← ", "dim"), (name, "yellow"), " ", (f"code {code}", style), " ", (_short(detail), "dim"))
        )

    def slow(self, elapsed_seconds: float) -> None:
        self.console.print(
            Text(
                f"  (no progress after {elapsed_seconds:.0f} s: no worker polls this session's task queue. "
                "Start one with `hermes dev` or `hermes worker`.)",
                style="yellow",
            )
        )


def print_user(console: Console, text: str, who: str = "you") -> None:
    """A user's message, as ``<who> › text``."""
    console.print(Text.assemble((f"{who} › ", "bold cyan"), text))


def print_reply(console: Console, result: TurnResult) -> None:
    """A turn's reply (with its status when not completed) and its warnings."""
    style = "bold green" if result.status == "completed" else "bold red"
    status = "" if result.status == "completed" else f" [{result.status}]"
    console.print(Text.assemble((f"hermes{status} › ", style), result.reply))
    for warning in result.warnings:
        console.print(Text.assemble(("  ! ", "bold red"), warning))


def print_message(console: Console, message: Message) -> None:
    """One transcript message, in the same style as a live conversation."""
    if message.role == "user":
        print_user(console, message.content or "", "user")
    elif message.role == "assistant":
        for call in message.tool_calls:
            console.print(
                Text.assemble(("  → tool call ", "dim"), (call.name, "bold yellow"), " ", _arguments(call.arguments))
            )
        if message.content:
            console.print(Text.assemble(("hermes › ", "bold green"), message.content))
    elif message.role == "tool":
        result = tool_result_of(message)
        if result is None:
            console.print(Text.assemble(("  ← ", "dim"), (message.name or "?", "yellow"), " ", _short(message.content or "")))
        else:
            ConsoleTurnView(console, "").tool_result(message.tool_call_id or "", message.name or "?", result)
    else:
        console.print(Text.assemble((f"{message.role} › ", "bold"), message.content or ""))



class ChatView(ConsoleTurnView):
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
