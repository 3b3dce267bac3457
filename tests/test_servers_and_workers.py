"""Servers and workers run apart: ``hermes dev --no-worker`` and ``hermes worker``.

``hermes dev --no-worker`` runs the embedded Temporal and Redis alone and prints the
``export`` lines a user pastes in other terminals; ``hermes worker`` processes started
with them serve the sessions, and each prints what it serves, without secrets. The
commands run as real subprocesses (``python -m hermes.cli``); the worker-banner test uses
the fixtures' Temporal and Redis.
"""

from __future__ import annotations

import asyncio
import json
import shlex
import signal
import sys
import uuid
from pathlib import Path
from types import SimpleNamespace

import pytest
from temporalio.client import Client

from hermes.cli.stack import describe_worker, worker_env
from hermes.models import TurnResult
from hermes.settings import Settings
from hermes.infra.stack import free_port
from tests.test_cli import assert_one_line_error, clean_env, hermes_cli, read_until, wait_until_no_process_uses

SECRETS = {
    "OPENAI_API_KEY": "sk-hermes-test-apikey-7f3a",
    "HERMES_TEST_MCP_TOKEN": "mcp-token-9c1e",
    "HERMES_TEST_TOOL_TOKEN": "tool-token-4b2d",
}
"""Fake secrets put in a worker's environment; none may appear in what it prints."""
BASE_URL_SECRETS = ("basepw-5e8f", "query-key-2a6c")


async def start_cli(*args: str, env: dict[str, str], cwd: Path) -> asyncio.subprocess.Process:
    """Start ``hermes ARGS`` (it runs until a signal); the caller stops it."""
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "hermes.cli", *args,
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env=env, cwd=cwd,
    )


async def interrupt(proc: asyncio.subprocess.Process, timeout_seconds: float = 120.0) -> tuple[int, str]:
    """Ctrl-C (SIGINT) ``proc``; its exit code and the rest of its stdout and stderr."""
    proc.send_signal(signal.SIGINT)
    out, err = await asyncio.wait_for(proc.communicate(), timeout_seconds)
    return proc.returncode or 0, out.decode() + err.decode()


async def kill(*procs: asyncio.subprocess.Process) -> None:
    for proc in procs:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


def exports(banner: str) -> dict[str, str]:
    """The ``export NAME=value`` lines of a banner, as the shell would set them."""
    found = {}
    for line in banner.splitlines():
        if line.startswith("export "):
            name, _, value = line.removeprefix("export ").partition("=")
            found[name] = shlex.split(value)[0]
    return found


@pytest.mark.timeout(600)  # two long-running CLI processes and a turn: minutes under load
async def test_dev_no_worker_prints_the_env_a_separate_worker_serves_a_session_with_and_ctrl_c_leaves_no_process(
    tmp_path,
):
    data_dir = tmp_path / "data"
    ui_port = free_port()
    dev_env = clean_env(
        HERMES_DATA_DIR=str(data_dir),
        HERMES_TEMPORAL_PORT=str(free_port()),
        HERMES_UI_PORT=str(ui_port),
        HERMES_REDIS_PORT=str(free_port()),
        HERMES_CODEC_PORT=str(free_port()),
        HERMES_COMMAND_KEYS="",  # the data dir's key file, as on a user's machine
    )
    dev = await start_cli("dev", "--no-worker", env=dev_env, cwd=tmp_path)
    worker = None
    try:
        banner = await read_until(dev, "Ready.", timeout_seconds=120)
        assert f"http://127.0.0.1:{ui_port}" in banner  # the Web UI
        pasted = exports(banner)
        assert pasted == {
            "TEMPORAL_ADDRESS": f"127.0.0.1:{dev_env['HERMES_TEMPORAL_PORT']}",
            "REDIS_URL": f"redis://127.0.0.1:{dev_env['HERMES_REDIS_PORT']}/0",
            "HERMES_TASK_QUEUE": "hermes-sessions",
            "HERMES_MEMORY_URI": str(data_dir / "memory"),
            "HERMES_COMMAND_KEY_FILE": str(data_dir / "command-keys"),
        }
        assert "Serving" not in banner  # no worker in the servers' process

        # Another terminal: only the pasted lines (memory off: no embedder to load).
        elsewhere = tmp_path / "elsewhere"
        elsewhere.mkdir()
        worker_env_ = clean_env(**pasted, HERMES_MEMORY_ENABLED="false", HERMES_COMMAND_KEYS="")
        worker = await start_cli("worker", env=worker_env_, cwd=elsewhere)
        served = await read_until(worker, "Serving.", timeout_seconds=120)
        assert "scripted stand-in" in served and "hermes-sessions" in served

        sent = await hermes_cli(
            "send", f"s-{uuid.uuid4().hex[:8]}", "What is (17 + 25) * 3?", "--json", env=worker_env_, cwd=elsewhere
        )
        assert sent.returncode == 0, sent.stdout + sent.stderr
        assert "126" in TurnResult.model_validate_json(sent.stdout).reply

        code, rest = await interrupt(worker)
        assert code == 0, rest
        code, rest = await interrupt(dev)
        assert code == 0, rest
        assert "Stopped." in rest
    finally:
        await kill(*(p for p in (worker, dev) if p is not None))
    assert wait_until_no_process_uses(data_dir, timeout_seconds=30) == []


async def test_dev_no_worker_with_both_servers_configured_says_there_is_nothing_to_run(tmp_path):
    env = clean_env(
        TEMPORAL_ADDRESS="127.0.0.1:9", REDIS_URL="redis://127.0.0.1:9/0", HERMES_DATA_DIR=str(tmp_path / "data")
    )
    run = await hermes_cli("dev", "--no-worker", env=env, cwd=tmp_path)
    assert run.returncode == 2
    assert_one_line_error(run, "nothing to run", "hermes worker")
    assert not (tmp_path / "data").exists()  # nothing was started


@pytest.fixture
def worker_cli_env(temporal_client: Client, redis_url: str, task_queue: str, tmp_path: Path) -> dict[str, str]:
    """A ``hermes worker`` with an OpenAI-compatible model, a tool module, a tool file and
    an MCP server, every one of them given a fake secret."""
    mcp_config = tmp_path / "mcp.json"
    mcp_config.write_text(
        json.dumps({
            "mcpServers": {
                "notes": {"command": sys.executable, "args": ["-c", "pass"], "env": {"TOKEN": "${HERMES_TEST_MCP_TOKEN}"}},
            }
        }),
        encoding="utf-8",
    )
    tool_file = tmp_path / "weather.json"
    tool_file.write_text(
        json.dumps({
            "tools": [{
                "name": "weather_now",
                "description": "The weather now.",
                "http": {"url": "http://127.0.0.1:9/now", "headers": {"Authorization": "Bearer ${HERMES_TEST_TOOL_TOKEN}"}},
            }]
        }),
        encoding="utf-8",
    )
    return clean_env(
        TEMPORAL_ADDRESS=temporal_client.service_client.config.target_host,
        REDIS_URL=redis_url,
        HERMES_TASK_QUEUE=task_queue,
        HERMES_MEMORY_ENABLED="false",
        HERMES_MODEL_PROVIDER="openai",
        HERMES_MODEL="gpt-4o-mini",
        OPENAI_BASE_URL=f"http://hermes:{BASE_URL_SECRETS[0]}@127.0.0.1:9/v1?api-key={BASE_URL_SECRETS[1]}",
        HERMES_TOOL_MODULES="tests.crash_tools",
        HERMES_TOOL_FILES=str(tool_file),
        HERMES_MCP_CONFIG=str(mcp_config),
        **SECRETS,
    )


@pytest.mark.timeout(300)
async def test_the_worker_banner_lists_what_it_serves_and_no_secret(worker_cli_env, task_queue, tmp_path):
    worker = await start_cli("worker", env=worker_cli_env, cwd=tmp_path)
    try:
        banner = await read_until(worker, "Serving.", timeout_seconds=120)
        code, rest = await interrupt(worker)
    finally:
        await kill(worker)
    assert code == 0, rest
    lines = {line.split("  ", 1)[0]: line.split("  ", 1)[-1].strip() for line in banner.splitlines() if "  " in line}
    assert lines["Model"] == "openai gpt-4o-mini via http://***@127.0.0.1:9/v1?api-key=*** (profile auto)"
    assert lines["Tool modules"] == "tests.crash_tools"
    assert lines["Tool files"] == worker_cli_env["HERMES_TOOL_FILES"]
    assert lines["MCP servers"] == "notes"
    assert lines["Memory"] == "off"
    assert lines["Task queue"] == task_queue
    assert lines["Temporal"].startswith(worker_cli_env["TEMPORAL_ADDRESS"])
    printed = banner + rest
    for secret in [*SECRETS.values(), *BASE_URL_SECRETS]:
        assert secret not in printed


def test_the_worker_description_names_the_script_and_the_memory_store_and_masks_urls(tmp_path):
    script = tmp_path / "script.yaml"
    settings = Settings(
        _env_file=None,
        script=script,
        memory_enabled=True,
        memory_embedder="use",
        memory_uri=str(tmp_path / "memory"),
        redis_url="redis://:redispw-1d4c@127.0.0.1:6379/0",
        temporal_address="127.0.0.1:7233",
    )
    provider = SimpleNamespace(name="scripted", source=str(script))
    fields = dict(describe_worker(settings, provider, registry=[object()] * 3, mcp=None))
    assert fields["Model"] == f"scripted stand-in, script {script}"
    assert fields["Tools"] == "3 registered"
    assert fields["MCP servers"] == "none"
    assert fields["Memory"] == f"on (embedder use, store {tmp_path / 'memory'})"
    assert fields["Redis"] == "redis://***@127.0.0.1:6379/0"


def test_worker_env_comments_out_a_redis_url_with_credentials_and_quotes_values(tmp_path):
    settings = Settings(_env_file=None, data_dir=tmp_path / "my data", task_queue="q one", memory_uri=None)
    lines = worker_env(settings, "127.0.0.1:7233", "redis://:pw-77@10.0.0.5:6379/0")
    assert lines[0] == "export TEMPORAL_ADDRESS=127.0.0.1:7233"
    assert lines[1].startswith("# export REDIS_URL='redis://***@10.0.0.5:6379/0'")
    assert "pw-77" not in "\n".join(lines)
    assert exports("\n".join(lines)) == {
        "TEMPORAL_ADDRESS": "127.0.0.1:7233",
        "HERMES_TASK_QUEUE": "q one",
        "HERMES_MEMORY_URI": str(tmp_path / "my data" / "memory"),
        "HERMES_COMMAND_KEY_FILE": str(tmp_path / "my data" / "command-keys"),
    }
