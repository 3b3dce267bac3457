"""Errors raised by Hermes.

Exception tree::

    HermesError
    ├── ConfigError            a mistake found at start-up (file, key, what was expected)
    ├── ToolError
    │   ├── ToolRegistrationError   a tool definition that cannot be used
    │   ├── ToolArgumentsError      arguments that fail validation (fields, expected, received)
    │   └── ToolFailure             raised by a tool to choose its result code
    │       └── ToolPermissionError     the caller may not do this (code 3)
    ├── ModelError
    │   ├── ModelUnavailableError   provider answered 5xx / timed out / rate limited (retryable)
    │   ├── ModelRequestError       provider refused the request: 4xx such as 401 (not retryable)
    │   └── ScriptExhaustedError    the scripted model has no step for this point
    ├── MessageRejectedError   a user message the session will not take (empty, too large)
    ├── SessionBusyError       too many messages in flight; retry later
    └── SessionClosedError     the session was closed; start a new one

Activities convert these to ``temporalio.exceptions.ApplicationError`` with
``type`` set to the class name, so a workflow (and a client) can tell them apart.
"""

from __future__ import annotations


class HermesError(Exception):
    """Root of every error Hermes raises on purpose."""


class ConfigError(HermesError):
    """A configuration mistake found at start-up.

    Args:
        message: what is wrong and what was expected.
        source: the file or setting name where it was found.
        key: the key within that source, if any.
    """

    def __init__(self, message: str, *, source: str | None = None, key: str | None = None):
        self.source = source
        self.key = key
        where = ": ".join(p for p in (source, key) if p)
        super().__init__(f"{where}: {message}" if where else message)


class ToolError(HermesError):
    """Base class for tool-layer errors."""


class ToolRegistrationError(ToolError):
    """A tool definition that cannot be registered (duplicate name, bad signature)."""


class ToolArgumentsError(ToolError):
    """Tool-call arguments that failed validation.

    Attributes:
        problems: one entry per bad field: ``{"field", "expected", "received"}``.
    """

    def __init__(self, tool_name: str, problems: list[dict[str, str]]):
        self.tool_name = tool_name
        self.problems = problems
        detail = "; ".join(
            f"{p['field']}: expected {p['expected']}, received {p['received']}" for p in problems
        )
        super().__init__(f"invalid arguments for tool {tool_name!r}: {detail}")


class ToolFailure(ToolError):
    """Raised by a tool (or a tool's check) to fail with a given result code.

    Args:
        message: what went wrong, for the model and the user (capped at 2,000 chars).
        code: a ``ToolResultCode`` value; 2 (dependency unavailable) by default.
        data: optional JSON-serializable details.

    A plain exception from a tool is reported as code 2 with its message; a
    ``ValueError`` from a check as code 1 and a ``PermissionError`` as code 3.
    """

    code: int = 2

    def __init__(self, message: str, *, code: int | None = None, data: object = None):
        if code is not None:
            self.code = code
        self.data = data
        super().__init__(message)


class ToolPermissionError(ToolFailure):
    """The caller may not do this (result code 3, permission denied)."""

    code = 3


class ModelError(HermesError):
    """Base class for model-provider errors."""


class ModelUnavailableError(ModelError):
    """The provider failed in a way worth retrying (5xx, 408, 409, 429, network).

    Attributes:
        retry_after_seconds: the provider's ``Retry-After``, if it sent one.
    """

    def __init__(self, message: str, *, status_code: int | None = None, retry_after_seconds: float | None = None):
        self.status_code = status_code
        self.retry_after_seconds = retry_after_seconds
        super().__init__(message)


class ModelRequestError(ModelError):
    """The provider refused the request (4xx other than 408/409/429); retrying will not help."""

    def __init__(self, message: str, *, status_code: int | None = None):
        self.status_code = status_code
        super().__init__(message)


class ContextTooLongError(ModelRequestError):
    """The provider refused the request because the context exceeds its window (OpenAI's
    ``context_length_exceeded``, an HTTP 413, or a "maximum context length" message). The
    session compacts its context once and retries once."""


class ScriptExhaustedError(ModelError):
    """The scripted model was asked for a step its script does not have."""


class MessageRejectedError(HermesError):
    """A user message the session will not take (empty, too large). Nothing was recorded."""


class SessionBusyError(HermesError):
    """The session has too many messages in flight; the message was not taken. Retry later."""


class SessionClosedError(HermesError):
    """The session is closed; send to a new session id."""
