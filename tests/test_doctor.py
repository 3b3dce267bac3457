"""``hermes doctor`` (issue 28, item 1): a line per configured service saying where it
lives; exit 0 against a working stack, 1 naming what failed. Real Temporal dev server and
Redis, as a subprocess."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client

from hermes.infra.stack import free_port
from tests.test_cli import clean_env, hermes_cli

CHECKS = ["Temporal", "Redis", "Memory store", "Model", "MCP servers", "Encryption keys", "Command keys"]


def _lines(stdout: str) -> dict[str, str]:
    """``{check name: its line}`` of the doctor's output."""
    found = {}
    for line in stdout.splitlines():
        for name in CHECKS:
            if line[5:].startswith(name + " "):
                found[name] = line
    return found


@pytest.fixture
def doctor_env(temporal_client: Client, redis_url: str, tmp_path: Path) -> dict[str, str]:
    return clean_env(
        TEMPORAL_ADDRESS=temporal_client.service_client.config.target_host,
        REDIS_URL=redis_url,
        HERMES_DATA_DIR=str(tmp_path / "data"),
        HERMES_MEMORY_URI=str(tmp_path / "memory"),
    )


@pytest.mark.timeout(120)
async def test_doctor_against_the_test_stack_passes_every_check_and_says_where_each_lives(
    doctor_env: dict[str, str], tmp_path: Path
) -> None:
    (tmp_path / "memory").mkdir()
    run = await hermes_cli("doctor", env=doctor_env, cwd=tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr
    lines = _lines(run.stdout)
    assert list(lines) == CHECKS, run.stdout
    assert all(line.startswith("ok ") for line in lines.values()), run.stdout
    assert doctor_env["TEMPORAL_ADDRESS"] in lines["Temporal"] and "namespace 'default' found" in lines["Temporal"]
    assert doctor_env["REDIS_URL"] in lines["Redis"]
    assert f"{tmp_path / 'memory'} (local path on this machine): opens, 0 tables" in lines["Memory store"]
    assert "All checks passed." in run.stdout


@pytest.mark.timeout(120)
async def test_doctor_with_a_dead_redis_fails_naming_redis_and_where_it_was_looked_for(
    doctor_env: dict[str, str], tmp_path: Path
) -> None:
    dead = f"redis://127.0.0.1:{free_port()}/0"
    run = await hermes_cli("doctor", env={**doctor_env, "REDIS_URL": dead}, cwd=tmp_path)
    assert run.returncode == 1, run.stdout + run.stderr
    lines = _lines(run.stdout)
    assert lines["Redis"].startswith("FAIL") and dead in lines["Redis"] and "unreachable" in lines["Redis"]
    assert lines["Temporal"].startswith("ok ")
    assert run.stderr.strip() == "error: 1 check(s) failed: Redis"


@pytest.mark.timeout(120)
async def test_doctor_fails_the_memory_store_of_a_remote_temporal_naming_the_scope_setting(
    doctor_env: dict[str, str], tmp_path: Path
) -> None:
    env = {**doctor_env, "TEMPORAL_ADDRESS": "temporal.invalid:7233"}  # another machine (its check fails too)
    run = await hermes_cli("doctor", env=env, cwd=tmp_path)
    assert run.returncode == 1
    lines = _lines(run.stdout)
    assert lines["Memory store"].startswith("FAIL") and "HERMES_MEMORY_STORE_SCOPE" in lines["Memory store"]
    run = await hermes_cli("doctor", env={**env, "HERMES_MEMORY_STORE_SCOPE": "shared"}, cwd=tmp_path)
    assert _lines(run.stdout)["Memory store"].startswith("ok ") and "shared" in _lines(run.stdout)["Memory store"]


@pytest.mark.timeout(120)
async def test_doctor_opens_an_s3_memory_store_with_the_settings_credentials_and_shows_the_uri_not_the_secret(
    doctor_env: dict[str, str], tmp_path: Path, s3_server: Any
) -> None:
    uri, secret = s3_server.fresh_uri(), "s3cr3t-never-shown"
    env = {
        **doctor_env, "HERMES_MEMORY_URI": uri, "HERMES_S3_ENDPOINT_URL": s3_server.endpoint,
        "HERMES_S3_REGION": "us-east-1", "HERMES_S3_ACCESS_KEY_ID": "testing", "HERMES_S3_SECRET_ACCESS_KEY": secret,
    }
    run = await hermes_cli("doctor", env=env, cwd=tmp_path)
    line = _lines(run.stdout)["Memory store"]
    assert line.startswith("ok ") and uri in line and "opens, 0 tables" in line, run.stdout + run.stderr
    assert secret not in run.stdout + run.stderr
