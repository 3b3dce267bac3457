"""Wiring of the memory layer to the settings: the store, and the consolidation schedule."""

from __future__ import annotations

from hermes.infra import cpu_pool, lance
from hermes.memory.embeddings import EMBEDDERS, Embedder, get_embedder, get_pooled_embedder
from hermes.memory.schedule import ensure_consolidation_schedule
from hermes.memory.store import MemoryStore
from hermes.settings import Settings

__all__ = ["embedder_from_settings", "ensure_consolidation_schedule", "open_store"]


def embedder_from_settings(settings: Settings) -> Embedder:
    """The embedder ``settings.memory_embedder`` names (its endpoint options for
    ``openai:<model>``). An offline model runs in the process's CPU pool
    (:func:`hermes.infra.cpu_pool.shared`, ``HERMES_CPU_WORKERS`` children; the model is
    loaded in them, not here), in this process only when that is 0.

    Raises:
        ConfigError: an unknown name, or an endpoint that does not answer.
        CpuWorkerLostError: the pool child loading the model died (twice).
    """
    if settings.memory_embedder.startswith("openai:"):
        key = settings.memory_embedding_api_key or settings.openai_api_key
        return get_embedder(
            settings.memory_embedder,
            base_url=settings.memory_embedding_base_url or settings.openai_base_url,
            api_key=key.get_secret_value() if key else None,
            dimensions=settings.memory_embedding_dimensions,
        )
    pool = cpu_pool.shared(settings.cpu_workers) if settings.memory_embedder in EMBEDDERS else None
    if pool is not None:
        return get_pooled_embedder(settings.memory_embedder, pool)
    return get_embedder(settings.memory_embedder)


def open_store(settings: Settings, embedder: Embedder | None = None) -> MemoryStore:
    """The memory store at ``settings.resolved_memory_uri`` (with its storage options and
    version retention).

    Raises:
        ConfigError: ``HERMES_MEMORY_STORAGE_OPTIONS`` is not a JSON object.
    """
    uri = settings.resolved_memory_uri
    return MemoryStore(
        uri,
        embedder or embedder_from_settings(settings),
        storage_options=settings.resolved_memory_storage_options() if lance.is_remote(uri) else None,
        keep_versions_seconds=settings.memory_keep_versions_seconds,
    )
