"""A session's config checked where the session is started (issue 27: a zero context window
or a model no provider knows was taken, and every turn then failed).

:func:`check_session_config` is called by :class:`hermes.client.HermesClient` before it
starts a session, so the Python client, the HTTP API and the CLI (all three start sessions
through it) refuse the same configs with the same :class:`~hermes.errors.SessionConfigError`
naming the field. Pure: no I/O, usable anywhere.
"""

from __future__ import annotations

from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import TYPE_CHECKING

from pydantic import ValidationError

from hermes.errors import SessionConfigError
from hermes.models import SessionConfig
from hermes.providers.profiles import known_model

if TYPE_CHECKING:
    from hermes.settings import Settings

__all__ = ["MIN_CONTEXT_TOKENS", "START_MAXIMA", "ModelNames", "check_session_config"]

MIN_CONTEXT_TOKENS = 256
"""Smallest context a new session takes (window less reserve): a system prompt, a message
and an answer do not fit in less, and every turn would fail."""

START_MAXIMA: dict[str, tuple[float, str]] = {
    "context_window_tokens": (100_000_000, "no model has a larger window"),
    "max_iterations": (1000, "a turn that runs longer is a loop"),
    "model_timeout_seconds": (86_400, "one model call attempt of over a day"),
    "model_max_attempts": (100, "attempts of one model call"),
    "approval_timeout_seconds": (365 * 86_400, "a year"),
    "max_message_bytes": (1_000_000, "a message inline takes part of Temporal's 2 MB payload cap"),
    "max_history_bytes": (50_000_000, "Temporal stops a run at 50 MB of history"),
    "max_updates_per_run": (2000, "Temporal takes at most 2,000 updates per run"),
    "max_carry_bytes": (1_900_000, "the carried state is one payload, capped at 2 MB by Temporal"),
    "max_system_prompt_bytes": (1_000_000, "a system prompt inline takes part of Temporal's 2 MB payload cap"),
    "max_argument_retries": (100, "retries of a tool call's arguments per turn"),
}
"""Largest value a new session may set, and why. Checked at the start only (a session
started before these checks, with a larger value, still decodes and runs)."""


@dataclass(frozen=True)
class ModelNames:
    """Which model names the workers serve, from their settings.

    Attributes:
        provider: ``scripted`` (any name: the offline stand-in answers every one) or ``openai``.
        default_model: the workers' ``HERMES_MODEL`` (always served unless an allow-list leaves it out).
        base_url: the provider endpoint (None: OpenAI's own).
        allowed: ``HERMES_ALLOWED_MODELS`` patterns; when given, the only names accepted.
    """

    provider: str = "scripted"
    default_model: str = "gpt-4o-mini"
    base_url: str | None = None
    allowed: tuple[str, ...] = ()

    @classmethod
    def from_settings(cls, settings: Settings) -> ModelNames:
        """The names the settings' provider serves (``model_provider``, ``model``,
        ``openai_base_url``, ``allowed_models``)."""
        allowed = tuple(p.strip() for p in (settings.allowed_models or "").split(",") if p.strip())
        return cls(settings.model_provider, settings.model, settings.openai_base_url, allowed)

    def refusal(self, model: str | None) -> str | None:
        """Why a session may not use ``model`` (None: the workers' default), or None when it may."""
        name = model or self.default_model
        if self.allowed:
            if any(fnmatchcase(name.lower(), p.lower()) for p in self.allowed):
                return None
            return f"model {name!r} is not on HERMES_ALLOWED_MODELS ({', '.join(self.allowed)})"
        if model is None or self.provider == "scripted" or model == self.default_model:
            return None
        if known_model(self.base_url, model):
            return None
        where = self.base_url or "https://api.openai.com/v1"
        return (
            f"model {model!r} is not served by the provider at {where} (its profile's models); "
            "fix the name, or list it in HERMES_ALLOWED_MODELS"
        )


def check_session_config(config: SessionConfig, models: ModelNames | None = None) -> SessionConfig:
    """``config`` checked again from its values (one built with ``model_copy(update=...)``
    skips pydantic's checks), and its model against ``models``.

    Args:
        config: the new session's config.
        models: the names the workers serve; None: the model name is not checked.

    Returns:
        The validated config (equal to ``config``).

    Raises:
        SessionConfigError: a value out of its bounds (the first bad field is named:
            pydantic's, :data:`START_MAXIMA`, a window that leaves less than
            :data:`MIN_CONTEXT_TOKENS`, archiving before idling), or a model the workers'
            provider does not serve.
    """
    try:
        checked = SessionConfig.model_validate(config.model_dump())
    except ValidationError as err:
        first = err.errors()[0]
        field = ".".join(str(part) for part in first["loc"])
        msg = first["msg"].removeprefix("Value error, ")
        raise SessionConfigError(f"{msg} (got {first.get('input')!r})" if field else msg, field=field) from None
    refused = _start_refusal(checked)
    if refused is not None:
        raise SessionConfigError(refused[1], field=refused[0])
    reason = models.refusal(checked.model) if models is not None else None
    if reason is not None:
        raise SessionConfigError(reason, field="model")
    return checked


def _start_refusal(config: SessionConfig) -> tuple[str, str] | None:
    """The first field a new session may not start with, and why (None: none)."""
    for field, (most, why) in START_MAXIMA.items():
        value = getattr(config, field)
        if value > most:
            return field, f"{value:g} is over {most:g} ({why})"
    window, reserve = config.context_window_tokens, config.context_reserve_ratio
    if window < MIN_CONTEXT_TOKENS:
        return "context_window_tokens", f"{window} is under {MIN_CONTEXT_TOKENS} tokens: no prompt fits"
    if int(window * (1 - reserve)) < MIN_CONTEXT_TOKENS:
        return "context_reserve_ratio", (
            f"{reserve:g} leaves {int(window * (1 - reserve))} of context_window_tokens={window} for the prompt; "
            f"at least {MIN_CONTEXT_TOKENS} are needed (a larger window or a smaller reserve)"
        )
    if config.archive_after_seconds < config.idle_after_seconds:
        return "archive_after_seconds", (
            f"{config.archive_after_seconds:g} is less than idle_after_seconds={config.idle_after_seconds:g} "
            "(a session is idle before it is archived)"
        )
    return None
