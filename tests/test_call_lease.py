"""A non-idempotent tool call's claim, running lease and record in Redis (issue 31: two
round trips a call, not four), against a real Redis and a durable ledger on disk: the
call still runs once, a later attempt still waits for a live earlier one, and the turn
events still land in order."""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path
from typing import Any

import pytest

from activities.call_lease import RunningLease, claim_call, running_lease_key
from activities.tools import ToolActivities, idempotency_key
from hermes.content.events import EventLog
from hermes.infra.durable import DurableStore
from hermes.models import RunToolInput, ToolCall, ToolResultCode
from hermes.tools.registry import ToolRegistry

pytestmark = pytest.mark.timeout(60)


def _tools(redis: Any, tmp_path: Path | None, charge: Any) -> tuple[ToolActivities, RunToolInput]:
    """Tool activities with ``charge`` registered as non-idempotent, turn events on, and
    (``tmp_path``) a durable ledger there; a call of it."""
    registry = ToolRegistry()
    registry.register(charge, idempotency="none")
    durable = DurableStore(tmp_path) if tmp_path is not None else None
    tools = ToolActivities(registry, redis, tier_seconds=lambda tier: 30.0, durable=durable)
    tools.events = EventLog(redis)
    request = RunToolInput(
        session_id=f"s-{uuid.uuid4()}", user_id="alice", turn=1, idempotent=False,
        tool_call=ToolCall(tool_call_id="c1", name="charge", arguments={"amount": 500}),
    )
    return tools, request


def _charging(runs: list[int]) -> Any:
    """A synchronous ``charge`` tool that notes each amount it runs with in ``runs``."""

    def charge(amount: int) -> str:
        """Charge the card.

        Args:
            amount: in cents.
        """
        runs.append(amount)
        return f"charged {amount}"

    return charge


def _slow_charge(runs: list[int], release: asyncio.Event) -> Any:
    """An async ``charge`` tool that notes its amount in ``runs``, then waits for ``release``."""

    async def charge(amount: int) -> str:
        """Charge the card.

        Args:
            amount: in cents.
        """
        runs.append(amount)
        await release.wait()
        return f"charged {amount}"

    return charge


async def _started(runs: list[int]) -> None:
    """Wait until the tool of :func:`_slow_charge` noted its run in ``runs`` (it is running)."""
    while not runs:
        await asyncio.sleep(0.01)


def _round_trips(monkeypatch: Any) -> list[list[str]]:
    """Every Redis round trip from now on: a pipeline's commands, or one command."""
    from redis.asyncio.client import Pipeline, Redis

    sent: list[list[str]] = []
    pipeline_execute, execute_command = Pipeline.execute, Redis.execute_command

    async def run_pipeline(self: Any, *args: Any, **kwargs: Any) -> Any:
        sent.append([str(command[0][0]).upper() for command in self.command_stack])
        return await pipeline_execute(self, *args, **kwargs)

    async def run_command(self: Any, *args: Any, **kwargs: Any) -> Any:
        sent.append([str(args[0]).upper()])
        return await execute_command(self, *args, **kwargs)

    monkeypatch.setattr(Pipeline, "execute", run_pipeline)
    monkeypatch.setattr(Redis, "execute_command", run_command)
    return sent


def _answer_lost_once(monkeypatch: Any) -> None:
    """The next Redis command or pipeline runs, and its answer is lost (a ``ConnectionError``)."""
    from redis.asyncio.client import Pipeline, Redis
    from redis.exceptions import ConnectionError as RedisConnectionError

    lost: list[Any] = []

    def losing(real: Any) -> Any:
        async def run(self: Any, *args: Any, **kwargs: Any) -> Any:
            answers = await real(self, *args, **kwargs)
            if not lost:
                lost.append(answers)
                raise RedisConnectionError("answer lost")
            return answers

        return run

    monkeypatch.setattr(Pipeline, "execute", losing(Pipeline.execute))
    monkeypatch.setattr(Redis, "execute_command", losing(Redis.execute_command))


def _sent_twice_once(monkeypatch: Any) -> None:
    """The next Redis command is sent twice, as redis-py's retry after a lost answer does."""
    from redis.asyncio.client import Redis

    real = Redis.execute_command
    sent_twice: list[bool] = []

    async def execute_command(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not sent_twice:
            sent_twice.append(True)
            await real(self, *args, **kwargs)  # answered, and the answer lost: sent again
        return await real(self, *args, **kwargs)

    monkeypatch.setattr(Redis, "execute_command", execute_command)


async def test_a_fast_call_takes_two_round_trips_and_its_events_ride_with_its_record(redis, monkeypatch, tmp_path):
    """Claim, lease and a read of the record and the lease in one round trip (a Lua
    script); the result's record, the lease's drop (if still this attempt's) and the turn
    events in the other. The events land in order and say what
    the call returned; the lease is gone; a later attempt answers from the record."""
    runs: list[int] = []
    tools, request = _tools(redis, tmp_path, _charging(runs))
    sent = _round_trips(monkeypatch)
    result = await tools.run_tool(request)
    assert result.ok and result.data == "charged 500"
    assert sent == [["EVAL"], ["SET", "EVAL", "XADD", "XADD", "EXPIRE"]], sent
    events = await EventLog(redis).read(request.session_id)
    assert [e.type for e in events] == ["tool_call_started", "tool_call_finished"]
    assert (events[1].data["ok"], events[1].data["data"]) == (True, json.dumps("charged 500"))
    key = idempotency_key(request.call_key)
    assert not await redis.exists(running_lease_key(key))
    assert json.loads(await redis.get(key))["state"] == "done"
    again = await tools.run_tool(request)
    assert (again.data, runs) == ("charged 500", [500])


async def test_a_later_attempt_waits_for_the_live_attempt_holding_the_lease_and_gets_its_result(redis, tmp_path):
    """Temporal gave up on attempt 1 (a late heartbeat) and started attempt 2 while 1 still
    runs: 2's claim is refused, 1 holds the lease it took with its claim, so 2 waits and
    answers with 1's result; the tool ran once."""
    runs: list[int] = []
    release = asyncio.Event()
    tools, request = _tools(redis, tmp_path, _slow_charge(runs, release))
    first = asyncio.ensure_future(tools.run_tool(request))
    await _started(runs)
    second = asyncio.ensure_future(tools.run_tool(request))
    await asyncio.sleep(0.5)
    assert not second.done(), "the later attempt did not wait for the live one"
    release.set()
    one, two = await asyncio.wait_for(asyncio.gather(first, second), 10)
    assert (one.data, two.data, runs) == ("charged 500", "charged 500", [500])
    assert not await redis.exists(running_lease_key(idempotency_key(request.call_key)))


async def test_a_claim_granted_while_another_attempt_holds_the_lease_waits_and_never_runs_the_tool(redis, tmp_path):
    """A lease with no record: Redis lost the record of a call another attempt runs (an
    eviction). The new attempt's claim is granted but not used: it waits while that lease
    lives, and when it lapses with no result reports the outcome unknown; the tool never
    runs a second time, and the other attempt's lease is never dropped by this one (both
    found by a break-it review of a version that took the lease over)."""
    runs: list[int] = []
    tools, request = _tools(redis, tmp_path, _charging(runs))
    lease = running_lease_key(idempotency_key(request.call_key))
    await redis.set(lease, "someone-else", px=800)
    began = asyncio.get_running_loop().time()
    result = await asyncio.wait_for(tools.run_tool(request), 20)
    assert (result.code, runs) == (ToolResultCode.OUTCOME_UNKNOWN, [])
    assert asyncio.get_running_loop().time() - began >= 0.6, "it did not wait for the lease"


async def test_a_refused_claim_never_takes_the_lease_and_never_waits_on_its_own_token(redis):
    """A refused claim leaves the lease alone (the claim is one script: the lease is taken
    only with a granted claim), and an attempt never counts its own token as another's."""
    key = f"hermes:toolcall:s-{uuid.uuid4()}:c1"
    await redis.set(key, json.dumps({"state": "started"}))
    lease = RunningLease(redis, key)
    claimed, record = await claim_call(lease, json.dumps({"state": "started"}), 60)
    assert (claimed, lease.taken) == (False, False) and json.loads(record)["state"] == "started"
    assert not await redis.exists(lease.key)
    await redis.set(lease.key, lease.token)
    assert not await lease.held_by_another()  # its own token
    assert await RunningLease(redis, key).held_by_another()
    await lease.drop()
    assert not await redis.exists(lease.key)


async def test_a_lease_done_sooner_than_its_first_renewal_sets_no_task_and_a_stop_drops_it(redis):
    """Renewals start a fifth of STARTED_LEASE_SECONDS after the claim: a call done sooner
    costs no renewal task; stopping drops the lease the claim set."""
    key = f"hermes:toolcall:s-{uuid.uuid4()}:c1"
    lease = RunningLease(redis, key)
    claimed, _ = await claim_call(lease, json.dumps({"state": "started"}), 60)
    assert claimed and lease.taken
    lease.start()
    assert lease._task is None and lease._timer is not None
    assert await redis.get(lease.key) in (lease.token, lease.token.encode())
    await lease.stop()
    assert not await redis.exists(lease.key) and lease._timer is None


async def test_a_synchronous_tool_is_claimed_run_and_recorded_in_one_hop_to_a_thread(redis, monkeypatch, tmp_path):
    """The durable claim, the tool and its result's durable record go to a thread once,
    not three times; the record is on disk before the call returns, and a later attempt,
    even with Redis flushed, answers from it without running the tool again."""
    runs: list[int] = []
    tools, request = _tools(redis, tmp_path, _charging(runs))
    loop = asyncio.get_running_loop()
    jobs: list[Any] = []
    run_in_executor = type(loop).run_in_executor

    def counted(self: Any, executor: Any, fn: Any, *args: Any) -> Any:
        jobs.append(fn)
        return run_in_executor(self, executor, fn, *args)

    monkeypatch.setattr(type(loop), "run_in_executor", counted)
    result = await tools.run_tool(request)
    monkeypatch.undo()
    assert result.ok and len(jobs) == 1, jobs
    assert tools.ledger is not None
    assert (await tools.ledger.done(request.call_key))["result"]["data"] == "charged 500"
    await redis.flushdb()
    again = await tools.run_tool(request)
    assert (again.data, runs) == ("charged 500", [500])


async def test_a_synchronous_tools_large_result_is_kept_by_reference_and_recorded_as_the_session_got_it(redis, tmp_path):
    """A result over ``max_result_bytes`` needs the content store (on the event loop): it
    is cut to a preview there and that preview is what the ledger records, so a later
    attempt answers the same."""
    runs: list[int] = []

    def report(rows: int) -> list[str]:
        """Build a report.

        Args:
            rows: how many rows.
        """
        runs.append(rows)
        return [f"row {i} " + "x" * 100 for i in range(rows)]

    tools, request = _tools(redis, tmp_path, report)
    request = request.model_copy(update={"tool_call": ToolCall(tool_call_id="c1", name="report", arguments={"rows": 2000})})
    result = await tools.run_tool(request)
    assert result.ok and len(result.model_dump_json()) <= tools.max_result_bytes + 1000
    recorded = await tools.ledger.done(request.call_key)
    assert recorded is not None and recorded["result"] == result.model_dump(mode="json")
    await redis.flushdb()
    again = await tools.run_tool(request)
    assert again == result and runs == [2000]
