"""Loops of Redis calls that only a cancel ends do end when cancelled.

redis-py can swallow a cancel that lands as a command's reply arrives: the command
returns and the task runs on as if never cancelled (redis/redis-py#2028). A loop that
only a cancel ends then ran forever: ``hermes send`` hung after its reply on its turn
event follower (CI), and a tool call's running-lease renewal would have held the call's
end, and its lease, for as long as the worker lived. Each loop here is cancelled at
random moments against the fixtures' real Redis; before the fix some rounds hung.
"""

from __future__ import annotations

import asyncio
import random

from activities.call_lease import RunningLease, running_lease_key
from hermes.content.events import START, EventLog, TurnEvent
from hermes.sessions.live_view import TurnFollower, TurnView
from tests.support import eventually


CANCEL_ROUNDS = 150
"""Cancels of a follower at random moments. redis-py swallowed about 1 cancel in 30 of
these (redis/redis-py#2028), so a follower that relied on the cancel alone hung here
with near certainty."""


async def test_a_follower_cancelled_at_any_moment_of_its_reads_ends(redis, session_id):
    log = EventLog(redis)
    await log.publish([TurnEvent(type="warning", session_id=session_id, turn=1, data={"text": "before"})])
    rng = random.Random(20261205)

    async def follow() -> None:
        async for _batch in log.follow(session_id, START, poll_ms=10):
            pass

    hung = []
    for i in range(CANCEL_ROUNDS):
        task = asyncio.ensure_future(follow())
        await asyncio.sleep(rng.uniform(0.0, 0.05))
        task.cancel()
        done, _ = await asyncio.wait({task}, timeout=2.0)
        if not done:
            hung.append(i)
            task.cancel()  # the loop reads again: this cancel may land in a read that ends normally
            await asyncio.wait({task}, timeout=2.0)
        else:
            assert task.cancelled()
    assert hung == [], f"{len(hung)} of {CANCEL_ROUNDS} cancelled followers kept reading"

    # The CLI's follower (hermes send, hermes chat) stops within a read, and its reads
    # are real ones: what is published while it runs reaches its view.
    seen: list[str] = []

    class View(TurnView):
        def text(self, step: int, text: str) -> None:
            seen.append(text)

    hermes = type("Hermes", (), {"events": log})()
    for i in range(CANCEL_ROUNDS // 3):
        follower = TurnFollower(hermes, session_id, View(), await log.last_offset(session_id), set(), set())  # type: ignore[arg-type]
        await log.publish([TurnEvent(type="text_delta", session_id=session_id, turn=1, step=1, data={"text": f"t{i}"})])
        wanted = f"t{i}"

        async def shown(wanted: str = wanted) -> bool:
            return wanted in seen

        await eventually(shown, what=f"the view to get {wanted!r}", timeout_seconds=5.0, poll_seconds=0.01)
        await asyncio.sleep(rng.uniform(0.0, 0.25))
        await asyncio.wait_for(follower.stop(), 1.0)
        assert follower.task.done()
    assert seen == [f"t{i}" for i in range(CANCEL_ROUNDS // 3)]


LEASE_ROUNDS = 600
"""Cancels of a lease renewal within its first SET. Before the fix about 1 in 75 hung."""


async def test_a_running_lease_cancelled_at_any_moment_stops_renewing_and_is_dropped(redis, session_id):
    rng = random.Random(31)
    hung = []
    for i in range(LEASE_ROUNDS):
        key = f"hermes:toolcall:{session_id}:{i}"
        task = asyncio.ensure_future(RunningLease(redis, key).hold())
        await asyncio.sleep(rng.uniform(0.0, 0.002))
        task.cancel()
        done, _ = await asyncio.wait({task}, timeout=3.0)
        if not done:
            hung.append(i)
            task.cancel()
            await asyncio.wait({task}, timeout=3.0)
    assert hung == [], f"{len(hung)} of {LEASE_ROUNDS} cancelled lease renewals kept renewing"
    held = [i for i in range(LEASE_ROUNDS) if await redis.exists(running_lease_key(f"hermes:toolcall:{session_id}:{i}"))]
    assert held == []  # each stopped renewal dropped its lease


async def test_a_follower_in_a_task_that_handled_an_earlier_cancel_reads_on(redis, session_id):
    """Only a cancel asked during a read ends the loop: a task whose Python 3.11
    ``TaskGroup`` cancelled it and left ``cancelling()`` at 1 (a child failed after the
    group's body; handled) still follows the events it asks for."""
    log = EventLog(redis)
    await log.publish([TurnEvent(type="warning", session_id=session_id, turn=1, data={"text": "first"})])

    async def boom() -> None:
        await asyncio.sleep(0.01)
        raise ValueError("a child failed")

    try:
        async with asyncio.TaskGroup() as group:
            group.create_task(boom())
    except* ValueError:
        pass
    current = asyncio.current_task()
    assert current is not None and current.cancelling() == 1  # what the TaskGroup left
    await log.publish([TurnEvent(type="warning", session_id=session_id, turn=1, data={"text": "second"})])
    texts = []
    async for batch in log.follow(session_id, START, poll_ms=10):
        texts += [event.data["text"] for event in batch]
        if "second" in texts:
            break
    assert texts == ["first", "second"]
    current.uncancel()
