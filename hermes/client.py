"""The Python client: send messages to sessions, decide approvals, read state.

    client = await HermesClient.connect()
    result = await client.send_message("s-1", "What time is it in Shanghai?", user_id="alice")
    print(result.reply)

A session is created by its first message (update-with-start). The client hides
Temporal's transient failures: a server restart, a lost connection, an aborted update,
a workflow task failing for a moment, or more than Temporal's 10 updates in flight are
retried here with exponential backoff and jitter, and every call raises only the errors
of :mod:`hermes.errors` (never a raw ``RPCError``):

* a message is resent under the **same client message id**: a transport error can come
  after the session took the message, and only a resend with the same id is safe (it
  returns the first reply and runs no second turn);
* past ``busy_timeout_seconds`` of refusals, :class:`SessionBusyError`: the message was
  not taken and never will be (the session answers a resend of a message it knows
  instead of refusing it, and the client says "busy" only when no attempt may have been
  taken);
* past ``retry_timeout_seconds`` of failures, :class:`SessionUnavailableError`, which
  says whether the message may have been taken.

Queries and signals ride the same retries. Signals are safe to resend: a decision on a
settled tool call changes nothing, close and set_system_prompt are idempotent. A signal
to a session whose workflow has ended is not retried: it raises
:class:`SessionClosedError` at once (a session that never existed:
:class:`SessionNotFoundError`).

Why this module is long: :class:`HermesClient` is the package's one public surface for
callers (STYLE.md: one public surface per module), and its every method rides on the
same retry, refusal and settle logic that makes a send exactly-once; split, that logic
would have to be public to be shared.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import unicodedata
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from pydantic import BaseModel
from temporalio.client import (
    Client,
    RPCTimeoutOrCancelledError,
    WorkflowQueryFailedError,
    WithStartWorkflowOperation,
    WorkflowFailureError,
    WorkflowHandle,
    WorkflowUpdateFailedError,
)
from temporalio.common import SearchAttributePair, TypedSearchAttributes, WorkflowIDConflictPolicy, WorkflowIDReusePolicy
from temporalio.exceptions import ApplicationError, WorkflowAlreadyStartedError
from temporalio.service import RPCError, RPCStatusCode

from hermes import command_auth, names
from hermes.blobs import CONTENT_TTL_SECONDS, BlobStore, stored_preview, value_ref
from hermes.durable import DurableStore
from hermes.events import EventLog, TurnEvent, check_offset
from hermes.errors import (
    CommandRefusedError,
    HermesError,
    MessageFailedError,
    MessageRejectedError,
    SessionBusyError,
    SessionClosedError,
    SessionExistsError,
    SessionForbiddenError,
    SessionHaltedError,
    SessionNotFoundError,
    SessionUnavailableError,
    TemporalRequestError,
    failed_to_replay,
)
from hermes.models import (
    ApprovalAuditEntry,
    ApprovalDecision,
    Message,
    PendingApproval,
    SendMessageInput,
    SessionConfig,
    SessionIndexEntry,
    SessionInput,
    SessionCarry,
    SessionState,
    StoredContent,
    TakenMessage,
    TraceStep,
    TurnResult,
)
from hermes.session_checks import ModelNames, check_session_config
from hermes.settings import Settings, get_settings

if TYPE_CHECKING:
    from temporalio.runtime import Runtime

_INVISIBLE_CATEGORIES = frozenset({"Cc", "Cf", "Zs", "Zl", "Zp"})
"""Unicode categories that show nothing: controls, format characters (U+200B zero width
space, U+200D zero width joiner, U+FEFF byte order mark), spaces and separators."""


MAX_STORED_MESSAGE_BYTES = 64 * 1024 * 1024
"""Largest user message taken at all, in UTF-8 bytes, even kept by reference (64 MB)."""


def check_message_text(text: str, *, max_message_bytes: int | None = None, can_store: bool = False) -> int:
    """Refuse a message that a session should not take, before anything is sent.

    Args:
        text: the user's message.
        max_message_bytes: the largest size taken inline, in UTF-8 bytes; None: no
            size check (other than :data:`MAX_STORED_MESSAGE_BYTES`).
        can_store: a larger message can be kept by reference (the caller has a content
            store: the durable store or Redis): then only :data:`MAX_STORED_MESSAGE_BYTES`
            applies.

    Returns:
        The message's size in UTF-8 bytes.

    Raises:
        MessageRejectedError: the message is empty (nothing but whitespace, control or
            invisible format characters), is not valid UTF-8 text (a lone surrogate, e.g.
            an undecodable byte of the command line or a terminal kept by Python's
            ``surrogateescape``), is larger than :data:`MAX_STORED_MESSAGE_BYTES`, or is
            larger than ``max_message_bytes`` and ``can_store`` is false.
    """
    if not text or all(unicodedata.category(char) in _INVISIBLE_CATEGORIES for char in text):
        raise MessageRejectedError("the message is empty")
    try:
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError as err:
        code = ord(text[err.start])
        what = f"U+{code:04X}"
        if 0xDC80 <= code <= 0xDCFF:
            # Python's surrogateescape keeps an undecodable byte b as U+DC00 + b.
            what += f", the undecodable byte 0x{code - 0xDC00:02X}"
        raise MessageRejectedError(
            f"the message is not valid UTF-8 text: it contains a lone surrogate ({what}) "
            f"at position {err.start}; check the encoding of your terminal or input"
        ) from None
    if size > MAX_STORED_MESSAGE_BYTES:
        raise MessageRejectedError(
            f"the message is {size} bytes; the largest message taken, even kept by reference, is "
            f"{MAX_STORED_MESSAGE_BYTES} bytes (64 MB); send large content as a file or a link"
        )
    if max_message_bytes is not None and size > max_message_bytes and not can_store:
        raise MessageRejectedError(
            f"the message is {size} bytes; the limit is {max_message_bytes} bytes "
            "(send large content as a file or a link, or give the client a content store (the durable store at "
            "HERMES_MEMORY_URI, or Redis at REDIS_URL) "
            "so that larger messages are kept by reference)"
        )
    return size


def message_by_reference(text: str, *, max_message_bytes: int) -> tuple[str, StoredContent]:
    """The preview text that stands for a message too large to send inline, and what
    says where the whole message is (store ``text`` under ``StoredContent.ref``).

    Args:
        text: the whole message.
        max_message_bytes: the preview's UTF-8 size is at most this.

    Raises:
        MessageRejectedError: the limit is too small for even a preview's header.
    """
    ref = value_ref(text)
    chars = 4000
    while True:
        preview = stored_preview(text, ref, "message", preview_chars=chars)
        if len(preview.encode("utf-8")) <= max_message_bytes:
            break
        if chars == 0:
            raise MessageRejectedError(
                f"the message is {len(text.encode('utf-8'))} bytes; the limit of {max_message_bytes} bytes is too "
                "small even for a preview of it kept by reference"
            )
        chars //= 2
    # (The header is one line: what follows it is the head and tail the session shows.)
    return preview, StoredContent(ref=ref, size_bytes=len(text.encode("utf-8")), preview=preview.partition("\n")[2])


def _too_many_tokens(text: str, size: int, config: SessionConfig) -> bool:
    """Whether ``text`` would take more than half of the session's context budget: such
    a message is kept by reference too (the model gets a preview and reads the rest with
    ``read_stored_content``) rather than end its turn as ``context_too_large``."""
    half = int(config.context_window_tokens * (1 - config.context_reserve_ratio)) // 2
    if size <= half:  # a token is at least one byte
        return False
    from hermes.tokens import TokenCounter

    return TokenCounter.get().text(text) > half


T = TypeVar("T")
M = TypeVar("M", bound=BaseModel)

DEFAULT_RETRY_TIMEOUT_SECONDS = 120.0
"""How long a call keeps retrying transient failures by default: long enough to ride
out a restart of the Temporal server (a dev server restarts in seconds, a cluster's
rolling restart in about a minute)."""

_FIRST_DELAY_SECONDS = 0.05
_MAX_DELAY_SECONDS = 2.0

_TRANSIENT_STATUSES = frozenset(
    {
        RPCStatusCode.UNAVAILABLE,  # "tcp connect error", "workflow update was aborted", a shard moving
        RPCStatusCode.UNKNOWN,  # "transport error": the connection broke mid-call
        RPCStatusCode.DEADLINE_EXCEEDED,
        RPCStatusCode.CANCELLED,  # by the transport, not by the caller (checked apart)
        RPCStatusCode.RESOURCE_EXHAUSTED,  # 10 updates in flight, a busy workflow, rate limits, closing
        RPCStatusCode.ABORTED,
        RPCStatusCode.INTERNAL,
    }
)
"""gRPC statuses worth retrying: the server was down, overloaded or mid-restart."""

FailureKind = Literal["busy", "transient", "exists", "closed", "fatal"]


def classify_failure(err: BaseException, *, admitted: bool = False, starts: bool = False) -> FailureKind:
    """What one failed Temporal call means for retrying it.

    Args:
        err: what the call raised.
        admitted: for a message, whether the server answered the update-with-start at
            least once in this attempt (the update was then admitted: it may be taken).
        starts: the call starts the workflow if needed (update-with-start, a start):
            a run that ended under it is found again (or its successor started) by the
            resend. False: the call addresses the workflow's current run (a signal, a
            query, a plain update), and "already completed" means it has ended for good.

    Returns:
        ``busy``: refused before it could be taken (the session's validator said busy,
        or Temporal refused to admit the update: 10 in flight, the run closing); retry,
        and the message was not taken by this attempt. ``transient``: the server was
        unreachable, restarting or failed mid-call; retry with the same id, the message
        may have been taken. ``exists``: update-with-start found a closed session.
        ``closed``: a signal or update reached a session whose workflow has ended
        (closed, archived, terminated): resending cannot change that
        (:class:`SessionClosedError`). ``fatal``: not worth retrying (see
        :func:`documented_error`).
    """
    if isinstance(err, WorkflowAlreadyStartedError):
        return "exists"
    if isinstance(err, WorkflowUpdateFailedError):
        kind = err.cause.type if isinstance(err.cause, ApplicationError) else None
        # UnprocessedUpdate: the server rejected an update its worker never handled
        # (e.g. the run ended in the same task); it was not taken.
        return "busy" if kind in ("SessionBusyError", "UnprocessedUpdate") else "fatal"
    if isinstance(err, RPCTimeoutOrCancelledError):
        return "transient"
    if isinstance(err, WorkflowQueryFailedError) and failed_to_replay(err.message):
        return "transient"
    if not isinstance(err, RPCError):
        return "fatal"
    if err.status == RPCStatusCode.ALREADY_EXISTS:
        # A bare ALREADY_EXISTS: a server that sends it without the details the SDK needs
        # to say so (the time-skipping test server).
        return "exists"
    if err.status == RPCStatusCode.RESOURCE_EXHAUSTED and not admitted:
        # Refused before admission (the registry's limit, a busy workflow lock, a rate
        # limit, or the run closing: an admitted update of a closing run is aborted).
        return "busy"
    if err.status in _TRANSIENT_STATUSES:
        return "transient"
    message = err.message.lower()
    if err.status == RPCStatusCode.FAILED_PRECONDITION and "workflow task in failed state" in message:
        # The session's workflow task is failing (e.g. during a server restart). An
        # update admitted earlier may still be taken once it recovers: not "busy".
        return "transient"
    if err.status == RPCStatusCode.NOT_FOUND and "already completed" in message and not starts:
        # "workflow execution already completed": a signal or update without a run id goes
        # to the workflow's current run, which a continue-as-new replaces atomically, so
        # this run is the last one. Retrying it for the whole window only delayed the
        # same answer (issue 16's review: a second close hung 120 s, then said 503).
        return "closed"
    if err.status == RPCStatusCode.NOT_FOUND and ("update" in message or "already completed" in message):
        # "workflow update was aborted by closing workflow", an update the restarted
        # server forgot, a run that ended under an update-with-start: the resend finds
        # the session (or its closed state) again.
        return "transient"
    return "fatal"


def documented_error(err: BaseException, session_id: str, *, user_id: str = "") -> HermesError | None:
    """The documented error that stands for a non-retryable Temporal failure ``err``, or
    None when ``err`` is not a Temporal failure (raise it unchanged). ``user_id``: for a
    message, who sent it (named by :class:`SessionForbiddenError`)."""
    if isinstance(err, WorkflowUpdateFailedError):
        cause = err.cause
        kind = cause.type if isinstance(cause, ApplicationError) else type(cause).__name__
        message = cause.message if isinstance(cause, ApplicationError) else str(cause)
        if kind == "MessageRejectedError":
            return MessageRejectedError(message)
        if kind == "SessionClosedError":
            return SessionClosedError(f"session {session_id!r} is closed")
        if kind == "SessionHaltedError":
            return SessionHaltedError(message)
        if kind == "SessionForbiddenError":
            return SessionForbiddenError(message, session_id=session_id, user_id=user_id)
        if kind == "CommandRefusedError":
            return CommandRefusedError(message, session_id=session_id, user_id=user_id)
        return MessageFailedError(
            f"session {session_id!r} failed the message ({kind}: {message})", reason=f"{kind}: {message}"
        )
    if isinstance(err, WorkflowQueryFailedError):
        return TemporalRequestError(f"session {session_id!r} failed the query: {err.message}", status="QUERY_FAILED")
    if isinstance(err, RPCError):
        if err.status == RPCStatusCode.NOT_FOUND:
            return SessionNotFoundError(f"no session {session_id!r} ({err.message})")
        return TemporalRequestError(
            f"Temporal refused the request ({err.status.name}): {err.message}", status=err.status.name
        )
    return None


def message_update_id(user_id: str, client_message_id: str) -> str:
    """The Temporal update id of message ``client_message_id`` sent by ``user_id``:
    ``'<user_id>':<client_message_id>`` (the user id quoted, so no two pairs share it).

    Temporal answers an update whose id it has seen in the run with that update's
    outcome without asking the session, so the id names the sender: another user's
    resend of a known client message id reaches the session, which refuses it, instead
    of receiving the owner's reply."""
    return f"{user_id!r}:{client_message_id}"


def _describe(err: BaseException) -> str:
    if isinstance(err, RPCError):
        return f"{err.status.name}: {err.message}"
    if isinstance(err, WorkflowUpdateFailedError):
        return str(err.cause)
    return f"{type(err).__name__}: {err}"


def _being_cancelled() -> bool:
    """Whether the caller cancelled this task: the SDK turns a cancellation into
    ``WorkflowUpdateRPCTimeoutOrCancelledError``, which must not be retried."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


def _start_answered(start: WithStartWorkflowOperation[Any, Any]) -> bool:
    """Whether the start half of an update-with-start was answered (so the server had
    admitted the update at least once). Reads the start's own future either way, so
    that asyncio does not print "Future exception was never retrieved" for it."""
    future = getattr(start, "_workflow_handle", None)
    if not isinstance(future, asyncio.Future):
        return True  # cannot tell: assume the worst (it may have been taken)
    if not future.done():
        return False
    if future.cancelled():
        return False
    return future.exception() is None


def backoff_seconds(attempt: int, *, first: float = _FIRST_DELAY_SECONDS, cap: float = _MAX_DELAY_SECONDS) -> float:
    """The pause before retry number ``attempt`` (0-based): ``first`` doubling up to
    ``cap``, with "equal jitter" (half fixed, half random) so that many callers refused
    at the same moment do not come back at the same moment."""
    delay = min(cap, first * (2 ** min(attempt, 30)))
    return delay / 2 + random.uniform(0, delay / 2)


log = logging.getLogger("hermes.client")

STREAM_DRAIN_SECONDS = 2.0
"""After a streamed message's result, how long :meth:`HermesClient.stream_message` waits
for the events still on their way (its turn's ``turn_finished`` ends the wait)."""

DEFAULT_MAX_IN_FLIGHT_PER_SESSION = 8
"""Messages of one session a client keeps in flight at once. Temporal admits at most 10
updates in flight per workflow (the server's ``history.maxInFlightUpdates``); a refusal
there is not only a refusal: on the dev server measured (issue 12's flood, 100 messages at
once to one session) every one came with about ten "workflow update was aborted" of the
session's admitted updates, so a flood past the limit took no message at all for minutes.
Kept below the limit, the rest wait in the client, where "busy" is certain: never sent."""


class _SessionSlots:
    """At most ``limit`` messages in flight per session from this client; entries of
    sessions with nothing in flight are dropped (bounded by what is in flight)."""

    def __init__(self, limit: int):
        self.limit = limit
        self._held: dict[str, tuple[asyncio.Semaphore, list[int]]] = {}

    @contextlib.asynccontextmanager
    async def hold(self, session_id: str, timeout: float) -> AsyncIterator[bool]:
        """Holds a slot of ``session_id`` for the block; yields False (holding none) if
        none came free within ``timeout`` seconds."""
        semaphore, users = self._held.setdefault(session_id, (asyncio.Semaphore(self.limit), [0]))
        users[0] += 1
        try:
            try:
                async with asyncio.timeout(max(timeout, 0.0)):
                    await semaphore.acquire()
            except TimeoutError:
                yield False
                return
            try:
                yield True
            finally:
                semaphore.release()
        finally:
            users[0] -= 1
            if users[0] == 0:
                self._held.pop(session_id, None)


def _store_opener(settings: Settings) -> Callable[[], Any]:
    """Opens the settings' long-term memory store when called (see ``HermesClient``'s
    ``memory_store``)."""

    def open_() -> Any:
        from hermes.memory.service import open_store

        store = open_store(settings)
        store.check_model()
        return store

    return open_


def _session_start_options(user_id: str, channel: str) -> dict[str, Any]:
    """What every start of a session workflow sets besides its id and input: the search
    attributes listings use, the Web UI summary, and the session's task timeout."""
    return {
        "search_attributes": TypedSearchAttributes(
            [
                SearchAttributePair(names.SA_USER_ID, user_id),
                SearchAttributePair(names.SA_CHANNEL, channel),
                SearchAttributePair(names.SA_STATUS, "active"),
            ]
        ),
        "static_summary": f"session of {user_id} ({channel})",
        "task_timeout": timedelta(seconds=names.SESSION_WORKFLOW_TASK_TIMEOUT_SECONDS),
    }


class HermesClient:
    """Talks to session workflows.

    Args:
        client: a Temporal client using ``pydantic_data_converter``.
        task_queue: where new sessions are started.
        redis: optional ``redis.asyncio.Redis`` for the session index (and the fast
            copy of what the durable store keeps).
        config: the :class:`SessionConfig` given to sessions this client creates.
        retry_timeout_seconds: how long a call keeps retrying transient Temporal failures
            (server unreachable or restarting, transport errors, aborted updates, a
            failing workflow task), in seconds from the first failure since the session
            last answered; then :class:`SessionUnavailableError`. Default 120 s, long
            enough to ride out a Temporal server restart (``HERMES_CLIENT_RETRY_SECONDS``
            with :meth:`connect`).
        durable: optional :class:`hermes.durable.DurableStore` (the workers' one, e.g. at
            ``settings.resolved_memory_uri``): large messages are kept there by reference,
            and archived transcripts, snapshots and the audit log are read from it.
        max_in_flight_per_session: messages of one session this client sends at once
            (default 8, below Temporal's 10 updates in flight per workflow: see
            :data:`DEFAULT_MAX_IN_FLIGHT_PER_SESSION`); more wait for a slot, within their
            ``busy_timeout_seconds``.
        memory_store: for :meth:`search_memories` and :meth:`list_memories`: a
            :class:`hermes.memory.store.MemoryStore`, or a function of no arguments that
            opens one (called on first use: opening loads the embedding model, seconds
            and about 250 MB). :meth:`connect` gives the settings' store this way.
        model_names: the model names the workers serve
            (:class:`hermes.session_checks.ModelNames`): a new session asking for another
            is refused. None: only the config's bounds are checked. :meth:`connect` gives
            the settings' names.
        content_ttl_seconds: how long content this client writes or reads stays in Redis
            after that (seconds; ``HERMES_REDIS_CONTENT_TTL_SECONDS``, default 7 days).

    Raises:
        ValueError: ``retry_timeout_seconds`` is not positive, or ``max_in_flight_per_session`` below 1.
    """

    def __init__(
        self,
        client: Client,
        *,
        task_queue: str = names.DEFAULT_TASK_QUEUE,
        redis: Any = None,
        config: SessionConfig | None = None,
        retry_timeout_seconds: float = DEFAULT_RETRY_TIMEOUT_SECONDS,
        durable: DurableStore | None = None,
        max_in_flight_per_session: int = DEFAULT_MAX_IN_FLIGHT_PER_SESSION,
        memory_store: Any = None,
        model_names: ModelNames | None = None,
        content_ttl_seconds: int = CONTENT_TTL_SECONDS,
    ):
        if not retry_timeout_seconds > 0:
            raise ValueError(f"retry_timeout_seconds must be positive, got {retry_timeout_seconds!r}")
        if max_in_flight_per_session < 1:
            raise ValueError(f"max_in_flight_per_session must be at least 1, got {max_in_flight_per_session!r}")
        self.client = client
        self.task_queue = task_queue
        self.redis = redis
        self.config = config or SessionConfig()
        self.model_names = model_names
        self.retry_timeout_seconds = retry_timeout_seconds
        self.durable = durable
        self.content_ttl_seconds = content_ttl_seconds
        self.command_keys: command_auth.CommandKeyRing | None = None
        """The key ring this client signs commands with (:mod:`hermes.command_auth`);
        None: this process' (``HERMES_COMMAND_KEYS`` / ``_KEY_FILE`` / ``<data_dir>/command-keys``)."""
        self._slots = _SessionSlots(max_in_flight_per_session)
        self._memory_store = memory_store
        self._memory_store_lock = asyncio.Lock()

    def check_config(self, config: SessionConfig | None = None) -> SessionConfig:
        """``config`` (default: the client's) as a new session would be started with it.

        Raises:
            SessionConfigError: a value out of bounds, or a model the workers do not
                serve (:func:`hermes.session_checks.check_session_config`).
        """
        return check_session_config(config or self.config, self.model_names)

    @property
    def max_in_flight_per_session(self) -> int:
        """Messages of one session this client sends at once (set at construction)."""
        return self._slots.limit

    @classmethod
    async def connect(
        cls, settings: Settings | None = None, *, runtime: Runtime | None = None, **kwargs: Any
    ) -> HermesClient:
        """Connect with the settings' Temporal address, namespace and TLS or API key
        (:func:`hermes.connections.temporal_connect_args`), task queue, Redis (``rediss://``
        with its CA) and retry timeout (``HERMES_CLIENT_RETRY_SECONDS``).

        Args:
            settings: default: :func:`hermes.settings.get_settings`.
            runtime: the Temporal runtime of the connection (its logging and metrics);
                default: the SDK's process-wide one.
            **kwargs: ``redis``, ``config``, ``durable`` and ``memory_store`` override what
                the settings give.

        Raises:
            ConfigError: a bad TLS setting (a certificate file that cannot be read, a key
                without its certificate, ...), before anything is dialled.
            TemporalTlsError: the TLS handshake with Temporal failed (which side, which setting).
        """
        from hermes import telemetry
        from worker import connect_client, connect_redis

        settings = settings or get_settings()
        command_auth.ensure(settings)
        if runtime is None:
            client = await connect_client(settings)
        else:
            from hermes import encryption
            from hermes.connections import connect_temporal

            client = await connect_temporal(
                settings,
                data_converter=encryption.converter_for(settings),
                runtime=runtime,
                plugins=telemetry.plugins(settings),
            )
        return cls(
            client,
            task_queue=settings.task_queue,
            redis=kwargs.pop("redis", None) or connect_redis(settings=settings),
            durable=kwargs.pop("durable", None) or DurableStore(settings.resolved_memory_uri),
            config=kwargs.pop("config", None)
            or SessionConfig(
                model_timeout_seconds=settings.model_timeout_seconds,
                model_max_attempts=settings.model_max_attempts,
                model_heartbeat_seconds=settings.model_heartbeat_seconds,
                token_budget=settings.session_token_budget,
                user_daily_token_budget=settings.user_daily_token_budget,
            ),
            retry_timeout_seconds=settings.client_retry_seconds,
            model_names=ModelNames.from_settings(settings),
            content_ttl_seconds=settings.redis_content_ttl_seconds,
            memory_store=kwargs.pop("memory_store", None) or _store_opener(settings),
        )

    async def _call(
        self, session_id: str, what: str, call: Callable[[], Awaitable[T]], *, starts: bool = False
    ) -> T:
        """Run one query, signal or describe, retrying transient failures.

        Args:
            session_id: the session it is about (for the errors).
            what: what is done, for the errors (e.g. ``"get_state"``).
            call: makes and awaits one attempt.
            starts: ``call`` starts the workflow if needed (see :func:`classify_failure`).

        Raises:
            SessionNotFoundError: no such session.
            SessionClosedError: a signal or update reached a session whose workflow has
                ended (closed, archived or terminated); nothing was delivered.
            SessionUnavailableError: still failing ``retry_timeout_seconds`` after the
                first failure.
            TemporalRequestError: Temporal refused the request itself.
        """
        loop = asyncio.get_running_loop()
        first_failure: float | None = None
        attempt = 0
        while True:
            try:
                return await call()
            except asyncio.CancelledError:
                raise
            except Exception as err:  # noqa: BLE001 - sorted below; unknown ones re-raised
                if _being_cancelled():
                    raise asyncio.CancelledError from err
                kind = classify_failure(err, starts=starts)
                if kind == "closed":
                    raise SessionClosedError(
                        f"session {session_id!r} is closed (its workflow has ended): {what} was not delivered"
                    ) from err
                if kind == "fatal" or kind == "exists":
                    documented = documented_error(err, session_id)
                    if documented is None:
                        raise
                    raise documented from err
                now = loop.time()
                first_failure = now if first_failure is None else first_failure
                delay = backoff_seconds(attempt)
                if now + delay > first_failure + self.retry_timeout_seconds:
                    raise SessionUnavailableError(
                        f"{what} on session {session_id!r}: Temporal did not answer within "
                        f"{self.retry_timeout_seconds:g} s ({_describe(err)})",
                        session_id=session_id,
                        last_error=_describe(err),
                    ) from err
                await asyncio.sleep(delay)
                attempt += 1

    def handle(self, session_id: str) -> WorkflowHandle[Any, Any]:
        return self.client.get_workflow_handle(session_id)

    # ----------------------------------------------------------- messages

    async def create_session(
        self,
        session_id: str,
        *,
        user_id: str = "anonymous",
        channel: str = "cli",
        config: SessionConfig | None = None,
        sender: str | None = None,
        roles: Iterable[str] = (),
    ) -> None:
        """Start a session before its first message (:meth:`send_message` also creates one).

        The session runs from now on and waits for messages; its first message then
        does not pay for the start.

        Args:
            session_id: the new session's id (workflow id).
            user_id: its owner.
            channel: where the conversation happens, e.g. ``cli``, ``api``.
            config: its settings (default: the client's).
            sender, roles: who starts it, as this client vouches (default: ``user_id``);
                another than ``user_id`` needs the ``admin`` role (:mod:`hermes.command_auth`).

        Raises:
            SessionConfigError: ``config`` has a value out of bounds or a model the workers
                do not serve (:func:`hermes.session_checks.check_session_config`); nothing started.
            SessionExistsError: a session with this id exists (running, closed or archived).
            SessionUnavailableError: Temporal did not answer within ``retry_timeout_seconds``.
            TemporalRequestError: Temporal refused the request itself.
        """
        config = self.check_config(config)

        async def start() -> None:
            await self.client.start_workflow(
                names.SESSION_WORKFLOW,
                self._signed_start(SessionInput(session_id=session_id, user_id=user_id, channel=channel, config=config), sender, roles),
                id=session_id,
                task_queue=self.task_queue,
                id_conflict_policy=WorkflowIDConflictPolicy.FAIL,
                id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE,
                **_session_start_options(user_id, channel),
            )

        try:
            await self._call(session_id, "create_session", start, starts=True)
        except WorkflowAlreadyStartedError as err:
            raise SessionExistsError(f"a session {session_id!r} exists already; use another id") from err
        except TemporalRequestError as err:
            if err.status != RPCStatusCode.ALREADY_EXISTS.name:
                raise
            raise SessionExistsError(f"a session {session_id!r} exists already; use another id") from err

    async def send_message(
        self,
        session_id: str,
        text: str,
        *,
        user_id: str = "anonymous",
        channel: str = "cli",
        client_message_id: str | None = None,
        config: SessionConfig | None = None,
        busy_timeout_seconds: float = 60.0,
        sender: str | None = None,
        roles: Iterable[str] = (),
    ) -> TurnResult:
        """Send one user message and wait for the reply; creates the session if needed.

        Transient failures (Temporal unreachable or restarting, transport errors,
        aborted updates, a failing workflow task) are retried for
        ``retry_timeout_seconds`` after the first of them, and a busy session for
        ``busy_timeout_seconds``, always under the same ``client_message_id``: a
        transport error can come after the session took the message, and only a resend
        with the same id is safe (it returns the first reply and runs no second turn).

        Args:
            session_id: the session (workflow id).
            text: the user's message: valid UTF-8 text (no lone surrogates), not only
                whitespace or invisible characters. Larger than ``config.max_message_bytes``
                UTF-8 bytes, it is kept by reference (in the durable store, and in Redis as
                the fast path) and the session gets a preview naming the reference (the
                model reads the rest with ``read_stored_content``); with neither store it
                is refused. At most
                :data:`MAX_STORED_MESSAGE_BYTES` in any case.
            user_id: who sends it: the owner of a new session; an existing session
                takes messages only from its own user.
            channel: where the conversation happens, e.g. ``cli``, ``web``.
            client_message_id: id for de-duplication; a resend with the same id returns
                the first reply. Generated when not given.
            config: settings of a new session (default: the client's).
            busy_timeout_seconds: how long to keep retrying while the session refuses
                the message as busy, in seconds from the first attempt.
            sender, roles: who sends it, as this client vouches with its command key
                (:mod:`hermes.command_auth`; default: ``user_id``). A sender other than
                the session's user needs the ``admin`` role; the message is recorded as
                theirs, and they never decide an approval their message caused.

        Returns:
            The reply and the tool calls made for it.

        Raises:
            MessageRejectedError: empty, not valid text, too large (or too large to send
                inline and it could not be stored); not taken.
            SessionConfigError: ``config`` (for a new session) has a value out of bounds or a
                model the workers do not serve; not sent.
            SessionClosedError: the session is closed; not taken.
            SessionHaltedError: the session waits for a human's decision; not taken.
            SessionForbiddenError: the session belongs to another user than ``user_id``,
                or ``sender`` is neither its user nor an admin; not taken (nor is the
                reply to a message id it knows returned).
            CommandRefusedError: the session could not verify this client's proof (its
                command key is not the workers'); not taken.
            SessionBusyError: the session stayed too busy to take the message; not taken,
                and it will never be processed (no attempt could have been taken).
            SessionUnavailableError: Temporal or the session did not answer in time; its
                ``may_have_been_taken`` says whether to resend with the same id.
            TemporalRequestError: Temporal refused the request itself; not taken.
            MessageFailedError: the session failed the message unexpectedly.
        """
        config = self.check_config(config)
        size = check_message_text(text, max_message_bytes=config.max_message_bytes, can_store=self._content.can_keep)
        stored: StoredContent | None = None
        if size > config.max_message_bytes or (self._content.can_keep and _too_many_tokens(text, size, config)):
            text, stored = await self._store_message(text, config.max_message_bytes)
        cid = client_message_id or f"msg-{uuid.uuid4()}"
        loop = asyncio.get_running_loop()
        busy_deadline = loop.time() + busy_timeout_seconds
        async with self._slots.hold(session_id, busy_deadline - loop.time()) as held:
            if not held:
                raise SessionBusyError(
                    f"session {session_id!r} is busy ({self.max_in_flight_per_session} messages of it already in "
                    "flight from this client); the message was not sent, retry later"
                )
            who = (sender or user_id, tuple(roles))
            return await self._send(session_id, text, stored, cid, user_id, channel, config, busy_deadline, who)

    @property
    def events(self) -> EventLog | None:
        """The sessions' turn events (:mod:`hermes.events`), when this client has Redis."""
        return EventLog(self.redis) if self.redis is not None else None

    async def stream_message(
        self, session_id: str, text: str, *, after: str | None = None, **send: Any
    ) -> AsyncIterator[TurnEvent | TurnResult]:
        """:meth:`send_message`, yielding the session's turn events while the turn runs
        and, last, its :class:`TurnResult`.

        The events are those published after ``after`` (default: the session's newest
        event when this is called), in order, each with its ``offset``: the turn's
        ``turn_started``, ``text_delta`` (drop a step's text on ``attempt_discarded``),
        tool calls, approvals, recalled memories, ``turn_finished``; also those of any
        turn queued before this message. Without Redis, or while it does not answer,
        only the result comes.

        Args:
            after: an event offset to start after (``hermes.events.check_offset``), no
                later than the session's newest event.
            send: the keyword arguments of :meth:`send_message`.

        Raises:
            ValueError: ``after`` is not an offset, or is after the session's newest
                event (``EventLog.check_resume``); nothing was sent.
            The errors of :meth:`send_message`, after the events published before them.
        """
        log_ = self.events
        offset = check_offset(after) if after is not None else None
        if log_ is not None:
            try:
                if offset is None:
                    offset = await asyncio.wait_for(log_.last_offset(session_id), 2.0)
                else:
                    await asyncio.wait_for(log_.check_resume(session_id, offset), 2.0)
            except ValueError:
                raise
            except Exception as err:  # noqa: BLE001 - events are a view: the turn goes on without them
                log.warning("turn events of %s not available (%s); the result alone follows", session_id, err)
                log_ = None
        sending = asyncio.ensure_future(self.send_message(session_id, text, **send))
        try:
            loop = asyncio.get_running_loop()
            finished_turn: int | None = None
            finished_turns: set[int | None] = set()
            drain_until: float | None = None
            while log_ is not None and offset is not None:
                if sending.done() and drain_until is None:
                    if sending.exception() is not None:
                        break
                    finished_turn = sending.result().turn
                    drain_until = loop.time() + STREAM_DRAIN_SECONDS
                    if finished_turn in finished_turns:
                        break
                if drain_until is not None and loop.time() >= drain_until:
                    break
                try:
                    batch = await log_.read(session_id, offset, block_ms=200)
                except Exception as err:  # noqa: BLE001 - wait for the result without events
                    log.warning("reading the turn events of %s failed (%s)", session_id, err)
                    await asyncio.wait({sending}, timeout=0.5)
                    continue
                ended = False
                for event in batch:
                    if event.type != "truncated":
                        offset = event.offset
                    if event.type == "turn_finished":
                        finished_turns.add(event.turn)
                        ended = True
                    yield event
                if finished_turn is not None and finished_turn in finished_turns:
                    break
                if ended and not sending.done():
                    # A turn ended: if it is this message's, its result is on its way; wait
                    # for it rather than in a blocking read (which cost up to 0.2 s).
                    await asyncio.wait({sending}, timeout=0.2)
            yield await sending
        finally:
            if not sending.done():
                sending.cancel()  # the caller stopped listening; the turn goes on in the session
                with contextlib.suppress(BaseException):
                    await sending

    async def _send(
        self,
        session_id: str,
        text: str,
        stored: StoredContent | None,
        cid: str,
        user_id: str,
        channel: str,
        config: SessionConfig,
        busy_deadline: float,
        who: tuple[str, tuple[str, ...]],
    ) -> TurnResult:
        """The attempts of :meth:`send_message` (its docstring says what they raise);
        ``who``: the sender and roles each attempt's proofs vouch for."""
        loop = asyncio.get_running_loop()
        # When the current run of transient failures began (None: none since the
        # session last answered).
        outage_since: float | None = None
        # Whether any attempt failed after the message could have been recorded: then
        # "busy" would be a guess, and the client never says it.
        may_have_been_taken = False
        # Whether the last refusal came from the session itself (its validator), not
        # from Temporal alone (updates in flight, a closing run).
        refused_by_session = False
        attempt = 0
        resume: SessionCarry | None = None
        while True:
            start = WithStartWorkflowOperation(
                names.SESSION_WORKFLOW,
                self._signed_start(
                    SessionInput(session_id=session_id, user_id=user_id, channel=channel, config=config, carry=resume), *who
                ),
                id=session_id,
                task_queue=self.task_queue,
                id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
                # A closed session stays closed; an archived one starts again from its snapshot.
                id_reuse_policy=(
                    WorkflowIDReusePolicy.ALLOW_DUPLICATE
                    if resume is not None
                    else WorkflowIDReusePolicy.ALLOW_DUPLICATE_FAILED_ONLY
                ),
                **_session_start_options(user_id, channel),
            )
            try:
                return await self.client.execute_update_with_start_workflow(
                    names.SEND_MESSAGE,
                    self._signed(
                        names.SEND_MESSAGE, session_id,
                        SendMessageInput(text=text, stored=stored, client_message_id=cid, user_id=user_id), *who,
                    ),
                    start_workflow_operation=start,
                    id=message_update_id(user_id, cid),
                    result_type=TurnResult,
                )
            except asyncio.CancelledError:
                _start_answered(start)
                raise
            except Exception as err:  # noqa: BLE001 - sorted below; unknown ones re-raised
                admitted = _start_answered(start)
                if _being_cancelled():
                    raise asyncio.CancelledError from err
                kind = classify_failure(err, admitted=admitted, starts=True)
                reason = _describe(err)
                failure: BaseException = err
                refused_by_session = isinstance(err, WorkflowUpdateFailedError)
            if kind == "fatal":
                documented = documented_error(failure, session_id, user_id=user_id)
                if documented is None:
                    raise failure
                raise documented from failure
            if kind == "exists":
                if resume is None:
                    resume = await self._archived_snapshot(session_id, user_id)
                    if resume is not None:
                        continue  # at once: start the session again from its snapshot
                if may_have_been_taken:
                    # The run that may have taken it has ended since: only its transcript tells.
                    raise SessionClosedError(
                        f"session {session_id!r} is closed; the message may have been taken before it closed "
                        f"(look for client message id {cid!r} in its transcript)"
                    ) from None
                raise SessionClosedError(f"session {session_id!r} is closed; use a new session id") from None
            now = loop.time()
            delay = backoff_seconds(attempt)
            if kind == "transient":
                may_have_been_taken = True
                if admitted or outage_since is None:
                    # The session answered this attempt: an outage starts from here.
                    outage_since = now
            if may_have_been_taken:
                assert outage_since is not None
                # Busy refusals after such an attempt are retried to the same deadline:
                # only the session's answer to this id can settle what happened to it.
                # The whole window is used: the last pause ends at the deadline, where one
                # more attempt is made (giving up when a pause would pass it gave up early,
                # after half the window when the jitter drew a long pause).
                retry_deadline = outage_since + self.retry_timeout_seconds
                delay = min(delay, max(retry_deadline - now, 0.0))
                if now >= retry_deadline:
                    raise SessionUnavailableError(
                        f"session {session_id!r} did not answer within {self.retry_timeout_seconds:g} s "
                        f"(last error: {reason}); the message may have been taken: resend it with the same "
                        f"client message id {cid!r} to get its reply (a new id could run it twice)",
                        session_id=session_id,
                        client_message_id=cid,
                        may_have_been_taken=True,
                        last_error=reason,
                    ) from failure
            elif now >= busy_deadline:
                # The session's own refusal came after every earlier attempt reached it (in
                # the order Temporal admitted them): it settles the message as not taken.
                # A refusal from Temporal alone does not; then the session is asked.
                if refused_by_session or not await self._taken(session_id, cid, reason):
                    raise SessionBusyError(
                        f"session {session_id!r} is busy ({reason}); the message was not taken, retry later"
                    )
                # An attempt hidden from this client (admitted, aborted, delivered again) was
                # taken after all: resend under the same id, which only waits for its reply.
                may_have_been_taken = True
                outage_since = loop.time()
            else:
                delay = min(delay, busy_deadline - now)  # a last attempt at the deadline
            await asyncio.sleep(delay)
            attempt += 1

    async def _taken(self, session_id: str, cid: str, reason: str) -> bool:
        """Whether the session took message ``cid``, asked before it is reported busy
        after refusals that came from Temporal, not from the session (see the session's
        ``settle_message``).

        Raises:
            SessionUnavailableError: the session did not answer (``may_have_been_taken``):
                resend under the same id.
        """

        async def attempt() -> bool:
            try:
                return await self.handle(session_id).execute_update(
                    names.SETTLE_MESSAGE, cid, id=f"settle-{uuid.uuid4()}", result_type=bool
                )
            except WorkflowUpdateFailedError as err:
                if isinstance(err.cause, ApplicationError) and err.cause.type == "MessageNotTaken":
                    return False
                raise

        try:
            return await self._call(session_id, "settle_message", attempt)
        except SessionClosedError:
            raise SessionClosedError(
                f"session {session_id!r} is closed; the message may have been taken before it closed "
                f"(look for client message id {cid!r} in its transcript)"
            ) from None
        except HermesError as err:
            raise SessionUnavailableError(
                f"session {session_id!r} stayed busy ({reason}) and did not say whether it took the message "
                f"({err}); resend it with the same client message id {cid!r} to get its reply "
                "(a new id could run it twice)",
                session_id=session_id,
                client_message_id=cid,
                may_have_been_taken=True,
                last_error=str(err),
            ) from err

    async def _archived_snapshot(self, session_id: str, user_id: str) -> SessionCarry | None:
        """The snapshot of a session archived after a long idle time (None if the session
        ended otherwise), for a message of ``user_id``: the final run's result, or (past
        Temporal's retention) the copy in the durable store (or Redis).

        Raises:
            SessionClosedError: archived, but the snapshot is nowhere to be found.
            SessionForbiddenError: archived, and its user (the ``HermesUserId`` search
                attribute) is not ``user_id``: the session is not started again for them.
        """
        try:
            description = await self._call(session_id, "describe", self.handle(session_id).describe)
        except (SessionNotFoundError, TemporalRequestError):
            return None
        if description.typed_search_attributes.get(names.SA_STATUS) != "archived":
            return None
        owner = description.typed_search_attributes.get(names.SA_USER_ID)
        if owner is not None and owner != user_id:
            raise SessionForbiddenError(
                f"session {session_id!r} takes messages only from its own user; the message from {user_id!r} "
                "was not taken (the session is archived and was not started again)",
                session_id=session_id,
                user_id=user_id,
            )
        # Past the namespace's retention the result is gone (NOT_FOUND): then the durable copy.
        final_run = self.client.get_workflow_handle(session_id, run_id=description.run_id, result_type=SessionState)
        with contextlib.suppress(SessionNotFoundError, TemporalRequestError, WorkflowFailureError):
            state = await self._call(session_id, "the archived run's result", final_run.result)
            if state.snapshot is not None:
                return state.snapshot
        if self.redis is not None or self.durable is not None:
            from activities.transcript import read_snapshot

            snapshot = await read_snapshot(self.redis, session_id, self.durable)
            if snapshot is not None:
                return snapshot
        raise SessionClosedError(
            f"session {session_id!r} was archived, but its snapshot is not available (the final run's result "
            "has passed the namespace's retention, and neither the durable store nor Redis has a copy); use a new session id"
        )

    async def _store_message(self, text: str, max_message_bytes: int) -> tuple[str, StoredContent]:
        """Keep ``text`` in the content store; the preview to send instead, and its reference.

        Raises:
            MessageRejectedError: the store could not take it (nothing was sent).
        """
        preview, stored = message_by_reference(text, max_message_bytes=max_message_bytes)
        try:
            await self._content.keep_many({stored.ref: text})
        except Exception as err:  # noqa: BLE001 - any store failure: the message is not sent
            raise MessageRejectedError(
                f"the message is {stored.size_bytes} bytes, over the {max_message_bytes}-byte limit of inline "
                f"messages, and could not be kept by reference ({type(err).__name__}: {err}); nothing was sent"
            ) from None
        return preview, stored

    async def get_stored_content(self, ref: str) -> str | None:
        """The whole text kept by reference under ``ref`` (a large message, tool result
        JSON or reply; ``ref`` as its preview names it), or ``None`` when this client has
        no store or nothing is stored under it (Redis first, then the durable store).

        Raises:
            DurableStoreError: not in Redis, and the durable store cannot be read.
        """
        if not self._content.can_keep:
            return None
        return (await self._content.read_many([ref])).get(ref)

    @property
    def _content(self) -> BlobStore:
        """Content kept by reference: the durable store, with Redis as the fast path."""
        return BlobStore(self.redis, durable=self.durable, ttl_seconds=self.content_ttl_seconds)

    # ----------------------------------------------------------- signals
    #
    # Resending a signal is safe (each one is retried like a message): a decision on a
    # tool call that is already decided is recorded as ``already_decided`` and changes
    # nothing (``SessionWorkflow._decide``); close and set_system_prompt are idempotent.
    # A cancel that arrived although its answer was lost, then resent, finds no turn to
    # cancel or the same one, unless the next turn started in between (a rare outage).

    async def _signal(self, session_id: str, name: str, *args: Any) -> None:
        handle = self.handle(session_id)
        await self._call(session_id, name, lambda: handle.signal(name, args=list(args)))

    def _signed(self, command: str, session_id: str, payload: M, sender: str, roles: Iterable[str] = ()) -> M:
        """``payload`` with its ``proof`` (:mod:`hermes.command_auth`) that ``sender`` sends it."""
        return command_auth.signed(payload, command, session_id, sender=sender, roles=roles, ring=self.command_keys)

    def _signed_start(self, inp: SessionInput, sender: str | None, roles: Iterable[str] = ()) -> SessionInput:
        return self._signed(names.START_SESSION, inp.session_id, inp, sender or inp.user_id, roles)

    async def _signal_as(self, session_id: str, name: str, payload: Any, sender: str | None, roles: Iterable[str]) -> None:
        """Signal ``name`` with ``payload`` (or none) and its proof, as ``sender`` (default:
        the session's user, from its ``HermesUserId`` search attribute)."""
        if sender is None:
            description = await self._call(session_id, "describe", self.handle(session_id).describe)
            sender = description.typed_search_attributes.get(names.SA_USER_ID) or "anonymous"
        proof = command_auth.proof_now(name, session_id, payload, sender=sender, roles=roles, ring=self.command_keys)
        await self._signal(session_id, name, *([] if payload is None else [payload]), proof)

    async def approve(self, session_id: str, tool_call_id: str, *, approver: str, reason: str | None = None) -> None:
        """Approve a pending tool call as ``approver`` (a user id). A signal: what the
        session did with it is read from ``get_state().decisions`` (``applied``, or not:
        ``unknown_tool_call``, ``already_decided``, ``not_allowed``). A ``write`` call
        (``confirm``) is decided only by the session's user or a listed approver, an
        ``admin`` call (``approve``) by a listed approver other than the requester (see
        :meth:`hermes.models.PendingApproval.may_decide`); anyone else's decision is
        recorded and audited as ``not_allowed`` and the call stays pending. ``approver``
        has no default: the caller says who decides (before issue 16 it defaulted to
        ``"user"``, which is nobody's user id).

        Raises:
            SessionNotFoundError: no such session (it never existed, or its history has
                passed the namespace's retention).
            SessionClosedError: the session is closed (or archived): nothing was
                delivered; raised at once, not retried.
            SessionUnavailableError, TemporalRequestError: as :meth:`get_state`.
        """
        decision = ApprovalDecision(tool_call_id=tool_call_id, approved=True, approver=approver, reason=reason)
        await self._signal(session_id, names.APPROVE_TOOL_CALL, self._signed(names.APPROVE_TOOL_CALL, session_id, decision, approver))

    async def reject(self, session_id: str, tool_call_id: str, *, approver: str, reason: str | None = None) -> None:
        """Reject a pending tool call; the model is told it was denied. Raises as :meth:`approve`."""
        decision = ApprovalDecision(tool_call_id=tool_call_id, approved=False, approver=approver, reason=reason)
        await self._signal(session_id, names.REJECT_TOOL_CALL, self._signed(names.REJECT_TOOL_CALL, session_id, decision, approver))

    async def set_system_prompt(
        self, session_id: str, system_prompt: str, *, sender: str | None = None, roles: Iterable[str] = ()
    ) -> None:
        """Replace the session's system prompt from its next model call on, as ``sender``
        (default: the session's user; another needs the ``admin`` role). Raises as
        :meth:`approve`."""
        await self._signal_as(session_id, names.SET_SYSTEM_PROMPT, system_prompt, sender, roles)

    async def cancel_turn(self, session_id: str, *, sender: str | None = None, roles: Iterable[str] = ()) -> None:
        """Stop the session's current turn (queued messages still run), as ``sender`` (see
        :meth:`set_system_prompt`). Raises as :meth:`approve`."""
        await self._signal_as(session_id, names.CANCEL_TURN, None, sender, roles)

    async def close(self, session_id: str, *, sender: str | None = None, roles: Iterable[str] = ()) -> None:
        """Close the session, as ``sender`` (see :meth:`set_system_prompt`): pending
        approvals are denied, new messages refused. Raises as :meth:`approve`
        (:class:`SessionClosedError` when it is closed already)."""
        await self._signal_as(session_id, names.CLOSE_SESSION, None, sender, roles)

    async def count_workers(self, *, seen_within_seconds: float = 90.0) -> int | None:
        """How many workers poll this client's task queue for workflow tasks.

        From Temporal's ``DescribeTaskQueue``: pollers seen within ``seen_within_seconds``
        (a worker's long poll lasts up to about 70 s; the server lists a stopped worker for
        a few minutes more).

        Args:
            seen_within_seconds: a poller last seen longer ago than this is not counted.

        Returns:
            The number of workers, or None when Temporal could not say within 5 s of
            attempts (unreachable, refused): then nothing is known either way.
        """
        from datetime import datetime, timedelta, timezone

        from temporalio.api.enums.v1 import TaskQueueKind, TaskQueueType
        from temporalio.api.taskqueue.v1 import TaskQueue
        from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest

        request = DescribeTaskQueueRequest(
            namespace=self.client.namespace,
            task_queue=TaskQueue(name=self.task_queue, kind=TaskQueueKind.TASK_QUEUE_KIND_NORMAL),
            task_queue_type=TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW,
        )
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 5.0
        while True:  # a loaded server's one failed answer is not "nobody knows": 5 s in all
            try:
                left = max(0.5, deadline - loop.time())
                described = await self.client.workflow_service.describe_task_queue(request, timeout=timedelta(seconds=left))
                break
            except Exception as err:  # noqa: BLE001 - an unknown answer, not an error of the caller
                log.debug("DescribeTaskQueue of %s failed: %r", self.task_queue, err)
                if loop.time() + 0.25 >= deadline:
                    return None
                await asyncio.sleep(0.25)
        now = datetime.now(timezone.utc)
        return sum(
            1
            for poller in described.pollers
            if not poller.HasField("last_access_time")
            or (now - poller.last_access_time.ToDatetime(tzinfo=timezone.utc)).total_seconds() <= seen_within_seconds
        )

    # ----------------------------------------------------------- queries

    async def _query(self, session_id: str, name: str, result_type: Any, *args: Any) -> Any:
        handle = self.handle(session_id)
        return await self._call(session_id, name, lambda: handle.query(name, args=list(args), result_type=result_type))

    async def get_state(self, session_id: str) -> SessionState:
        """The session's state (status, turn count, pending approvals, decisions...).

        Raises:
            SessionNotFoundError: no such session.
            SessionUnavailableError: Temporal or the session's worker did not answer
                within ``retry_timeout_seconds`` of the first failure.
            TemporalRequestError: Temporal refused the query.
        """
        return await self._query(session_id, names.GET_STATE, SessionState)

    async def taken_messages(self, session_id: str, prefix: str) -> list[TakenMessage]:
        """The messages the session took whose client message ids start with ``prefix``:
        every id a resend would be answered from, not run again (queued or running,
        answered and when), the newest last.

        Raises:
            SessionNotFoundError, SessionUnavailableError, TemporalRequestError: as
                :meth:`get_state` (a worker older than this query: TemporalRequestError).
        """
        return await self._query(session_id, names.GET_TAKEN_MESSAGES, list[TakenMessage], prefix)

    async def get_transcript(self, session_id: str, *, include_archived: bool = True) -> list[Message]:
        """The session's messages in order, all of them by default.

        Args:
            session_id: the session.
            include_archived: also the oldest messages that a long session moved to the
                transcript archive (see ``SessionConfig.max_carry_bytes``; needs the
                client's durable store or Redis); False: only those the workflow still holds.

        Raises:
            SessionNotFoundError, SessionUnavailableError, TemporalRequestError: as
                :meth:`get_state`.
        """
        live = await self._query(session_id, names.GET_TRANSCRIPT, list[Message])
        if not include_archived or (self.redis is None and self.durable is None):
            return live
        from activities.transcript import read_archive

        state = await self.get_state(session_id)
        archived = await read_archive(self.redis, session_id, state.chain_id, self.durable)
        if not live:
            return archived
        # Whole turns are archived, so turn numbers join the two without overlap, even if
        # the archive was written just before a continue-as-new that this query missed.
        return [m for m in archived if m.turn < live[0].turn] + live

    async def get_pending_approvals(self, session_id: str) -> list[PendingApproval]:
        """The session's pending approvals, oldest first. Raises as :meth:`get_state`."""
        return await self._query(session_id, names.GET_PENDING_APPROVALS, list[PendingApproval])

    async def list_pending_approvals(self, *, user_id: str | None = None, limit: int = 200) -> list[PendingApproval]:
        """Every pending approval across running sessions, oldest first.

        Found through Temporal visibility (search attribute ``HermesPendingApprovals > 0``),
        then each session is asked for its own list, which is authoritative: visibility
        lags by a moment, so a just-settled approval is not listed and a just-requested one
        may appear a moment later.

        Args:
            user_id: only sessions of this user (the requester).
            limit: at most this many sessions are asked.
        """
        from hermes.session_index import sessions_query

        query = sessions_query("ExecutionStatus = 'Running'", f"{names.SA_PENDING_APPROVALS.name} > 0", user_id=user_id)

        async def listing() -> list[str]:
            return [execution.id async for execution in self.client.list_workflows(query, limit=limit)]

        session_ids = await self._call("*", "list_pending_approvals", listing)

        async def pending_of(session_id: str) -> list[PendingApproval]:
            try:
                found = await self.get_pending_approvals(session_id)
            except (SessionNotFoundError, TemporalRequestError):
                return []  # it ended between the listing and the query
            return [p if p.session_id else p.model_copy(update={"session_id": session_id}) for p in found]

        lists = await asyncio.gather(*(pending_of(sid) for sid in session_ids))
        return sorted((p for found in lists for p in found), key=lambda p: (p.requested_at, p.session_id, p.tool_call_id))

    async def get_approval_audit(self, *, session_id: str | None = None, limit: int = 100) -> list[ApprovalAuditEntry]:
        """The approval audit log (the durable store, else Redis): requests, decisions and
        verdicts, oldest first.

        Args:
            session_id: only this session's entries; default: the newest of all sessions.
            limit: at most this many (the newest).

        Raises:
            RuntimeError: the client has neither a durable store nor Redis.
            DurableStoreError: the durable store cannot be read.
        """
        from activities.audit import read_audit

        if self.redis is None and self.durable is None:
            raise RuntimeError("the approval audit log needs the durable store or a Redis connection")
        return await read_audit(self.redis, session_id=session_id, limit=limit, durable=self.durable)

    async def get_trace(self, session_id: str) -> list[TraceStep]:
        """One record per step of the session (model calls, tool calls). Raises as :meth:`get_state`."""
        return await self._query(session_id, names.GET_TRACE, list[TraceStep])

    async def wait_for_approval(self, session_id: str, *, timeout_seconds: float = 30.0, poll_seconds: float = 0.1) -> PendingApproval:
        """Wait until the session has a pending approval and return the oldest.

        Raises:
            asyncio.TimeoutError: none appeared in time.
        """

        async def poll() -> PendingApproval:
            while True:
                try:
                    pending = await self.get_pending_approvals(session_id)
                except SessionNotFoundError:
                    pending = []  # the message that creates the session may still be on its way
                if pending:
                    return pending[0]
                await asyncio.sleep(poll_seconds)

        return await asyncio.wait_for(poll(), timeout_seconds)

    # ------------------------------------------------------------- memory

    def _writer_start(self, user_id: str) -> WithStartWorkflowOperation[Any, Any]:
        from hermes.memory.models import MemoryWriterInput

        writer_id = names.memory_writer_id(user_id)
        return WithStartWorkflowOperation(
            names.MEMORY_WRITER_WORKFLOW,
            self._signed(names.START_MEMORY_WRITER, writer_id, MemoryWriterInput(user_id=user_id), user_id),
            id=writer_id,
            task_queue=self.task_queue,
            id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
        )

    async def add_memories(self, user_id: str, candidates: list[Any]) -> Any:
        """Write ``candidates`` (:class:`~hermes.memory.models.MemoryCandidate`) for
        ``user_id`` now, through the user's memory writer (so the write is deduplicated and
        checked for conflicts like any other). Needs a worker.

        Returns:
            The :class:`~hermes.memory.models.WriteReport`.

        Raises:
            pydantic.ValidationError: a candidate with a field a memory does not have
                (``metadata``...), named in the error; nothing was written.
        """
        from hermes.memory.models import MemoryBatch, WriteReport

        batch = self._signed(names.WRITE_MEMORIES_NOW, names.memory_writer_id(user_id), MemoryBatch(candidates=candidates), user_id)
        return await self._writer_update(user_id, names.WRITE_MEMORIES_NOW, batch, WriteReport)

    async def forget_user(self, user_id: str) -> Any:
        """Delete every long-term memory of ``user_id`` (both tables) and drop what is
        waiting to be written; a candidate said before this and delivered later is refused.

        Returns:
            The :class:`~hermes.memory.models.ForgetReport`.
        """
        from hermes.memory.models import ForgetReport

        proof = command_auth.proof_now(
            names.FORGET_USER, names.memory_writer_id(user_id), None, sender=user_id, ring=self.command_keys
        )
        return await self._writer_update(user_id, names.FORGET_USER, proof, ForgetReport)

    async def _writer_update(self, user_id: str, update: str, arg: Any, result_type: Any) -> Any:
        """One update of the user's memory writer (started if needed), retried like a
        message under one update id, so a resend is answered by the first attempt."""
        update_id = f"{update}-{uuid.uuid4()}"
        writer_id = names.memory_writer_id(user_id)

        async def attempt() -> Any:
            start = self._writer_start(user_id)
            try:
                return await self.client.execute_update_with_start_workflow(
                    update, *([] if arg is None else [arg]), start_workflow_operation=start, id=update_id,
                    result_type=result_type,
                )
            finally:
                _start_answered(start)

        return await self._call(writer_id, update, attempt, starts=True)

    async def _store(self) -> Any:
        """The long-term memory store (opened on first use when given as a function).

        Raises:
            RuntimeError: the client was made without a memory store.
            MemoryStoreError: the store cannot be opened, or was written with another
                embedding model than the settings'.
        """
        async with self._memory_store_lock:
            if self._memory_store is None:
                raise RuntimeError("reading long-term memory needs a memory store (HermesClient(memory_store=...))")
            if callable(self._memory_store):
                self._memory_store = await asyncio.to_thread(self._memory_store)
            return self._memory_store

    async def search_memories(self, user_id: str, query: str, *, limit: int = 5) -> list[Any]:
        """The memories a session of ``user_id`` would be given for ``query``, best first
        (``hermes memory search``): prefilter, vector top-20 plus full-text, rerank (0.5
        similarity, 0.2 recency, 0.2 importance, 0.1 frequency), the model's threshold.

        Args:
            user_id: whose memories.
            query: what to look for, any language.
            limit: at most this many (1-5).

        Returns:
            :class:`~hermes.memory.models.RetrievedMemory` items (texts cut to 200 characters).

        Raises:
            RuntimeError: no memory store (see the constructor).
            MemoryStoreError: the store cannot be read, or ``user_id`` is not a valid id.
        """
        store = await self._store()
        return await asyncio.to_thread(store.search, user_id, query, limit=limit)

    async def list_memories(self, user_id: str, *, archived: bool = False, limit: int = 100) -> list[Any]:
        """``user_id``'s memories, newest first (``hermes memory list``): active and
        superseded rows, or with ``archived`` the archive's rows (merged, archived,
        expired, superseded, active).

        Returns:
            :class:`~hermes.memory.models.MemoryRecord` items, at most ``limit``.

        Raises:
            RuntimeError, MemoryStoreError: as :meth:`search_memories`.
        """
        from hermes.memory.models import MemoryRecord

        store = await self._store()
        statuses = ("merged", "archived", "expired", "superseded", "active") if archived else ("active", "superseded")
        rows = await asyncio.to_thread(store.list, user_id, statuses=statuses, archived=archived, limit=limit)
        return [MemoryRecord.model_validate(row) for row in rows]

    async def consolidate_memories(self, *, archive_after_days: float, users: list[str] | None = None) -> Any:
        """Run the memory consolidation now (the one the schedule runs hourly) and wait.

        Returns:
            The :class:`~hermes.memory.models.ConsolidationReport`.
        """
        from hermes.memory.models import ConsolidationInput, ConsolidationReport

        workflow_id = f"hermes-memory-consolidation-manual-{uuid.uuid4()}"

        async def attempt() -> Any:
            # The same id on every attempt: a resend joins the run the first one started.
            return await self.client.execute_workflow(
                names.MEMORY_CONSOLIDATION_WORKFLOW,
                command_auth.signed(
                    ConsolidationInput(archive_after_days=archive_after_days, users=users), names.START_CONSOLIDATION,
                    names.CONSOLIDATION_TARGET, sender="hermes-client", roles=["admin"], ring=self.command_keys,
                ),
                id=workflow_id,
                task_queue=self.task_queue,
                result_type=ConsolidationReport,
                id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
            )

        return await self._call(workflow_id, "consolidate_memories", attempt, starts=True)

    async def list_sessions(self, user_id: str, *, limit: int = 50, rebuild: bool = False) -> list[SessionIndexEntry]:
        """The user's sessions, newest activity first, from the Redis index.

        Args:
            user_id: whose sessions.
            limit: at most this many.
            rebuild: first add the sessions Temporal knows and the index lacks. Done
                anyway when the index has none for the user (e.g. Redis was flushed).
        """
        from hermes.session_index import list_entries, rebuild_index

        if self.redis is None:
            raise RuntimeError("list_sessions needs a Redis connection")
        if rebuild:
            await rebuild_index(self.client, self.redis, user_id)
        entries = await list_entries(self.redis, user_id, limit=limit)
        if not entries and await rebuild_index(self.client, self.redis, user_id):
            entries = await list_entries(self.redis, user_id, limit=limit)
        return entries
