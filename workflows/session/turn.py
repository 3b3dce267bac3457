"""How a turn ends: the ways it stops early and what the user is told each time.

A turn is the agent loop (model -> tool calls -> results -> model) until a final answer,
``max_iterations`` steps, or one of the stops below. Each stop is an exception raised
inside the loop and turned into a status and a reply here; the workflow then closes the
open tool calls (never an orphan) and keeps the reply as a notice in the transcript.
Plain Python; nothing here knows of Temporal.
"""

from __future__ import annotations

from hermes.models import SessionConfig, ToolCall, ToolResult, ToolSpec

from workflows.session.tool_step import ask_for_arguments


class TurnStop(Exception):
    """A turn stops before a final answer."""

    status = "completed"

    def reply(self, cfg: SessionConfig) -> str:
        raise NotImplementedError


class TurnCancelled(TurnStop):
    """The cancel_turn signal (or a cancelled approval)."""

    status = "cancelled"

    def reply(self, cfg: SessionConfig) -> str:
        return "This turn was cancelled."


class ContextTooLarge(TurnStop):
    """The context cannot be sent: the turn alone is over the budget, or the provider
    refused it as too long even after compaction."""

    status = "context_too_large"

    def reply(self, cfg: SessionConfig) -> str:
        return f"I cannot send this to the model: {self}. Ask for less at once, or start a new session."


class ModelFailed(TurnStop):
    """The model call failed after its retries."""

    status = "model_error"

    def reply(self, cfg: SessionConfig) -> str:
        return f"The model could not answer ({self}). Your message is kept; send it again to retry."


class SessionClosedMidTurn(TurnStop):
    """The close signal came while the turn ran (runs with the stop-turn-on-close patch)."""

    status = "closed"

    def reply(self, cfg: SessionConfig) -> str:
        return "The session was closed while this turn ran; it stopped here."


class ArgumentsExhausted(TurnStop):
    """The model got a tool's arguments wrong more than ``max_argument_retries`` times."""

    status = "invalid_arguments"

    def __init__(self, call: ToolCall, result: ToolResult, spec: ToolSpec | None):
        self.call, self.result, self.spec = call, result, spec
        super().__init__(result.message)

    def reply(self, cfg: SessionConfig) -> str:
        return ask_for_arguments(cfg, self.call, self.result, self.spec)


class BudgetExceeded(TurnStop):
    """The session or the user's day has used its token budget: no model call is started."""

    status = "budget_exceeded"

    def __init__(self, *, used: int, budget: int, daily: bool):
        self.used, self.budget, self.daily = used, budget, daily
        super().__init__(f"{used} of {budget} tokens")

    def reply(self, cfg: SessionConfig) -> str:
        if self.daily:
            return (
                f"You have used today's token budget ({self.used:,} of {self.budget:,} tokens, all your sessions). "
                "It starts again at 00:00 UTC; your message is kept."
            )
        return (
            f"This session has used its token budget ({self.used:,} of {self.budget:,} tokens), so it stops here. "
            "Start a new session, or ask the operator to raise the budget."
        )


def budget_stop(cfg: SessionConfig, *, tokens_used: int, user_day: str, user_day_tokens: int, today: str) -> BudgetExceeded | None:
    """Why no model call may start now, or None (see ``SessionConfig.token_budget`` and
    ``user_daily_token_budget``). The day's count is the newest a model call reported for
    ``user_day``; on another day nothing is counted yet."""
    if cfg.token_budget is not None and tokens_used >= cfg.token_budget:
        return BudgetExceeded(used=tokens_used, budget=cfg.token_budget, daily=False)
    daily = cfg.user_daily_token_budget
    if daily is not None and user_day == today and user_day_tokens >= daily:
        return BudgetExceeded(used=user_day_tokens, budget=daily, daily=True)
    return None


CLOSED_BEFORE_TURN = "The session was closed before this message could be answered."
EMPTY_ANSWER = "The model returned an empty answer. Ask again, or rephrase the question."


def foreign_sender(session_id: str, sender: str) -> str:
    """Why a message from ``sender``, not the session's user, is refused (the update
    validator's ``SessionForbiddenError``; the session's own user is not named)."""
    return f"session {session_id!r} takes messages only from its own user; the message from {sender!r} was not taken"


def max_iterations_reply(cfg: SessionConfig) -> str:
    return (
        f"I stopped after {cfg.max_iterations} model/tool steps without reaching "
        "a final answer. Tell me how to continue, or ask a narrower question."
    )


def title_of(text: str) -> str:
    """A session's title: its first message, whitespace collapsed, 60 characters."""
    return " ".join(text.split())[:60]
