"""Redis writes the README promises land, or are reported; none is skipped silently (issue 27).

A real Redis (``redis_url``, tests/conftest.py). The clients come from
:func:`hermes.infra.connections.redis_client`, as every worker, API server and client's do.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from datetime import datetime, timezone
from typing import Any

import pytest
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from activities.session_index import SessionIndexActivities
from hermes.content.blobs import BLOB_KEY, BlobStore
from hermes.content.events import EventLog, TurnEvent
from hermes.infra import telemetry
from hermes.infra.connections import redis_client
from hermes.infra.redis_keys import index_user_key
from hermes.infra.redis_writes import skipped_writes, take_skipped
from hermes.infra.stack import free_port
from hermes.models import SessionIndexEntry
from hermes.sessions.index import list_entries
from hermes.settings import Settings

WRITERS = 60


def entry(session_id: str, user_id: str) -> SessionIndexEntry:
    now = datetime.now(timezone.utc)
    return SessionIndexEntry(
        session_id=session_id, user_id=user_id, channel="test", status="active", title="t",
        created_at=now, last_active_at=now,
    )


@pytest.fixture
def metrics() -> Iterator[InMemoryMetricReader]:
    """Telemetry on for this test (metrics read in memory); off afterwards."""
    reader = InMemoryMetricReader()
    telemetry.start(metric_readers=[reader], batch=False)
    try:
        yield reader
    finally:
        telemetry.shutdown()


def skipped_metric(reader: InMemoryMetricReader) -> dict[str, int]:
    """``hermes.redis.writes_skipped`` by kind, from one collection."""
    data = reader.get_metrics_data()
    found: dict[str, int] = {}
    for resource in data.resource_metrics if data else []:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                if metric.name == "hermes.redis.writes_skipped":
                    for point in metric.data.data_points:
                        kind = point.attributes["hermes.redis.write"]
                        found[kind] = found.get(kind, 0) + point.value
    return found


async def connected_clients(redis: Any) -> int:
    return int((await redis.info("clients"))["connected_clients"])


@pytest.mark.timeout(60)
async def test_writers_beyond_the_pool_wait_for_a_connection_and_every_write_lands(redis_url: str, redis: Any) -> None:
    settings = Settings(redis_url=redis_url, redis_max_connections=2, redis_pool_timeout_seconds=30)
    client = redis_client(settings)
    before_skipped = skipped_writes()
    before_clients = await connected_clients(redis)
    store, log = BlobStore(client), EventLog(client)
    index = SessionIndexActivities(client, timeout_seconds=30)
    index.events = log
    user = f"pool-user-{free_port()}"

    async def writer(i: int) -> list[bool]:
        session_id = f"pool-{user}-{i}"
        finished = entry(session_id, user).model_copy(update={"finished_turn": 1, "finished_status": "completed"})
        return [
            await store.cache_or_report({f"b:pool{user}{i}": f"body {i}"}, "test bodies", timeout_seconds=30),
            await log.publish_quietly([TurnEvent(type="warning", session_id=session_id, data={"text": str(i)})]),
            await index.update_session_index(finished),
        ]

    try:
        landed = await asyncio.gather(*(writer(i) for i in range(WRITERS)))
        opened = await connected_clients(redis) - before_clients
    finally:
        await client.aclose()

    assert landed == [[True, True, True]] * WRITERS
    assert skipped_writes() == before_skipped
    assert opened <= 2, f"{opened} connections opened by a pool bounded at 2"
    values = await redis.mget([BLOB_KEY.format(ref=f"b:pool{user}{i}") for i in range(WRITERS)])
    assert [v.decode() for v in values] == [f"body {i}" for i in range(WRITERS)]
    reader = EventLog(redis)
    for i in range(WRITERS):
        assert [e.type for e in await reader.read(f"pool-{user}-{i}")] == ["warning", "turn_finished"]
    assert len(await list_entries(redis, user, limit=WRITERS + 1)) == WRITERS


@pytest.mark.timeout(60)
async def test_writes_to_an_unreachable_redis_are_reported_not_dropped_silently(
    metrics: InMemoryMetricReader, caplog: pytest.LogCaptureFixture
) -> None:
    settings = Settings(redis_url=f"redis://127.0.0.1:{free_port()}/0")  # nothing listens there
    client = redis_client(settings)
    caplog.set_level(logging.WARNING, logger="hermes.redis_writes")
    try:
        published = await EventLog(client).publish_quietly(
            [TurnEvent(type="warning", session_id="s-down", data={"text": "a"}), TurnEvent(type="warning", session_id="s-down")]
        )
        cached = await BlobStore(client).cache_or_report({"m:" + "0" * 32: "body"}, "message bodies")
        index = SessionIndexActivities(client)
        first = await index.update_session_index(entry("s-down", "u-down"))
        during_backoff = await index.update_session_index(entry("s-down", "u-down"))
    finally:
        await client.aclose()

    assert (published, cached, first, during_backoff) == (False, False, False, False)
    assert skipped_metric(metrics) == {"turn_events": 2, "content_store": 1, "session_index": 2}
    # The session's own tally, for its notices (taken once).
    assert take_skipped("s-down") == {"turn_events": 2, "session_index": 2} and take_skipped("s-down") == {}
    warnings = [r.getMessage() for r in caplog.records if r.name == "hermes.redis_writes"]
    assert any("turn_events" in w and "2 turn event(s)" in w and "'s-down'" in w for w in warnings), warnings
    assert any("content_store" in w and "message bodies" in w for w in warnings), warnings
    assert sum("session_index" in w and "'s-down'" in w for w in warnings) == 2, warnings


@pytest.mark.timeout(60)
async def test_a_session_index_write_that_waited_for_a_busy_pool_is_reported_and_the_next_one_lands(
    redis_url: str, redis: Any
) -> None:
    client = redis_client(Settings(redis_url=redis_url, redis_max_connections=1, redis_pool_timeout_seconds=30))
    index = SessionIndexActivities(client, timeout_seconds=0.3)
    key, user = f"hold-{free_port()}", f"busy-user-{free_port()}"
    before = skipped_writes().get("session_index", 0)
    try:
        holder = asyncio.ensure_future(client.blpop([key], timeout=4))  # holds the pool's one connection
        while client.connection_pool.can_get_connection():
            await asyncio.sleep(0.01)
        waited = await index.update_session_index(entry("busy-1", user))
        await redis.rpush(key, "go")
        await holder
        landed = await index.update_session_index(entry("busy-2", user))
    finally:
        await client.aclose()
    # A busy pool is not an outage: the write that timed out waiting is reported, and the
    # next one is not skipped for the index's backoff.
    assert (waited, landed) == (False, True)
    assert skipped_writes().get("session_index", 0) == before + 1
    assert [e.session_id for e in await list_entries(redis, user)] == ["busy-2"]


def finished(session_id: str, user_id: str) -> SessionIndexEntry:
    """A row written at a turn's end: it also publishes ``turn_finished``."""
    return entry(session_id, user_id).model_copy(update={"finished_turn": 1, "finished_status": "completed"})


@pytest.mark.timeout(60)
async def test_a_turn_end_writes_its_row_and_its_event_in_one_round_trip_and_each_part_that_fails_is_reported(
    redis_url: str, redis: Any
) -> None:
    """The row and ``turn_finished`` go in one pipeline (issue 31); when one part fails
    the other still lands, the row is tried again on its own, and what did not land is
    reported by its kind: never both dropped for one's failure, never one silently."""
    client = redis_client(Settings(redis_url=redis_url))
    index, reader = SessionIndexActivities(client), EventLog(redis)
    index.events = EventLog(client)
    user = f"end-user-{free_port()}"
    pipelines = 0
    make = client.pipeline

    def counted(*args: Any, **kwargs: Any) -> Any:
        nonlocal pipelines
        pipelines += 1
        return make(*args, **kwargs)

    client.pipeline = counted  # type: ignore[method-assign]
    before = skipped_writes()
    try:
        both = await index.update_session_index(finished("end-1", user))
        one_trip = pipelines
        # Another user's list is not a sorted set: the row's ZADD fails (twice), the event lands.
        await redis.set(index_user_key(f"{user}-x"), "not a sorted set")
        row_failed = await index.update_session_index(finished("end-2", f"{user}-x"))
        index._skip_until = 0.0  # the backoff that failure started is not what this test reads
        # The session's stream is not a stream: the event fails, the row lands.
        await redis.set("hermes:events:end-3", "not a stream")
        event_failed = await index.update_session_index(finished("end-3", user))
    finally:
        await client.aclose()
    after = skipped_writes()
    assert (both, row_failed, event_failed) == (True, False, True)
    assert one_trip == 1, f"{one_trip} pipelines for a turn's end (one expected)"
    assert [e.type for e in await reader.read("end-1")] == ["turn_finished"]
    assert [e.type for e in await reader.read("end-2")] == ["turn_finished"]
    assert after.get("session_index", 0) - before.get("session_index", 0) == 1
    assert after.get("turn_events", 0) - before.get("turn_events", 0) == 1
    assert sorted(e.session_id for e in await list_entries(redis, user)) == ["end-1", "end-3"]


@pytest.mark.timeout(60)
async def test_a_turn_end_to_an_unreachable_redis_reports_its_event_and_its_row(metrics: InMemoryMetricReader) -> None:
    client = redis_client(Settings(redis_url=f"redis://127.0.0.1:{free_port()}/0"))  # nothing listens there
    index = SessionIndexActivities(client)
    index.events = EventLog(client)
    try:
        first = await index.update_session_index(finished("s-end-down", "u-end-down"))
        during_backoff = await index.update_session_index(finished("s-end-down", "u-end-down"))
    finally:
        await client.aclose()
    assert (first, during_backoff) == (False, False)
    assert skipped_metric(metrics) == {"turn_events": 2, "session_index": 2}
    assert take_skipped("s-end-down") == {"turn_events": 2, "session_index": 2}
