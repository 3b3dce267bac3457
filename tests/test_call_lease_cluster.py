"""A non-idempotent tool call's claim, lease (a Lua compare-and-delete) and record on a
real Redis Cluster, where the record and the lease are on different nodes (issue 31)."""

from __future__ import annotations

import asyncio

import pytest

from activities.call_lease import RunningLease, claim_for_attempt, running_lease_key
from activities.tools import idempotency_key
from tests.test_call_lease import _charging, _slow_charge, _started, _tools
from tests.test_redis_cluster import cluster_url, redis, settings  # noqa: F401 - fixtures

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize("with_ledger", [True, False])
async def test_a_non_idempotent_call_runs_once_and_drops_its_lease_on_the_cluster(redis, tmp_path, with_ledger):
    runs: list[int] = []
    tools, request = _tools(redis, tmp_path if with_ledger else None, _charging(runs))
    result = await tools.run_tool(request)
    assert result.data == "charged 500", result.message
    key = idempotency_key(request.call_key)
    assert not await redis.exists(running_lease_key(key))
    again = await tools.run_tool(request)
    assert (again.data, runs) == ("charged 500", [500])


async def test_a_refused_attempt_drops_only_its_own_lease_on_the_cluster(redis, tmp_path):
    runs: list[int] = []
    release = asyncio.Event()
    tools, request = _tools(redis, tmp_path, _slow_charge(runs, release))
    first = asyncio.ensure_future(tools.run_tool(request))
    await _started(runs)
    key = idempotency_key(request.call_key)
    other = RunningLease(redis, key)
    record = await claim_for_attempt(other, '{"state": "started"}', 60)
    assert record and record["state"] == "started"
    assert await redis.exists(running_lease_key(key))
    await other.drop()
    assert await redis.exists(running_lease_key(key))
    release.set()
    one = await first
    assert one.data == "charged 500" and not await redis.exists(running_lease_key(key))


async def test_on_a_cluster_the_lease_is_not_dropped_before_the_result_is_recorded(redis, monkeypatch):
    """_record_and_release promises the record, then the lease's drop, "in that order". On a
    cluster the record and the lease hash to different nodes and redis-py sends each node
    its part of a non-transactional pipeline as a concurrent task: the drop can land first.
    Here the record's node is a little slower: the waiting attempt sees the lease gone and
    the record still "started" and reports "outcome unknown" (Redis alone: it then writes
    "unknown" over the result)."""
    from redis.asyncio.cluster import ClusterNode

    from hermes.models import ToolResultCode

    runs: list[int] = []
    release = asyncio.Event()
    tools, request = _tools(redis, None, _slow_charge(runs, release))
    key = idempotency_key(request.call_key)
    assert redis.keyslot(key) != redis.keyslot(running_lease_key(key))
    real = ClusterNode.execute_pipeline

    delayed: list[int] = []

    async def execute_pipeline(self, commands):

        if any(c.args[0] == "SET" and c.args[1] == key and "NX" not in c.args for c in commands) and release.is_set():
            delayed.append(1)
            await asyncio.sleep(0.6)  # the record's node answers a little later
        return await real(self, commands)

    monkeypatch.setattr(ClusterNode, "execute_pipeline", execute_pipeline)
    first = asyncio.ensure_future(tools.run_tool(request))
    await _started(runs)
    second = asyncio.ensure_future(tools.run_tool(request))
    await asyncio.sleep(0.5)
    release.set()
    one, two = await asyncio.wait_for(asyncio.gather(first, second), 20)
    assert delayed and runs == [500] and one.data == "charged 500"
    assert two.code != ToolResultCode.OUTCOME_UNKNOWN, two.message
