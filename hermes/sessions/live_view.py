"""What ``hermes chat``, ``hermes send`` and ``hermes demo`` show while a turn runs: the
:class:`TurnView` they implement; :func:`send_watched`, which sends one message and tells
the view about its tool calls, approvals and results while the turn runs (by polling the
session's queries); and :class:`TurnFollower`, which feeds the view the session's turn
events (:mod:`hermes.content.events`) as they come."""

from __future__ import annotations

import asyncio
import contextlib
import json
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from hermes.client import HermesClient
from hermes.errors import HermesError, SessionNotFoundError
from hermes.infra.connections import stop_task
from hermes.models import (
    DecisionRecord,
    Message,
    PendingApproval,
    ToolCall,
    ToolResult,
    TurnResult,
)
from hermes.sessions.approvals import decide

__all__ = ["TurnFollower", "TurnView", "Verdict", "follow_turn", "send_watched", "tool_result_of"]

_POLL_SECONDS = 0.1
_POLL_QUERY_TIMEOUT_SECONDS = 5.0
_SLOW_TURN_SECONDS = 10.0
"""After this long with no sign of a worker, :func:`send_watched` tells the view."""
_STOP_WAIT_SECONDS = 5.0
"""How long :meth:`TurnFollower.stop` waits for the follower's Redis read to end (one read
blocks 0.2 s; a Redis that does not answer fails it within the 5 s socket timeout)."""


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
    """Hands a turn's events (:mod:`hermes.content.events`) to a view while
    :func:`send_watched` waits: the model's text as it streams
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
        """End the follower: within one read (0.2 s), at most :data:`_STOP_WAIT_SECONDS`
        (a cancel redis-py swallowed kept ``hermes send`` from exiting, seen in CI;
        :meth:`EventLog.follow` now ends on it)."""
        await stop_task(self.task, wait_seconds=_STOP_WAIT_SECONDS, what=f"the turn event follower of {self.session_id}")


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


# --------------------------------------------------------------------------- sending a watched message


def tool_result_of(message: Message) -> ToolResult | None:
    """The :class:`ToolResult` a ``tool`` message carries, or None when its content was cut
    (the turn's :class:`TurnResult` has the full result)."""
    try:
        return ToolResult.model_validate_json(message.content or "")
    except ValidationError:
        return None


async def _known_tool_call_ids(hermes: HermesClient, session_id: str) -> set[str] | None:
    """Ids of the tool calls already in the transcript: empty for a new session, None
    when the session did not answer in time (its worker may be down)."""
    try:
        transcript = await asyncio.wait_for(hermes.get_transcript(session_id), _POLL_QUERY_TIMEOUT_SECONDS)
    except SessionNotFoundError:
        return set()
    except (HermesError, asyncio.TimeoutError):
        return None
    known: set[str] = set()
    for message in transcript:
        known.update(c.tool_call_id for c in message.tool_calls)
        if message.tool_call_id:
            known.add(message.tool_call_id)
    return known


async def send_watched(
    hermes: HermesClient,
    session_id: str,
    text: str,
    view: TurnView,
    *,
    user_id: str,
    client_message_id: str | None = None,
    poll_seconds: float = _POLL_SECONDS,
    slow_after_seconds: float = _SLOW_TURN_SECONDS,
) -> TurnResult:
    """Send one message and tell ``view`` about tool calls and approvals as they happen.

    While the ``send_message`` update runs, the session's transcript and pending
    approvals are polled every ``poll_seconds``; events missed between polls (a fast
    turn) are reported from the :class:`TurnResult` at the end, in order. If the
    session cannot tell which tool calls it had before this message (a query timed
    out), nothing is shown live and everything is reported at the end.

    Args:
        hermes: a connected client.
        session_id: the session; created by this message if new.
        text: the user's message.
        view: receives the events; its ``approval_needed`` may decide approvals.
        user_id: owner of a new session.
        client_message_id: de-duplication id (see :meth:`HermesClient.send_message`).
        poll_seconds: polling interval, in seconds.
        slow_after_seconds: with no sign of the turn after this long, ``view.slow`` is
            called, once, if Temporal lists no worker polling the task queue.

    Returns:
        The turn's result.

    Raises:
        MessageRejectedError, SessionConfigError, SessionClosedError, SessionBusyError,
            SessionHaltedError, SessionUnavailableError...: as :meth:`HermesClient.send_message`.
    """
    hermes.check_config()  # refused before anything is followed (a SessionConfigError names the field)
    watch = _TurnWatch(hermes, session_id, text, view, await _known_tool_call_ids(hermes, session_id))
    view.turn_begins()
    streaming = await follow_turn(hermes, session_id, view, watch.shown_calls, watch.shown_results)
    task = asyncio.ensure_future(
        hermes.send_message(session_id, text, user_id=user_id, client_message_id=client_message_id)
    )
    watch.started = asyncio.get_running_loop().time()
    try:
        while not task.done():
            await asyncio.wait({task}, timeout=poll_seconds)
            if task.done():
                break
            await watch.poll(slow_after_seconds)
        result = await task
        if streaming is not None:
            await streaming.finish(result.turn)
    finally:
        try:
            if streaming is not None:
                await streaming.stop()
        finally:
            if not task.done():
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task
    watch.report_rest(result)
    return result


class _TurnWatch:
    """What :func:`send_watched` has shown of one turn, and one poll of the session's queries.

    Args:
        known: the tool call ids in the transcript before the message (never shown), or
            None when they are unknown (then nothing of the transcript is shown live).
    """

    def __init__(self, hermes: HermesClient, session_id: str, text: str, view: TurnView, known: set[str] | None):
        self.hermes, self.session_id, self.text, self.view, self.known = hermes, session_id, text, view, known
        self.shown_calls: set[str] = set()
        self.shown_results: set[str] = set()
        self.asked: set[str] = set()
        self.progressed = False
        """The turn has shown a sign of life: its user message or a pending approval."""
        self.warned = False
        self.started = asyncio.get_running_loop().time()

    async def poll(self, slow_after_seconds: float) -> None:
        """Read the transcript and the pending approvals once and show what is new."""
        try:
            transcript = await asyncio.wait_for(
                self.hermes.get_transcript(self.session_id), _POLL_QUERY_TIMEOUT_SECONDS
            )
            pending = await asyncio.wait_for(
                self.hermes.get_pending_approvals(self.session_id), _POLL_QUERY_TIMEOUT_SECONDS
            )
        except (HermesError, asyncio.TimeoutError):
            transcript, pending = [], []  # not started yet, or no worker answered
        if self.known is not None:
            self._show_transcript(transcript, self.known)
        # Every pending approval is offered, also one of an earlier turn: this
        # message waits behind that turn until it is decided.
        for approval in pending:
            self.progressed = True
            await self._offer(approval)
        await self._warn_if_slow(slow_after_seconds)

    def _show_transcript(self, transcript: list[Message], known: set[str]) -> None:
        for message in transcript:
            if message.role == "user" and message.content == self.text:
                self.progressed = True
            for call in message.tool_calls:
                if call.tool_call_id not in known and call.tool_call_id not in self.shown_calls:
                    self.shown_calls.add(call.tool_call_id)
                    self.view.tool_call(call)
            if message.role == "tool" and message.tool_call_id:
                tcid = message.tool_call_id
                result = tool_result_of(message)
                if tcid not in known and tcid not in self.shown_results and result is not None:
                    self.shown_results.add(tcid)
                    self.view.tool_result(tcid, message.name or "?", result)

    async def _offer(self, approval: PendingApproval) -> None:
        """Show a pending approval once, and send the view's verdict if it gives one."""
        if approval.tool_call_id in self.asked:
            return
        self.asked.add(approval.tool_call_id)
        if approval.tool_call_id not in self.shown_calls and approval.tool_call_id not in (self.known or ()):
            self.shown_calls.add(approval.tool_call_id)
            self.view.tool_call(
                ToolCall(tool_call_id=approval.tool_call_id, name=approval.tool_name, arguments=approval.arguments)
            )
        verdict = await self.view.approval_needed(approval)
        if verdict is not None:
            record = await decide(
                self.hermes,
                self.session_id,
                approval.tool_call_id,
                approved=verdict.approved,
                approver=verdict.approver,
                reason=verdict.reason,
            )
            self.view.decided(approval, verdict, record)

    async def _warn_if_slow(self, slow_after_seconds: float) -> None:
        elapsed = asyncio.get_running_loop().time() - self.started
        if self.progressed or self.warned or elapsed <= slow_after_seconds:
            return
        self.warned = True
        # Only a hint when it may be true: with a worker polling, the turn is slow, not lost.
        if await self.hermes.count_workers() != 0:
            return
        self.view.slow(asyncio.get_running_loop().time() - self.started)

    def report_rest(self, result: TurnResult) -> None:
        """Show, in order, the tool calls and results of ``result`` no poll saw."""
        for record in result.tool_calls:
            if record.tool_call_id not in self.shown_calls:
                self.view.tool_call(
                    ToolCall(tool_call_id=record.tool_call_id, name=record.name, arguments=record.arguments)
                )
            if record.tool_call_id not in self.shown_results:
                self.view.tool_result(record.tool_call_id, record.name, record.result)
