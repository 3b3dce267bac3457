"""Errors raised by Hermes.

Exception tree::

    HermesError
    ├── ConfigError            a mistake found at start-up (file, key, what was expected)
    │   └── SessionConfigError     a session's config refused at its start (the field)
    ├── ToolError
    │   ├── ToolRegistrationError   a tool definition that cannot be used
    │   ├── ToolArgumentsError      arguments that fail validation (fields, expected, received)
    │   └── ToolFailure             raised by a tool to choose its result code
    │       └── ToolPermissionError     the caller may not do this (code 3)
    ├── ModelError
    │   ├── ModelUnavailableError   provider answered 5xx / timed out / rate limited (retryable)
    │   ├── ModelRequestError       provider refused the request: 4xx such as 401 (not retryable)
    │   ├── ScriptExhaustedError    the scripted model has no step for this point
    │   └── ContextBodiesMissingError  a body a model call refers to is neither in the
    │                                  content store nor in its input (not retried: the
    │                                  session writes it again)
    ├── MessageRejectedError   a user message the session will not take (empty, too large)
    ├── SessionBusyError       not taken: too many messages in flight; retry later
    ├── SessionHaltedError     not taken: a tool call waits for a human's decision
    ├── SessionClosedError     not taken: the session was closed; start a new one
    ├── SessionNotFoundError   no session with this id (a query or a signal)
    ├── SessionExistsError     a session with this id exists already (creating one)
    ├── SessionForbiddenError  not taken: the message's user is not the session's
    ├── SessionUnavailableError  Temporal (or the session) did not answer before the
    │                            deadline; a message MAY have been taken: resend it
    │                            with the same client message id
    ├── TemporalRequestError   Temporal refused the request itself (e.g. a payload over
    │                            its limit, no permission); nothing happened
    └── MessageFailedError     the session failed the message in a way the client does
                                 not know (a bug to report); see its ``reason``

:class:`hermes.client.HermesClient` raises only these (never a raw ``RPCError``): it
retries transient Temporal failures itself, resending a message under the same client
message id, which is the only safe resend (see README "Client errors").

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


class SessionConfigError(ConfigError, ValueError):
    """A session's config refused where the session is started (client, API, CLI): a
    value out of bounds, or a model no provider of the worker knows. Nothing was started.

    Attributes:
        field: the :class:`~hermes.models.SessionConfig` field at fault (``model``,
            ``context_window_tokens``...; ``""`` for a check of several fields, which
            the message names).
    """

    def __init__(self, message: str, *, field: str):
        self.field = field
        super().__init__(message, source="session config", key=field or None)


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


class ContextBodiesMissingError(ModelError):
    """A body a model call or a summary refers to is in neither the content store nor the
    activity's input (the store lost it: an eviction, a flush, a restart).

    Args:
        refs: the missing references (at most the first 20).
    """

    def __init__(self, refs: list[str]):
        self.refs = refs[:20]
        super().__init__(f"{len(refs)} context body(ies) not in the content store: {', '.join(refs[:5])}")


class ScriptExhaustedError(ModelError):
    """The scripted model was asked for a step its script does not have."""


class MessageRejectedError(HermesError):
    """A user message the session will not take (empty, too large). Nothing was recorded."""


class SessionBusyError(HermesError):
    """The session stayed too busy to take the message (the client's
    ``max_in_flight_per_session`` or Temporal's 10 updates in flight, or the session
    continuing as new) until the client's busy deadline. The message was not taken, and
    it is never processed later (a refusal from Temporal alone is first settled with the
    session): retry it, with the same or a new id."""


class SessionHaltedError(HermesError):
    """The session takes no message until a human approves or rejects the tool call it
    is halted on (an expired approval under ``on_expiry="halt"``). Not taken."""


class SessionClosedError(HermesError):
    """The session is closed; send to a new session id. The message was not taken."""


class SessionForbiddenError(HermesError, PermissionError):
    """The session belongs to another user: it takes messages only from its own user
    (``SessionInput.user_id``, set by its first message). Not taken, nothing recorded;
    the session stays usable by its user. Sending again with the same ``user_id`` will
    not help.

    Attributes:
        session_id: the session.
        user_id: who the message claimed to be from.
    """

    def __init__(self, message: str, *, session_id: str = "", user_id: str = ""):
        self.session_id = session_id
        self.user_id = user_id
        super().__init__(message)


class CommandRefusedError(SessionForbiddenError):
    """The session could not verify the proof of who sent the command
    (:mod:`hermes.security.command_auth`): this client's command key is not one the workers hold
    (``HERMES_COMMAND_KEYS`` / ``HERMES_COMMAND_KEY_FILE`` differ, or each process made
    its own ``<data_dir>/command-keys``), or its clock is off by more than five minutes.
    Not taken, nothing recorded; the session stays usable by a client with the right key.
    """


class SessionNotFoundError(HermesError, LookupError):
    """No session with this id (a query or a signal to a session never started)."""


class SessionExistsError(HermesError):
    """A session with this id exists already, running, closed or archived
    (``HermesClient.create_session``); nothing was started."""


class SessionUnavailableError(HermesError):
    """Temporal, or the session's workflow, did not answer before the client's retry
    deadline (a server restart or outage longer than the deadline, no worker...).

    Attributes:
        session_id: the session.
        client_message_id: for a message, the id it was sent under; None otherwise.
        may_have_been_taken: for a message, whether it may have reached the session (an
            attempt failed after it could have been recorded). Then resend it with the
            same ``client_message_id``: that returns the first reply and never runs a
            second turn, while a new id could.
        last_error: the last failure seen, for the log.
    """

    def __init__(
        self,
        message: str,
        *,
        session_id: str,
        client_message_id: str | None = None,
        may_have_been_taken: bool = False,
        last_error: str = "",
    ):
        self.session_id = session_id
        self.client_message_id = client_message_id
        self.may_have_been_taken = may_have_been_taken
        self.last_error = last_error
        super().__init__(message)


class TemporalRequestError(HermesError):
    """Temporal refused the request as such (invalid, too large, not permitted, search
    attributes not registered...): retrying it unchanged will not help. Nothing happened.

    Attributes:
        status: the gRPC status name, e.g. ``INVALID_ARGUMENT``.
    """

    def __init__(self, message: str, *, status: str):
        self.status = status
        super().__init__(message)


class MessageFailedError(HermesError):
    """The session failed the message with a failure this client does not know (not one
    of the refusals above): a bug or an operator's action (e.g. the workflow terminated
    mid-turn). Whether it ran is unknown; see ``hermes show``.

    Attributes:
        reason: the failure's type and message.
    """

    def __init__(self, message: str, *, reason: str):
        self.reason = reason
        super().__init__(message)


def failed_to_replay(query_failure: str) -> bool:
    """Whether a failed query's message says that the worker answering it failed to
    replay the session (Temporal core's nondeterminism error, ``[TMPRL1100]``). Seen in
    issue 12's soak on workers without the session cached, with histories that replay
    cleanly: another attempt may reach a worker that has it, so it is retried."""
    return "[TMPRL1100]" in query_failure
