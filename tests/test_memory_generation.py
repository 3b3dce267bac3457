"""Searches see a write even when the attempt that committed it never told them (issue 12:
on a loaded machine a memory write's first attempt was cancelled by its heartbeat timeout
after its commit, the retry found the rows written and reported nothing changed, and the
demo's second session kept getting the user's rows cached from before the write)."""

from __future__ import annotations

import uuid
from datetime import datetime, timezone
from typing import Any

from activities.memory import MemoryActivities
from hermes.memory.models import MemoryCandidate, SearchMemoriesInput, WriteMemoriesInput


def _candidate(user_id: str) -> MemoryCandidate:
    return MemoryCandidate(
        user_id=user_id, text="The user lives in Zurich.", subject="home_city", value="Zurich", kind="fact",
        importance=0.7, confidence=0.9, source_session="s-1", source_turn=1, created_at=datetime.now(timezone.utc),
    )


async def test_a_write_retried_after_its_first_attempt_committed_still_refreshes_the_searches(store: Any, redis: Any):
    activities = MemoryActivities(lambda: store, redis=redis)
    activities.store()  # opened, as a worker has it
    user = f"user-{uuid.uuid4().hex[:8]}"
    ask = SearchMemoriesInput(user_id=user, query="Where do I live?")
    assert (await activities.search_memories(ask)).memories == []  # cached for this generation

    # The first attempt's commit, with nothing after it (cancelled before it told anyone):
    candidate = _candidate(user)
    assert store.write([candidate]).inserted == [candidate.candidate_id]
    assert (await activities.search_memories(ask)).memories == [], "the cache is what the retry must refresh"

    # The retry finds the row written: nothing changed by it, and still the searches see it.
    report = await activities.write_memories(WriteMemoriesInput(user_id=user, candidates=[candidate]))
    assert (report.inserted, report.updated) == ([], [])
    found = (await activities.search_memories(ask)).memories
    assert [m.text for m in found] == ["The user lives in Zurich."]


async def test_a_search_between_a_writes_commit_and_its_end_sees_the_write_not_the_rows_cached_before(store: Any, redis: Any):
    """Issue 28: with three workers, a user who saw the move in the store was told the old
    city: the search came between the commit and the new generation, and the worker's
    cache still held the rows of before."""
    from hermes.memory.store import MemoryStore

    other = MemoryStore(store.uri, store.embedder)  # another worker's handle on the same store
    searcher = MemoryActivities(lambda: store, redis=redis)
    writer = MemoryActivities(lambda: other, redis=redis)
    searcher.store(), writer.store()
    user = f"user-{uuid.uuid4().hex[:8]}"
    ask = SearchMemoriesInput(user_id=user, query="Where do I live?")
    assert (await searcher.search_memories(ask)).memories == []  # cached in this worker
    async with writer._changing(user):
        other.write([_candidate(user)])  # committed; the change has not ended yet
        found = (await searcher.search_memories(ask)).memories
        assert [m.text for m in found] == ["The user lives in Zurich."]
    found = (await searcher.search_memories(ask)).memories
    assert [m.text for m in found] == ["The user lives in Zurich."]
    assert int(await redis.hget(writer.generation_key(user), "writing")) == 0


async def test_a_cancelled_change_keeps_searches_off_the_cache_until_its_mark_expires(store: Any, redis: Any):
    """An attempt cancelled while its thread still commits: the commit may land after the
    activity ended, so its mark stays (with a time to live) rather than let the cache
    serve the rows of before."""
    import asyncio

    import pytest

    activities = MemoryActivities(lambda: store, redis=redis)
    activities.store()
    user = f"user-{uuid.uuid4().hex[:8]}"
    ask = SearchMemoriesInput(user_id=user, query="Where do I live?")
    assert (await activities.search_memories(ask)).memories == []
    with pytest.raises(asyncio.CancelledError):
        async with activities._changing(user):
            raise asyncio.CancelledError
    assert (await activities.search_memories(ask)).memories == []  # and this search caches nothing
    store.write([_candidate(user)])  # the cancelled attempt's thread commits afterwards
    found = (await activities.search_memories(ask)).memories
    assert [m.text for m in found] == ["The user lives in Zurich."]
    key = activities.generation_key(user)
    assert int(await redis.hget(key, "writing")) == 1
    assert 0 < await redis.ttl(key) <= 600
