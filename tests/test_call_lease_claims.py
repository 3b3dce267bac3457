"""Claims that race, answers that are lost, a holder that finishes between a waiter's two
reads, Redis down: a non-idempotent call still runs once, its result is never reported
"unknown" when it was produced, and a call that never ran is never reported "unknown"
(each found by a second break-it review of the two-round-trip claim, issue 31)."""

from __future__ import annotations

import asyncio

import pytest

from activities.call_lease import RunningLease, running_lease_key
from activities.tools import idempotency_key
from hermes.models import ToolResultCode
from tests.test_call_lease import _answer_lost_once, _slow_charge, _started, _tools

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize("with_ledger", [True, False])
async def test_two_attempts_claiming_at_the_same_moment_run_the_call_once_and_both_get_its_result(
    redis, tmp_path, with_ledger
):
    """Attempt 1 (late heartbeat, still on its worker) and attempt 2 claim at the same
    moment: one is granted the claim and the lease together (one script), the other sees
    that lease and waits for its result (a pipeline of the two let a refused attempt take
    the lease for an instant: both reported "outcome unknown" and the tool never ran)."""
    runs: list[int] = []
    release = asyncio.Event()
    tools, request = _tools(redis, tmp_path if with_ledger else None, _slow_charge(runs, release))
    b = asyncio.ensure_future(tools.run_tool(request))
    c = asyncio.ensure_future(tools.run_tool(request))
    await asyncio.sleep(0.3)
    release.set()
    one, two = await asyncio.wait_for(asyncio.gather(b, c), 30)
    assert runs == [500]
    assert (one.code, two.code, one.data, two.data) == (ToolResultCode.OK, ToolResultCode.OK, "charged 500", "charged 500")


async def test_a_claim_whose_answer_was_lost_with_redis_alone_is_not_unknown_for_a_call_never_run(redis, monkeypatch):
    """Redis alone (no durable store, accepted by the code). The claim pipeline ran in Redis
    but its answer was lost (a socket timeout on a busy loop, a reset connection): the
    attempt fails (no ledger to fall back on) and Temporal retries. The attempt takes back
    its lease and its "started" record, so the retry runs the call (left, it found
    "started", no lease, and reported "outcome unknown" for a call that never ran)."""
    runs: list[int] = []
    release = asyncio.Event()
    release.set()
    tools, request = _tools(redis, None, _slow_charge(runs, release))
    _answer_lost_once(monkeypatch)
    with pytest.raises(Exception):
        await tools.run_tool(request)  # attempt 1 fails: Temporal retries it
    monkeypatch.undo()
    assert runs == []
    two = await asyncio.wait_for(tools.run_tool(request), 20)
    assert two.code != ToolResultCode.OUTCOME_UNKNOWN, f"never ran, yet: {two.message}"
    assert runs == [500]


async def test_a_waiter_that_reads_the_record_just_before_the_holder_finishes_gets_its_result_with_redis_alone(
    redis, monkeypatch
):
    """Redis alone. Attempt 2 waits for live attempt 1 (_await_earlier_attempt): it reads the
    record ("started"), then, in a second round trip, the lease. Attempt 1 finishes between
    the two (its record "done" and the lease's drop in one pipeline): attempt 2 reads the
    record again and returns the result (it reported "outcome unknown", and that record
    overwrote the "done" one)."""
    runs: list[int] = []
    release = asyncio.Event()
    tools, request = _tools(redis, None, _slow_charge(runs, release))
    first = asyncio.ensure_future(tools.run_tool(request))
    await _started(runs)
    real = RunningLease.held_by_another
    polls: list[int] = []

    async def held_by_another(self: RunningLease) -> bool:
        polls.append(1)
        if len(polls) == 2:  # attempt 1 finishes between attempt 2's two reads
            release.set()
            await first
        return await real(self)

    monkeypatch.setattr(RunningLease, "held_by_another", held_by_another)
    two = await asyncio.wait_for(tools.run_tool(request), 20)
    assert runs == [500] and (await first).data == "charged 500"
    monkeypatch.setattr(RunningLease, "held_by_another", real)
    three = await asyncio.wait_for(tools.run_tool(request), 20)  # attempt 2's "unknown" overwrote the "done" record
    assert (two.code, three.code) == (ToolResultCode.OK, ToolResultCode.OK), (
        f"attempt 1 returned 'charged 500', yet attempt 2 says {two.code.name}, and attempt 3 {three.code.name}")



async def test_redis_down_leaves_no_unretrieved_lease_drop_behind(tmp_path):
    """Redis unreachable: the durable ledger claims alone (documented). The failed claim's
    undo of what it may have set is bounded and awaited, never left running in the
    background to end in an exception no one retrieves (asyncio's "Task exception was
    never retrieved" for every non-idempotent call while Redis is down)."""
    import gc

    from redis.asyncio import Redis

    from tests.test_call_lease import _charging

    loop = asyncio.get_running_loop()
    unhandled: list[dict] = []
    loop.set_exception_handler(lambda _loop, context: unhandled.append(context))
    down = Redis(host="127.0.0.1", port=1, socket_connect_timeout=0.5)
    runs: list[int] = []
    tools, request = _tools(down, tmp_path, _charging(runs))
    tools.events = None
    result = await tools.run_tool(request)
    assert result.data == "charged 500" and runs == [500]
    await asyncio.sleep(6)  # the shielded drop gives up
    gc.collect()
    await asyncio.sleep(0)
    assert not unhandled, [c.get("message") for c in unhandled]
