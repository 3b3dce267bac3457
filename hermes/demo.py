"""The offline demo, and the console conversation view it shares with ``hermes chat``.

``hermes demo`` needs no API key and nothing but this package: it starts the embedded
stack (a Temporal dev server with its Web UI and a Redis, data in ``.hermes/``), or uses
the one a running ``hermes dev`` holds, runs a worker in-process with the packaged
scripted model (``hermes/scripts/demo.yaml``: a stand-in that plays lines, it
understands nothing), and plays a conversation in Chinese and English in a new session.
Every reply is checked; a wrong one makes :func:`run_demo` raise :class:`DemoFailed`,
so a green demo means the runtime works on this machine.

Pieces reused by the CLI:

* :func:`local_servers`: the embedded stack, or the servers named by
  ``TEMPORAL_ADDRESS`` / ``REDIS_URL``.
* :func:`send_watched`: send one message and report its tool calls, approvals and
  results to a :class:`TurnView` while the turn runs (by polling the session's queries).
* :func:`decide`: approve or reject a tool call and return the session's audit record.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ValidationError
from rich.console import Console
from rich.markup import escape
from rich.text import Text

from hermes import names
from hermes.client import HermesClient
from hermes.errors import HermesError, SessionNotFoundError
from hermes.live_view import TurnView, Verdict, follow_turn
from hermes.models import (
    DecisionRecord,
    Message,
    PendingApproval,
    ToolCall,
    ToolResult,
    ToolResultCode,
    TurnResult,
)
from hermes.settings import Settings
from hermes.stack import EmbeddedStack, StackError, ensure_search_attributes

__all__ = [
    "DEMO_USER",
    "DemoFailed",
    "DemoSummary",
    "Servers",
    "TurnView",
    "ConsoleTurnView",
    "decide",
    "local_servers",
    "print_message",
    "run_demo",
    "send_watched",
    "wait_until_interrupted",
]

DEMO_USER = "demo-user"
"""The demo's user id and approver."""

_PROBE_TIMEOUT_SECONDS = 5.0
_POLL_SECONDS = 0.1
_POLL_QUERY_TIMEOUT_SECONDS = 5.0
_SLOW_TURN_SECONDS = 10.0
"""After this long with no sign of a worker, :func:`send_watched` tells the view."""


class DemoFailed(HermesError):
    """A demo step did not produce the expected reply or tool results."""


# --------------------------------------------------------------------------- servers


@dataclass
class Servers:
    """Where the Temporal server, its Web UI and Redis are, and who started them."""

    temporal_address: str
    redis_url: str
    namespace: str = "default"
    ui_url: str | None = None
    """Base URL of the Temporal Web UI, when it is known (the embedded one)."""
    stack: EmbeddedStack | None = None
    """The stack this process started, or None."""
    reused: bool = False
    """True when a stack started by another process (a running `hermes dev`) is used."""

    def workflow_url(self, session_id: str) -> str | None:
        """The Web UI page of a session's workflow, or None when the UI is unknown."""
        if self.ui_url is None:
            return None
        return f"{self.ui_url}/namespaces/{self.namespace}/workflows/{session_id}"


async def _start_stack(stack: EmbeddedStack) -> None:
    """Start ``stack``; if the caller is cancelled meanwhile, finish starting, then stop it,
    so that no server outlives a Ctrl-C during start-up."""
    starting = asyncio.ensure_future(stack.start_async())
    try:
        await asyncio.shield(starting)
    except asyncio.CancelledError:
        with contextlib.suppress(Exception):
            await starting
        await stack.stop_async()
        raise


async def _servers_answer(settings: Settings) -> bool:
    """True if a Temporal frontend and a Redis answer at the settings' addresses (with
    their TLS settings)."""
    from hermes.connections import connect_temporal
    from worker import connect_redis

    try:
        client = await asyncio.wait_for(connect_temporal(settings), _PROBE_TIMEOUT_SECONDS)
        await asyncio.wait_for(client.service_client.check_health(), _PROBE_TIMEOUT_SECONDS)
    except Exception:  # noqa: BLE001 - any failure means "not usable"
        return False
    redis = connect_redis(settings=settings)
    try:
        return bool(await asyncio.wait_for(redis.ping(), _PROBE_TIMEOUT_SECONDS))
    except Exception:  # noqa: BLE001
        return False
    finally:
        await redis.aclose()


@contextlib.asynccontextmanager
async def local_servers(
    settings: Settings, *, ui: bool = True, reuse_running: bool = False, ui_codec_endpoint: str | None = None
) -> AsyncIterator[Servers]:
    """Temporal and Redis for a command: the user's, or the embedded stack.

    With ``TEMPORAL_ADDRESS`` and ``REDIS_URL`` both set nothing is started. Otherwise the
    missing ones are started as an :class:`EmbeddedStack` in ``settings.data_dir`` on
    ``settings.temporal_port`` / ``ui_port`` / ``redis_port``, and stopped on exit. An
    embedded Temporal gets the Hermes search attributes; on any other server the caller
    registers them (:func:`hermes.stack.ensure_search_attributes`, idempotent).

    Args:
        settings: addresses, ports, data directory and namespace.
        ui: serve the Temporal Web UI with the embedded server.
        ui_codec_endpoint: the codec server an embedded Web UI decodes payloads through.
        reuse_running: if the stack cannot start because one (a ``hermes dev``) already
            holds the data directory or the ports, use those servers when they answer.

    Yields:
        The addresses to use.

    Raises:
        StackAlreadyRunning: another stack holds the data directory (and not reused).
        StackError: the stack could not start (port in use, binary missing, ...).
        ConfigError: a bad TLS setting, or TLS settings for a server that is embedded
            (checked before anything starts).
    """
    from hermes.connections import check_connection_settings

    check_connection_settings(settings)
    external_temporal = settings.temporal_address is not None
    external_redis = settings.redis_url is not None
    namespace = settings.temporal_namespace
    if external_temporal and external_redis:
        yield Servers(settings.resolved_temporal_address, settings.resolved_redis_url, namespace)
        return
    stack = EmbeddedStack(
        settings.data_dir,
        temporal_port=settings.temporal_port,
        ui_port=settings.ui_port,
        redis_port=settings.redis_port,
        search_attributes=names.SEARCH_ATTRIBUTES,
        start_temporal=not external_temporal,
        start_redis=not external_redis,
        ui=ui,
        ui_codec_endpoint=ui_codec_endpoint,
        namespace=namespace,
    )
    try:
        await _start_stack(stack)
    except StackError:
        if not reuse_running or not await _servers_answer(settings):
            raise
        started = False
    else:
        started = True
    if not started:
        yield Servers(
            settings.resolved_temporal_address,
            settings.resolved_redis_url,
            namespace,
            ui_url=None if external_temporal or not ui else f"http://127.0.0.1:{settings.ui_port}",
            reused=True,
        )
        return
    try:
        yield Servers(
            settings.temporal_address or stack.temporal_address,
            settings.redis_url or stack.redis_url,
            namespace,
            ui_url=None if external_temporal else stack.ui_url,
            stack=stack,
        )
    finally:
        await stack.stop_async()


async def wait_until_interrupted() -> None:
    """Wait until this task is cancelled (the CLI cancels it on Ctrl-C or SIGTERM), then
    return normally, so the caller's cleanup runs as on a normal exit."""
    try:
        await asyncio.Event().wait()
    except asyncio.CancelledError:
        task = asyncio.current_task()
        if task is not None:
            task.uncancel()


# --------------------------------------------------------------------------- watching a turn


def _tool_result_of(message: Message) -> ToolResult | None:
    try:
        return ToolResult.model_validate_json(message.content or "")
    except ValidationError:
        return None  # truncated content; the TurnResult has the full result


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


async def decide(
    hermes: HermesClient,
    session_id: str,
    tool_call_id: str,
    *,
    approved: bool,
    approver: str,
    reason: str | None = None,
    timeout_seconds: float = 10.0,
) -> DecisionRecord:
    """Approve or reject a tool call and return the session's record of the decision.

    The decision is a signal; its outcome (``applied``, ``unknown_tool_call``,
    ``already_decided``) is read back from ``get_state().decisions``.

    Args:
        hermes: a connected client.
        session_id: the session (workflow id).
        tool_call_id: the id listed by ``get_pending_approvals``.
        approved: approve (True) or reject (False).
        approver: who decided, for the audit record.
        reason: optional reason, shown to the model on a rejection.
        timeout_seconds: how long to wait for the record to appear.

    Returns:
        The newest decision record for ``tool_call_id``.

    Raises:
        asyncio.TimeoutError: the session did not record the decision in time (no worker?).
        SessionNotFoundError: no such session.
        SessionUnavailableError: Temporal did not answer (see :class:`HermesClient`).
    """
    before = sum(1 for d in (await hermes.get_state(session_id)).decisions if d.tool_call_id == tool_call_id)
    if approved:
        await hermes.approve(session_id, tool_call_id, approver=approver, reason=reason)
    else:
        await hermes.reject(session_id, tool_call_id, approver=approver, reason=reason)

    async def poll() -> DecisionRecord:
        while True:
            records = [d for d in (await hermes.get_state(session_id)).decisions if d.tool_call_id == tool_call_id]
            if len(records) > before:
                return records[-1]
            await asyncio.sleep(_POLL_SECONDS)

    return await asyncio.wait_for(poll(), timeout_seconds)


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
    known = await _known_tool_call_ids(hermes, session_id)
    shown_calls: set[str] = set()
    shown_results: set[str] = set()
    asked: set[str] = set()
    view.turn_begins()
    streaming = await follow_turn(hermes, session_id, view, shown_calls, shown_results)
    task = asyncio.ensure_future(
        hermes.send_message(session_id, text, user_id=user_id, client_message_id=client_message_id)
    )
    loop = asyncio.get_running_loop()
    started = loop.time()
    progressed = False
    warned = False
    try:
        while not task.done():
            await asyncio.wait({task}, timeout=poll_seconds)
            if task.done():
                break
            try:
                transcript = await asyncio.wait_for(hermes.get_transcript(session_id), _POLL_QUERY_TIMEOUT_SECONDS)
                pending = await asyncio.wait_for(
                    hermes.get_pending_approvals(session_id), _POLL_QUERY_TIMEOUT_SECONDS
                )
            except (HermesError, asyncio.TimeoutError):
                transcript, pending = [], []  # not started yet, or no worker answered
            for message in transcript if known is not None else []:
                if message.role == "user" and message.content == text:
                    progressed = True
                for call in message.tool_calls:
                    if call.tool_call_id not in known and call.tool_call_id not in shown_calls:
                        shown_calls.add(call.tool_call_id)
                        view.tool_call(call)
                if message.role == "tool" and message.tool_call_id:
                    tcid = message.tool_call_id
                    result = _tool_result_of(message)
                    if tcid not in known and tcid not in shown_results and result is not None:
                        shown_results.add(tcid)
                        view.tool_result(tcid, message.name or "?", result)
            # Every pending approval is offered, also one of an earlier turn: this
            # message waits behind that turn until it is decided.
            for approval in pending:
                progressed = True
                if approval.tool_call_id in asked:
                    continue
                asked.add(approval.tool_call_id)
                if approval.tool_call_id not in shown_calls and approval.tool_call_id not in (known or ()):
                    shown_calls.add(approval.tool_call_id)
                    view.tool_call(
                        ToolCall(tool_call_id=approval.tool_call_id, name=approval.tool_name, arguments=approval.arguments)
                    )
                verdict = await view.approval_needed(approval)
                if verdict is not None:
                    record = await decide(
                        hermes,
                        session_id,
                        approval.tool_call_id,
                        approved=verdict.approved,
                        approver=verdict.approver,
                        reason=verdict.reason,
                    )
                    view.decided(approval, verdict, record)
            if not progressed and not warned and loop.time() - started > slow_after_seconds:
                warned = True
                # Only a hint when it may be true: with a worker polling, the turn is slow, not lost.
                if await hermes.count_workers() != 0:
                    continue
                view.slow(loop.time() - started)
        result = await task
        if streaming is not None:
            await streaming.finish(result.turn)
    finally:
        if streaming is not None:
            await streaming.stop()
        if not task.done():
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
    for record in result.tool_calls:
        if record.tool_call_id not in shown_calls:
            view.tool_call(ToolCall(tool_call_id=record.tool_call_id, name=record.name, arguments=record.arguments))
        if record.tool_call_id not in shown_results:
            view.tool_result(record.tool_call_id, record.name, record.result)
    return result


# --------------------------------------------------------------------------- console output


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
    console.print(Text.assemble((f"{who} › ", "bold cyan"), text))


def print_reply(console: Console, result: TurnResult) -> None:
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
        result = _tool_result_of(message)
        if result is None:
            console.print(Text.assemble(("  ← ", "dim"), (message.name or "?", "yellow"), " ", _short(message.content or "")))
        else:
            ConsoleTurnView(console, "").tool_result(message.tool_call_id or "", message.name or "?", result)
    else:
        console.print(Text.assemble((f"{message.role} › ", "bold"), message.content or ""))


# --------------------------------------------------------------------------- the demo


@dataclass(frozen=True)
class DemoStep:
    """One user message of the demo and what its turn must produce."""

    text: str
    tools: tuple[str, ...]
    """Tool names called, in order; every result must have code 0."""
    reply: str
    """A regular expression the reply must match (``re.search``)."""
    approve: bool = False
    """The turn must ask for an approval, which the demo grants."""
    check: Callable[[TurnResult], str | None] | None = None
    """Extra check; returns a problem description or None."""
    new_session: bool = False
    """Sent in a second session of the same user (long-term memory crosses sessions)."""
    needs_memory: bool = False
    """Skipped when long-term memory is off (``HERMES_MEMORY_ENABLED=false``)."""
    wait_for_memory: str | None = None
    """Before sending, wait until a memory containing this text is stored (memories are
    written after the reply, in batches of 10 items or 5 s)."""


def _calculated_126(result: TurnResult) -> str | None:
    value = result.tool_calls[0].result.data.get("value") if isinstance(result.tool_calls[0].result.data, dict) else None
    return None if value == 126 else f"calculate returned {value!r}, expected 126"


DEMO_STEPS: tuple[DemoStep, ...] = (
    DemoStep("你好！现在上海几点？", ("current_time",), r"^上海现在是 \d\d:\d\d（\d{4}-\d\d-\d\d，星期[一二三四五六日]）。$"),
    DemoStep(
        "What time is it in Paris and New York?",
        ("current_time", "current_time"),
        r"^Paris: \d\d:\d\d, New York: \d\d:\d\d\.$",
    ),
    DemoStep("What is (17 + 25) * 3?", ("calculate",), r"= 126\.$", check=_calculated_126),
    DemoStep("请帮我记一条笔记：明天上午十点和 Alice 开会", ("save_note",), r"^保存笔记“明天上午十点和 Alice 开会”：已保存。$", approve=True),
    DemoStep("Show me my notes", ("list_notes",), r"note\(s\); the latest: 明天上午十点和 Alice 开会\.$"),
    DemoStep("By the way, my name is Lin and I live in Zurich.", (), r"I will remember that\.$", needs_memory=True),
    DemoStep(
        "Where do I live?", (), r"^From what I remember: .*The user lives in Zurich\.",
        new_session=True, wait_for_memory="The user lives in Zurich.", needs_memory=True,
    ),
)


async def _wait_for_memory(settings: Settings, user_id: str, text: str, timeout_seconds: float = 30.0) -> bool:
    """Whether a memory of ``user_id`` containing ``text`` is stored within the timeout."""
    from hermes.memory.service import open_store

    store = await asyncio.to_thread(open_store, settings)
    deadline = asyncio.get_running_loop().time() + timeout_seconds
    while True:
        rows = await asyncio.to_thread(store.list, user_id, statuses=("active",))
        if any(text in r["text"] for r in rows):
            return True
        if asyncio.get_running_loop().time() > deadline:
            return False
        await asyncio.sleep(0.2)


class DemoSummary(BaseModel):
    """What :func:`run_demo` did."""

    session_id: str
    user_id: str
    turns: list[TurnResult]
    decisions: list[DecisionRecord]
    temporal_address: str
    redis_url: str
    ui_url: str | None = None
    workflow_url: str | None = None
    reused_stack: bool = False
    """True if a running `hermes dev` stack was used instead of starting one."""

    @property
    def tool_call_count(self) -> int:
        return sum(len(t.tool_calls) for t in self.turns)


def _problems(step: DemoStep, result: TurnResult, decisions: list[DecisionRecord]) -> list[str]:
    problems: list[str] = []
    if result.status != "completed":
        problems.append(f"the turn ended with status {result.status!r}")
    called = tuple(r.name for r in result.tool_calls)
    if called != step.tools:
        problems.append(f"tool calls were {list(called)}, expected {list(step.tools)}")
    for record in result.tool_calls:
        if record.result.code != ToolResultCode.OK:
            problems.append(f"{record.name} returned code {int(record.result.code)}: {record.result.message}")
    if not re.search(step.reply, result.reply):
        problems.append(f"the reply {result.reply!r} does not match {step.reply!r}")
    if step.approve:
        mine = [d for d in decisions if d.approver == DEMO_USER]
        if not mine or mine[-1].outcome != "applied":
            problems.append("no approval was requested and applied for the write tool")
        elif not all(r.approval == "approved" and r.approver == DEMO_USER for r in result.tool_calls):
            problems.append("the session did not record the tool call as approved by the demo user")
    if step.check is not None and not problems:
        extra = step.check(result)
        if extra:
            problems.append(extra)
    return problems


class _DemoView(ConsoleTurnView):
    """Prints like chat, and approves as the demo user."""

    def __init__(self, console: Console, session_id: str):
        super().__init__(console, session_id)
        self.decisions: list[DecisionRecord] = []

    async def approval_needed(self, pending: PendingApproval) -> Verdict | None:
        self.print_pending(pending)
        return Verdict(approved=True, approver=DEMO_USER, reason="approved by the demo")

    def decided(self, pending: PendingApproval, verdict: Verdict, record: DecisionRecord) -> None:
        self.decisions.append(record)
        super().decided(pending, verdict, record)


async def run_demo(
    settings: Settings | None = None,
    *,
    console: Console | None = None,
    keep: bool = False,
    session_id: str | None = None,
    turn_timeout_seconds: float = 60.0,
) -> DemoSummary:
    """Run the offline demo end to end and check every reply.

    Args:
        settings: ports, data directory, task queue (default: from the environment).
            With ``TEMPORAL_ADDRESS`` and ``REDIS_URL`` set, those servers are used.
        console: where to print (default: stdout).
        keep: after the conversation, keep the stack and the worker running until this
            task is cancelled (Ctrl-C in the CLI).
        session_id: the session to create (default: a new ``demo-...`` id).
        turn_timeout_seconds: the longest one turn may take.

    Returns:
        The session id, each turn's result and where to look at it.

    Raises:
        DemoFailed: a reply or tool result was not the expected one.
        StackError: the embedded stack could not start and no running one answers.
    """
    from hermes import encryption
    from hermes.providers.scripted import ScriptedModel
    from hermes.tools.builtin import register_builtins
    from hermes.tools.registry import ToolRegistry
    from hermes.durable import DurableStore
    from hermes.connections import connect_temporal
    from worker import build_worker, connect_redis

    settings = settings or Settings()
    console = console or Console()
    session_id = session_id or f"demo-{uuid.uuid4().hex[:12]}"
    console.rule("Hermes demo")
    console.print(
        "Model: the packaged [bold]scripted stand-in[/] (hermes/scripts/demo.yaml). It plays "
        "prepared lines and understands nothing; see README.md to use a real model."
    )
    async with local_servers(settings, ui=True, reuse_running=True) as servers:
        if servers.reused:
            console.print(f"Using the running hermes dev stack at {servers.temporal_address}.")
        elif servers.stack is not None:
            console.print(f"Started the embedded stack (data in {escape(str(servers.stack.data_dir))}).")
        console.print(
            f"Temporal {servers.temporal_address} · Redis {servers.redis_url}"
            + (f" · Web UI {servers.ui_url}" if servers.ui_url else "")
        )
        client = await connect_temporal(
            settings, address=servers.temporal_address, data_converter=encryption.converter_for(settings)
        )
        await ensure_search_attributes(client, names.SEARCH_ATTRIBUTES, servers.namespace)
        redis = connect_redis(servers.redis_url, settings)
        try:
            worker = build_worker(
                client,
                settings,
                task_queue=settings.task_queue,
                provider=ScriptedModel.demo(),
                registry=register_builtins(ToolRegistry()),
                redis=redis,
            )
            async with worker:
                hermes = HermesClient(
                    client, task_queue=settings.task_queue, redis=redis, durable=DurableStore(settings.resolved_memory_uri)
                )
                console.print(f"Session [bold]{session_id}[/] (user {DEMO_USER}), worker on task queue {settings.task_queue}")
                console.print()
                view = _DemoView(console, session_id)
                turns: list[TurnResult] = []
                current = session_id
                for number, step in enumerate(DEMO_STEPS, start=1):
                    if step.needs_memory and not settings.memory_enabled:
                        continue
                    if step.wait_for_memory:
                        console.print(f"(waiting for the memory {step.wait_for_memory!r} to be written)", style="dim")
                        if not await _wait_for_memory(settings, DEMO_USER, step.wait_for_memory):
                            raise DemoFailed(f"step {number}: the memory {step.wait_for_memory!r} was not written within 30 s")
                    if step.new_session:
                        current = f"{session_id}-2"
                        console.print(f"A new session, [bold]{current}[/], for the same user:")
                        decisions, view = view.decisions, _DemoView(console, current)
                        view.decisions = decisions
                    print_user(console, step.text)
                    decided_before = len(view.decisions)
                    try:
                        result = await asyncio.wait_for(
                            send_watched(hermes, current, step.text, view, user_id=DEMO_USER),
                            turn_timeout_seconds,
                        )
                    except asyncio.TimeoutError:
                        raise DemoFailed(
                            f"step {number} ({step.text!r}): no reply within {turn_timeout_seconds:.0f} s"
                        ) from None
                    view.finish_reply(result)
                    console.print()
                    turns.append(result)
                    problems = _problems(step, result, view.decisions[decided_before:])
                    if problems:
                        raise DemoFailed(f"step {number} ({step.text!r}): " + "; ".join(problems))
                summary = DemoSummary(
                    session_id=session_id,
                    user_id=DEMO_USER,
                    turns=turns,
                    decisions=view.decisions,
                    temporal_address=servers.temporal_address,
                    redis_url=servers.redis_url,
                    ui_url=servers.ui_url,
                    workflow_url=servers.workflow_url(session_id),
                    reused_stack=servers.reused,
                )
                _print_where_to_look(console, summary, servers, keep=keep)
                if keep:
                    await wait_until_interrupted()
                    console.print("Stopping.")
        finally:
            await redis.aclose()
    return summary


def _print_where_to_look(console: Console, summary: DemoSummary, servers: Servers, *, keep: bool) -> None:
    sid = summary.session_id
    console.rule("Demo passed")
    console.print(
        f"{len(summary.turns)} turns, {summary.tool_call_count} tool calls, "
        f"{len(summary.decisions)} approval; every reply and tool result checked."
    )
    console.print("See it:")
    if summary.workflow_url:
        console.print(f"  Web UI   {summary.workflow_url}")
        console.print(
            f"           (search: HermesUserId = \"{DEMO_USER}\"; queries get_state / get_transcript "
            "in the Queries tab)",
            markup=False,
        )
    else:
        console.print("  Web UI   open your Temporal Web UI and find the workflow id " + sid)
    console.print(f"  CLI      hermes show {sid}", markup=False)
    if servers.stack is not None and not keep:
        console.print(
            f"  Later    hermes dev   (the session stays in {servers.stack.data_dir}; start the stack "
            "again to open the link or run hermes show)",
            markup=False,
        )
    if keep:
        console.print("The stack and the worker keep running; press Ctrl-C to stop.")
    elif servers.reused:
        console.print("The running hermes dev stack keeps running.")
    elif servers.stack is not None:
        console.print("Stopping the embedded stack (use --keep to keep it running).")

