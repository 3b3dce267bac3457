"""The lifecycle of content in Redis (issue 28, item 4): archived sessions' blobs leave
Redis when a durable copy is confirmed, a TTL that reads refresh bounds the rest, and a
turn's event markers expire after a day (README "What Redis holds")."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from temporalio.client import WorkflowExecutionStatus
from temporalio.testing import ActivityEnvironment

from activities.transcript import SNAPSHOT_KEY, TranscriptActivities, read_snapshot
from hermes.content.blobs import BLOB_KEY, BlobStore, message_ref, stored_preview, value_ref
from hermes.infra.durable import DurableStore
from hermes.content.events import DEFAULT_TTL_SECONDS, MARKER_TTL_SECONDS, EventLog, stream_key
from hermes.models import Message, SessionCarry, SessionConfig, SessionState, SnapshotInput
from tests.support import eventually

pytestmark = pytest.mark.timeout(60)

TTL_SECONDS = 3600


@pytest.mark.timeout(60)
async def test_archiving_a_session_drops_its_durably_kept_blobs_from_redis_and_they_stay_readable(
    redis, _memory_store_per_test: Path
):
    durable = DurableStore(_memory_store_per_test)
    store = BlobStore(redis, durable=durable, ttl_seconds=TTL_SECONDS)
    kept_text = "a large tool result " * 50 + uuid.uuid4().hex
    kept = value_ref(kept_text)
    await store.keep_many({kept: kept_text})  # durable store first, then Redis
    only_in_redis_text = "cached, never kept durably " + uuid.uuid4().hex
    only_in_redis = value_ref(only_in_redis_text)
    await store.put_many({only_in_redis: only_in_redis_text})
    messages = [
        Message(role="user", content=stored_preview(kept_text, kept, "message"), turn=1),
        Message(role="assistant", content=f"see {only_in_redis} " + uuid.uuid4().hex, turn=1),
    ]
    bodies = {message_ref(m): m.model_dump_json() for m in messages}
    await store.put_many(bodies)
    assert await redis.exists(*[BLOB_KEY.format(ref=r) for r in [kept, only_in_redis, *bodies]]) == 4

    session_id = "archived-" + uuid.uuid4().hex
    activities = TranscriptActivities(redis, durable, content_ttl_seconds=TTL_SECONDS)
    carry = SessionCarry(messages=messages, turn_count=1, chain_id="chain-1", status="archived")
    await ActivityEnvironment().run(activities.save_snapshot, SnapshotInput(session_id=session_id, carry=carry))

    assert await redis.exists(BLOB_KEY.format(ref=kept)) == 0
    for ref in bodies:
        assert await redis.exists(BLOB_KEY.format(ref=ref)) == 0
    # Not confirmed by the durable store: the only copy stays (the TTL bounds it).
    assert await redis.exists(BLOB_KEY.format(ref=only_in_redis)) == 1
    # Still readable: the content from the durable store, the bodies from the snapshot.
    assert (await store.read_many([kept]))[kept] == kept_text
    assert (await read_snapshot(redis, session_id, durable)).messages == messages
    assert 0 < await redis.ttl(SNAPSHOT_KEY.format(session_id=session_id)) <= TTL_SECONDS


@pytest.mark.timeout(60)
async def test_content_keys_carry_a_ttl_that_reads_refresh_and_an_expired_blob_is_read_from_the_durable_store(
    redis, _memory_store_per_test: Path
):
    durable = DurableStore(_memory_store_per_test)
    store = BlobStore(redis, durable=durable, ttl_seconds=TTL_SECONDS)
    body = Message(role="user", content="hello " + uuid.uuid4().hex, turn=1)
    body_ref = message_ref(body)
    await store.put_many({body_ref: body.model_dump_json()})
    key = BLOB_KEY.format(ref=body_ref)
    assert 0 < await redis.ttl(key) <= TTL_SECONDS

    await redis.expire(key, 10)
    assert await store.get_many([body_ref])
    # Its writer gave it the whole TTL a moment ago: its own read sends no refresh.
    assert await redis.ttl(key) <= 10
    other_worker = BlobStore(redis, durable=durable, ttl_seconds=TTL_SECONDS)
    assert await other_worker.get_many([body_ref])
    assert await redis.ttl(key) > 10  # the read of a hot blob kept it

    text = "kept by reference " + uuid.uuid4().hex
    ref = value_ref(text)
    await store.keep_many({ref: text})
    assert 0 < await redis.ttl(BLOB_KEY.format(ref=ref)) <= TTL_SECONDS
    await redis.delete(BLOB_KEY.format(ref=ref))  # as if it had expired
    assert await store.read_many([ref]) == {ref: text}
    assert 0 < await redis.ttl(BLOB_KEY.format(ref=ref)) <= TTL_SECONDS  # cached again, with a TTL


@pytest.mark.timeout(60)
async def test_content_that_only_redis_holds_never_expires(redis):
    store = BlobStore(redis, ttl_seconds=TTL_SECONDS)
    text = "no durable store " + uuid.uuid4().hex
    ref = value_ref(text)
    await store.keep_many({ref: text})
    assert await redis.ttl(BLOB_KEY.format(ref=ref)) == -1
    # Read back, by its writer and by another worker: still no TTL (a read's refresh
    # gave the only copy one, and it expired a week after its last read).
    assert await store.read_many([ref]) == {ref: text}
    assert await BlobStore(redis, ttl_seconds=TTL_SECONDS).read_many([ref]) == {ref: text}
    assert await redis.ttl(BLOB_KEY.format(ref=ref)) == -1


@pytest.mark.timeout(60)
async def test_a_turns_event_markers_expire_after_a_day_while_its_stream_lives_a_week(redis):
    events = EventLog(redis)
    session_id = "markers-" + uuid.uuid4().hex
    assert await events.begin_turn(session_id, 1)
    assert await events.begin_step(session_id, 1, 0, "attempt-1")
    for marker in (f"{stream_key(session_id)}:turn:1", f"{stream_key(session_id)}:step:1.0"):
        assert 0 < await redis.ttl(marker) <= MARKER_TTL_SECONDS
    assert MARKER_TTL_SECONDS < await redis.ttl(stream_key(session_id)) <= DEFAULT_TTL_SECONDS


@pytest.mark.timeout(120)
async def test_an_archived_sessions_content_leaves_redis_and_stays_readable_from_the_durable_store(
    run_worker, session_id, temporal_client, redis
):
    config = SessionConfig(idle_after_seconds=1, archive_after_seconds=2, max_message_bytes=2048)
    large = "a long note " + "x" * 5000 + uuid.uuid4().hex
    async with run_worker({"turns": [], "fallback": "noted"}, config=config) as hermes:
        assert (await hermes.send_message(session_id, "hello " + uuid.uuid4().hex)).reply == "noted"
        sent = await hermes.send_message(session_id, large)
        assert sent.reply == "noted"
        ref = value_ref(large)
        assert 0 < await redis.ttl(BLOB_KEY.format(ref=ref)) <= 7 * 24 * 3600  # kept by reference, with a TTL

        async def archived() -> bool:
            return (await hermes.handle(session_id).describe()).status == WorkflowExecutionStatus.COMPLETED

        await eventually(archived, what="the session archiving itself")
        final = await temporal_client.get_workflow_handle(session_id, result_type=SessionState).result()
        assert final.status == "archived" and final.snapshot is not None
        body_keys = [BLOB_KEY.format(ref=message_ref(m)) for m in final.snapshot.messages]
        assert len(body_keys) >= 4 and await redis.exists(*body_keys) == 0
        assert await redis.exists(BLOB_KEY.format(ref=ref)) == 0

        assert await hermes.get_stored_content(ref) == large  # from the durable store
        assert 0 < await redis.ttl(BLOB_KEY.format(ref=ref)) <= 7 * 24 * 3600  # cached again, with a TTL


@pytest.mark.timeout(60)
async def test_a_body_read_again_soon_keeps_its_ttl_and_is_refreshed_once_an_eighth_of_it_has_passed(
    redis, monkeypatch: pytest.MonkeyPatch
):
    # Each model call reads its whole context: one EXPIRE per message per call was most of
    # the Redis work of a long session's model calls (issue 31).
    import hermes.content.blobs as blobs

    clock = [1000.0]
    monkeypatch.setattr(blobs.time, "monotonic", lambda: clock[0])
    store = BlobStore(redis, ttl_seconds=800)
    body = Message(role="user", content="hello " + uuid.uuid4().hex, turn=1)
    ref = message_ref(body)
    key = BLOB_KEY.format(ref=ref)
    await redis.set(key, body.model_dump_json(), ex=50)  # written by another worker
    assert await store.get_many([ref])
    assert await redis.ttl(key) > 700  # the first read refreshes it
    await redis.expire(key, 50)
    clock[0] += 99  # under 800 / 8 s later: not again
    assert await store.get_many([ref])
    assert 0 < await redis.ttl(key) <= 50
    clock[0] += 2  # past 100 s since the refresh
    assert await store.get_many([ref])
    assert await redis.ttl(key) > 700
