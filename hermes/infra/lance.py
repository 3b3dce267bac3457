"""Connecting to LanceDB: one capped session per process, storage options for object
storage, and retries of the commit conflicts that concurrent openers and writers meet.

Caches. LanceDB's own cache defaults are gigabytes (6 GiB of index pages, 1 GiB of metadata),
sized for a database server. With strong consistency (``read_consistency_interval=0``,
which Hermes uses because workers and clients write the same tables) every write makes
a table version whose manifest and fragment metadata stay cached: a worker grew by about
0.1-0.3 MB per write without end, in ``bench/soak.py`` and in a loop of 300 memory writes
(+23 MB). One capped session for the memory tables and the durable store bounds both.

Object storage. A remote URI (``s3://bucket/prefix``) is opened with the storage options
of :meth:`hermes.settings.Settings.resolved_memory_storage_options` (endpoint, region, credentials,
``allow_http``; LanceDB's keys, https://docs.lancedb.com/storage/configuration) unless
the caller passes its own. They hold secrets: nothing here logs them.

Conflicts. Several workers opening a fresh shared store at once race to create the same
tables and indexes; the loser of a commit gets LanceDB's "Retryable commit conflict"
(a ``RuntimeError`` / ``OSError`` naming the conflicting operation, e.g. ``CreateIndex``).
:func:`retry_conflicts` runs such a step again with jittered backoff, and the steps are
written to be idempotent (``exist_ok`` tables, indexes created only when missing).
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any, TypeVar

INDEX_CACHE_BYTES = 256 * 1024 * 1024
"""Index pages (room for the vector index of 100k memories)."""
METADATA_CACHE_BYTES = 16 * 1024 * 1024
"""Manifests and fragment metadata: the hot paths keep their own rows (the memory store's
per-user cache), so this needs little more than the tables' current versions."""
CONFLICT_ATTEMPTS = 10
"""Tries of one conflicting step; the backoff doubles from 50 ms to 2 s (about 10 s in all)."""

log = logging.getLogger("hermes.lance")
_T = TypeVar("_T")
_lock = threading.Lock()
_session: Any = None


def shared_session() -> Any:
    """The process's ``lancedb.Session`` with the caps above (made on first use; thread-safe)."""
    global _session
    with _lock:
        if _session is None:
            import lancedb

            _session = lancedb.Session(
                index_cache_size_bytes=INDEX_CACHE_BYTES, metadata_cache_size_bytes=METADATA_CACHE_BYTES
            )
        return _session


def is_remote(uri: str) -> bool:
    """Whether ``uri`` is on object storage or a server (``s3://``, ``gs://``, ``db://``), not a path."""
    return "://" in uri and not uri.startswith("file://")


def connect(uri: str, storage_options: dict[str, str] | None = None) -> Any:
    """``lancedb.connect(uri)`` with strong consistency (every read sees the newest
    version: other processes write the same tables) and the shared capped session.

    Args:
        uri: a directory or a LanceDB URI.
        storage_options: LanceDB's object store options; None: for a remote ``uri``, the
            process's settings' (:meth:`hermes.settings.Settings.resolved_memory_storage_options`).

    Returns:
        A ``lancedb.DBConnection``.
    """
    import lancedb

    if storage_options is None and is_remote(uri):
        from hermes.settings import get_settings

        storage_options = get_settings().resolved_memory_storage_options()
    return lancedb.connect(
        uri,
        read_consistency_interval=timedelta(0),
        session=shared_session(),
        storage_options=storage_options or None,
    )


def is_conflict(err: BaseException) -> bool:
    """Whether ``err`` is a LanceDB commit conflict (another writer committed first)."""
    text = str(err).lower()
    return "conflict" in text and ("commit" in text or "retryable" in text)


def retry_conflicts(step: Callable[[], _T], *, attempts: int = CONFLICT_ATTEMPTS) -> _T:
    """``step()``, run again after a commit conflict (jittered backoff, see :data:`CONFLICT_ATTEMPTS`).

    ``step`` must be idempotent: after a conflict it runs again against the newest version.

    Raises:
        Whatever ``step`` raises that is not a conflict, or the last conflict.
    """
    for attempt in range(attempts):
        try:
            return step()
        except (RuntimeError, OSError, ValueError) as err:
            if not is_conflict(err) or attempt == attempts - 1:
                raise
            time.sleep(random.uniform(0.01, min(2.0, 0.05 * 2**attempt)))
    raise AssertionError("unreachable")  # pragma: no cover


def open_table(db: Any, name: str, schema: Any) -> Any:
    """Table ``name`` of ``db``, created with ``schema`` if missing; safe when several
    processes do it at once (the losers open the winner's table)."""

    def step() -> Any:
        try:
            return db.create_table(name, schema=schema, exist_ok=True)
        except (ValueError, OSError, RuntimeError) as err:
            if is_conflict(err):
                raise
            return db.open_table(name)  # created by another process in the meantime

    return retry_conflicts(step)


def ensure_index(table: Any, column: str, config: Any, *, name: str | None = None) -> None:
    """An index on ``column`` of ``table`` unless one named ``name`` (``<column>_idx``)
    exists; idempotent under concurrent callers (an index another process made while
    this one tried counts as made)."""
    wanted = name or f"{column}_idx"

    def step() -> None:
        if wanted in {i.name for i in table.list_indices()}:
            return
        try:
            table.create_index(column, config=config, replace=False)
        except (ValueError, OSError, RuntimeError) as err:
            if is_conflict(err) or "already exists" in str(err).lower():
                if wanted in {i.name for i in table.list_indices()}:
                    return
            raise

    retry_conflicts(step)


class CommitCounter:
    """Commits this process made to each table since its last optimization, and the
    tables being optimized now: every ``every`` commits a table is due, and one caller
    takes it (:meth:`due`) while the others go on without waiting. Each commit leaves a
    small fragment that every later read and merge opens (LanceDB's ``optimize``: "run
    more than 20 data modification operations"), so the durable store and the memory
    store both optimize their tables this way between scheduled upkeep.

    Args:
        every: commits to one table that make it due (>= 1).
    """

    def __init__(self, every: int) -> None:
        self.every = every
        self._counts: dict[str, int] = {}
        self._busy: set[str] = set()
        self._lock = threading.Lock()

    def committed(self, table: str) -> None:
        """Count a commit to ``table``."""
        with self._lock:
            self._counts[table] = self._counts.get(table, 0) + 1

    def count(self, table: str) -> int:
        """Commits to ``table`` since its last optimization was taken (or :meth:`reset`)."""
        with self._lock:
            return self._counts.get(table, 0)

    def reset(self, table: str) -> None:
        """``table`` was just optimized by other means: count from zero."""
        with self._lock:
            self._counts[table] = 0

    def due(self) -> list[str]:
        """The tables due and not being optimized: now counted from zero and marked being
        optimized, each until :meth:`done`."""
        with self._lock:
            due = [t for t, n in self._counts.items() if n >= self.every and t not in self._busy]
            for table in due:
                self._counts[table] = 0
                self._busy.add(table)
        return due

    def done(self, table: str) -> None:
        """The optimization :meth:`due` gave out for ``table`` is over (however it ended)."""
        with self._lock:
            self._busy.discard(table)


def optimize(table: Any, keep_versions_seconds: float) -> bool:
    """Compact ``table``'s small fragments, fold new rows into its indexes and delete
    versions older than ``keep_versions_seconds`` (their files too: object storage does
    not grow with every commit); best effort (a concurrent commit wins): a failure is
    logged as a warning naming the table, and the next optimization tries again.

    Returns:
        Whether it optimized.
    """
    try:
        retry_conflicts(
            lambda: table.optimize(cleanup_older_than=timedelta(seconds=keep_versions_seconds)), attempts=3
        )
    except Exception as err:  # noqa: BLE001 - the next optimization tries again
        log.warning("LanceDB table %s not optimized (%s: %s); its small fragments stay until the next try",
                    getattr(table, "name", "?"), type(err).__name__, err)
        return False
    return True
