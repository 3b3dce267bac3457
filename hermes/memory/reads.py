"""The read path: search (prefilter, vector top-k, identifiers, relevance, rerank), the
per-user in-memory cache of active rows, scoring and hit counting."""

from __future__ import annotations

import math
import re
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

import numpy as np

from hermes.infra import lance
from hermes.memory import crosslingual, people, relevance
from hermes.memory.models import (
    MemoryKind,
    RetrievedMemory,
)
from hermes.memory.schema import (
    _utc,
    check_id,
    sql_str,
    sql_time,
)
from hermes.memory.text import clean_text, content_words, identifiers

VECTOR_TOP_K = 20
"""Vector candidates per search (seed 002 §6.2: top 20)."""
KEYWORD_TOP_K = 10
RERANK_WEIGHTS = (0.5, 0.2, 0.2, 0.1)
"""Similarity, recency, importance, frequency (seed 004 §6.3)."""
RECENCY_HALF_LIFE_DAYS = 30.0
"""A memory's recency term halves every this many days since it was last stated or used."""
FREQUENCY_SATURATION = 10
"""Uses (hits plus restatements) at which the frequency term reaches 1."""
USER_CACHE_MAX_ROWS = 5000
"""Users with at most this many active rows are searched in memory (exact); larger ones
through LanceDB (and its vector index)."""
USER_CACHE_SECONDS = 60.0
"""A user's cached rows are read again at least this often (hit statistics move)."""
USER_CACHE_USERS = 2000
"""Users whose rows one process holds (the oldest loaded goes first)."""


def rerank_score(row: dict[str, Any], similarity: float, now: datetime, *, floor: float, best: float = 1.0) -> float:
    """0.5 similarity + 0.2 recency + 0.2 importance + 0.1 frequency, each in 0-1.

    Similarity is rescaled from the model's retrieval threshold (0) to the best
    candidate's similarity for this query (1): each model has its own scale (USE's
    relevant memories sit at 0.4-0.6, e5's at 0.85-0.9), and on an absolute scale
    recency and importance would outweigh which memory the question is about
    (``bench/memory_quality.py``: recall@5 0.86 absolute, higher relative). Recency
    halves every 30 days since the memory was last stated or used; frequency saturates
    at 10 uses.

    Args:
        row: a store row (``updated_at``, ``last_hit_at``, ``importance``, ``hit_count``,
            ``mentions``).
        similarity: cosine of the row and the query.
        now: the search's time (UTC), for recency.
        floor: the model's retrieval threshold (similarity 0 on the rescaled scale).
        best: the best candidate's similarity for this query (1 on the rescaled scale).

    Returns:
        The score, in 0-1.
    """
    top = max(best, floor + 1e-6)
    sim = min(1.0, max(0.0, (similarity - floor) / (top - floor)))
    last = max(x for x in (_utc(row.get("updated_at")), _utc(row.get("last_hit_at"))) if x is not None)
    age_days = max(0.0, (now - last).total_seconds() / 86400.0)
    recency = 0.5 ** (age_days / RECENCY_HALF_LIFE_DAYS)
    uses = int(row.get("hit_count") or 0) + int(row.get("mentions") or 1) - 1
    frequency = min(1.0, math.log1p(uses) / math.log1p(FREQUENCY_SATURATION))
    w = RERANK_WEIGHTS
    return w[0] * sim + w[1] * recency + w[2] * float(row.get("importance") or 0.0) + w[3] * frequency


@dataclass
class _UserRows:
    """One user's active rows and their vectors, held for the read path."""

    generation: str
    loaded_at: float
    rows: list[dict[str, Any]]
    """Without their vectors (those are ``matrix``'s rows, in the same order)."""
    matrix: np.ndarray
    kinds: np.ndarray
    valid_until: np.ndarray
    """POSIX seconds; ``inf`` for none."""
    hub: np.ndarray | None = None
    """Each row's hub level (:mod:`hermes.memory.relevance`), computed on first need."""
    jobs: np.ndarray | None = None
    """Each row states a job (:func:`relevance.states_job`), computed on first need."""


class MemoryReads:
    """:class:`hermes.memory.store.MemoryStore`'s read path (mixed in; ``__init__`` sets
    ``_cache``, ``_cache_lock``, ``_model_checked_at``)."""

    def search(
        self,
        user_id: str,
        query: str,
        *,
        limit: int = 3,
        kinds: Sequence[MemoryKind] | None = None,
        now: datetime | None = None,
        max_chars: int = 200,
        hybrid: bool = True,
        vector: np.ndarray | None = None,
        generation: str | None = None,
    ) -> list[RetrievedMemory]:
        """The memories of ``user_id`` most useful for ``query``, best first.

        Prefilter (user, kinds, active, valid at ``now``, this embedding model), vector
        top-20 plus the rows holding the query's identifiers (``hybrid``), rerank (seed 004 §6.3), drop those under
        the model's retrieval threshold, keep ``limit`` (at most 5), texts cut to
        ``max_chars`` (seed 004 §6.3: 200). ``vector``: the query's embedding, when the
        caller has it already.

        Full-text matching is used where it helps: for the identifiers in the query (order
        numbers, dates, ids), which an embedding hardly tells apart.

        ``generation``: a token that changes whenever the user's rows change (the memory
        activities keep it in Redis, ``hermes:memory:generation:<user>``). With it, the user's
        active rows (up to ``USER_CACHE_MAX_ROWS``) are read once and searched in memory
        until it changes (or ``USER_CACHE_SECONDS`` pass, for the hit statistics); without
        it, every search asks LanceDB.

        Raises:
            EmbeddingModelMismatch: the rows were embedded by another model.
            MemoryStoreError: a bad user id.
        """
        self._check_model_cached()
        now = _utc(now) or datetime.now(timezone.utc)
        query = clean_text(query, 2000)
        if not query:
            return []
        held = self._user_rows(user_id, generation)
        if held is not None and not held.rows:
            return []  # a user with no memories costs no embedding
        if vector is None:
            vector = self.embedder.embed_query(query)
        wanted = identifiers(query) if hybrid else frozenset()
        job_question = hybrid and relevance.asks_job(query)
        keyword: set[str] = set()
        if held is not None:
            # The hot path: the user's rows are few (the prefilter's job); an exact scan of
            # them in memory is both exact and faster than any index.
            mask = held.valid_until > now.timestamp()
            if kinds:
                mask &= np.isin(held.kinds, list(kinds))
            keep = np.nonzero(mask)[0]
            scores = held.matrix[keep] @ vector.astype(np.float32)
            chosen = list(np.argsort(-scores, kind="stable")[:VECTOR_TOP_K])
            if wanted:
                matched = [j for j, i in enumerate(keep) if wanted & identifiers(held.rows[i]["text"])]
                keyword = {held.rows[keep[j]]["memory_id"] for j in matched}
                chosen += matched
            if job_question:
                # The user's job is stated in words no embedding puts near "job title"
                # ("Mira is the product lead at Kestrel Labs."): its rows are candidates.
                chosen += list(np.nonzero(self._held_jobs(held)[keep])[0])
            rows = {held.rows[keep[j]]["memory_id"]: held.rows[keep[j]] for j in chosen}
            sims = {held.rows[keep[j]]["memory_id"]: float(scores[j]) for j in chosen}
            hub_of = self._held_hub(held)
            hubs = {held.rows[keep[j]]["memory_id"]: float(hub_of[keep[j]]) for j in chosen} if hub_of is not None else {}
        else:
            where = self._where(user_id, kinds=kinds, now=now)
            rows = {r["memory_id"]: r for r in self._vector_search(vector, where, VECTOR_TOP_K)}
            if wanted:
                for r in self._keyword_rows(wanted, where):
                    keyword.add(r["memory_id"])
                    rows.setdefault(r["memory_id"], r)
            sims = {mid: self._similarity(r, vector) for mid, r in rows.items()}
            bank = self._bank()
            hubs = {}
            if bank is not None and rows:
                ids = list(rows)
                levels = bank.hub(np.stack([np.asarray(rows[m]["vector"], dtype=np.float32) for m in ids]))
                hubs = dict(zip(ids, map(float, levels)))
        best = max(sims.values(), default=1.0)
        query_words = content_words(query) if hybrid else frozenset()
        query_persons = people.query_persons(query)
        # Who the names are, as the candidates say ("Has two kids, Leo and Ada"): only
        # needed when the question is about someone.
        relations_of = people.name_relations(r["text"] for r in rows.values()) if query_persons else {}
        scored = []
        for mid, r in rows.items():
            sim = sims[mid]
            if mid not in keyword and not self._relevant(query, query_words, query_persons, r["text"], sim,
                                                         hubs.get(mid, -1.0), relations_of, job_question):
                continue
            scored.append((self.score(r, sim, now, best=best), sim, r))
        scored.sort(key=lambda item: (-item[0], item[2]["memory_id"]))
        return [
            RetrievedMemory(
                memory_id=r["memory_id"],
                kind=r["kind"],
                text=clean_text(r["text"], max_chars),
                updated_at=_utc(r["updated_at"]),
                similarity=round(sim, 4),
                score=round(score, 4),
            )
            for score, sim, r in scored[: max(1, min(limit, 5))]
        ]

    def _relevant(self, query: str, query_words: frozenset[str], query_persons: frozenset[str], text: str,
                  sim: float, hub: float, relations_of: dict[str, frozenset[str]] | None = None,
                  job_question: bool = False) -> bool:
        """Whether a memory (``text``, at similarity ``sim``, hub level ``hub``) answers
        something of the question (words ``query_words``, other people ``query_persons``);
        rules only, no model (the read path stays fast). See :func:`relevance.admit`:

        - a shared content word admits the memory (a compound question, "where do I live,
          what is my name and where do I work?", meets each of its memories through one
          word at similarity 0.08-0.12), unless the question is about someone the memory
          does not name (``my sister's birthday`` / the user's own); across languages a
          Chinese word counts as the English of its dictionary senses
          (:func:`crosslingual.share_word`: ``get to work`` / ``上班``), and a question
          about the user's job (``job_question``) meets a memory stating one
          (:func:`relevance.asks_job`);
        - the question's people are those it owns ("my manager", not "dependency
          manager"), and a memory names them by relation, role phrase or a name the
          user's memories relate (``relations_of``; :mod:`hermes.memory.people`);
        - otherwise the similarity must reach the model's retrieval floor and stand out
          from the memory's usual level (``retrieval_lift``), or reach ``retrieval_sure``.
        """
        named = people.memory_persons(text, relations_of) if query_persons else frozenset()
        persons_ok = not query_persons or people.persons_match(query_persons, named)  # most questions name no one
        shared = bool(query_words) and (bool(query_words & content_words(text)) or crosslingual.share_word(query, text)
                                        or (job_question and relevance.states_job(text)))
        # The question's people named in other terms ("my manager" / "reports to Tom") are
        # as good as a shared word.
        shared = shared or people.named_otherwise(query_persons, text, named)
        return relevance.admit(sim, hub, shared=shared, persons_ok=persons_ok, thresholds=self.thresholds)

    def _bank(self) -> relevance.ReferenceBank | None:
        """The embedder's reference bank, when the thresholds check hub levels."""
        if self.thresholds.retrieval_lift <= -1.0:
            return None
        return relevance.bank_for(self.embedder)

    def _held_hub(self, held: _UserRows) -> np.ndarray | None:
        bank = self._bank()
        if bank is None:
            return None
        if held.hub is None:
            held.hub = bank.hub(held.matrix)  # once per generation: rows x bank
        return held.hub

    @staticmethod
    def _held_jobs(held: _UserRows) -> np.ndarray:
        if held.jobs is None:
            held.jobs = np.array([relevance.states_job(r["text"]) for r in held.rows], dtype=bool)  # once per generation
        return held.jobs

    def _check_model_cached(self) -> None:
        if time.monotonic() - self._model_checked_at > USER_CACHE_SECONDS:
            self.check_model()
            self._model_checked_at = time.monotonic()

    def _user_rows(self, user_id: str, generation: str | None) -> _UserRows | None:
        """The user's active rows for the hot path, or None (no generation to trust, or
        too many rows: LanceDB's vector index serves those)."""
        if generation is None:
            return None
        check_id(user_id)
        with self._cache_lock:
            held = self._cache.get(user_id)
        if held is not None and held.generation == generation and time.monotonic() - held.loaded_at < USER_CACHE_SECONDS:
            return held
        data = self.table.search().where(self._where(user_id)).limit(USER_CACHE_MAX_ROWS + 1).to_arrow()
        if len(data) > USER_CACHE_MAX_ROWS:
            return None
        vectors = data.column("vector").combine_chunks()
        matrix = vectors.values.to_numpy(zero_copy_only=False).astype(np.float32).reshape(len(data), self.embedder.dim)
        rows = data.drop_columns(["vector"]).to_pylist()
        held = _UserRows(
            generation=generation,
            loaded_at=time.monotonic(),
            rows=rows,
            matrix=matrix,
            kinds=np.array([r["kind"] for r in rows], dtype=object),
            valid_until=np.array(
                [_utc(r["valid_until"]).timestamp() if r.get("valid_until") else np.inf for r in rows], dtype=np.float64
            ),
        )
        with self._cache_lock:
            if len(self._cache) >= USER_CACHE_USERS:
                self._cache.pop(next(iter(self._cache)))
            self._cache[user_id] = held
        return held

    def forget_cached(self, user_id: str) -> None:
        """Drop ``user_id``'s rows from this process' read cache."""
        with self._cache_lock:
            self._cache.pop(user_id, None)

    def _keyword_rows(self, wanted: frozenset[str], where: str) -> list[dict[str, Any]]:
        """Rows (within ``where``) whose text holds one of the query's identifiers: the
        lexical half of the hybrid search, for what an embedding hardly tells apart (order
        and card numbers, ids, dates), in any script (``尾号8821`` finds ``8821``).
        Identifiers are letters, digits and ``-`` only, so the patterns need no escaping."""
        terms = sorted(t for t in wanted if re.fullmatch(r"[a-z0-9-]{2,64}", t))[:8]
        if not terms:
            return []
        likes = " OR ".join(f"lower(text) LIKE '%{t}%'" for t in terms)
        rows = self.table.search().where(f"{where} AND ({likes})").limit(KEYWORD_TOP_K).to_list()
        return [r for r in rows if wanted & identifiers(r["text"])]

    def score(self, row: dict[str, Any], similarity: float, now: datetime, *, best: float = 1.0) -> float:
        """:func:`rerank_score` with this store's retrieval threshold."""
        return rerank_score(row, similarity, now, floor=self.thresholds.retrieval, best=best)

    def record_hits(self, memory_ids: Iterable[str], now: datetime | None = None) -> int:
        """Count a use of each memory (hit count, last hit): the frequency term and the
        archive clock. Unconditional SQL increments, so they commute with other writes."""
        ids = sorted({check_id(m, "memory_id") for m in memory_ids})
        if not ids:
            return 0
        now = _utc(now) or datetime.now(timezone.utc)
        # A conflict (a concurrent commit, an optimize) committed nothing: safe to run again.
        result = lance.retry_conflicts(lambda: self.table.update(
            where="memory_id IN (" + ", ".join(sql_str(m) for m in ids) + ")",
            values_sql={"hit_count": "hit_count + 1", "last_hit_at": sql_time(now), "version": "version + 1"},
        ))
        self._committed()
        self.optimize_if_due()
        return int(getattr(result, "rows_updated", 0) or 0)
