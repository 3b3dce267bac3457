"""A model call whose worker dies or is stopped: retried in seconds, or finished, never billed twice.

In process (``ActivityEnvironment``): model calls, summaries and memory extractions
heartbeat while the provider thinks (the provider answers only after some heartbeats).

With real workers: the workers are real subprocesses (``python worker.py``, configured only through the
environment, as in tests/test_crash.py) using the OpenAI-compatible provider against a
local HTTP server speaking the chat-completions wire. The server holds the first request
it gets until the test releases it (so the test can kill or stop the worker meanwhile),
answers every later one at once, and counts them all:

- SIGKILL: the attempt stops heartbeating, is failed by a *heartbeat* timeout (seconds,
  ``HERMES_MODEL_HEARTBEAT_SECONDS``) instead of the 120 s start-to-close one, and is
  retried on the other worker; the turn completes with the reply;
- SIGTERM (a deploy) to ``python worker.py``, ``hermes worker`` or ``hermes dev``: the
  stopping worker takes no new work but lets the call finish and report
  (``HERMES_WORKER_SHUTDOWN_SECONDS``), heartbeating all the while, so the provider sees
  exactly one request for the step, and the worker then exits with 0.

Long-term memory is off in the workers: its extraction would be a second model request.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from datetime import datetime, timedelta, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from temporalio.service import RPCError
from temporalio.api.enums.v1 import EventType, TaskQueueType, TimeoutType
from temporalio.api.taskqueue.v1 import TaskQueue
from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest
from temporalio import activity
from temporalio.client import Client
from temporalio.testing import ActivityEnvironment

from activities.heartbeat import beat_interval_seconds, heartbeating
from activities.memory import MemoryActivities
from activities.model import ModelActivities
from hermes import names
from hermes.security import command_auth
from hermes.client import HermesClient
from hermes.memory.models import ConversationExcerpt, ExtractMemoriesInput
from hermes.models import CallModelInput, CallModelResult, Message, SessionConfig, SummarizeInput
from hermes.infra.stack import free_port
from tests.support import eventually
from tests.test_replay import replayer
from workflows.session import calls
from tests.test_crash import kill_group, worker_log

MAIN_DIR = Path(__file__).resolve().parent.parent
MODEL = "fake-model"
HEARTBEAT_SECONDS = SessionConfig().model_heartbeat_seconds
"""The default (1 s): the tests check the shipped setting, not a lowered one."""
OLD_GRACEFUL_SECONDS = 5.0
"""The worker's graceful shutdown before it became a setting: a call held longer than this
after SIGTERM would have been cancelled and sent to the provider again."""


# ------------------------------------------------- in process: the activities heartbeat


class ThinkingProvider:
    """A provider that answers only once the activity has heartbeated ``beats`` times
    while it waited (a provider that never answers would hang, so the test bounds it)."""

    name = "thinking"

    def __init__(self, beats: int) -> None:
        self.beats = beats
        self.seen = 0
        self._enough = asyncio.Event()

    def on_heartbeat(self, *details: Any) -> None:
        self.seen += 1
        if self.seen >= self.beats:
            self._enough.set()

    async def complete(self, request: CallModelInput) -> CallModelResult:
        await self._enough.wait()
        return CallModelResult(message=Message(role="assistant", content=f"thought for {self.seen} heartbeats"))


def activity_env(provider: ThinkingProvider, heartbeat_timeout_seconds: float) -> ActivityEnvironment:
    env = ActivityEnvironment()
    env.info = dataclasses.replace(env.info, heartbeat_timeout=timedelta(seconds=heartbeat_timeout_seconds))
    env.on_heartbeat = provider.on_heartbeat
    return env


async def test_a_model_call_heartbeats_while_it_waits_on_the_provider():
    provider = ThinkingProvider(beats=3)
    request = CallModelInput(session_id="s-beats", turn=1, messages=[Message(role="user", content="think")])
    result = await asyncio.wait_for(
        activity_env(provider, 0.2).run(ModelActivities(provider).call_model, request), 10
    )
    assert result.message.content == "thought for 3 heartbeats"


async def test_a_summary_heartbeats_while_it_waits_on_the_provider():
    provider = ThinkingProvider(beats=3)
    request = SummarizeInput(session_id="s-beats", message_refs=[], upto_turn=1, previous_summary="earlier")
    summary = await asyncio.wait_for(
        activity_env(provider, 0.2).run(ModelActivities(provider).summarize_context, request), 10
    )
    assert summary.text == "thought for 3 heartbeats"


async def test_a_memory_extraction_heartbeats_while_it_waits_on_the_provider():
    provider = ThinkingProvider(beats=3)
    request = ExtractMemoriesInput(
        user_id="u-beats",
        session_id="s-beats",
        turn=1,
        created_at=datetime.now(timezone.utc),
        excerpt=[ConversationExcerpt(turn=1, role="user", text="I live in Lyon")],
        use_model=True,
    )
    memory = MemoryActivities(lambda: None, provider=provider)  # type: ignore[arg-type, return-value]
    result = await asyncio.wait_for(activity_env(provider, 0.2).run(memory.extract_memories, request), 10)
    assert provider.seen >= 3 and result.delivered == 0  # the answer is not an extraction: nothing to deliver


async def test_a_memory_judge_heartbeats_while_it_waits_on_the_provider(monkeypatch: pytest.MonkeyPatch):
    """The judge's model call beats like every model call (found by a break-it review: only
    its store calls did, so a judge call longer than the timeout was asked and paid again)."""
    from hermes.memory.judge import JudgeMemoriesInput, JudgePair
    from hermes.memory.store import MemoryStore

    class Rows:
        def forget_cached(self, user_id: str) -> None:
            pass

    monkeypatch.setattr(MemoryStore, "pair_texts", lambda self, pair: ("The user lives in Lyon.", "The user lives in Oslo."))
    monkeypatch.setattr(MemoryStore, "apply_verdict", lambda self, *args, **kwargs: "kept")
    provider = ThinkingProvider(beats=3)
    memory = MemoryActivities(lambda: Rows(), provider=provider)  # type: ignore[arg-type, return-value]
    request = JudgeMemoriesInput(user_id="u-beats", pairs=[JudgePair(older_id="a", newer_id="b", similarity=0.9)], max_calls=1)
    report = await asyncio.wait_for(activity_env(provider, 0.2).run(memory.judge_memories, request), 10)
    assert provider.seen >= 3 and report.asked == 1


async def test_one_heartbeating_block_entered_twice_is_refused_and_the_first_keeps_beating():
    """Each block makes its own ``heartbeating()``: entering one object again (nested) is
    refused, and the block that holds it keeps beating."""
    provider = ThinkingProvider(beats=10**6)
    env = activity_env(provider, 0.3)

    async def body() -> None:
        block = heartbeating()
        async with block:
            with pytest.raises(RuntimeError, match="already entered"):
                async with block:
                    pass
            seen = provider.seen
            await asyncio.sleep(0.5)  # ten intervals of 0.05 s
            assert provider.seen >= seen + 3, "the block stopped beating"

    await env.run(body)


def test_heartbeats_are_queued_four_times_per_heartbeat_timeout():
    # The SDK sends the newest queued heartbeat every 0.8 x timeout: one is always queued.
    assert beat_interval_seconds(3.0) == 0.5
    assert beat_interval_seconds(0.1) == 0.05
    assert beat_interval_seconds(None) == beat_interval_seconds(0) == 5.0


async def test_heartbeating_outside_an_activity_does_nothing_and_a_bad_interval_is_refused():
    async with heartbeating():
        pass
    env = ActivityEnvironment()

    async def bad() -> None:
        async with heartbeating(0):
            pass

    with pytest.raises(ValueError, match="interval_seconds"):
        await env.run(bad)


# ------------------- a worker that looks dead to every attempt: the step is started again


class FrozenWorkerModel:
    """A provider whose first ``busy_calls`` calls answer only after ``hold_seconds``
    while their worker looks dead by every measure (see the ``frozen`` fixture): no
    heartbeat of theirs leaves the worker and no lease or result of the step is kept, so
    each of their attempts ends in a heartbeat timeout and is retried. Later calls answer
    at once."""

    name = "frozen-worker"

    def __init__(self, *, busy_calls: int, hold_seconds: float) -> None:
        self.busy_calls = busy_calls
        self.hold_seconds = hold_seconds
        self.calls = 0

    def busy_next(self) -> bool:
        """Whether the next call is a busy one (asked as its attempt starts heartbeating)."""
        return self.calls < self.busy_calls

    async def complete(self, request: CallModelInput) -> CallModelResult:
        self.calls += 1
        if self.calls <= self.busy_calls:
            await asyncio.sleep(self.hold_seconds)  # the call outlives its attempt's heartbeat timeout
        return CallModelResult(message=Message(role="assistant", content=f"answered on call {self.calls}"))


@pytest.fixture
def frozen(monkeypatch: pytest.MonkeyPatch) -> Callable[[FrozenWorkerModel], None]:
    """``frozen(model)``: the busy calls of ``model`` lose their heartbeats, and model
    steps keep no lease or result (as a frozen process, or a worker whose heartbeats and
    Redis both fail), so the session's own recovery is what is left."""
    from activities import heartbeat as heartbeat_module
    from activities.model_steps import ModelSteps

    def freeze(model: FrozenWorkerModel) -> None:
        real = heartbeat_module.heartbeat_sender

        def lossy() -> Callable[[], None]:
            if activity.info().activity_type == names.CALL_MODEL and model.busy_next():
                return lambda: None
            return real()

        monkeypatch.setattr(heartbeat_module, "heartbeat_sender", lossy)
        monkeypatch.setattr(ModelSteps, "client", lambda self: None)

    return freeze


async def model_activity_events(client: Client, session_id: str) -> tuple[list[Any], list[Any]]:
    """(scheduled, timed out) events of the session's model-call activities."""
    history = await client.get_workflow_handle(session_id).fetch_history()
    scheduled = [
        e.activity_task_scheduled_event_attributes
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
        and e.activity_task_scheduled_event_attributes.activity_type.name == names.CALL_MODEL
    ]
    timed_out = [
        e.activity_task_timed_out_event_attributes
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_TIMED_OUT
    ]
    return scheduled, timed_out


async def test_a_model_step_whose_attempts_all_missed_their_heartbeat_is_started_again_and_the_turn_is_answered(
    run_worker, session_id, temporal_client, frozen
):
    # The issue 12 soak: one worker left with 50 sessions on a loaded machine spent a
    # step's five attempts on 1 s heartbeat timeouts in seconds and the turn was lost.
    cfg = SessionConfig()
    model = FrozenWorkerModel(busy_calls=cfg.model_max_attempts, hold_seconds=3 * cfg.model_heartbeat_seconds)
    frozen(model)
    async with run_worker(model) as hermes:
        result = await hermes.send_message(session_id, "hello")
    assert result.status == "completed", result
    assert int(result.reply.rsplit(" ", 1)[1]) > cfg.model_max_attempts, result.reply
    scheduled, timed_out = await model_activity_events(temporal_client, session_id)
    assert [s.heartbeat_timeout.ToTimedelta() for s in scheduled] == [
        timedelta(seconds=cfg.model_heartbeat_seconds), timedelta(seconds=2 * cfg.model_heartbeat_seconds)
    ]
    assert [t.failure.timeout_failure_info.timeout_type for t in timed_out] == [TimeoutType.TIMEOUT_TYPE_HEARTBEAT]
    # The step started again replays as it ran.
    history = await temporal_client.get_workflow_handle(session_id).fetch_history()
    await replayer().replay_workflow(history)


async def test_a_model_step_lost_on_every_heartbeat_is_started_again_a_bounded_number_of_times(
    run_worker, session_id, temporal_client, frozen
):
    # One attempt per start, heartbeats of 0.25, 0.5, 1 and 2 s: a call that holds the loop
    # for 3 s misses every one of them; the turn ends with the model error, not a loop.
    cfg = SessionConfig(model_max_attempts=1, model_heartbeat_seconds=0.25)
    model = FrozenWorkerModel(busy_calls=100, hold_seconds=3.0)
    frozen(model)
    async with run_worker(model, config=cfg) as hermes:
        result = await hermes.send_message(session_id, "hello")
        assert result.status == "model_error", result
        assert "could not answer" in result.reply and "heartbeat" in result.reply
        scheduled, timed_out = await model_activity_events(temporal_client, session_id)
        assert [s.heartbeat_timeout.ToTimedelta() for s in scheduled] == [
            timedelta(seconds=0.25 * 2**n) for n in range(calls.MODEL_REISSUES + 1)
        ]
        assert len(timed_out) == calls.MODEL_REISSUES + 1
        assert model.calls == calls.MODEL_REISSUES + 1
        # The session stays usable.
        model.busy_calls = 0
        after = await hermes.send_message(session_id, "again")
        assert after.status == "completed"


# ---------------------------------------------- worker subprocesses and a provider


class HoldingProvider:
    """A chat-completions endpoint that holds the first request until :meth:`release`
    and answers every request with ``reply to <the user's last message>``.

    ``requests`` lists the user message of every request, in arrival order, and
    ``arrived_at`` their ``time.monotonic()``.
    """

    def __init__(self) -> None:
        self.requests: list[str] = []
        self.arrived_at: list[float] = []
        self.first_received = threading.Event()
        self._release = threading.Event()
        self._lock = threading.Lock()
        provider = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's naming
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
                users = [m.get("content") for m in body.get("messages", []) if m.get("role") == "user"]
                text = users[-1] if users else ""
                with provider._lock:
                    provider.requests.append(text)
                    provider.arrived_at.append(time.monotonic())
                    first = len(provider.requests) == 1
                if first:
                    provider.first_received.set()
                    provider._release.wait(120)
                data = json.dumps(_completion(f"reply to {text}")).encode()
                try:
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except OSError:
                    pass  # the worker that asked was killed meanwhile

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - quiet
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.base_url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        self._thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()

    def release(self) -> None:
        self._release.set()

    def stop(self) -> None:
        self.release()
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(timeout=5)


def _completion(content: str) -> dict[str, Any]:
    return {
        "id": "chatcmpl-recovery",
        "object": "chat.completion",
        "created": 1_700_000_000,
        "model": MODEL,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18},
    }


@pytest.fixture
def provider() -> Iterator[HoldingProvider]:
    server = HoldingProvider()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def spawn_worker(
    tmp_path: Path, temporal_env: Any, redis_url: str, task_queue: str, provider: HoldingProvider
) -> Iterator[Callable[..., subprocess.Popen[bytes]]]:
    """``spawn(command=("worker.py",))`` starts ``python <command>`` on the holding
    provider; each one still running at teardown is stopped (SIGTERM, then SIGKILL of its
    group) and reaped."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HERMES_", "OPENAI_"))}
    env.update(
        {
            "TEMPORAL_ADDRESS": temporal_env.client.service_client.config.target_host,
            "REDIS_URL": redis_url,
            "HERMES_TASK_QUEUE": task_queue,
            "HERMES_MODEL_PROVIDER": "openai",
            "HERMES_OPENAI_BASE_URL": provider.base_url,
            "HERMES_OPENAI_API_KEY": "test",
            "HERMES_MODEL": MODEL,
            "HERMES_MEMORY_ENABLED": "false",
            "HERMES_DATA_DIR": str(tmp_path / "data"),
            "HERMES_CODEC_PORT": str(free_port()),  # `hermes dev` serves one
            "PYTHONUNBUFFERED": "1",
            # The command keys of this process, whose clients talk to these workers.
            "HERMES_COMMAND_KEYS": command_auth.format_keys(command_auth.active()),
        }
    )
    procs: list[tuple[subprocess.Popen[bytes], Any]] = []

    def spawn(command: tuple[str, ...] = ("worker.py",)) -> subprocess.Popen[bytes]:
        log = open(tmp_path / f"worker-{len(procs)}.log", "wb")  # noqa: SIM115 - closed at teardown
        proc = subprocess.Popen(
            [sys.executable, *command],
            cwd=MAIN_DIR,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        procs.append((proc, log))
        return proc

    try:
        yield spawn
    finally:
        provider.release()  # a worker still in its graceful shutdown can finish
        for proc, _ in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc, log in procs:
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                pass
            kill_group(proc)
            log.close()


async def until(
    condition: Callable[[], Awaitable[Any] | Any], what: str, tmp_path: Path, *, timeout_seconds: float = 60.0
) -> Any:
    """Poll ``condition`` (sync or async) until it returns something truthy; fail naming
    ``what`` (with the worker logs) after ``timeout_seconds``."""
    deadline = time.monotonic() + timeout_seconds
    while True:
        value = condition()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout_seconds} s\n{worker_log(tmp_path)}")
        await asyncio.sleep(0.05)


async def polling_pids(client: Client, task_queue: str) -> set[int]:
    """Pids of the workers that polled ``task_queue``'s activities lately (a worker's
    identity is ``<pid>@<host>``)."""
    try:
        answer = await client.workflow_service.describe_task_queue(
            DescribeTaskQueueRequest(
                namespace=client.namespace,
                task_queue=TaskQueue(name=task_queue),
                task_queue_type=TaskQueueType.TASK_QUEUE_TYPE_ACTIVITY,
            )
        )
    except RPCError:  # a transient failure of a busy dev server ("operation was canceled"): poll again
        return set()
    return {int(p.identity.split("@", 1)[0]) for p in answer.pollers if p.identity.split("@", 1)[0].isdigit()}


async def wait_polling(client: Client, task_queue: str, proc: subprocess.Popen[bytes], tmp_path: Path) -> None:
    async def ready() -> bool:
        if proc.poll() is not None:
            raise AssertionError(f"worker {proc.pid} exited with {proc.returncode}\n{worker_log(tmp_path)}")
        return proc.pid in await polling_pids(client, task_queue)

    # A worker takes 1-3 s to start, 10-15 s on a loaded 2-core machine.
    await until(ready, f"worker {proc.pid} polling {task_queue}", tmp_path, timeout_seconds=120)


async def model_call_started_events(client: Client, session_id: str) -> list[Any]:
    """The ``ActivityTaskStarted`` attributes of the session's ``call_model`` activities."""
    history = await client.get_workflow_handle(session_id).fetch_history()
    model_ids = {
        e.event_id
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
        and e.activity_task_scheduled_event_attributes.activity_type.name == names.CALL_MODEL
    }
    return [
        e.activity_task_started_event_attributes
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED
        and e.activity_task_started_event_attributes.scheduled_event_id in model_ids
    ]


async def start_turn(
    spawn_worker: Callable[..., subprocess.Popen[bytes]],
    temporal_client: Client,
    redis: Any,
    task_queue: str,
    session_id: str,
    provider: HoldingProvider,
    tmp_path: Path,
    text: str,
    command: tuple[str, ...] = ("worker.py",),
) -> tuple[asyncio.Task[Any], subprocess.Popen[bytes]]:
    """Start a worker (``python <command>``), send ``text``, and return once the
    provider holds its model request."""
    first = spawn_worker(command)
    await wait_polling(temporal_client, task_queue, first, tmp_path)
    hermes = HermesClient(temporal_client, task_queue=task_queue, redis=redis)
    turn = asyncio.ensure_future(hermes.send_message(session_id, text, user_id="recovery-test"))

    def held() -> bool:
        if turn.done():
            raise AssertionError(f"the turn ended before its model call was held: {turn.result()!r}")
        return provider.first_received.is_set()

    await until(held, "the model request reached the provider", tmp_path)
    return turn, first


@pytest.mark.timeout(600)
async def test_a_model_call_on_a_killed_worker_is_retried_on_another_after_a_heartbeat_timeout(
    spawn_worker, temporal_client, redis, task_queue, session_id, provider, tmp_path
):
    turn, first = await start_turn(
        spawn_worker, temporal_client, redis, task_queue, session_id, provider, tmp_path, "hello after a crash"
    )
    try:
        second = spawn_worker()
        await wait_polling(temporal_client, task_queue, second, tmp_path)
        kill_group(first)
        killed_at = time.monotonic()
        try:
            # Far below the 120 s start-to-close timeout that used to be the only way out.
            result = await asyncio.wait_for(asyncio.shield(turn), 30)
        except asyncio.TimeoutError:
            raise AssertionError(f"no reply within 30 s of the kill\n{worker_log(tmp_path)}") from None
        elapsed = time.monotonic() - killed_at
        retried = provider.arrived_at[-1] - killed_at if len(provider.arrived_at) > 1 else float("nan")
        print(
            f"\nkill-to-reply (model call, heartbeat timeout {HEARTBEAT_SECONDS:g} s): {elapsed:.2f} s "
            f"(the retry reached the provider after {retried:.2f} s)"
        )
    finally:
        if not turn.done():
            turn.cancel()
            await asyncio.gather(turn, return_exceptions=True)

    assert result.status == "completed"
    assert result.reply == "reply to hello after a crash"
    assert provider.requests == ["hello after a crash"] * 2, "one request from each worker"
    [started] = await model_call_started_events(temporal_client, session_id)
    assert started.attempt == 2, "the call completed on its second attempt"
    assert started.last_failure.HasField("timeout_failure_info"), started.last_failure
    assert started.last_failure.timeout_failure_info.timeout_type == TimeoutType.TIMEOUT_TYPE_HEARTBEAT, (
        f"the first attempt must end by a heartbeat timeout, got {TimeoutType.Name(started.last_failure.timeout_failure_info.timeout_type)}"
    )
    assert second.poll() is None


@pytest.mark.timeout(600)
@pytest.mark.parametrize(
    "command",
    [("worker.py",), ("-m", "hermes.cli", "worker"), ("-m", "hermes.cli", "dev")],
    ids=["python worker.py", "hermes worker", "hermes dev"],
)
async def test_a_worker_stopped_mid_model_call_finishes_it_and_the_provider_is_called_once(
    command, spawn_worker, temporal_client, redis, task_queue, session_id, provider, tmp_path
):
    turn, first = await start_turn(
        spawn_worker, temporal_client, redis, task_queue, session_id, provider, tmp_path, "hello during a deploy", command
    )
    handle = temporal_client.get_workflow_handle(session_id)
    try:
        first.send_signal(signal.SIGTERM)
        stopped_at = time.time()
        second = spawn_worker()
        await wait_polling(temporal_client, task_queue, second, tmp_path)

        async def heartbeating_past_the_old_shutdown() -> bool:
            # The stopping worker still runs the call and heartbeats it, well past both the
            # heartbeat timeout and the 5 s after which it used to cancel it.
            if first.poll() is not None:
                raise AssertionError(f"the stopping worker exited mid-call ({first.returncode})\n{worker_log(tmp_path)}")
            pending = [
                a
                for a in (await handle.describe()).raw_description.pending_activities
                if a.activity_type.name == names.CALL_MODEL
            ]
            assert len(pending) == 1, f"expected one running model call, got {len(pending)}"
            assert pending[0].attempt == 1, (
                f"the stopping worker gave the call up: attempt {pending[0].attempt} is "
                f"{pending[0].state}, last failure: {pending[0].last_failure.message!r}"
            )
            beat = pending[0].last_heartbeat_time
            return beat.seconds > 0 and beat.ToDatetime().timestamp() > stopped_at + OLD_GRACEFUL_SECONDS + 1

        await until(heartbeating_past_the_old_shutdown, "heartbeats from the stopping worker", tmp_path)
        assert provider.requests == ["hello during a deploy"], "no second worker may have called the provider"
        provider.release()
        try:
            result = await asyncio.wait_for(asyncio.shield(turn), 60)
        except asyncio.TimeoutError:
            raise AssertionError(f"no reply within 60 s of the release\n{worker_log(tmp_path)}") from None
    finally:
        if not turn.done():
            turn.cancel()
            await asyncio.gather(turn, return_exceptions=True)

    assert result.status == "completed"
    assert result.reply == "reply to hello during a deploy"
    assert provider.requests == ["hello during a deploy"], "the provider is called once for the step"
    [started] = await model_call_started_events(temporal_client, session_id)
    assert started.attempt == 1
    # The stopped worker exits by itself, normally, once its call has reported.
    await until(lambda: first.poll() is not None, "the stopped worker to exit", tmp_path, timeout_seconds=30)
    assert first.returncode == 0, worker_log(tmp_path)
    assert second.poll() is None


# ------------------- the context a model call needs, when only its session has it


async def test_a_model_call_asks_its_session_again_until_it_answers_and_then_gets_its_reply(
    run_worker, temporal_client, session_id, monkeypatch, caplog
):
    """Redis is down (no content store) and the session's worker is away for a few
    seconds (killed, or busy on a loaded machine): the call's queries for the context
    time out; it asks again with backoff instead of failing the attempt (which, five
    times in a row, used to end the turn with "The model could not answer"), and answers
    once a worker serves the session again."""
    import activities.model as model_module
    from hermes.content.blobs import BlobStore
    from hermes.providers.scripted import ScriptedModel

    script = {"turns": [{"match": ".*", "steps": [{"reply": "reply to {{ user }}"}]}]}
    async with run_worker(script) as hermes:
        await hermes.send_message(session_id, "what the session alone keeps", user_id="u")
    history = await temporal_client.get_workflow_handle(session_id).fetch_history()
    [request] = [
        CallModelInput.model_validate_json(e.activity_task_scheduled_event_attributes.input.payloads[0].data)
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
        and e.activity_task_scheduled_event_attributes.activity_type.name == names.CALL_MODEL
    ]
    assert request.context_ref and not request.messages, "the call carries references, not bodies"
    # As a call of a run recorded before the model-context-stored patch: only such a call
    # asks its session (tests/test_model_no_query.py has the calls of newer runs).
    request = request.model_copy(update={"bodies_stored": False, "bodies": {}})

    monkeypatch.setattr(model_module, "SESSION_QUERY_RPC_SECONDS", 2.0, raising=False)
    activities = ModelActivities(ScriptedModel.from_dict(script), store=BlobStore(None), client=temporal_client)
    back = asyncio.Event()
    done = asyncio.Event()

    def asked_again() -> bool:
        return any("asking again" in r.getMessage() for r in caplog.records)

    async def a_query_found_no_worker() -> bool:
        return asked_again()

    async def worker_back_later() -> None:
        # Back once a query found no worker (not after a fixed time: on a loaded machine
        # the call's first query could be sent after a worker was already back).
        await eventually(a_query_found_no_worker, what="a query that found no worker", timeout_seconds=45)
        async with run_worker(script):
            back.set()
            await done.wait()

    returning = asyncio.create_task(worker_back_later())
    try:
        result = await asyncio.wait_for(ActivityEnvironment().run(activities.call_model, request), 60)
    finally:
        done.set()
        await returning
    assert back.is_set()
    assert result.message.content == "reply to what the session alone keeps"
    assert asked_again(), "the first queries found no worker"


async def test_a_model_call_does_not_wait_on_a_session_that_does_not_exist(temporal_client, monkeypatch):
    """NOT_FOUND is final: no patience is spent on a session that is gone."""
    from hermes.content.blobs import BlobStore
    from hermes.providers.scripted import ScriptedModel

    activities = ModelActivities(
        ScriptedModel.from_dict({"turns": []}), store=BlobStore(None), client=temporal_client
    )
    request = CallModelInput(session_id="no-such-session-" + os.urandom(4).hex(), turn=1, context_ref="c" * 64, step=0)
    started = time.monotonic()
    with pytest.raises(Exception) as caught:
        await ActivityEnvironment().run(activities.call_model, request)
    assert time.monotonic() - started < 10, "a missing session is not asked again"
    assert "not found" in str(caught.value).lower() or "ContextResolutionError" in repr(caught.value), caught.value
