"""The deployment files, checked without Docker (issue 28): ``docker-compose.yml`` against
the Compose Specification's JSON schema (vendored in ``tests/deploy/``) and the rules of
README "Deploying" (ports on 127.0.0.1, Redis with a password, ``maxmemory`` and no
eviction, a health check on every Hermes service, no secret written inline, only real
setting names given to Hermes), the ``Dockerfile`` (a pinned base of pyproject's Python, a
build stage holding the compiler, a non-root user, a ``HEALTHCHECK``, commands the CLI
has), and ``hermes healthcheck`` itself against a real codec server, API and worker."""

from __future__ import annotations

import asyncio
import json
import re
import shlex
import socket
import tomllib
from pathlib import Path
from typing import Any

import httpx2 as httpx
import jsonschema
import pytest
import redis.asyncio as aioredis
import yaml
from packaging.specifiers import SpecifierSet
from pydantic import AliasChoices
from typer.testing import CliRunner

from hermes.cli import app
from hermes.cli.health import target_of, worker_polls
from hermes.content.blobs import BlobStore
from hermes.infra.stack import free_port
from hermes.providers.scripted import ScriptedModel
from hermes.security.codec_server import default_ui_origins, running_codec_server
from hermes.settings import Settings

ROOT = Path(__file__).resolve().parent.parent
COMPOSE = ROOT / "docker-compose.yml"
DOCKERFILE = ROOT / "Dockerfile"
SCHEMA = Path(__file__).resolve().parent / "deploy" / "compose-spec.json"

HERMES_SERVICES = ("worker", "api", "codec-server")

EXTERNAL_VARIABLES = {
    # LanceDB (its object_store) reads these itself for an s3:// HERMES_MEMORY_URI; Hermes'
    # settings have no names for them yet (README "Deploying").
    "AWS_ENDPOINT",
    "AWS_ALLOW_HTTP",
    "AWS_DEFAULT_REGION",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
}
"""Variables given to the Hermes services that are not Hermes settings, and who reads them."""

SECRET_NAME = re.compile(r"PASSWORD|PWD|TOKEN|SECRET|API_KEY|_KEYS?$")
INTERPOLATION = re.compile(r"\$\{[A-Za-z_][A-Za-z0-9_]*(?::?[?+-][^}]*)?\}")
REQUIRED_VARIABLE = re.compile(r"^\$\{[A-Za-z_][A-Za-z0-9_]*(?::\?[^}]*)?\}$")

runner = CliRunner()


def compose() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE.read_text())


def environment(service: dict[str, Any]) -> dict[str, str]:
    """A service's ``environment``, list or mapping form, as a mapping."""
    env = service.get("environment") or {}
    if isinstance(env, list):
        return dict(item.split("=", 1) if "=" in item else (item, "") for item in env)
    return {name: "" if value is None else str(value) for name, value in env.items()}


def setting_names() -> set[str]:
    """Every environment variable :class:`hermes.settings.Settings` reads."""
    names: set[str] = set()
    for name, field in Settings.model_fields.items():
        alias = field.validation_alias
        if isinstance(alias, AliasChoices):
            names.update(str(choice) for choice in alias.choices)
        elif isinstance(alias, str):
            names.add(alias)
        else:
            names.add(f"HERMES_{name.upper()}")
    return names


def published_ports(service: dict[str, Any]) -> list[tuple[str | None, str]]:
    """``(host address, port)`` of each port a service publishes (short or long syntax)."""
    ports = []
    for port in service.get("ports", []):
        if isinstance(port, dict):
            ports.append((port.get("host_ip"), str(port.get("published"))))
            continue
        parts = str(port).rsplit(":", 2)
        ports.append((parts[0] if len(parts) == 3 else None, parts[-2] if len(parts) > 1 else parts[-1]))
    return ports


def literal_text(value: str) -> str:
    """``value`` without its ``${...}`` interpolations: what compose would not take from outside."""
    return INTERPOLATION.sub("", value)


# --------------------------------------------------------------------------- compose


def test_compose_file_is_valid_against_the_compose_specification_schema():
    validator = jsonschema.Draft7Validator(json.loads(SCHEMA.read_text()))
    errors = [f"{'/'.join(map(str, e.path))}: {e.message}" for e in validator.iter_errors(compose())]
    assert errors == []

    # The schema does bite: a misspelled key or a wrong type is refused.
    broken = compose()
    broken["services"]["worker"]["helthcheck"] = broken["services"]["worker"].pop("healthcheck")
    broken["services"]["redis"]["depends_on"] = 5
    assert len(list(validator.iter_errors(broken))) >= 2


def test_every_published_port_is_bound_to_localhost_only():
    services = compose()["services"]
    published = {name: published_ports(service) for name, service in services.items() if service.get("ports")}
    assert {"temporal", "temporal-ui", "redis", "api", "codec-server"} <= set(published)
    for name, ports in published.items():
        for host, port in ports:
            assert host == "127.0.0.1", f"{name} publishes {port} on {host or 'every interface'}"


def test_redis_has_a_password_a_memory_bound_and_never_evicts():
    redis = compose()["services"]["redis"]
    command = " ".join(redis["command"]) if isinstance(redis["command"], list) else redis["command"]
    words = shlex.split(command.replace("$$", "$"))
    env = environment(redis)
    assert words[words.index("--requirepass") + 1] == "$REDIS_PASSWORD"
    assert REQUIRED_VARIABLE.match(env["REDIS_PASSWORD"]), "the password comes from .env and is required"
    assert words[words.index("--maxmemory") + 1] == "$REDIS_MAXMEMORY" and env["REDIS_MAXMEMORY"]
    assert words[words.index("--maxmemory-policy") + 1] == "noeviction"
    assert "--appendonly" in words
    # Its health check authenticates (an unauthenticated PING is refused with NOAUTH).
    assert "REDISCLI_AUTH" in " ".join(redis["healthcheck"]["test"])
    # And every Hermes service uses that password.
    for name in HERMES_SERVICES:
        assert "${REDIS_PASSWORD" in environment(compose()["services"][name])["REDIS_URL"]


def test_every_hermes_service_runs_a_cli_command_with_a_health_check_that_fits_it():
    services = compose()["services"]
    settings = Settings()
    for name in HERMES_SERVICES:
        service = services[name]
        assert service.get("build") == ".", f"{name} is built from the Dockerfile"
        command = service["command"]
        help_run = runner.invoke(app, [*command, "--help"])
        assert help_run.exit_code == 0, f"{name}: hermes {' '.join(command)} --help: {help_run.output}"
        test = service["healthcheck"]["test"]
        assert test[:3] == ["CMD", "hermes", "healthcheck"], f"{name}: {test}"
        # The URL it checks is the one the command serves (its --port, on this host).
        assert test[3] == target_of(["hermes", *command], settings), name
        assert service["healthcheck"]["start_period"]
    assert services["worker"]["command"] == ["worker"]


def test_hermes_services_start_after_what_they_need_is_healthy():
    services = compose()["services"]
    for name in HERMES_SERVICES:
        depends_on = services[name]["depends_on"]
        assert "redis" in depends_on
        if name != "codec-server":
            assert {"temporal-namespace", "minio-bucket"} <= set(depends_on)
        for dependency, rule in depends_on.items():
            condition = rule["condition"]
            assert condition in ("service_healthy", "service_completed_successfully"), (name, dependency)
            if condition == "service_healthy":
                assert "healthcheck" in services[dependency], f"{name} waits for {dependency}'s health, which it has not"


def test_hermes_services_get_only_real_setting_names():
    known = setting_names() | EXTERNAL_VARIABLES
    assert {"HERMES_MEMORY_URI", "REDIS_URL", "TEMPORAL_ADDRESS", "HERMES_CODEC_TOKEN"} <= setting_names()
    for name in HERMES_SERVICES:
        unknown = set(environment(compose()["services"][name])) - known
        assert not unknown, f"{name} gets variables Hermes does not read: {sorted(unknown)}"
    example = (ROOT / "deploy" / "hermes.env.example").read_text()
    named = set(re.findall(r"^#?\s*([A-Z][A-Z0-9_]*)=", example, re.MULTILINE))
    assert named and named <= known, sorted(named - known)
    # A misspelled one would be caught.
    assert "HERMES_MEMORY_URL" not in known


def test_no_secret_is_written_in_the_compose_file():
    data = compose()
    for name, service in data["services"].items():
        for variable, value in environment(service).items():
            if SECRET_NAME.search(variable) and not variable.endswith("_FILE"):
                assert REQUIRED_VARIABLE.match(value), f"{name}: {variable} must be a required ${{...}} from .env, not {value!r}"
            if "://" in value and "@" in value:  # credentials in a URL
                userinfo = value.split("://", 1)[1].split("@", 1)[0]
                assert literal_text(userinfo) in ("", ":"), f"{name}: {variable} has credentials written in it"
    # The key rings are Docker secrets from files, never values.
    hermes = environment(data["services"]["worker"])
    for variable, secret in (("HERMES_ENCRYPTION_KEY_FILE", "hermes-encryption-keys"), ("HERMES_COMMAND_KEY_FILE", "hermes-command-keys")):
        assert hermes[variable] == f"/run/secrets/{secret}"
        assert secret in data["services"]["worker"]["secrets"]
        assert data["secrets"][secret]["file"].startswith("./deploy/secrets/")
        assert variable.removesuffix("_FILE") + "S" not in hermes
    # Nothing secret is committed or sent to the image build.
    ignored = (ROOT / ".gitignore").read_text().splitlines()
    assert {".env", "deploy/secrets/", "deploy/hermes.env"} <= set(ignored)
    dockerignore = (ROOT / ".dockerignore").read_text().splitlines()
    assert {".env", "deploy/secrets/", ".hermes/", "deploy/hermes.env"} <= set(dockerignore)


def test_every_worker_shares_one_memory_store_on_the_object_store():
    services = compose()["services"]
    uris = {environment(services[name])["HERMES_MEMORY_URI"] for name in HERMES_SERVICES}
    assert len(uris) == 1 and next(iter(uris)).startswith("s3://")
    assert "mc mb --ignore-existing" in "".join(services["minio-bucket"]["command"])
    assert services["minio"]["healthcheck"]["test"]


# --------------------------------------------------------------------------- Dockerfile


def dockerfile_instructions(text: str) -> list[tuple[str, str]]:
    """``(INSTRUCTION, arguments)`` of a Dockerfile: comments dropped, continuations joined."""
    joined = re.sub(r"\\\n", " ", "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#")))
    instructions = []
    for line in joined.splitlines():
        if line.strip():
            word, _, rest = line.strip().partition(" ")
            instructions.append((word.upper(), rest.strip()))
    return instructions


def stages(instructions: list[tuple[str, str]]) -> list[list[tuple[str, str]]]:
    """The build stages, each starting with its FROM."""
    result: list[list[tuple[str, str]]] = []
    for instruction in instructions:
        if instruction[0] == "FROM":
            result.append([])
        if result:
            result[-1].append(instruction)
    return result


def test_dockerfile_builds_on_a_pinned_slim_python_of_pyprojects_version():
    instructions = dockerfile_instructions(DOCKERFILE.read_text())
    args = dict(a.split("=", 1) for kind, a in instructions if kind == "ARG" and "=" in a)
    images = [re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], a.split()[0]) for kind, a in instructions if kind == "FROM"]
    assert len(images) >= 2, "multi-stage: a build stage and the runtime"
    requires = SpecifierSet(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"])
    for image in images:
        match = re.fullmatch(r"python:(\d+\.\d+\.\d+)-slim-[a-z]+", image)
        assert match, f"{image}: expected python:<major.minor.patch>-slim-<debian release>, never a floating tag"
        assert match.group(1) in requires


def test_dockerfile_runtime_has_no_compiler_a_non_root_user_and_a_health_check():
    all_stages = stages(dockerfile_instructions(DOCKERFILE.read_text()))
    build, runtime = all_stages[0], all_stages[-1]
    assert any("build-essential" in a for kind, a in build if kind == "RUN")
    runtime_runs = " ".join(a for kind, a in runtime if kind == "RUN")
    assert not re.search(r"build-essential|\bgcc\b|apt-get install", runtime_runs)
    copies = [a for kind, a in runtime if kind == "COPY"]
    assert copies == ["--from=build /opt/venv /opt/venv"], "only the virtualenv comes from the build stage"
    (user,) = [a for kind, a in runtime if kind == "USER"]
    assert user.split(":")[0] not in ("root", "0")
    (check,) = [a for kind, a in runtime if kind == "HEALTHCHECK"]
    assert "--start-period" in check and json.loads(check.split("CMD", 1)[1]) == ["hermes", "healthcheck"]


def test_dockerfile_entrypoint_and_command_are_real_cli_commands():
    runtime = stages(dockerfile_instructions(DOCKERFILE.read_text()))[-1]
    entrypoint = json.loads(dict(runtime)["ENTRYPOINT"])
    command = json.loads(dict(runtime)["CMD"])
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert entrypoint == ["hermes"] and scripts["hermes"] == "hermes.cli:app"
    for args in (command, ["healthcheck"]):
        result = runner.invoke(app, [*args, "--help"])
        assert result.exit_code == 0, result.output
    assert runner.invoke(app, ["no-such-command", "--help"]).exit_code != 0


# --------------------------------------------------------------------------- hermes healthcheck


def test_healthcheck_finds_what_to_check_from_a_process_command_line():
    settings = Settings(codec_port=8099)
    venv = "/opt/venv/bin"
    assert target_of([f"{venv}/python", f"{venv}/hermes", "worker"], settings) == "worker"
    assert target_of(["python", "-m", "hermes.cli", "worker"], settings) == "worker"
    assert target_of([f"{venv}/hermes", "serve", "--host", "0.0.0.0", "--port", "8000"], settings) == "http://127.0.0.1:8000/health"
    assert target_of(["hermes", "serve"], settings) == "http://127.0.0.1:8080/health"
    assert target_of(["hermes", "codec-server", "--host=10.0.0.5"], settings) == "http://10.0.0.5:8099/health"
    assert target_of(["hermes", "chat"], settings) is None
    assert target_of(["/usr/bin/redis-server", "worker"], settings) is None


async def test_codec_server_health_says_whether_redis_answers(redis):
    dead = BlobStore(aioredis.Redis(host="127.0.0.1", port=free_port()))
    for store, status in ((BlobStore(redis), 200), (dead, 503)):
        async with running_codec_server(store, port=free_port(), ui_origins=default_ui_origins(), token="t") as url:
            async with httpx.AsyncClient(base_url=url, timeout=10.0) as client:
                answer = await client.get("/health")  # no token needed
                assert answer.status_code == status
                assert answer.json() == {"status": "ok" if status == 200 else "unavailable", "redis": status == 200}
                assert (await client.post("/decode", json={"payloads": []})).status_code == 401
    await dead.redis.aclose()


async def test_healthcheck_passes_for_a_serving_url_and_fails_for_a_closed_port(redis):
    async with running_codec_server(BlobStore(redis), port=free_port(), ui_origins=default_ui_origins()) as url:
        ok = await asyncio.to_thread(runner.invoke, app, ["healthcheck", f"{url}/health"])
        assert ok.exit_code == 0, ok.output
    closed = await asyncio.to_thread(runner.invoke, app, ["healthcheck", f"http://127.0.0.1:{free_port()}/health"])
    assert closed.exit_code == 1 and "did not answer" in closed.output
    unknown = await asyncio.to_thread(runner.invoke, app, ["healthcheck", "postgres"])
    assert unknown.exit_code == 1


@pytest.mark.timeout(300)
async def test_worker_healthcheck_passes_only_while_a_worker_of_this_host_polls(run_worker, settings, temporal_env):
    settings = settings.model_copy(update={"temporal_address": temporal_env.client.service_client.config.target_host})
    host = socket.gethostname()
    problem = await worker_polls(settings, host)
    assert problem is not None and "no worker of host" in problem
    async with run_worker(ScriptedModel.demo()):
        # The worker's first poll reaches the server a moment after it starts.
        for _ in range(200):
            if (problem := await worker_polls(settings, host)) is None:
                break
            await asyncio.sleep(0.05)
        assert problem is None
        assert await worker_polls(settings, "another-host") is not None
    unreachable = settings.model_copy(update={"temporal_address": f"127.0.0.1:{free_port()}"})
    assert "did not describe" in (await worker_polls(unreachable, host) or "")
