""""Is a worker running?" is asked only when no worker polls the session's task queue.

Temporal's DescribeTaskQueue lists the pollers; with one polling, a query that takes long
is a slow session (a loaded machine, a long workflow task), and the hint would send the
user looking for a problem that is not there.
"""

from __future__ import annotations

import asyncio

import pytest

from hermes.cli.errors import CliError
from hermes.cli.running import answer
from hermes.client import HermesClient
from hermes.providers.scripted import ScriptedModel
from hermes.sessions.live_view import TurnView, send_watched


async def _never() -> None:
    await asyncio.Event().wait()


async def test_no_worker_is_counted_on_a_queue_nobody_polls_and_one_while_a_worker_runs(
    run_worker, temporal_client, task_queue
):
    assert await HermesClient(temporal_client, task_queue=task_queue).count_workers() == 0
    async with run_worker(ScriptedModel.demo()) as hermes:
        assert await _until_polled(hermes) >= 1


async def test_a_query_without_an_answer_asks_for_a_worker_only_when_none_polls(
    run_worker, temporal_client, task_queue, settings
):
    idle = HermesClient(temporal_client, task_queue=task_queue)
    with pytest.raises(CliError) as unserved:
        await answer(_never(), settings, idle, timeout_seconds=0.2)
    assert "no worker polls task queue" in unserved.value.message
    async with run_worker(ScriptedModel.demo()) as hermes:
        await _until_polled(hermes)
        with pytest.raises(CliError) as slow:
            await answer(_never(), settings, hermes, timeout_seconds=0.2)
    assert "worker(s) poll task queue" in slow.value.message
    assert "start one" not in slow.value.message.lower()


async def _until_polled(hermes: HermesClient, timeout_seconds: float = 30.0) -> int:
    """The worker count once a started worker's first poll reached Temporal."""
    deadline = asyncio.get_running_loop().time() + timeout_seconds
    while (count := await hermes.count_workers()) == 0:
        assert asyncio.get_running_loop().time() < deadline, "the worker never polled"
        await asyncio.sleep(0.05)
    return count or 0


class _Recorder(TurnView):
    def __init__(self) -> None:
        self.slow_seen = asyncio.Event()

    def slow(self, elapsed_seconds: float) -> None:
        self.slow_seen.set()


async def test_a_turn_that_no_worker_takes_shows_the_hint(temporal_client, task_queue, session_id):
    hermes = HermesClient(temporal_client, task_queue=task_queue)
    view = _Recorder()
    turn = asyncio.ensure_future(
        send_watched(hermes, session_id, "hello", view, user_id="u", poll_seconds=0.05, slow_after_seconds=0.2)
    )
    try:
        await asyncio.wait_for(view.slow_seen.wait(), 30)
    finally:
        turn.cancel()
        await asyncio.gather(turn, return_exceptions=True)
