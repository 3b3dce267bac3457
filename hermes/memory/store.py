"""The long-term memory store: one LanceDB table of memories and one of archived rows.

Write path (:meth:`MemoryStore.write`), read path (:meth:`MemoryStore.search`) and the
consolidation of one user's rows (:meth:`MemoryStore.consolidate_user`), with the rules of
DESIGN.md "Memory" and seeds 000 §4, 002 §6, 004 §6-7:

- Writes are upserts keyed by a deterministic ``memory_id``; a candidate already applied
  (a retried activity) changes nothing. A candidate close to an active row (cosine at or
  above the embedding model's ``dedupe`` threshold, seed 004 §6.2: 0.92 for e5) refreshes that
  row instead of inserting one. A candidate with the ``subject`` of an active row and
  another value supersedes it: the old row stays, marked ``superseded``, with half its
  confidence and ``superseded_by`` set (seed 002 §6.3: never a silent delete).
- Every change to an existing row is conditional on its ``version`` (optimistic
  concurrency): a write racing a consolidation, or another worker, re-reads and tries
  again instead of overwriting.
- Reads filter first (user, kinds, ``active``, still valid, same embedding model; a scalar
  index on each filter column), then take the vector top-20 and the rows that hold the
  query's identifiers (the lexical half of a hybrid search),
  and rerank by 0.5 similarity + 0.2 recency + 0.2 importance + 0.1 frequency (seed 004
  §6.3).
- Filters are built from validated values and quoted SQL literals (``'`` doubled), so a
  user id with quotes or SQL in it selects that id and nothing else.

All methods are synchronous (LanceDB's own calls are); the activities run them in threads.

Why this module is long: the write path, the search and the consolidation work on the
same two LanceDB tables, under the same per-user locks and with the same SQL and schema
helpers, and must change together whenever the schema does; the pure helpers (text
cleaning, identifiers, re-embedding) sit beside them for the same reason.
"""

from __future__ import annotations

import math
import random
import re
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from hermes import lance
from hermes.errors import HermesError
from hermes.memory.embeddings import Embedder
from hermes.memory import crosslingual, relevance
from hermes.memory.judge import JudgePair, Verdict, assess, change_marker, persons
from hermes.memory.models import (
    ConsolidationReport,
    MemoryCandidate,
    MemoryKind,
    RetrievedMemory,
    WriteReport,
)

MEMORY_TABLE = "memories"
ARCHIVE_TABLE = "memories_archive"
JUDGED_TABLE = "memories_judged"
"""One row per pair the judge decided (``older|newer``, the verdict, when): consolidation
does not put a pair before the model twice. A table of its own, so stores written before
it (issue 15) open unchanged."""
JUDGE_NEIGHBOURS = 3
"""Neighbours of a new memory put before the judge at most (the closest first)."""
FORGOTTEN_TABLE = "memories_forgotten"
"""One row per user who asked to be forgotten, with when: a candidate said before that and
delivered after (a retried extraction) is refused."""
SCHEMA_VERSION = "1"
_META_MODEL = b"hermes.embedding_model"
_META_DIM = b"hermes.dim"
_META_SCHEMA = b"hermes.schema"

VECTOR_TOP_K = 20
"""Vector candidates per search (seed 002 §6.2: top 20)."""
KEYWORD_TOP_K = 10
RERANK_WEIGHTS = (0.5, 0.2, 0.2, 0.1)
"""Similarity, recency, importance, frequency (seed 004 §6.3)."""
RECENCY_HALF_LIFE_DAYS = 30.0
"""A memory's recency term halves every this many days since it was last stated or used."""
FREQUENCY_SATURATION = 10
"""Uses (hits plus restatements) at which the frequency term reaches 1."""
MAX_SOURCES = 32
"""Candidate ids kept per row (to recognise a retried write); the oldest drop off."""
VECTOR_INDEX_MIN_ROWS = 100_000
"""Rows from which the ANN index (IvfHnswSq) is built. Below it, searches are exact: the
per-user prefilter (scalar index) leaves only that user's rows to scan.
``bench/memory_search.py`` at 100k rows (200 users, one with 10,000 rows): for users of
about 450 rows flat, IvfPq and IvfHnswSq are about as fast (vector part 15-20 ms median)
at recall@20 1.0; for the 10,000-row user flat takes about 100 ms, IvfHnswSq about 20 ms at
recall 1.0, and IvfPq (nprobes 32, refine 10) reaches only 0.37-0.75 recall."""
_MAX_ID_CHARS = 512
USER_CACHE_MAX_ROWS = 5000
"""Users with at most this many active rows are searched in memory (exact); larger ones
through LanceDB (and its vector index)."""
USER_CACHE_SECONDS = 60.0
"""A user's cached rows are read again at least this often (hit statistics move)."""
USER_CACHE_USERS = 2000
"""Users whose rows one process holds (the oldest loaded goes first)."""
LANCE_INDEX_CACHE_BYTES = lance.INDEX_CACHE_BYTES
LANCE_METADATA_CACHE_BYTES = lance.METADATA_CACHE_BYTES
"""Caps of the process's LanceDB caches (see :mod:`hermes.lance`, shared with the durable
store): measured here first, a store writing and searching 200 times grew +98 MB with
LanceDB's defaults, +77 MB and flat from the 150th with a 16 MB metadata cache."""
_REEMBED_SUFFIX = "__reembed"


class MemoryStoreError(HermesError):
    """A memory operation the store refuses (a bad argument)."""


class EmbeddingModelMismatch(MemoryStoreError):
    """The rows were embedded by another model (or dimension) than the one configured:
    searching them would compare incomparable vectors. ``hermes memory reembed`` fixes it."""


class WriteConflict(MemoryStoreError):
    """Rows kept changing under a write for every attempt (the activity retries)."""


PINNED_SOURCES = frozenset({"remember", "cli"})
"""Sources of a memory the user asked to keep ("remember ...", ``hermes memory add``): such
an active row is never archived by age (only by ``valid_until``, a supersession or a
forget). ``api`` is not among them: a program writing through the client (an import) is
not a user's wish; it sends ``source="remember"`` for one."""
ARCHIVE_IMPORTANCE_BASE = 16.0
"""Importance 0.5 keeps the configured archive age; each 0.25 above doubles it (0.9: x3,
1.0: x4), each 0.25 below halves it (0.0: x1/4)."""
ARCHIVE_CONFIDENCE_REF = 0.8
"""Confidence that keeps the configured age (the write threshold's neighbourhood)."""
ARCHIVE_USE_MAX = 3.0
"""Most that retrievals extend the age (reached at 15 hits)."""


def archive_age_days(row: dict[str, Any], archive_after_days: float) -> float:
    """Days without use after which consolidation archives ``row`` (``math.inf``: never).

    ``archive_after_days * I * C * U``, counted from the row's last use (the newest of
    ``updated_at`` and ``last_hit_at``: a restatement or a retrieval restarts the clock):

    - ``I = 16 ** (importance - 0.5)`` (0.25 at importance 0, 1 at 0.5, 3 at 0.9, 4 at 1):
      forgetting by age alone archived a user's name, allergy or e-mail, unretrieved for
      the period because nothing asked for it, exactly like a passing remark; what the
      writer judged important keeps longer, and a remark goes sooner.
    - ``C = clamp(confidence / 0.8, 0.5, 1.25)``: a doubtful memory (and a superseded one,
      whose confidence was halved) goes sooner.
    - ``U = min(3, 1 + 0.5 * log2(1 + hit_count))`` (1 hit: 1.5, 3: 2, 15: 3): a memory
      retrieved often has shown it is used, so a pause in its use is not disuse yet.

    An active row whose ``source`` is in :data:`PINNED_SOURCES` (an explicit "remember")
    is never archived by age.

    Args:
        row: a store row (``importance``, ``confidence``, ``hit_count``, ``source``,
            ``status``).
        archive_after_days: the configured age (``Settings.archive_after_days``: 180, or 7
            for the personal profile), in days; > 0.

    Returns:
        The effective age in days, or ``math.inf``.
    """
    if row.get("status", "active") == "active" and row.get("source") in PINNED_SOURCES:
        return math.inf
    importance = min(1.0, max(0.0, float(row.get("importance") or 0.0)))
    confidence = float(row.get("confidence") or 0.0)
    hits = max(0, int(row.get("hit_count") or 0))
    weight_importance = ARCHIVE_IMPORTANCE_BASE ** (importance - 0.5)
    weight_confidence = min(1.25, max(0.5, confidence / ARCHIVE_CONFIDENCE_REF))
    weight_use = min(ARCHIVE_USE_MAX, 1.0 + 0.5 * math.log2(1 + hits))
    return archive_after_days * weight_importance * weight_confidence * weight_use


def check_id(value: str, what: str = "user_id") -> str:
    """``value`` if it is usable as an id: non-empty, at most 512 characters, no control
    characters. Any other character (quotes, SQL, emoji) is fine: filters quote it.

    Raises:
        MemoryStoreError: naming ``what`` and why.
    """
    if not isinstance(value, str) or not value:
        raise MemoryStoreError(f"{what} must be a non-empty string, got {value!r}")
    if len(value) > _MAX_ID_CHARS:
        raise MemoryStoreError(f"{what} is {len(value)} characters; at most {_MAX_ID_CHARS}")
    if any(ord(c) < 32 or ord(c) == 127 for c in value):
        raise MemoryStoreError(f"{what} contains control characters: {value[:80]!r}")
    if any(0xD800 <= ord(c) <= 0xDFFF for c in value):
        # Not encodable as UTF-8: LanceDB would fail with a UnicodeEncodeError, not refuse.
        raise MemoryStoreError(f"{what} contains lone surrogates: {value[:80]!r}")
    return value


def sql_str(value: str) -> str:
    """A SQL string literal for ``value`` (single quotes doubled; DataFusion's rule)."""
    return "'" + value.replace("'", "''") + "'"


def sql_time(value: datetime) -> str:
    """A UTC timestamp literal for LanceDB filters."""
    value = value.astimezone(timezone.utc) if value.tzinfo else value.replace(tzinfo=timezone.utc)
    return f"TIMESTAMP '{value.strftime('%Y-%m-%dT%H:%M:%S.%f')}'"


def _utc(value: datetime | None) -> datetime | None:
    if value is None:
        return None
    return value.replace(tzinfo=timezone.utc) if value.tzinfo is None else value.astimezone(timezone.utc)


_CONTROL = re.compile(r"[\x00-\x08\x0e-\x1f\x7f-\x84\x86-\x9f]")
"""Control characters that are not whitespace (C0 and C1): terminal escapes, NUL, bells.
Whitespace ones (tab, newline, U+0085...) are collapsed by ``split``."""


def clean_text(text: str, limit: int) -> str:
    """``text`` on one line, whitespace collapsed, lone surrogates replaced, other control
    characters removed (a stored ``ESC[2J`` must not reach a terminal or a context), at
    most ``limit`` characters (cut with an ellipsis)."""
    text = " ".join(_CONTROL.sub("", text.encode("utf-8", "replace").decode("utf-8")).split())
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


_JUDGED_SCHEMA = pa.schema(
    [
        pa.field("user_id", pa.string(), nullable=False),
        pa.field("pair", pa.string(), nullable=False),
        pa.field("verdict", pa.string(), nullable=False),
        pa.field("judged_at", pa.timestamp("us", tz="UTC")),
    ]
)
_FORGOTTEN_SCHEMA = pa.schema(
    [pa.field("user_id", pa.string(), nullable=False), pa.field("forgotten_at", pa.timestamp("us", tz="UTC"))]
)


def _schema(dim: int, model_id: str) -> pa.Schema:
    ts = pa.timestamp("us", tz="UTC")
    return pa.schema(
        [
            pa.field("memory_id", pa.string(), nullable=False),
            pa.field("user_id", pa.string(), nullable=False),
            pa.field("kind", pa.string(), nullable=False),
            pa.field("subject", pa.string()),
            pa.field("value", pa.string()),
            pa.field("text", pa.string(), nullable=False),
            pa.field("vector", pa.list_(pa.float32(), dim)),
            pa.field("embedding_model", pa.string(), nullable=False),
            pa.field("importance", pa.float32()),
            pa.field("confidence", pa.float32()),
            pa.field("source", pa.string()),
            pa.field("source_session", pa.string()),
            pa.field("source_turn", pa.int64()),
            pa.field("created_at", ts),
            pa.field("updated_at", ts),
            pa.field("last_hit_at", ts),
            pa.field("hit_count", pa.int64()),
            pa.field("mentions", pa.int64()),
            pa.field("sources", pa.list_(pa.string())),
            pa.field("valid_until", ts),
            pa.field("superseded_by", pa.string()),
            pa.field("status", pa.string(), nullable=False),
            pa.field("version", pa.int64()),
        ],
        metadata={_META_MODEL: model_id.encode(), _META_DIM: str(dim).encode(), _META_SCHEMA: SCHEMA_VERSION.encode()},
    )


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


@dataclass
class _Plan:
    """What one write batch will change."""

    inserts: dict[str, dict[str, Any]]
    updates: dict[str, dict[str, Any]]
    """Rows to replace, keyed by memory_id; each carries the version it was read at."""
    report: WriteReport
    applied: list[str] = field(default_factory=list)
    """Candidate ids found already applied (counted ``unchanged``)."""


class MemoryStore:
    """Long-term memories in LanceDB.

    Args:
        uri: a local directory or any LanceDB URI (``s3://...``, ``db://...``).
        embedder: the embedding model; rows of another model are refused, not mixed.
        vector_index_min_rows: rows from which the ANN index is built.
        storage_options: LanceDB's object store options (:func:`hermes.lance.connect`;
            None: the settings').
        keep_versions_seconds: :meth:`optimize` deletes table versions older than this.

    Raises:
        MemoryStoreError: the URI cannot be opened.
    """

    def __init__(self, uri: str | Path, embedder: Embedder, *, vector_index_min_rows: int = VECTOR_INDEX_MIN_ROWS,
                 storage_options: dict[str, str] | None = None, keep_versions_seconds: float = 3600.0):
        self.uri = str(uri)
        self.embedder = embedder
        self.thresholds = embedder.thresholds
        self.vector_index_min_rows = vector_index_min_rows
        if "://" not in self.uri:
            Path(self.uri).mkdir(parents=True, exist_ok=True)
        # Strong consistency: other workers and the CLI write to the same tables.
        self._db = lance.connect(self.uri, storage_options)
        self.keep_versions_seconds = keep_versions_seconds
        self.commits = 0  # made by writes and hits: a benchmark's lance_commits_per_write
        self._lock = threading.Lock()
        self._forgotten_table: Any = None
        self._judged_table: Any = None
        self._cache: dict[str, _UserRows] = {}
        self._cache_lock = threading.Lock()
        self._model_checked_at = 0.0
        self.table = self._open(MEMORY_TABLE)
        self.archive = self._open(ARCHIVE_TABLE)
        self._forgotten()
        self.ensure_indexes()

    # ------------------------------------------------------------ tables

    def _table_names(self) -> set[str]:
        try:
            names = self._db.list_tables()
            names = getattr(names, "tables", names)
        except AttributeError:  # pragma: no cover - older lancedb
            names = self._db.table_names()
        return set(names)

    def _open(self, name: str) -> Any:
        names = self._table_names()
        if name not in names and f"{name}{_REEMBED_SUFFIX}" in names:
            _finish_reembed(self._db, name)  # a re-embedding stopped between its two steps
            names = self._table_names()
        if name in names:
            return self._db.open_table(name)
        return lance.open_table(self._db, name, _schema(self.embedder.dim, self.embedder.model_id))

    def stored_model(self, table: Any = None) -> tuple[str, int]:
        """The embedding model id and dimension the table was created for."""
        schema = (table or self.table).schema
        meta = schema.metadata or {}
        dim = schema.field("vector").type.list_size
        return meta.get(_META_MODEL, b"").decode() or "unknown", int(dim)

    def check_model(self) -> None:
        """Raises :class:`EmbeddingModelMismatch` unless every row (both tables) was
        embedded by this store's model, with its dimension."""
        for table in (self.table, self.archive):
            model, dim = self.stored_model(table)
            if model != self.embedder.model_id or dim != self.embedder.dim:
                raise EmbeddingModelMismatch(
                    f"the memories at {self.uri} were embedded with {model} ({dim} dimensions) and this worker "
                    f"uses {self.embedder.model_id} ({self.embedder.dim} dimensions): run `hermes memory reembed` "
                    "to embed them again, or configure the same model (HERMES_MEMORY_EMBEDDER)"
                )

    def ensure_indexes(self) -> None:
        """Scalar indexes on the filter columns, and the
        vector index once the table has ``vector_index_min_rows`` rows. Cheap when they
        exist; new rows are searched unindexed until the next refresh (still found)."""
        from lancedb.index import BTree, Bitmap

        try:
            rows = self.table.count_rows()
        except Exception:  # noqa: BLE001 - a table being rewritten by reembed
            return
        # Idempotent and retried (lance.ensure_index): workers opening a fresh shared store at once.
        for column, config in (("user_id", BTree()), ("memory_id", BTree()), ("kind", Bitmap()),
                               ("status", Bitmap()), ("subject", BTree())):
            lance.ensure_index(self.table, column, config)
        if rows >= self.vector_index_min_rows:
            from lancedb.index import IvfHnswSq

            # IvfHnswSq, not IvfPq: PQ lost recall under a per-user prefilter (bench/memory_search.py).
            partitions = max(1, int(math.sqrt(rows)))
            lance.ensure_index(self.table, "vector", IvfHnswSq(distance_type="cosine", num_partitions=partitions))
        lance.ensure_index(self.archive, "user_id", BTree())

    def optimize(self) -> None:
        """Fold new rows into the indexes, compact small fragments and delete versions
        older than ``keep_versions_seconds`` (consolidation runs it)."""
        judged = [self._judged()] if JUDGED_TABLE in self._table_names() else []
        for table in (self.table, self.archive, self._forgotten(), *judged):
            lance.optimize(table, self.keep_versions_seconds)
        self.ensure_indexes()

    # ----------------------------------------------------------- helpers

    def _where(self, user_id: str, *, statuses: Sequence[str] = ("active",), kinds: Sequence[str] | None = None,
               now: datetime | None = None, model: bool = True) -> str:
        parts = [f"user_id = {sql_str(check_id(user_id))}"]
        if statuses:
            parts.append("status IN (" + ", ".join(sql_str(s) for s in statuses) + ")")
        if kinds:
            parts.append("kind IN (" + ", ".join(sql_str(k) for k in kinds) + ")")
        if now is not None:
            parts.append(f"(valid_until IS NULL OR valid_until > {sql_time(now)})")
        if model:
            parts.append(f"embedding_model = {sql_str(self.embedder.model_id)}")
        return " AND ".join(parts)

    def _rows(self, table: Any, where: str, *, limit: int | None = None, vectors: bool = False) -> list[dict[str, Any]]:
        query = table.search().where(where)
        if limit is not None:
            query = query.limit(limit)
        else:
            query = query.limit(table.count_rows(where) + 1 or 1)
        rows = query.to_list()
        if not vectors:
            for r in rows:
                r.pop("vector", None)
        return rows

    def _vector_search(self, vector: np.ndarray, where: str, limit: int) -> list[dict[str, Any]]:
        query = (
            self.table.search(vector.astype(np.float32), vector_column_name="vector")
            .distance_type("cosine")
            .where(where, prefilter=True)
            .limit(limit)
        )
        if "vector_idx" in {i.name for i in self.table.list_indices()}:
            query = query.nprobes(32).refine_factor(10)
        return query.to_list()

    @staticmethod
    def _similarity(row: dict[str, Any], vector: np.ndarray) -> float:
        return float(np.dot(np.asarray(row["vector"], dtype=np.float32), vector))

    # ------------------------------------------------------------- write

    def _already_applied(self, user_id: str, candidate_ids: list[str]) -> set[str]:
        if not candidate_ids:
            return set()
        found: set[str] = set()
        ids = ", ".join(sql_str(c) for c in candidate_ids)
        where = f"user_id = {sql_str(user_id)} AND (memory_id IN ({ids}) OR array_has_any(sources, [{ids}]))"
        for table in (self.table, self.archive):
            for row in self._rows(table, where):
                found.add(row["memory_id"])
                found.update(row.get("sources") or [])
        return found & set(candidate_ids)

    def write(self, candidates: Sequence[MemoryCandidate], *, now: datetime | None = None, attempts: int = 8,
              judge: bool = False, retried: bool = False) -> WriteReport:
        """Store ``candidates`` (all of one user): insert, refresh a near-duplicate, or
        supersede an older value of the same subject.

        Neighbours under the merge threshold go before the judge (:mod:`hermes.memory.judge`):
        what the rules settle is applied here (the same text once normalised: merged; a
        change word about the same topic: the older superseded; a negation: superseded).
        ``judge``: the rest are left to the model (``WriteReport.judge_pairs``, both rows
        stored); without it the rules' verdict is applied to them too.

        ``retried``: this is a retry of a write that may have landed (a retried activity):
        a candidate already applied is reported with what its write did, read back from
        the rows it wrote (:meth:`_applied_outcomes`), not as ``unchanged``.

        Returns:
            What changed. ``inserted`` and ``updated`` name only rows stored for this user
            (read back after the insert); a candidate whose ``candidate_id`` is another
            user's row id is not stored and is named in ``refused``.

        Raises:
            EmbeddingModelMismatch: the table holds another model's vectors.
            WriteConflict: the rows kept changing for ``attempts`` tries (8: a restated
                preference is one hot row that writers and consolidation all update; the
                jittered backoff doubles from 50 ms, about 6 s in all).
            MemoryStoreError: candidates of several users, or a bad user id.
        """
        if not candidates:
            return WriteReport()
        users = {c.user_id for c in candidates}
        if len(users) != 1:
            raise MemoryStoreError(f"one user per write; got {len(users)}")
        user_id = check_id(next(iter(users)))
        self.check_model()
        now = _utc(now) or datetime.now(timezone.utc)
        forgotten = self.forgotten_at(user_id)
        texts = [clean_text(c.text, 500) for c in candidates]
        keep = [
            (c, t) for c, t in zip(candidates, texts)
            if t and (forgotten is None or (_utc(c.created_at) or now) > forgotten)
        ]
        taken = self._ids_of_other_users(user_id, [c.candidate_id for c, _ in keep])
        refused = [f"memory_id {mid!r} is already used by another user: not stored (leave candidate_id "
                   "empty for a generated id, or choose another)" for mid in sorted(taken)]
        keep = [(c, t) for c, t in keep if c.candidate_id not in taken]
        dropped = len(candidates) - len(keep)
        vectors = self.embedder.embed_passages([t for _, t in keep]) if keep else np.zeros((0, self.embedder.dim))
        landed: set[str] = set()
        for attempt in range(attempts):
            plan = self._plan(user_id, keep, vectors, now, judge=judge, landed=landed)
            plan.report.dropped += dropped
            plan.report.refused = refused + plan.report.refused
            if self._apply(plan):
                self._confirm_inserts(user_id, plan.report)
                if retried and plan.applied:
                    self._applied_outcomes(user_id, plan.applied, plan.report)
                return plan.report
            # The inserts of a conflicted plan landed (one commit): the next plan inserts
            # them again (a no-op) and redoes the changes to old rows they call for.
            landed.update(plan.inserts)
            # Jittered: writers that lost the same race must not retry in lockstep.
            time.sleep(random.uniform(0.01, 0.05 * 2**attempt))
        raise WriteConflict(f"memories of {user_id!r} kept changing during {attempts} write attempts")

    def _ids_of_other_users(self, user_id: str, candidate_ids: list[str]) -> set[str]:
        """The ``candidate_ids`` that are already row ids of another user (either table).

        Memory ids are the primary key of one table shared by every user: inserting such
        an id would be skipped as "already there" while reporting an insert, and the
        archive's upsert by id would overwrite the other user's row.
        """
        if not candidate_ids:
            return set()
        ids = ", ".join(sql_str(c) for c in sorted(set(candidate_ids)))
        where = f"memory_id IN ({ids}) AND user_id != {sql_str(user_id)}"
        return {r["memory_id"] for table in (self.table, self.archive) for r in self._rows(table, where)}

    def _applied_outcomes(self, user_id: str, candidate_ids: list[str], report: WriteReport) -> None:
        """Report in ``report`` what the earlier write of each of ``candidate_ids`` (already
        applied) did, from the rows it wrote, which are its record keyed by the candidate id
        (written in the same commit, so nothing lands without it): a row with the id was
        inserted (and rows it superseded name it in ``superseded_by``); an id among a row's
        ``sources`` was folded into that row (``updated``). Each one reported is no longer
        counted ``unchanged``.
        """
        ids = ", ".join(sql_str(c) for c in sorted(set(candidate_ids)))
        where = (f"user_id = {sql_str(user_id)} AND (memory_id IN ({ids}) OR superseded_by IN ({ids}) "
                 f"OR array_has_any(sources, [{ids}]))")
        rows = [r for table in (self.table, self.archive) for r in self._rows(table, where)]
        by_id = {r["memory_id"]: r for r in rows}
        for cid in dict.fromkeys(candidate_ids):
            if cid in by_id:
                found = [cid]
                report.inserted += [cid] if cid not in report.inserted else []
                report.superseded += sorted(
                    r["memory_id"] for r in by_id.values() if r.get("superseded_by") == cid and r["memory_id"] not in report.superseded
                )
            else:
                found = sorted(r["memory_id"] for r in by_id.values() if cid in (r.get("sources") or []))[:1]
                report.updated += [m for m in found if m not in report.updated]
            if found:
                report.unchanged -= 1

    def _confirm_inserts(self, user_id: str, report: WriteReport) -> None:
        """Keep in ``report.inserted`` only the ids now stored for ``user_id``.

        The insert skips an id that exists already (a retry's own row); another user
        taking the id between the check in :meth:`write` and the insert would otherwise be
        reported as this user's insert.
        """
        if not report.inserted:
            return
        ids = ", ".join(sql_str(m) for m in sorted(set(report.inserted)))
        mine = {r["memory_id"] for r in self._rows(self.table, f"memory_id IN ({ids}) AND user_id = {sql_str(user_id)}")}
        lost = [m for m in report.inserted if m not in mine]
        if lost:
            report.inserted = [m for m in report.inserted if m in mine]
            report.dropped += len(lost)
            report.refused += [f"memory_id {m!r} was taken by another user during the write: not stored" for m in lost]

    def _plan(self, user_id: str, items: list[tuple[MemoryCandidate, str]], vectors: np.ndarray, now: datetime,
              *, judge: bool = False, landed: set[str] = frozenset()) -> _Plan:
        """``landed``: candidate ids whose rows a conflicted attempt of this write inserted:
        planned as new rows again (not as restatements of themselves)."""
        report = WriteReport()
        applied = self._already_applied(user_id, [c.candidate_id for c, _ in items]) - landed
        applied_now: list[str] = []
        inserts: dict[str, dict[str, Any]] = {}
        updates: dict[str, dict[str, Any]] = {}
        base = self._where(user_id, now=now)
        for (cand, text), vector in zip(items, vectors):
            # One candidate id is one candidate: a second one in the batch is a repeat.
            if cand.candidate_id in applied or cand.candidate_id in inserts:
                report.unchanged += 1
                if cand.candidate_id in applied:
                    applied_now.append(cand.candidate_id)
                continue
            subject = _norm_key(cand.subject)
            value = _norm_value(cand.value)
            pool = {r["memory_id"]: r for r in self._vector_search(vector, base, 5)}
            if subject:
                for r in self._rows(self.table, base + f" AND subject = {sql_str(subject)}", vectors=True):
                    pool.setdefault(r["memory_id"], r)
            if cand.candidate_id in landed:
                pool.pop(cand.candidate_id, None)
            # What this batch already changed takes precedence over what was read.
            for mid in list(pool):
                if mid in updates:
                    pool[mid] = updates[mid]
            pool.update({mid: r for mid, r in inserts.items()})
            active = [r for r in pool.values() if r["status"] == "active"]
            same: dict[str, Any] | None = None
            best = -1.0
            for r in active:
                sim = self._similarity(r, vector)
                if subject and r.get("subject") == subject:
                    # Same single-valued subject: the same value restated, or a new value.
                    if value and r.get("value"):
                        if r["value"] == value and sim > best:
                            same, best = r, sim
                        continue
                if (
                    sim >= self.thresholds.dedupe
                    and sim > best
                    and (not subject or not r.get("subject") or r.get("subject") == subject)
                    and identifiers(r["text"]) == identifiers(text)
                ):
                    same, best = r, sim
            if cand.candidate_id in landed:
                same = None  # it was an insert: redo the supersedes, do not refresh another row
            pairs = [] if same is not None else self._neighbours(text, vector, active, subject)
            for r, sim, verdict in pairs:
                if verdict.verdict == "same" and (verdict.certain or not judge) and cand.candidate_id not in landed:
                    same = r
                    break
            if same is not None:
                row = dict(same)
                row["updated_at"] = now
                row["importance"] = max(float(row["importance"]), cand.importance)
                row["confidence"] = max(float(row["confidence"]), cand.confidence)
                row["mentions"] = int(row["mentions"]) + 1
                if cand.source in PINNED_SOURCES:
                    row["source"] = cand.source  # "remember" said of a known memory pins it
                row["sources"] = (list(row.get("sources") or []) + [cand.candidate_id])[-MAX_SOURCES:]
                if cand.valid_until is not None:
                    row["valid_until"] = max(_utc(cand.valid_until), _utc(row.get("valid_until")) or _utc(cand.valid_until))
                if not row.get("subject") and subject:
                    row["subject"], row["value"] = subject, value
                self._stage(row, inserts, updates)
                if row["memory_id"] not in report.inserted and row["memory_id"] not in report.updated:
                    report.updated.append(row["memory_id"])
                continue
            new_id = cand.candidate_id
            row = self.new_row(cand, text, vector, now, subject=subject, value=value)
            inserts[new_id] = row
            report.inserted.append(new_id)
            if subject:
                for r in active:
                    if r.get("subject") == subject and r["memory_id"] != new_id:
                        old = dict(r)
                        old["status"] = "superseded"
                        old["superseded_by"] = new_id
                        old["confidence"] = round(float(old["confidence"]) * 0.5, 4)
                        old["updated_at"] = now
                        self._stage(old, inserts, updates)
                        report.superseded.append(old["memory_id"])
            replaced = False
            for r, sim, verdict in pairs:
                if verdict.certain or not judge:
                    if verdict.verdict == "update" and not verdict.certain:
                        # One change replaces one fact: a change word with several old rows
                        # of a shared topic word ("学校 now uses DingTalk" near three school
                        # facts) supersedes only the closest, by rules.
                        if replaced:
                            continue
                        replaced = True
                    if verdict.verdict in ("update", "contradicts") and r["memory_id"] not in report.superseded:
                        old = dict(r, status="superseded", superseded_by=new_id, updated_at=now,
                                   confidence=round(float(r["confidence"]) * 0.5, 4))
                        self._stage(old, inserts, updates)
                        report.superseded.append(old["memory_id"])
                else:
                    report.judge_pairs.append(JudgePair(
                        older_id=r["memory_id"], newer_id=new_id, similarity=round(sim, 4), fallback=verdict.verdict,
                        never_same=verdict.never_same, reason=verdict.reason,
                    ))
        return _Plan(inserts=inserts, updates=updates, report=report, applied=applied_now)

    def _neighbours(self, text: str, vector: np.ndarray, active: list[dict[str, Any]], subject: str
                    ) -> list[tuple[dict[str, Any], float, Any]]:
        """The active rows a new ``text`` is judged against, closest first, with the rules'
        assessment: at or above the model's judge floor (lower when ``text`` holds a
        change word), at most :data:`JUDGE_NEIGHBOURS`; rows of ``subject`` are the subject
        rule's, not the judge's."""
        bands = self.thresholds.judge_bands()
        floor = bands.marker_floor if change_marker(text) else bands.floor
        near = []
        for r in active:
            if subject and r.get("subject") == subject:
                continue
            sim = self._similarity(r, vector)
            if sim >= floor:
                near.append((sim, r))
        near.sort(key=lambda item: (-item[0], item[1]["memory_id"]))
        return [(r, sim, assess(r["text"], text, sim, bands)) for sim, r in near[:JUDGE_NEIGHBOURS]]

    def new_row(self, cand: MemoryCandidate, text: str, vector: np.ndarray, now: datetime, *,
                subject: str | None = None, value: str | None = None) -> dict[str, Any]:
        """The row a new memory gets (active, version 1, stated once at ``now``)."""
        return {
            "memory_id": cand.candidate_id,
            "user_id": cand.user_id,
            "kind": cand.kind,
            "subject": _norm_key(cand.subject) if subject is None else subject,
            "value": _norm_value(cand.value) if value is None else value,
            "text": text,
            "vector": np.asarray(vector, dtype=np.float32),
            "embedding_model": self.embedder.model_id,
            "importance": cand.importance,
            "confidence": cand.confidence,
            "source": cand.source,
            "source_session": cand.source_session,
            "source_turn": cand.source_turn,
            "created_at": _utc(cand.created_at) or now,
            "updated_at": now,
            "last_hit_at": None,
            "hit_count": 0,
            "mentions": 1,
            "sources": [cand.candidate_id],
            "valid_until": _utc(cand.valid_until),
            "superseded_by": None,
            "status": "active",
            "version": 1,
        }

    def insert_rows(self, rows: list[dict[str, Any]]) -> None:
        """Add whole rows as they are, bypassing the write path's checks (bulk loads,
        benchmarks, and tests that set up what racing writers could leave)."""
        self.table.add(self._table_rows(rows))

    @staticmethod
    def _stage(row: dict[str, Any], inserts: dict[str, dict[str, Any]], updates: dict[str, dict[str, Any]]) -> None:
        mid = row["memory_id"]
        if mid in inserts:
            inserts[mid] = row
        else:
            updates[mid] = row

    def _apply(self, plan: _Plan) -> bool:
        """Apply ``plan`` in one commit (a reader never sees a new value without its
        supersede): each update conditional on the version it was read at, each insert
        only where the id is free (a retry's own row stays). False when a row changed
        since it was read: the plan's inserts and its other updates landed anyway; the
        caller plans again (``landed``)."""
        rows = [dict(row, version=int(row["version"]) + 1) for row in plan.updates.values()]
        rows += [dict(row, version=1) for row in plan.inserts.values()]
        if not rows:
            return True
        with self._lock:
            # An insert's source version 1 never matches an existing row (version >= 1).
            merge = (self.table.merge_insert("memory_id").when_matched_update_all(
                where="target.version = source.version - 1").when_not_matched_insert_all())
            result = lance.retry_conflicts(lambda: merge.execute(self._table_rows(rows)))  # idempotent: conditional
            self.commits += 1
        return int(result.num_updated_rows) == len(plan.updates)

    def _table_rows(self, rows: list[dict[str, Any]]) -> pa.Table:
        schema = self.table.schema
        clean = []
        for row in rows:
            r = {name: row.get(name) for name in schema.names}
            r["vector"] = np.asarray(r["vector"], dtype=np.float32).tolist()
            for key in ("created_at", "updated_at", "last_hit_at", "valid_until"):
                r[key] = _utc(r[key])
            r["sources"] = list(r.get("sources") or [])
            clean.append(r)
        return pa.Table.from_pylist(clean, schema=schema)

    # -------------------------------------------------------------- read

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
        activities keep it in Redis, ``hermes:memory:gen:<user>``). With it, the user's
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
        query_persons = persons(query)
        scored = []
        for mid, r in rows.items():
            sim = sims[mid]
            if mid not in keyword and not self._relevant(query, query_words, query_persons, r["text"], sim, hubs.get(mid, -1.0)):
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
                  sim: float, hub: float) -> bool:
        """Whether a memory (``text``, at similarity ``sim``, hub level ``hub``) answers
        something of the question (words ``query_words``, other people ``query_persons``);
        rules only, no model (the read path stays fast). See :func:`relevance.admit`:

        - a shared content word admits the memory (a compound question, "where do I live,
          what is my name and where do I work?", meets each of its memories through one
          word at similarity 0.08-0.12), unless the question is about someone the memory
          does not name (``my sister's birthday`` / the user's own); across languages a
          Chinese word counts as the English of its dictionary senses
          (:func:`crosslingual.share_word`: ``get to work`` / ``上班``);
        - otherwise the similarity must reach the model's retrieval floor and stand out
          from the memory's usual level (``retrieval_lift``), or reach ``retrieval_sure``.
        """
        persons_ok = not query_persons or bool(query_persons & persons(text))  # most questions name no one
        shared = bool(query_words) and (bool(query_words & content_words(text)) or crosslingual.share_word(query, text))
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
        """0.5 similarity + 0.2 recency + 0.2 importance + 0.1 frequency, each in 0-1.

        Similarity is rescaled from the model's retrieval threshold (0) to the best
        candidate's similarity for this query (1): each model has its own scale (USE's
        relevant memories sit at 0.4-0.6, e5's at 0.85-0.9), and on an absolute scale
        recency and importance would outweigh which memory the question is about
        (``bench/memory_quality.py``: recall@5 0.86 absolute, higher relative). Recency
        halves every 30 days since the memory was last stated or used; frequency saturates
        at 10 uses.
        """
        floor = self.thresholds.retrieval
        top = max(best, floor + 1e-6)
        sim = min(1.0, max(0.0, (similarity - floor) / (top - floor)))
        last = max(x for x in (_utc(row.get("updated_at")), _utc(row.get("last_hit_at"))) if x is not None)
        age_days = max(0.0, (now - last).total_seconds() / 86400.0)
        recency = 0.5 ** (age_days / RECENCY_HALF_LIFE_DAYS)
        uses = int(row.get("hit_count") or 0) + int(row.get("mentions") or 1) - 1
        frequency = min(1.0, math.log1p(uses) / math.log1p(FREQUENCY_SATURATION))
        w = RERANK_WEIGHTS
        return w[0] * sim + w[1] * recency + w[2] * float(row.get("importance") or 0.0) + w[3] * frequency

    def record_hits(self, memory_ids: Iterable[str], now: datetime | None = None) -> int:
        """Count a use of each memory (hit count, last hit): the frequency term and the
        archive clock. Unconditional SQL increments, so they commute with other writes."""
        ids = sorted({check_id(m, "memory_id") for m in memory_ids})
        if not ids:
            return 0
        now = _utc(now) or datetime.now(timezone.utc)
        result = self.table.update(
            where="memory_id IN (" + ", ".join(sql_str(m) for m in ids) + ")",
            values_sql={"hit_count": "hit_count + 1", "last_hit_at": sql_time(now), "version": "version + 1"},
        )
        self.commits += 1
        return int(getattr(result, "rows_updated", 0) or 0)

    # ------------------------------------------------------ list, forget

    def list(self, user_id: str, *, statuses: Sequence[str] = ("active", "superseded"), archived: bool = False,
             limit: int = 1000) -> list[dict[str, Any]]:
        """Rows of ``user_id`` without vectors, newest first (``archived``: the archive's)."""
        table = self.archive if archived else self.table
        where = self._where(user_id, statuses=statuses, model=False)
        rows = self._rows(table, where, limit=None)
        rows.sort(key=lambda r: (r["updated_at"], r["memory_id"]), reverse=True)
        return rows[:limit]

    def users(self) -> list[str]:
        """Every user with rows in the memory table."""
        if self.table.count_rows() == 0:
            return []
        col = self.table.search().select(["user_id"]).limit(self.table.count_rows()).to_arrow()["user_id"]
        return sorted(set(col.to_pylist()))

    def forget_user(self, user_id: str, *, now: datetime | None = None) -> int:
        """Delete every row of ``user_id`` from both tables and record when, so that a
        candidate said before now is refused if it arrives later; returns how many rows."""
        where = f"user_id = {sql_str(check_id(user_id))}"
        now = _utc(now) or datetime.now(timezone.utc)
        mark = pa.Table.from_pylist([{"user_id": user_id, "forgotten_at": now}], schema=_FORGOTTEN_SCHEMA)
        self._forgotten().merge_insert("user_id").when_matched_update_all().when_not_matched_insert_all().execute(mark)
        deleted = 0
        for table in (self.table, self.archive):
            result = table.delete(where)
            deleted += int(getattr(result, "num_deleted_rows", 0) or 0)
        self._judged().delete(where)
        return deleted

    def forgotten_at(self, user_id: str) -> datetime | None:
        """When ``user_id`` last asked to be forgotten, if ever."""
        rows = self._forgotten().search().where(f"user_id = {sql_str(check_id(user_id))}").limit(1).to_list()
        return _utc(rows[0]["forgotten_at"]) if rows else None

    def _judged(self) -> Any:
        if self._judged_table is None:
            self._judged_table = lance.open_table(self._db, JUDGED_TABLE, _JUDGED_SCHEMA)
        return self._judged_table

    def _forgotten(self) -> Any:
        if self._forgotten_table is None:
            self._forgotten_table = lance.open_table(self._db, FORGOTTEN_TABLE, _FORGOTTEN_SCHEMA)
        return self._forgotten_table

    def count(self, user_id: str | None = None, *, archived: bool = False) -> int:
        table = self.archive if archived else self.table
        # ``is not None``: an empty user id is refused, not read as "every user".
        return table.count_rows(f"user_id = {sql_str(check_id(user_id))}" if user_id is not None else None)

    # ------------------------------------------------------ consolidation

    def consolidate_user(self, user_id: str, now: datetime, archive_after_days: float) -> ConsolidationReport:
        """Merge near-duplicates, resolve conflicts of a subject, expire rows past
        ``valid_until`` and archive rows unused for ``archive_after_days`` weighed by their
        importance, confidence and retrievals (:func:`archive_age_days`; an explicit
        "remember" never by age); idempotent (a second run right after changes nothing).

        Raises:
            EmbeddingModelMismatch: the table holds another model's vectors.
            WriteConflict: a survivor of a merge kept changing (the activity retries).
        """
        self.check_model()
        now = _utc(now) or datetime.now(timezone.utc)
        report = ConsolidationReport(users=1)
        forgotten_before = self.forgotten_at(user_id)
        where = self._where(user_id, statuses=("active", "superseded"), model=False)
        rows = self._rows(self.table, where, vectors=True)
        report.rows_before = len(rows)
        moves: dict[str, tuple[dict[str, Any], str]] = {}
        updates: dict[str, dict[str, Any]] = {}
        merges: dict[str, list[dict[str, Any]]] = {}  # survivor memory_id -> rows merged into it
        for r in rows:
            valid = _utc(r.get("valid_until"))
            used = max(x for x in (_utc(r["updated_at"]), _utc(r.get("last_hit_at"))) if x is not None)
            age = archive_age_days(r, archive_after_days)
            if valid is not None and valid <= now:
                moves[r["memory_id"]] = (r, "expired")
                report.expired += 1
                report.details.append(f"expired {r['memory_id']}: valid until {valid:%Y-%m-%d}")
            elif math.isfinite(age) and used < now - timedelta(days=age):
                moves[r["memory_id"]] = (r, "archived")
                report.archived += 1
                report.details.append(f"archived {r['memory_id']}: unused since {used:%Y-%m-%d} (kept {age:.0f} days)")
        active = [r for r in rows if r["status"] == "active" and r["memory_id"] not in moves]
        # Conflicts: more than one active row for a single-valued subject (two sessions
        # wrote at once): the newest stays, the others are superseded by it.
        by_subject: dict[str, list[dict[str, Any]]] = {}
        for r in active:
            if r.get("subject"):
                by_subject.setdefault(r["subject"], []).append(r)
        for subject_rows in by_subject.values():
            if len(subject_rows) < 2:
                continue
            subject_rows.sort(key=lambda r: (_utc(r["updated_at"]), r["memory_id"]), reverse=True)
            newest = subject_rows[0]
            for old in subject_rows[1:]:
                if old.get("value") and old.get("value") == newest.get("value"):
                    continue  # the same value: a duplicate, merged below
                updates[old["memory_id"]] = dict(
                    old, status="superseded", superseded_by=newest["memory_id"],
                    confidence=round(float(old["confidence"]) * 0.5, 4), updated_at=now,
                )
                report.superseded += 1
                report.details.append(f"superseded {old['memory_id']} by {newest['memory_id']} ({old['subject']})")
        active = [r for r in active if r["memory_id"] not in updates]
        # Near-duplicates: clusters at or above the dedupe threshold fold into one row.
        if len(active) > 1:
            matrix = np.array([r["vector"] for r in active], dtype=np.float32)
            sims = matrix @ matrix.T
            parent = list(range(len(active)))

            def find(i: int) -> int:
                while parent[i] != i:
                    parent[i] = parent[parent[i]]
                    i = parent[i]
                return i

            for i in range(len(active)):
                for j in np.nonzero(sims[i, i + 1:] >= self.thresholds.dedupe)[0]:
                    j = int(j) + i + 1
                    a, b = active[i], active[j]
                    if identifiers(a["text"]) != identifiers(b["text"]):
                        continue  # locker L-1007 is not locker L-1009, however alike the sentences
                    if a.get("subject") and b.get("subject") and (
                        a["subject"] != b["subject"] or (a.get("value") or "") != (b.get("value") or "")
                    ):
                        continue
                    parent[find(i)] = find(j)
            # The same subject and value (two sessions inserted it at once) is one memory,
            # however differently it was worded.
            first_with_value: dict[tuple[str, str], int] = {}
            for i, r in enumerate(active):
                if r.get("subject") and r.get("value"):
                    k = first_with_value.setdefault((r["subject"], r["value"]), i)
                    if k != i:
                        parent[find(i)] = find(k)
            clusters: dict[int, list[dict[str, Any]]] = {}
            for i, r in enumerate(active):
                clusters.setdefault(find(i), []).append(r)
            for members in clusters.values():
                if len(members) < 2:
                    continue
                members.sort(key=lambda r: (-int(r["mentions"]) - int(r["hit_count"]), _utc(r["created_at"]), r["memory_id"]))
                keep, rest = members[0], members[1:]
                merges[keep["memory_id"]] = rest
                for r in rest:
                    moves[r["memory_id"]] = (dict(r, superseded_by=keep["memory_id"]), "merged")
                    report.merged += 1
                    report.details.append(f"merged {r['memory_id']} into {keep['memory_id']}")
        # Apply: updates at the version read; moves copy to the archive, then delete; then
        # each survivor takes in the rows actually moved into it.
        for mid, row in updates.items():
            seen = int(row["version"])
            self.table.merge_insert("memory_id").when_matched_update_all(where=f"target.version = {seen}").execute(
                self._table_rows([dict(row, version=seen + 1)])
            )
        if moves:
            archived_rows = [dict(r, status=status, updated_at=_utc(r["updated_at"])) for r, status in moves.values()]
            self.archive.merge_insert("memory_id").when_matched_update_all().when_not_matched_insert_all().execute(
                self._table_rows(archived_rows)
            )
            condition = " OR ".join(
                f"(memory_id = {sql_str(mid)} AND version = {int(r['version'])})" for mid, (r, _) in moves.items()
            )
            self.table.delete(condition)
            # A row that changed meanwhile was not deleted: its archive copy goes again.
            left = self._rows(self.table, "memory_id IN (" + ", ".join(sql_str(m) for m in moves) + ")")
            if left:
                self.archive.delete("memory_id IN (" + ", ".join(sql_str(r["memory_id"]) for r in left) + ")")
                for r in left:
                    report.details.append(f"left {r['memory_id']} (changed during consolidation)")
                    status = moves.pop(r["memory_id"])[1]
                    setattr(report, status, getattr(report, status) - 1)
            if self.forgotten_at(user_id) != forgotten_before:
                # The user was forgotten after this run read the rows: the copies just
                # written to the archive must not outlive the forget. (A forget after this
                # check deletes them itself.)
                self.archive.delete("memory_id IN (" + ", ".join(sql_str(m) for m in moves) + ")")
        for keep_id, rest in merges.items():
            self._absorb(keep_id, [r for r in rest if r["memory_id"] in moves])
        report.rows_after = self.count(user_id)
        report.details = report.details[:200]
        return report

    def _absorb(self, keep_id: str, rest: list[dict[str, Any]], attempts: int = 10) -> None:
        """Fold the counts and sources of ``rest`` (rows already moved to the archive) into
        the row ``keep_id``, re-reading it while a concurrent write changes it."""
        for attempt in range(attempts if rest else 0):
            found = self._rows(self.table, f"memory_id = {sql_str(keep_id)}", vectors=True)
            if not found:
                return  # forgotten meanwhile
            merged = dict(found[0])
            for r in rest:
                merged["mentions"] = int(merged["mentions"]) + int(r["mentions"])
                merged["hit_count"] = int(merged["hit_count"]) + int(r["hit_count"])
                merged["importance"] = max(float(merged["importance"]), float(r["importance"]))
                merged["confidence"] = max(float(merged["confidence"]), float(r["confidence"]))
                merged["updated_at"] = max(_utc(merged["updated_at"]), _utc(r["updated_at"]))
                merged["sources"] = (list(merged.get("sources") or []) + list(r.get("sources") or []) + [r["memory_id"]])[-MAX_SOURCES:]
                if r.get("source") in PINNED_SOURCES and merged.get("source") not in PINNED_SOURCES:
                    merged["source"] = r["source"]  # a merged "remember" keeps the survivor
                if not merged.get("subject") and r.get("subject"):
                    merged["subject"], merged["value"] = r["subject"], r.get("value")
            seen = int(merged["version"])
            result = self.table.merge_insert("memory_id").when_matched_update_all(where=f"target.version = {seen}").execute(
                self._table_rows([dict(merged, version=seen + 1)])
            )
            if result.num_updated_rows == 1:
                return
            time.sleep(random.uniform(0.01, 0.02 * 2**min(attempt, 4)))
        if rest:
            raise WriteConflict(f"memory {keep_id!r} kept changing while merging {len(rest)} rows into it")


    # ------------------------------------------------------------- judge

    def judged_pairs(self, user_id: str) -> set[str]:
        """The pairs (``older|newer``) of ``user_id`` the judge already decided."""
        table = self._judged()
        where = f"user_id = {sql_str(check_id(user_id))}"
        n = table.count_rows(where)
        if not n:
            return set()
        return {r["pair"] for r in table.search().where(where).select(["pair"]).limit(n + 1).to_list()}

    def pair_texts(self, pair: JudgePair) -> tuple[str, str] | None:
        """The texts of ``pair``'s rows, or None when either is no longer active."""
        rows = {r["memory_id"]: r for r in self._rows(
            self.table, f"memory_id IN ({sql_str(pair.older_id)}, {sql_str(pair.newer_id)}) AND status = 'active'")}
        if pair.older_id not in rows or pair.newer_id not in rows:
            return None
        return rows[pair.older_id]["text"], rows[pair.newer_id]["text"]

    def apply_verdict(self, user_id: str, pair: JudgePair, verdict: Verdict, *, now: datetime | None = None,
                      record: bool = True, attempts: int = 5) -> str:
        """Apply the judge's ``verdict`` on ``pair`` (never a delete without a copy):

        - ``same``: the newer row goes to the archive as ``merged`` (``superseded_by`` the
          older), whose mentions, sources (the newer's id among them) and importance take it in;
        - ``update`` / ``contradicts``: the older row is ``superseded``, linked to the newer,
          with half its confidence;
        - ``different``: nothing changes.

        ``record``: remember the pair as decided, so consolidation never asks again.

        Returns:
            ``merged``, ``superseded``, ``kept``, or ``gone`` (a row is no longer active).

        Raises:
            WriteConflict: a row kept changing for ``attempts`` tries (the activity retries).
        """
        check_id(user_id)
        now = _utc(now) or datetime.now(timezone.utc)
        outcome = "kept"
        for attempt in range(attempts):
            rows = {r["memory_id"]: r for r in self._rows(
                self.table,
                f"user_id = {sql_str(user_id)} AND status = 'active' AND memory_id IN "
                f"({sql_str(pair.older_id)}, {sql_str(pair.newer_id)})",
                vectors=True,
            )}
            if pair.older_id not in rows or pair.newer_id not in rows:
                return "gone"
            older, newer = rows[pair.older_id], rows[pair.newer_id]
            if verdict == "same":
                moved = dict(newer, status="merged", superseded_by=older["memory_id"], updated_at=_utc(newer["updated_at"]))
                self.archive.merge_insert("memory_id").when_matched_update_all().when_not_matched_insert_all().execute(
                    self._table_rows([moved])
                )
                result = self.table.delete(f"memory_id = {sql_str(newer['memory_id'])} AND version = {int(newer['version'])}")
                if int(getattr(result, "num_deleted_rows", 1) or 0) == 0 and self._rows(
                    self.table, f"memory_id = {sql_str(newer['memory_id'])}"
                ):
                    self.archive.delete(f"memory_id = {sql_str(newer['memory_id'])}")
                    time.sleep(random.uniform(0.01, 0.02 * 2**attempt))
                    continue
                self._absorb(older["memory_id"], [newer])
                outcome = "merged"
            elif verdict in ("update", "contradicts"):
                seen = int(older["version"])
                old = dict(older, status="superseded", superseded_by=newer["memory_id"], updated_at=now,
                           confidence=round(float(older["confidence"]) * 0.5, 4), version=seen + 1)
                result = self.table.merge_insert("memory_id").when_matched_update_all(
                    where=f"target.version = {seen}").execute(self._table_rows([old]))
                if result.num_updated_rows != 1:
                    time.sleep(random.uniform(0.01, 0.02 * 2**attempt))
                    continue
                outcome = "superseded"
            break
        else:
            raise WriteConflict(f"memories {pair.older_id!r} / {pair.newer_id!r} kept changing while judged")
        if record:
            mark = pa.Table.from_pylist(
                [{"user_id": user_id, "pair": f"{pair.older_id}|{pair.newer_id}", "verdict": verdict, "judged_at": now}],
                schema=_JUDGED_SCHEMA,
            )
            self._judged().merge_insert(["user_id", "pair"]).when_matched_update_all().when_not_matched_insert_all().execute(mark)
        return outcome

    def judge_pass(self, user_id: str, now: datetime, *, judge: bool = False, max_pairs: int = 0) -> tuple[list[str], list[JudgePair]]:
        """Consolidation's judge step for one user: every active row against its older
        neighbours in the judge band (at most :data:`JUDGE_NEIGHBOURS` each), pairs already
        decided skipped. The rules' certain verdicts are applied (all of them without
        ``judge``); with ``judge`` the other pairs are returned, closest first, at most
        ``max_pairs``.

        Returns:
            ``(details, pairs)``: one line per change applied, and the pairs for the model.
        """
        rows = self._rows(self.table, self._where(user_id, now=now, model=False), vectors=True)
        if len(rows) < 2:
            return [], []
        rows.sort(key=lambda r: (_utc(r["created_at"]), r["memory_id"]))
        matrix = np.array([r["vector"] for r in rows], dtype=np.float32)
        sims = matrix @ matrix.T
        decided = self.judged_pairs(user_id)
        # Rows that already replaced one by rules: one change replaces one fact (see _plan).
        replacers = {r["superseded_by"] for r in self._rows(
            self.table, self._where(user_id, statuses=("superseded",), model=False)) if r.get("superseded_by")}
        bands = self.thresholds.judge_bands()
        gone: set[str] = set()
        details: list[str] = []
        pending: list[JudgePair] = []
        for i in range(1, len(rows)):
            newer = rows[i]
            floor = bands.marker_floor if change_marker(newer["text"]) else bands.floor
            order = [j for j in np.argsort(-sims[i, :i], kind="stable") if sims[i, j] >= floor][:JUDGE_NEIGHBOURS]
            for j in order:
                older = rows[int(j)]
                if newer["memory_id"] in gone:
                    break
                if older["memory_id"] in gone or f"{older['memory_id']}|{newer['memory_id']}" in decided:
                    continue
                if older.get("subject") and older.get("subject") == newer.get("subject"):
                    continue  # the subject rule's
                sim = float(sims[i, j])
                a = assess(older["text"], newer["text"], sim, bands)
                pair = JudgePair(older_id=older["memory_id"], newer_id=newer["memory_id"], similarity=round(sim, 4),
                                 fallback=a.verdict, never_same=a.never_same, reason=a.reason)
                if judge and not a.certain:
                    pending.append(pair)
                    continue
                if a.verdict == "different":
                    continue
                if a.verdict == "update" and not a.certain:
                    if newer["memory_id"] in replacers:
                        continue
                    replacers.add(newer["memory_id"])
                outcome = self.apply_verdict(user_id, pair, a.verdict, now=now, record=a.certain)
                if outcome == "merged":
                    gone.add(newer["memory_id"])
                elif outcome == "superseded":
                    gone.add(older["memory_id"])
                if outcome in ("merged", "superseded"):
                    details.append(f"{outcome} {pair.newer_id if outcome == 'merged' else pair.older_id} "
                                   f"({a.verdict} by rules: {a.reason or 'close restatement'})")
        pending.sort(key=lambda p: -p.similarity)
        return details, pending[:max_pairs]


_WORD = re.compile(r"[a-z]{3,}|[\u3400-\u9fff]+")
_STOP_WORDS = frozenset(
    """the and for are was were what when where which who whom whose why how you your yours
    user users this that these those with from have has had not but can could would should
    will shall may might must did does doing done any all some our ours their theirs they them
    she her his him its it's i'm i've about into over under again then than there here just
    also very much more most such only own same too please tell know remember said says
    my me mine do is am be been being of to in on at by an or as if so no yes
    day week month year time times many left get got thing things kind way still now""".split()
)
_STOP_BIGRAMS = frozenset(
    "用户 我的 你的 他的 她的 我们 你们 什么 怎么 哪里 哪儿 是不 不是 一个 这个 那个 记得 告诉 知道 一下 可以 的是 是什 "
    "时候 么时 多少 是多 哪个 在哪 哪天 现在 今年 每天 一般".split()
)
"""Besides grammar: the words of any question about a date, an amount or a place ("how many
days", "什么时候", "多少"), which a memory sharing them is not therefore about."""


def content_words(text: str) -> frozenset[str]:
    """The words of ``text`` that carry meaning, for the lexical half of the search:
    English words of 3+ letters without stop words, lightly stemmed (``lives`` -> ``live``,
    ``works`` -> ``work``); Chinese as character bigrams, without the common ones (``用户``,
    ``我的``). ``Where do I live?`` meets ``The user lives in Bern.``; ``我住在哪里`` meets
    ``用户住在苏黎世``."""
    found: set[str] = set()
    for token in _WORD.findall(text.casefold()):
        if token.isascii():
            if token in _STOP_WORDS:
                continue
            for suffix in ("ing", "ies", "ed", "s"):
                if token.endswith(suffix) and len(token) - len(suffix) >= 3:
                    token = token[: -len(suffix)] + ("y" if suffix == "ies" else "")
                    break
            if token not in _STOP_WORDS:  # "days" is "day"
                found.add(token)
        else:
            found.update(b for b in (token[i : i + 2] for i in range(len(token) - 1)) if b not in _STOP_BIGRAMS)
    return frozenset(found)


_IDENTIFIER = re.compile(r"[A-Za-z0-9-]*\d[A-Za-z0-9-]*")


def identifiers(text: str) -> frozenset[str]:
    """The tokens of ``text`` that hold a digit (numbers, dates, ids like ``L-1007``): two
    texts whose identifiers differ are never the same memory, whatever their similarity."""
    return frozenset(m.group(0).casefold().strip("-") for m in _IDENTIFIER.finditer(text))


def _norm_key(subject: str) -> str:
    return re.sub(r"[^a-z0-9_]+", "_", subject.strip().lower()).strip("_")[:64]


def _norm_value(value: str) -> str:
    return " ".join(_CONTROL.sub("", value.casefold().encode("utf-8", "replace").decode("utf-8")).split())[:200]


def _finish_reembed(db: Any, name: str) -> None:
    """Make ``name`` from its re-embedded copy, then drop the copy."""
    tmp = f"{name}{_REEMBED_SUFFIX}"
    data = db.open_table(tmp).to_arrow()
    db.create_table(name, data=data, schema=data.schema, mode="overwrite")
    db.drop_table(tmp)


def reembed(uri: str | Path, embedder: Embedder, *, batch_size: int = 256, progress: Any = None) -> dict[str, int]:
    """Embed every row of the store at ``uri`` again with ``embedder`` (both tables), so a
    changed embedding model or dimension can search them. Run it with the workers stopped.

    Each table is first written whole to ``<table>__reembed``; only then is the table
    replaced. A run stopped in between loses nothing: opening the store finishes it.

    Returns:
        Rows re-embedded per table.
    """
    db = lance.connect(str(uri))
    done: dict[str, int] = {}
    existing = set(getattr(db.list_tables(), "tables", None) or db.table_names())
    for name in (MEMORY_TABLE, ARCHIVE_TABLE):
        if name not in existing:
            if f"{name}{_REEMBED_SUFFIX}" in existing:
                _finish_reembed(db, name)
            continue
        old = db.open_table(name).to_arrow()
        schema = _schema(embedder.dim, embedder.model_id)
        rows = old.to_pylist()
        for start in range(0, len(rows), batch_size):
            chunk = rows[start : start + batch_size]
            vectors = embedder.embed_passages([r["text"] for r in chunk])
            for r, v in zip(chunk, vectors):
                r["vector"] = np.asarray(v, dtype=np.float32).tolist()
                r["embedding_model"] = embedder.model_id
                r["version"] = int(r.get("version") or 0) + 1
            if progress is not None:
                progress(name, min(start + batch_size, len(rows)), len(rows))
        table = pa.Table.from_pylist([{k: r.get(k) for k in schema.names} for r in rows], schema=schema)
        db.create_table(f"{name}{_REEMBED_SUFFIX}", data=table, schema=schema, mode="overwrite")
        db.drop_table(name)
        _finish_reembed(db, name)
        done[name] = len(rows)
    return done
