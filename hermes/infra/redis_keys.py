"""Every Redis key whose name matters to a multi-key operation, in one place, and the
helpers that keep those operations inside one Redis Cluster hash slot.

Redis Cluster refuses a command or a MULTI whose keys hash to different slots
(``CROSSSLOT``). A key's slot is the CRC16 of its hash tag (the part between the first
``{`` and the next ``}``) or of the whole name, so keys that one operation touches carry
the same tag (https://redis.io/docs/latest/operate/oss_and_stack/reference/cluster-spec/,
"Hash tags"):

- the session index: a user's row of each session and the user's sorted set are tagged
  with the user (``hermes:session:{<user>}:<session>``, ``hermes:user_sessions:{<user>}``),
  so the upsert (MULTI over both) and the listing (MGET of the user's rows) stay in the
  user's slot;
- the approval audit: the per-session hashes and the index of all entries share the tag
  ``{hermes:audit}`` (the upsert is a MULTI over a session's hash and the index), so the
  audit lives on one node; approvals are rare, that is small;
- a model step's lease and recorded result (``hermes:model_step:{<step>}:lease`` and
  ``:result``) share the step's tag: one script reads the result or takes the lease,
  another records the result and gives the lease up;
- content-store bodies (``hermes:blob:<ref>``) are keyed by the content's hash and shared
  by every session that holds the same text, so no tag can group them; reads of several
  go through :func:`mget`, which splits them by slot on a cluster.

Every other key is read and written one at a time (turn-event streams and their step
markers are separate commands in a non-transactional pipeline, which a cluster client
sends to each key's node). ``tests/test_redis_cluster.py`` checks that the keys of each
multi-key operation here hash to one slot, so a new key cannot bring ``CROSSSLOT`` back.

Renamed keys (the index and the audit, before Redis Cluster support): the session index
rebuilds itself from Temporal when a user's listing finds no rows
(:func:`hermes.sessions.index.rebuild_index`), and audit reads also read the old names
(:data:`LEGACY_AUDIT_INDEX_KEY`, :func:`legacy_audit_session_key`).
"""

from __future__ import annotations

import hashlib
from typing import Any

__all__ = [
    "AUDIT_INDEX_KEY",
    "LEGACY_AUDIT_INDEX_KEY",
    "audit_session_key",
    "hash_tag",
    "index_row_key",
    "index_user_key",
    "is_cluster",
    "legacy_audit_session_key",
    "mget",
    "model_step_key",
    "MULTI_KEY_OPERATIONS",
]

AUDIT_TAG = "{hermes:audit}"
AUDIT_INDEX_KEY = f"{AUDIT_TAG}:approvals"
"""Sorted set of every approval audit entry (``<session>|<entry>`` scored by time)."""
LEGACY_AUDIT_INDEX_KEY = "hermes:audit:approvals"
"""The index's name before hash tags; read, never written."""


def hash_tag(value: str) -> str:
    """``value`` as a Redis Cluster hash tag (``{value}``). A value that is empty or holds a
    ``}`` (which would end the tag early or make it empty, so the whole name would be
    hashed) is replaced by its SHA-256 prefix, the same for the same value.

    Args:
        value: the entity the keys share (a user id, a session id).

    Returns:
        ``"{...}"``, safe to embed in a key name.
    """
    if not value or "{" in value or "}" in value:
        value = "h" + hashlib.sha256(value.encode("utf-8", "surrogatepass")).hexdigest()[:24]
    return "{" + value + "}"


def index_row_key(user_id: str, session_id: str) -> str:
    """The session index row (JSON) of ``session_id``, in its user's slot."""
    return f"hermes:session:{hash_tag(user_id)}:{session_id}"


def index_user_key(user_id: str) -> str:
    """The user's sorted set of session ids, scored by last activity (epoch seconds)."""
    return f"hermes:user_sessions:{hash_tag(user_id)}"


def audit_session_key(session_id: str) -> str:
    """The hash of one session's approval audit entries (entry id -> JSON)."""
    return f"{AUDIT_TAG}:approval:{session_id}"


def legacy_audit_session_key(session_id: str) -> str:
    """The per-session audit hash's name before hash tags; read, never written."""
    return f"hermes:audit:approval:{session_id}"


def model_step_key(name: str) -> str:
    """The Redis name (without ``:lease``/``:result``) of the model step ``name``
    (``<session>:<run>:<turn>:<step>:<purpose>:<digest>``, never empty), the whole name as
    its hash tag (a ``}`` in it is dropped, so the tag cannot end early)."""
    return "hermes:model_step:{" + name.replace("}", "") + "}"


def is_cluster(redis: Any) -> bool:
    """Whether ``redis`` is a ``redis.asyncio.RedisCluster`` (its commands route by slot)."""
    from redis.asyncio.cluster import RedisCluster

    return isinstance(redis, RedisCluster)


async def mget(redis: Any, keys: list[str]) -> list[Any]:
    """``MGET keys``, in order; on a cluster split into one MGET per slot (not atomic
    across slots, which no caller needs: each value stands alone).

    Args:
        redis: a ``redis.asyncio.Redis`` or ``redis.asyncio.RedisCluster``.
        keys: the names.

    Returns:
        One value (bytes) or None per key.

    Raises:
        redis.RedisError: Redis cannot be read.
    """
    if not keys:
        return []
    if is_cluster(redis):
        return list(await redis.mget_nonatomic(keys))
    return list(await redis.mget(keys))


MULTI_KEY_OPERATIONS: dict[str, Any] = {
    "session index upsert (MULTI) and listing (MGET)": lambda entity, other: [
        index_user_key(entity), index_row_key(entity, other), index_row_key(entity, other + "-2")
    ],
    "approval audit upsert (MULTI)": lambda entity, other: [audit_session_key(entity), AUDIT_INDEX_KEY],
    "model step read-or-claim and record-and-release (EVAL)": lambda entity, other: [
        model_step_key(f"{entity}:{other}:3:1:reply:0f") + suffix for suffix in (":lease", ":result")
    ],
}
"""Each operation that sends several keys in one command or MULTI, as ``(entity, other) ->
keys`` for any two ids (a user and a session, two sessions): they must share one slot
(checked by ``tests/test_redis_cluster.py``). A new multi-key operation is added here."""
