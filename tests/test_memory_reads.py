"""A turn's memory search never waits behind the worker's writes and consolidations.

On object storage a memory write takes seconds; with three workers at load, searches
queued behind writes in the event loop's default executor and timed out (15 s), so turns
went on without their memories (``bench/scale.py``). Searches have their own threads.
"""

from __future__ import annotations

import asyncio
import threading

import pytest

from activities.memory import READ_THREADS, MemoryActivities


@pytest.mark.timeout(60)
async def test_a_search_runs_while_every_default_executor_thread_is_busy_writing():
    release = threading.Event()
    acts = MemoryActivities(lambda: object())  # type: ignore[arg-type, return-value]
    loop = asyncio.get_running_loop()
    # More blocked "writes" than the default executor has threads: a search queued behind
    # them would wait until they end.
    writes = [acts._run(lambda _store: release.wait(30)) for _ in range(64)]
    blocked = asyncio.gather(*writes)
    await asyncio.sleep(0.2)
    try:
        found = await asyncio.wait_for(acts._run(lambda _store: ["home: Berlin"], read=True), 10)
        assert found == ["home: Berlin"]
        # Reads among themselves run side by side too.
        many = await asyncio.wait_for(
            asyncio.gather(*(acts._run(lambda _store, n=n: n, read=True) for n in range(READ_THREADS * 2))), 10
        )
        assert many == list(range(READ_THREADS * 2))
    finally:
        release.set()
        await asyncio.wait_for(blocked, 30)
    assert loop.is_running()
