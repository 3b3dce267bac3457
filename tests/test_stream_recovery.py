"""A worker killed while its model call streams: the stream goes on with the retried
attempt, and the text the dead attempt streamed is marked discarded.

Real worker processes (``python worker.py``, as tests/test_model_recovery.py) on the
OpenAI-compatible provider against a local server speaking the chat-completions stream
(server-sent ``chat.completion.chunk`` events, ``data: [DONE]``, as OpenAI documents it).
The server streams the first request's first words, then holds it until the test has
killed that worker; the retried request streams its whole answer.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from hermes.client import HermesClient
from hermes.content.events import TurnEvent
from hermes.models import TurnResult
from tests.test_crash import kill_group
from tests.test_model_recovery import MODEL, spawn_worker, until, wait_polling  # noqa: F401 - the fixture

REPLY_WORDS = ["The", "retried", "attempt", "streams", "all", "of", "its", "answer", "again."]


class StreamingHoldingProvider:
    """Streams ``REPLY_WORDS`` as chat-completion chunks; the first request stops after
    three words until :meth:`release` (by then its worker is dead)."""

    def __init__(self) -> None:
        self.requests: list[str] = []
        self.arrived_at: list[float] = []
        self.first_received = threading.Event()
        self.first_words_sent = threading.Event()
        self._release = threading.Event()
        self._lock = threading.Lock()
        provider = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:  # noqa: N802 - http.server's naming
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
                users = [m.get("content") for m in body.get("messages", []) if m.get("role") == "user"]
                with provider._lock:
                    provider.requests.append(users[-1] if users else "")
                    provider.arrived_at.append(time.monotonic())
                    first = len(provider.requests) == 1
                if first:
                    provider.first_received.set()
                try:
                    self.send_response(200)
                    self.send_header("Content-Type", "text/event-stream")
                    self.send_header("Connection", "close")
                    self.end_headers()
                    for i, word in enumerate(REPLY_WORDS):
                        if first and i == 3:
                            provider.first_words_sent.set()
                            provider._release.wait(120)
                        self._chunk({"content": ("" if i == 0 else " ") + word})
                        time.sleep(0.15 if first else 0.02)
                    self._chunk({}, "stop")
                    self.wfile.write(b"data: [DONE]\n\n")
                    self.wfile.flush()
                except OSError:
                    pass  # the worker that asked was killed meanwhile

            def _chunk(self, delta: dict[str, Any], finish: str | None = None) -> None:
                chunk = {
                    "id": "chatcmpl-stream", "object": "chat.completion.chunk", "created": 1_700_000_000, "model": MODEL,
                    "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
                }
                self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                self.wfile.flush()

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


@pytest.fixture
def provider() -> Iterator[StreamingHoldingProvider]:
    server = StreamingHoldingProvider()
    try:
        yield server
    finally:
        server.stop()


@pytest.mark.timeout(600)
async def test_a_stream_goes_on_with_the_retried_attempt_and_marks_the_dead_ones_text_discarded(
    spawn_worker, temporal_client, redis, task_queue, session_id, provider, tmp_path  # noqa: F811
):
    first = spawn_worker()
    await wait_polling(temporal_client, task_queue, first, tmp_path)
    hermes = HermesClient(temporal_client, task_queue=task_queue, redis=redis)
    events: list[TurnEvent] = []
    results: list[TurnResult] = []

    async def listen() -> None:
        async for item in hermes.stream_message(session_id, "stream please", user_id="stream-test"):
            (events if isinstance(item, TurnEvent) else results).append(item)

    listening = asyncio.ensure_future(listen())
    try:
        await until(provider.first_words_sent.is_set, "the first attempt's words sent", tmp_path)
        await until(lambda: any(e.type == "text_delta" for e in events), "the first attempt's text streamed", tmp_path)
        second = spawn_worker()
        await wait_polling(temporal_client, task_queue, second, tmp_path)
        kill_group(first)
        await asyncio.wait_for(asyncio.shield(listening), 60)
    finally:
        provider.release()
        if not listening.done():
            listening.cancel()
            await asyncio.gather(listening, return_exceptions=True)

    [result] = results
    assert result.status == "completed" and result.reply == " ".join(REPLY_WORDS)
    deltas = [e for e in events if e.type == "text_delta"]
    [discarded] = [e for e in events if e.type == "attempt_discarded"]
    dead, retried = deltas[0].attempt, deltas[-1].attempt
    assert dead != retried and discarded.attempt == dead and discarded.step == 0
    # The dead attempt's words come first, then the mark, then the whole retried answer.
    assert events.index(discarded) > events.index(deltas[0])
    assert all(events.index(d) > events.index(discarded) for d in deltas if d.attempt == retried)
    assert "".join(d.data["text"] for d in deltas if d.attempt == dead) in ("The", "The retried", "The retried attempt")
    assert "".join(d.data["text"] for d in deltas if d.attempt == retried) == result.reply
    assert provider.requests == ["stream please"] * 2
