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

:class:`MemoryStore` is a facade in the manner of redis-py's ``Redis`` over its command
mixins: it opens the tables and holds the state; each concern is a mixin of its own module,
and the plain rules they share are functions without LanceDB:

- :mod:`hermes.memory.schema`: table names, Arrow schemas, errors, ids and SQL literals;
- :mod:`hermes.memory.text`: cleaning texts, their content words and identifiers;
- :mod:`hermes.memory.tables`: opening, the model check, indexes, optimize, row IO;
- :mod:`hermes.memory.writes`: the write plan and its one-commit apply;
- :mod:`hermes.memory.reads`: search, the per-user cache, scoring, hits;
- :mod:`hermes.memory.consolidation`: expiry, archive by age, conflicts, duplicate clusters;
- :mod:`hermes.memory.judging`: the judge's pairs and verdicts;
- :mod:`hermes.memory.forgetting`: the archive age and forgetting a user.

Mixins rather than part objects, so every method keeps its name on ``MemoryStore`` (callers,
the benchmarks and tests that replace a step such as ``_plan`` or ``_rows`` see one class).
Every name this module held before is still importable from it.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from hermes.infra import lance
from hermes.memory.consolidation import MemoryConsolidation
from hermes.memory.embeddings import Embedder
from hermes.memory.forgetting import MemoryForgetting
from hermes.memory.judge import assess
from hermes.memory.judging import MemoryJudging
from hermes.memory.reads import MemoryReads
from hermes.memory.schema import ARCHIVE_TABLE, MEMORY_TABLE, _REEMBED_SUFFIX, _schema
from hermes.memory.tables import OPTIMIZE_EVERY_COMMITS, VECTOR_INDEX_MIN_ROWS, MemoryTables, _finish_reembed
from hermes.memory.writes import MemoryWrites

# The names this module held before it became a facade: callers, tests and benchmarks
# import them from here.
from hermes.memory.forgetting import (  # noqa: F401
    ARCHIVE_CONFIDENCE_REF, ARCHIVE_IMPORTANCE_BASE, ARCHIVE_USE_MAX, PINNED_SOURCES, archive_age_days,
)
from hermes.memory.judging import JUDGE_NEIGHBOURS  # noqa: F401
from hermes.memory.reads import (  # noqa: F401
    FREQUENCY_SATURATION, KEYWORD_TOP_K, RECENCY_HALF_LIFE_DAYS, RERANK_WEIGHTS, USER_CACHE_MAX_ROWS,
    USER_CACHE_SECONDS, USER_CACHE_USERS, VECTOR_TOP_K, _UserRows,
)
from hermes.memory.schema import (  # noqa: F401
    FORGOTTEN_TABLE, JUDGED_TABLE, MAX_SOURCES, SCHEMA_VERSION, _FORGOTTEN_SCHEMA, _JUDGED_SCHEMA, _MAX_ID_CHARS,
    _META_DIM, _META_MODEL, _META_SCHEMA, EmbeddingModelMismatch, MemoryStoreError, WriteConflict, _utc, check_id,
    sql_str, sql_time,
)
from hermes.memory.tables import LANCE_INDEX_CACHE_BYTES, LANCE_METADATA_CACHE_BYTES  # noqa: F401
from hermes.memory.text import _CONTROL, _norm_key, _norm_value, clean_text, content_words, identifiers  # noqa: F401
from hermes.memory.writes import _Plan  # noqa: F401


class MemoryStore(MemoryTables, MemoryWrites, MemoryReads, MemoryConsolidation, MemoryJudging, MemoryForgetting):
    """Long-term memories in LanceDB.

    Args:
        uri: a local directory or any LanceDB URI (``s3://...``, ``db://...``).
        embedder: the embedding model; rows of another model are refused, not mixed.
        vector_index_min_rows: rows from which the ANN index is built.
        storage_options: LanceDB's object store options (:func:`hermes.infra.lance.connect`;
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
        self._unoptimized = lance.CommitCounter(OPTIMIZE_EVERY_COMMITS)  # MemoryTables.optimize_if_due
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

    @staticmethod
    def _assess(older: str, newer: str, similarity: float, bands: Any) -> Any:
        """:func:`hermes.memory.judge.assess`, looked up in this module at each call, so a
        test or a benchmark observes the judge's rules by replacing ``store.assess``."""
        return assess(older, newer, similarity, bands)


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
