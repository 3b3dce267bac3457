"""``hermes memory search|add|list|forget|consolidate`` against a worker in the test process
(real Temporal dev server, Redis, LanceDB), run as a user would, in a subprocess."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client

from hermes.providers.scripted import ScriptedModel
from tests.test_cli import clean_env, hermes_cli


@pytest.fixture
def memory_env(temporal_client: Client, redis_url: str, task_queue: str, _memory_store_per_test: Path) -> dict[str, str]:
    return clean_env(
        TEMPORAL_ADDRESS=temporal_client.service_client.config.target_host,
        REDIS_URL=redis_url,
        HERMES_TASK_QUEUE=task_queue,
        HERMES_MEMORY_URI=str(_memory_store_per_test),
    )


@pytest.mark.timeout(1200)  # a dozen CLI processes or a whole demo: minutes under load
async def test_memory_commands_add_list_search_consolidate_and_forget(run_worker: Any, memory_env: dict[str, str], tmp_path: Path) -> None:
    user = f"user-{uuid.uuid4().hex[:8]}"
    other = f"other-{uuid.uuid4().hex[:8]}"
    async with run_worker(ScriptedModel.demo()):
        added = await hermes_cli(
            "memory", "add", "The user lives in Bern.", "--user", user, "--subject", "home_city", "--value", "Bern",
            env=memory_env, cwd=tmp_path,
        )
        assert added.returncode == 0, added.stderr
        assert added.stdout.startswith("added mem_")
        moved = await hermes_cli(
            "memory", "add", "The user moved to Zurich.", "--user", user, "--subject", "home_city", "--value", "Zurich",
            "--json", env=memory_env, cwd=tmp_path,
        )
        report = json.loads(moved.stdout)
        assert len(report["inserted"]) == 1 and len(report["superseded"]) == 1
        again = await hermes_cli("memory", "add", "I live in Zurich", "--user", user, "--subject", "home_city",
                                 "--value", "zurich", env=memory_env, cwd=tmp_path)
        assert "already known: refreshed " + report["inserted"][0] in again.stdout
        await hermes_cli("memory", "add", "The user likes oolong tea.", "--user", other, env=memory_env, cwd=tmp_path)

        listed = json.loads((await hermes_cli("memory", "list", "--user", user, "--json", env=memory_env, cwd=tmp_path)).stdout)
        by_text = {r["text"]: r for r in listed}
        assert by_text["The user lives in Bern."]["status"] == "superseded"
        assert by_text["The user lives in Bern."]["superseded_by"] == by_text["The user moved to Zurich."]["memory_id"]
        assert by_text["The user moved to Zurich."]["mentions"] == 2

        found = await hermes_cli("memory", "search", "用户住在哪里？", "--user", user, "--json", env=memory_env, cwd=tmp_path)
        assert found.returncode == 0, found.stderr
        assert [m["text"] for m in json.loads(found.stdout)] == ["The user moved to Zurich."]
        table = await hermes_cli("memory", "search", "which city do I live in", "--user", user, env=memory_env, cwd=tmp_path)
        assert "The user moved to Zurich." in table.stdout and "Bern" not in table.stdout

        consolidated = await hermes_cli("memory", "consolidate", "--json", env=memory_env, cwd=tmp_path)
        assert consolidated.returncode == 0, consolidated.stderr
        assert json.loads(consolidated.stdout)["users"] == 2
        second = json.loads((await hermes_cli("memory", "consolidate", "--json", env=memory_env, cwd=tmp_path)).stdout)
        assert (second["merged"], second["superseded"], second["archived"], second["expired"]) == (0, 0, 0, 0)

        forgot = await hermes_cli("memory", "forget", "--user", user, "--yes", env=memory_env, cwd=tmp_path)
        assert forgot.returncode == 0, forgot.stderr
        assert f"deleted 2 memories of {user}" in forgot.stdout
        empty = json.loads((await hermes_cli("memory", "list", "--user", user, "--json", env=memory_env, cwd=tmp_path)).stdout)
        assert empty == []
        kept = json.loads((await hermes_cli("memory", "list", "--user", other, "--json", env=memory_env, cwd=tmp_path)).stdout)
        assert [r["text"] for r in kept] == ["The user likes oolong tea."]


async def test_memory_commands_refuse_bad_input_in_one_line(memory_env: dict[str, str], tmp_path: Path) -> None:
    bad_user = await hermes_cli("memory", "list", "--user", "a\x01b", env=memory_env, cwd=tmp_path)
    assert bad_user.returncode == 1
    assert "user_id contains control characters" in bad_user.stderr
    bad_kind = await hermes_cli("memory", "add", "x", "--user", "u", "--kind", "gossip", env=memory_env, cwd=tmp_path)
    assert bad_kind.returncode == 1 and "memory refused" in bad_kind.stderr
    hostile = await hermes_cli("memory", "search", "anything", "--user", "x' OR '1'='1", "--json", env=memory_env, cwd=tmp_path)
    assert hostile.returncode == 0 and json.loads(hostile.stdout) == []
