"""The store's side of the judge: which pairs of a user's rows go before it, the rules'
certain verdicts, and applying a verdict (merge or supersede, never a delete without a copy)."""

from __future__ import annotations

import random
import time
from datetime import datetime, timezone

import numpy as np
import pyarrow as pa

from hermes.memory.judge import JudgePair, Verdict, change_marker
from hermes.memory.schema import (
    _JUDGED_SCHEMA,
    WriteConflict,
    _utc,
    check_id,
    sql_str,
    superseded_row,
)

JUDGE_NEIGHBOURS = 3
"""Neighbours of a new memory put before the judge at most (the closest first)."""


class MemoryJudging:
    """:class:`hermes.memory.store.MemoryStore`'s judge operations (mixed in; uses its tables
    and ``_absorb``)."""

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
                old = dict(superseded_row(older, newer["memory_id"], now), version=seen + 1)
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
                a = self._assess(older["text"], newer["text"], sim, bands)
                pair = JudgePair(older_id=older["memory_id"], newer_id=newer["memory_id"], similarity=round(sim, 4),
                                 fallback=a.verdict, never_same=a.never_same, reason=a.reason, two_things=a.two_things)
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
