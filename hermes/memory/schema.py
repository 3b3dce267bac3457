"""The memory tables' names, Arrow schemas and errors, and the helpers every part of the
store uses to build filters: validated ids, quoted SQL literals, UTC timestamps."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

import pyarrow as pa

from hermes.errors import HermesError

MEMORY_TABLE = "memories"
ARCHIVE_TABLE = "memories_archive"
JUDGED_TABLE = "memories_judged"
"""One row per pair the judge decided (``older|newer``, the verdict, when): consolidation
does not put a pair before the model twice. A table of its own, so stores written before
it (issue 15) open unchanged."""
FORGOTTEN_TABLE = "memories_forgotten"
"""One row per user who asked to be forgotten, with when: a candidate said before that and
delivered after (a retried extraction) is refused."""
SCHEMA_VERSION = "1"
_META_MODEL = b"hermes.embedding_model"
_META_DIM = b"hermes.dim"
_META_SCHEMA = b"hermes.schema"

MAX_SOURCES = 32
"""Candidate ids kept per row (to recognise a retried write); the oldest drop off."""
_MAX_ID_CHARS = 512
_REEMBED_SUFFIX = "__reembed"


class MemoryStoreError(HermesError):
    """A memory operation the store refuses (a bad argument)."""


class EmbeddingModelMismatch(MemoryStoreError):
    """The rows were embedded by another model (or dimension) than the one configured:
    searching them would compare incomparable vectors. ``hermes memory reembed`` fixes it."""


class WriteConflict(MemoryStoreError):
    """Rows kept changing under a write for every attempt (the activity retries)."""


PINNED_SOURCES = frozenset({"remember", "cli"})
"""Sources of a memory the user asked to keep ("remember ...", ``hermes memory add``): such
an active row is never archived by age (only by ``valid_until``, a supersession or a
forget). ``api`` is not among them: a program writing through the client (an import) is
not a user's wish; it sends ``source="remember"`` for one."""


def check_id(value: str, what: str = "user_id") -> str:
    """``value`` if it is usable as an id: non-empty, at most 512 characters, no control
    characters. Any other character (quotes, SQL, emoji) is fine: filters quote it.

    Raises:
        MemoryStoreError: naming ``what`` and why.
    """
    if not isinstance(value, str) or not value:
        raise MemoryStoreError(f"{what} must be a non-empty string, got {value!r}")
    if len(value) > _MAX_ID_CHARS:
        raise MemoryStoreError(f"{what} is {len(value)} characters; at most {_MAX_ID_CHARS}")
    if any(ord(c) < 32 or ord(c) == 127 for c in value):
        raise MemoryStoreError(f"{what} contains control characters: {value[:80]!r}")
    if any(0xD800 <= ord(c) <= 0xDFFF for c in value):
        # Not encodable as UTF-8: LanceDB would fail with a UnicodeEncodeError, not refuse.
        raise MemoryStoreError(f"{what} contains lone surrogates: {value[:80]!r}")
    return value


def superseded_row(row: dict[str, Any], by: str, now: datetime) -> dict[str, Any]:
    """A copy of ``row`` as a memory replaced by the row ``by``: status ``superseded``,
    linked to its replacement, with half its confidence, changed at ``now`` (seed 002 §6.3:
    the old value stays, never a silent delete). The version is the caller's."""
    return dict(row, status="superseded", superseded_by=by, confidence=round(float(row["confidence"]) * 0.5, 4),
                updated_at=now)


def sql_str(value: str) -> str:
    """A SQL string literal for ``value`` (single quotes doubled; DataFusion's rule)."""
    return "'" + value.replace("'", "''") + "'"


def sql_time(value: datetime) -> str:
    """A UTC timestamp literal for LanceDB filters."""
    value = value.astimezone(timezone.utc) if value.tzinfo else value.replace(tzinfo=timezone.utc)
    return f"TIMESTAMP '{value.strftime('%Y-%m-%dT%H:%M:%S.%f')}'"


def _utc(value: datetime | None) -> datetime | None:
    if value is None:
        return None
    return value.replace(tzinfo=timezone.utc) if value.tzinfo is None else value.astimezone(timezone.utc)


_JUDGED_SCHEMA = pa.schema(
    [
        pa.field("user_id", pa.string(), nullable=False),
        pa.field("pair", pa.string(), nullable=False),
        pa.field("verdict", pa.string(), nullable=False),
        pa.field("judged_at", pa.timestamp("us", tz="UTC")),
    ]
)
_FORGOTTEN_SCHEMA = pa.schema(
    [pa.field("user_id", pa.string(), nullable=False), pa.field("forgotten_at", pa.timestamp("us", tz="UTC"))]
)


def _schema(dim: int, model_id: str) -> pa.Schema:
    ts = pa.timestamp("us", tz="UTC")
    return pa.schema(
        [
            pa.field("memory_id", pa.string(), nullable=False),
            pa.field("user_id", pa.string(), nullable=False),
            pa.field("kind", pa.string(), nullable=False),
            pa.field("subject", pa.string()),
            pa.field("value", pa.string()),
            pa.field("text", pa.string(), nullable=False),
            pa.field("vector", pa.list_(pa.float32(), dim)),
            pa.field("embedding_model", pa.string(), nullable=False),
            pa.field("importance", pa.float32()),
            pa.field("confidence", pa.float32()),
            pa.field("source", pa.string()),
            pa.field("source_session", pa.string()),
            pa.field("source_turn", pa.int64()),
            pa.field("created_at", ts),
            pa.field("updated_at", ts),
            pa.field("last_hit_at", ts),
            pa.field("hit_count", pa.int64()),
            pa.field("mentions", pa.int64()),
            pa.field("sources", pa.list_(pa.string())),
            pa.field("valid_until", ts),
            pa.field("superseded_by", pa.string()),
            pa.field("status", pa.string(), nullable=False),
            pa.field("version", pa.int64()),
        ],
        metadata={_META_MODEL: model_id.encode(), _META_DIM: str(dim).encode(), _META_SCHEMA: SCHEMA_VERSION.encode()},
    )
