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

The client is a facade over parts with one concern each (the house's model, like
``workflows/session/``): :mod:`~hermes.client.messages` (what a message must be, ids),
:mod:`~hermes.client.failures` (what a failure means, which error it raises),
:mod:`~hermes.client.retry` (the retry-on-outage policy), :mod:`~hermes.client.sending`
(sessions started, messages sent exactly once), :mod:`~hermes.client.streaming`,
:mod:`~hermes.client.commands` (approvals and signals), :mod:`~hermes.client.queries`
(state and listings), :mod:`~hermes.client.memory`, :mod:`~hermes.client.content`
(content kept by reference) and :mod:`~hermes.client.connect` (settings wiring). The
facade's methods say in one line what they do; the part's method says the rest.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable
from typing import TYPE_CHECKING, Any

from temporalio.client import Client, WorkflowHandle

from hermes import names
from hermes.client.commands import Commands
from hermes.client.connect import connect as connect_from_settings
from hermes.client.content import content_store, read_stored
from hermes.client.failures import FailureKind, classify_failure, documented_error
from hermes.client.memory import MemoryAccess
from hermes.client.messages import (
    MAX_STORED_MESSAGE_BYTES,
    check_message_text,
    message_by_reference,
    message_update_id,
)
from hermes.client.queries import Queries
from hermes.client.retry import DEFAULT_RETRY_TIMEOUT_SECONDS, backoff_seconds
from hermes.client.sending import DEFAULT_MAX_IN_FLIGHT_PER_SESSION, Sender
from hermes.client.streaming import STREAM_DRAIN_SECONDS, stream_message
from hermes.content.blobs import CONTENT_TTL_SECONDS
from hermes.content.events import EventLog, TurnEvent
from hermes.infra.durable import DurableStore
from hermes.models import (
    ApprovalAuditEntry,
    Message,
    PendingApproval,
    SessionConfig,
    SessionIndexEntry,
    SessionState,
    TakenMessage,
    TraceStep,
    TurnResult,
)
from hermes.security import command_auth
from hermes.sessions.checks import ModelNames, check_session_config
from hermes.settings import Settings

if TYPE_CHECKING:
    from temporalio.runtime import Runtime

__all__ = [
    "DEFAULT_MAX_IN_FLIGHT_PER_SESSION",
    "DEFAULT_RETRY_TIMEOUT_SECONDS",
    "MAX_STORED_MESSAGE_BYTES",
    "STREAM_DRAIN_SECONDS",
    "FailureKind",
    "HermesClient",
    "backoff_seconds",
    "check_message_text",
    "classify_failure",
    "documented_error",
    "message_by_reference",
    "message_update_id",
]


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
        durable: optional :class:`hermes.infra.durable.DurableStore` (the workers' one, e.g. at
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
            (:class:`hermes.sessions.checks.ModelNames`): a new session asking for another
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
        """The key ring this client signs commands with (:mod:`hermes.security.command_auth`);
        None: this process' (``HERMES_COMMAND_KEYS`` / ``_KEY_FILE`` / ``<data_dir>/command-keys``)."""
        self._sender = Sender(self, max_in_flight_per_session)
        self._slots = self._sender.slots
        self._commands = Commands(self)
        self._queries = Queries(self)
        self._memory = MemoryAccess(self, memory_store)


    def check_config(self, config: SessionConfig | None = None) -> SessionConfig:
        """``config`` (default: the client's) as a new session would be started with it.

        Raises:
            SessionConfigError: a value out of bounds, or a model the workers do not
                serve (:func:`hermes.sessions.checks.check_session_config`).
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
        (:func:`hermes.infra.connections.temporal_connect_args`), task queue, Redis (``rediss://``
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
        return await connect_from_settings(cls, settings, runtime=runtime, **kwargs)

    def handle(self, session_id: str) -> WorkflowHandle[Any, Any]:
        """The handle of session ``session_id``'s workflow (its current run)."""
        return self.client.get_workflow_handle(session_id)

    # ----------------------------------------------------------- messages (hermes.client.sending)

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
        """Start a session before its first message (:meth:`Sender.create_session
        <hermes.client.sending.Sender.create_session>` says how, and what it raises)."""
        await self._sender.create_session(
            session_id, user_id=user_id, channel=channel, config=config, sender=sender, roles=roles
        )

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
        Exactly once through outages: :meth:`Sender.send_message
        <hermes.client.sending.Sender.send_message>` says how, and what it raises."""
        return await self._sender.send_message(
            session_id,
            text,
            user_id=user_id,
            channel=channel,
            client_message_id=client_message_id,
            config=config,
            busy_timeout_seconds=busy_timeout_seconds,
            sender=sender,
            roles=roles,
        )

    @property
    def events(self) -> EventLog | None:
        """The sessions' turn events (:mod:`hermes.content.events`), when this client has Redis."""
        return EventLog(self.redis) if self.redis is not None else None

    def stream_message(
        self, session_id: str, text: str, *, after: str | None = None, first_turn: int | None = None, **send: Any
    ) -> AsyncIterator[TurnEvent | TurnResult]:
        """:meth:`send_message`, yielding its own turn's events (no other turn's) while
        the turn runs and, last, its result (:func:`hermes.client.streaming.stream_message`)."""
        return stream_message(self, session_id, text, after=after, first_turn=first_turn, **send)

    async def get_stored_content(self, ref: str) -> str | None:
        """The whole text kept by reference under ``ref``, or ``None``
        (:func:`hermes.client.content.read_stored` says which, and what it raises)."""
        return await read_stored(content_store(self.redis, self.durable, self.content_ttl_seconds), ref)

    # ----------------------------------------------------------- commands (hermes.client.commands)

    async def approve(self, session_id: str, tool_call_id: str, *, approver: str, reason: str | None = None) -> None:
        """Approve a pending tool call as ``approver`` (:meth:`Commands.approve
        <hermes.client.commands.Commands.approve>` says who may, and what it raises)."""
        await self._commands.approve(session_id, tool_call_id, approver=approver, reason=reason)

    async def reject(self, session_id: str, tool_call_id: str, *, approver: str, reason: str | None = None) -> None:
        """Reject a pending tool call; the model is told it was denied. Raises as :meth:`approve`."""
        await self._commands.reject(session_id, tool_call_id, approver=approver, reason=reason)

    async def set_system_prompt(
        self, session_id: str, system_prompt: str, *, sender: str | None = None, roles: Iterable[str] = ()
    ) -> None:
        """Replace the session's system prompt from its next model call on, as ``sender``
        (default: the session's user; another needs the ``admin`` role). Raises as :meth:`approve`."""
        await self._commands.set_system_prompt(session_id, system_prompt, sender=sender, roles=roles)

    async def cancel_turn(self, session_id: str, *, sender: str | None = None, roles: Iterable[str] = ()) -> None:
        """Stop the session's current turn (queued messages still run). Raises as :meth:`approve`."""
        await self._commands.cancel_turn(session_id, sender=sender, roles=roles)

    async def close(self, session_id: str, *, sender: str | None = None, roles: Iterable[str] = ()) -> None:
        """Close the session: pending approvals are denied, new messages refused. Raises
        as :meth:`approve` (:class:`SessionClosedError` when it is closed already)."""
        await self._commands.close(session_id, sender=sender, roles=roles)

    # ----------------------------------------------------------- queries (hermes.client.queries)

    async def get_state(self, session_id: str) -> SessionState:
        """The session's state (:meth:`Queries.get_state <hermes.client.queries.Queries.get_state>`)."""
        return await self._queries.get_state(session_id)

    async def taken_messages(self, session_id: str, prefix: str) -> list[TakenMessage]:
        """The messages the session took whose client message ids start with ``prefix``
        (:meth:`Queries.taken_messages <hermes.client.queries.Queries.taken_messages>`)."""
        return await self._queries.taken_messages(session_id, prefix)

    async def get_transcript(self, session_id: str, *, include_archived: bool = True) -> list[Message]:
        """The session's messages in order, archived ones too by default
        (:meth:`Queries.get_transcript <hermes.client.queries.Queries.get_transcript>`)."""
        return await self._queries.get_transcript(session_id, include_archived=include_archived)

    async def get_pending_approvals(self, session_id: str) -> list[PendingApproval]:
        """The session's pending approvals, oldest first. Raises as :meth:`get_state`."""
        return await self._queries.get_pending_approvals(session_id)

    async def list_pending_approvals(self, *, user_id: str | None = None, limit: int = 200) -> list[PendingApproval]:
        """Every pending approval across running sessions, oldest first
        (:meth:`Queries.list_pending_approvals <hermes.client.queries.Queries.list_pending_approvals>`)."""
        return await self._queries.list_pending_approvals(user_id=user_id, limit=limit)

    async def get_approval_audit(self, *, session_id: str | None = None, limit: int = 100) -> list[ApprovalAuditEntry]:
        """The approval audit log, oldest first
        (:meth:`Queries.get_approval_audit <hermes.client.queries.Queries.get_approval_audit>`)."""
        return await self._queries.get_approval_audit(session_id=session_id, limit=limit)

    async def get_trace(self, session_id: str) -> list[TraceStep]:
        """One record per step of the session (model calls, tool calls). Raises as :meth:`get_state`."""
        return await self._queries.get_trace(session_id)

    async def wait_for_approval(
        self, session_id: str, *, timeout_seconds: float = 30.0, poll_seconds: float = 0.1
    ) -> PendingApproval:
        """Wait until the session has a pending approval and return the oldest.

        Raises:
            asyncio.TimeoutError: none appeared in time.
        """
        return await self._queries.wait_for_approval(session_id, timeout_seconds=timeout_seconds, poll_seconds=poll_seconds)

    async def list_sessions(self, user_id: str, *, limit: int = 50, rebuild: bool = False) -> list[SessionIndexEntry]:
        """The user's sessions, newest activity first, from the Redis index
        (:meth:`Queries.list_sessions <hermes.client.queries.Queries.list_sessions>`)."""
        return await self._queries.list_sessions(user_id, limit=limit, rebuild=rebuild)

    async def count_workers(self, *, seen_within_seconds: float = 90.0) -> int | None:
        """How many workers poll this client's task queue for workflow tasks; None when
        unknown (:meth:`Queries.count_workers <hermes.client.queries.Queries.count_workers>`)."""
        return await self._queries.count_workers(seen_within_seconds=seen_within_seconds)

    # ----------------------------------------------------------- memory (hermes.client.memory)

    async def add_memories(self, user_id: str, candidates: list[Any]) -> Any:
        """Write ``candidates`` for ``user_id`` now, through the user's memory writer
        (:meth:`MemoryAccess.add_memories <hermes.client.memory.MemoryAccess.add_memories>`)."""
        return await self._memory.add_memories(user_id, candidates)

    async def forget_user(self, user_id: str) -> Any:
        """Delete every long-term memory of ``user_id``; the ``ForgetReport``."""
        return await self._memory.forget_user(user_id)

    async def search_memories(self, user_id: str, query: str, *, limit: int = 5) -> list[Any]:
        """The memories a session of ``user_id`` would be given for ``query``, best first
        (:meth:`MemoryAccess.search_memories <hermes.client.memory.MemoryAccess.search_memories>`)."""
        return await self._memory.search_memories(user_id, query, limit=limit)

    async def list_memories(self, user_id: str, *, archived: bool = False, limit: int = 100) -> list[Any]:
        """``user_id``'s memories, newest first
        (:meth:`MemoryAccess.list_memories <hermes.client.memory.MemoryAccess.list_memories>`)."""
        return await self._memory.list_memories(user_id, archived=archived, limit=limit)

    async def consolidate_memories(self, *, archive_after_days: float, users: list[str] | None = None) -> Any:
        """Run the memory consolidation now (the one the schedule runs hourly) and wait;
        the ``ConsolidationReport``."""
        return await self._memory.consolidate_memories(archive_after_days=archive_after_days, users=users)
