"""The Redis session index: read and write sides, and the rebuild from Temporal.

Layout (:mod:`hermes.infra.redis_keys`): ``hermes:session:{<user>}:<session>`` a JSON row;
``hermes:user_sessions:{<user>}`` a sorted set of session ids scored by last activity
(epoch seconds); both in the user's Redis Cluster slot. Temporal stays
the source of truth: with Redis flushed, :func:`rebuild_index` lists the session
workflows by their ``HermesUserId`` search attribute and writes the rows again.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

from hermes import names
from hermes.infra.redis_keys import index_row_key, index_user_key, mget
from hermes.models import SessionIndexEntry, SessionState
from hermes.security import encryption


async def write_entry(redis: Any, entry: SessionIndexEntry) -> None:
    """Upsert one row and its place in the user's list, atomically (``MULTI``). With
    encryption on (:func:`hermes.security.encryption.active`) the row is sealed: its title
    is the session's first message."""
    async with redis.pipeline(transaction=True) as pipe:
        queue_entry(pipe, entry)
        await pipe.execute()


def queue_entry(pipe: Any, entry: SessionIndexEntry) -> int:
    """Queue :func:`write_entry`'s two writes on ``pipe`` (a pipeline of the same client;
    non-transactional, it may carry other writes: then the row and its place land apart
    if Redis fails between them, which the session's next write mends). Returns how many
    commands were queued (their answers come first)."""
    pipe.set(index_row_key(entry.user_id, entry.session_id), encryption.seal(entry.model_dump_json()))
    pipe.zadd(index_user_key(entry.user_id), {entry.session_id: entry.last_active_at.timestamp()})
    return 2


async def list_entries(redis: Any, user_id: str, *, limit: int = 50) -> list[SessionIndexEntry]:
    """The user's sessions, most recently active first."""
    ids = await redis.zrevrange(index_user_key(user_id), 0, limit - 1)
    if not ids:
        return []
    rows = await mget(redis, [index_row_key(user_id, i.decode() if isinstance(i, bytes) else i) for i in ids])
    return [SessionIndexEntry.model_validate_json(r) for r in _opened_rows(rows)]


def _opened_rows(rows: list[Any]) -> list[str]:
    """The rows as JSON, sealed ones opened; one this process cannot open (no key ring or
    a key no longer configured) is left out (the session's next turn writes it again)."""
    out = []
    for raw in rows:
        if not raw:
            continue
        try:
            out.append(encryption.open_sealed(raw.decode() if isinstance(raw, bytes) else raw))
        except Exception:  # noqa: BLE001 - an unknown key or altered data: not listed
            continue
    return out


async def _query_state(client: Any, session_id: str) -> SessionState | None:
    """The session's own state (turns, last activity), if a worker answers in time."""
    try:
        return await client.get_workflow_handle(session_id).query(
            names.GET_STATE, result_type=SessionState, rpc_timeout=timedelta(seconds=2)
        )
    except Exception:  # noqa: BLE001 - no worker, or an old run: fall back to visibility
        return None


def sessions_query(*conditions: str, user_id: str | None = None) -> str:
    """A Temporal visibility query for session workflows, with ``conditions`` (ANDed) and,
    when given, only ``user_id``'s sessions (quotes and backslashes in it escaped, so a
    user id cannot widen the query)."""
    parts = [f"WorkflowType = '{names.SESSION_WORKFLOW}'", *conditions]
    if user_id is not None:
        escaped = user_id.replace("\\", "\\\\").replace("'", "\\'")
        parts.append(f"{names.SA_USER_ID.name} = '{escaped}'")
    return " AND ".join(parts)


async def rebuild_index(client: Any, redis: Any, user_id: str | None = None, *, limit: int = 1000) -> int:
    """Write index rows for session workflows found in Temporal visibility that the
    index lacks. Rows already present are left alone: they are fresher than what
    visibility knows (turn count, last activity).

    Args:
        client: a ``temporalio.client.Client``.
        redis: a ``redis.asyncio.Redis``.
        user_id: only this user's sessions, or all users'.
        limit: at most this many workflow executions are read.

    Returns:
        How many rows were written.
    """
    query = sessions_query(user_id=user_id)
    written = 0
    seen: set[str] = set()
    async for wf in client.list_workflows(query, limit=limit):
        if wf.id in seen:
            continue  # runs of one session (continue-as-new); the newest comes first
        seen.add(wf.id)
        sa = wf.typed_search_attributes
        uid = sa.get(names.SA_USER_ID)
        if uid is None or await redis.exists(index_row_key(uid, wf.id)):
            continue
        running = wf.status is not None and wf.status.name == "RUNNING"
        if running:
            state = await _query_state(client, wf.id)
            if state is not None:
                await write_entry(redis, SessionIndexEntry.from_state(state))
                written += 1
                continue
        status = "active" if running else "closed"
        started = wf.start_time or datetime.now(timezone.utc)
        entry = SessionIndexEntry(
            session_id=wf.id,
            user_id=uid,
            channel=sa.get(names.SA_CHANNEL) or "",
            status=status,
            title=await wf.memo_value(names.MEMO_TITLE, ""),
            created_at=started,
            last_active_at=wf.close_time or started,
        )
        await write_entry(redis, entry)
        written += 1
    return written
