"""What keeps a worker's memory flat (issue 12, ``bench/soak.py``): the embedding model is
loaded once at start, not in whichever activity first needs it; LanceDB's caches are capped."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hermes.errors import ConfigError
from hermes.memory import service
from hermes.memory.embeddings import Thresholds
from hermes.memory.models import MemoryCandidate
from hermes.memory.store import LANCE_METADATA_CACHE_BYTES, MemoryStore
from hermes.settings import Settings
from worker import PreloadedEmbedder


class CountingEmbedder:
    """A deterministic 16-d embedder that counts how often it is made and warmed."""

    made = 0
    model_id = "counting:16"
    dim = 16
    thresholds = Thresholds(dedupe=0.99, related=0.5, retrieval=0.0)

    def __init__(self) -> None:
        CountingEmbedder.made += 1
        self.warmed = 0

    def warm(self) -> None:
        self.warmed += 1

    def embed_passages(self, texts: Sequence[str]) -> np.ndarray:
        rows = [np.random.default_rng(sum(map(ord, t))).standard_normal(self.dim) for t in texts]
        vectors = np.array(rows, dtype=np.float32).reshape(len(texts), self.dim)
        return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)

    def embed_query(self, text: str) -> np.ndarray:
        return self.embed_passages([text])[0]


@pytest.fixture
def counting(monkeypatch: pytest.MonkeyPatch) -> type[CountingEmbedder]:
    CountingEmbedder.made = 0
    monkeypatch.setattr(service, "embedder_from_settings", lambda settings: CountingEmbedder())
    return CountingEmbedder


def test_the_preloaded_embedder_is_made_and_warmed_once_and_the_store_uses_it(counting, tmp_path: Path):
    preloaded = PreloadedEmbedder(Settings(memory_uri=str(tmp_path / "memory")))
    threads = [threading.Thread(target=preloaded.preload) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)

    store = preloaded.open_store()

    assert counting.made == 1, "one embedder for the preload and every store"
    assert store.embedder is preloaded.get()
    assert store.embedder.warmed == 1, "the model is loaded once, whoever asks first (the store included)"
    from hermes.memory import crosslingual

    assert crosslingual._GLOSSES, "the cross-language dictionary is read at start, not in a turn"


def test_a_failed_preload_is_logged_and_the_store_makes_the_embedder_again(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture
):
    attempts: list[int] = []

    def flaky(settings: Any) -> CountingEmbedder:
        attempts.append(1)
        if len(attempts) == 1:
            raise ConfigError("embeddings endpoint failed", source="HERMES_MEMORY_EMBEDDER")
        return CountingEmbedder()

    monkeypatch.setattr(service, "embedder_from_settings", flaky)
    preloaded = PreloadedEmbedder(Settings(memory_uri=str(tmp_path / "memory")))

    preloaded.preload()  # must not raise: the memory activities meet the error, as before

    assert "memory embedder not preloaded" in caplog.text
    assert isinstance(preloaded.open_store().embedder, CountingEmbedder)
    assert len(attempts) == 2


@pytest.fixture
def lancedb_sessions(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The ``session`` argument of every ``lancedb.connect`` made while the test runs."""
    import lancedb

    sessions: list[Any] = []
    connect = lancedb.connect

    def spy(*args: Any, **kwargs: Any) -> Any:
        sessions.append(kwargs.get("session"))
        return connect(*args, **kwargs)

    monkeypatch.setattr(lancedb, "connect", spy)
    return sessions


def test_a_memory_store_caps_the_metadata_lancedb_caches_for_every_version(lancedb_sessions: list[Any], tmp_path: Path):
    store = MemoryStore(tmp_path / "memory", CountingEmbedder())
    now = datetime.now(timezone.utc)
    for i in range(10):  # every write is a new table version
        store.write([MemoryCandidate(user_id="u1", text=f"fact number {i} about item {i * 7}", confidence=0.9, created_at=now)])
        store.search("u1", "which fact", now=now)

    [session] = lancedb_sessions
    assert session is not None, "LanceDB's default caches are gigabytes and keep every version's metadata"
    assert 0 < session.size_bytes <= LANCE_METADATA_CACHE_BYTES + 256 * 1024 * 1024
    assert store.count("u1") == 10


def test_the_durable_store_and_the_memory_store_share_one_capped_lancedb_session(
    lancedb_sessions: list[Any], tmp_path: Path
):
    """The durable store writes on every turn (transcript archive, snapshots, exactly-once
    records, content by reference); with LanceDB's default session each write's version
    stayed cached (issue 12: the soak's worker grew without end)."""
    from hermes.infra import lance
    from hermes.infra.durable import NOTES, DurableStore, Record

    durable = DurableStore(str(tmp_path / "memory"))
    for i in range(5):
        durable.upsert_sync(NOTES, [Record(key=f"note-{i}", value=f"note {i}", owner="u1")])
    assert len(durable.list_sync(NOTES, owner="u1")) == 5
    MemoryStore(tmp_path / "memory", CountingEmbedder())

    sessions = lancedb_sessions
    assert len(sessions) == 2 and sessions[0] is sessions[1] is lance.shared_session()
    assert 0 < sessions[0].size_bytes <= lance.METADATA_CACHE_BYTES + lance.INDEX_CACHE_BYTES


async def test_the_workflow_cache_is_bounded_by_the_setting_and_a_caller_can_override_it(temporal_client, settings):
    """``HERMES_MAX_CACHED_WORKFLOWS`` bounds how many session runs a worker keeps (each up to
    about 2 MiB at the default replay budget); ``build_worker``'s argument wins over it."""
    from worker import build_worker

    assert Settings().max_cached_workflows == 1000
    bounded = settings.model_copy(update={"max_cached_workflows": 40})
    assert build_worker(temporal_client, bounded, memory=False).config()["max_cached_workflows"] == 40
    # One worker per task queue per process: the second on its own queue.
    other = build_worker(temporal_client, bounded, memory=False, task_queue=settings.task_queue + "-b", max_cached_workflows=0)
    assert other.config()["max_cached_workflows"] == 0
    with pytest.raises(ValueError, match="max_cached_workflows"):
        Settings(max_cached_workflows=-1)


async def test_a_search_never_holds_a_turn_on_a_store_still_opening_and_finds_once_it_is_open(
    store: MemoryStore, monkeypatch: pytest.MonkeyPatch
):
    """At load 15 a new store took 38 s to open (and its model 26 s to load): longer than the
    session's 15 s search, twice, so a worker's first turns waited 30 s and lost their
    memories anyway. The store opens in the background from the worker's start; a search
    waits for it briefly, then its turn goes on with the reason."""
    import activities.memory as memory_module
    from temporalio.testing import ActivityEnvironment

    from activities.memory import MemoryActivities
    from hermes.memory.models import SearchMemoriesInput

    store.write([MemoryCandidate(user_id="u", kind="fact", text="The user lives in Zurich.", subject="home_city",
                                 value="Zurich", source="cli", created_at=datetime.now(timezone.utc))])
    monkeypatch.setattr(memory_module, "STORE_WAIT_SECONDS", 0.5)
    release = threading.Event()
    entered = threading.Event()

    def slow_open() -> MemoryStore:
        entered.set()
        assert release.wait(30), "the test never released the store"
        return store

    activities = MemoryActivities(slow_open)
    activities.open_in_background()
    assert entered.wait(10), "the store did not start opening"
    activities.open_in_background()  # a second call while it opens starts nothing more
    env = ActivityEnvironment()
    query = SearchMemoriesInput(user_id="u", query="where does the user live")

    # While the opening thread holds the store: the search (on the event loop) must not wait on it.
    early = await asyncio.wait_for(env.run(activities.search_memories, query), 10)
    assert early.memories == [] and "still opening" in early.error

    release.set()
    late = await env.run(activities.search_memories, query)
    assert late.error == "" or late.error is None
    assert [m.text for m in late.memories] == ["The user lives in Zurich."]
