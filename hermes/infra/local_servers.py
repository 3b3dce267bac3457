"""Temporal and Redis for a command: the servers the settings name, or the embedded stack.

Used by ``hermes dev`` (with or without ``--no-worker``) and ``hermes demo``:
:func:`local_servers` starts what ``TEMPORAL_ADDRESS`` / ``REDIS_URL`` do not
name as an :class:`~hermes.infra.stack.EmbeddedStack`, or reuses the one a running ``hermes
dev`` holds, and says where everything is (:class:`Servers`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass

from hermes import names
from hermes.infra.stack import EmbeddedStack, StackError
from hermes.settings import Settings

__all__ = ["Servers", "local_servers"]

_PROBE_TIMEOUT_SECONDS = 5.0
"""How long a running stack's servers may take to answer before it counts as not usable."""


@dataclass
class Servers:
    """Where the Temporal server, its Web UI and Redis are, and who started them."""

    temporal_address: str
    redis_url: str
    namespace: str = "default"
    ui_url: str | None = None
    """Base URL of the Temporal Web UI, when it is known (the embedded one)."""
    stack: EmbeddedStack | None = None
    """The stack this process started, or None."""
    reused: bool = False
    """True when a stack started by another process (a running `hermes dev`) is used."""

    def workflow_url(self, session_id: str) -> str | None:
        """The Web UI page of a session's workflow, or None when the UI is unknown."""
        if self.ui_url is None:
            return None
        return f"{self.ui_url}/namespaces/{self.namespace}/workflows/{session_id}"


async def _start_stack(stack: EmbeddedStack) -> None:
    """Start ``stack``; if the caller is cancelled meanwhile, finish starting, then stop it,
    so that no server outlives a Ctrl-C during start-up."""
    starting = asyncio.ensure_future(stack.start_async())
    try:
        await asyncio.shield(starting)
    except asyncio.CancelledError:
        with contextlib.suppress(Exception):
            await starting
        await stack.stop_async()
        raise


async def _servers_answer(settings: Settings) -> bool:
    """True if a Temporal frontend and a Redis answer at the settings' addresses (with
    their TLS settings)."""
    from hermes.infra.connections import connect_temporal
    from worker import connect_redis

    try:
        client = await asyncio.wait_for(connect_temporal(settings), _PROBE_TIMEOUT_SECONDS)
        await asyncio.wait_for(client.service_client.check_health(), _PROBE_TIMEOUT_SECONDS)
    except Exception:  # noqa: BLE001 - any failure means "not usable"
        return False
    redis = connect_redis(settings=settings)
    try:
        return bool(await asyncio.wait_for(redis.ping(), _PROBE_TIMEOUT_SECONDS))
    except Exception:  # noqa: BLE001
        return False
    finally:
        await redis.aclose()


@contextlib.asynccontextmanager
async def local_servers(
    settings: Settings, *, ui: bool = True, reuse_running: bool = False, ui_codec_endpoint: str | None = None
) -> AsyncIterator[Servers]:
    """Temporal and Redis for a command: the user's, or the embedded stack.

    With ``TEMPORAL_ADDRESS`` and ``REDIS_URL`` both set nothing is started. Otherwise the
    missing ones are started as an :class:`EmbeddedStack` in ``settings.data_dir`` on
    ``settings.temporal_port`` / ``ui_port`` / ``redis_port``, and stopped on exit. An
    embedded Temporal gets the Hermes search attributes; on any other server the caller
    registers them (:func:`hermes.infra.stack.ensure_search_attributes`, idempotent).

    Args:
        settings: addresses, ports, data directory and namespace.
        ui: serve the Temporal Web UI with the embedded server.
        ui_codec_endpoint: the codec server an embedded Web UI decodes payloads through.
        reuse_running: if the stack cannot start because one (a ``hermes dev``) already
            holds the data directory or the ports, use those servers when they answer.

    Yields:
        The addresses to use.

    Raises:
        StackAlreadyRunning: another stack holds the data directory (and not reused).
        StackError: the stack could not start (port in use, binary missing, ...).
        ConfigError: a bad TLS setting, or TLS settings for a server that is embedded
            (checked before anything starts).
    """
    from hermes.infra.connections import check_connection_settings

    check_connection_settings(settings)
    external_temporal = settings.temporal_address is not None
    external_redis = settings.redis_url is not None
    namespace = settings.temporal_namespace
    if external_temporal and external_redis:
        yield Servers(settings.resolved_temporal_address, settings.resolved_redis_url, namespace)
        return
    stack = EmbeddedStack(
        settings.data_dir,
        temporal_port=settings.temporal_port,
        ui_port=settings.ui_port,
        redis_port=settings.redis_port,
        search_attributes=names.SEARCH_ATTRIBUTES,
        start_temporal=not external_temporal,
        start_redis=not external_redis,
        ui=ui,
        ui_codec_endpoint=ui_codec_endpoint,
        namespace=namespace,
    )
    try:
        await _start_stack(stack)
    except StackError:
        if not reuse_running or not await _servers_answer(settings):
            raise
        started = False
    else:
        started = True
    if not started:
        yield Servers(
            settings.resolved_temporal_address,
            settings.resolved_redis_url,
            namespace,
            ui_url=None if external_temporal or not ui else f"http://127.0.0.1:{settings.ui_port}",
            reused=True,
        )
        return
    try:
        yield Servers(
            settings.temporal_address or stack.temporal_address,
            settings.redis_url or stack.redis_url,
            namespace,
            ui_url=None if external_temporal else stack.ui_url,
            stack=stack,
        )
    finally:
        await stack.stop_async()
