"""Memory search latency at 10k and 100k memories, against a brute-force numpy search.

    python bench/memory_search.py            # 200 queries per size, index policies compared
    python bench/memory_search.py --quick    # 30 queries per size, the store's policy only

No servers (LanceDB is embedded; its tables go to a temporary directory). Printed:

- **data**: 10k rows over 20 users (500 each) and 100k rows over 200 users: 199 of about
  452 rows and one heavy user with 10,000 (``--quick``: 2,000). Rows are written in bulk
  through the store's own schema (``store.table.schema``, ``store.table.add``), then the
  store's ``optimize()`` runs, as consolidation does: compaction, the rows folded into the
  scalar and full-text indexes, and ``ensure_indexes()`` (the vector index if the store's
  policy builds one at that size: IvfHnswSq from 100k rows). About 10% of the rows are superseded and
  about 2% expired (``valid_until`` in the past), so the prefilter removes rows of the
  user as well as other users' rows.
- **vectors**: synthetic, clustered, 512 dimensions (the default embedder's): 256 topic
  centroids; each user has 8 topics; a row is its topic's centroid plus a user-topic offset
  plus noise, normalised (cosine to a same-topic row of the user about 0.5-0.6, to another
  topic about 0). A query is a new point of one of the user's topics (same construction),
  with two of that topic's words as its text. Real embeddings of 100k texts would take
  too long here; the layout, not the model, decides what an index does.
- **series, per query, interleaved** (the order rotates per query, after a warm-up); the
  three ``search`` series are the product's read path (prefilter, vector top-20, full-text
  match of the query's identifiers, rerank), ``MemoryStore.search(user, text, vector=q)``:
  ``search_cold``: the user's rows changed since their last search (a new generation
  token, as a memory write sets in Redis): the prefiltered rows are read from LanceDB,
  then searched; ``search``: the next search of that user with nothing changed (a
  session's following turns), answered from the rows held in memory; ``search_lancedb``:
  no generation (a worker without Redis): LanceDB's prefiltered vector search (and
  full-text search) every time; ``vector``: LanceDB's vector part
  alone (``MemoryStore._vector_search``, same filter, top-20); ``brute``: numpy over all
  rows of the same table (every vector multiplied, then the filter as a boolean mask over
  the table's columns, exact top-20 by ``argpartition``); ``brute_masked``: numpy, the
  mask first, then only the matching rows multiplied (an exact search that filters first,
  as the store does).
- **recall@20** of the store's vector top-20 against the exact top-20 for the same
  prefilter (VECTOR_TOP_K is 20), over all queries; also recall@10 (the first 10 of each).
- ``--compare`` (default in the full run, at 100k): the same queries with no vector index
  (``flat``: scalar-index prefilter, then an exact scan of the user's rows), with
  ``IvfPq`` and with ``IvfHnswSq`` (as ``ensure_indexes`` would build them; searched with
  the store's ``nprobes`` / ``refine_factor``), each built on the same table, timed and
  dropped again.

Last line: ``memory_search_ratio=<p95 search / p95 brute at 100k>`` (the steady read
path); ``search_cold`` and ``search_lancedb`` ratios are printed beside it. The issue's
target is at most 0.25 with recall@20 at least 0.95 (recall of the LanceDB path; the held
rows are searched exactly).
"""

from __future__ import annotations

import argparse
import hashlib
import uuid
import math
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common  # noqa: E402  (also puts the repository root on sys.path)

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402

from hermes.memory import store as store_module  # noqa: E402
from hermes.memory.embeddings import UseEmbedder  # noqa: E402
from hermes.memory.store import VECTOR_TOP_K, MemoryStore  # noqa: E402

DIM = 512
TOPICS = 256
TOPICS_PER_USER = 8
KINDS = np.array(["fact", "preference", "episode", "working"])
KIND_P = [0.5, 0.3, 0.15, 0.05]
NOW = datetime(2026, 11, 20, 12, 0, tzinfo=timezone.utc)
ROW_NOISE = 0.9
"""Norm of a row's own noise, relative to its unit topic centroid."""
USER_OFFSET = 0.5
"""Norm of a user's offset from a topic centroid (two users' rows of one topic differ)."""


class SyntheticEmbedder:
    """The default embedder's shape (512 dimensions, its thresholds) for rows and queries
    whose vectors the bench makes itself; it embeds nothing."""

    dim = DIM
    model_id = f"synthetic-clustered:{DIM}"
    thresholds = UseEmbedder.thresholds

    def embed_passages(self, texts: Any) -> np.ndarray:
        raise AssertionError("the bench passes vectors; nothing is embedded")

    def embed_query(self, text: str) -> np.ndarray:
        """A fixed random unit vector per text: only the read path's reference bank
        (:mod:`hermes.memory.relevance`, embedded once) comes here, so its hub-level check
        costs what it costs with a real model (the bench's queries pass their vectors)."""
        seed = int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little")
        return _unit(np.random.default_rng(seed).standard_normal(DIM))


def _unit(x: np.ndarray) -> np.ndarray:
    return (x / np.linalg.norm(x, axis=-1, keepdims=True)).astype(np.float32)


def _noise(rng: np.random.Generator, n: int, norm: float) -> np.ndarray:
    return _unit(rng.standard_normal((n, DIM))) * norm


@dataclass
class Dataset:
    """Rows as numpy columns (the same values the table holds) and the queries."""

    user_ids: np.ndarray
    status: np.ndarray
    valid_until_us: np.ndarray
    """Microseconds since the epoch; ``np.iinfo(int64).max`` for no end."""
    vectors: np.ndarray
    table: pa.Table
    queries: list[tuple[str, str, np.ndarray]] = field(default_factory=list)
    """(user_id, text, vector)."""
    heavy_user: str | None = None
    heavy_queries: list[tuple[str, str, np.ndarray]] = field(default_factory=list)


class World:
    """Topic centroids and words shared by every dataset of a run."""

    def __init__(self, seed: int = 7) -> None:
        self.rng = np.random.default_rng(seed)
        self.centroids = _unit(self.rng.standard_normal((TOPICS, DIM)))
        syllables = ["ka", "lo", "mi", "ren", "sut", "vo", "zan", "pe", "qui", "dor", "fel", "ga", "hu", "jin", "bre"]
        self.words = [
            ["".join(self.rng.choice(syllables, size=3)) + f"{t}w{k}" for k in range(12)] for t in range(TOPICS)
        ]

    def user_topics(self, rng: np.random.Generator, n_users: int) -> tuple[np.ndarray, np.ndarray]:
        topics = np.stack([rng.choice(TOPICS, size=TOPICS_PER_USER, replace=False) for _ in range(n_users)])
        offsets = _noise(rng, n_users * TOPICS_PER_USER, USER_OFFSET).reshape(n_users, TOPICS_PER_USER, DIM)
        return topics, offsets

    def dataset(self, schema: pa.Schema, model_id: str, counts: list[int], n_queries: int, seed: int,
                heavy_user: str | None = None) -> Dataset:
        rng = np.random.default_rng(seed)
        n_users = len(counts)
        names = [f"user-{seed}-{i:04d}" for i in range(n_users)]
        if heavy_user:
            names[-1] = heavy_user
        topics, offsets = self.user_topics(rng, n_users)
        user_idx = np.repeat(np.arange(n_users), counts)
        rng.shuffle(user_idx)  # users' rows interleaved, as written over time
        n = len(user_idx)
        slot = rng.integers(0, TOPICS_PER_USER, size=n)
        topic = topics[user_idx, slot]
        vectors = np.empty((n, DIM), dtype=np.float32)
        for start in range(0, n, 20_000):
            s = slice(start, min(n, start + 20_000))
            vectors[s] = _unit(self.centroids[topic[s]] + offsets[user_idx[s], slot[s]] + _noise(rng, s.stop - s.start, ROW_NOISE))
        user_ids = np.array(names)[user_idx]
        r = rng.random(n)
        status = np.where(r < 0.10, "superseded", "active")
        kinds = rng.choice(KINDS, size=n, p=KIND_P)
        day_us = 86_400 * 1_000_000
        now_us = int(NOW.timestamp() * 1_000_000)
        created = now_us - rng.integers(1, 365, size=n) * day_us
        updated = np.minimum(now_us, created + rng.integers(0, 60, size=n) * day_us)
        has_end = rng.random(n) < 0.04
        ends = np.where(rng.random(n) < 0.5, now_us - 3 * day_us, now_us + 30 * day_us)
        valid_until_us = np.where(has_end, ends, np.iinfo(np.int64).max)
        texts = [
            f"{' '.join(rng.choice(self.words[t], size=3))} note {i}" for i, t in enumerate(topic)
        ]
        ts = pa.timestamp("us", tz="UTC")
        ids = [f"m-{seed}-{i:07d}" for i in range(n)]
        columns = {
            "memory_id": pa.array(ids),
            "user_id": pa.array(user_ids.tolist()),
            "kind": pa.array(kinds.tolist()),
            "subject": pa.nulls(n, pa.string()),
            "value": pa.nulls(n, pa.string()),
            "text": pa.array(texts),
            "vector": pa.FixedSizeListArray.from_arrays(pa.array(vectors.reshape(-1)), DIM),
            "embedding_model": pa.array([model_id] * n),
            "importance": pa.array(rng.random(n).astype(np.float32)),
            "confidence": pa.array((0.75 + 0.25 * rng.random(n)).astype(np.float32)),
            "source": pa.array(["rule"] * n),
            "source_session": pa.array([f"s-{i % 5000}" for i in range(n)]),
            "source_turn": pa.array(rng.integers(0, 200, size=n)),
            "created_at": pa.array(created, type=ts),
            "updated_at": pa.array(updated, type=ts),
            "last_hit_at": pa.array(updated, type=ts, mask=rng.random(n) >= 0.3),
            "hit_count": pa.array(rng.integers(0, 5, size=n)),
            "mentions": pa.array(np.ones(n, dtype=np.int64)),
            "sources": pa.array([[x] for x in ids], type=pa.list_(pa.string())),
            "valid_until": pa.array(np.where(has_end, ends, 0), type=ts, mask=~has_end),
            "superseded_by": pa.nulls(n, pa.string()),
            "status": pa.array(status.tolist()),
            "version": pa.array(np.ones(n, dtype=np.int64)),
        }
        table = pa.Table.from_arrays([columns[f.name].cast(f.type) for f in schema], schema=schema)
        data = Dataset(user_ids=user_ids, status=status, valid_until_us=valid_until_us, vectors=vectors,
                       table=table, heavy_user=heavy_user)
        # Queries: a user (drawn by rows, so a heavy user is asked about as often as it
        # writes; the heavy user's own queries are reported apart), one of its topics.
        q_users = rng.integers(0, n_users - (1 if heavy_user else 0), size=n_queries)
        q_slots = rng.integers(0, TOPICS_PER_USER, size=n_queries)
        q_vectors = _unit(self.centroids[topics[q_users, q_slots]] + offsets[q_users, q_slots]
                          + _noise(rng, n_queries, ROW_NOISE))
        for u, s, v in zip(q_users, q_slots, q_vectors):
            data.queries.append((names[u], " ".join(rng.choice(self.words[topics[u, s]], size=2)), v))
        if heavy_user:
            hs = rng.integers(0, TOPICS_PER_USER, size=max(10, n_queries // 4))
            hv = _unit(self.centroids[topics[-1, hs]] + offsets[-1, hs] + _noise(rng, len(hs), ROW_NOISE))
            data.heavy_queries = [(heavy_user, " ".join(rng.choice(self.words[topics[-1, s]], size=2)), v)
                                  for s, v in zip(hs, hv)]
        return data


class BruteForce:
    """Exact filtered cosine top-k in numpy over every row of the table."""

    def __init__(self, data: Dataset) -> None:
        self.vectors = data.vectors
        self.user_ids = data.user_ids
        self.active = data.status == "active"
        self.valid_until_us = data.valid_until_us

    def mask(self, user_id: str, now: datetime) -> np.ndarray:
        now_us = int(now.timestamp() * 1_000_000)
        return (self.user_ids == user_id) & self.active & (self.valid_until_us > now_us)

    def scan(self, user_id: str, vector: np.ndarray, k: int, now: datetime) -> np.ndarray:
        """Every vector multiplied, then masked: the plain brute force."""
        sims = self.vectors @ vector
        sims[~self.mask(user_id, now)] = -np.inf
        top = np.argpartition(-sims, k)[:k]
        return top[np.argsort(-sims[top])]

    def masked(self, user_id: str, vector: np.ndarray, k: int, now: datetime) -> np.ndarray:
        """Mask first, then only the matching rows multiplied."""
        idx = np.nonzero(self.mask(user_id, now))[0]
        sims = self.vectors[idx] @ vector
        k = min(k, len(idx))
        top = np.argpartition(-sims, k - 1)[:k] if k < len(idx) else np.arange(len(idx))
        return idx[top[np.argsort(-sims[top])]]


def row_ids(data: Dataset, positions: np.ndarray) -> list[str]:
    mids = data.table.column("memory_id")
    return [mids[int(i)].as_py() for i in positions]


@dataclass
class Series:
    name: str
    samples: list[float] = field(default_factory=list)

    def p(self, fraction: float) -> float:
        return _common.percentile(self.samples, fraction)

    def median(self) -> float:
        return statistics.median(self.samples)

    def line(self) -> str:
        return f"{self.name:<13} {_common.describe_ms(self.samples)}"


def measure(store: MemoryStore, data: Dataset, queries: list[tuple[str, str, np.ndarray]], *,
            warmup: int, with_search: bool = True) -> tuple[dict[str, Series], float, float]:
    """Time every series on every query, interleaved; return the series and recall@20, @10."""
    brute = BruteForce(data)
    index_of = {m: i for i, m in enumerate(data.table.column("memory_id").to_pylist())}
    series = {name: Series(name) for name in ("search", "search_cold", "search_lancedb", "vector", "brute", "brute_masked")}
    if not with_search:
        for name in ("search", "search_cold", "search_lancedb"):
            del series[name]
    generations: dict[str, str] = {}

    def cold(u: str, t: str, v: np.ndarray) -> Any:
        generations[u] = uuid.uuid4().hex  # the user's rows just changed: read them again
        return store.search(u, t, vector=v, limit=5, now=NOW, generation=generations[u])

    def warm(u: str, t: str, v: np.ndarray) -> Any:
        generations.setdefault(u, uuid.uuid4().hex)
        return store.search(u, t, vector=v, limit=5, now=NOW, generation=generations[u])

    calls: dict[str, Callable[[str, str, np.ndarray], Any]] = {
        "search": warm,
        "search_cold": cold,
        "search_lancedb": lambda u, t, v: store.search(u, t, vector=v, limit=5, now=NOW),
        "vector": lambda u, t, v: store._vector_search(v, store._where(u, now=NOW), VECTOR_TOP_K),
        "brute": lambda u, t, v: brute.scan(u, v, VECTOR_TOP_K, NOW),
        "brute_masked": lambda u, t, v: brute.masked(u, v, VECTOR_TOP_K, NOW),
    }
    names = list(series)
    hits20 = hits10 = want20 = want10 = 0
    for qi, (user, text, vec) in enumerate(queries[:warmup] + queries):
        order = names[qi % len(names):] + names[: qi % len(names)]
        if "search" in order:  # a user's first search after a change reads the rows; the next ones reuse them
            order.remove("search")
            order.insert(order.index("search_cold") + 1, "search")
        results: dict[str, Any] = {}
        for name in order:
            t0 = time.perf_counter()
            results[name] = calls[name](user, text, vec)
            elapsed = time.perf_counter() - t0
            if qi >= warmup:
                series[name].samples.append(elapsed)
        if qi < warmup:
            continue
        exact = brute.scan(user, vec, VECTOR_TOP_K, NOW)
        assert list(exact) == list(results["brute_masked"]) or set(exact) == set(results["brute_masked"])
        got = [index_of[r["memory_id"]] for r in results["vector"]]
        hits20 += len(set(got) & set(exact.tolist()))
        want20 += len(exact)
        hits10 += len(set(got[:10]) & set(exact[:10].tolist()))
        want10 += min(10, len(exact))
        if "search" in results:
            assert results["search"], f"no memory found for {user}: {text}"
    return series, hits20 / want20, hits10 / want10


def report(label: str, series: dict[str, Series], r20: float, r10: float) -> float | None:
    print(f"  [{label}] recall@20={r20:.3f} recall@10={r10:.3f}")
    for s in series.values():
        print("    " + s.line())
    ratio = None
    if "search" in series:
        b = series["brute"]
        ratio = series["search"].p(0.95) / b.p(0.95)
        print(
            f"    ratios (p95 / p95): search/brute={ratio:.3f} search_cold/brute={series['search_cold'].p(0.95) / b.p(0.95):.3f} "
            f"search_lancedb/brute={series['search_lancedb'].p(0.95) / b.p(0.95):.3f} "
            f"vector/brute={series['vector'].p(0.95) / b.p(0.95):.3f} "
            f"search/brute_masked={series['search'].p(0.95) / series['brute_masked'].p(0.95):.1f} "
            f"vector/brute_masked={series['vector'].p(0.95) / series['brute_masked'].p(0.95):.1f}"
        )
    return ratio


def build(path: Path, world: World, *, size: int, counts: list[int], n_queries: int, seed: int,
          heavy: str | None = None) -> tuple[MemoryStore, Dataset]:
    embedder = SyntheticEmbedder()
    store = MemoryStore(path, embedder)  # the product's policy (VECTOR_INDEX_MIN_ROWS)
    t0 = time.perf_counter()
    data = world.dataset(store.table.schema, embedder.model_id, counts, n_queries, seed, heavy_user=heavy)
    t1 = time.perf_counter()
    for start in range(0, data.table.num_rows, 50_000):
        store.table.add(data.table.slice(start, 50_000))
    t2 = time.perf_counter()
    t3 = time.perf_counter()
    store.optimize()  # as consolidation does: compact, fold the rows into the indexes, ensure_indexes()
    t4 = time.perf_counter()
    have = sorted(i.name for i in store.table.list_indices())
    print(
        f"{size:,} rows, {len(counts)} users ({min(counts)}-{max(counts)} rows each): generated {t1 - t0:.1f} s, "
        f"written {t2 - t1:.1f} s, optimize + ensure_indexes {t4 - t3:.1f} s ({', '.join(have)})",
        flush=True,
    )
    return store, data


def drop_vector_index(store: MemoryStore) -> None:
    if "vector_idx" in {i.name for i in store.table.list_indices()}:
        store.table.drop_index("vector_idx")


def compare_indexes(store: MemoryStore, data: Dataset, queries: list, heavy_queries: list, warmup: int) -> None:
    """flat / IvfPq / IvfHnswSq on the same 100k table, vector part and full search."""
    from lancedb.index import IvfHnswSq, IvfPq

    rows = store.table.count_rows()
    partitions = max(1, int(math.sqrt(rows)))
    configs: list[tuple[str, Any]] = [
        ("flat", None),
        (f"IvfPq({partitions})", IvfPq(distance_type="cosine", num_partitions=partitions)),
        (f"IvfHnswSq({partitions})", IvfHnswSq(distance_type="cosine", num_partitions=partitions)),
    ]
    had = "vector_idx" in {i.name for i in store.table.list_indices()}
    for name, config in configs:
        drop_vector_index(store)
        if config is not None:
            t0 = time.perf_counter()
            store.table.create_index("vector", config=config)
            print(f"  {name}: built in {time.perf_counter() - t0:.1f} s", flush=True)
        series, r20, r10 = measure(store, data, queries, warmup=warmup)
        report(name, series, r20, r10)
        if heavy_queries:
            series, r20, r10 = measure(store, data, heavy_queries, warmup=3)
            report(f"{name}, heavy user", series, r20, r10)
    drop_vector_index(store)
    if had:
        store.ensure_indexes()


def main_sync(args: argparse.Namespace) -> None:
    n_queries = args.queries or (30 if args.quick else 200)
    warmup = 5 if args.quick else 20
    heavy_rows = 2_000 if args.quick else 10_000
    world = World()
    print(
        f"memory_search: dim {DIM}, {TOPICS} topics, {TOPICS_PER_USER} per user; {n_queries} queries per size "
        f"(+{warmup} warm-up); VECTOR_INDEX_MIN_ROWS={store_module.VECTOR_INDEX_MIN_ROWS:,}",
        flush=True,
    )
    ratio_100k = None
    with tempfile.TemporaryDirectory(prefix="hermes-memsearch-") as tmp:
        for size in (10_000, 100_000):
            if size == 10_000:
                counts = [500] * 20
                heavy = None
            else:
                rest = size - heavy_rows
                counts = [rest // 199 + (1 if i < rest % 199 else 0) for i in range(199)] + [heavy_rows]
                heavy = "heavy-user"
            store, data = build(Path(tmp) / f"m{size}", world, size=size, counts=counts,
                                n_queries=n_queries, seed=size, heavy=heavy)
            series, r20, r10 = measure(store, data, data.queries, warmup=warmup)
            ratio = report(f"{size:,}, store policy", series, r20, r10)
            if heavy:
                hq = data.heavy_queries[: max(10, n_queries // 4)]
                hseries, h20, h10 = measure(store, data, hq, warmup=3)
                report(f"{size:,}, heavy user ({heavy_rows:,} rows)", hseries, h20, h10)
                if args.compare if args.compare is not None else not args.quick:
                    compare_indexes(store, data, data.queries, hq, warmup)
                ratio_100k = ratio
            print(f"  memory_search_ratio_{size // 1000}k={ratio:.3f}", flush=True)
            del store, data
    _common.headline("memory_search_ratio", f"{ratio_100k:.3f}")


async def main() -> None:
    p = _common.parser(__doc__.splitlines()[0])
    p.add_argument("-n", "--queries", type=int, default=None, help="queries per size (default 200; --quick 30)")
    p.add_argument("--compare", action=argparse.BooleanOptionalAction, default=None,
                   help="compare flat / IvfPq / IvfHnswSq at 100k (default: on, off with --quick)")
    args = p.parse_args()
    main_sync(args)


if __name__ == "__main__":
    _common.run(main)
