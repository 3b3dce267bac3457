"""Writes never lie (issue 15): a write report names as inserted or updated only rows that
are stored, for the user who wrote them. Memory ids are global (one table for every user):
a caller-chosen id another user already has is refused with the id named, never reported
``inserted`` while nothing is stored. Real LanceDB in ``tmp_path``, the real offline
embedder, no Temporal.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from hermes.memory.models import MemoryCandidate, WriteReport
from hermes.memory.store import MemoryStore

T0 = datetime(2026, 1, 10, 12, 0, tzinfo=timezone.utc)
DAY = timedelta(days=1)
ALL_STATUSES = ("active", "superseded", "merged", "archived", "expired")


def cand(user_id: str, text: str, **kw: Any) -> MemoryCandidate:
    kw.setdefault("created_at", T0)
    kw.setdefault("confidence", 0.9)
    return MemoryCandidate(user_id=user_id, text=text, **kw)


def assert_report_is_true(store: MemoryStore, user_id: str, report: WriteReport) -> None:
    """Every id the report says was inserted or updated is a row of ``user_id``."""
    rows = {r["memory_id"]: r for r in store.list(user_id, statuses=ALL_STATUSES)}
    for mid in report.inserted + report.updated:
        assert mid in rows, f"{mid} reported written for {user_id} but not stored for them"
        assert rows[mid]["user_id"] == user_id


def test_an_id_another_user_has_is_refused_by_name_and_the_first_users_row_is_untouched(store):
    first = store.write([cand("alice", "The user likes green tea.", candidate_id="m1")], now=T0)
    assert first.inserted == ["m1"]
    second = store.write([cand("bob", "The user plays the cello.", candidate_id="m1"),
                          cand("bob", "The user lives in Lyon.", candidate_id="m2")], now=T0 + DAY)
    assert second.inserted == ["m2"]
    assert second.dropped == 1
    assert len(second.refused) == 1 and "'m1'" in second.refused[0] and "another user" in second.refused[0]
    assert_report_is_true(store, "bob", second)
    (alice,) = store.list("alice")
    assert (alice["memory_id"], alice["text"]) == ("m1", "The user likes green tea.")
    assert [r["text"] for r in store.list("bob")] == ["The user lives in Lyon."]


def test_an_id_another_user_has_only_in_the_archive_is_refused_too(store):
    store.write([cand("alice", "The user likes green tea.", candidate_id="m1")], now=T0)
    store.consolidate_user("alice", T0 + 400 * DAY, archive_after_days=90)
    assert [r["memory_id"] for r in store.list("alice", statuses=ALL_STATUSES, archived=True)] == ["m1"]
    report = store.write([cand("bob", "The user plays the cello.", candidate_id="m1")], now=T0 + 401 * DAY)
    assert report.inserted == [] and "'m1'" in report.refused[0]
    assert store.list("bob", statuses=ALL_STATUSES) == []
    (archived,) = store.list("alice", statuses=ALL_STATUSES, archived=True)
    assert archived["text"] == "The user likes green tea."


def test_the_same_users_id_sent_again_is_unchanged_not_refused(store):
    store.write([cand("alice", "The user likes green tea.", candidate_id="m1")], now=T0)
    again = store.write([cand("alice", "The user likes green tea.", candidate_id="m1")], now=T0 + DAY)
    assert again.inserted == [] and again.refused == [] and again.unchanged == 1


def test_one_id_twice_in_a_batch_is_one_insert_of_the_first_candidate(store):
    report = store.write([cand("alice", "The user likes green tea.", candidate_id="m1"),
                          cand("alice", "The user owns a red bicycle.", candidate_id="m1")], now=T0)
    assert report.inserted == ["m1"] and report.unchanged == 1
    assert [r["text"] for r in store.list("alice")] == ["The user likes green tea."]


def test_an_id_taken_by_another_user_during_the_write_is_not_reported_inserted(store, tmp_path, use, monkeypatch):
    # Another writer (its own store object, as in another worker) inserts the id between
    # the collision check and the insert.
    other = MemoryStore(tmp_path / "m", use)
    check = store._ids_of_other_users

    def racing(user_id: str, ids: list[str]) -> set[str]:
        found = check(user_id, ids)
        other.write([cand("alice", "The user likes green tea.", candidate_id="m1")], now=T0)
        return found

    monkeypatch.setattr(store, "_ids_of_other_users", racing)
    report = store.write([cand("bob", "The user plays the cello.", candidate_id="m1")], now=T0)
    assert report.inserted == [] and report.dropped == 1 and "'m1'" in report.refused[0]
    assert store.list("bob") == []


def test_every_id_a_report_names_as_written_is_stored_for_its_user(store):
    users = ["alice", "bob", "carol"]
    texts = ["The user likes green tea.", "Likes green tea!", "The user lives in Bern.", "The user moved to Zurich.",
             "用户喜欢绿茶。", "The user's daughter is called Mia.", "The user works at ACME."]
    reports: list[tuple[str, WriteReport]] = []
    for day, text in enumerate(texts):
        for user in users:
            subject = "home_city" if "Bern" in text or "Zurich" in text else ""
            value = "Bern" if "Bern" in text else "Zurich" if "Zurich" in text else ""
            # A caller-chosen id that every user reuses, and a generated one.
            reports.append((user, store.write([
                cand(user, text, candidate_id=f"shared-{day}", subject=subject, value=value),
                cand(user, text + " (again)", source_turn=day + 1),
            ], now=T0 + day * DAY)))
    assert sum(len(r.refused) for _, r in reports) >= len(texts) - 1  # the shared ids did collide
    for user, report in reports:
        assert_report_is_true(store, user, report)
        for line in report.refused:
            (mid,) = [m for m in (f"shared-{d}" for d in range(len(texts))) if repr(m) in line]
            owners = {r["user_id"] for t in (store.table, store.archive) for r in t.search().where(
                f"memory_id = '{mid}'").to_list()}
            assert owners and user not in owners


# A retried write (issue 27): the report says what the write did, not "unchanged".


def _fail_once_after_commit(store: MemoryStore, monkeypatch: Any) -> None:
    """The next write applies its rows, then fails before returning (a lost connection
    after the commit, a worker killed there)."""
    confirm = store._confirm_inserts

    def lost(*args: Any, **kwargs: Any) -> None:
        monkeypatch.setattr(store, "_confirm_inserts", confirm)
        raise ConnectionError("connection lost after the commit")

    monkeypatch.setattr(store, "_confirm_inserts", lost)


def test_a_retry_of_a_write_that_landed_reports_the_fact_it_superseded(store, monkeypatch):
    bern = store.write([cand("alice", "The user lives in Bern.", subject="home_city", value="Bern")], now=T0)
    zurich = cand("alice", "The user lives in Zurich.", subject="home_city", value="Zurich")
    _fail_once_after_commit(store, monkeypatch)
    with pytest.raises(ConnectionError):
        store.write([zurich], now=T0 + DAY)
    retry = store.write([zurich], now=T0 + DAY, retried=True)
    assert retry.superseded == bern.inserted
    assert retry.inserted == [zurich.candidate_id] and retry.unchanged == 0
    # The same candidate sent again later (not a retry) changed nothing that time.
    again = store.write([zurich], now=T0 + 2 * DAY)
    assert again.unchanged == 1 and again.inserted == again.superseded == []


def test_a_retry_of_a_write_folded_into_a_known_memory_reports_it_updated(store, monkeypatch):
    first = store.write([cand("alice", "The user likes green tea.")], now=T0)
    restated = cand("alice", "The user likes green tea.", candidate_id="restated-1")
    _fail_once_after_commit(store, monkeypatch)
    with pytest.raises(ConnectionError):
        store.write([restated], now=T0 + DAY)
    retry = store.write([restated], now=T0 + DAY, retried=True)
    assert retry.updated == first.inserted and retry.inserted == [] and retry.unchanged == 0
