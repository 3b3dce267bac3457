"""Wiring of the memory layer to the settings: the store, and the consolidation schedule."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from hermes import names
from hermes.memory.embeddings import Embedder, get_embedder
from hermes.memory.store import MemoryStore
from hermes.settings import Settings


def embedder_from_settings(settings: Settings) -> Embedder:
    """The embedder ``settings.memory_embedder`` names (its endpoint options for
    ``openai:<model>``).

    Raises:
        ConfigError: an unknown name, or an endpoint that does not answer.
    """
    if settings.memory_embedder.startswith("openai:"):
        key = settings.memory_embedding_api_key or settings.openai_api_key
        return get_embedder(
            settings.memory_embedder,
            base_url=settings.memory_embedding_base_url or settings.openai_base_url,
            api_key=key.get_secret_value() if key else None,
            dimensions=settings.memory_embedding_dimensions,
        )
    return get_embedder(settings.memory_embedder)


def open_store(settings: Settings, embedder: Embedder | None = None) -> MemoryStore:
    """The memory store at ``settings.resolved_memory_uri``."""
    return MemoryStore(settings.resolved_memory_uri, embedder or embedder_from_settings(settings))


async def ensure_consolidation_schedule(client: Any, settings: Settings, *, task_queue: str | None = None) -> str:
    """Create (or update) the Temporal Schedule that runs the consolidation every
    ``memory_consolidation_every_seconds`` (hourly), skipping a run while one is going.

    Returns:
        The schedule id.
    """
    from temporalio.client import (
        Schedule,
        ScheduleActionStartWorkflow,
        ScheduleAlreadyRunningError,
        ScheduleIntervalSpec,
        ScheduleOverlapPolicy,
        SchedulePolicy,
        ScheduleSpec,
        ScheduleUpdate,
    )

    from hermes import command_auth
    from hermes.memory.models import ConsolidationInput

    schedule = Schedule(
        action=ScheduleActionStartWorkflow(
            names.MEMORY_CONSOLIDATION_WORKFLOW,
            # Signed once, good at any age: the schedule starts every run with this input
            # (re-signed whenever a worker writes the schedule again).
            command_auth.signed(
                ConsolidationInput(
                    archive_after_days=settings.archive_after_days, heartbeat_seconds=settings.model_heartbeat_seconds,
                    max_judge_calls=settings.resolved_memory_judge_max_calls,
                ),
                names.START_CONSOLIDATION, names.CONSOLIDATION_TARGET, sender="hermes-worker", roles=["admin"],
            ),
            id="hermes-memory-consolidation-run",
            task_queue=task_queue or settings.task_queue,
        ),
        spec=ScheduleSpec(intervals=[ScheduleIntervalSpec(every=timedelta(seconds=settings.memory_consolidation_every_seconds))]),
        policy=SchedulePolicy(overlap=ScheduleOverlapPolicy.SKIP),
    )
    try:
        await client.create_schedule(names.MEMORY_CONSOLIDATION_SCHEDULE, schedule)
    except ScheduleAlreadyRunningError:
        handle = client.get_schedule_handle(names.MEMORY_CONSOLIDATION_SCHEDULE)

        async def update(_: Any) -> ScheduleUpdate:
            return ScheduleUpdate(schedule=schedule)

        await handle.update(update)
    return names.MEMORY_CONSOLIDATION_SCHEDULE
