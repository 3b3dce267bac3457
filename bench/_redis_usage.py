"""What Redis holds, by key family: reused by ``redis_soak.py`` and ``scale.py`` for
``redis_bytes_per_session``.

A key family is the key's second segment (``hermes:blob:m:...`` -> ``blob``,
``hermes:events:<session>`` -> ``events``); bytes are ``MEMORY USAGE`` per key (the key,
its value and Redis' overhead), summed. ``INFO memory``'s ``used_memory`` is given too (the
whole server, allocator and buffers included). With a ``redis.asyncio.RedisCluster``,
``scan_iter`` visits every primary and the pipeline routes each single-key command to its
node.

    usage = await redis_usage(redis)
    usage.total_bytes / active_sessions   # redis_bytes_per_session
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

_BATCH = 500
"""Keys per pipeline of ``MEMORY USAGE``."""


def family_of(key: str) -> str:
    """The family of ``key``: ``hermes:<family>:...`` -> ``<family>``; another key: ``other``."""
    parts = key.split(":", 2)
    return parts[1] if len(parts) >= 2 and parts[0] == "hermes" else "other"


@dataclass
class RedisUsage:
    """A measurement of what Redis holds."""

    used_memory_bytes: int
    """``INFO memory`` ``used_memory`` (summed over the nodes of a cluster)."""
    keys: dict[str, int] = field(default_factory=dict)
    """Family -> number of keys."""
    bytes: dict[str, int] = field(default_factory=dict)
    """Family -> ``MEMORY USAGE`` bytes summed over its keys."""

    @property
    def total_bytes(self) -> int:
        """``MEMORY USAGE`` bytes of every key measured."""
        return sum(self.bytes.values())

    def per_session(self, sessions: int) -> float:
        """``redis_bytes_per_session``: :attr:`total_bytes` over ``sessions`` (at least 1)."""
        return self.total_bytes / max(1, sessions)

    def table(self, sessions: int) -> str:
        """One line per family: keys, bytes, bytes per session."""
        rows = [f"  {'family':<20}{'keys':>8}{'bytes':>12}{'bytes/session':>15}"]
        for name in sorted(self.bytes, key=lambda f: -self.bytes[f]):
            rows.append(f"  {name:<20}{self.keys[name]:>8}{self.bytes[name]:>12}{self.bytes[name] / max(1, sessions):>15.0f}")
        return "\n".join(rows)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


async def redis_usage(redis: Any, *, match: str = "hermes:*") -> RedisUsage:
    """Measure the keys matching ``match`` by family, and the server's ``used_memory``.

    Args:
        redis: a ``redis.asyncio.Redis`` or ``RedisCluster``.
        match: a ``SCAN MATCH`` pattern.

    Returns:
        The measurement. A key that expires between ``SCAN`` and ``MEMORY USAGE`` counts 0.

    Raises:
        redis.RedisError: Redis cannot be read.
    """
    info = await redis.info("memory")
    if isinstance(info, dict) and "used_memory" not in info:  # a cluster: node -> section
        used = sum(int(node.get("used_memory", 0)) for node in info.values() if isinstance(node, dict))
    else:
        used = int(info["used_memory"])
    usage = RedisUsage(used_memory_bytes=used)
    batch: list[str] = []

    async def measure() -> None:
        pipe = redis.pipeline(transaction=False)
        for key in batch:
            pipe.memory_usage(key)
        for key, size in zip(batch, await pipe.execute()):
            family = family_of(key)
            usage.keys[family] = usage.keys.get(family, 0) + 1
            usage.bytes[family] = usage.bytes.get(family, 0) + int(size or 0)
        batch.clear()

    async for key in redis.scan_iter(match=match, count=1000):
        batch.append(_text(key))
        if len(batch) >= _BATCH:
            await measure()
    if batch:
        await measure()
    return usage
