"""Token usage per user and UTC day, for the daily token budget (issue 17).

The session workflow enforces the budgets (``SessionConfig.token_budget``,
``user_daily_token_budget``) from the usage every model activity returns. A user's day
spans sessions, so the model activities add each call's tokens to a Redis hash per user
and day, ``hermes:usage:<user>:<YYYY-MM-DD>``: one field per model call (its workflow run
and activity id, so a retried activity is counted once) and ``total``. The hash lives
:data:`USAGE_TTL_SECONDS` (three days) after its last write. Losing Redis loses the day's
count (the budget then starts again from the calls after it), never a turn.
"""

from __future__ import annotations

import logging
import uuid
from typing import Any

log = logging.getLogger("hermes.usage")

USAGE_KEY = "hermes:usage:{user}:{day}"
USAGE_TTL_SECONDS = 3 * 24 * 3600
_TOTAL = "total"

_RECORD = """
if redis.call('HSETNX', KEYS[1], ARGV[1], ARGV[2]) == 1 then
  redis.call('HINCRBY', KEYS[1], 'total', ARGV[2])
end
redis.call('EXPIRE', KEYS[1], ARGV[3])
return tonumber(redis.call('HGET', KEYS[1], 'total') or '0')
"""
"""Add a call's tokens once (its field is set only if new), then answer the day's total."""


async def record(redis: Any, user_id: str, day: str, call_id: str, tokens: int) -> int:
    """Count ``tokens`` of the model call ``call_id`` for ``user_id`` on ``day`` (once,
    however often it is recorded) and return the user's total for that day.

    Args:
        redis: a ``redis.asyncio.Redis``.
        user_id: the session's user.
        day: the UTC day, ``YYYY-MM-DD`` (from workflow time).
        call_id: the call's identity (workflow run id and activity id).
        tokens: prompt + completion tokens of the call (>= 0).

    Returns:
        The user's tokens that day, this call included.

    Raises:
        redis.RedisError: Redis did not answer.
    """
    key = USAGE_KEY.format(user=user_id, day=day)
    return int(await redis.eval(_RECORD, 1, key, call_id, max(0, int(tokens)), USAGE_TTL_SECONDS))


async def record_for_activity(redis: Any, user_id: str | None, day: str | None, tokens: int) -> int | None:
    """:func:`record` for the model call of the running activity (its workflow run and
    activity id: its retries count once; outside an activity, a one-off id), and the user's
    total that day.

    Returns:
        The total; None when no daily budget applies (no user, no day or no Redis) or
        Redis did not answer (logged: the session then goes by the last total it had).
    """
    if not user_id or not day or redis is None:
        return None
    from temporalio import activity

    try:
        info = activity.info()
        call_id = f"{info.workflow_run_id}:{info.activity_id}"
    except RuntimeError:  # called outside an activity (tests, tools): no retry to fold
        call_id = f"local:{uuid.uuid4().hex}"
    try:
        return await record(redis, user_id, day, call_id, tokens)
    except Exception as err:  # noqa: BLE001 - the reply matters more than the count
        log.warning("token usage of %s on %s not counted (%s); the daily budget goes by the last total", user_id, day, err)
        return None


async def day_total(redis: Any, user_id: str, day: str) -> int:
    """The user's tokens on ``day`` so far (0 when nothing is counted)."""
    value = await redis.hget(USAGE_KEY.format(user=user_id, day=day), _TOTAL)
    return int(value or 0)
