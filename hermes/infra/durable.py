"""The durable store: what must survive a Redis loss, in LanceDB beside the memory tables.

DESIGN.md: "nothing that must survive lives only in Redis: losing Redis costs speed, never a
session". Redis stays the fast path (reads first, writes too where reads are hot); the rows
here are the copy that survives a ``FLUSHALL``, an eviction or a Redis without AOF. Every
worker and client opens the same LanceDB URI (``HERMES_MEMORY_URI``: a directory, or any
LanceDB URI such as ``s3://...``), so all of them share it as they share the memory store;
SQLite would not be shared across worker hosts.

Tables (one per kind, so writers of different kinds never contend), all with the columns
``key`` (unique per table), ``owner`` (what rows are listed by), ``seq`` (an order within an
owner), ``at`` (UTC) and ``value`` (text, usually JSON):

| table                     | key                           | owner          | written by                         |
|---------------------------|-------------------------------|----------------|------------------------------------|
| ``hermes_notes``          | note_id (the call's key)      | user_id        | the built-in ``save_note``         |
| ``hermes_content``        | ``b:<hash>`` reference        | ""             | large messages, tool results, replies kept by reference |
| ``hermes_transcript``     | session, chain, index (JSON)  | session, chain | ``archive_messages``               |
| ``hermes_approval_audit`` | session, entry_id (JSON)      | session_id     | ``record_approval_audit``          |
| ``hermes_snapshots``      | session_id                    | session_id     | ``save_snapshot``                  |
| ``hermes_tool_calls``     | call_key                      | session_id     | the exactly-once ledger on an object store: claims (a directory store keeps them as files, :mod:`hermes.infra.ledger`) |
| ``hermes_tool_results``   | call_key                      | session_id     | the same ledger: results of the calls claimed |

Writes are idempotent: :meth:`DurableStore.insert` adds only keys not yet present (a
retried activity rewrites nothing, the first value wins) and :meth:`DurableStore.upsert`
replaces a key's row. :meth:`DurableStore.append` adds rows without looking (one commit,
no merge: about a third of an insert's CPU) for a key only one writer ever writes, such
as the result of a call whose claim that writer holds; reads return one row per key.
Filters quote every value as a SQL literal (``'`` doubled), so an id with quotes or SQL in
it selects that id and nothing else.

The connection is opened lazily, once per store object (one per worker process and one per
client), outside workflow code; every call runs LanceDB's synchronous API in a thread.
Each table is compacted in the background every :data:`COMPACT_EVERY_WRITES` writes made
by this process (each write adds a fragment; reads slow down with their number), and gets
scalar indexes on ``key`` and ``owner`` the first time.

Errors: every failure to reach or write the store raises :class:`DurableStoreError`
(naming the URI and the table), so a caller can say "not saved" and never confirms what
was not written.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from hermes.errors import HermesError
from hermes.infra import lance

log = logging.getLogger("hermes.durable")

NOTES = "hermes_notes"
CONTENT = "hermes_content"
TRANSCRIPT = "hermes_transcript"
AUDIT = "hermes_approval_audit"
SNAPSHOTS = "hermes_snapshots"
TOOL_CALLS = "hermes_tool_calls"
TOOL_RESULTS = "hermes_tool_results"
TABLES = (NOTES, CONTENT, TRANSCRIPT, AUDIT, SNAPSHOTS, TOOL_CALLS, TOOL_RESULTS)

COMPACT_EVERY_WRITES = 64
"""Writes by this process to one table between two background compactions. Measured on a
2-core machine: a filtered read of a table of 300 one-row fragments takes about 70 ms,
after compaction about 5 ms."""
_KEEP_VERSIONS_FOR = timedelta(hours=1)
"""Old table versions (of compacted fragments) are deleted after this long: readers on
other hosts always read the latest version (strong consistency), so an hour is ample."""
_IN_CHUNK = 500
"""Keys per ``key IN (...)`` filter."""


class DurableStoreError(HermesError):
    """The durable store could not be opened, read or written (the message names the URI,
    the table and the cause). Nothing was confirmed: the caller reports it."""


@dataclass(frozen=True)
class Record:
    """One row of a durable table."""

    key: str
    value: str
    owner: str = ""
    seq: int = 0
    at: datetime | None = None
    """UTC; ``None`` is stored as the time of the write."""


def sql_str(value: str) -> str:
    """A SQL string literal for ``value`` (single quotes doubled; DataFusion's rule, as in
    :func:`hermes.memory.store.sql_str`).

    Raises:
        DurableStoreError: ``value`` holds a NUL or a lone surrogate (not encodable).
    """
    if "\x00" in value or any(0xD800 <= ord(c) <= 0xDFFF for c in value):
        raise DurableStoreError(f"an id with a NUL or a lone surrogate cannot be stored: {value[:80]!r}")
    return "'" + value.replace("'", "''") + "'"


def _schema() -> Any:
    import pyarrow as pa

    return pa.schema(
        [
            pa.field("key", pa.string(), nullable=False),
            pa.field("owner", pa.string(), nullable=False),
            pa.field("seq", pa.int64(), nullable=False),
            pa.field("at", pa.timestamp("us", tz="UTC"), nullable=False),
            # large_string: a value kept by reference may be megabytes.
            pa.field("value", pa.large_string(), nullable=False),
        ]
    )


def _utc(value: datetime | None) -> datetime:
    if value is None:
        return datetime.now(timezone.utc)
    return value.replace(tzinfo=timezone.utc) if value.tzinfo is None else value.astimezone(timezone.utc)


class DurableStore:
    """Durable tables in LanceDB at ``uri`` (see the module docstring).

    Args:
        uri: a local directory or any LanceDB URI; the same one for every worker and
            client of a deployment (``Settings.resolved_memory_uri``).

    The constructor connects to nothing; the first call opens the connection.
    """

    def __init__(self, uri: str | Path):
        self.uri = str(uri)
        self._db: Any = None
        self._tables: dict[str, Any] = {}
        self._lock = threading.Lock()
        self._commits = lance.CommitCounter(COMPACT_EVERY_WRITES)
        self._background: set[asyncio.Task[Any]] = set()

    def __repr__(self) -> str:
        return f"DurableStore({self.uri!r})"

    # ------------------------------------------------------------ tables

    def _table(self, name: str) -> Any:
        table = self._tables.get(name)
        if table is not None:
            return table
        with self._lock:
            table = self._tables.get(name)
            if table is not None:
                return table
            if self._db is None:
                if "://" not in self.uri:
                    Path(self.uri).mkdir(parents=True, exist_ok=True)
                # Strong consistency (other workers and clients write the same tables) and
                # capped caches: with LanceDB's defaults every write's version stayed cached.
                self._db = lance.connect(self.uri)
            table = lance.open_table(self._db, name, _schema())  # other processes may create it at once
            self._tables[name] = table
            return table

    def _fail(self, what: str, table: str, err: BaseException) -> DurableStoreError:
        return DurableStoreError(f"durable store {self.uri} ({table}): {what} failed: {type(err).__name__}: {err}")

    def _rows(self, records: Sequence[Record]) -> Any:
        import pyarrow as pa

        return pa.Table.from_pylist(
            [
                {"key": r.key, "owner": r.owner, "seq": r.seq, "at": _utc(r.at), "value": r.value}
                for r in records
            ],
            schema=_schema(),
        )

    # ------------------------------------------------------------ writes (sync)

    def insert_sync(self, table: str, records: Sequence[Record]) -> int:
        """Add the records whose keys are not in ``table`` yet (a retry changes nothing).

        Returns:
            How many were added (0: all of them were there already).

        Raises:
            DurableStoreError: the store cannot be opened or written.
        """
        result = self._write(
            table, records, lambda handle, rows: handle.merge_insert("key").when_not_matched_insert_all().execute(rows)
        )
        if result is None:
            return 0
        inserted = getattr(result, "num_inserted_rows", None)  # a LanceDB without it: all were new
        return int(inserted) if inserted is not None else len(_unique(records))

    def upsert_sync(self, table: str, records: Sequence[Record]) -> None:
        """Write the records, replacing rows with the same keys.

        Raises:
            DurableStoreError: the store cannot be opened or written.
        """
        self._write(
            table,
            records,
            lambda handle, rows: handle.merge_insert("key").when_matched_update_all().when_not_matched_insert_all().execute(rows),
        )

    def append_sync(self, table: str, records: Sequence[Record]) -> None:
        """Add the records without looking for their keys: for keys no other write uses
        (a key appended twice is two rows, of which reads return one).

        Raises:
            DurableStoreError: the store cannot be opened or written.
        """
        self._write(table, records, lambda handle, rows: handle.add(rows))

    def _write(self, table: str, records: Sequence[Record], write: Callable[[Any, Any], Any]) -> Any:
        """``write(table handle, arrow rows)`` of the records, the first of each key; None
        (nothing written) when there are none. Counts the write for compaction.

        Raises:
            DurableStoreError: the store cannot be opened or written.
        """
        unique = _unique(records)
        if not unique:
            return None
        try:
            result = write(self._table(table), self._rows(unique))
        except Exception as err:  # noqa: BLE001 - any failure is "not written"
            raise self._fail("write", table, err) from err
        self._wrote(table)
        return result

    # ------------------------------------------------------------ reads (sync)

    def _select(self, table: str, where: str, columns: list[str] | None = None) -> list[dict[str, Any]]:
        try:
            query = self._table(table).search().where(where)
            if columns is not None:
                query = query.select(columns)
            return query.limit(None).to_arrow().to_pylist()
        except Exception as err:  # noqa: BLE001
            raise self._fail("read", table, err) from err

    def get_sync(self, table: str, keys: Iterable[str]) -> dict[str, Record]:
        """The records of ``keys`` that exist (missing keys are left out).

        Raises:
            DurableStoreError: the store cannot be read.
        """
        unique = list(dict.fromkeys(keys))
        found: dict[str, Record] = {}
        for start in range(0, len(unique), _IN_CHUNK):
            chunk = unique[start : start + _IN_CHUNK]
            for row in self._select(table, f"key IN ({', '.join(sql_str(k) for k in chunk)})"):
                found.setdefault(row["key"], _record(row))
        return found

    def list_sync(self, table: str, *, owner: str | None = None, limit: int | None = None) -> list[Record]:
        """The records of ``owner`` (of all owners when ``None``), ordered by
        ``(seq, at, key)``; with ``limit``, only the last ``limit`` of that order.

        Raises:
            DurableStoreError: the store cannot be read.
        """
        where = f"owner = {sql_str(owner)}" if owner is not None else "key IS NOT NULL"
        if limit is None or owner is not None:
            rows = sorted(self._select(table, where), key=_order)
            return [_record(r) for r in (rows[-limit:] if limit is not None else rows)]
        # Across owners the table may be large: order the keys, then read the values kept.
        heads = sorted(self._select(table, where, ["key", "owner", "seq", "at"]), key=_order)[-limit:]
        values = self.get_sync(table, [h["key"] for h in heads])
        return [values[h["key"]] for h in heads if h["key"] in values]

    # ------------------------------------------------------------ async

    async def insert(self, table: str, records: Sequence[Record]) -> int:
        """:meth:`insert_sync` in a thread."""
        return await self._run(self.insert_sync, table, records)

    async def upsert(self, table: str, records: Sequence[Record]) -> None:
        """:meth:`upsert_sync` in a thread."""
        await self._run(self.upsert_sync, table, records)

    async def append(self, table: str, records: Sequence[Record]) -> None:
        """:meth:`append_sync` in a thread."""
        await self._run(self.append_sync, table, records)

    async def get(self, table: str, keys: Iterable[str]) -> dict[str, Record]:
        """:meth:`get_sync` in a thread."""
        return await self._run(self.get_sync, table, list(keys))

    async def list(self, table: str, *, owner: str | None = None, limit: int | None = None) -> list[Record]:
        """:meth:`list_sync` in a thread."""
        return await self._run(self.list_sync, table, owner=owner, limit=limit)

    async def _run(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        result = await asyncio.to_thread(fn, *args, **kwargs)
        self._maybe_compact()
        return result

    # ------------------------------------------------------------ upkeep

    def _wrote(self, table: str) -> None:
        self._commits.committed(table)

    def _maybe_compact(self) -> None:
        for table in self._commits.due():
            task = asyncio.get_running_loop().create_task(asyncio.to_thread(self._compact, table))
            self._background.add(task)
            task.add_done_callback(self._background.discard)

    def _compact(self, table: str) -> None:
        """Compact small fragments, fold new rows into the indexes, and create the scalar
        indexes on ``key`` (point reads, the merge of every write) and ``owner`` (lists)
        once the table has had this many writes."""
        try:
            handle = self._table(table)
            have = {column for index in handle.list_indices() for column in index.columns}
            for column in ("key", "owner"):
                if column not in have:
                    handle.create_scalar_index(column, index_type="BTREE")
            handle.optimize(cleanup_older_than=_KEEP_VERSIONS_FOR)
        except Exception as err:  # noqa: BLE001 - upkeep: the next round tries again
            log.warning("durable store %s (%s): compaction failed: %s", self.uri, table, err)
        finally:
            self._commits.done(table)


def _unique(records: Sequence[Record]) -> list[Record]:
    """The first record of each key (a batch with one key twice would insert it twice)."""
    seen: dict[str, Record] = {}
    for r in records:
        seen.setdefault(r.key, r)
    return list(seen.values())


def _order(row: dict[str, Any]) -> tuple[int, datetime, str]:
    return (row["seq"], row["at"], row["key"])


def _record(row: dict[str, Any]) -> Record:
    return Record(key=row["key"], value=row["value"], owner=row["owner"], seq=row["seq"], at=row["at"])


def composite_key(*parts: str | int) -> str:
    """A key made of several ids (session, chain, index...), unambiguous whatever
    characters the ids hold: their JSON array."""
    return json.dumps(list(parts), ensure_ascii=False, separators=(",", ":"))
