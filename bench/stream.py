"""Streamed turns: how soon the first event arrives, and what turn events cost in history.

    python bench/stream.py --quick    # 8 turns per series, about a minute on 2 cores
    python bench/stream.py            # 30 turns per series

What runs: a Temporal dev server and a Redis (bench/_common.py), workers in this process
(``worker.build_worker``) whose scripted model streams a 40-word reply word by word,
0.03 s apart (about 1.2 s of generation, as a provider's stream), and the HTTP API
(``hermes serve``'s app under uvicorn on a socket, an API key).

Series, turn by turn in turn (machine noise hits both alike), each turn on its own session
message through the API:

* ``json``: ``POST /v1/sessions/{id}/messages``, the reply whole: time to the reply.
* ``sse``: the same with ``Accept: text/event-stream``: time to the first event
  (``turn_started``), to the first text, and to the ``result`` event.

History: the same turns sent to two sessions on two workers, one publishing turn events
(``HERMES_EVENTS_ENABLED``, the default) and one not; history bytes per turn of each
(``history_size_bytes`` of the runs) and their ratio: ``stream_history_ratio`` (issue 16:
at most 1.5). Hermes' events go to a Redis Stream, so the ratio is about 1.

Workflow Streams: the same reply streamed through ``temporalio.contrib.workflow_streams``
instead (issue 16 asked for it first): a minimal workflow with a ``WorkflowStream`` built
in ``@workflow.init``, an activity publishing the same events (turn started, the text
deltas batched every 0.1 s as Hermes batches them, turn finished) with
``WorkflowStreamClient.from_within_activity()``, and a subscriber reading them as a client
would; against the same workflow and activity without the stream. Printed: the bytes it
adds per turn, and the ratio it would give the session (the session's bytes per turn plus
those, over the session's).

Last line: ``stream_history_ratio=<on/off, 2 decimals> first_event_ms=<sse median>``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import statistics
import tempfile
import time
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import _common
from temporalio import activity, workflow
from temporalio.contrib.workflow_streams import WorkflowStream, WorkflowStreamClient

WORDS = 40
CHUNK_SECONDS = 0.03
REPLY = " ".join(f"word{i}" for i in range(WORDS)) + "."
SCRIPT: dict[str, Any] = {
    "stream_chunk_seconds": CHUNK_SECONDS,
    "turns": [{"match": ".", "steps": [{"reply": REPLY}]}],
}


# --------------------------------------------------------------------------- Workflow Streams arm


@activity.defn(name="bench_stream_generate")
async def generate(streaming: bool) -> str:
    """The scripted reply, word by word; published to the parent workflow's stream when
    ``streaming`` (batched every 0.1 s, as hermes.content.events batches text)."""
    if not streaming:
        for _ in range(WORDS):
            await asyncio.sleep(CHUNK_SECONDS)
        return REPLY
    async with WorkflowStreamClient.from_within_activity(batch_interval=timedelta(seconds=0.1)) as stream:
        topic = stream.topic("events")
        topic.publish({"type": "turn_started"})
        for word in REPLY.split(" "):
            await asyncio.sleep(CHUNK_SECONDS)
            topic.publish({"type": "text_delta", "text": word + " "})
        topic.publish({"type": "turn_finished"})
    return REPLY


@workflow.defn(name="BenchStreamProbe")
class StreamProbe:
    """One update per turn running :func:`generate`; a WorkflowStream when ``streaming``."""

    @workflow.init
    def __init__(self, streaming: bool) -> None:
        self.streaming = streaming
        self.stream = WorkflowStream() if streaming else None
        self.closing = False

    @workflow.run
    async def run(self, streaming: bool) -> None:
        await workflow.wait_condition(lambda: self.closing)

    @workflow.update
    async def turn(self) -> str:
        return await workflow.execute_activity(
            generate, self.streaming, start_to_close_timeout=timedelta(seconds=60)
        )

    @workflow.signal
    def close(self) -> None:
        self.closing = True


async def _probe_turns(client: Any, task_queue: str, turns: int, streaming: bool) -> int:
    """History bytes per turn of a :class:`StreamProbe` run of ``turns`` turns (with a
    subscriber reading every event when ``streaming``)."""
    wid = f"bench-stream-probe-{streaming}-{uuid.uuid4().hex[:8]}"
    handle = await client.start_workflow(StreamProbe.run, streaming, id=wid, task_queue=task_queue)
    offset = 0
    for _ in range(turns):
        reader = None
        if streaming:
            async def read(start: int) -> int:
                async for item in WorkflowStreamClient.create(client, wid).subscribe("events", start):
                    start = item.offset + 1
                    if item.data.get("type") == "turn_finished":
                        return start
                return start

            reader = asyncio.ensure_future(read(offset))
        await handle.execute_update(StreamProbe.turn)
        if reader is not None:
            offset = await asyncio.wait_for(reader, 30)
    await handle.signal(StreamProbe.close)
    await handle.result()
    size = (await handle.describe()).raw_description.workflow_execution_info.history_size_bytes
    return int(size) // turns


# --------------------------------------------------------------------------- the session arms


async def _sse_turn(http: Any, url: str, headers: dict[str, str]) -> tuple[float, float, float, str]:
    """(first event, first text, result) seconds after the request, and the reply."""
    started = time.perf_counter()
    first = first_text = 0.0
    reply = ""
    event = ""
    async with http.stream("POST", url, json={"text": "talk to me"},
                           headers={**headers, "Accept": "text/event-stream", "Idempotency-Key": uuid.uuid4().hex}) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            if line.startswith("event: "):
                event = line[7:]
                now = time.perf_counter() - started
                first = first or now
                if event == "text_delta" and not first_text:
                    first_text = now
            elif line.startswith("data: ") and event == "result":
                reply = json.loads(line[6:])["reply"]
                return first, first_text, time.perf_counter() - started, reply
            elif line.startswith("data: ") and event == "error":
                raise RuntimeError(f"the turn failed: {line[6:]}")
    raise RuntimeError("the stream ended without a result")


async def _history_bytes(client: Any, session_id: str) -> int:
    info = (await client.get_workflow_handle(session_id).describe()).raw_description.workflow_execution_info
    return int(info.history_size_bytes)


async def main() -> None:
    p = _common.parser(__doc__.splitlines()[0])
    p.add_argument("--turns", type=int, default=None, help="turns per series (default 30; 8 with --quick)")
    args = p.parse_args()
    turns = args.turns or (8 if args.quick else 30)

    import httpx2
    import uvicorn
    from temporalio.worker import UnsandboxedWorkflowRunner, Worker

    from hermes.api import KeyRing, add_key, create_app
    from hermes.client import HermesClient
    from hermes.infra.stack import free_port
    from hermes.providers.scripted import ScriptedModel
    from hermes.settings import Settings
    from hermes.tools.builtin import register_builtins
    from hermes.tools.registry import ToolRegistry
    from worker import build_worker

    async with _common.bench_stack() as stack, contextlib.AsyncExitStack() as stop:
        client = stack.client
        tmp = Path(stop.enter_context(tempfile.TemporaryDirectory(prefix="hermes-bench-stream-")))
        queues = {on: f"bench-stream-{on}-{uuid.uuid4().hex[:8]}" for on in (True, False)}
        for on, queue in queues.items():
            settings = Settings(
                redis_url=stack.redis_url, task_queue=queue, temporal_address="unused:0", events_enabled=on,
                data_dir=tmp / f"data-{on}",
            )
            worker = build_worker(
                client, settings, provider=ScriptedModel.from_dict(SCRIPT, source="bench"),
                registry=register_builtins(ToolRegistry()), redis=stack.redis, memory=False,
            )
            await stop.enter_async_context(worker)
        probe_queue = f"bench-stream-probe-{uuid.uuid4().hex[:8]}"
        await stop.enter_async_context(
            Worker(client, task_queue=probe_queue, workflows=[StreamProbe], activities=[generate],
                   workflow_runner=UnsandboxedWorkflowRunner())
        )

        keys = tmp / "keys.yaml"
        key = add_key(keys, "bench", ["user"])
        hermes = HermesClient(client, task_queue=queues[True], redis=stack.redis)
        api_settings = Settings(data_dir=stack.data_dir, redis_url=stack.redis_url, task_queue=queues[True], temporal_address="unused:0")
        port = free_port()
        server = uvicorn.Server(uvicorn.Config(
            create_app(api_settings, keys=KeyRing(keys), hermes=hermes),
            host="127.0.0.1", port=port, lifespan="off", log_config=None, access_log=False,
        ))
        server.capture_signals = contextlib.nullcontext  # type: ignore[method-assign]
        serving = asyncio.ensure_future(server.serve())
        while not server.started:
            await asyncio.sleep(0.02)
        try:
            http = await stop.enter_async_context(httpx2.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=60.0))
            auth = {"Authorization": f"Bearer {key}"}
            sids = {name: f"bench-stream-{name}-{uuid.uuid4().hex[:8]}" for name in ("json", "sse")}
            for sid in sids.values():
                (await http.post("/v1/sessions", json={"session_id": sid}, headers=auth)).raise_for_status()
            json_s: list[float] = []
            first_s: list[float] = []
            text_s: list[float] = []
            sse_s: list[float] = []
            for _ in range(turns + 1):  # the first turn of each warms the path up
                started = time.perf_counter()
                # A key per message: the same body again would be taken as a retry (hermes.api.retries).
                r = await http.post(f"/v1/sessions/{sids['json']}/messages", json={"text": "talk to me"},
                                    headers={**auth, "Idempotency-Key": uuid.uuid4().hex})
                r.raise_for_status()
                json_s.append(time.perf_counter() - started)
                first, first_text, total, reply = await _sse_turn(http, f"/v1/sessions/{sids['sse']}/messages", auth)
                assert reply == REPLY, reply
                first_s.append(first)
                text_s.append(first_text)
                sse_s.append(total)
            json_s, first_s, text_s, sse_s = json_s[1:], first_s[1:], text_s[1:], sse_s[1:]

            # History bytes per turn, events on and off: the same turns, plain client sends.
            per_turn: dict[bool, float] = {}
            for on, queue in queues.items():
                sender = HermesClient(client, task_queue=queue, redis=stack.redis)
                sid = f"bench-stream-history-{on}-{uuid.uuid4().hex[:8]}"
                for i in range(turns):
                    await sender.send_message(sid, f"talk to me {i}", user_id="bench")
                per_turn[on] = await _history_bytes(client, sid) / turns
            ratio = per_turn[True] / per_turn[False]

            probe_off = await _probe_turns(client, probe_queue, turns, streaming=False)
            probe_on = await _probe_turns(client, probe_queue, turns, streaming=True)
        finally:
            server.should_exit = True
            await asyncio.wait_for(serving, 30)

    def ms(values: list[float]) -> str:
        return f"median {statistics.median(values) * 1000:.0f} ms (min {min(values) * 1000:.0f}, max {max(values) * 1000:.0f})"

    added = probe_on - probe_off
    print(f"turns per series: {turns}; reply: {WORDS} words streamed {CHUNK_SECONDS * 1000:.0f} ms apart")
    print(f"json  reply:         {ms(json_s)}")
    print(f"sse   first event:   {ms(first_s)}")
    print(f"sse   first text:    {ms(text_s)}")
    print(f"sse   result:        {ms(sse_s)}")
    print(f"history per turn: events on {per_turn[True]:.0f} B, off {per_turn[False]:.0f} B (Redis Streams: nothing in history)")
    print(
        f"workflow_streams: probe workflow {probe_on} B/turn with the stream and a subscriber, {probe_off} B/turn without: "
        f"+{added} B/turn; on the session that would be a ratio of {(per_turn[False] + added) / per_turn[False]:.2f}"
    )
    _common.headline("stream_history_ratio", f"{ratio:.2f} first_event_ms={statistics.median(first_s) * 1000:.0f}")


if __name__ == "__main__":
    _common.run(main)
