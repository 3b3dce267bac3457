"""The model activity: one call to the configured provider."""

from __future__ import annotations

from datetime import timedelta

from temporalio import activity
from temporalio.exceptions import ApplicationError

from hermes import names
from hermes.errors import ModelRequestError, ModelUnavailableError, ScriptExhaustedError
from hermes.models import CallModelInput, CallModelResult
from hermes.providers.base import ModelProvider


class ModelActivities:
    """Holds the provider; ``call_model`` is registered on the worker."""

    def __init__(self, provider: ModelProvider):
        self.provider = provider

    @activity.defn(name=names.CALL_MODEL)
    async def call_model(self, request: CallModelInput) -> CallModelResult:
        """Ask the provider for the next assistant message.

        Raises:
            ApplicationError: ``type="ModelUnavailableError"`` (retried, honouring
                Retry-After), ``"ModelRequestError"`` or ``"ScriptExhaustedError"`` (not retried).
        """
        try:
            return await self.provider.complete(request)
        except ModelUnavailableError as err:
            delay = timedelta(seconds=err.retry_after_seconds) if err.retry_after_seconds is not None else None
            raise ApplicationError(str(err), type=type(err).__name__, next_retry_delay=delay) from None
        except (ModelRequestError, ScriptExhaustedError) as err:
            raise ApplicationError(str(err), type=type(err).__name__, non_retryable=True) from None
