"""The memory store's plain parts, without LanceDB: the consolidation's decisions (what
leaves by time, which subject conflicts resolve how, which rows are one memory), the rows a
restatement and a supersede make, and the rerank score (issue 29)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

import numpy as np
import pytest

from hermes.memory.consolidation import age_out, duplicate_clusters, subject_conflicts
from hermes.memory.models import ConsolidationReport, MemoryCandidate
from hermes.memory.reads import rerank_score
from hermes.memory.schema import MAX_SOURCES, superseded_row
from hermes.memory.writes import restated_match, restated_row

T0 = datetime(2026, 1, 10, 12, 0, tzinfo=timezone.utc)
DAY = timedelta(days=1)


def row(memory_id: str, text: str = "", *, vector: list[float] | None = None, **fields: Any) -> dict[str, Any]:
    base = {
        "memory_id": memory_id, "user_id": "u1", "kind": "fact", "subject": "", "value": "", "text": text or memory_id,
        "vector": np.asarray(vector or [1.0, 0.0], dtype=np.float32), "importance": 0.5, "confidence": 0.8,
        "source": "model", "created_at": T0, "updated_at": T0, "last_hit_at": None, "hit_count": 0, "mentions": 1,
        "sources": [memory_id], "valid_until": None, "superseded_by": None, "status": "active", "version": 1,
    }
    return base | fields


def unit(angle_degrees: float) -> list[float]:
    a = np.radians(angle_degrees)
    return [float(np.cos(a)), float(np.sin(a))]


def test_rows_past_their_validity_expire_and_rows_unused_past_their_age_are_archived() -> None:
    rows = [
        row("trip", valid_until=T0 + 7 * DAY),
        row("remark", importance=0.5, updated_at=T0 - 200 * DAY),
        row("recent", updated_at=T0 + 9 * DAY),
        row("pinned", source="remember", updated_at=T0 - 900 * DAY),
    ]
    report = ConsolidationReport(users=1)
    moves = age_out(rows, T0 + 10 * DAY, 180.0, report)
    assert {mid: status for mid, (_, status) in moves.items()} == {"trip": "expired", "remark": "archived"}
    assert (report.expired, report.archived) == (1, 1)
    assert report.details[0].startswith("expired trip: valid until 2026-01-17")


def test_a_subject_with_two_values_keeps_the_newest_and_supersedes_the_other_at_half_confidence() -> None:
    older = row("bern", subject="home_city", value="bern", updated_at=T0)
    newer = row("zurich", subject="home_city", value="zurich", updated_at=T0 + DAY)
    same_value = row("zurich2", subject="home_city", value="zurich", updated_at=T0 - DAY)
    report = ConsolidationReport(users=1)
    updates = subject_conflicts([older, newer, same_value], T0 + 2 * DAY, report)
    assert list(updates) == ["bern"]  # the same value is a duplicate: merged, not superseded
    assert updates["bern"]["status"] == "superseded" and updates["bern"]["superseded_by"] == "zurich"
    assert updates["bern"]["confidence"] == pytest.approx(0.4) and updates["bern"]["updated_at"] == T0 + 2 * DAY
    assert report.superseded == 1 and older["status"] == "active"  # the row read is not changed in place


def test_close_rows_cluster_with_the_most_used_first_unless_their_identifiers_differ() -> None:
    a = row("a", "Locker L-1007 is mine.", vector=unit(0), mentions=1)
    b = row("b", "Locker L-1007 is mine!", vector=unit(1), mentions=3)
    c = row("c", "Locker L-1009 is mine.", vector=unit(0.5))
    far = row("far", "Likes tea.", vector=unit(80))
    clusters = duplicate_clusters([a, b, c, far], dedupe=0.99)
    assert [[r["memory_id"] for r in members] for members in clusters] == [["b", "a"]]


def test_the_same_subject_and_value_is_one_memory_however_differently_worded() -> None:
    a = row("a", "Lives in Bern.", vector=unit(0), subject="home_city", value="bern", created_at=T0 + DAY)
    b = row("b", "Home is the Swiss capital.", vector=unit(70), subject="home_city", value="bern")
    clusters = duplicate_clusters([a, b], dedupe=0.99)
    assert [[r["memory_id"] for r in members] for members in clusters] == [["b", "a"]]  # equal use: the older first


def test_fewer_than_two_rows_make_no_cluster() -> None:
    assert duplicate_clusters([row("a")], dedupe=0.5) == []


def test_a_candidate_restates_the_closest_row_of_its_subject_and_value_or_a_near_identical_one() -> None:
    v = np.asarray(unit(0), dtype=np.float32)
    bern = row("bern", subject="home_city", value="bern", vector=unit(60))
    bern_closer = row("bern2", subject="home_city", value="bern", vector=unit(30))
    zurich = row("zurich", subject="home_city", value="zurich", vector=unit(0))
    assert restated_match([bern, zurich, bern_closer], v, "Lives in Bern.", "home_city", "bern", 0.99) is bern_closer
    assert restated_match([zurich], v, "Lives in Bern.", "home_city", "bern", 0.5) is None  # a new value: a supersede
    locker = row("l7", "Locker L-1007.", vector=unit(0))
    assert restated_match([locker], v, "Locker L-1007!", "", "", 0.99) is locker
    assert restated_match([locker], v, "Locker L-1009.", "", "", 0.99) is None  # other identifiers
    assert restated_match([row("far", vector=unit(30))], v, "far", "", "", 0.99) is None  # under the threshold


def test_a_restatement_counts_a_mention_keeps_the_higher_scores_and_the_later_validity() -> None:
    stored = row("m1", importance=0.9, confidence=0.6, mentions=2, valid_until=T0 + 30 * DAY,
                 sources=[f"s{i}" for i in range(MAX_SOURCES)])
    cand = MemoryCandidate(candidate_id="c9", user_id="u1", text="x", importance=0.3, confidence=0.95,
                           source="remember", created_at=T0, valid_until=T0 + 10 * DAY)
    out = restated_row(stored, cand, "home_city", "bern", T0 + DAY)
    assert (out["importance"], out["confidence"], out["mentions"]) == (0.9, 0.95, 3)
    assert out["valid_until"] == T0 + 30 * DAY and out["updated_at"] == T0 + DAY
    assert out["source"] == "remember"  # "remember" said of a known memory pins it
    assert out["sources"][-1] == "c9" and len(out["sources"]) == MAX_SOURCES
    assert (out["subject"], out["value"], out["version"]) == ("home_city", "bern", 1)
    assert stored["mentions"] == 2  # a copy: the plan keeps the row it read


def test_a_superseded_row_links_its_replacement_and_keeps_half_its_confidence() -> None:
    out = superseded_row(row("old", confidence=0.9, version=4), "new", T0 + DAY)
    assert (out["status"], out["superseded_by"], out["confidence"]) == ("superseded", "new", 0.45)
    assert out["updated_at"] == T0 + DAY and out["version"] == 4


def test_the_rerank_score_weighs_relative_similarity_recency_importance_and_use() -> None:
    fresh = row("a", importance=1.0, hit_count=10, mentions=1)  # 10 uses: frequency 1
    assert rerank_score(fresh, 0.9, T0, floor=0.5, best=0.9) == pytest.approx(1.0)
    assert rerank_score(fresh, 0.5, T0, floor=0.5, best=0.9) == pytest.approx(0.5)  # at the floor: no similarity
    month_old = rerank_score(fresh, 0.9, T0 + 30 * DAY, floor=0.5, best=0.9)
    assert month_old == pytest.approx(1.0 - 0.2 * 0.5)  # recency halves in 30 days
    unused = row("b", importance=0.0)
    assert rerank_score(unused, 0.9, T0, floor=0.5, best=0.9) == pytest.approx(0.5 + 0.2)
