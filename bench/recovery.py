"""Recovery after a worker is killed: the time from a SIGKILL to the session's reply.

    python bench/recovery.py --quick                     # 2 repetitions per case and turn
    python bench/recovery.py                             # 3 repetitions
    python bench/recovery.py --tool-heartbeat 2 --sticky-timeout 1
    python bench/recovery.py --quick --deploy            # SIGTERM during a model call, CPU hogs beside

A Temporal dev server, a Redis and two worker *processes* (``python worker.py``, configured
only through the environment, as in production, each in its own process group). The model
is an OpenAI-compatible chat-completions endpoint served by this bench on 127.0.0.1
(``HERMES_MODEL_PROVIDER=openai``), so a model call can be made slow without changing the
scripted model; the slow tool is ``bench/recovery_tools.py`` (``HERMES_TOOL_MODULES``).
Long-term memory is off in the workers (``HERMES_MEMORY_ENABLED=false``): the figures are
the session's own recovery.

Sessions are measured at turn 10 and at turn 300, one session per measurement, those of a
level built concurrently first with filler turns of one model call each (about 13.5
history events a turn: the dev server suggests continue-as-new at 4,096 events, so at turn
300 the current run still holds the whole session). A session measured twice would have
just continued as new the second time, hence one each.
Cases, each one SIGKILL of a whole worker process group:

* ``tool``: the worker running a tool call that takes 1 s (``recovery_work``, idempotent,
  so it is retried elsewhere): killed as soon as the tool has started (its marker line);
* ``model``: the worker running a model call that takes 1 s (the endpoint answers that
  message after 1 s, on every attempt): killed as soon as the request has arrived;
* ``idle``: the session idle between turns: the worker that completed its last workflow
  task (the one holding it in its cache, from the history) is killed and the next
  message is sent right after the kill.

The worker to kill is found from ``describe()``: the pending activity's last worker
identity (the SDK's default ``pid@host``). Recovery = kill to reply, with the other
worker alive, less the 1 s the retried call needs (tool, model). A replacement worker is
started after the reply and the next measurement waits until it polls, so two workers
are alive at every kill and the replacement's start-up does not load the measured window.
A case that has no reply within ``--case-timeout`` seconds is reported as timed out (its
session is terminated and the case's remaining repetitions at that turn are skipped).

Timeline of each recovery, from the run's history (server timestamps) and the
tool marker / endpoint's request log: ``detect`` kill -> the retried call starts on the
survivor (heartbeat or start-to-close timeout, then dispatch); ``retry`` the retried call
(about 1 s); ``dispatch`` the call's completion (idle: the kill) -> the first workflow task
started on the survivor (the sticky schedule-to-start wait is here); ``replay`` that
task's started -> completed (the survivor rebuilds the run from history); ``rest`` -> the
reply (the turn itself).

``--deploy`` measures a deploy instead of the cases (issue 31): at the first turn level,
the worker running a session's 1 s model call gets a SIGTERM (the graceful stop a process
manager sends; the worker's own grace period, ``HERMES_WORKER_SHUTDOWN_SECONDS``, default
model timeout + 30 s) while eight CPU hogs per core (``yes > /dev/null``,
``--hogs-per-core``) run beside the workers, until the stopped worker has exited. Printed
per measurement: the provider requests of that model step, SIGTERM to reply, SIGTERM to
the worker's exit, and the retries and timeouts in the history after the SIGTERM; last
``deploy_provider_calls=<the most requests one model step cost>`` (the goal: 1).

Printed: the settings in force, one line per measurement, each case's median at both
turns with the timeline medians, the turn-300/turn-10 ratio per case (recovery and
replay), and last ``recovery_seconds=<worst median>`` (a timed-out case counts as its
timeout, and a line before the headline says so).
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import ctypes
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

try:
    from bench import _common
except ImportError:  # run as a file: bench/ is on the path, not the repository root
    import _common  # type: ignore[no-redef]

from temporalio.api.common.v1 import WorkflowExecution  # noqa: E402
from temporalio.api.enums.v1 import PendingActivityState, TaskQueueType, TimeoutType  # noqa: E402
from temporalio.api.taskqueue.v1 import TaskQueue  # noqa: E402
from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
WORK_SECONDS = 1.0
"""How long the slow tool and the slow model call take, on every attempt."""
CASES = ("idle", "tool", "model")
"""In this order at each turn: a timed-out ``model`` case leaves its session stuck for the
model timeout, so it comes last."""
TURN_LEVELS = (10, 300)
"""Turns a session has completed when a case is measured (the measured turn is the next)."""
READY_TIMEOUT_SECONDS = 90.0
"""A worker that does not poll within this long after its start fails the run."""

SETTINGS = (
    # (flag, environment variable, Settings field, what it is)
    ("tool_heartbeat", "HERMES_TOOL_HEARTBEAT_SECONDS", "tool_heartbeat_seconds", "tool heartbeat timeout"),
    ("model_heartbeat", "HERMES_MODEL_HEARTBEAT_SECONDS", "model_heartbeat_seconds", "model heartbeat timeout"),
    ("sticky_timeout", "HERMES_STICKY_SCHEDULE_TO_START_SECONDS", "sticky_schedule_to_start_seconds", "sticky schedule-to-start timeout"),
    ("model_timeout", "HERMES_MODEL_TIMEOUT_SECONDS", "model_timeout_seconds", "model call start-to-close timeout"),
)


# ------------------------------------------------------------------ the model endpoint


class ModelEndpoint:
    """A chat-completions endpoint (stdlib ``http.server`` in a thread) that answers by the
    first word of the conversation's last user message:

    * ``tool <label>``: a call of ``recovery_work(label)``; after the tool's result, ``tool done``;
    * ``model <label>``: ``model done`` after ``WORK_SECONDS`` (every attempt);
    * anything else (filler turns, ``idle``, summaries): ``ok`` at once.

    Streaming requests (``"stream": true``) are answered as server-sent events. Every
    request's arrival time (Unix seconds) is recorded per label.
    """

    def __init__(self, work_seconds: float = WORK_SECONDS) -> None:
        self.work_seconds = work_seconds
        self.arrivals: dict[str, list[float]] = {}
        self._lock = threading.Lock()
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:  # noqa: N802 - http.server's naming
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                try:
                    endpoint._answer(self, body)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the worker that asked was killed

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - quiet
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.base_url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        self._thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, name="model-endpoint", daemon=True
        )

    def start(self) -> ModelEndpoint:
        self._thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(timeout=5)

    def arrivals_of(self, label: str) -> list[float]:
        with self._lock:
            return list(self.arrivals.get(label, []))

    def _answer(self, handler: BaseHTTPRequestHandler, body: dict[str, Any]) -> None:
        messages = body.get("messages") or []
        last_user = next((m for m in reversed(messages) if m.get("role") == "user"), {})
        text = last_user.get("content") if isinstance(last_user.get("content"), str) else ""
        kind, _, label = (text or "").partition(" ")
        after_tool = bool(messages) and messages[-1].get("role") == "tool"
        with self._lock:
            self.arrivals.setdefault(label, []).append(time.time())
        message: dict[str, Any] = {"role": "assistant", "content": "ok"}
        if kind == "tool":
            if after_tool:
                message["content"] = "tool done"
            else:
                message = {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": f"call_{label}",
                            "type": "function",
                            "function": {"name": "recovery_work", "arguments": json.dumps({"label": label})},
                        }
                    ],
                }
        elif kind == "model":
            time.sleep(self.work_seconds)
            message["content"] = "model done"
        if body.get("stream"):
            self._stream(handler, message)
        else:
            self._send(handler, 200, "application/json", json.dumps(_completion(message)).encode())

    @staticmethod
    def _send(handler: BaseHTTPRequestHandler, status: int, content_type: str, data: bytes) -> None:
        handler.send_response(status)
        handler.send_header("Content-Type", content_type)
        handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        handler.wfile.write(data)

    def _stream(self, handler: BaseHTTPRequestHandler, message: dict[str, Any]) -> None:
        delta: dict[str, Any] = {"role": "assistant", "content": message.get("content")}
        if message.get("tool_calls"):
            delta["tool_calls"] = [dict(c, index=i) for i, c in enumerate(message["tool_calls"])]
        finish = "tool_calls" if message.get("tool_calls") else "stop"
        chunks = [
            _chunk({"index": 0, "delta": delta, "finish_reason": None}),
            _chunk({"index": 0, "delta": {}, "finish_reason": finish}),
            dict(_chunk(None), choices=[], usage={"prompt_tokens": 10, "completion_tokens": 2, "total_tokens": 12}),
        ]
        data = b"".join(f"data: {json.dumps(c)}\n\n".encode() for c in chunks) + b"data: [DONE]\n\n"
        self._send(handler, 200, "text/event-stream", data)


def _completion(message: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": "chatcmpl-bench",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": "bench-model",
        "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls" if message.get("tool_calls") else "stop"}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 2, "total_tokens": 12},
    }


def _chunk(choice: dict[str, Any] | None) -> dict[str, Any]:
    return {
        "id": "chatcmpl-bench",
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": "bench-model",
        "choices": [choice] if choice else [],
    }


# ------------------------------------------------------------------ worker processes

_libc = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None
_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """In the child before exec: SIGKILL when the bench dies, even by SIGKILL (Linux).
    Only a libc call (loaded before the fork), so it is safe beside the parent's threads."""
    if _libc is not None:
        _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


class Workers:
    """``python worker.py`` processes, each in its own process group (a kill takes all of
    it). :meth:`stop_all` kills every one still running; it is also registered with
    ``atexit``, and each child is SIGKILLed by the kernel if the bench itself dies.
    ``spawn`` must be called from the main thread (the parent-death signal follows the
    thread that forked)."""

    def __init__(self, env: dict[str, str], log_dir: Path) -> None:
        self.env = env
        self.log_dir = log_dir
        self.procs: dict[int, tuple[subprocess.Popen[bytes], Any]] = {}
        self.started = 0
        atexit.register(self.stop_all)

    def spawn(self) -> int:
        self.started += 1
        log = open(self.log_dir / f"worker-{self.started}.log", "wb")  # noqa: SIM115 - closed in _reap
        proc = subprocess.Popen(
            [sys.executable, "worker.py"],
            cwd=ROOT,
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_die_with_parent,  # noqa: PLW1509 - a single libc call, see _die_with_parent
        )
        self.procs[proc.pid] = (proc, log)
        return proc.pid

    def alive(self) -> list[int]:
        return [pid for pid, (proc, _) in self.procs.items() if proc.poll() is None]

    def kill(self, pid: int) -> None:
        """SIGKILL the process group of worker ``pid`` and reap it."""
        proc, log = self.procs.pop(pid)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)
        proc.wait(timeout=10)
        log.close()

    def stop_all(self) -> None:
        for pid in list(self.procs):
            self.kill(pid)

    def terminate(self, pid: int) -> None:
        """SIGTERM worker ``pid`` alone, as a deploy or a scale-down does (a graceful stop:
        it takes no new work and lets its running activities finish); it stays in the pool
        (``alive()``) until it exits. See :meth:`reap`."""
        os.kill(pid, signal.SIGTERM)

    def reap(self, pid: int, timeout_seconds: float) -> int | None:
        """Wait up to ``timeout_seconds`` for worker ``pid`` to exit, then take it out of the
        pool (SIGKILLing its process group if it had not exited). Blocks.

        Returns:
            Its exit code, or None when it had to be killed.
        """
        proc, _ = self.procs[pid]
        try:
            code = proc.wait(timeout=timeout_seconds)
        except subprocess.TimeoutExpired:
            code = None
        self.kill(pid)
        return code

    def log_tail(self, pid: int | None = None, chars: int = 2000) -> str:
        paths = sorted(self.log_dir.glob("worker-*.log"))
        return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-chars:]}" for p in paths[-4:])


async def wait_polling(client: Any, task_queue: str, workers: Workers, pid: int) -> None:
    """Wait until worker ``pid`` polls both the workflow and the activity task queue.

    Raises:
        RuntimeError: the worker exited, or did not poll within ``READY_TIMEOUT_SECONDS``.
    """
    deadline = time.monotonic() + READY_TIMEOUT_SECONDS
    prefix = f"{pid}@"
    pending = {TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW, TaskQueueType.TASK_QUEUE_TYPE_ACTIVITY}
    while pending:
        if pid not in workers.alive():
            raise RuntimeError(f"worker {pid} exited before polling:\n{workers.log_tail()}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"worker {pid} did not poll within {READY_TIMEOUT_SECONDS:.0f} s:\n{workers.log_tail()}")
        for kind in list(pending):
            response = await client.workflow_service.describe_task_queue(
                DescribeTaskQueueRequest(namespace=client.namespace, task_queue=TaskQueue(name=task_queue), task_queue_type=kind)
            )
            if any(p.identity.startswith(prefix) for p in response.pollers):
                pending.discard(kind)
        if pending:
            await asyncio.sleep(0.1)


async def two_workers(client: Any, task_queue: str, workers: Workers) -> None:
    """Start workers until two are alive; return when every live one polls."""
    while len(workers.alive()) < 2:
        workers.spawn()
    for pid in workers.alive():
        await wait_polling(client, task_queue, workers, pid)


# ------------------------------------------------------------------ measurements


@dataclass
class Session:
    session_id: str
    turns: int = 0


@dataclass
class Sample:
    case: str
    level: int
    recovery: float | None
    """Kill to reply, less the retried call's ``WORK_SECONDS``; None: timed out."""
    history_events: int
    phases: dict[str, float] = field(default_factory=dict)
    note: str = ""


@dataclass
class DeploySample:
    provider_calls: int
    """Requests the endpoint got for the model step running at the SIGTERM (the goal: 1)."""
    reply_seconds: float | None
    """SIGTERM to the reply; None: none within the case timeout."""
    exit_seconds: float | None
    """SIGTERM to the stopped worker's exit; None: still running after the case timeout (killed)."""
    exit_code: int | None
    note: str = ""


def description_length(description: Any) -> int:
    return description.history_length


def _pid_of(identity: str) -> int | None:
    head = identity.split("@", 1)[0]
    return int(head) if head.isdigit() else None


def _event_seconds(event: Any) -> float:
    return event.event_time.seconds + event.event_time.nanos / 1e9


def read_markers(path: Path, label: str) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    lines = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    return [m for m in lines if m["label"] == label]


async def running_activity_pid(handle: Any, activity_type: str, workers: Workers) -> int:
    """The pid of the live worker running the session's pending ``activity_type``
    activity, from ``describe()`` (its last worker identity).

    Raises:
        RuntimeError: no such running activity on one of the bench's workers within 5 s.
    """
    deadline = time.monotonic() + 5.0
    seen: list[str] = []
    while time.monotonic() < deadline:
        description = await handle.describe()
        for pending in description.raw_description.pending_activities:
            if pending.activity_type.name != activity_type:
                continue
            seen.append(f"{pending.state} {pending.last_worker_identity!r}")
            if pending.state == PendingActivityState.PENDING_ACTIVITY_STATE_STARTED:
                pid = _pid_of(pending.last_worker_identity)
                if pid in workers.alive():
                    return pid
        await asyncio.sleep(0.02)
    raise RuntimeError(f"no running {activity_type} activity on a bench worker; seen: {seen[-3:]}")


async def cached_on_pid(client: Any, handle: Any) -> int | None:
    """The pid of the worker that completed the session's last workflow task (the one
    holding it in its cache, whose sticky queue gets its next task), once the session is
    quiescent.

    Raises:
        RuntimeError: the session stayed busy for 10 s, or has no completed workflow task.
    """
    deadline = time.monotonic() + 10.0
    while True:
        description = await handle.describe()
        raw = description.raw_description
        if not raw.HasField("pending_workflow_task") and not raw.pending_activities:
            break
        if time.monotonic() > deadline:
            raise RuntimeError("the session did not become idle within 10 s")
        await asyncio.sleep(0.05)
    history = await client.get_workflow_handle(handle.id, run_id=description.run_id).fetch_history()
    for event in reversed(history.events):
        if event.HasField("workflow_task_completed_event_attributes"):
            return _pid_of(event.workflow_task_completed_event_attributes.identity)
    raise RuntimeError("no completed workflow task in the session's history")


async def timeline(
    client: Any, session_id: str, run_id: str, case: str, label: str, kill_at: float, reply_at: float,
    killed: int, endpoint: ModelEndpoint, marker_file: Path, problems: list[str],
) -> dict[str, float]:
    """Phases of one recovery in seconds (see the module docstring); those that could not
    be found are left out. Workflow-task failures and timeouts after the kill are appended
    to ``problems`` (a sticky schedule-to-start timeout is one of them)."""
    phases: dict[str, float] = {}
    events = (await client.get_workflow_handle(session_id, run_id=run_id).fetch_history()).events
    after = [e for e in events if _event_seconds(e) >= kill_at - 0.001]
    for e in after:
        if e.HasField("workflow_task_failed_event_attributes"):
            failed = e.workflow_task_failed_event_attributes
            problems.append(f"workflow task failed ({failed.cause}): {failed.failure.message.splitlines()[0][:160] if failed.failure.message else ''}")
        elif e.HasField("workflow_task_timed_out_event_attributes"):
            kind = e.workflow_task_timed_out_event_attributes.timeout_type
            if kind == TimeoutType.TIMEOUT_TYPE_SCHEDULE_TO_START:
                problems.append("sticky wait timed out")  # the expected way off a dead worker's sticky queue
            else:
                problems.append(f"workflow task {TimeoutType.Name(kind).removeprefix('TIMEOUT_TYPE_').lower()} timeout")
    resumed_from = kill_at
    if case in ("tool", "model"):
        if case == "tool":
            starts = [m["at"] for m in read_markers(marker_file, label) if m["attempt"] >= 2]
        else:
            starts = endpoint.arrivals_of(label)[1:]
        completed = next((e for e in after if e.HasField("activity_task_completed_event_attributes")), None)
        if starts:
            phases["detect"] = starts[0] - kill_at
        if starts and completed is not None:
            phases["retry"] = _event_seconds(completed) - starts[0]
        if completed is None:
            return phases
        resumed_from = _event_seconds(completed)
    started = next(
        (
            e
            for e in after
            if e.HasField("workflow_task_started_event_attributes")
            and _event_seconds(e) >= resumed_from
            and _pid_of(e.workflow_task_started_event_attributes.identity) not in (killed, None)
        ),
        None,
    )
    if started is None:
        return phases
    phases["dispatch"] = _event_seconds(started) - resumed_from
    phases["history_kib"] = started.workflow_task_started_event_attributes.history_size_bytes / 1024
    done = next(
        (
            e
            for e in after
            if e.event_id > started.event_id
            and (e.HasField("workflow_task_completed_event_attributes") or e.HasField("workflow_task_failed_event_attributes"))
        ),
        None,
    )
    if done is not None:
        phases["replay"] = _event_seconds(done) - _event_seconds(started)
        phases["rest"] = reply_at - _event_seconds(done)
    return phases


class Bench:
    """One run: the servers, the workers, the client, the sessions and the samples."""

    def __init__(self, stack: Any, hermes: Any, task_queue: str, workers: Workers, endpoint: ModelEndpoint,
                 marker_file: Path, case_timeout: float) -> None:
        self.stack = stack
        self.client = stack.client
        self.hermes = hermes
        self.task_queue = task_queue
        self.workers = workers
        self.endpoint = endpoint
        self.marker_file = marker_file
        self.case_timeout = case_timeout
        self.tag = uuid.uuid4().hex[:6]
        self.counter = 0
        self.warmed: set[int] = set()

    async def send(self, session: Session, text: str) -> Any:
        result = await self.hermes.send_message(session.session_id, text, user_id="bench")
        session.turns += 1
        return result

    async def _send_until(
        self, session: Session, text: str, cid: str, first: asyncio.Future[Any] | None, deadline: float
    ) -> tuple[Any, list[str]]:
        """The reply to ``text`` (``first``: a send already under way, or None to start
        one), resending with the same client message id after an error until
        ``deadline`` (monotonic). Returns (reply or None, the errors the client got)."""
        turn = first
        if turn is None:
            turn = asyncio.ensure_future(self._send(session, text, cid, deadline - time.monotonic()))
        errors: list[str] = []
        while True:
            try:
                return await asyncio.wait_for(asyncio.shield(turn), max(0.0, deadline - time.monotonic())), errors
            except asyncio.TimeoutError:
                turn.cancel()
                await asyncio.gather(turn, return_exceptions=True)
                return None, errors
            except Exception as err:  # noqa: BLE001 - today raw Temporal errors reach callers (issue 12)
                # What a careful caller does: resend with the same client message id (safe:
                # the session de-duplicates it) until the deadline.
                errors.append(f"{type(err).__name__}: {str(err).splitlines()[0][:120] if str(err) else ''}")
                pause = min(0.1 * 2 ** len(errors), 0.5)
                if time.monotonic() + pause >= deadline:
                    return None, errors
                await asyncio.sleep(pause)
                turn = asyncio.ensure_future(self._send(session, text, cid, deadline - time.monotonic()))

    async def _send(self, session: Session, text: str, cid: str, busy_seconds: float) -> Any:
        return await self.hermes.send_message(
            session.session_id, text, user_id="bench", client_message_id=cid, busy_timeout_seconds=max(busy_seconds, 1.0)
        )

    async def ready(self) -> None:
        """Two workers alive, polling, and each has run a workflow (see :meth:`warm`)."""
        await two_workers(self.client, self.task_queue, self.workers)
        for pid in self.workers.alive():
            if pid not in self.warmed:
                await self.warm(pid)
                self.warmed.add(pid)

    async def close(self, session: Session) -> None:
        """Terminate a session that will not be measured (so no worker keeps it)."""
        with contextlib.suppress(Exception):
            await self.client.get_workflow_handle(session.session_id).terminate(reason="bench: not needed")

    async def warm(self, pid: int) -> None:
        """Run throwaway one-turn sessions until worker ``pid`` has run one, so its first
        workflow run (the sandbox loading the workflow's modules) is not counted as replay."""
        for _ in range(20):
            session = await self.build(1)
            history = await self.client.get_workflow_handle(session.session_id).fetch_history()
            await self.close(session)
            if any(
                e.HasField("workflow_task_completed_event_attributes")
                and _pid_of(e.workflow_task_completed_event_attributes.identity) == pid
                for e in history.events
            ):
                return

    async def build_many(self, turns: int, count: int) -> list[Session]:
        """``count`` new sessions, built concurrently (see :meth:`build`)."""
        return list(await asyncio.gather(*(self.build(turns) for _ in range(count))))

    async def build(self, turns: int) -> Session:
        """A new session with ``turns`` filler turns done (one model call each)."""
        self.counter += 1
        session = Session(f"bench-recovery-{self.tag}-{self.counter}")
        for i in range(turns):
            result = await self.send(session, f"filler {i}")
            if result.reply != "ok":
                raise RuntimeError(f"filler turn {i}: unexpected reply {result.reply!r}")
        return session

    async def deploy(self, session: Session, hogs: int) -> DeploySample:
        """A deploy during a model call: SIGTERM (a graceful stop) to the worker running
        the session's 1 s model call, with ``hogs`` CPU hogs beside the workers, then the
        reply (from the worker finishing the call, or from the other one) and the
        provider requests that model step cost."""
        await self.ready()
        self.counter += 1
        label = f"d{self.counter}"
        text, cid = f"model {label}", f"bench-{self.tag}-{label}"
        handle = self.client.get_workflow_handle(session.session_id)
        with _common.cpu_hogs(hogs):
            turn = asyncio.ensure_future(self._send(session, text, cid, self.case_timeout + 30.0))
            deadline = time.monotonic() + 60.0
            while not self.endpoint.arrivals_of(label):
                if turn.done() or time.monotonic() > deadline:
                    raise RuntimeError(f"deploy {label}: the model call did not start:\n{self.workers.log_tail()}")
                await asyncio.sleep(0.01)
            victim = await running_activity_pid(handle, "call_model", self.workers)
            self.workers.terminate(victim)
            term_at, term_mono = time.time(), time.monotonic()
            result, errors = await self._send_until(session, text, cid, turn, term_mono + self.case_timeout)
            reply_seconds = time.monotonic() - term_mono
            # The stopping worker's exit, still beside the hogs (its grace period is the
            # product's: model timeout + 30 s unless HERMES_WORKER_SHUTDOWN_SECONDS).
            exit_code = await asyncio.to_thread(self.workers.reap, victim, self.case_timeout)
            exit_seconds = time.monotonic() - term_mono
        self.workers.spawn()
        notes = [f"client got {e}" for e in errors]
        if result is None:
            notes.append(f"no reply within {self.case_timeout:.0f} s")
            with contextlib.suppress(Exception):
                await handle.terminate(reason="bench: no reply within the case timeout")
        elif result.reply != "model done":
            notes.append(f"reply {result.reply!r}, expected 'model done'")
        retried: Counter[str] = Counter()
        async for event in handle.fetch_history_events():
            if _event_seconds(event) < term_at - 0.001:
                continue
            if event.HasField("activity_task_started_event_attributes"):
                retried["attempts started after the SIGTERM"] += 1
            elif event.HasField("activity_task_timed_out_event_attributes"):
                kind = event.activity_task_timed_out_event_attributes.failure.timeout_failure_info.timeout_type
                retried[f"{TimeoutType.Name(kind).removeprefix('TIMEOUT_TYPE_').lower()} timeouts"] += 1
            elif event.HasField("activity_task_failed_event_attributes"):
                retried["attempts failed"] += 1
        notes += [f"{n} {what}" for what, n in sorted(retried.items())]
        return DeploySample(
            provider_calls=len(self.endpoint.arrivals_of(label)),
            reply_seconds=None if result is None else reply_seconds,
            exit_seconds=None if exit_code is None else exit_seconds,
            exit_code=exit_code,
            note="; ".join(notes),
        )

    async def measure(self, case: str, level: int, session: Session) -> Sample:
        await self.ready()
        self.counter += 1
        label = f"{case[0]}{self.counter}"
        handle = self.client.get_workflow_handle(session.session_id)
        text = f"{case} {label}"
        expected = {"idle": "ok", "tool": "tool done", "model": "model done"}[case]
        cid = f"bench-{self.tag}-{label}"
        turn: asyncio.Task[Any] | None = None
        if await cached_on_pid(self.client, handle) not in self.workers.alive():
            # Built before an earlier kill, on the worker killed then: one turn moves it to
            # a live worker (a replay, not measured), as a user's next message would.
            homed, errors = await self._send_until(
                session, "filler home", f"bench-{self.tag}-home{self.counter}",
                None, time.monotonic() + self.case_timeout,
            )
            if homed is None:
                await self.close(session)
                why = f"{len(errors)} x {errors[-1]}" if errors else "no reply"
                return Sample(case, level, None, description_length(await handle.describe()), {},
                              f"could not move the session to a live worker within {self.case_timeout:.0f} s "
                              f"before the measurement: {why}")
            session.turns += 1
        if case == "idle":
            victim = await cached_on_pid(self.client, handle)
            if victim not in self.workers.alive():
                raise RuntimeError(f"the session is cached on {victim}, not on a live bench worker")
        else:
            turn = asyncio.ensure_future(self._send(session, text, cid, self.case_timeout + 30.0))
            deadline = time.monotonic() + 30.0
            while not (read_markers(self.marker_file, label) if case == "tool" else self.endpoint.arrivals_of(label)):
                if turn.done():
                    raise RuntimeError(f"{case} {label}: the turn ended before the slow call ran: {turn.result()!r}")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{case} {label}: the slow call did not start within 30 s:\n{self.workers.log_tail()}")
                await asyncio.sleep(0.01)
            victim = await running_activity_pid(handle, "run_tool" if case == "tool" else "call_model", self.workers)
        description = await handle.describe()
        self.workers.kill(victim)
        kill_at, killed_mono = time.time(), time.monotonic()
        deadline = killed_mono + self.case_timeout
        result, errors = await self._send_until(session, text, cid, turn, deadline)  # idle: sent now
        elapsed = time.monotonic() - killed_mono
        reply_at = time.time()
        notes = []
        if result is None:
            with contextlib.suppress(Exception):
                await handle.terminate(reason="bench: no reply within the case timeout")
            notes.append(f"no reply within {self.case_timeout:.0f} s")
        else:
            session.turns += 1
            if result.reply != expected:
                raise RuntimeError(f"{case} {label}: reply {result.reply!r}, expected {expected!r}")
        # Two alive again before anything else runs (the replacement starts after the reply).
        self.workers.spawn()
        problems: list[str] = []
        phases = await timeline(
            self.client, session.session_id, description.run_id, case, label, kill_at, reply_at,
            victim, self.endpoint, self.marker_file, problems,
        )
        counted: dict[str, int] = {}
        for problem in problems + [f"client got {e}" for e in errors]:
            counted[problem] = counted.get(problem, 0) + 1
        notes += [f"{n} x {p}" if n > 1 else p for p, n in counted.items()]
        work = WORK_SECONDS if case != "idle" else 0.0
        return Sample(
            case=case,
            level=level,
            recovery=None if result is None else elapsed - work,
            history_events=description.history_length,
            phases=phases,
            note="; ".join(notes),
        )


# ------------------------------------------------------------------ figures


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def recovery_median(samples: list[Sample], cap: float) -> tuple[float, bool]:
    """Median recovery, a timed-out sample counting as ``cap``; and whether any timed out."""
    values = [s.recovery if s.recovery is not None else cap for s in samples]
    return statistics.median(values), any(s.recovery is None for s in samples)


def settings_in_force(args: Any) -> list[tuple[str, str, str | None, str]]:
    """(what, environment variable, value passed to the workers or None, how it is shown)."""
    from hermes.settings import Settings

    rows = []
    for flag, env_name, field_name, what in SETTINGS:
        value = getattr(args, flag)
        if value is None and os.environ.get(env_name):
            value = float(os.environ[env_name])
        known = Settings.model_fields.get(field_name)
        if value is not None:
            shown = f"{value:g} s ({env_name})"
            if known is None:
                shown += " [not a setting of this version: ignored]"
        elif known is not None:
            shown = f"{known.default:g} s (product default; {env_name})"
        else:
            shown = f"none ({env_name} is not a setting of this version)"
        rows.append((what, env_name, None if value is None else f"{value:g}", shown))
    return rows


def sample_line(s: Sample) -> str:
    got = f"{s.recovery:6.2f} s" if s.recovery is not None else "timed out"
    phases = " ".join(f"{k} {v:.2f}" for k, v in s.phases.items() if k != "history_kib")
    kib = s.phases.get("history_kib")
    return (
        f"  {s.case:<5} turn {s.level:>3}: recovery {got}  [{phases}]  "
        f"history {s.history_events} events{f', {kib:.0f} KiB' if kib is not None else ''}"
        f"{'  (' + s.note + ')' if s.note else ''}"
    )


def report(samples: list[Sample], cap: float, levels: tuple[int, ...], cases: tuple[str, ...]) -> None:
    """Print the medians, the turn ratios and, last, the headline."""
    print("\nmedians (recovery = kill to reply - 1 s for tool/model; timeline phases in s):")
    print(f"  {'case':<6}{'turn':>5}{'n':>3}  {'recovery':>10}  {'detect':>7}{'retry':>7}{'dispatch':>9}{'replay':>8}{'rest':>7}  history")
    worst: tuple[float, str, bool] = (0.0, "", False)
    medians: dict[tuple[str, int], tuple[float, bool]] = {}
    replays: dict[tuple[str, int], float | None] = {}
    for case in cases:
        for level in levels:
            group = [s for s in samples if s.case == case and s.level == level]
            if not group:
                continue
            median, timed_out = recovery_median(group, cap)
            medians[case, level] = (median, timed_out)
            phase = {k: _median([s.phases[k] for s in group if k in s.phases]) for k in ("detect", "retry", "dispatch", "replay", "rest")}
            replays[case, level] = phase["replay"]
            events = int(statistics.median([s.history_events for s in group]))
            shown = f"{'>=' if timed_out else ''}{median:.2f} s"
            cols = "".join(f"{'-' if v is None else f'{v:.2f}':>{w}}" for v, w in zip(phase.values(), (7, 7, 9, 8, 7)))
            print(f"  {case:<6}{level:>5}{len(group):>3}  {shown:>10}  {cols}  {events} events")
            if median > worst[0]:
                worst = (median, f"{case} at turn {level}", timed_out)
    first, last = levels[0], levels[-1]
    if first != last:
        print(f"\nturn {last} / turn {first} (target: at most 1.20):")
    for case in cases if first != last else ():
        low, high = medians.get((case, first)), medians.get((case, last))
        if low is None or high is None:
            continue
        if low[1] or high[1]:
            ratio = "n/a (timed out)"
        else:
            ratio = f"{high[0] / low[0]:.2f}"
        r_low, r_high = replays.get((case, first)), replays.get((case, last))
        replay = f"{r_high / r_low:.2f} ({r_low * 1000:.0f} -> {r_high * 1000:.0f} ms)" if r_low and r_high else "-"
        print(f"  {case:<6} recovery {ratio}   replay {replay}")
    if worst[2]:
        print(f"\nworst: {worst[1]} timed out: recovery_seconds is a lower bound (the case timeout)")
    else:
        print(f"\nworst: {worst[1]}")
    _common.headline("recovery_seconds", f"{worst[0]:.2f}")


# ------------------------------------------------------------------ main


async def main() -> None:
    p = _common.parser(__doc__.splitlines()[0])
    p.add_argument("-r", "--repetitions", type=int, help="measurements per case and turn (default 3, --quick 2)")
    p.add_argument("--case-timeout", type=float, help="seconds to wait for a reply after a kill (default 150, --quick 30)")
    p.add_argument("--tool-heartbeat", type=float, help="HERMES_TOOL_HEARTBEAT_SECONDS for the workers")
    p.add_argument("--model-heartbeat", type=float, help="HERMES_MODEL_HEARTBEAT_SECONDS for the workers (if the setting exists)")
    p.add_argument("--sticky-timeout", type=float, help="HERMES_STICKY_SCHEDULE_TO_START_SECONDS for the workers")
    p.add_argument("--model-timeout", type=float, help="HERMES_MODEL_TIMEOUT_SECONDS (model call start-to-close)")
    p.add_argument("--turns", type=int, nargs="+", help=f"session turn levels (default {' '.join(map(str, TURN_LEVELS))})")
    p.add_argument("--cases", nargs="+", choices=CASES, help="cases to run (default all)")
    p.add_argument("--deploy", action="store_true", help="instead of the cases: SIGTERM to the worker running a "
                   "model call, with CPU hogs beside it; prints deploy_provider_calls= (at the first --turns level)")
    p.add_argument("--hogs-per-core", type=int, default=8, help="CPU hogs per core during each --deploy measurement")
    p.add_argument("--log-dir", type=Path, help="keep the workers' logs in this directory (default: deleted)")
    p.add_argument(
        "--timer-shift",
        type=float,
        help="the server's history.timerProcessorMaxTimeShift in seconds (Hermes' dev servers: 0.1; Temporal's "
        "default, 1, is what a cluster has unless set: no server timer fires sooner than this after it was set)",
    )
    args = p.parse_args()
    for name in ("tool_heartbeat", "model_heartbeat", "sticky_timeout", "model_timeout", "case_timeout", "timer_shift"):
        value = getattr(args, name)
        if value is not None and value <= 0:
            p.error(f"--{name.replace('_', '-')} must be a positive number of seconds, not {value}")
    repetitions = args.repetitions or (2 if args.quick else 3)
    if repetitions < 1:
        p.error("--repetitions must be at least 1")
    case_timeout = args.case_timeout or (30.0 if args.quick else 150.0)
    levels = tuple(args.turns or TURN_LEVELS)
    if min(levels) < 1:
        p.error("--turns: every level must be at least 1")
    cases = tuple(c for c in CASES if c in (args.cases or CASES))

    # On SIGTERM the main task is cancelled, as asyncio does on Ctrl-C, so every `finally`
    # runs (servers and workers stopped); then the exit code says which signal it was.
    main_task = asyncio.current_task()
    assert main_task is not None
    stopped_by: list[int] = []

    def on_signal(signum: int) -> None:
        stopped_by.append(signum)
        main_task.cancel()

    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, on_signal, signal.SIGTERM)
    loop.set_exception_handler(_quiet_unretrieved_rpc_errors)
    try:
        await measure_all(args, levels, cases, repetitions, case_timeout)
    except asyncio.CancelledError:
        if stopped_by:
            print("\nstopped by SIGTERM; servers and workers stopped", file=sys.stderr)
            raise SystemExit(128 + stopped_by[0]) from None
        raise


UNRETRIEVED = [0]
"""How many "Future exception was never retrieved" of Temporal RPC errors were silenced."""


def _quiet_unretrieved_rpc_errors(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    """Count, instead of printing with a traceback, the RPC errors left unretrieved in the
    update-with-start's start-operation future when ``send_message`` fails (issue 12: the
    client prints one per failed send); everything else as asyncio would."""
    from temporalio.service import RPCError

    if context.get("message") == "Future exception was never retrieved" and isinstance(context.get("exception"), RPCError):
        UNRETRIEVED[0] += 1
        return
    loop.default_exception_handler(context)


async def measure_all(args: Any, levels: tuple[int, ...], cases: tuple[str, ...], repetitions: int, case_timeout: float) -> None:
    """Start everything, run every measurement, stop everything, print the figures."""
    rows = settings_in_force(args)
    print("settings in force (workers' environment):")
    for what, _, _, shown in rows:
        print(f"  {what}: {shown}")
    shift = args.timer_shift
    print(
        "  server history.timerProcessorMaxTimeShift: "
        + ("100 ms (Hermes' dev servers, hermes.infra.stack.DEV_SERVER_DYNAMIC_CONFIG)" if shift is None else f"{shift:g} s")
    )
    print(
        f"  slow call: {WORK_SECONDS:g} s per attempt; repetitions {repetitions}; case timeout {case_timeout:g} s; "
        f"turns {', '.join(map(str, levels))}; memory off; cpus {os.cpu_count()}, load average {_load()}",
        flush=True,
    )

    from hermes.client import HermesClient
    from hermes.security import command_auth
    from hermes.settings import Settings

    started = time.monotonic()
    endpoint = ModelEndpoint().start()
    try:
        dynamic = None if shift is None else {"history.timerProcessorMaxTimeShift": f'"{round(shift * 1000)}ms"'}
        async with _common.bench_stack(dynamic_config=dynamic) as stack:
            with tempfile.TemporaryDirectory(prefix="hermes-recovery-") as tmp:
                tmp_path = Path(tmp)
                task_queue = f"bench-recovery-{uuid.uuid4()}"
                marker_file = tmp_path / "tool-markers.jsonl"
                overrides = {env_name: value for _, env_name, value, _ in rows if value is not None}
                env = {k: v for k, v in os.environ.items() if not k.startswith(("HERMES_", "OPENAI_"))}
                env.update(
                    {
                        "TEMPORAL_ADDRESS": stack.client.service_client.config.target_host,
                        "REDIS_URL": stack.redis_url,
                        "HERMES_TASK_QUEUE": task_queue,
                        "HERMES_MODEL_PROVIDER": "openai",
                        "HERMES_OPENAI_BASE_URL": endpoint.base_url,
                        "HERMES_OPENAI_API_KEY": "bench",
                        "HERMES_TOOL_MODULES": "bench.recovery_tools",
                        "HERMES_MEMORY_ENABLED": "false",
                        "HERMES_DATA_DIR": str(tmp_path / "data"),
                        # The workers check commands with the keys this process signs with.
                        "HERMES_COMMAND_KEYS": command_auth.format_keys(command_auth.active()),
                        "HERMES_RECOVERY_MARKER_FILE": str(marker_file),
                        "HERMES_RECOVERY_WORK_SECONDS": str(WORK_SECONDS),
                        "PYTHONUNBUFFERED": "1",
                        **overrides,
                    }
                )
                # The client reads the same settings (a session's config comes from them).
                os.environ.update(overrides)
                log_dir = args.log_dir or tmp_path
                log_dir.mkdir(parents=True, exist_ok=True)
                workers = Workers(env, log_dir)
                hermes = None
                try:
                    await two_workers(stack.client, task_queue, workers)
                    hermes = await HermesClient.connect(
                        Settings(
                            temporal_address=stack.client.service_client.config.target_host,
                            redis_url=stack.redis_url,
                            task_queue=task_queue,
                        )
                    )
                    bench = Bench(stack, hermes, task_queue, workers, endpoint, marker_file, case_timeout)
                    if args.deploy:
                        deploys = await run_deploys(bench, levels[0], repetitions, args.hogs_per_core * (os.cpu_count() or 1))
                    else:
                        samples = await run_all(bench, levels, cases, repetitions)
                finally:
                    workers.stop_all()
                    if hermes is not None and hermes.redis is not None:
                        await hermes.redis.aclose()
    finally:
        endpoint.stop()
    print(f"\nworkers started: {workers.started}; wall time {time.monotonic() - started:.0f} s; load average {_load()}")
    if UNRETRIEVED[0]:
        print(f"client: {UNRETRIEVED[0]} unretrieved RPC errors of failed sends silenced (\"Future exception was never retrieved\")")
    if args.deploy:
        report_deploys(deploys)
    else:
        report(samples, case_timeout, levels, cases)


async def run_all(bench: Bench, levels: tuple[int, ...], cases: tuple[str, ...], repetitions: int) -> list[Sample]:
    """Every case ``repetitions`` times at every level, each measurement on a session of
    its own (all of a level built concurrently first): a session's first turns after a
    continue-as-new replay a short run, so a session measured twice would not be at the
    same point of its run twice. A case that times out skips its remaining repetitions
    at that level."""
    samples: list[Sample] = []
    for level in levels:
        building = time.monotonic()
        await bench.ready()
        fresh = await bench.build_many(level, len(cases) * repetitions)
        print(f"turn {level}: {len(fresh)} sessions built in {time.monotonic() - building:.1f} s (load {_load()})", flush=True)
        for case in cases:
            for _ in range(repetitions):
                sample = await bench.measure(case, level, fresh.pop())
                samples.append(sample)
                print(sample_line(sample), flush=True)
                if sample.recovery is None:
                    print(f"  {case} at turn {level}: timed out, its remaining repetitions skipped", flush=True)
                    break
        for session in fresh:  # those of skipped repetitions
            await bench.close(session)
    return samples


async def run_deploys(bench: Bench, level: int, repetitions: int, hogs: int) -> list[DeploySample]:
    """``repetitions`` deploys (:meth:`Bench.deploy`), each on a session of its own with ``level`` turns done."""
    await bench.ready()
    fresh = await bench.build_many(level, repetitions)
    print(f"deploy: {len(fresh)} sessions of {level} turns built; {hogs} CPU hogs during each measurement", flush=True)
    samples = []
    for session in fresh:
        sample = await bench.deploy(session, hogs)
        samples.append(sample)
        reply = "no reply" if sample.reply_seconds is None else f"reply {sample.reply_seconds:.2f} s"
        gone = "killed" if sample.exit_seconds is None else f"exited ({sample.exit_code}) {sample.exit_seconds:.2f} s"
        print(f"  deploy turn {level}: provider calls {sample.provider_calls}; {reply} after the SIGTERM; "
              f"worker {gone} after it{'  (' + sample.note + ')' if sample.note else ''}", flush=True)
    return samples


def report_deploys(samples: list[DeploySample]) -> None:
    """The worst deploy, last ``deploy_provider_calls=<max provider requests for one model step>``."""
    replies = [s.reply_seconds for s in samples if s.reply_seconds is not None]
    print(f"\ndeploys {len(samples)}: replies {len(replies)}"
          + (f", SIGTERM to reply median {statistics.median(replies):.2f} s max {max(replies):.2f} s" if replies else ""))
    _common.headline("deploy_provider_calls", str(max(s.provider_calls for s in samples)))


def _load() -> str:
    return " ".join(f"{v:.1f}" for v in os.getloadavg())


if __name__ == "__main__":
    _common.run(main)
