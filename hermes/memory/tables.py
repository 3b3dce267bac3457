"""The store's LanceDB tables: opening them (finishing a stopped re-embedding), the
embedding-model check, indexes, optimize, and the filter and row helpers every part reads
and writes through."""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import numpy as np
import pyarrow as pa

from hermes.infra import lance
from hermes.memory.schema import (
    JUDGED_TABLE, MEMORY_TABLE, _JUDGED_SCHEMA, _META_MODEL, _REEMBED_SUFFIX, EmbeddingModelMismatch, _schema,
    _utc, check_id, sql_str, sql_time,
)

VECTOR_INDEX_MIN_ROWS = 100_000
"""Rows from which the ANN index (IvfHnswSq) is built. Below it, searches are exact: the
per-user prefilter (scalar index) leaves only that user's rows to scan.
``bench/memory_search.py`` at 100k rows (200 users, one with 10,000 rows): for users of
about 450 rows flat, IvfPq and IvfHnswSq are about as fast (vector part 15-20 ms median)
at recall@20 1.0; for the 10,000-row user flat takes about 100 ms, IvfHnswSq about 20 ms at
recall 1.0, and IvfPq (nprobes 32, refine 10) reaches only 0.37-0.75 recall."""
OPTIMIZE_EVERY_COMMITS = 20
"""Commits to the memory table by one process between two optimizations of it
(:meth:`MemoryTables.optimize_if_due`), LanceDB's rule of thumb (``LanceTable.optimize``:
"run optimize if you have added or modified 100,000 or more records or run more than 20
data modification operations"). Every commit (a memory write, a flush of hit statistics:
one a second at most) leaves a small fragment that every later read and merge of the table
opens, and before this only consolidation (a schedule, daily) compacted them. Measured
here: a one-row write cost 150 ms of CPU at 50 fragments and 760 ms at 200, a user's rows
read 23 -> 105 ms; with an optimize every 8 commits 80 and 12 ms (issue 31: the memory
table's threads were a third of a worker's CPU per turn in ``bench/overload.py``, tripling
within one run)."""
AUTO_OPTIMIZE_KEEP_VERSIONS_SECONDS = 3600.0
"""The least age of a table version an automatic optimization (:data:`OPTIMIZE_EVERY_COMMITS`)
deletes, whatever ``keep_versions_seconds`` says: a shorter keep (``0`` saves the most
space) still applies when consolidation optimizes, once a day, as it always did. Every 20
commits in every process, it deleted the version a concurrent write checks out to find a
row it revived (a row left in the table and the archive at once) and the files another
process's query was reading ("Not found"), as LanceDB warns of ``cleanup_older_than=0``
(break-it review of issue 31). An hour is the default keep."""
LANCE_INDEX_CACHE_BYTES = lance.INDEX_CACHE_BYTES
LANCE_METADATA_CACHE_BYTES = lance.METADATA_CACHE_BYTES
"""Caps of the process's LanceDB caches (see :mod:`hermes.infra.lance`, shared with the durable
store): measured here first, a store writing and searching 200 times grew +98 MB with
LanceDB's defaults, +77 MB and flat from the 150th with a 16 MB metadata cache."""


def _finish_reembed(db: Any, name: str) -> None:
    """Make ``name`` from its re-embedded copy, then drop the copy."""
    tmp = f"{name}{_REEMBED_SUFFIX}"
    data = db.open_table(tmp).to_arrow()
    db.create_table(name, data=data, schema=data.schema, mode="overwrite")
    db.drop_table(tmp)


class MemoryTables:
    """:class:`hermes.memory.store.MemoryStore`'s tables and row IO (mixed in; ``__init__``
    sets ``_db``, ``table``, ``archive``, ``embedder``)."""

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

    def _committed(self) -> None:
        """Count a commit this process made to the memory table."""
        self.commits += 1
        self._unoptimized.committed(MEMORY_TABLE)

    def optimize_if_due(self) -> bool:
        """Optimize the memory table (compact its small fragments, fold new rows into its
        indexes, delete versions older than ``keep_versions_seconds``) once this process
        made :data:`OPTIMIZE_EVERY_COMMITS` commits to it since the last optimization
        (versions younger than :data:`AUTO_OPTIMIZE_KEEP_VERSIONS_SECONDS` are kept);
        writes wait meanwhile (no conflict of their own making), another thread already
        optimizing is not waited for. Best effort, as :meth:`optimize` (a failure is logged;
        the next commits count toward the next try).

        Returns:
            Whether it optimized.
        """
        if MEMORY_TABLE not in self._unoptimized.due():
            return False
        try:
            with self._lock:
                return lance.optimize(self.table, max(self.keep_versions_seconds, AUTO_OPTIMIZE_KEEP_VERSIONS_SECONDS))
        finally:
            self._unoptimized.done(MEMORY_TABLE)

    def optimize(self) -> None:
        """Fold new rows into the indexes, compact small fragments and delete versions
        older than ``keep_versions_seconds`` (consolidation runs it)."""
        self._unoptimized.reset(MEMORY_TABLE)
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

    def insert_rows(self, rows: list[dict[str, Any]]) -> None:
        """Add whole rows as they are, bypassing the write path's checks (bulk loads,
        benchmarks, and tests that set up what racing writers could leave)."""
        self.table.add(self._table_rows(rows))

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

    def _judged(self) -> Any:
        if self._judged_table is None:
            self._judged_table = lance.open_table(self._db, JUDGED_TABLE, _JUDGED_SCHEMA)
        return self._judged_table

    def count(self, user_id: str | None = None, *, archived: bool = False) -> int:
        table = self.archive if archived else self.table
        # ``is not None``: an empty user id is refused, not read as "every user".
        return table.count_rows(f"user_id = {sql_str(check_id(user_id))}" if user_id is not None else None)
