"""One memory for every worker (issue 28, item 1): a worker whose Temporal serves other
machines refuses a local memory store unless told it is shared or deliberately local, and
its banner says where memories live."""

from __future__ import annotations

from pathlib import Path

import pytest

from hermes.errors import ConfigError
from hermes.memory.location import check_memory_location, memory_location, temporal_is_remote
from hermes.settings import Settings
from tests.test_cli import clean_env, hermes_cli


def _settings(tmp_path: Path, **values: object) -> Settings:
    return Settings(_env_file=None, data_dir=tmp_path / "data", memory_uri=None, **values)


@pytest.mark.parametrize(
    ("address", "remote"),
    [
        (None, False), ("127.0.0.1:7233", False), ("localhost:7233", False), ("[::1]:7233", False),
        ("127.0.0.2:7233", False), ("10.0.0.5:7233", True), ("temporal.internal:7233", True),
        ("[2001:db8::1]:7233", True),
    ],
)
def test_a_temporal_on_another_machine_is_told_from_a_loopback_one(tmp_path: Path, address: str | None, remote: bool) -> None:
    assert temporal_is_remote(_settings(tmp_path, temporal_address=address)) is remote


def test_a_loopback_temporal_behind_an_api_key_counts_as_remote(tmp_path: Path) -> None:
    assert temporal_is_remote(_settings(tmp_path, temporal_address="127.0.0.1:7233", temporal_api_key="k"))


def test_a_remote_temporal_with_a_local_store_is_refused_unless_the_scope_is_given(tmp_path: Path) -> None:
    remote = _settings(tmp_path, temporal_address="10.0.0.5:7233")
    with pytest.raises(ConfigError) as refused:
        check_memory_location(remote)
    message = str(refused.value)
    assert "HERMES_MEMORY_STORE_SCOPE" in message and "=shared" in message and "=local" in message
    assert str((tmp_path / "data" / "memory").absolute()) in message
    shared = check_memory_location(remote.model_copy(update={"memory_store_scope": "shared"}))
    assert "shared" in shared.describe()
    assert check_memory_location(remote.model_copy(update={"memory_store_scope": "local"})).local
    on_s3 = check_memory_location(remote.model_copy(update={"memory_uri": "s3://bucket/hermes?region=x"}))
    assert not on_s3.local and on_s3.describe() == "s3://bucket/hermes?region=*** (object store: one for every worker)"
    assert check_memory_location(_settings(tmp_path, temporal_address="127.0.0.1:7233")).local


def test_the_location_of_a_local_store_is_its_absolute_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    location = memory_location(Settings(_env_file=None, memory_uri="rel/memory"))
    assert location.uri == str(tmp_path / "rel" / "memory")
    assert location.describe() == f"{tmp_path / 'rel' / 'memory'} (local path on this machine)"


@pytest.mark.timeout(120)
async def test_hermes_worker_with_a_remote_temporal_and_a_local_store_refuses_naming_the_setting(tmp_path: Path) -> None:
    env = clean_env(TEMPORAL_ADDRESS="10.255.255.1:7233", REDIS_URL="redis://127.0.0.1:9/0", HERMES_DATA_DIR=str(tmp_path / "d"))
    run = await hermes_cli("worker", env=env, cwd=tmp_path)
    assert run.returncode == 2, run.stdout + run.stderr
    assert "HERMES_MEMORY_STORE_SCOPE" in run.stderr and "shared" in run.stderr and "local" in run.stderr
    assert "Traceback" not in run.stderr
