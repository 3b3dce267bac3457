"""The offline demo: ``hermes demo``.

``hermes demo`` needs no API key and nothing but this package: it starts the embedded
stack (a Temporal dev server with its Web UI and a Redis, data in ``.hermes/``), or uses
the one a running ``hermes dev`` holds, runs a worker in-process with the packaged
scripted model (``hermes/scripts/demo.yaml``: a stand-in that plays lines, it
understands nothing), and plays a conversation in Chinese and English in a new session.
Every reply is checked; a wrong one makes :func:`run_demo` raise :class:`DemoFailed`,
so a green demo means the runtime works on this machine.

A leaf: only the CLI's demo command (:mod:`hermes.cli.demo`) imports it. What it shares
with the rest of the product lives there: the servers in :mod:`hermes.infra.local_servers`,
watching a turn in :mod:`hermes.sessions.live_view`, deciding approvals in :mod:`hermes.sessions.approvals`,
the console view in :mod:`hermes.cli.chat_view`.
"""

from __future__ import annotations

import asyncio
import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from pydantic import BaseModel
from rich.console import Console
from rich.markup import escape

from hermes import names
from hermes.cli.chat_view import ConsoleTurnView, print_user
from hermes.client import HermesClient
from hermes.errors import HermesError
from hermes.infra.local_servers import Servers, local_servers
from hermes.infra.process import wait_until_interrupted
from hermes.infra.stack import ensure_search_attributes
from hermes.models import DecisionRecord, PendingApproval, ToolResultCode, TurnResult
from hermes.sessions.live_view import Verdict, send_watched
from hermes.settings import Settings

__all__ = ["DEMO_USER", "DemoFailed", "DemoSummary", "run_demo"]

DEMO_USER = "demo-user"
"""The demo's user id and approver."""


class DemoFailed(HermesError):
    """A demo step did not produce the expected reply or tool results."""


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


MEMORY_WAIT_SECONDS = 180.0
"""How long the demo waits for the memory its later step recalls to be written (a few
seconds on an idle machine; minutes on one starved of CPU)."""

SLOW_TURN_SECONDS = 60.0
"""A turn slower than this is named slow in the demo's output (it still passes)."""


async def _wait_for_memory(settings: Settings, user_id: str, text: str, timeout_seconds: float = MEMORY_WAIT_SECONDS) -> bool:
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
    turn_timeout_seconds: float = 300.0,
) -> DemoSummary:
    """Run the offline demo end to end and check every reply.

    Args:
        settings: ports, data directory, task queue (default: from the environment).
            With ``TEMPORAL_ADDRESS`` and ``REDIS_URL`` set, those servers are used.
        console: where to print (default: stdout).
        keep: after the conversation, keep the stack and the worker running until this
            task is cancelled (Ctrl-C in the CLI).
        session_id: the session to create (default: a new ``demo-...`` id).
        turn_timeout_seconds: the longest one turn may take. On an idle machine a turn
            takes a few seconds; starved of CPU (eight busy processes per core beside it)
            one took 50 s: a starved worker is slow, and the demo checks what it answers.

    Returns:
        The session id, each turn's result and where to look at it.

    Raises:
        DemoFailed: a reply or tool result was not the expected one.
        StackError: the embedded stack could not start and no running one answers.
    """
    from hermes.infra.connections import connect_temporal
    from hermes.infra.durable import DurableStore
    from hermes.providers.scripted import ScriptedModel
    from hermes.security import encryption
    from hermes.tools.builtin import register_builtins
    from hermes.tools.registry import ToolRegistry
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
                turns, decisions = await _play_steps(hermes, settings, console, session_id, turn_timeout_seconds)
                summary = DemoSummary(
                    session_id=session_id,
                    user_id=DEMO_USER,
                    turns=turns,
                    decisions=decisions,
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


async def _play_steps(
    hermes: HermesClient, settings: Settings, console: Console, session_id: str, turn_timeout_seconds: float
) -> tuple[list[TurnResult], list[DecisionRecord]]:
    """Send each of :data:`DEMO_STEPS` and check its turn.

    Returns:
        Each turn's result, and every approval decision the demo made.

    Raises:
        DemoFailed: a turn took too long, or its reply or tool results were not the expected ones.
    """
    view = _DemoView(console, session_id)
    turns: list[TurnResult] = []
    current = session_id
    for number, step in enumerate(DEMO_STEPS, start=1):
        if step.needs_memory and not settings.memory_enabled:
            continue
        if step.wait_for_memory:
            console.print(f"(waiting for the memory {step.wait_for_memory!r} to be written)", style="dim")
            if not await _wait_for_memory(settings, DEMO_USER, step.wait_for_memory):
                raise DemoFailed(
                    f"step {number}: the memory {step.wait_for_memory!r} was not written within {MEMORY_WAIT_SECONDS:.0f} s"
                )
        if step.new_session:
            current = f"{session_id}-2"
            console.print(f"A new session, [bold]{current}[/], for the same user:")
            decisions, view = view.decisions, _DemoView(console, current)
            view.decisions = decisions
        print_user(console, step.text)
        decided_before = len(view.decisions)
        started = asyncio.get_running_loop().time()
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
        took = asyncio.get_running_loop().time() - started
        if took > SLOW_TURN_SECONDS:
            console.print(f"  (a slow turn: {took:.0f} s; this machine is short of CPU)", style="dim")
        console.print()
        turns.append(result)
        problems = _problems(step, result, view.decisions[decided_before:])
        if problems:
            raise DemoFailed(f"step {number} ({step.text!r}): " + "; ".join(problems))
    return turns, view.decisions


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

