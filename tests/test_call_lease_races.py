"""Races around a non-idempotent tool call's running lease (issue 31), each found by a
break-it review of the two-round-trip claim (``activities/call_lease.py``) and kept as a
test: Redis losing the record of a call that still runs, a refused attempt's drop racing
a live holder's renewal, a claim whose answer was lost, a claim the client sent twice."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from activities.call_lease import running_lease_key
from activities.tools import idempotency_key
from hermes.models import ToolResultCode
from hermes.security import encryption
from tests.test_call_lease import _answer_lost_once, _sent_twice_once, _slow_charge, _started, _tools
from tests.test_sealed_at_rest import KEYS

pytestmark = pytest.mark.timeout(60)


async def test_a_record_evicted_while_its_call_runs_makes_a_later_attempt_wait_for_its_result(redis, tmp_path):
    """Redis evicted the call's record (LRU: the 30-day record is touched once, the lease
    every 2 s) while attempt 1 runs on a live worker holding its lease. Attempt 2's claim
    is granted but its lease is NOT taken (attempt 1 holds it): a live attempt is running.
    It should wait for attempt 1's result, not report "outcome unknown"."""
    runs: list[int] = []
    release = asyncio.Event()
    tools, request = _tools(redis, tmp_path, _slow_charge(runs, release))
    key = idempotency_key(request.call_key)
    first = asyncio.ensure_future(tools.run_tool(request))
    await _started(runs)
    assert await redis.exists(running_lease_key(key))
    await redis.delete(key)  # evicted; the lease lives
    second = asyncio.ensure_future(tools.run_tool(request))
    await asyncio.sleep(0.5)
    release.set()
    one, two = await asyncio.wait_for(asyncio.gather(first, second), 15)
    assert runs == [500]
    assert one.data == "charged 500"
    assert two.code != ToolResultCode.OUTCOME_UNKNOWN, f"live attempt 1 holds the lease, yet attempt 2 says: {two.message}"
    assert two.data == "charged 500"


async def test_a_record_evicted_while_its_call_runs_never_runs_it_twice_with_redis_alone(redis):
    """Same, with Redis alone (no durable store, which the code accepts): attempt 2's
    claim is granted but another attempt holds the running lease, so it must not run the
    tool (a version that took the lease over ran it twice)."""
    runs: list[int] = []
    release = asyncio.Event()
    tools, request = _tools(redis, None, _slow_charge(runs, release))
    key = idempotency_key(request.call_key)
    first = asyncio.ensure_future(tools.run_tool(request))
    await _started(runs)
    await redis.delete(key)  # evicted; the lease lives
    second = asyncio.ensure_future(tools.run_tool(request))
    await asyncio.sleep(0.5)
    release.set()
    await asyncio.wait_for(asyncio.gather(first, second), 15)
    assert runs == [500], f"ran {len(runs)} times although a live attempt held the running lease"


async def test_a_refused_attempt_never_touches_a_live_holders_lease(redis, tmp_path):
    """Attempt 1 runs; its lease lapsed for a moment (its loop starved past 10 s). Attempt
    2's claim is refused and leaves the lease alone (a version that took the absent lease
    and dropped it deleted attempt 1's renewal landing meanwhile), so attempt 1's renewal
    stands; the tool runs once."""
    runs: list[int] = []
    release = asyncio.Event()
    tools, request = _tools(redis, tmp_path, _slow_charge(runs, release))
    key = idempotency_key(request.call_key)
    lease_key = running_lease_key(key)
    first = asyncio.ensure_future(tools.run_tool(request))
    await _started(runs)
    token_1 = await redis.get(lease_key)
    await redis.delete(lease_key)  # lapsed while attempt 1's loop was starved
    second = asyncio.ensure_future(tools.run_tool(request))
    await asyncio.sleep(0.05)
    assert await redis.get(lease_key) is None, "the refused attempt took the lease"
    await redis.set(lease_key, token_1, px=10_000)  # attempt 1's renewal
    release.set()
    one, _ = await asyncio.wait_for(asyncio.gather(first, second), 15)
    assert runs == [500] and one.data == "charged 500"


async def test_a_record_evicted_while_its_call_runs_is_not_run_again_when_its_holder_ends_at_once(redis):
    """Redis alone. Redis evicted the record of a running call; attempt 2's claim is
    granted but attempt 1 holds the lease, and attempt 1 finishes 50 ms later: attempt 2
    never takes the lease for itself (a version that looked again for a free lease ran the
    tool a second time, found by a break-it review)."""
    runs: list[int] = []
    release = asyncio.Event()
    tools, request = _tools(redis, None, _slow_charge(runs, release))
    first = asyncio.ensure_future(tools.run_tool(request))
    await _started(runs)
    await redis.delete(idempotency_key(request.call_key))  # evicted; the lease lives
    second = asyncio.ensure_future(tools.run_tool(request))
    await asyncio.sleep(0.05)
    release.set()
    one, two = await asyncio.wait_for(asyncio.gather(first, second), 15)
    assert runs == [500], f"ran {len(runs)} times: {one.data!r} {two.data!r}"


async def test_a_record_evicted_while_its_call_runs_is_not_run_again_when_its_lease_lapses_a_moment(redis):
    """Redis alone. Record evicted, then the holder's lease lapses for a moment (a late
    renewal) while attempt 2 decides: attempt 2 never runs the tool while attempt 1 does."""
    runs: list[int] = []
    release = asyncio.Event()
    tools, request = _tools(redis, None, _slow_charge(runs, release))
    key = idempotency_key(request.call_key)
    first = asyncio.ensure_future(tools.run_tool(request))
    await _started(runs)
    await redis.delete(key)  # evicted
    second = asyncio.ensure_future(tools.run_tool(request))
    await asyncio.sleep(0.01)
    await redis.delete(running_lease_key(key))  # lapsed for a moment
    await asyncio.sleep(0.5)
    release.set()
    await asyncio.wait_for(asyncio.gather(first, second), 15)
    assert runs == [500], f"ran {len(runs)} times"


async def test_a_claim_whose_answer_was_lost_leaves_no_lease_for_a_later_attempt_to_wait_on(redis, tmp_path, monkeypatch):
    """The claim pipeline ran in Redis but its answer was lost: attempt 1 claims in the
    durable ledger alone, runs and records its result there. The lease its pipeline set
    is taken back, so attempt 2 answers from the durable record at
    once (left, it waited the lease's whole 10 s on a token nobody held)."""
    runs: list[int] = []
    release = asyncio.Event()
    release.set()
    tools, request = _tools(redis, tmp_path, _slow_charge(runs, release))
    _answer_lost_once(monkeypatch)
    one = await tools.run_tool(request)
    monkeypatch.undo()
    assert one.data == "charged 500"
    loop = asyncio.get_running_loop()
    began = loop.time()
    two = await asyncio.wait_for(tools.run_tool(request), 20)
    took = loop.time() - began
    assert (two.data, runs) == ("charged 500", [500])
    assert took < 2, f"attempt 2 waited {took:.1f} s on a lease nobody holds"


@pytest.fixture(params=[False, True], ids=["plain", "sealed at rest"])
def at_rest(request: Any) -> Any:
    """Records in Redis plain, then sealed (``HERMES_ENCRYPTION_KEYS``)."""
    if request.param:
        encryption.activate(encryption.parse_keys(KEYS, source="test", separator=","))
    yield request.param
    encryption.activate(None)


async def test_a_claim_the_client_sent_twice_is_still_this_attempts_and_runs_the_tool_once(redis, tmp_path, monkeypatch, at_rest):
    """redis-py sends a command again after a lost connection: the claim's second sending
    is refused by its own first. The "started" record names the attempt's lease token, so
    the attempt still knows the claim is its own (sealed or not): it runs the tool once and
    returns its result (without the token it reported "outcome unknown" for a tool that
    never ran)."""
    runs: list[int] = []
    release = asyncio.Event()
    release.set()
    tools, request = _tools(redis, tmp_path, _slow_charge(runs, release))
    _sent_twice_once(monkeypatch)
    result = await asyncio.wait_for(tools.run_tool(request), 20)
    assert (result.code, result.data, runs) == (ToolResultCode.OK, "charged 500", [500])
    key = idempotency_key(request.call_key)
    assert not await redis.exists(running_lease_key(key))
    assert (b"charged" in await redis.get(key)) is not at_rest
