"""A non-idempotent tool call's claim with a client that decodes responses (issue 31);
records sealed at rest: ``tests/test_call_lease_races.py``."""

from __future__ import annotations

import asyncio

import pytest
import redis.asyncio as aioredis

from activities.call_lease import running_lease_key
from activities.tools import idempotency_key
from tests.test_call_lease import _slow_charge, _started, _tools

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize("with_ledger", [True, False])
async def test_a_client_that_decodes_responses_runs_a_call_once_and_drops_its_lease(redis_url, tmp_path, with_ledger):
    client = aioredis.Redis.from_url(redis_url, decode_responses=True)
    try:
        runs: list[int] = []
        release = asyncio.Event()
        tools, request = _tools(client, tmp_path if with_ledger else None, _slow_charge(runs, release))
        first = asyncio.ensure_future(tools.run_tool(request))
        await _started(runs)
        second = asyncio.ensure_future(tools.run_tool(request))
        await asyncio.sleep(0.3)
        assert not second.done()
        release.set()
        one, two = await asyncio.wait_for(asyncio.gather(first, second), 15)
        assert (one.data, two.data, runs) == ("charged 500", "charged 500", [500])
        assert not await client.exists(running_lease_key(idempotency_key(request.call_key)))
    finally:
        await client.aclose()
