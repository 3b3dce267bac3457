"""Settings wiring: what :meth:`hermes.client.HermesClient.connect` builds a client from
(the Temporal connection, Redis, the durable store, the session config, the memory store)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from hermes.infra.durable import DurableStore
from hermes.models import SessionConfig
from hermes.security import command_auth
from hermes.sessions.checks import ModelNames
from hermes.settings import Settings, get_settings

if TYPE_CHECKING:
    from temporalio.runtime import Runtime

C = TypeVar("C")


def store_opener(settings: Settings) -> Callable[[], Any]:
    """Opens the settings' long-term memory store when called (see ``HermesClient``'s
    ``memory_store``)."""

    def open_() -> Any:
        from hermes.memory.service import open_store

        store = open_store(settings)
        store.check_model()
        return store

    return open_


def session_config(settings: Settings) -> SessionConfig:
    """The :class:`SessionConfig` a connected client gives the sessions it creates."""
    return SessionConfig(
        model_timeout_seconds=settings.model_timeout_seconds,
        model_max_attempts=settings.model_max_attempts,
        model_heartbeat_seconds=settings.model_heartbeat_seconds,
        token_budget=settings.session_token_budget,
        user_daily_token_budget=settings.user_daily_token_budget,
    )


async def connect(
    make: Callable[..., C], settings: Settings | None = None, *, runtime: Runtime | None = None, **kwargs: Any
) -> C:
    """A client made by ``make`` (the class :class:`hermes.client.HermesClient`) from the
    settings (see :meth:`hermes.client.HermesClient.connect`, which says what it raises)."""
    from hermes.infra import telemetry
    from worker import connect_client, connect_redis

    settings = settings or get_settings()
    command_auth.ensure(settings)
    if runtime is None:
        client = await connect_client(settings)
    else:
        from hermes.infra.connections import connect_temporal
        from hermes.security import encryption

        client = await connect_temporal(
            settings,
            data_converter=encryption.converter_for(settings),
            runtime=runtime,
            plugins=telemetry.plugins(settings),
        )
    return make(
        client,
        task_queue=settings.task_queue,
        redis=kwargs.pop("redis", None) or connect_redis(settings=settings),
        durable=kwargs.pop("durable", None) or DurableStore(settings.resolved_memory_uri),
        config=kwargs.pop("config", None) or session_config(settings),
        retry_timeout_seconds=settings.client_retry_seconds,
        model_names=ModelNames.from_settings(settings),
        content_ttl_seconds=settings.redis_content_ttl_seconds,
        memory_store=kwargs.pop("memory_store", None) or store_opener(settings),
    )
