"""How ``hermes chat`` shows a turn: :class:`ChatView` asks the person at the terminal to
approve or reject pending tool calls.

A module of its own so that :mod:`hermes.cli.conversation` imports the console view (and
with it the client and Temporal's SDK) only when a chat starts, not for ``hermes --help``.
"""

from __future__ import annotations

import signal

from rich.console import Console
from rich.markup import escape
from rich.prompt import Confirm
from rich.text import Text

from hermes.demo import ConsoleTurnView, Verdict
from hermes.models import PendingApproval

__all__ = ["ChatView"]


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
