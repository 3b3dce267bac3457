"""The one LanceDB session (caches) every LanceDB connection of a process shares.

LanceDB's own cache defaults are gigabytes (6 GiB of index pages, 1 GiB of metadata),
sized for a database server. With strong consistency (``read_consistency_interval=0``,
which Hermes uses because workers and clients write the same tables) every write makes
a table version whose manifest and fragment metadata stay cached: a worker grew by about
0.1-0.3 MB per write without end, in ``bench/soak.py`` and in a loop of 300 memory writes
(+23 MB). One capped session for the memory tables and the durable store bounds both.
"""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any

INDEX_CACHE_BYTES = 256 * 1024 * 1024
"""Index pages (room for the vector index of 100k memories)."""
METADATA_CACHE_BYTES = 16 * 1024 * 1024
"""Manifests and fragment metadata: the hot paths keep their own rows (the memory store's
per-user cache), so this needs little more than the tables' current versions."""

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


def connect(uri: str) -> Any:
    """``lancedb.connect(uri)`` with strong consistency (every read sees the newest
    version: other processes write the same tables) and the shared capped session."""
    import lancedb

    return lancedb.connect(uri, read_consistency_interval=timedelta(0), session=shared_session())
