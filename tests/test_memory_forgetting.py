"""Forgetting weighs importance, confidence and use, not age alone (issue 15): the archive
step of consolidation (hermes/memory/store.py ``archive_age_days``). Real LanceDB in
``tmp_path`` with the real offline embedder; times are given, never waited for.
"""

from __future__ import annotations

import math
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from hermes.memory.models import MemoryCandidate
from hermes.memory.rules import extract_by_rules
from hermes.memory.store import MemoryStore, archive_age_days

T0 = datetime(2026, 1, 10, 12, 0, tzinfo=timezone.utc)
DAY = timedelta(days=1)
BASE = 180.0  # the default profile's archive age


def cand(text: str, **kw: Any) -> MemoryCandidate:
    kw.setdefault("created_at", T0)
    kw.setdefault("confidence", 0.9)
    kw.setdefault("source", "rules")
    return MemoryCandidate(user_id="u1", text=text, **kw)


def active_texts(store: MemoryStore) -> set[str]:
    return {r["text"] for r in store.list("u1", statuses=("active",))}


def test_an_important_fact_not_retrieved_for_the_archive_period_stays_and_a_passing_remark_goes(store):
    allergy = cand("The user is allergic to peanuts.", importance=0.9, source_turn=1)
    remark = cand("The user had pasta for lunch.", importance=0.3, source_turn=2)
    store.write([allergy, remark], now=T0)
    report = store.consolidate_user("u1", T0 + (BASE + 1) * DAY, archive_after_days=BASE)
    assert report.archived == 1
    assert active_texts(store) == {allergy.text}
    assert [r["text"] for r in store.list("u1", statuses=("archived",), archived=True)] == [remark.text]
    # The important one is not kept forever: x3 for importance 0.9, x1.125 for confidence 0.9.
    assert store.consolidate_user("u1", T0 + 3.3 * BASE * DAY, archive_after_days=BASE).archived == 0
    assert store.consolidate_user("u1", T0 + 3.5 * BASE * DAY, archive_after_days=BASE).archived == 1
    assert active_texts(store) == set()


def test_a_passing_remark_goes_before_the_archive_period(store):
    store.write([cand("The user had pasta for lunch.", importance=0.3, confidence=0.8)], now=T0)  # x0.57
    assert store.consolidate_user("u1", T0 + 0.5 * BASE * DAY, archive_after_days=BASE).archived == 0
    assert store.consolidate_user("u1", T0 + 0.6 * BASE * DAY, archive_after_days=BASE).archived == 1


def test_an_explicit_remember_is_never_archived_by_age(store):
    rules = extract_by_rules("Remember that my locker code is 4711.")
    assert [c.explicit for c in rules] == [True]
    (rc,) = rules
    pinned = cand(rc.text, importance=rc.importance, confidence=rc.confidence, source="remember", source_turn=1)
    said = cand("The user's bike is blue.", importance=rc.importance, confidence=rc.confidence, source_turn=2)
    added = cand("The user's badge number is 88.", importance=0.5, source="cli", source_turn=3)
    store.write([pinned, said, added], now=T0)
    report = store.consolidate_user("u1", T0 + 100 * BASE * DAY, archive_after_days=BASE)
    assert report.archived == 1
    assert active_texts(store) == {pinned.text, added.text}
    # A superseded "remember" (the user moved since) is archived by age like any old value.
    assert math.isfinite(archive_age_days({"source": "remember", "status": "superseded", "importance": 0.8,
                                           "confidence": 0.45, "hit_count": 0}, BASE))


def test_an_explicit_remember_still_expires_when_it_says_it_does(store):
    trip = cand("The user is in Tokyo this week.", source="remember", valid_until=T0 + 7 * DAY)
    store.write([trip], now=T0)
    report = store.consolidate_user("u1", T0 + 8 * DAY, archive_after_days=BASE)
    assert (report.expired, report.archived) == (1, 0)


def test_remember_said_of_a_known_memory_pins_it(store):
    store.write([cand("The user's locker code is 4711.", importance=0.5, source_turn=1)], now=T0)
    report = store.write([cand("The user's locker code is 4711.", importance=0.5, source="remember",
                               source_turn=2)], now=T0)
    assert len(report.updated) == 1
    assert store.consolidate_user("u1", T0 + 100 * BASE * DAY, archive_after_days=BASE).archived == 0


def test_a_frequently_retrieved_low_importance_row_outlives_an_unretrieved_one(store):
    used = cand("The user takes the 7:40 train.", importance=0.4, source_turn=1)
    unused = cand("The user bought new socks.", importance=0.4, source_turn=2)
    store.write([used, unused], now=T0)
    for _ in range(7):
        store.record_hits([used.candidate_id], now=T0)  # retrieved often, then not for a while
    day = BASE * 16 ** (0.4 - 0.5) * (0.9 / 0.8) + 1  # just past the unretrieved row's age
    assert store.consolidate_user("u1", T0 + day * DAY, archive_after_days=BASE).archived == 1
    assert active_texts(store) == {used.text}
    # Its own age is 2.5 times longer (1 + 0.5 log2(8)), counted from the last retrieval.
    assert store.consolidate_user("u1", T0 + 2.4 * day * DAY, archive_after_days=BASE).archived == 0
    assert store.consolidate_user("u1", T0 + 2.6 * day * DAY, archive_after_days=BASE).archived == 1


@pytest.mark.parametrize(("row", "factor"), [
    ({"importance": 0.5, "confidence": 0.8, "hit_count": 0}, 1.0),
    ({"importance": 1.0, "confidence": 0.8, "hit_count": 0}, 4.0),
    ({"importance": 0.0, "confidence": 0.8, "hit_count": 0}, 0.25),
    ({"importance": 0.5, "confidence": 0.4, "hit_count": 0}, 0.5),
    ({"importance": 0.5, "confidence": 1.0, "hit_count": 0}, 1.25),
    ({"importance": 0.5, "confidence": 0.8, "hit_count": 1}, 1.5),
    ({"importance": 0.5, "confidence": 0.8, "hit_count": 1000}, 3.0),
    ({"importance": 0.5, "confidence": 0.8, "hit_count": 0, "source": "remember"}, math.inf),
    ({"importance": 0.5, "confidence": 0.8, "hit_count": 0, "source": "cli", "status": "active"}, math.inf),
    ({"importance": 0.5, "confidence": 0.8, "hit_count": 0, "source": "api"}, 1.0),
    ({"importance": 0.5, "confidence": 0.8, "hit_count": 0, "source": "model"}, 1.0),
])
def test_the_archive_age_follows_the_documented_formula(row, factor):
    assert archive_age_days(row, BASE) == pytest.approx(BASE * factor)


def test_more_importance_confidence_or_use_never_shortens_the_archive_age():
    grid = [(i / 10, c / 10, h) for i in range(11) for c in range(1, 11) for h in (0, 1, 3, 20)]
    age = {g: archive_age_days({"importance": g[0], "confidence": g[1], "hit_count": g[2]}, BASE) for g in grid}
    for (i, c, h), days in age.items():
        for other in ((i + 0.1, c, h), (i, c + 0.1, h), (i, c, h + 1)):
            key = (round(other[0], 1), round(other[1], 1), other[2])
            if key in age:
                assert age[key] >= days
