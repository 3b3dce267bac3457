"""Adversarial cases for long-term memory (issue 6): weird model answers, hostile text and
ids, naive datetimes through the API, and a forget racing a consolidation. Real LanceDB in
``tmp_path`` with the real offline embedder; the session-level case runs a real worker.
"""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from hermes.memory.extraction import parse_extraction
from hermes.memory.models import MemoryCandidate
from hermes.memory.service import open_store
from hermes.memory.store import MemoryStore, MemoryStoreError
from hermes.settings import Settings
from temporalio.testing import WorkflowEnvironment

T0 = datetime(2026, 1, 10, 12, 0, tzinfo=timezone.utc)
ALL_STATUSES = ("active", "superseded", "merged", "archived", "expired")


@pytest.fixture
def settings(temporal_env: WorkflowEnvironment, redis_url: str, task_queue: str) -> Settings:
    return Settings(redis_url=redis_url, task_queue=task_queue, temporal_address="unused:0", memory_batch_seconds=0.3)


def cand(user_id: str, text: str, **kw: Any) -> MemoryCandidate:
    kw.setdefault("created_at", T0)
    kw.setdefault("confidence", 0.9)
    return MemoryCandidate(user_id=user_id, text=text, **kw)


def parse(answer: str) -> tuple[list[MemoryCandidate], int, list[str]]:
    return parse_extraction(answer, user_id="u", session_id="s", turn=1, created_at=T0, min_confidence=0.75)


# ------------------------------------------------------------ extraction answers


def test_an_extracted_memory_of_only_whitespace_is_a_problem_and_the_others_are_kept() -> None:
    found, dropped, problems = parse(
        '{"memories": [{"text": "  \\n\\t ", "confidence": 0.9}, {"text": "The user likes tea.", "confidence": 0.9}]}'
    )
    assert [c.text for c in found] == ["The user likes tea."]
    assert dropped == 0 and len(problems) == 1 and "memories[0]" in problems[0]


@pytest.mark.parametrize(
    "answer",
    [
        '{"memories": [{"text": "x", "confidence": -0.5}]}',
        '{"memories": [{"text": "x", "confidence": 0.9, "valid_days": 1e9}]}',
        '{"memories": [{"text": "x", "confidence": 0.9, "kind": {"nested": [1, 2]}}]}',
        '{"memories": [{"text": "caf\\ud800", "confidence": 0.9}]}',
        '{"memories": {"text": "x", "confidence": 0.9}}',
        '{"memories": ' + "[" * 50_000 + "]" * 50_000 + "}",
        "```json\n" + " " * 200_000,
    ],
    ids=["negative-confidence", "valid-days-1e9", "nested-kind", "lone-surrogate", "not-a-list", "deep", "huge-unclosed-fence"],
)
def test_a_malformed_extraction_answer_gives_no_candidate_and_never_raises(answer: str) -> None:
    found, _, problems = parse(answer)
    assert found == [] and problems


def test_a_ten_megabyte_extraction_answer_keeps_at_most_fifty_memories_of_at_most_500_characters() -> None:
    item = '{"text": "%s", "confidence": 0.9}' % ("The user likes tea. " * 5000)
    answer = '{"memories": [' + ", ".join([item] * 100) + "]}"
    assert len(answer) > 10_000_000
    found, _, problems = parse(answer)
    assert len(found) == 50 and problems == []
    assert all(len(c.text) <= 500 for c in found)


# ------------------------------------------------------------ hostile text and ids


def test_a_user_id_with_a_lone_surrogate_is_refused_as_a_bad_id(store: MemoryStore) -> None:
    with pytest.raises(MemoryStoreError):
        store.search("u\ud800", "tea", now=T0)
    with pytest.raises(MemoryStoreError):
        store.write([cand("u\ud800", "The user likes tea.")], now=T0)


def test_a_value_with_a_lone_surrogate_is_stored_without_it(store: MemoryStore) -> None:
    report = store.write([cand("u1", "The user lives in Bern.", subject="home_city", value="Bern\ud800")], now=T0)
    assert len(report.inserted) == 1
    [row] = store.list("u1")
    assert row["value"].startswith("bern") and "\ud800" not in row["value"]


def test_control_characters_in_a_memory_never_reach_the_store_or_the_context(store: MemoryStore) -> None:
    store.write([cand("u1", "The user likes \x1b[31mred\x00 tea\x07 and \x9bgreen\u0085 tea.")], now=T0)
    [row] = store.list("u1")
    assert row["text"] == "The user likes [31mred tea and green tea."
    [found] = store.search("u1", "which tea does the user like", now=T0)
    assert found.text == row["text"]


def test_hostile_user_ids_neither_see_nor_forget_another_users_rows(store: MemoryStore) -> None:
    store.write([cand("victim", "The user's bank PIN is 4321.")], now=T0)
    for hostile in ["victim' OR '1'='1", "victim\\' OR 1=1 --", "victim%", "VICTIM", "victim ", "\u202evictim", "用户'; --"]:
        assert store.search(hostile, "bank PIN", now=T0) == []
        assert store.count(hostile) == 0 and store.list(hostile) == []
        store.forget_user(hostile, now=T0)
    assert store.count("victim") == 1


# ------------------------------------------------------------ forget racing consolidation


def test_a_forget_during_a_consolidation_leaves_no_archived_copy_of_the_users_rows(
    store: MemoryStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    old = T0 - timedelta(days=400)
    store.write([cand("u1", "The user plays the cello.", created_at=old),
                 cand("u1", "The user is in Rome this week.", created_at=old, valid_until=old + timedelta(days=7))], now=old)
    store.write([cand("u2", "The user plays the flute.", created_at=old)], now=old)
    real_rows = MemoryStore._rows
    forgotten = []

    def rows_then_forget(self: MemoryStore, *args: Any, **kwargs: Any) -> list[dict[str, Any]]:
        rows = real_rows(self, *args, **kwargs)
        if not forgotten:  # the consolidation has read the rows; the user asks to be forgotten now
            forgotten.append(self.forget_user("u1"))
        return rows

    monkeypatch.setattr(MemoryStore, "_rows", rows_then_forget)
    store.consolidate_user("u1", T0, archive_after_days=180)
    monkeypatch.undo()
    assert forgotten == [2]
    assert store.list("u1", statuses=ALL_STATUSES) == []
    assert store.list("u1", statuses=ALL_STATUSES, archived=True) == []
    assert store.count("u2") == 1


# ------------------------------------------------------------ through the writer


async def test_candidates_with_naive_datetimes_sent_after_a_forget_are_written_in_utc(
    run_worker: Any, settings: Settings
) -> None:
    user = f"user-{uuid.uuid4()}"
    store = open_store(settings)
    async with run_worker({"turns": [], "fallback": "Noted."}) as hermes:
        await hermes.forget_user(user)
        naive = datetime.now(timezone.utc).replace(tzinfo=None) + timedelta(minutes=1)
        report = await hermes.add_memories(user, [MemoryCandidate(
            user_id=user, text="The user plays the cello.", confidence=0.9, created_at=naive,
            valid_until=naive + timedelta(days=30),
        )])
    assert len(report.inserted) == 1
    [row] = store.list(user)
    assert row["created_at"] == naive.replace(tzinfo=timezone.utc)
