"""Embedding quality for long-term memory: retrieval on the project's set, and the thresholds.

    python bench/memory_quality.py                     # both candidates, latencies over 5 rounds
    python bench/memory_quality.py --quick             # latencies over 1 round (about 10 s)
    python bench/memory_quality.py --embedders use     # one candidate (the default is always added)

The set is ``bench/data/memory_retrieval.yaml`` (written for Hermes: three users, memories
and queries in Chinese and English, see its header). No servers are needed; nothing is
downloaded (both candidates ship their model inside their PyPI package).

Retrieval, per candidate embedder (``hermes.memory.embeddings.get_embedder``): each user's
memories are embedded as passages; a query is embedded as a query and ranked by cosine
similarity against **its own user's memories only** (the product's metadata prefilter).
The ranking is a function ``rank(user, query_text) -> list[memory_id]`` (best first)
(:class:`VectorRanker`), so the product's read path can later be measured by the same
:func:`evaluate` in place of the plain vector ranking. Figures:

- **recall@5**: per query, the fraction of its relevant memory ids found in the top 5
  (1.0 or 0.0 for a query with one relevant id; 0.5 when one of two is found), averaged
  over the queries;
- **MRR**: per query, 1 / rank of the first relevant memory (0 when none is ranked),
  averaged over the queries;

both overall and by query type (paraphrase, cross_language, distractor, keyword). Also the
load time (constructor plus a first passage embedding), the embedding time per query
(median over all queries and rounds, ms) and per passage (each user's memories embedded as
one batch, ms per memory), and the queries missed.

Thresholds, per candidate, from the ``pairs`` section (cosine similarity of two texts, both
embedded as passages, as memories are when they are written):

- distributions (min / median / max) of ``same`` pairs (the same statement in other words;
  one entry is one preference said 8 ways, whose 28 pairs all count), ``conflict`` pairs
  (same subject, contradicting value) and ``different`` pairs (same topic area, different
  facts);
- **dedupe** (at or above: the same memory, the existing row is updated): a value that
  merges every ``same`` pair and no ``conflict`` or ``different`` pair. If none exists the
  overlapping pairs are printed and the value is chosen to merge no ``conflict`` or
  ``different`` pair first, then as many ``same`` pairs as possible: a false merge drops
  the new fact (the existing row is only touched), a missed one leaves a duplicate for the
  related-subject check and consolidation. Also printed: the highest value at which the
  8-way group still forms one connected group (single linkage), i.e. merges into one row
  when each new phrasing is compared with all rows stored before it;
- **related** (at or above: same subject, checked for a conflict): ``conflict`` pairs above,
  ``different`` pairs below; if they overlap, the value is chosen to miss no ``conflict``
  pair first, then to flag as few ``different`` pairs as possible: a missed conflict
  leaves a stale fact live next to the new one, a false one costs one extra check;
- **retrieval** (below: never injected): the highest value, rounded down to 0.01, that keeps
  at least 95% of the queries whose top-1 memory is relevant (their top-1 similarity at or
  above it).

Within the best interval the middle is taken, rounded to 0.01 when that stays inside it.

Product path (issue 15): the development set ``bench/data/memory_quality_dev.yaml`` (two
users telling things over ten weeks: duplicate groups, changes of fact without a subject,
unrelated questions) is written through the writer's and the consolidation's own code
(``MemoryStore.write``, ``activities.memory.judge_pairs``, ``consolidate_and_judge``) twice:
rules only, and with the judge played by the scripted model answering what the set says a
good model answers. Printed per run: recall@5, MRR, ``duplicates_collapsed`` (restatements
absorbed / restatements), ``changes_superseded``, ``unrelated_empty``, the retrieval-floor and hub-level-lift (``Thresholds.retrieval_lift``)
trade-off, and for the judge run ``judge_pairs_asked`` (true pairs that reached the judge,
its rules or its model) and ``judge_calls_per_write``. ``--dev-only`` runs only this.
Template set (issue 30, :func:`measure_template_set`): 500 distinct facts from one
sentence ("The billing service is insured by policy INV-495950 (item 50)", only the id and
the item differ) written for one user through ``MemoryStore.write``, rules only, by four
threads at once in batches of 10 (a conflicting batch retried, as the activity is);
``false_supersessions=N``: facts of the set whose row ended not active (must be 0).
Last line: ``memory_score=<mean of rules-only recall@5, duplicates_collapsed,
changes_superseded, unrelated_empty>``; the retrieval set's ``recall_at_5`` is printed
before it.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common  # noqa: E402  (also puts the repository root on sys.path)

import numpy as np  # noqa: E402
import yaml  # noqa: E402

from hermes.memory.embeddings import DEFAULT_EMBEDDER, EMBEDDERS, Embedder, get_embedder  # noqa: E402

DATA_PATH = Path(__file__).resolve().parent / "data" / "memory_retrieval.yaml"
QUERY_TYPES = ("paraphrase", "cross_language", "distractor", "keyword")
MEMORY_KINDS = ("fact", "preference", "episode")
MAX_TEXT_CHARS = 200
TOP_K = 5
RETRIEVAL_KEEP_FRACTION = 0.95

Rank = Callable[[str, str], list[str]]
"""``rank(user, query_text) -> memory ids, best first`` (only the user's memories)."""


# ---------------------------------------------------------------------------- the set


@dataclass(frozen=True)
class Memory:
    memory_id: str
    user: str
    kind: str
    text: str
    importance: float | None = None
    days_ago: float | None = None


@dataclass(frozen=True)
class Query:
    query_id: str
    user: str
    text: str
    relevant: tuple[str, ...]
    type: str


@dataclass(frozen=True)
class PairSet:
    same: dict[str, list[str]]
    """Entry id -> two or more texts saying the same thing (every pair of them counts)."""
    conflict: dict[str, tuple[str, str]]
    different: dict[str, tuple[str, str]]


@dataclass(frozen=True)
class RetrievalSet:
    memories: list[Memory]
    queries: list[Query]
    pairs: PairSet

    def users(self) -> list[str]:
        return sorted({m.user for m in self.memories})


def load_set(path: Path = DATA_PATH) -> RetrievalSet:
    """Read and check the retrieval set.

    Args:
        path: the YAML file (see its header for the format).

    Returns:
        The memories, queries and pairs.

    Raises:
        ValueError: a duplicate id, an unknown kind or query type, a text over 200
            characters, a relevant id that is not a memory of the query's user, a pair
            entry with fewer than two texts.
    """
    raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    memories = [
        Memory(
            memory_id=str(m["id"]),
            user=str(m["user"]),
            kind=str(m["kind"]),
            text=str(m["text"]),
            importance=m.get("importance"),
            days_ago=m.get("days_ago"),
        )
        for m in raw["memories"]
    ]
    by_id = {m.memory_id: m for m in memories}
    if len(by_id) != len(memories):
        raise ValueError("duplicate memory ids")
    for m in memories:
        if m.kind not in MEMORY_KINDS:
            raise ValueError(f"memory {m.memory_id}: unknown kind {m.kind!r}")
        if len(m.text) > MAX_TEXT_CHARS:
            raise ValueError(f"memory {m.memory_id}: {len(m.text)} characters (at most {MAX_TEXT_CHARS})")
    queries = [
        Query(query_id=str(q["id"]), user=str(q["user"]), text=str(q["text"]), relevant=tuple(map(str, q["relevant"])), type=str(q["type"]))
        for q in raw["queries"]
    ]
    if len({q.query_id for q in queries}) != len(queries):
        raise ValueError("duplicate query ids")
    for q in queries:
        if q.type not in QUERY_TYPES:
            raise ValueError(f"query {q.query_id}: unknown type {q.type!r}")
        if not q.relevant:
            raise ValueError(f"query {q.query_id}: no relevant memory")
        for memory_id in q.relevant:
            if memory_id not in by_id or by_id[memory_id].user != q.user:
                raise ValueError(f"query {q.query_id}: {memory_id} is not a memory of user {q.user!r}")

    def entries(section: str) -> dict[str, list[str]]:
        out = {}
        for entry in raw["pairs"][section]:
            texts = [str(t) for t in entry["texts"]]
            if len(texts) < 2 or (section != "same" and len(texts) != 2):
                raise ValueError(f"pairs.{section}.{entry['id']}: {len(texts)} texts")
            out[str(entry["id"])] = texts
        return out

    pairs = PairSet(
        same=entries("same"),
        conflict={k: (v[0], v[1]) for k, v in entries("conflict").items()},
        different={k: (v[0], v[1]) for k, v in entries("different").items()},
    )
    return RetrievalSet(memories=memories, queries=queries, pairs=pairs)


# ---------------------------------------------------------------------------- ranking


class VectorRanker:
    """Plain vector ranking with the per-user prefilter: cosine over the user's memories.

    Args:
        embedder: embeds the memories (as passages) at construction and each query.
        memories: all users' memories.
    """

    def __init__(self, embedder: Embedder, memories: Sequence[Memory]) -> None:
        self._embedder = embedder
        self._ids: dict[str, list[str]] = {}
        self._vectors: dict[str, np.ndarray] = {}
        self.passage_seconds: list[tuple[int, float]] = []
        """Per user: (number of memories, seconds to embed them as one batch)."""
        users = sorted({m.user for m in memories})
        for user in users:
            own = [m for m in memories if m.user == user]
            started = time.perf_counter()
            vectors = embedder.embed_passages([m.text for m in own])
            self.passage_seconds.append((len(own), time.perf_counter() - started))
            self._ids[user] = [m.memory_id for m in own]
            self._vectors[user] = vectors

    def search(self, user: str, query_text: str) -> list[tuple[str, float]]:
        """The user's memories with their cosine similarity to the query, best first.

        Returns:
            ``(memory_id, similarity)`` for every memory of ``user``; empty for an unknown user.
        """
        if user not in self._ids:
            return []
        similarity = self._vectors[user] @ self._embedder.embed_query(query_text)
        order = np.argsort(-similarity, kind="stable")
        return [(self._ids[user][i], float(similarity[i])) for i in order]

    def rank(self, user: str, query_text: str) -> list[str]:
        """``rank(user, query_text) -> list[memory_id]``, best first (see :data:`Rank`)."""
        return [memory_id for memory_id, _ in self.search(user, query_text)]


class StoreRanker:
    """The product's read path: the memories in a real :class:`MemoryStore` (LanceDB in a
    temporary directory, written with their importance and age), ranked by
    :meth:`MemoryStore.search` (prefilter, vector top-20, identifier full-text match,
    rerank 0.5/0.2/0.2/0.1, the model's retrieval threshold), its top 5.

    Args:
        embedder: the embedding model.
        memories: all users' memories.
        path: the store's directory.
    """

    def __init__(self, embedder: Embedder, memories: Sequence[Memory], path: Path) -> None:
        from datetime import datetime, timedelta, timezone

        from hermes.memory.models import MemoryCandidate
        from hermes.memory.store import MemoryStore

        self.now = datetime(2026, 11, 30, 12, 0, tzinfo=timezone.utc)
        self.store = MemoryStore(path, embedder)
        vectors = embedder.embed_passages([m.text for m in memories])
        rows = []
        for m, v in zip(memories, vectors):
            at = self.now - timedelta(days=m.days_ago or 0)
            candidate = MemoryCandidate(
                user_id=m.user, kind=m.kind, text=m.text, importance=m.importance if m.importance is not None else 0.5,
                confidence=0.9, source_session="bench", candidate_id=m.memory_id, created_at=at,
            )
            rows.append(self.store.new_row(candidate, m.text, v, at))
        self.store.insert_rows(rows)
        self.store.optimize()

    def rank(self, user: str, query_text: str) -> list[str]:
        return [m.memory_id for m in self.store.search(user, query_text, limit=5, now=self.now)]


@dataclass
class QueryResult:
    query: Query
    ranked: list[str]

    @property
    def first_relevant_rank(self) -> int | None:
        """1-based rank of the first relevant memory, None when none is ranked."""
        for position, memory_id in enumerate(self.ranked, start=1):
            if memory_id in self.query.relevant:
                return position
        return None

    @property
    def recall_at_k(self) -> float:
        found = set(self.ranked[:TOP_K]) & set(self.query.relevant)
        return len(found) / len(self.query.relevant)

    @property
    def reciprocal_rank(self) -> float:
        rank = self.first_relevant_rank
        return 0.0 if rank is None else 1.0 / rank


@dataclass
class Scores:
    recall_at_5: float
    mrr: float
    n: int


@dataclass
class Evaluation:
    results: list[QueryResult]
    overall: Scores = field(init=False)
    by_type: dict[str, Scores] = field(init=False)

    def __post_init__(self) -> None:
        self.overall = _scores(self.results)
        self.by_type = {t: _scores([r for r in self.results if r.query.type == t]) for t in QUERY_TYPES}


def _scores(results: Sequence[QueryResult]) -> Scores:
    if not results:
        return Scores(recall_at_5=float("nan"), mrr=float("nan"), n=0)
    return Scores(
        recall_at_5=statistics.fmean(r.recall_at_k for r in results),
        mrr=statistics.fmean(r.reciprocal_rank for r in results),
        n=len(results),
    )


def evaluate(rank: Rank, queries: Sequence[Query]) -> Evaluation:
    """Recall@5 and MRR of a ranking function over the queries (see the module docstring).

    Args:
        rank: ``rank(user, query_text) -> memory ids, best first``.
        queries: the queries, each naming its user and relevant memory ids.
    """
    return Evaluation([QueryResult(query=q, ranked=list(rank(q.user, q.text))) for q in queries])


# ---------------------------------------------------------------------------- thresholds


@dataclass
class Pair:
    section: str
    entry_id: str
    a: str
    b: str
    similarity: float = 0.0


def pair_similarities(embedder: Embedder, pairs: PairSet) -> list[Pair]:
    """Every pair of the set with its cosine similarity (both texts embedded as passages)."""
    out = []
    for entry_id, texts in pairs.same.items():
        out += [Pair("same", entry_id, a, b) for a, b in itertools.combinations(texts, 2)]
    out += [Pair("conflict", k, a, b) for k, (a, b) in pairs.conflict.items()]
    out += [Pair("different", k, a, b) for k, (a, b) in pairs.different.items()]
    texts = sorted({t for p in out for t in (p.a, p.b)})
    vectors = dict(zip(texts, embedder.embed_passages(texts)))
    for p in out:
        p.similarity = float(vectors[p.a] @ vectors[p.b])
    return out


@dataclass
class Split:
    threshold: float
    low: float
    """The best interval is (low, high]: any threshold in it gives the same errors."""
    high: float
    above_missed: list[Pair]
    """Pairs that should be at or above the threshold but are below it."""
    below_missed: list[Pair]
    """Pairs that should be below the threshold but are at or above it."""
    separable: bool


def best_split(above: Sequence[Pair], below: Sequence[Pair], *, above_weight: float, below_weight: float) -> Split:
    """The threshold that best puts ``above`` at or above it and ``below`` under it.

    Cost of a threshold: ``above_weight`` per ``above`` pair under it plus ``below_weight``
    per ``below`` pair at or above it. Among the cheapest intervals between neighbouring
    similarities, the widest one; its middle, rounded to 0.01 when that stays inside.

    Args:
        above: pairs that should reach the threshold.
        below: pairs that should stay under it.
        above_weight: cost of one ``above`` pair missed.
        below_weight: cost of one ``below`` pair let through.
    """
    values = sorted({p.similarity for p in [*above, *below]})
    edges = [values[0] - 0.05, *values, values[-1] + 0.05]
    best: tuple[float, float, float, float] | None = None  # (cost, -width, low, high)
    for low, high in itertools.pairwise(edges):
        t = (low + high) / 2
        cost = above_weight * sum(p.similarity < t for p in above) + below_weight * sum(p.similarity >= t for p in below)
        key = (cost, -(high - low), low, high)
        if best is None or key < best:
            best = key
    assert best is not None
    _, _, low, high = best
    middle = (low + high) / 2
    rounded = round(middle, 2)
    threshold = rounded if low < rounded <= high else round(middle, 3)
    above_missed = [p for p in above if p.similarity < threshold]
    below_missed = [p for p in below if p.similarity >= threshold]
    return Split(threshold, low, high, above_missed, below_missed, not above_missed and not below_missed)


def single_linkage_threshold(pairs: Sequence[Pair]) -> float:
    """The highest threshold at which all texts of ``pairs`` still form one connected group.

    The smallest edge of the maximum spanning tree (Kruskal) over the pairs' similarities.
    """
    parent: dict[str, str] = {}

    def root(text: str) -> str:
        while parent.setdefault(text, text) != text:
            text = parent[text]
        return text

    texts = {t for p in pairs for t in (p.a, p.b)}
    weakest = float("inf")
    for p in sorted(pairs, key=lambda p: -p.similarity):
        ra, rb = root(p.a), root(p.b)
        if ra != rb:
            parent[ra] = rb
            weakest = min(weakest, p.similarity)
    return weakest if len({root(t) for t in texts}) == 1 else float("-inf")


def retrieval_threshold(top1_hit_similarities: Sequence[float], keep_fraction: float = RETRIEVAL_KEEP_FRACTION) -> float:
    """The highest threshold (rounded down to 0.01) keeping ``keep_fraction`` of the hits.

    Args:
        top1_hit_similarities: the top-1 similarity of each query whose top-1 is relevant.
        keep_fraction: in (0, 1].

    Returns:
        The threshold; 0.0 when there are no hits.
    """
    if not top1_hit_similarities:
        return 0.0
    ordered = sorted(top1_hit_similarities, reverse=True)
    kth = ordered[math.ceil(keep_fraction * len(ordered)) - 1]
    return math.floor(kth * 100 + 1e-9) / 100


# ---------------------------------------------------------------------------- output


def _describe(values: Sequence[float]) -> str:
    return f"min={min(values):.3f} median={statistics.median(values):.3f} max={max(values):.3f} (n={len(values)})"


def _short(text: str, width: int = 34) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def _pair_line(p: Pair) -> str:
    return f"      {p.similarity:.3f} {p.section}/{p.entry_id}: {_short(p.a)!r} ~ {_short(p.b)!r}"


@dataclass
class CandidateReport:
    name: str
    evaluation: Evaluation
    dedupe: Split
    related: Split
    retrieval: float


def measure_store(name: str, data: RetrievalSet) -> Scores:
    """recall@5 and MRR of the product's read path (:class:`StoreRanker`) with ``name``."""
    import tempfile

    import dataclasses

    embedder = get_embedder(name)
    trade_off = []
    with tempfile.TemporaryDirectory(prefix="hermes-memquality-") as tmp:
        ranker = StoreRanker(embedder, data.memories, Path(tmp))
        evaluation = evaluate(ranker.rank, data.queries)
        # The other side of the dev set's silence trade-off: what a higher floor costs here
        # (cross-language and reworded questions meet their memory at 0.16-0.25 with USE).
        for floor in DEV_FLOORS:
            ranker.store.thresholds = dataclasses.replace(embedder.thresholds, retrieval=floor)
            trade_off.append((floor, evaluate(ranker.rank, data.queries).overall.recall_at_5))
        lifts = []
        if embedder.thresholds.retrieval_lift > -1.0:
            for lift in DEV_LIFTS:
                ranker.store.thresholds = dataclasses.replace(embedder.thresholds, retrieval_lift=lift)
                lifts.append((lift, evaluate(ranker.rank, data.queries).overall.recall_at_5))
        ranker.store.thresholds = embedder.thresholds
    o = evaluation.overall
    print(f"\n== {name}, the product's read path (MemoryStore.search: prefilter, vector + identifiers, rerank, threshold, top 5):")
    print("  retrieval floor trade-off on this set: " + ", ".join(f"{f:.2f} -> recall@5 {r:.3f}" for f, r in trade_off))
    if lifts:
        print("  hub-level lift trade-off on this set: " + ", ".join(f"{x:+.2f} -> recall@5 {r:.3f}" for x, r in lifts))
    print(f"  all             recall@5={o.recall_at_5:.3f} MRR={o.mrr:.3f}")
    for query_type, sc in evaluation.by_type.items():
        print(f"  {query_type:<15} recall@5={sc.recall_at_5:.3f} MRR={sc.mrr:.3f} (n={sc.n})")
    return o


def measure(name: str, data: RetrievalSet, rounds: int) -> CandidateReport:
    """Measure one candidate embedder and print its figures."""
    started = time.perf_counter()
    embedder = get_embedder(name)
    embedder.embed_passages(["warm-up"])
    load_seconds = time.perf_counter() - started
    print(f"\n== {name}: {embedder.model_id}  (dim {embedder.dim}; current thresholds {embedder.thresholds})")
    print(f"load: {load_seconds * 1000:.0f} ms (constructor + first passage embedding)")

    ranker = VectorRanker(embedder, data.memories)
    evaluation = evaluate(ranker.rank, data.queries)
    o = evaluation.overall
    print(f"retrieval ({o.n} queries, {len(data.memories)} memories, {len(data.users())} users, per-user prefilter):")
    print(f"  all             recall@5={o.recall_at_5:.3f} MRR={o.mrr:.3f}")
    for query_type, s in evaluation.by_type.items():
        print(f"  {query_type:<15} recall@5={s.recall_at_5:.3f} MRR={s.mrr:.3f} (n={s.n})")
    misses = [r for r in evaluation.results if r.first_relevant_rank != 1]
    if misses:
        print("  not ranked first (query: rank of first relevant; top-1):")
        for r in misses:
            top = r.ranked[0] if r.ranked else "-"
            print(f"    {r.query.query_id} [{r.query.type}] {_short(r.query.text, 30)!r}: rank {r.first_relevant_rank}; top-1 {top}")

    query_seconds = []
    for _ in range(rounds):
        for q in data.queries:
            t0 = time.perf_counter()
            embedder.embed_query(q.text)
            query_seconds.append(time.perf_counter() - t0)
    per_passage_ms = [seconds * 1000 / n for n, seconds in ranker.passage_seconds]
    print(
        f"latency: embed per query {_common.describe_ms(query_seconds)}; "
        f"per passage {statistics.median(per_passage_ms):.2f} ms (batches of {[n for n, _ in ranker.passage_seconds]})"
    )

    pairs = pair_similarities(embedder, data.pairs)
    same = [p for p in pairs if p.section == "same"]
    group = max(data.pairs.same, key=lambda k: len(data.pairs.same[k]))
    conflict = [p for p in pairs if p.section == "conflict"]
    different = [p for p in pairs if p.section == "different"]
    print("pairs (cosine, both as passages):")
    print(f"  same ({group}, {len(data.pairs.same[group])} ways) {_describe([p.similarity for p in same if p.entry_id == group])}")
    print(f"  same (others)   {_describe([p.similarity for p in same if p.entry_id != group])}")
    print(f"  conflict        {_describe([p.similarity for p in conflict])}")
    print(f"  different       {_describe([p.similarity for p in different])}")

    # Lexicographic: no false merge first, then as few missed same pairs as possible.
    dedupe = best_split(same, conflict + different, above_weight=1, below_weight=len(same) + 1)
    state = "separates all" if dedupe.separable else f"overlap: {len(dedupe.above_missed)} same pairs not merged, {len(dedupe.below_missed)} conflict/different merged"
    print(f"  dedupe  >= {dedupe.threshold:.3f}  (best interval ({dedupe.low:.3f}, {dedupe.high:.3f}]; {state})")
    for p in sorted(dedupe.below_missed, key=lambda p: -p.similarity):
        print(_pair_line(p))
    group_pairs = [p for p in same if p.entry_id == group]
    print(
        f"    {len([p for p in dedupe.above_missed if p.entry_id != group])}/{len(same) - len(group_pairs)} other same pairs "
        f"and {len([p for p in dedupe.above_missed if p.entry_id == group])}/{len(group_pairs)} {group} pairs not merged; "
        f"{group} stays one group (single linkage) up to {single_linkage_threshold(group_pairs):.3f}"
    )
    # Lexicographic: no missed conflict first, then as few related different pairs as possible.
    related = best_split(conflict, different, above_weight=len(different) + 1, below_weight=1)
    state = "separates all" if related.separable else f"overlap: {len(related.above_missed)} conflict pairs under, {len(related.below_missed)} different pairs over"
    print(f"  related >= {related.threshold:.3f}  (best interval ({related.low:.3f}, {related.high:.3f}]; {state})")
    for p in sorted(related.above_missed + related.below_missed, key=lambda p: -p.similarity):
        print(_pair_line(p))

    hits, wrong_top1, top5_counts = [], [], []
    for q in data.queries:
        found = ranker.search(q.user, q.text)
        (top_id, top_similarity) = found[0]
        (hits if top_id in q.relevant else wrong_top1).append(top_similarity)
        top5_counts.append(found[:TOP_K])
    retrieval = retrieval_threshold(hits)
    kept = [sum(s >= retrieval for _, s in top5) for top5 in top5_counts]
    print(
        f"  retrieval >= {retrieval:.2f}  (keeps {sum(s >= retrieval for s in hits)}/{len(hits)} relevant top-1 hits; "
        f"drops {sum(s < retrieval for s in wrong_top1)}/{len(wrong_top1)} wrong top-1; "
        f"top-5 memories left per query: mean {statistics.fmean(kept):.1f})"
    )
    return CandidateReport(name, evaluation, dedupe, related, retrieval)


# ---------------------------------------------------------------------------- template set (issue 30)

TEMPLATE_FACTS = 500
TEMPLATE = "The billing service is insured by policy INV-{policy} (item {item})"
"""One sentence, 500 distinct facts: only the policy id and the item number differ."""
TEMPLATE_THREADS = 4
TEMPLATE_BATCH = 10
"""Candidates per write: the writer's batch (``batch_size``, activities/memory.py)."""
TEMPLATE_RETRIES = 5
"""Attempts of a write that keeps conflicting (the activity's retries)."""


def measure_template_set(n: int = TEMPLATE_FACTS, threads: int = TEMPLATE_THREADS, batch: int = TEMPLATE_BATCH) -> int:
    """Write ``n`` distinct facts from one template (:data:`TEMPLATE`) for one user through
    ``MemoryStore.write`` (rules only, the offline default), ``threads`` writers at once,
    ``batch`` candidates per write, as concurrent memory writers do; print and return
    ``false_supersessions``: facts of the set whose row ended other than active (each
    fact is its own; none replaces another)."""
    import tempfile
    from concurrent.futures import ThreadPoolExecutor
    from datetime import datetime, timezone

    from hermes.memory.models import MemoryCandidate
    from hermes.memory.schema import WriteConflict
    from hermes.memory.store import MemoryStore

    user = "template"
    now = datetime(2026, 3, 1, 9, 0, tzinfo=timezone.utc)
    candidates = [
        MemoryCandidate(user_id=user, text=TEMPLATE.format(policy=495900 + i, item=i), kind="fact",
                        candidate_id=f"tpl{i:04d}", source_session="template", created_at=now, importance=0.5, confidence=0.9)
        for i in range(n)
    ]
    batches = [candidates[i : i + batch] for i in range(0, n, batch)]
    with tempfile.TemporaryDirectory(prefix="hermes-memtpl-") as tmp:
        store = MemoryStore(Path(tmp), get_embedder(DEFAULT_EMBEDDER))

        def write(b: list[MemoryCandidate]):
            for attempt in range(TEMPLATE_RETRIES):  # as Temporal retries write_memories
                try:
                    return store.write(b, now=now, retried=attempt > 0)
                except WriteConflict:
                    if attempt == TEMPLATE_RETRIES - 1:
                        raise
            raise AssertionError("unreachable")

        started = time.perf_counter()
        with ThreadPoolExecutor(max_workers=threads) as pool:
            reports = list(pool.map(write, batches))
        seconds = time.perf_counter() - started
        status = {r["memory_id"]: r["status"] for r in store.list(user, statuses=("active", "superseded"), limit=10 * n)}
        status.update({r["memory_id"]: r["status"] for r in store.list(user, statuses=("merged",), archived=True, limit=10 * n)})
    lost = [c.candidate_id for c in candidates if status.get(c.candidate_id) != "active"]
    print(f"\n== template set: {n} distinct facts from one template ({TEMPLATE!r}), {threads} threads, "
          f"batches of {batch}, rules only: {seconds:.1f} s; superseded {sum(len(r.superseded) for r in reports)}, "
          f"refreshed {sum(len(r.updated) for r in reports)}; not active at the end: {len(lost)}")
    print(f"false_supersessions={len(lost)}")
    return len(lost)


# ---------------------------------------------------------------- product path (issue 15)

DEV_PATH = Path(__file__).resolve().parent / "data" / "memory_quality_dev.yaml"
DEV_FLOORS = (0.10, 0.15, 0.20, 0.25, 0.30, 0.35, 0.40)
DEV_LIFTS = (-1.0, -0.04, -0.02, -0.01, 0.0, 0.01, 0.02, 0.04)
"""Hub-level lifts of the silence trade-off (``Thresholds.retrieval_lift``; -1: no check)."""
DEV_CONSOLIDATE_EVERY_DAYS = 14
DEV_JUDGE_MAX_CALLS = 20
"""Model calls per written batch and per consolidation run (the setting's default)."""


@dataclass
class DevSet:
    raw: dict
    statements: list[dict]
    """Every memory said, in the order said: ``id``, ``user``, ``day``, ``text``, ``item`` (the
    duplicate group, change or background id it belongs to)."""
    groups: dict[str, list[str]]
    changes: dict[str, tuple[str, str]]


def load_dev(path: Path = DEV_PATH) -> DevSet:
    """Read the development set (see its header)."""
    raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    statements, groups, changes = [], {}, {}
    for g in raw["duplicates"]:
        groups[g["id"]] = [s["id"] for s in g["statements"]]
        statements += [dict(s, user=g["user"], item=g["id"]) for s in g["statements"]]
    for c in raw["changes"]:
        changes[c["id"]] = (c["old"]["id"], c["new"]["id"])
        statements += [dict(c["old"], user=c["user"], item=c["id"]), dict(c["new"], user=c["user"], item=c["id"])]
    statements += [dict(b, item=b["id"]) for b in raw["background"]]
    ids = [s["id"] for s in statements]
    if len(set(ids)) != len(ids):
        raise ValueError("duplicate statement ids in the development set")
    statements.sort(key=lambda s: (s["day"], s["user"], s["id"]))
    return DevSet(raw=raw, statements=statements, groups=groups, changes=changes)


def scripted_judge(dev: DevSet):
    """The judge played by the product's scripted model, answering what the set says a
    good model answers (``judge`` beside each group and change; ``judge_default`` else)."""
    import re as _re

    from hermes.providers.scripted import ScriptedModel

    text = {s["id"]: s["text"] for s in dev.statements}
    entries = []
    for g in dev.raw["duplicates"]:
        for a, b in itertools.permutations([s["id"] for s in g["statements"]], 2):
            entries.append({"older": f"^{_re.escape(text[a])}$", "newer": f"^{_re.escape(text[b])}$", "verdict": g["judge"]})
    for c in dev.raw["changes"]:
        entries.append({"older": f"^{_re.escape(c['old']['text'])}$", "newer": f"^{_re.escape(c['new']['text'])}$", "verdict": c["judge"]})
    return ScriptedModel.from_dict(
        {"turns": [{"steps": [{"reply": "-"}]}], "judgements": entries, "judgement_default": dev.raw["judge_default"]},
        source="memory_quality_dev.yaml",
    )


@dataclass
class DevRun:
    label: str
    rates: dict[str, float]
    lines: list[str]


def run_dev(dev: DevSet, embedder: Embedder, path: Path, *, provider=None) -> DevRun:
    """Write the set through the product's path, as the memory writer and the scheduled
    consolidation run it (``MemoryStore.write`` per batch, then ``judge_memories``'s
    :func:`activities.memory.judge_pairs`; every 14 days and at the end
    :func:`activities.memory.consolidate_and_judge`, then ``judge_pairs``), and measure.
    ``provider``: the judge's model (None: rules only, the offline default)."""
    import asyncio as _asyncio
    import dataclasses as _dc
    from datetime import datetime, timedelta, timezone

    import hermes.memory.store as store_module
    from activities.memory import consolidate_and_judge, judge_pairs
    from hermes.memory.judge import JudgeMemoriesInput
    from hermes.memory.models import ConsolidateInput, MemoryCandidate
    from hermes.memory.store import MemoryStore

    start = datetime(2026, 3, 1, 9, 0, tzinfo=timezone.utc)
    store = MemoryStore(path, embedder)
    judge = provider is not None
    assessed: list[tuple[str, str]] = []
    real_assess = store_module.assess

    def observed(older, newer, similarity, bands):  # observes which pairs reach the judge; changes nothing
        assessed.append((older, newer))
        return real_assess(older, newer, similarity, bands)

    store_module.assess = observed
    asked = 0
    writes = 0
    try:
        loop = _asyncio.new_event_loop()

        def judge_now(user: str, pairs, now) -> None:
            nonlocal asked
            if pairs:
                report = loop.run_until_complete(judge_pairs(
                    store, provider, JudgeMemoriesInput(user_id=user, pairs=pairs, max_calls=DEV_JUDGE_MAX_CALLS), now=now))
                asked += report.asked

        def consolidate(day: float) -> None:
            now = start + timedelta(days=day)
            for user in store.users():
                inp = ConsolidateInput(user_id=user, now=now, archive_after_days=180, judge=judge,
                                       max_judge_pairs=DEV_JUDGE_MAX_CALLS if judge else 0)
                report = consolidate_and_judge(store, inp, judge=judge)
                judge_now(user, report.judge_pairs, now)

        batches: dict[tuple[float, str], list[dict]] = {}
        for s in dev.statements:
            batches.setdefault((s["day"], s["user"]), []).append(s)
        next_consolidation = DEV_CONSOLIDATE_EVERY_DAYS
        for (day, user), said in sorted(batches.items()):
            while day >= next_consolidation:
                consolidate(next_consolidation)
                next_consolidation += DEV_CONSOLIDATE_EVERY_DAYS
            now = start + timedelta(days=day)
            candidates = [
                MemoryCandidate(user_id=user, text=s["text"], kind="fact", candidate_id=s["id"], source_session=f"dev-{day}",
                                created_at=now, importance=0.5, confidence=0.9)
                for s in said
            ]
            report = store.write(candidates, now=now, judge=judge)
            writes += len(candidates)
            judge_now(user, report.judge_pairs, now)
        consolidate(dev.raw["ask_day"])
    finally:
        store_module.assess = real_assess
        loop.close()

    ask = start + timedelta(days=dev.raw["ask_day"])
    by_text = {s["text"]: s["id"] for s in dev.statements}
    holder: dict[str, dict] = {}
    for user in sorted({s["user"] for s in dev.statements}):
        for r in store.list(user, statuses=("active", "superseded")):
            for sid in [r["memory_id"], *(r.get("sources") or [])]:
                holder[sid] = r
    item_of = {s["id"]: s["item"] for s in dev.statements}
    lines: list[str] = []
    false_merges = sum(
        1 for r in {id(r): r for r in holder.values()}.values()
        if len({item_of[x] for x in [r["memory_id"], *(r.get("sources") or [])] if x in item_of}) > 1
    )
    removed = total = whole = 0
    text_of = {s["id"]: s["text"] for s in dev.statements}
    split_groups: list[str] = []
    for gid, members in dev.groups.items():
        rows = {holder[m]["memory_id"] for m in members if m in holder}
        removed += len(members) - len(rows)
        total += len(members) - 1
        whole += len(rows) == 1
        if len(rows) > 1:
            parts = [" + ".join(_short(text_of[m], 40) for m in members if m in holder and holder[m]["memory_id"] == row)
                     for row in sorted(rows)]
            split_groups.append(f"    {gid}: {len(rows)} rows: " + " | ".join(parts))
    superseded = 0
    missed = []
    for cid, (old, new) in dev.changes.items():
        ho, hn = holder.get(old), holder.get(new)
        ok = ho is not None and hn is not None and ho["status"] == "superseded" and hn["status"] == "active" and ho is not hn
        superseded += ok
        if not ok:
            missed.append(cid)
    # Which true pairs reached the judge (its rules or its model) or the merge threshold.
    assessed_ids = {(by_text.get(a), by_text.get(b)) for a, b in assessed}
    covered = 0
    true_pairs = 0
    for gid, members in dev.groups.items():
        for k, m in enumerate(members[1:], start=1):
            true_pairs += 1
            earlier = set(members[:k])
            covered += any((x, m) in assessed_ids or (m, x) in assessed_ids for x in earlier)
    for cid, (old, new) in dev.changes.items():
        true_pairs += 1
        covered += (old, new) in assessed_ids

    def relevant(q) -> set[str]:
        out: set[str] = set()
        for x in q["relevant"]:
            out |= set(dev.groups.get(x, [x]))
        return out

    vectors = {q["id"]: embedder.embed_query(q["text"]) for q in dev.raw["queries"]}

    def rank(q) -> list[set[str]]:
        return [{m.memory_id, *(holder.get(m.memory_id, {}).get("sources") or [])}
                for m in store.search(q["user"], q["text"], limit=5, now=ask, generation="dev", vector=vectors[q["id"]])]

    def evaluate(floor: float, lift: float | None = None) -> tuple[float, float, float, int]:
        lift = embedder.thresholds.retrieval_lift if lift is None else lift
        store.thresholds = _dc.replace(embedder.thresholds, retrieval=floor, retrieval_lift=lift)
        recalls, rrs, empty, stale_first = [], [], [], 0
        for q in dev.raw["queries"]:
            ranked = rank(q)
            if q["type"] == "unrelated":
                empty.append(not ranked)
                continue
            want = relevant(q)
            pos = next((i for i, got in enumerate(ranked, start=1) if got & want), None)
            recalls.append(1.0 if pos is not None and pos <= TOP_K else 0.0)
            rrs.append(0.0 if pos is None else 1.0 / pos)
            stale = set(q.get("stale", []))
            spos = next((i for i, got in enumerate(ranked, start=1) if got & stale), None)
            stale_first += spos is not None and (pos is None or spos < pos)
        return statistics.fmean(recalls), statistics.fmean(rrs), statistics.fmean(empty), stale_first

    lines.append(f"  retrieval floor trade-off, lift {embedder.thresholds.retrieval_lift} (recall@5 / MRR / unrelated_empty):")
    for floor in DEV_FLOORS:
        r5, mrr, empty, _ = evaluate(floor)
        lines.append(f"    floor {floor:.2f}: recall@5={r5:.3f} MRR={mrr:.3f} unrelated_empty={empty:.3f}")
    floor = embedder.thresholds.retrieval
    lines.append(f"  hub-level lift trade-off, floor {floor:.2f} (-1: no lift check; recall@5 / MRR / unrelated_empty):")
    for lift in DEV_LIFTS:
        r5, mrr, empty, _ = evaluate(floor, lift)
        lines.append(f"    lift {lift:+.2f}: recall@5={r5:.3f} MRR={mrr:.3f} unrelated_empty={empty:.3f}")
    r5, mrr, empty, stale_first = evaluate(embedder.thresholds.retrieval)
    store.thresholds = embedder.thresholds
    missed_queries = []
    for q in dev.raw["queries"]:
        if q["type"] == "unrelated":
            continue
        ranked = rank(q)
        if not any(got & relevant(q) for got in ranked[:TOP_K]):
            want = sorted(relevant(q))
            missed_queries.append(f"    {q['id']} {_short(q['text'], 40)!r}: wanted {_short(text_of.get(want[0], want[0]), 40)!r}; "
                                  f"got {len(ranked)} ({_short(text_of.get(next(iter(ranked[0]), ''), '-'), 30) if ranked else '-'})")
    rates = {
        "recall_at_5": r5,
        "mrr": mrr,
        "duplicates_collapsed": removed / total,
        "changes_superseded": superseded / len(dev.changes),
        "unrelated_empty": empty,
    }
    lines.append(
        f"  groups collapsed to one row: {whole}/{len(dev.groups)}; false merges (rows holding two items): {false_merges}; "
        f"stale memory ranked above the current one: {stale_first}; changes missed: {', '.join(missed) or '-'}"
    )
    lines.append(f"  true pairs that reached the judge (rules or model): {covered}/{true_pairs}")
    if split_groups:
        lines.append("  duplicate groups left in several rows:")
        lines += split_groups
    if missed_queries:
        lines.append(f"  questions whose memory is not in the top {TOP_K}:")
        lines += missed_queries
    if judge:
        rates["judge_pairs_asked"] = covered / true_pairs
        rates["judge_calls_per_write"] = asked / writes
    return DevRun("with the judge (scripted model)" if judge else "rules only", rates, lines)


def measure_dev(dev_path: Path) -> float:
    """Both product-path runs of the development set, printed; returns ``memory_score``."""
    import tempfile

    dev = load_dev(dev_path)
    embedder = get_embedder(DEFAULT_EMBEDDER)
    counts = {t: sum(q["type"] == t for q in dev.raw["queries"]) for t in ("duplicate", "change", "plain", "unrelated")}
    print(f"\n== development set {dev_path.name}: {len(dev.statements)} memories, {len(dev.groups)} duplicate groups, "
          f"{len(dev.changes)} changes, queries {counts}; written through the product's path ({DEFAULT_EMBEDDER})")
    runs = []
    for provider in (None, scripted_judge(dev)):
        with tempfile.TemporaryDirectory(prefix="hermes-memdev-") as tmp:
            run = run_dev(dev, embedder, Path(tmp), provider=provider)
        runs.append(run)
        print(f"\n  -- {run.label}: " + " ".join(f"{k}={v:.3f}" for k, v in run.rates.items()))
        for line in run.lines:
            print(line)
    rules = runs[0].rates
    return statistics.fmean([rules["recall_at_5"], rules["duplicates_collapsed"], rules["changes_superseded"], rules["unrelated_empty"]])


# ------------------------------------------------------- offline extraction (issue 30)

CONVERSATION_PATH = Path(__file__).resolve().parent / "data" / "memory_conversation.yaml"


def measure_extraction(path: Path = CONVERSATION_PATH) -> float:
    """Facts the rules (no model) extract from the conversation sentences, printed with the
    misses; returns ``extracted_facts_ratio`` (facts found / facts listed, see the set's
    header). A fact with a subject is found when a candidate has that subject and a value
    holding the listed one; one without, when a candidate's text holds the listed text."""
    from hermes.memory.rules import extract_by_rules

    sentences = yaml.safe_load(path.read_text(encoding="utf-8"))["sentences"]
    found = total = 0
    misses: list[str] = []
    for s in sentences:
        got = extract_by_rules(s["text"])
        for fact in s["facts"]:
            total += 1
            if "subject" in fact:
                ok = any(c.subject == fact["subject"] and str(fact["value"]).casefold() in c.value.casefold() for c in got)
            else:
                ok = any(str(fact["text"]).casefold() in c.text.casefold() for c in got)
            found += ok
            if not ok:
                misses.append(f"    {s['id']} {_short(s['text'], 40)!r}: wanted {fact}; got {[c.text for c in got]}")
    print(f"\n== offline extraction ({path.name}, rules only): {found}/{total} facts from {len(sentences)} sentences")
    for line in misses:
        print(line)
    return found / total


async def main() -> None:
    p = _common.parser(__doc__.splitlines()[0])
    p.add_argument("--embedders", default=",".join(EMBEDDERS), help=f"comma-separated candidates (default: {','.join(EMBEDDERS)})")
    p.add_argument("--data", type=Path, default=DATA_PATH, help="the retrieval set (YAML)")
    p.add_argument("--dev-only", action="store_true", help="only the product-path run of the development set")
    p.add_argument("--dev", type=Path, default=DEV_PATH, help="the development set of the product-path run (YAML)")
    args = p.parse_args()
    print(f"extracted_facts_ratio={measure_extraction():.3f} (conversation sentences, rules only)")
    if args.dev_only:
        _common.headline("memory_score", f"{await asyncio.to_thread(measure_dev, args.dev):.3f}")
        return
    names = [n.strip() for n in args.embedders.split(",") if n.strip()]
    if DEFAULT_EMBEDDER not in names:
        names.append(DEFAULT_EMBEDDER)
    data = load_set(args.data)
    counts = {t: sum(q.type == t for q in data.queries) for t in QUERY_TYPES}
    print(f"set: {len(data.memories)} memories, {len(data.queries)} queries {counts}, users {data.users()}")
    reports = {name: measure(name, data, rounds=1 if args.quick else 5) for name in names}
    product = {name: measure_store(name, data) for name in names}

    print("\nsummary (recall@5 / MRR; thresholds dedupe / related / retrieval):")
    for name, r in reports.items():
        o = r.evaluation.overall
        default = " (default)" if name == DEFAULT_EMBEDDER else ""
        print(
            f"  {name:<7} {o.recall_at_5:.3f} / {o.mrr:.3f}; "
            f"Thresholds(dedupe={r.dedupe.threshold}, related={r.related.threshold}, retrieval={r.retrieval}){default}"
        )
    print("\nproduct read path (recall@5 / MRR):")
    for name, o in product.items():
        print(f"  {name:<7} {o.recall_at_5:.3f} / {o.mrr:.3f}" + (" (default)" if name == DEFAULT_EMBEDDER else ""))
    print(f"recall_at_5={product[DEFAULT_EMBEDDER].recall_at_5:.3f} (retrieval set, product read path)")
    await asyncio.to_thread(measure_template_set)
    score = await asyncio.to_thread(measure_dev, args.dev)
    _common.headline("memory_score", f"{score:.3f}")


if __name__ == "__main__":
    _common.run(main)
