"""The memory store on object storage (issue 28, item 2): ``HERMES_MEMORY_URI=s3://...`` with
storage options from the settings, against a local S3 server (moto, tests/s3_server.py).
Concurrent opens of a fresh store, a supersede as one commit, a conflicted write converging,
commits per write, and old versions cleaned up. The store's main tests also run on S3
(``on_local_and_s3`` in tests/test_memory_store.py).
"""

from __future__ import annotations

import threading
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from hermes.infra import lance
from hermes.memory.models import MemoryCandidate
from hermes.memory.store import ARCHIVE_TABLE, FORGOTTEN_TABLE, MEMORY_TABLE, MemoryStore, sql_str
from hermes.settings import Settings
from tests.s3_server import on_local_and_s3

T0 = datetime(2026, 1, 10, 12, 0, tzinfo=timezone.utc)
CITIES = ["Bern", "Zurich", "Basel", "Geneva", "Lausanne", "Lugano", "Chur", "Sion"]
"""Seven moves: the two-commit supersede left a reader without a home city in about a tenth of its reads."""


def home(user_id: str, city: str, turn: int) -> MemoryCandidate:
    return MemoryCandidate(
        user_id=user_id, text=f"The user lives in {city}.", subject="home_city", value=city, kind="fact",
        importance=0.7, confidence=0.9, source_session="s1", source_turn=turn, created_at=T0 + timedelta(minutes=turn),
    )


def current_homes(store: MemoryStore, user_id: str) -> int:
    return store.table.count_rows(f"user_id = {sql_str(user_id)} AND subject = 'home_city' AND status = 'active'")


def test_s3_settings_become_lancedb_storage_options_with_the_json_options_overridden() -> None:
    settings = Settings(
        _env_file=None,
        memory_uri="s3://bucket/prefix",
        memory_storage_options='{"aws_region": "eu-west-1", "timeout": "60s"}',
        s3_endpoint_url="http://minio:9000",
        s3_region="us-east-1",
        s3_access_key_id="AKIA",
        s3_secret_access_key="very-secret",
    )
    assert settings.resolved_memory_storage_options() == {
        "aws_region": "us-east-1", "timeout": "60s", "aws_endpoint": "http://minio:9000",
        "aws_access_key_id": "AKIA", "aws_secret_access_key": "very-secret", "allow_http": "true",
    }
    assert "very-secret" not in repr(settings)


def test_storage_options_that_are_not_a_json_object_are_refused_naming_the_setting() -> None:
    from hermes.errors import ConfigError

    with pytest.raises(ConfigError, match="HERMES_MEMORY_STORAGE_OPTIONS: expected a JSON object"):
        Settings(_env_file=None, memory_storage_options='["aws_region"]').resolved_memory_storage_options()


@pytest.mark.timeout(180)
def test_workers_opening_a_fresh_shared_store_at_once_all_open_it_and_see_the_same_tables(
    s3_server: Any, use: Any
) -> None:
    uri = s3_server.fresh_uri()
    openers = 6
    start = threading.Barrier(openers)
    stores: list[MemoryStore] = []
    errors: list[BaseException] = []

    def open_store() -> None:
        try:
            start.wait(timeout=30)
            stores.append(MemoryStore(uri, use, storage_options=s3_server.storage_options()))
        except BaseException as err:  # noqa: BLE001 - reported below
            errors.append(err)

    threads = [threading.Thread(target=open_store) for _ in range(openers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=150)
    assert errors == [], errors
    assert len(stores) == openers
    tables = {frozenset(s._table_names()) for s in stores}
    assert tables == {frozenset({MEMORY_TABLE, ARCHIVE_TABLE, FORGOTTEN_TABLE})}
    indexes = {frozenset(i.name for i in s.table.list_indices()) for s in stores}
    assert indexes == {frozenset({"user_id_idx", "memory_id_idx", "kind_idx", "status_idx", "subject_idx"})}
    stores[0].write([home("u1", "Bern", 1)], now=T0)
    assert all(current_homes(s, "u1") == 1 for s in stores)


@pytest.mark.timeout(240)
@on_local_and_s3
def test_a_reader_polling_during_many_supersedes_never_sees_the_user_without_a_home_city(store: MemoryStore) -> None:
    store.write([home("u1", CITIES[0], 0)], now=T0)
    seen: list[int] = []
    done = threading.Event()

    def reader() -> None:
        while not done.is_set():
            seen.append(current_homes(store, "u1"))

    polling = threading.Thread(target=reader)
    polling.start()
    try:
        for turn, city in enumerate(CITIES[1:], start=1):
            report = store.write([home("u1", city, turn)], now=T0 + timedelta(minutes=turn))
            assert len(report.superseded) == 1, report
    finally:
        done.set()
        polling.join(timeout=60)
    assert len(seen) > len(CITIES), "the reader hardly ran"
    assert 0 not in seen, f"{seen.count(0)} of {len(seen)} reads saw no current home city"
    assert current_homes(store, "u1") == 1


def test_a_write_whose_supersede_lost_a_race_retries_to_one_current_value_without_duplicates(
    store: MemoryStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    bern, zurich = home("u1", "Bern", 1), home("u1", "Zurich", 2)
    store.write([bern], now=T0)
    plan = store._plan
    raced: list[str] = []

    def plan_then_race(*args: Any, **kwargs: Any) -> Any:
        made = plan(*args, **kwargs)
        if not raced:  # another worker changes the old row between this plan and its commit
            raced.append(bern.candidate_id)
            store.record_hits([bern.candidate_id], now=T0)
        return made

    monkeypatch.setattr(store, "_plan", plan_then_race)
    report = store.write([zurich], now=T0 + timedelta(days=1))
    assert raced and report.inserted == [zurich.candidate_id] and report.superseded == [bern.candidate_id]
    rows = {r["memory_id"]: r for r in store.list("u1")}
    assert set(rows) == {bern.candidate_id, zurich.candidate_id}
    assert rows[zurich.candidate_id]["status"] == "active" and rows[zurich.candidate_id]["mentions"] == 1
    assert rows[bern.candidate_id]["status"] == "superseded"
    assert rows[bern.candidate_id]["superseded_by"] == zurich.candidate_id and rows[bern.candidate_id]["hit_count"] == 1


def test_a_write_of_many_candidates_with_a_supersede_is_one_commit(store: MemoryStore) -> None:
    store.write([home("u1", "Bern", 1)], now=T0)
    before, version = store.commits, store.table.version
    batch = [home("u1", "Zurich", 2)] + [
        MemoryCandidate(user_id="u1", text=text, kind="fact", source_session="s1", source_turn=3 + i, created_at=T0)
        for i, text in enumerate(["The user's cat is called Miso.", "The user works at ACME.", "The user plays the cello."])
    ]
    report = store.write(batch, now=T0 + timedelta(days=1))
    assert len(report.inserted) == 4 and len(report.superseded) == 1
    assert store.commits - before == 1
    assert store.table.version - version == 1


@pytest.mark.timeout(180)
@pytest.mark.filterwarnings("ignore:optimize\\(cleanup_older_than=0\\):UserWarning")
def test_consolidation_deletes_table_versions_older_than_the_retention(s3_server: Any, use: Any) -> None:
    store = MemoryStore(s3_server.fresh_uri(), use, storage_options=s3_server.storage_options(), keep_versions_seconds=0)
    for turn, city in enumerate(CITIES[:4]):
        store.write([home("u1", city, turn)], now=T0 + timedelta(minutes=turn))
    before = len(store.table.list_versions())
    assert before >= 4
    store.optimize()
    assert len(store.table.list_versions()) < 3, store.table.list_versions()
    assert current_homes(store, "u1") == 1
    assert [m.text for m in store.search("u1", "Where does the user live?", now=T0 + timedelta(hours=1))][:1] == [
        f"The user lives in {CITIES[3]}."
    ]


def test_a_remote_uri_without_options_takes_them_from_the_settings(
    s3_server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hermes.settings import get_settings

    monkeypatch.setenv("HERMES_S3_ENDPOINT_URL", s3_server.endpoint)
    monkeypatch.setenv("HERMES_S3_REGION", "us-east-1")
    monkeypatch.setenv("HERMES_S3_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("HERMES_S3_SECRET_ACCESS_KEY", "testing")
    get_settings.cache_clear()
    try:
        db = lance.connect(s3_server.fresh_uri())
        db.create_table("t", data=[{"a": 1}])
        assert list(db.table_names()) == ["t"]
    finally:
        get_settings.cache_clear()
