"""Forgetting: by age (:func:`archive_age_days`, consolidation's clock) and on request
(:meth:`MemoryForgetting.forget_user`, with the mark that refuses late candidates)."""

from __future__ import annotations

import math
from datetime import datetime, timezone
from typing import Any

import pyarrow as pa

from hermes.infra import lance
from hermes.memory.schema import (
    _FORGOTTEN_SCHEMA,
    FORGOTTEN_TABLE,
    PINNED_SOURCES,
    _utc,
    check_id,
    sql_str,
)

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


class MemoryForgetting:
    """:class:`hermes.memory.store.MemoryStore`'s forget operations (mixed in; uses its tables)."""

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

    def _forgotten(self) -> Any:
        if self._forgotten_table is None:
            self._forgotten_table = lance.open_table(self._db, FORGOTTEN_TABLE, _FORGOTTEN_SCHEMA)
        return self._forgotten_table
