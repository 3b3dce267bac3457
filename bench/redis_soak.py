"""Redis memory per active session over a long run: does it stay flat?

Sessions (quick: 3) each take turns (quick: 60) of a distinct ~1.3 KB user message on one
worker built by ``worker.build_worker`` with the scripted model, against a real Redis and
a durable store in a temporary folder. The sessions keep a small context (the last 4
messages whole, 2 turns of history, a summary every 5 turns), as a long session does with
the defaults after its first ~30 turns, and the content TTL is short
(``HERMES_REDIS_CONTENT_TTL_SECONDS``, quick: 3 s), standing in for the 7 days of a
long-lived deployment: blobs that left every session's context expire, those still in it
are refreshed by each model call's read. The event stream keeps 100 events
(``HERMES_EVENTS_MAX_PER_SESSION``; default 10,000) and the turn markers live as long as the
content (``HERMES_EVENTS_MARKER_TTL_SECONDS``; default a day), so both reach their bound
within the run.

Redis is measured by key family (``bench/_redis_usage.py``: ``MEMORY USAGE`` per key,
summed) after each of the 5 turns up to half of the run (past the first TTL and the stream
cap) and after each of the last 5; printed: the families, ``redis_bytes_per_session`` early and late, and last
``redis_bytes_per_session_ratio=late/early``: about 1 when flat (measured 0.85-1.25 run to
run); with ``--ttl-seconds 1000000`` (nothing expires within the run) 1.9: Redis grows with
the turns.

    python bench/redis_soak.py --quick
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # `python -m bench.redis_soak` too
import _common  # noqa: E402, I001 - also puts the repository on sys.path
from _redis_usage import redis_usage  # noqa: E402

SCRIPT: dict[str, Any] = {"turns": [{"match": ".", "steps": [{"reply": "Noted, {{ user | short }}"}]}],
                          "summary": "The user sent numbered notes."}
"""Every user message: one short reply; summaries: one fixed line."""
SAMPLES = 5
"""Measurements (one after each turn) averaged for the early and for the late figure: the
TTL and the stream's approximate trimming make a single one jitter by about 20%."""


def message_text(session: int, turn: int) -> str:
    """A distinct user message of about 1.3 KB (a new content blob each turn)."""
    return f"note {turn} of session {session}: " + " ".join(f"{uuid.uuid4().hex}" for _ in range(38))


async def main() -> None:
    p = _common.parser(__doc__.splitlines()[0])
    p.add_argument("--sessions", type=int, default=None)
    p.add_argument("--turns", type=int, default=None)
    p.add_argument("--ttl-seconds", type=int, default=None, help="the content TTL (quick: 3)")
    args = p.parse_args()
    sessions = args.sessions or (3 if args.quick else 10)
    turns = args.turns or (60 if args.quick else 200)
    ttl = args.ttl_seconds or (3 if args.quick else 10)
    early = max(1, turns // 2)

    from hermes.client import HermesClient
    from hermes.models import SessionConfig
    from hermes.providers.scripted import ScriptedModel
    from hermes.settings import Settings
    from worker import build_worker

    async with _common.bench_stack() as stack:
        with tempfile.TemporaryDirectory(prefix="hermes-redis-soak-") as tmp:
            task_queue = f"bench-redis-soak-{uuid.uuid4()}"
            settings = Settings(data_dir=stack.data_dir, redis_url=stack.redis_url, task_queue=task_queue, temporal_address="unused:0",
                                data_dir=Path(tmp), redis_content_ttl_seconds=ttl, memory_enabled=False,
                                events_max_per_session=100, events_marker_ttl_seconds=ttl)
            worker = build_worker(stack.client, settings, task_queue=task_queue, memory=False,
                                  provider=ScriptedModel.from_dict(SCRIPT, source="bench"), redis=stack.redis)
            config = SessionConfig(context_recent_messages=4, context_history_turns=2, summary_every_turns=5)
            hermes = HermesClient(stack.client, task_queue=task_queue, redis=stack.redis, config=config)
            tag = uuid.uuid4().hex[:8]
            ids = [f"soak-{tag}-{s}" for s in range(sessions)]
            measured: dict[str, Any] = {}
            started = time.monotonic()
            async with worker:
                for turn in range(1, turns + 1):
                    await asyncio.gather(*(hermes.send_message(sid, message_text(s, turn), user_id=f"user-{s}")
                                           for s, sid in enumerate(ids)))
                    if early - SAMPLES < turn <= early or turns - SAMPLES < turn:
                        measured.setdefault("early" if turn <= early else "late", []).append(await redis_usage(stack.redis))
            elapsed = time.monotonic() - started
    before, after = measured["early"][-1], measured["late"][-1]
    print(f"{sessions} sessions x {turns} turns in {elapsed:.1f} s; content TTL {ttl} s; "
          f"context: last 4 messages, 2 history turns, a summary every 5 turns")
    for name, usage, at in (("early", before, early), ("late", after, turns)):
        print(f"after turn {at} ({name}): used_memory={usage.used_memory_bytes} bytes")
        print(usage.table(sessions))
    early_bytes, late_bytes = (sum(u.per_session(sessions) for u in measured[k]) / len(measured[k]) for k in ("early", "late"))
    print(f"redis_bytes_per_session early (turns {early - SAMPLES + 1}-{early}, mean)={early_bytes:.0f}")
    print(f"redis_bytes_per_session late (turns {turns - SAMPLES + 1}-{turns}, mean)={late_bytes:.0f}")
    print(f"redis_bytes_per_session={late_bytes:.0f}")
    _common.headline("redis_bytes_per_session_ratio", f"{late_bytes / max(1.0, early_bytes):.2f}")


if __name__ == "__main__":
    _common.run(main)
