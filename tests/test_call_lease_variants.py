"""A non-idempotent tool call's claim with records sealed at rest and with a client that
decodes responses (issue 31)."""

from __future__ import annotations

import asyncio

import pytest
import redis.asyncio as aioredis

from activities.call_lease import running_lease_key
from activities.tools import idempotency_key
from hermes.models import ToolResultCode
from hermes.security import encryption
from tests.test_call_lease import _charging, _sent_twice_once, _slow_charge, _tools
from tests.test_sealed_at_rest import KEYS

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def sealed():
    encryption.activate(encryption.parse_keys(KEYS, source="test", separator=","))
    yield
    encryption.activate(None)


async def test_a_claim_the_client_sent_twice_runs_the_call_once_with_records_sealed_at_rest(redis, tmp_path, monkeypatch, sealed):
    runs: list[int] = []
    release = asyncio.Event()
    release.set()
    tools, request = _tools(redis, tmp_path, _slow_charge(runs, release))
    _sent_twice_once(monkeypatch)
    result = await asyncio.wait_for(tools.run_tool(request), 20)
    assert (result.code, result.data, runs) == (ToolResultCode.OK, "charged 500", [500])
    raw = await redis.get(idempotency_key(request.call_key))
    assert b"charged" not in raw


@pytest.mark.parametrize("with_ledger", [True, False])
async def test_a_client_that_decodes_responses_runs_a_call_once_and_drops_its_lease(redis_url, tmp_path, with_ledger):
    client = aioredis.Redis.from_url(redis_url, decode_responses=True)
    try:
        runs: list[int] = []
        release = asyncio.Event()
        tools, request = _tools(client, tmp_path if with_ledger else None, _slow_charge(runs, release))
        first = asyncio.ensure_future(tools.run_tool(request))
        while not runs:
            await asyncio.sleep(0.01)
        second = asyncio.ensure_future(tools.run_tool(request))
        await asyncio.sleep(0.3)
        assert not second.done()
        release.set()
        one, two = await asyncio.wait_for(asyncio.gather(first, second), 15)
        assert (one.data, two.data, runs) == ("charged 500", "charged 500", [500])
        assert not await client.exists(running_lease_key(idempotency_key(request.call_key)))
    finally:
        await client.aclose()
