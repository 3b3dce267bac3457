"""Rolling deploys with Worker Versioning (issue 28, item 6): two builds of one deployment
on one task queue, on the real dev server. Each build's scripted model names its build,
so a reply says which build ran the turn (a pinned run's activities run on its build)."""

from __future__ import annotations

import asyncio
import json
import uuid
from contextlib import AsyncExitStack
from typing import Any

import pytest
from temporalio.client import Client

from hermes.client import HermesClient
from hermes.errors import ConfigError
from hermes.infra import deploy
from hermes.models import SessionConfig
from hermes.providers.scripted import ScriptedModel
from hermes.settings import Settings
from hermes.tools.builtin import register_builtins
from hermes.tools.registry import ToolRegistry
from tests.support import eventually
from tests.test_cli import clean_env, hermes_cli
from worker import build_worker

ROLL_EVERY = 3
"""Messages per run of the old session: it continues as new after its third."""


def _build(settings: Settings, deployment: str, build_id: str) -> Settings:
    return settings.model_copy(update={"deployment_name": deployment, "build_id": build_id})


def _versions(builds: list[deploy.BuildStatus]) -> dict[str, deploy.BuildStatus]:
    return {b.build_id: b for b in builds}


def test_versioning_is_off_unless_both_deployment_name_and_build_id_are_set() -> None:
    assert deploy.deployment_config(Settings()) is None
    config = deploy.deployment_config(Settings(deployment_name="hermes", build_id="v2"))
    assert config.use_worker_versioning and config.version.build_id == "v2"
    with pytest.raises(ConfigError, match="HERMES_BUILD_ID"):
        deploy.deployment_config(Settings(deployment_name="hermes"))


@pytest.mark.timeout(90)
async def test_a_new_build_takes_new_sessions_and_an_old_session_moves_to_it_at_continue_as_new_so_the_old_build_drains(
    temporal_client: Client, settings: Settings, redis: Any, tmp_path: Any
) -> None:
    deployment = f"hermes-{uuid.uuid4().hex[:8]}"
    cfg = SessionConfig(max_updates_per_run=ROLL_EVERY)
    hermes = HermesClient(temporal_client, task_queue=settings.task_queue, redis=redis, config=cfg)
    old, new = f"old-{uuid.uuid4()}", f"new-{uuid.uuid4()}"

    async def reply(session_id: str, text: str) -> str:
        return (await asyncio.wait_for(hermes.send_message(session_id, text), 30)).reply

    def worker(build_id: str) -> Any:
        model = ScriptedModel.from_dict({"fallback": f"build {build_id}", "turns": []})
        return build_worker(
            temporal_client, _build(settings, deployment, build_id), provider=model,
            registry=register_builtins(ToolRegistry()), redis=redis, memory=False,
        )

    async def current(build_id: str) -> None:
        # A build can be made current once the server has seen its workers poll.
        async def promoted() -> bool:
            try:
                await deploy.set_current(temporal_client, deployment, build_id)
            except Exception:  # noqa: BLE001 - RPCError until the version is registered
                return False
            return True

        await eventually(promoted, what=f"build {build_id} made current", timeout_seconds=20)

    async with AsyncExitStack() as stack:
        await stack.enter_async_context(worker("a"))
        await current("a")
        assert await reply(old, "hello") == "build a"

        await stack.enter_async_context(worker("b"))
        await current("b")
        assert await reply(new, "hello") == "build b", "a new session did not start on the current build"
        # The old session's run is pinned to build a until it continues as new.
        replies = [await reply(old, f"turn {n}") for n in range(2, ROLL_EVERY + 3)]
        assert replies[: ROLL_EVERY - 1] == ["build a"] * (ROLL_EVERY - 1), replies
        assert replies[-1] == "build b", f"the old session never moved to build b: {replies}"
        state = await hermes.get_state(old)
        assert state.run_index >= 1

        async def drained() -> dict[str, deploy.BuildStatus] | None:
            builds = _versions(await deploy.status(temporal_client, deployment))
            return builds if builds["a"].running == 0 and builds["a"].drainage == "drained" else None

        builds = await eventually(drained, what="build a drained", timeout_seconds=30, poll_seconds=0.5)
        assert builds["b"].status == "current" and builds["b"].running == 2
        assert builds["a"].status == "drained"

        # What an operator sees: `hermes deploy status`; promoting a build no worker runs is refused.
        env = clean_env(TEMPORAL_ADDRESS=temporal_client.service_client.config.target_host, HERMES_DEPLOYMENT_NAME=deployment)
        shown = await hermes_cli("deploy", "status", "--json", env=env, cwd=tmp_path)
        assert shown.returncode == 0, shown.stderr
        assert {b["build_id"]: (b["status"], b["running"]) for b in json.loads(shown.stdout)} == {
            "a": ("drained", 0), "b": ("current", 2)
        }
        refused = await hermes_cli("deploy", "set-current", "nope", env=env, cwd=tmp_path)
        assert refused.returncode == 1 and refused.stderr.startswith(f"error: deployment {deployment!r}"), refused.stderr
