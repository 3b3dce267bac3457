"""The durable copy of the exactly-once ledger of non-idempotent tool calls.

Redis holds the fast copy (:mod:`activities.tools`); this is the copy that survives a Redis
loss (a ``FLUSHALL``, an eviction, a restart without AOF): a **claim** written before the
tool runs, inserted only if absent, and the **result** written after it by the claim's
holder. A claim found here that Redis did not have means Redis lost the call's record: the
tool is not run again.

Where it is kept depends on the durable store's URI (``HERMES_MEMORY_URI``):

* **A directory** (the default ``<data_dir>/memory``, or a filesystem every worker host
  mounts): one file per claim under ``<uri>/hermes_tool_ledger/``, created only if absent
  (``open(..., O_CREAT | O_EXCL)``: an atomic insert-if-absent on POSIX filesystems and
  NFS v3 and later), then the directory is flushed to disk (``fsync``) before the tool
  runs: the claim's *name* survives a power loss, which is what keeps the tool from
  running twice. A record read between its creation and its write is read again for a
  moment; one whose contents never came (its writer died between the two, or they did
  not reach the disk) reads as ``started`` (outcome unknown, never run twice), which is
  all a claim ever says. The result is written the same way beside it, not flushed: it is also
  in Redis and in the activity's completion, and a result lost or cut short with the
  machine reads as the claim (outcome unknown, never run again), the safe side.
  One ``fsync`` and two file creations a call, about 0.3 ms of CPU on a 2-core machine,
  against 0.4 ms for the two file flushes of the version before (which did not flush the
  directory, so a claim could vanish in a power loss) and a little more for the
  temporary files then linked or renamed into place that it wrote until issue 31;
  about 7 ms for a LanceDB ``merge_insert`` claim and 3 ms for the result's append
  (issue 31: the ledger was two thirds of a non-idempotent call's CPU).
* **Any other LanceDB URI** (``s3://``, ``gs://``, ...): the durable store's tables
  ``hermes_tool_calls`` (claims, :meth:`DurableStore.insert`) and ``hermes_tool_results``
  (results, :meth:`DurableStore.append`).

Records that versions before this one kept in a directory's LanceDB tables are still
honoured: while those tables exist, a claim granted here also looks there, so a call
claimed by an older worker (a rolling upgrade) is never run a second time.

Values are the ledger's JSON text (``{"state": "started" | "done", ...}``); a claim file
that cannot be parsed (a disk fault) reads as ``started`` (outcome unknown, never run twice).

Errors: every failure to create, write or read a record raises
:class:`~hermes.infra.durable.DurableStoreError` naming the location, so the caller can
report the tool as not run and never confirms what was not kept.
"""

from __future__ import annotations

import asyncio
import errno
import hashlib
import json
import os
import time
import uuid
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from hermes.infra.durable import TOOL_CALLS, TOOL_RESULTS, DurableStore, DurableStoreError, Record

LEDGER_DIR = "hermes_tool_ledger"
"""The directory, inside a directory store's URI, that holds the claim and result files."""

_RECORD_FOLDERS = 256
"""Record folders under the ledger directory: a record's folder is the first two hex
digits of its key's SHA-256, so that no directory holds more than a 256th of the records."""

_STARTED_UNREADABLE = {"state": "started"}
"""What a claim file that exists but cannot be parsed (a disk fault) says."""

_SETTLE_SECONDS = 0.2
"""How long a record file that reads empty or cut short, and changed within
:data:`_YOUNG_SECONDS`, is read again before it counts as unparseable (its writer between
creating and writing it, preempted on a loaded machine)."""

_YOUNG_SECONDS = 1.0
"""A record file that changed longer ago than this is not being written any more."""


def _flush_directory(folder: Path) -> None:
    """``fsync`` the directory ``folder``: the names created in it are on disk. A
    filesystem that cannot flush a directory (``EINVAL``, ``ENOTSUP``: some network and
    FUSE filesystems) is left to its own ordering, as SQLite does."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError as err:
        if err.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP):
            raise
    finally:
        os.close(fd)


def _young(path: Path) -> bool:
    """Whether ``path`` changed less than :data:`_YOUNG_SECONDS` ago (by the file's own
    clock: a skewed one only makes the wait longer or the read the bare ``started`` it was
    before, both safe), so that its writer may still be filling it; gone meanwhile counts
    as young (read again)."""
    try:
        return time.time() - path.stat().st_mtime < _YOUNG_SECONDS
    except FileNotFoundError:
        return True


class CallLedger:
    """The durable side of the exactly-once ledger over ``durable``'s URI (see the module
    docstring for where records go).

    Args:
        durable: the deployment's durable store; its URI decides the backend.
    """

    def __init__(self, durable: DurableStore) -> None:
        self.durable = durable
        self._directory = None if "://" in durable.uri else Path(durable.uri)
        self._folders: set[Path] = set()
        """The ledger directory and record folders known to exist (and flushed into their
        parent) in this process."""

    @property
    def uses_files(self) -> bool:
        """Whether records are files under the store's directory (else LanceDB tables)."""
        return self._directory is not None

    async def claim(self, key: str, owner: str, value: str) -> dict[str, Any] | None:
        """Claim call ``key`` (of session ``owner``) with ``value``, if nobody has.

        Returns:
            None when this caller now holds the claim; otherwise the call's record: its
            result if one was written, else the earlier claim.

        Raises:
            DurableStoreError: the claim could not be written or read.
        """
        if self._directory is None:
            if await self.durable.insert(TOOL_CALLS, [Record(key=key, owner=owner, value=value)]):
                return None
            return await self._lance_record(key)
        found, legacy = await self._io(self._claim_file_beside_legacy, key, owner, value)
        if found is None and legacy:
            legacy = await self._lance_record(key)
            if legacy.get("state") == "done":  # so that the files answer later attempts the same
                await self._io(self._write_result, key, owner, json.dumps(legacy))
            return legacy or None
        return found

    async def done(self, key: str) -> dict[str, Any] | None:
        """The result record (``{"state": "done", ...}``) of call ``key`` if its claim's
        holder wrote one, else None; never claims.

        Raises:
            DurableStoreError: the records could not be read.
        """
        if self._directory is None:
            found = await self._lance_record(key)
        else:
            found = await self._io(self._read_files, key)
            if (found is None or found.get("state") != "done") and self._legacy_tables():
                found = await self._lance_record(key)
        return found if found and found.get("state") == "done" else None

    async def finish(self, key: str, owner: str, value: str) -> None:
        """Record the result ``value`` of call ``key``, claimed by this caller (only the
        claim's holder writes it, so nothing is overwritten).

        Raises:
            DurableStoreError: the result could not be written.
        """
        if self._directory is None:
            await self.durable.append(TOOL_RESULTS, [Record(key=key, owner=owner, value=value)])
            return
        await self._io(self._write_result, key, owner, value)

    # ------------------------------------------------------------ files

    def _paths(self, key: str) -> tuple[Path, Path]:
        assert self._directory is not None
        digest = hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()
        folder = self._directory / LEDGER_DIR / digest[:2]
        return folder / f"{digest}.claim.json", folder / f"{digest}.result.json"

    @staticmethod
    def _body(key: str, owner: str, value: str) -> bytes:
        at = datetime.now(timezone.utc).isoformat()
        return json.dumps({"key": key, "owner": owner, "at": at, "value": value}).encode("utf-8", "surrogatepass")

    def _claim_file(self, key: str, owner: str, value: str) -> dict[str, Any] | None:
        claim, _ = self._paths(key)
        try:
            self._create(claim, self._body(key, owner, value))  # O_EXCL: insert-if-absent
        except FileExistsError:
            return self._read_files(key) or dict(_STARTED_UNREADABLE)
        try:
            _flush_directory(claim.parent)  # the claim's name is on disk before the tool runs
        except OSError:
            # Not kept: the tool is reported as not run, so no claim may say it started.
            claim.unlink(missing_ok=True)
            raise
        return None

    def _claim_file_beside_legacy(self, key: str, owner: str, value: str) -> tuple[dict[str, Any] | None, bool]:
        """:meth:`_claim_file`, and whether ledger tables of an earlier version exist
        (looked at first: a look that fails leaves no claim behind)."""
        legacy = self._legacy_tables()
        return self._claim_file(key, owner, value), legacy

    def _folder(self, folder: Path) -> None:
        """Create ``folder`` (a record folder under the ledger directory), the ledger
        directory and the ledger directory's other record folders where missing, and flush
        each level into its parent, so that a claim flushed into its folder survives with
        it: the first time this process uses them, whoever made them (a maker that died or
        failed before its flush, or another thread still flushing). All
        :data:`_RECORD_FOLDERS` record folders are made at once and flushed with one
        ``fsync`` of the ledger directory (one a process, where one a folder was a second
        ``fsync`` for each of the first few hundred claims, issue 31); each is remembered
        (see :meth:`_written`)."""
        ledger = folder.parent
        if ledger not in self._folders:
            ledger.mkdir(parents=True, exist_ok=True)
            _flush_directory(ledger.parent)
            self._folders.add(ledger)
        if folder not in self._folders:
            made = {ledger / f"{index:02x}" for index in range(_RECORD_FOLDERS)} | {folder}
            for each in made:
                each.mkdir(exist_ok=True)
            _flush_directory(ledger)
            self._folders.update(made)

    def _create(self, path: Path, body: bytes) -> None:
        """Create ``path`` holding ``body`` (not flushed), only if absent (``O_EXCL``: atomic
        on POSIX filesystems and NFS v3 and later); its folder is made first
        (:meth:`_folder`), and again when it was removed meanwhile. A file this call
        created and could not fill is removed.

        Raises:
            FileExistsError: ``path`` exists (nothing was written).
            OSError: it could not be created or written.
        """
        if path.parent not in self._folders:
            self._folder(path.parent)
        try:
            out = open(path, "xb")
        except FileNotFoundError:  # its folder was removed (a data directory cleared)
            self._folders.difference_update((path.parent, path.parent.parent))
            self._folder(path.parent)
            out = open(path, "xb")
        try:
            with out:
                out.write(body)
        except BaseException:
            path.unlink(missing_ok=True)
            raise

    def _written(self, beside: Path, key: str, owner: str, value: str) -> Path:
        """A new temporary file next to ``beside`` holding the record (see :meth:`_create`)."""
        temporary = beside.with_name(f".{beside.name}.{uuid.uuid4().hex}")
        self._create(temporary, self._body(key, owner, value))
        return temporary

    def _write_result(self, key: str, owner: str, value: str) -> None:
        _, result = self._paths(key)
        try:
            self._create(result, self._body(key, owner, value))
            return
        except FileExistsError:
            pass  # written before (a legacy record copied): replaced whole, never truncated in place
        written = self._written(result, key, owner, value)
        try:
            os.replace(written, result)
        finally:
            written.unlink(missing_ok=True)

    def _read_files(self, key: str) -> dict[str, Any] | None:
        """The result file's value, else the claim file's (unparseable: ``started``), else None.

        A file is created, then written (:meth:`_create`): one read a moment after another
        thread or worker created it can find it empty or cut short. Such a file, when it
        changed less than :data:`_YOUNG_SECONDS` ago, is read again for up to
        :data:`_SETTLE_SECONDS` before it counts as unparseable, so that a racing claim
        reads the claim that was granted (issue 31), not a bare ``started``; an older one
        (its writer died between the two, e.g. in a power loss) counts at once.
        """
        deadline, pause = time.monotonic() + _SETTLE_SECONDS, 0.001
        while True:
            found, settled = self._read_files_once(key)
            if settled or time.monotonic() >= deadline:
                return found
            time.sleep(min(pause, max(0.0, deadline - time.monotonic())))
            pause *= 2

    def _read_files_once(self, key: str) -> tuple[dict[str, Any] | None, bool]:
        """:meth:`_read_files` without waiting, and whether every file it read parsed."""
        settled = True
        for path in self._paths(key)[::-1]:
            try:
                raw = path.read_bytes()
            except FileNotFoundError:
                continue
            try:
                found = json.loads(json.loads(raw)["value"])
            except (ValueError, KeyError, TypeError):
                found = None
            if isinstance(found, dict):
                return found, settled
            settled = settled and not _young(path)
            if path.name.endswith(".claim.json"):
                return dict(_STARTED_UNREADABLE), settled
        return None, settled

    async def _io(self, fn: Any, *args: Any) -> Any:
        return await asyncio.to_thread(self._checked, fn, *args)

    def _checked(self, fn: Any, *args: Any) -> Any:
        try:
            return fn(*args)
        except OSError as err:
            raise DurableStoreError(
                f"durable store {self.durable.uri} ({LEDGER_DIR}): {fn.__name__.strip('_')} failed: {type(err).__name__}: {err}"
            ) from err

    # ------------------------------------------------------------ in a thread

    def claims_without_io_wait(self) -> bool:
        """Whether :meth:`claim_in_thread` and :meth:`finish_in_thread` can stand for
        :meth:`claim` and :meth:`finish`: records are files and no ledger tables of an
        earlier version are left to consult (blocking I/O: call it from a thread).

        Raises:
            DurableStoreError: the directory could not be looked at.
        """
        return self._directory is not None and not self._checked(self._legacy_tables)

    def claim_in_thread(self, key: str, owner: str, value: str) -> dict[str, Any] | None:
        """:meth:`claim`, blocking, for a caller already in a thread (issue 31: the claim,
        a synchronous tool and its result's record in one hop to a thread, not three);
        only where :meth:`claims_without_io_wait`.

        Raises:
            DurableStoreError: the claim could not be written or read.
        """
        return self._checked(self._claim_file, key, owner, value)

    def finish_in_thread(self, key: str, owner: str, value: str) -> None:
        """:meth:`finish`, blocking, for a caller already in a thread (see
        :meth:`claim_in_thread`).

        Raises:
            DurableStoreError: the result could not be written.
        """
        self._checked(self._write_result, key, owner, value)

    # ------------------------------------------------------------ LanceDB

    def _legacy_tables(self) -> bool:
        """Whether the directory holds ledger tables written by an earlier version."""
        assert self._directory is not None
        return any((self._directory / f"{table}.lance").exists() for table in (TOOL_CALLS, TOOL_RESULTS))

    async def _lance_record(self, key: str) -> dict[str, Any]:
        """The LanceDB ledger's record of a call: its result if one was written, else its
        claim (a claim row that says "done" is one written before results had their own table)."""
        claims, results = await asyncio.gather(self.durable.get(TOOL_CALLS, [key]), self.durable.get(TOOL_RESULTS, [key]))
        found = results.get(key) or claims.get(key)
        return json.loads(found.value) if found is not None else {}
