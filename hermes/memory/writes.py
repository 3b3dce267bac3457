"""The write path: planning a batch of candidates against the user's rows (insert, refresh a
near-duplicate, supersede), applying the plan in one commit conditional on row versions,
and reporting what a retried write did."""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

import numpy as np

from hermes.infra import lance
from hermes.memory import crosslingual
from hermes.memory.judge import JudgePair, change_marker
from hermes.memory.judging import JUDGE_NEIGHBOURS
from hermes.memory.models import (
    MemoryCandidate,
    WriteReport,
)
from hermes.memory.schema import (
    MAX_SOURCES,
    PINNED_SOURCES,
    MemoryStoreError,
    WriteConflict,
    _utc,
    check_id,
    sql_str,
    superseded_row,
)
from hermes.memory.text import _norm_key, _norm_value, clean_text, identifiers

log = logging.getLogger("hermes.memory.writes")


@dataclass
class _Plan:
    """What one write batch will change."""

    inserts: dict[str, dict[str, Any]]
    updates: dict[str, dict[str, Any]]
    """Rows to replace, keyed by memory_id; each carries the version it was read at."""
    report: WriteReport
    applied: list[str] = field(default_factory=list)
    """Candidate ids found already applied (counted ``unchanged``)."""


def restated_match(active: list[dict[str, Any]], vector: np.ndarray, text: str, subject: str, value: str,
                   dedupe: float) -> dict[str, Any] | None:
    """The active row a new memory restates, or None: the closest row of the same subject
    with the same value (in either language: :func:`hermes.memory.crosslingual.same_value`);
    else the closest at or above ``dedupe`` whose subject does not differ and whose
    identifiers (numbers, ids) are the same. A row of the same subject
    with another value is never restated (the new value supersedes it).

    Args:
        active: the user's active rows near the candidate, with their ``vector``.
        vector: the candidate's embedding (unit length).
        text: the candidate's cleaned text.
        subject: its normalised subject (``""``: none).
        value: its normalised value (``""``: none).
        dedupe: the embedding model's dedupe threshold (cosine).
    """
    same: dict[str, Any] | None = None
    best = -1.0
    for r in active:
        sim = float(np.dot(np.asarray(r["vector"], dtype=np.float32), vector))
        if subject and r.get("subject") == subject:
            # Same single-valued subject: the same value restated, or a new value.
            if value and r.get("value"):
                # "Chinese" / "中文", "Xiao Dai" / "小戴": one value in two languages (issue 30).
                if sim > best and crosslingual.same_value(r["value"], value):
                    same, best = r, sim
                continue
        if (
            sim >= dedupe
            and sim > best
            and (not subject or not r.get("subject") or r.get("subject") == subject)
            and identifiers(r["text"]) == identifiers(text)
        ):
            same, best = r, sim
    return same


def restated_row(row: dict[str, Any], cand: MemoryCandidate, subject: str, value: str, now: datetime) -> dict[str, Any]:
    """A copy of the stored ``row`` refreshed by ``cand``, which restates it: stated again
    at ``now``, one more mention, the higher importance and confidence, ``cand``'s id among
    its sources (the newest :data:`MAX_SOURCES`), the later ``valid_until``; a pinned
    source ("remember") pins it; a row without a subject takes ``subject`` and ``value``.

    Args:
        row: the active row restated (with its ``version``, kept for the conditional write).
        cand: the candidate.
        subject: ``cand``'s normalised subject (``""``: none).
        value: ``cand``'s normalised value.
        now: the write's time (UTC).
    """
    row = dict(row)
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
    return row


class MemoryWrites:
    """:class:`hermes.memory.store.MemoryStore`'s write path (mixed in; uses its tables)."""

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
                self.optimize_if_due()
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
            same = restated_match(active, vector, text, subject, value, self.thresholds.dedupe)
            if cand.candidate_id in landed:
                same = None  # it was an insert: redo the supersedes, do not refresh another row
            pairs = [] if same is not None else self._neighbours(text, vector, active, subject)
            for r, sim, verdict in pairs:
                if verdict.verdict == "same" and (verdict.certain or not judge) and cand.candidate_id not in landed:
                    same = r
                    break
            if same is not None and (same["memory_id"] == cand.candidate_id or cand.candidate_id in (same.get("sources") or [])):
                # Another attempt of this write (a retried activity whose first attempt
                # still runs in its thread) landed it after the check above: already applied.
                report.unchanged += 1
                applied_now.append(cand.candidate_id)
                continue
            if same is not None:
                row = restated_row(same, cand, subject, value, now)
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
                        old = superseded_row(r, new_id, now)
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
                        old = superseded_row(r, new_id, now)
                        self._stage(old, inserts, updates)
                        report.superseded.append(old["memory_id"])
                else:
                    report.judge_pairs.append(JudgePair(
                        older_id=r["memory_id"], newer_id=new_id, similarity=round(sim, 4), fallback=verdict.verdict,
                        never_same=verdict.never_same, reason=verdict.reason, two_things=verdict.two_things,
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
        return [(r, sim, self._assess(r["text"], text, sim, bands)) for sim, r in near[:JUDGE_NEIGHBOURS]]

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

    @staticmethod
    def _stage(row: dict[str, Any], inserts: dict[str, dict[str, Any]], updates: dict[str, dict[str, Any]]) -> None:
        mid = row["memory_id"]
        if mid in inserts:
            inserts[mid] = row
        else:
            updates[mid] = row

    def _apply(self, plan: _Plan) -> bool:
        """Apply ``plan``: its inserts and supersedes in one commit (a reader never sees a
        new value without its supersede), each update conditional on the version it was
        read at, each insert only where the id is free (a retry's own row stays). False
        when a row changed since it was read: the plan's inserts and its other updates
        landed anyway; the caller plans again (``landed``).

        One merge that inserts cannot tell an update from an insert: an update of a row
        that left the table since it was read (moved to the archive by consolidation,
        forgotten) is inserted, the row back with its counts already folded elsewhere.
        So rows a plan restates (they stay active, with new sources) are updated first in
        a commit of their own that inserts nothing: no restatement ever lands in a revived
        row. A superseded row revived by the second commit holds no new source and is
        deleted again at once (:meth:`_drop_revived`); until then consolidation leaves it
        alone (its id is in the archive)."""
        restated = {m: r for m, r in plan.updates.items() if r["status"] == "active"} if plan.inserts else {}
        others = {m: r for m, r in plan.updates.items() if m not in restated}
        with self._lock:
            ok = self._merge(restated, {}) if restated else True
            return self._merge(others, plan.inserts) and ok

    def _merge(self, updates: dict[str, dict[str, Any]], inserts: dict[str, dict[str, Any]]) -> bool:
        """One conditional merge of ``updates`` (and ``inserts``, if any); True when every
        update matched the version it was read at."""
        rows = [dict(row, version=int(row["version"]) + 1) for row in updates.values()]
        rows += [dict(row, version=1) for row in inserts.values()]
        if not rows:
            return True
        # An insert's source version 1 never matches an existing row (version >= 1).
        merge = self.table.merge_insert("memory_id").when_matched_update_all(where="target.version = source.version - 1")
        if inserts:
            merge = merge.when_not_matched_insert_all()  # without inserts, nothing can be revived
        result = lance.retry_conflicts(lambda: merge.execute(self._table_rows(rows)))  # idempotent: conditional
        self._committed()
        updated = int(result.num_updated_rows)
        if updated < len(updates) and int(result.num_inserted_rows) > 0:
            self._drop_revived(updates, int(result.version))
        return updated == len(updates)

    def _drop_revived(self, updates: dict[str, dict[str, Any]], version: int) -> None:
        """Delete the rows of ``updates`` that the merge committed as ``version``
        inserted: absent from the table just before it (read at ``version - 1``)."""
        ids = ", ".join(sql_str(m) for m in updates)
        try:
            before = self._db.open_table(self.table.name)
            before.checkout(version - 1)
            existed = {r["memory_id"] for r in self._rows(before, f"memory_id IN ({ids})")}
        except Exception as err:  # noqa: BLE001 - a version cleaned up meanwhile: report, do not fail the write
            log.warning("memory write: could not read table version %d to find revived rows (%s)", version - 1, err)
            return
        revived = [m for m in updates if m not in existed]
        if revived:
            log.warning("memory write: %d row(s) updated after they left the table were inserted again; deleting %s",
                        len(revived), revived)
            self.table.delete(" OR ".join(
                f"(memory_id = {sql_str(m)} AND version = {int(updates[m]['version']) + 1})" for m in revived))
            self._committed()
