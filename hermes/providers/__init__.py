"""Model providers behind one interface: ``openai`` (any OpenAI-compatible endpoint)
and ``scripted`` (a file of steps; the offline stand-in for a remote model)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from hermes.providers.base import ModelProvider

if TYPE_CHECKING:
    from hermes.settings import Settings

__all__ = ["ModelProvider", "make_provider"]


def make_provider(settings: Settings) -> ModelProvider:
    """The provider the settings choose.

    Raises:
        ConfigError: the provider is misconfigured (missing script, missing base URL).
    """
    if settings.model_provider == "openai":
        from hermes.providers.openai import OpenAIProvider

        return OpenAIProvider.from_settings(settings)
    from hermes.providers.scripted import ScriptedModel

    return ScriptedModel.from_file(settings.script) if settings.script else ScriptedModel.demo()
