"""The memory judge (issue 15) on a real LanceDB store in ``tmp_path`` with the default
embedder: normalised restatements merge, the rules never merge differing numbers or a
negation, the model's verdicts are applied without deleting anything, change words in
English and Chinese supersede without a subject, the model calls are bounded per run, the
read path never judges, and a shared word alone admits nothing. No Temporal.
"""

from __future__ import annotations

import asyncio
import json
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

import hermes.memory.store as store_module
from activities.memory import judge_pairs
from hermes.memory.embeddings import Embedder
from hermes.memory.judge import JudgeBands, JudgeMemoriesInput, JudgePair, applied_verdict, assess, normalise
from hermes.memory.models import MemoryCandidate
from hermes.memory.store import MemoryStore
from hermes.models import CallModelResult, Message

T0 = datetime(2026, 3, 1, 9, 0, tzinfo=timezone.utc)
DAY = timedelta(days=1)
BANDS = JudgeBands(floor=0.3, marker_floor=0.25, rules_same=0.75, change=0.5)


def cand(text: str, day: int, user: str = "u1") -> MemoryCandidate:
    return MemoryCandidate(user_id=user, text=text, source_session=f"s{day}", source_turn=1,
                           created_at=T0 + day * DAY, confidence=0.9)


class Judge:
    """A provider answering every judge request with ``verdict``; counts its calls."""

    def __init__(self, verdict: str) -> None:
        self.verdict = verdict
        self.calls = 0

    async def complete(self, request: Any) -> CallModelResult:
        assert request.purpose == "memory_judge"
        self.calls += 1
        return CallModelResult(message=Message(role="assistant", content=json.dumps({"verdict": self.verdict})))


def active(store: MemoryStore, user: str = "u1") -> list[dict[str, Any]]:
    return store.list(user, statuses=("active",))


def test_a_restatement_that_differs_only_in_case_and_punctuation_is_merged_into_the_first(store: MemoryStore) -> None:
    assert normalise("Likes green tea.") == normalise("likes  GREEN tea!") == normalise("ｌｉｋｅｓ green tea")
    first, again = cand("Likes green tea.", 0), cand("likes green tea!", 7)
    store.write([first], now=T0)
    report = store.write([again], now=T0 + 7 * DAY, judge=True)
    assert report.inserted == [] and report.updated == [first.candidate_id]
    rows = active(store)
    assert len(rows) == 1 and again.candidate_id in rows[0]["sources"]


@pytest.mark.parametrize(
    ("older", "newer"),
    [
        ("The locker code is 4711.", "The locker code is 4712."),
        ("The 2.0 release is planned for March 12.", "The 2.0 release is planned for March 20."),
        ("The user's wife's birthday is on May 3.", "The user's son's birthday is on May 3."),
    ],
)
def test_the_rules_never_merge_texts_whose_numbers_or_one_word_differ_whatever_the_model_says(older: str, newer: str) -> None:
    verdict = assess(older, newer, 0.95, BANDS)
    assert verdict.verdict != "same" and verdict.never_same
    pair = JudgePair(older_id="a", newer_id="b", similarity=0.95, fallback=verdict.verdict, never_same=verdict.never_same)
    assert applied_verdict(pair, "same") == "update"


def test_a_statement_and_its_negation_are_a_certain_contradiction_and_the_newer_wins(store: MemoryStore) -> None:
    verdict = assess("Likes cilantro.", "Doesn't like cilantro.", 0.8, BANDS)
    assert (verdict.verdict, verdict.certain) == ("contradicts", True)
    old, new = cand("Likes cilantro.", 0), cand("Doesn't like cilantro.", 5)
    store.write([old], now=T0)
    report = store.write([new], now=T0 + 5 * DAY, judge=True)
    assert report.superseded == [old.candidate_id]
    (row,) = [r for r in store.list("u1") if r["memory_id"] == old.candidate_id]
    assert row["status"] == "superseded" and row["superseded_by"] == new.candidate_id


@pytest.mark.parametrize(
    ("older", "newer"),
    [
        ("Our office is in Lyon.", "We moved the office from Lyon to Nantes."),
        ("表妹的婚礼定在八月举行。", "表妹的婚礼延期到九月了。"),
        ("学校老师之间用企业微信沟通。", "学校现在改用钉钉沟通了。"),
    ],
)
def test_a_change_word_in_either_language_makes_a_supersede_candidate_and_without_a_model_the_old_is_superseded(
    tmp_path: Path, use: Embedder, older: str, newer: str
) -> None:
    judged = MemoryStore(tmp_path / "judged", use)
    old, new = cand(older, 0), cand(newer, 30)
    judged.write([old], now=T0)
    report = judged.write([new], now=T0 + 30 * DAY, judge=True)
    assert [(p.older_id, p.newer_id, p.fallback) for p in report.judge_pairs] == [(old.candidate_id, new.candidate_id, "update")]
    rules = MemoryStore(tmp_path / "rules", use)
    rules.write([old], now=T0)
    assert rules.write([new], now=T0 + 30 * DAY).superseded == [old.candidate_id]
    assert [r["memory_id"] for r in active(rules)] == [new.candidate_id]


def test_the_models_verdicts_are_applied_merged_into_the_older_or_the_older_kept_superseded_and_linked(
    tmp_path: Path, use: Embedder
) -> None:
    for verdict in ("same", "update"):
        store = MemoryStore(tmp_path / verdict, use)
        old, new = cand("Prefers a window seat on flights.", 0), cand("Always book me a window seat when I fly.", 9)
        store.write([old], now=T0)
        report = store.write([new], now=T0 + 9 * DAY, judge=True)
        assert [p.newer_id for p in report.judge_pairs] == [new.candidate_id]
        assert len(active(store)) == 2  # nothing decided before the judge
        done = asyncio.run(judge_pairs(store, Judge(verdict), JudgeMemoriesInput(user_id="u1", pairs=report.judge_pairs)))
        assert done.asked == 1
        if verdict == "same":
            (row,) = active(store)
            assert row["memory_id"] == old.candidate_id and new.candidate_id in row["sources"]
            (archived,) = store.list("u1", statuses=("merged",), archived=True)
            assert archived["memory_id"] == new.candidate_id and archived["superseded_by"] == old.candidate_id
        else:
            assert [r["memory_id"] for r in active(store)] == [new.candidate_id]
            (kept,) = store.list("u1", statuses=("superseded",))
            assert kept["memory_id"] == old.candidate_id and kept["superseded_by"] == new.candidate_id
        assert f"{old.candidate_id}|{new.candidate_id}" in store.judged_pairs("u1")


def test_the_judge_asks_the_model_at_most_max_calls_times_and_decides_the_rest_by_rules(store: MemoryStore) -> None:
    texts = ["Prefers short answers.", "Keep answers brief, please.", "Wants concise replies.",
             "Likes answers that are short and to the point.", "Short answers, no long explanations."]
    pairs = []
    for day, text in enumerate(texts):
        pairs += store.write([cand(text, day)], now=T0 + day * DAY, judge=True).judge_pairs
    assert len(pairs) > 2
    model = Judge("different")
    report = asyncio.run(judge_pairs(store, model, JudgeMemoriesInput(user_id="u1", pairs=pairs, max_calls=2)))
    assert model.calls == 2 and report.asked == 2 and report.by_rules == len(pairs) - 2


def test_consolidation_finds_pairs_the_writer_missed_applies_certain_ones_and_returns_no_more_than_its_budget(
    store: MemoryStore,
) -> None:
    texts = ["Prefers short answers.", "Keep answers brief, please.", "Wants concise replies.",
             "Likes answers that are short and to the point.", "prefers short answers!"]
    rows = [store.new_row(cand(t, d), t, v, T0 + d * DAY) for d, (t, v) in enumerate(zip(texts, store.embedder.embed_passages(texts)))]
    store.insert_rows(rows)  # as writers racing each other could leave them: nothing judged yet
    details, pairs = store.judge_pass("u1", T0 + 10 * DAY, judge=True, max_pairs=2)
    assert len(pairs) == 2
    assert [d.split(" (")[0] for d in details] == [f"merged {rows[4]['memory_id']}"]
    assert len(active(store)) == len(texts) - 1


def test_the_read_path_never_judges(store: MemoryStore, monkeypatch: pytest.MonkeyPatch) -> None:
    store.write([cand("Likes green tea.", 0)], now=T0)

    def refuse(*args: Any) -> None:
        raise AssertionError("the judge ran on the read path")

    monkeypatch.setattr(store_module, "assess", refuse)
    found = store.search("u1", "What do I like to drink?", now=T0 + DAY)
    assert [m.text for m in found] == ["Likes green tea."]
