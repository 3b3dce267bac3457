"""What keeping notes durably costs: ``save_note`` and ``list_notes`` on the durable store.

The built-in note tools write to and read from the durable store (LanceDB, ``hermes.infra.durable``)
instead of a Redis list, so that a note confirmed as saved outlives a Redis loss. This
measures both tools as a worker runs them (one store object per process, opened once),
on a store that already holds notes of other users, including the background compaction
that runs every ``COMPACT_EVERY_WRITES`` writes. The LanceDB directory is a temporary one;
no server is needed (neither Temporal nor Redis is on this path).

    python bench/durable_notes.py [--quick]

Prints the median and p95 of each tool, and last ``save_note_p50_ms=``.
"""

from __future__ import annotations

import asyncio
import tempfile
import time

from _common import describe_ms, headline, parser, percentile, run

from hermes.infra.durable import DurableStore
from hermes.tools.builtin import list_notes, save_note
from hermes.tools.registry import ToolContext


async def main() -> None:
    args = parser(__doc__.splitlines()[0]).parse_args()
    users, saves, lists = (20, 200, 100) if args.quick else (200, 2000, 500)
    with tempfile.TemporaryDirectory(prefix="hermes-durable-") as tmp:
        store = DurableStore(tmp)
        started = time.perf_counter()
        await store.list("hermes_notes", owner="nobody")  # opens the connection and the table
        print(f"first use (import lancedb, open, create table): {time.perf_counter() - started:.2f} s")
        save_times: list[float] = []
        for n in range(saves):
            context = ToolContext(
                session_id=f"s{n % users}", user_id=f"user-{n % users}", tool_call_id=f"t{n}", turn=1, durable=store
            )
            t0 = time.perf_counter()
            result = await save_note(f"note {n}", "milk, 豆腐, 🍞 " * 5, context)
            save_times.append(time.perf_counter() - t0)
            assert result.message == "note saved", result
        list_times: list[float] = []
        for n in range(lists):
            context = ToolContext(session_id="s", user_id=f"user-{n % users}", tool_call_id="l", turn=1, durable=store)
            t0 = time.perf_counter()
            result = await list_notes(context, limit=20)
            list_times.append(time.perf_counter() - t0)
            assert result.data["count"] == min(20, saves // users), result
        await asyncio.gather(*list(store._background))  # the last compaction, before the directory goes
    print(f"store: {saves} notes of {users} users")
    print(f"save_note: {describe_ms(save_times)}")
    print(f"list_notes (limit 20): {describe_ms(list_times)}")
    print(f"list_notes_p95_ms={percentile(list_times, 0.95) * 1000:.1f}")
    headline("save_note_p50_ms", f"{percentile(save_times, 0.5) * 1000:.1f}")


if __name__ == "__main__":
    run(main)
