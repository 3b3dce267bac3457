"""The model activity: one call to the configured provider."""

from __future__ import annotations

from datetime import timedelta

from temporalio import activity
from temporalio.exceptions import ApplicationError

from hermes import names
from hermes.errors import ModelRequestError, ModelUnavailableError, ScriptExhaustedError
from hermes.models import CallModelInput, CallModelResult
from hermes.providers.base import ModelProvider
from hermes.tools.arguments import MAX_NESTING, _nesting


def _refuse_deep_arguments(result: CallModelResult) -> CallModelResult:
    """``result`` with each tool call nested deeper than ``MAX_NESTING`` turned into an
    arguments error (a code-1 result): the workflow decodes this payload with pydantic,
    whose JSON parser stops at about 250 levels, and a payload it cannot decode fails
    every workflow task of the session."""
    calls = result.message.tool_calls
    if not any(_nesting(c.arguments, MAX_NESTING) > MAX_NESTING for c in calls):
        return result
    fixed = [
        c.model_copy(
            update={
                "arguments": {},
                "arguments_error": f"arguments: expected a JSON object nested at most {MAX_NESTING} levels deep",
            }
        )
        if _nesting(c.arguments, MAX_NESTING) > MAX_NESTING
        else c
        for c in calls
    ]
    return result.model_copy(update={"message": result.message.model_copy(update={"tool_calls": fixed})})


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
            return _refuse_deep_arguments(await self.provider.complete(request))
        except ModelUnavailableError as err:
            delay = timedelta(seconds=err.retry_after_seconds) if err.retry_after_seconds is not None else None
            raise ApplicationError(str(err), type=type(err).__name__, next_retry_delay=delay) from None
        except (ModelRequestError, ScriptExhaustedError) as err:
            raise ApplicationError(str(err), type=type(err).__name__, non_retryable=True) from None
