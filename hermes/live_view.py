"""What ``hermes chat``, ``hermes send`` and ``hermes demo`` show while a turn runs: the
:class:`TurnView` they implement, and :class:`TurnFollower`, which feeds it the session's
turn events (:mod:`hermes.events`) as they come."""

from __future__ import annotations

import asyncio
import contextlib
import json
from dataclasses import dataclass
from typing import Any

from hermes.client import HermesClient
from hermes.models import DecisionRecord, PendingApproval, ToolCall, ToolResult

__all__ = ["TurnFollower", "TurnView", "Verdict", "follow_turn"]


@dataclass(frozen=True)
class Verdict:
    """What a :class:`TurnView` decided about a pending approval."""

    approved: bool
    approver: str
    reason: str | None = None


class TurnView:
    """Receives the events of one turn from :func:`send_watched`. Override what you show."""

    def tool_call(self, call: ToolCall) -> None:
        """The model asked for a tool call (not run yet)."""

    async def approval_needed(self, pending: PendingApproval) -> Verdict | None:
        """A tool call waits for a human. Return a verdict to send it, or None to leave
        it pending (someone else decides, e.g. with ``hermes approve``)."""
        return None

    def decided(self, pending: PendingApproval, verdict: Verdict, record: DecisionRecord) -> None:
        """The verdict was sent; ``record.outcome`` says what the session did with it."""

    def tool_result(self, tool_call_id: str, name: str, result: ToolResult) -> None:
        """A tool call finished (or was denied) with ``result``."""

    def slow(self, elapsed_seconds: float) -> None:
        """The turn has shown no progress for ``elapsed_seconds`` and no worker polls its task queue."""

    def turn_begins(self) -> None:
        """A message is about to be sent: what follows belongs to its turn."""

    def text(self, step: int, text: str) -> None:
        """More of the model's text for model step ``step``, as it streams (turn events)."""

    def text_discarded(self, step: int) -> None:
        """The text shown for ``step`` so far is void: the step was started again."""


class TurnFollower:
    """Hands a turn's events (:mod:`hermes.events`) to a view while
    :func:`hermes.demo.send_watched` waits: the model's text as it streams
    (``view.text`` / ``view.text_discarded``), tool calls as they start and finish
    (``view.tool_call`` / ``view.tool_result``, each once: ``shown_calls`` and
    ``shown_results`` are shared with the transcript polling)."""

    def __init__(
        self, hermes: HermesClient, session_id: str, view: Any, after: str, shown_calls: set[str], shown_results: set[str]
    ):
        self.hermes, self.session_id, self.view, self.offset = hermes, session_id, view, after
        self.shown_calls, self.shown_results = shown_calls, shown_results
        self.finished: int | None = None
        self.finished_turns: set[int] = set()
        self.task = asyncio.ensure_future(self._run())

    async def _run(self) -> None:
        log_ = self.hermes.events
        assert log_ is not None
        async for batch in log_.follow(self.session_id, self.offset, poll_ms=200):
            for event in batch:
                if event.type == "text_delta" and event.step is not None:
                    self.view.text(event.step, event.data.get("text", ""))
                elif event.type == "attempt_discarded" and event.step is not None:
                    self.view.text_discarded(event.step)
                elif event.type == "tool_call_started" and event.data.get("tool_call_id") not in self.shown_calls:
                    # Shown as they happen, so a reply never streams before its tools' lines.
                    self.shown_calls.add(event.data["tool_call_id"])
                    self.view.tool_call(
                        ToolCall(tool_call_id=event.data["tool_call_id"], name=event.data.get("name", "?"),
                                 arguments=_parsed(event.data.get("arguments"), "arguments"))
                    )
                elif (
                    event.type == "tool_call_finished" and not event.data.get("retrying")
                    and event.data.get("tool_call_id") not in self.shown_results
                ):
                    self.shown_results.add(event.data["tool_call_id"])
                    result = ToolResult(
                        code=event.data.get("code", 0), message=event.data.get("message", ""),
                        data=_parsed(event.data["data"], "data") if "data" in event.data else None,
                    )
                    self.view.tool_result(event.data["tool_call_id"], event.data.get("name", "?"), result)
                elif event.type == "turn_finished" and event.turn is not None:
                    self.finished_turns.add(event.turn)
            if self.finished is not None and self.finished in self.finished_turns:
                return

    async def finish(self, turn: int) -> None:
        """Wait (at most 2 s) for the rest of turn ``turn``'s text."""
        self.finished = turn
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(asyncio.shield(self.task), 2.0)

    async def stop(self) -> None:
        self.task.cancel()
        with contextlib.suppress(BaseException):
            await self.task


def _parsed(preview: Any, key: str) -> Any:
    """An event's JSON preview as its value; a cut one (not JSON) as ``{key: preview}``."""
    if not isinstance(preview, str):
        return {} if preview is None else preview
    try:
        value = json.loads(preview)
    except ValueError:
        return {key: preview}
    return value if key == "data" or isinstance(value, dict) else {key: value}


async def follow_turn(
    hermes: HermesClient, session_id: str, view: Any, shown_calls: set[str], shown_results: set[str]
) -> TurnFollower | None:
    """A follower of the session's turn events from now on, or None without them."""
    log_ = hermes.events
    if log_ is None:
        return None
    try:
        after = await asyncio.wait_for(log_.last_offset(session_id), 2.0)
    except Exception:  # noqa: BLE001 - no live text: the reply shows whole
        return None
    return TurnFollower(hermes, session_id, view, after, shown_calls, shown_results)
