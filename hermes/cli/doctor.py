"""``hermes doctor``: check every configured service and say where each thing lives.

One line per check, ``ok`` or ``FAIL``, the place (address, path, URI; credentials masked)
and what was found; exit 1 when any check failed. Nothing is written or made (no key file,
no memory directory) and no paid API is called: the model provider's base URL is only
asked whether it answers HTTP.

Checks, in order: Temporal (reachable, namespace known), Redis (answers PING), the memory
store (where it is, whether every worker shares it, whether it opens), the model provider
(configured; its base URL reachable), MCP servers (the configuration file), encryption
keys and command keys (present and well formed).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from rich.text import Text

from hermes.cli.errors import EXIT_REFUSED, connect_reason, explain, fail, hide_password
from hermes.cli.output import out
from hermes.cli.root import app
from hermes.cli.running import load_settings, quiet_runtime, run_command

if TYPE_CHECKING:
    from hermes.settings import Settings

__all__ = ["Finding", "doctor", "run_checks"]

CHECK_TIMEOUT_SECONDS = 15.0
"""The most time one check may take (a server that does not answer fails its check)."""


@dataclass(frozen=True)
class Finding:
    """The outcome of one check."""

    name: str
    """What was checked: ``Temporal``, ``Redis``, ``Memory store``, ..."""
    ok: bool
    where: str
    """Where it lives (address, path, URI), credentials masked."""
    detail: str
    """What was found, or why the check failed."""


class CheckFailed(Exception):
    """A check's failure with the line to print (``where`` is the check's own)."""


def _reason(err: BaseException, settings: Settings) -> str:
    import redis.exceptions

    if isinstance(err, RuntimeError) and str(err).startswith("Failed client connect"):
        return f"unreachable ({connect_reason(str(err))})"
    if isinstance(err, (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError)):
        return f"unreachable ({connect_reason(str(err))})"
    explained = explain(err, settings)
    if explained is not None:
        return explained[0]
    return f"{type(err).__name__}: {err}"[:300]


async def _temporal(settings: Settings) -> str:
    from temporalio.api.workflowservice.v1 import DescribeNamespaceRequest
    from temporalio.service import RPCError, RPCStatusCode

    from hermes.infra.connections import connect_temporal

    client = await connect_temporal(settings, runtime=quiet_runtime())
    try:
        await client.workflow_service.describe_namespace(DescribeNamespaceRequest(namespace=settings.temporal_namespace))
    except RPCError as err:
        if err.status == RPCStatusCode.NOT_FOUND:
            raise CheckFailed(f"namespace {settings.temporal_namespace!r} does not exist (HERMES_TEMPORAL_NAMESPACE)") from None
        raise
    return f"reachable, namespace {settings.temporal_namespace!r} found"


def _redis_mode(settings: Settings) -> str:
    """`` (cluster)`` or `` (sentinel <master> via <sentinels>)``; nothing for one server."""
    if settings.redis_mode == "sentinel":
        return f" (sentinel {settings.redis_sentinel_master!r} via {', '.join(settings.redis_sentinels) or 'no sentinels'})"
    return " (cluster)" if settings.redis_mode == "cluster" else ""


async def _redis(settings: Settings) -> str:
    from worker import connect_redis

    redis = connect_redis(settings=settings)
    try:
        await redis.ping()
        info = await redis.info("server")
    finally:
        await redis.aclose()
    return f"answers PING (Redis {info.get('redis_version', '?')})"


def _memory_store(settings: Settings) -> str:
    from hermes.errors import ConfigError
    from hermes.memory.location import check_memory_location

    try:
        location = check_memory_location(settings)
    except ConfigError as err:
        raise CheckFailed(str(err)) from None
    if location.local and not Path(location.uri).exists():
        parent = next(p for p in Path(location.uri).parents if p.exists())
        if not _writable(parent):
            raise CheckFailed(f"does not exist, and {parent} is not writable: it cannot be made")
        return "not made yet: the first worker makes it"
    from hermes.infra import lance

    try:
        options = settings.resolved_memory_storage_options()  # secrets: never printed
    except ConfigError as err:
        raise CheckFailed(str(err)) from None
    tables = lance.connect(location.uri, options if lance.is_remote(location.uri) else None).table_names()
    return f"opens, {len(tables)} tables"


def _writable(path: Path) -> bool:
    import os

    return os.access(path, os.W_OK | os.X_OK)


async def _model(settings: Settings) -> str:
    from hermes.providers import make_provider

    provider = make_provider(settings)  # a wrong script or profile fails here
    if settings.model_provider == "scripted":
        return f"scripted stand-in, script {getattr(provider, 'source', settings.script) or 'packaged demo'}"
    base = settings.openai_base_url or "https://api.openai.com/v1"
    if settings.openai_base_url is None and settings.openai_api_key is None:
        raise CheckFailed("OPENAI_API_KEY is unset: api.openai.com answers nothing without one")
    import httpx

    async with httpx.AsyncClient(timeout=5.0) as http:
        try:
            response = await http.get(base.rstrip("/") + "/models")  # no key sent: reachability only
        except httpx.HTTPError as err:
            raise CheckFailed(f"{hide_password(base)} does not answer ({type(err).__name__}: {err})") from None
    key = "API key set" if settings.openai_api_key is not None else "no API key"
    return f"model {settings.model}, base URL answers HTTP {response.status_code}, {key}"


def _mcp(settings: Settings) -> str:
    import os

    if settings.mcp_config is None:
        return "none configured"
    from hermes.mcp.config import load_mcp_config

    config = load_mcp_config(settings.mcp_config, environ=os.environ)
    names = list(config.enabled_servers())
    return f"{len(names)} enabled: {', '.join(names) or 'none'} (not started)"


def _encryption(settings: Settings) -> str:
    from hermes.security.encryption import keyring_from_settings

    ring = keyring_from_settings(settings)
    if ring is None:
        return "off: payloads stored in clear"
    return f"{len(ring.keys)} key(s), encrypting with {ring.current!r}"


def _command_keys(settings: Settings) -> str:
    from hermes.memory.location import temporal_is_remote
    from hermes.security.command_auth import DEFAULT_KEY_FILE, ring_from_settings

    given = settings.command_keys is not None or settings.command_key_file is not None
    default = settings.data_dir / DEFAULT_KEY_FILE
    if not given and not default.exists():
        if temporal_is_remote(settings):
            raise CheckFailed(
                "none: each process would make its own and refuse the others' commands; give every worker, "
                "API server and client the same HERMES_COMMAND_KEYS or HERMES_COMMAND_KEY_FILE (`hermes command-key`)"
            )
        return "not made yet: the first process makes one (this machine only)"
    ring = ring_from_settings(settings)
    return f"{len(ring.keys)} key(s), signing with {ring.current!r}"


def _where(settings: Settings) -> dict[str, str]:
    from hermes.infra.connections import describe_temporal_security
    from hermes.memory.location import memory_location

    if settings.command_keys is not None:
        command_keys = "HERMES_COMMAND_KEYS"
    else:
        from hermes.security.command_auth import DEFAULT_KEY_FILE

        command_keys = str(Path(settings.command_key_file or settings.data_dir / DEFAULT_KEY_FILE).expanduser().absolute())
    return {
        "Temporal": f"{hide_password(settings.resolved_temporal_address)} "
        f"({'yours' if settings.temporal_address else 'embedded, hermes dev'}, {describe_temporal_security(settings)})",
        "Redis": hide_password(settings.resolved_redis_url) + _redis_mode(settings),
        "Memory store": memory_location(settings).describe(),
        "Model": settings.model_provider
        + ("" if settings.model_provider == "scripted" else f" via {hide_password(settings.openai_base_url or 'https://api.openai.com/v1')}"),
        "MCP servers": str(settings.mcp_config) if settings.mcp_config else "HERMES_MCP_CONFIG unset",
        "Encryption keys": "HERMES_ENCRYPTION_KEYS" if settings.encryption_keys is not None
        else str(settings.encryption_key_file or "HERMES_ENCRYPTION_KEYS / _KEY_FILE unset"),
        "Command keys": command_keys,
    }


async def run_checks(settings: Settings) -> list[Finding]:
    """Run every check, each bounded by :data:`CHECK_TIMEOUT_SECONDS`.

    Args:
        settings: what to check.

    Returns:
        One :class:`Finding` per check, in the order of the module docstring.
    """
    checks: list[tuple[str, Callable[[], Awaitable[str]]]] = [
        ("Temporal", lambda: _temporal(settings)),
        ("Redis", lambda: _redis(settings)),
        ("Memory store", lambda: asyncio.to_thread(_memory_store, settings)),
        ("Model", lambda: _model(settings)),
        ("MCP servers", lambda: asyncio.to_thread(_mcp, settings)),
        ("Encryption keys", lambda: asyncio.to_thread(_encryption, settings)),
        ("Command keys", lambda: asyncio.to_thread(_command_keys, settings)),
    ]
    where = _where(settings)
    findings = []
    for name, check in checks:
        try:
            detail, ok = await asyncio.wait_for(check(), CHECK_TIMEOUT_SECONDS), True
        except asyncio.TimeoutError:
            detail, ok = f"no answer within {CHECK_TIMEOUT_SECONDS:g} s", False
        except CheckFailed as err:
            detail, ok = str(err), False
        except Exception as err:  # noqa: BLE001 - any failure is this check's finding
            detail, ok = _reason(err, settings), False
        findings.append(Finding(name, ok, where[name], detail))
    return findings


@app.command()
def doctor() -> None:
    """Check every configured service (Temporal, Redis, the memory store, the model
    provider, MCP servers, keys) and print where each lives; exit 1 if any check fails.

    Writes nothing and calls no paid API.
    """
    settings = load_settings()

    async def main() -> list[Finding]:
        return await run_checks(settings)

    findings = run_command(main, settings)
    width = max(len(f.name) for f in findings)
    for finding in findings:
        mark = Text("ok  ", style="green") if finding.ok else Text("FAIL", style="bold red")
        line = Text.assemble(mark, " ", (finding.name.ljust(width), "bold"), "  ", finding.where, ": ", finding.detail)
        out.print(line, soft_wrap=True)  # one line per check, whatever the terminal's width
    failed = [f.name for f in findings if not f.ok]
    if failed:
        raise fail(f"{len(failed)} check(s) failed: {', '.join(failed)}", EXIT_REFUSED)
    out.print("All checks passed.")
