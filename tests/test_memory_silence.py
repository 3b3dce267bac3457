"""Silence when nothing is relevant (issue 15): the read path returns no memory for a
question none of the user's memories answers, and still finds the one a question in the
other language or in other words is about. Real LanceDB store in ``tmp_path`` with the
default embedder; no Temporal."""

from __future__ import annotations

import dataclasses
from datetime import datetime, timedelta, timezone

import numpy as np
import pytest

from hermes.memory.embeddings import Embedder
from hermes.memory.judge import persons
from hermes.memory.models import MemoryCandidate
from hermes.memory.relevance import REFERENCE_QUESTIONS, ReferenceBank
from hermes.memory.store import MemoryStore

T0 = datetime(2026, 5, 1, 9, 0, tzinfo=timezone.utc)
ASK = T0 + timedelta(days=30)

MEMORIES = (
    "Works as a nurse at the children's hospital.",
    "Has a dog called Biscuit.",
    "Her birthday is on June 14.",
    "Goes swimming twice a week.",
    "Prefers answers in bullet points.",
    "Drives a red Toyota Corolla.",
    "The team stand-up is at 9:30 every morning.",
    "Is learning Spanish on Duolingo.",
    "喜欢喝乌龙茶，不加糖。",
    "住在杭州西湖区。",
    "女儿在读初中二年级。",
    "每个周末去爬山。",
    "对花粉过敏。",
    "Uses a MacBook Air for work.",
)

UNRELATED = (
    "What's my blood type?",
    "How many vacation days do I have left this year?",
    "我上次体检是什么时候？",
    "我妈妈的手机号是多少？",
    "What is my favourite film?",
    "我们家的房屋保险什么时候续费？",
)

RELEVANT = (
    ("我的狗叫什么名字？", "Has a dog called Biscuit."),
    ("What do I like to drink?", "喜欢喝乌龙茶，不加糖。"),
    ("Which city do I live in?", "住在杭州西湖区。"),
    ("What grade is my daughter in?", "女儿在读初中二年级。"),
)


@pytest.fixture
def filled(store: MemoryStore) -> MemoryStore:
    store.write(
        [MemoryCandidate(user_id="u1", text=t, source_session="s", created_at=T0, confidence=0.9) for t in MEMORIES], now=T0
    )
    return store


def found(store: MemoryStore, question: str, generation: str | None) -> list[str]:
    return [m.text for m in store.search("u1", question, limit=5, now=ASK, generation=generation)]


@pytest.mark.parametrize("generation", [None, "g1"], ids=["lancedb", "held-rows"])
def test_a_question_no_memory_answers_gets_no_memory(filled: MemoryStore, generation: str | None) -> None:
    answered = {q: found(filled, q, generation) for q in UNRELATED}
    assert answered == {q: [] for q in UNRELATED}


def test_without_the_hub_check_unrelated_questions_get_memories(filled: MemoryStore) -> None:
    # What the check is for: with the plain floor some of them get memories.
    filled.thresholds = dataclasses.replace(filled.thresholds, retrieval_lift=-1.0, retrieval_sure=1.0)
    assert sum(bool(found(filled, q, None)) for q in UNRELATED) >= 2


@pytest.mark.parametrize("generation", [None, "g1"], ids=["lancedb", "held-rows"])
def test_a_question_in_the_other_language_or_other_words_still_finds_its_memory(filled: MemoryStore,
                                                                                generation: str | None) -> None:
    for question, memory in RELEVANT:
        assert memory in found(filled, question, generation), question


@pytest.mark.xfail(strict=True, reason="known limit of the hub check: a memory that answers a common question "
                   "(its hub level 0.23) is not lifted above it by that very question in the other language (0.21)")
def test_a_memory_that_answers_a_common_question_is_found_by_it_in_the_other_language(filled: MemoryStore) -> None:
    assert "Goes swimming twice a week." in found(filled, "我平时做什么运动？", None)


def test_a_question_about_someone_else_is_not_answered_by_a_memory_naming_none_of_them(filled: MemoryStore) -> None:
    assert found(filled, "我妈妈住在哪里？", None) == []
    assert found(filled, "When is my brother's birthday?", None) == []


def test_a_contraction_is_not_a_person() -> None:
    assert persons("What's my blood type?") == frozenset()
    assert persons("That's Jonas's car.") == {"jonas"}


def test_hub_levels_are_each_memorys_mean_of_its_closest_bank_questions(use: Embedder) -> None:
    bank = ReferenceBank(use, k=3)
    vectors = use.embed_passages(["Her birthday is on June 14.", "Has a dog called Biscuit."])
    levels = bank.hub(vectors)
    expected = np.sort(vectors @ bank.matrix.T, axis=1)[:, -3:].mean(axis=1)
    assert levels.shape == (2,) and np.allclose(levels, expected)
    assert bank.matrix.shape == (len(REFERENCE_QUESTIONS), use.dim)
    assert bank.hub(np.zeros((0, use.dim), dtype=np.float32)).shape == (0,)


def test_a_bank_without_questions_or_with_a_bad_k_is_refused(use: Embedder) -> None:
    with pytest.raises(ValueError, match="at least one question"):
        ReferenceBank(use, questions=())
    with pytest.raises(ValueError, match="k must be in 1..2"):
        ReferenceBank(use, questions=("a?", "b?"), k=3)


def test_a_question_about_an_attribute_no_memory_holds_is_not_answered_by_a_favourite_drink(store: MemoryStore) -> None:
    # Issue 30's development set: "Likes green tea." stood 0.00-0.01 above its hub level
    # for "What's my blood type?" and was injected; the lift is 0.01.
    store.write([MemoryCandidate(user_id="u1", text=t, source_session="s", created_at=T0, confidence=0.9)
                 for t in ("Likes green tea.", "Plays the cello in an amateur orchestra.")], now=T0)
    assert found(store, "What's my blood type?", None) == []
    assert found(store, "What do I like to drink?", None)[:1] == ["Likes green tea."]


def test_a_pooled_embedder_embeds_the_bank_in_one_call_to_its_child_with_the_same_vectors(use: Embedder) -> None:
    """A worker's first search embedded the bank's hundred questions one pool round trip
    each (3 s idle; past the search's timeout when starved, and the demo's recall came
    back empty under eight busy processes per core): one call now, same matrix."""
    from hermes.infra.cpu_pool import CpuPool
    from hermes.memory.embeddings import PooledEmbedder

    pool = CpuPool(1)
    try:
        pooled = PooledEmbedder("use", pool)
        calls: list[str] = []
        real_call = pool.call

        def counting(fn, *args):  # type: ignore[no-untyped-def]
            calls.append(fn.__name__)
            return real_call(fn, *args)

        pool.call = counting  # type: ignore[method-assign]
        matrix = ReferenceBank(pooled).matrix
    finally:
        pool.shutdown()
    assert calls == ["_queries_in_child"], calls
    assert np.allclose(matrix, ReferenceBank(use).matrix, atol=1e-5)
