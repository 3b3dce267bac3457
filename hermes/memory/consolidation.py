"""Consolidation of one user's rows: expiry, archive by age, subject conflicts and
near-duplicate clusters folded into one survivor."""

from __future__ import annotations

import math
import random
import time
from datetime import datetime, timedelta, timezone
from typing import Any

import numpy as np

from hermes.memory import crosslingual
from hermes.memory.forgetting import archive_age_days
from hermes.memory.models import (
    ConsolidationReport,
)
from hermes.memory.schema import (
    MAX_SOURCES,
    PINNED_SOURCES,
    WriteConflict,
    _utc,
    sql_str,
    superseded_row,
)
from hermes.memory.text import identifiers


def age_out(rows: list[dict[str, Any]], now: datetime, archive_after_days: float,
            report: ConsolidationReport) -> dict[str, tuple[dict[str, Any], str]]:
    """The rows of ``rows`` that leave the table by time: past ``valid_until`` (``expired``)
    or unused for their :func:`archive_age_days` (``archived``), each counted and described
    in ``report``.

    Args:
        rows: the user's active and superseded rows.
        now: the consolidation's time (UTC).
        archive_after_days: the configured archive age, in days.
        report: counts and details, updated in place.

    Returns:
        ``memory_id`` -> ``(row, status)``, in the order of ``rows``.
    """
    moves: dict[str, tuple[dict[str, Any], str]] = {}
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
    return moves


def subject_conflicts(active: list[dict[str, Any]], now: datetime, report: ConsolidationReport) -> dict[str, dict[str, Any]]:
    """Conflicts: more than one active row for a single-valued subject (two sessions wrote
    at once). The newest stays; the others with another value are superseded by it (half
    their confidence); one with the same value is a duplicate, left to
    :func:`duplicate_clusters`.

    Returns:
        ``memory_id`` -> the superseded row (to be written at the version it was read at).
    """
    updates: dict[str, dict[str, Any]] = {}
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
            if old.get("value") and crosslingual.same_value(old["value"], newest.get("value") or ""):
                continue  # the same value (in either language): a duplicate, merged below
            updates[old["memory_id"]] = superseded_row(old, newest["memory_id"], now)
            report.superseded += 1
            report.details.append(f"superseded {old['memory_id']} by {newest['memory_id']} ({old['subject']})")
    return updates


def duplicate_clusters(active: list[dict[str, Any]], dedupe: float) -> list[list[dict[str, Any]]]:
    """Clusters of ``active`` rows that are one memory: cosine at or above ``dedupe`` with
    the same identifiers (and, where both have a subject, the same subject and value), or
    the same subject and value however worded (two sessions inserted it at once); a value
    in either language (:func:`hermes.memory.crosslingual.same_value`: ``Chinese`` / ``中文``).

    Args:
        active: rows with their ``vector`` (unit length).
        dedupe: the embedding model's dedupe threshold.

    Returns:
        Clusters of two or more rows, the survivor first (most mentions and hits, then the
        oldest, then by ``memory_id``).
    """
    if len(active) < 2:
        return []
    matrix = np.array([r["vector"] for r in active], dtype=np.float32)
    sims = matrix @ matrix.T
    parent = list(range(len(active)))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for i in range(len(active)):
        for j in np.nonzero(sims[i, i + 1:] >= dedupe)[0]:
            j = int(j) + i + 1
            a, b = active[i], active[j]
            if identifiers(a["text"]) != identifiers(b["text"]):
                continue  # locker L-1007 is not locker L-1009, however alike the sentences
            if a.get("subject") and b.get("subject") and (
                a["subject"] != b["subject"] or not crosslingual.same_value(a.get("value") or "", b.get("value") or "")
            ):
                continue
            parent[find(i)] = find(j)
    valued: dict[str, list[int]] = {}
    for i, r in enumerate(active):
        if r.get("subject") and r.get("value"):
            valued.setdefault(r["subject"], []).append(i)
    for members in valued.values():  # a handful of rows per subject
        for k, i in enumerate(members):
            for j in members[:k]:
                if crosslingual.same_value(active[i]["value"], active[j]["value"]):
                    parent[find(i)] = find(j)
    clusters: dict[int, list[dict[str, Any]]] = {}
    for i, r in enumerate(active):
        clusters.setdefault(find(i), []).append(r)
    found = []
    for members in clusters.values():
        if len(members) < 2:
            continue
        members.sort(key=lambda r: (-int(r["mentions"]) - int(r["hit_count"]), _utc(r["created_at"]), r["memory_id"]))
        found.append(members)
    return found


class MemoryConsolidation:
    """:class:`hermes.memory.store.MemoryStore`'s consolidation (mixed in; uses its tables)."""

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
        ghosts = self._archived_ids([r["memory_id"] for r in rows if r["status"] == "active"])
        if ghosts:
            # A row revived by a write that raced its move to the archive (deleted again by
            # that write), or one another run is moving: not this run's to merge or move.
            rows = [r for r in rows if r["memory_id"] not in ghosts]
            report.details.append(f"left {len(ghosts)} row(s) also in the archive (a move in progress)")
        moves = age_out(rows, now, archive_after_days, report)
        active = [r for r in rows if r["status"] == "active" and r["memory_id"] not in moves]
        updates = subject_conflicts(active, now, report)
        active = [r for r in active if r["memory_id"] not in updates]
        merges: dict[str, list[dict[str, Any]]] = {}  # survivor memory_id -> rows merged into it
        for keep, *rest in duplicate_clusters(active, self.thresholds.dedupe):
            merges[keep["memory_id"]] = rest
            for r in rest:
                moves[r["memory_id"]] = (dict(r, superseded_by=keep["memory_id"]), "merged")
                report.merged += 1
                report.details.append(f"merged {r['memory_id']} into {keep['memory_id']}")
        self._apply_consolidation(user_id, updates, moves, forgotten_before, report)
        for keep_id, rest in merges.items():
            self._absorb(keep_id, [r for r in rest if r["memory_id"] in moves])
        report.rows_after = self.count(user_id)
        report.details = report.details[:200]
        return report

    def _apply_consolidation(self, user_id: str, updates: dict[str, dict[str, Any]],
                             moves: dict[str, tuple[dict[str, Any], str]], forgotten_before: datetime | None,
                             report: ConsolidationReport) -> None:
        """Updates at the version read; moves copy to the archive, then delete (a row that
        changed meanwhile stays, and leaves ``moves`` and the counts)."""
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

    def _archived_ids(self, ids: list[str]) -> set[str]:
        """The ``ids`` that have a row in the archive (queried 500 at a time)."""
        found: set[str] = set()
        for start in range(0, len(ids), 500):
            chunk = ", ".join(sql_str(m) for m in ids[start:start + 500])
            found.update(r["memory_id"] for r in self._rows(self.archive, f"memory_id IN ({chunk})"))
        return found

    def _absorb(self, keep_id: str, rest: list[dict[str, Any]], attempts: int = 10) -> None:
        """Fold the counts and sources of ``rest`` (rows already moved to the archive) into
        the row ``keep_id``, re-reading it while a concurrent write changes it; a row whose
        id ``keep_id``'s sources already hold is not folded twice.

        A survivor that left the table meanwhile (merged by another run of consolidation)
        is followed to the row it was merged into: ``rest`` always ends in a live row
        unless the user was forgotten, or the chain ends; then ``rest`` goes back to the
        table as it was (the next run merges it again), never lost."""
        for attempt in range(attempts if rest else 0):
            found = self._rows(self.table, f"memory_id = {sql_str(keep_id)}", vectors=True)
            if not found:
                moved = self._rows(self.archive, f"memory_id = {sql_str(keep_id)}")
                if moved and moved[0].get("superseded_by") and moved[0]["superseded_by"] != keep_id:
                    keep_id = moved[0]["superseded_by"]
                    continue
                if self.forgotten_at(rest[0]["user_id"]) is None:
                    self._reinstate(rest)
                return
            merged = dict(found[0])
            # A row already folded in (its id among the sources) was absorbed by another run
            # of consolidation that moved it at the same time: what that run folded counts
            # once, and only what this run's copy holds beyond it (a restatement a write
            # added in between) is added; never a source lost for having been seen.
            folded = set(merged.get("sources") or [])
            for r in rest:
                ids = [*(r.get("sources") or []), r["memory_id"]]
                seen_before = sum(1 for i in ids if i in folded)
                if r["memory_id"] in folded and seen_before == len(ids):
                    continue
                merged["mentions"] = int(merged["mentions"]) + max(int(r["mentions"]) - seen_before, 0)
                if r["memory_id"] not in folded:
                    merged["hit_count"] = int(merged["hit_count"]) + int(r["hit_count"])
                merged["importance"] = max(float(merged["importance"]), float(r["importance"]))
                merged["confidence"] = max(float(merged["confidence"]), float(r["confidence"]))
                merged["updated_at"] = max(_utc(merged["updated_at"]), _utc(r["updated_at"]))
                merged["sources"] = (list(merged.get("sources") or []) + [i for i in ids if i not in folded])[-MAX_SOURCES:]
                folded.update(ids)
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

    def _reinstate(self, rows: list[dict[str, Any]]) -> None:
        """Put ``rows`` (moved to the archive by this run) back in the table, active as they
        were read, and drop their archive copies: their survivor is gone."""
        self.table.merge_insert("memory_id").when_not_matched_insert_all().execute(self._table_rows(rows))
        self.archive.delete("memory_id IN (" + ", ".join(sql_str(r["memory_id"]) for r in rows) + ")")
