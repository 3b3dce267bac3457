"""The OpenAI-compatible embeddings option, against a local server speaking the OpenAI
``/v1/embeddings`` wire (its vectors come from the offline default model, so retrieval
means something; ``dimensions`` shortens them as OpenAI's endpoint does)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hermes.errors import ConfigError
from hermes.memory.embeddings import OpenAIEmbedder, get_embedder
from hermes.memory.models import MemoryCandidate
from hermes.memory.store import EmbeddingModelMismatch, MemoryStore, reembed
from hermes.settings import Settings
from tests.test_memory_store import T0


class EmbeddingsServer:
    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        inner = get_embedder("use")
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
                server.requests.append({"path": self.path, "auth": self.headers.get("Authorization"), "body": body})
                texts = body["input"] if isinstance(body["input"], list) else [body["input"]]
                vectors = inner.embed_passages(texts)
                if body.get("dimensions"):
                    vectors = vectors[:, : body["dimensions"]]
                    vectors = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
                data = json.dumps({
                    "object": "list",
                    "model": body["model"],
                    # Out of order on purpose: clients must sort by index.
                    "data": [{"object": "embedding", "index": i, "embedding": v.tolist()} for i, v in reversed(list(enumerate(vectors)))],
                    "usage": {"prompt_tokens": 1, "total_tokens": 1},
                }).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                pass

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.http.daemon_threads = True
        self.base_url = f"http://127.0.0.1:{self.http.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.http.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.http.shutdown()
        self.http.server_close()


@pytest.fixture
def server() -> Iterator[EmbeddingsServer]:
    s = EmbeddingsServer()
    try:
        yield s
    finally:
        s.stop()


def cand(text: str, **kw: Any) -> MemoryCandidate:
    return MemoryCandidate(user_id="u1", text=text, created_at=T0, **kw)


def test_an_openai_compatible_endpoint_embeds_memories_that_search_finds(server: EmbeddingsServer, tmp_path: Path) -> None:
    embedder = OpenAIEmbedder("text-embedding-3-small", base_url=server.base_url, api_key="sk-test")
    assert (embedder.dim, embedder.model_id) == (512, "openai/text-embedding-3-small:512")
    store = MemoryStore(tmp_path / "m", embedder)
    store.write([cand("The user lives in Bern."), cand("The user's daughter is called Mia.", source_turn=2)], now=T0)
    found = store.search("u1", "用户的女儿叫什么名字？", now=T0)
    assert [m.text for m in found][:1] == ["The user's daughter is called Mia."]
    sent = server.requests[-1]
    assert sent["path"] == "/v1/embeddings" and sent["auth"] == "Bearer sk-test"
    assert sent["body"]["model"] == "text-embedding-3-small"


def test_a_shorter_dimension_is_refused_until_the_memories_are_embedded_again(server: EmbeddingsServer, tmp_path: Path) -> None:
    full = OpenAIEmbedder("text-embedding-3-small", base_url=server.base_url, api_key="k")
    store = MemoryStore(tmp_path / "m", full)
    store.write([cand("The user lives in Bern.")], now=T0)
    short = OpenAIEmbedder("text-embedding-3-small", base_url=server.base_url, api_key="k", dimensions=256)
    assert short.model_id == "openai/text-embedding-3-small:256"
    refused = MemoryStore(tmp_path / "m", short)
    with pytest.raises(EmbeddingModelMismatch, match="hermes memory reembed"):
        refused.search("u1", "where does the user live?", now=T0)
    assert server.requests[-1]["body"]["dimensions"] == 256
    reembed(tmp_path / "m", short)
    found = MemoryStore(tmp_path / "m", short).search("u1", "where does the user live?", now=T0)
    assert [m.text for m in found] == ["The user lives in Bern."]


def test_an_unreachable_endpoint_is_a_configuration_error_naming_the_setting() -> None:
    settings = Settings(memory_embedder="openai:text-embedding-3-small", memory_embedding_base_url="http://127.0.0.1:9/v1",
                        memory_embedding_api_key="k")
    from hermes.memory.service import embedder_from_settings

    with pytest.raises(ConfigError, match="HERMES_MEMORY_EMBEDDER"):
        embedder_from_settings(settings)
