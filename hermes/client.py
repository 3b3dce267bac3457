"""The Python client: send messages to sessions, decide approvals, read state.

    client = await HermesClient.connect()
    result = await client.send_message("s-1", "What time is it in Shanghai?", user_id="alice")
    print(result.reply)

A session is created by its first message (update-with-start). Messages that the
server cannot take right now (more than Temporal's 10 in-flight updates, or a session
continuing as new) are retried here with backoff and, past ``busy_timeout_seconds``,
refused with :class:`SessionBusyError`: never silently dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import unicodedata
import uuid
from typing import TYPE_CHECKING, Any

from temporalio.client import (
    Client,
    WithStartWorkflowOperation,
    WorkflowFailureError,
    WorkflowHandle,
    WorkflowUpdateFailedError,
)
from temporalio.common import SearchAttributePair, TypedSearchAttributes, WorkflowIDConflictPolicy, WorkflowIDReusePolicy
from temporalio.exceptions import ApplicationError, WorkflowAlreadyStartedError
from temporalio.service import RPCError, RPCStatusCode

from hermes import names
from hermes.blobs import BlobStore, stored_preview, value_ref
from hermes.durable import DurableStore
from hermes.errors import MessageRejectedError, SessionBusyError, SessionClosedError
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
    TraceStep,
    TurnResult,
)
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
    return preview, StoredContent(ref=ref, size_bytes=len(text.encode("utf-8")), preview=text[:chars])


def _too_many_tokens(text: str, size: int, config: SessionConfig) -> bool:
    """Whether ``text`` would take more than half of the session's context budget: such
    a message is kept by reference too (the model gets a preview and reads the rest with
    ``read_stored_content``) rather than end its turn as ``context_too_large``."""
    half = int(config.context_window_tokens * (1 - config.context_reserve_ratio)) // 2
    if size <= half:  # a token is at least one byte
        return False
    from hermes.tokens import TokenCounter

    return TokenCounter.get().text(text) > half


class HermesClient:
    """Talks to session workflows.

    Args:
        client: a Temporal client using ``pydantic_data_converter``.
        task_queue: where new sessions are started.
        redis: optional ``redis.asyncio.Redis`` for the session index (and the fast
            copy of what the durable store keeps).
        config: the :class:`SessionConfig` given to sessions this client creates.
        durable: optional :class:`hermes.durable.DurableStore` (the workers' one, e.g. at
            ``settings.resolved_memory_uri``): large messages are kept there by reference,
            and archived transcripts, snapshots and the audit log are read from it.
    """

    def __init__(
        self,
        client: Client,
        *,
        task_queue: str = names.DEFAULT_TASK_QUEUE,
        redis: Any = None,
        config: SessionConfig | None = None,
        durable: DurableStore | None = None,
    ):
        self.client = client
        self.task_queue = task_queue
        self.redis = redis
        self.config = config or SessionConfig()
        self.durable = durable

    @classmethod
    async def connect(
        cls, settings: Settings | None = None, *, runtime: Runtime | None = None, **kwargs: Any
    ) -> HermesClient:
        """Connect with the settings' Temporal address, namespace, task queue and Redis.

        Args:
            settings: default: :func:`hermes.settings.get_settings`.
            runtime: the Temporal runtime of the connection (its logging and metrics);
                default: the SDK's process-wide one.
            **kwargs: ``redis``, ``config`` and ``durable`` override what the settings give.
        """
        from worker import connect_client, connect_redis

        settings = settings or get_settings()
        if runtime is None:
            client = await connect_client(settings)
        else:
            from temporalio.contrib.pydantic import pydantic_data_converter

            client = await Client.connect(
                settings.resolved_temporal_address,
                namespace=settings.temporal_namespace,
                data_converter=pydantic_data_converter,
                runtime=runtime,
            )
        return cls(
            client,
            task_queue=settings.task_queue,
            redis=kwargs.pop("redis", None) or connect_redis(settings.resolved_redis_url),
            durable=kwargs.pop("durable", None) or DurableStore(settings.resolved_memory_uri),
            config=kwargs.pop("config", None)
            or SessionConfig(
                model_timeout_seconds=settings.model_timeout_seconds,
                model_max_attempts=settings.model_max_attempts,
            ),
        )

    def handle(self, session_id: str) -> WorkflowHandle[Any, Any]:
        return self.client.get_workflow_handle(session_id)

    # ----------------------------------------------------------- messages

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
    ) -> TurnResult:
        """Send one user message and wait for the reply; creates the session if needed.

        Args:
            session_id: the session (workflow id).
            text: the user's message: valid UTF-8 text (no lone surrogates), not only
                whitespace or invisible characters. Larger than ``config.max_message_bytes``
                UTF-8 bytes, it is kept by reference (in the durable store, and in Redis as
                the fast path) and the session gets a preview naming the reference (the
                model reads the rest with ``read_stored_content``); with neither store it
                is refused. At most
                :data:`MAX_STORED_MESSAGE_BYTES` in any case.
            user_id: owner of a new session (ignored for an existing one).
            channel: where the conversation happens, e.g. ``cli``, ``web``.
            client_message_id: id for de-duplication; a resend with the same id returns
                the first reply. Generated when not given.
            config: settings of a new session (default: the client's).
            busy_timeout_seconds: how long to keep retrying while the session is busy.

        Returns:
            The reply and the tool calls made for it.

        Raises:
            MessageRejectedError: empty, not valid text, too large (or too large to send
                inline and it could not be stored); nothing was sent.
            SessionClosedError: the session is closed.
            SessionBusyError: the session stayed too busy to take the message.
        """
        config = config or self.config
        size = check_message_text(text, max_message_bytes=config.max_message_bytes, can_store=self._content.can_keep)
        stored: StoredContent | None = None
        if size > config.max_message_bytes or (self._content.can_keep and _too_many_tokens(text, size, config)):
            text, stored = await self._store_message(text, config.max_message_bytes)
        cid = client_message_id or f"msg-{uuid.uuid4()}"
        delay = 0.05
        deadline = asyncio.get_running_loop().time() + busy_timeout_seconds
        resume: SessionCarry | None = None
        while True:
            start = WithStartWorkflowOperation(
                names.SESSION_WORKFLOW,
                SessionInput(session_id=session_id, user_id=user_id, channel=channel, config=config, carry=resume),
                id=session_id,
                task_queue=self.task_queue,
                id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
                # A closed session stays closed; an archived one starts again from its snapshot.
                id_reuse_policy=(
                    WorkflowIDReusePolicy.ALLOW_DUPLICATE
                    if resume is not None
                    else WorkflowIDReusePolicy.ALLOW_DUPLICATE_FAILED_ONLY
                ),
                search_attributes=TypedSearchAttributes(
                    [
                        SearchAttributePair(names.SA_USER_ID, user_id),
                        SearchAttributePair(names.SA_CHANNEL, channel),
                        SearchAttributePair(names.SA_STATUS, "active"),
                    ]
                ),
                static_summary=f"session of {user_id} ({channel})",
            )
            try:
                return await self.client.execute_update_with_start_workflow(
                    names.SEND_MESSAGE,
                    SendMessageInput(text=text, stored=stored, client_message_id=cid),
                    start_workflow_operation=start,
                    id=cid,
                    result_type=TurnResult,
                )
            except WorkflowUpdateFailedError as err:
                cause = err.cause
                kind = cause.type if isinstance(cause, ApplicationError) else None
                message = cause.message if isinstance(cause, ApplicationError) else str(err)
                if kind == "MessageRejectedError":
                    raise MessageRejectedError(message) from None
                if kind == "SessionClosedError":
                    raise SessionClosedError(f"session {session_id!r} is closed") from None
                if kind != "SessionBusyError":
                    raise
                reason = message
            except (WorkflowAlreadyStartedError, RPCError) as err:
                # ALREADY_EXISTS as a bare RPCError: a server that sends it without the
                # details the SDK needs to say so (the time-skipping test server).
                already = isinstance(err, WorkflowAlreadyStartedError) or err.status == RPCStatusCode.ALREADY_EXISTS
                if not already:
                    if err.status != RPCStatusCode.RESOURCE_EXHAUSTED:
                        raise
                    reason = err.message
                else:
                    # The start operation holds the same error in a future of its own; read
                    # it so asyncio does not print "Future exception was never retrieved".
                    with contextlib.suppress(Exception):
                        await start.workflow_handle()
                    if resume is None:
                        resume = await self._archived_snapshot(session_id)
                        if resume is not None:
                            continue  # at once: start the session again from its snapshot
                    raise SessionClosedError(f"session {session_id!r} is closed; use a new session id") from None
            if asyncio.get_running_loop().time() + delay > deadline:
                raise SessionBusyError(
                    f"session {session_id!r} is busy ({reason}); the message was not taken, retry later"
                )
            await asyncio.sleep(delay)
            delay = min(delay * 2, 2.0)

    async def _archived_snapshot(self, session_id: str) -> SessionCarry | None:
        """The snapshot of a session archived after a long idle time (None if the session
        ended otherwise): the final run's result, or (past Temporal's retention) the copy
        in the durable store (or Redis).

        Raises:
            SessionClosedError: archived, but the snapshot is nowhere to be found.
        """
        try:
            description = await self.handle(session_id).describe()
        except RPCError:
            return None
        if description.typed_search_attributes.get(names.SA_STATUS) != "archived":
            return None
        # Past the namespace's retention the result is gone (NOT_FOUND): then the copy.
        with contextlib.suppress(RPCError, WorkflowFailureError):
            state = await self.client.get_workflow_handle(
                session_id, run_id=description.run_id, result_type=SessionState
            ).result()
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
        return BlobStore(self.redis, durable=self.durable)

    # ----------------------------------------------------------- signals

    async def approve(self, session_id: str, tool_call_id: str, *, approver: str = "user", reason: str | None = None) -> None:
        """Approve a pending tool call (a no-op for unknown or settled ids; see ``decisions``)."""
        await self.handle(session_id).signal(
            names.APPROVE_TOOL_CALL, ApprovalDecision(tool_call_id=tool_call_id, approved=True, approver=approver, reason=reason)
        )

    async def reject(self, session_id: str, tool_call_id: str, *, approver: str = "user", reason: str | None = None) -> None:
        """Reject a pending tool call; the model is told it was denied."""
        await self.handle(session_id).signal(
            names.REJECT_TOOL_CALL, ApprovalDecision(tool_call_id=tool_call_id, approved=False, approver=approver, reason=reason)
        )

    async def set_system_prompt(self, session_id: str, system_prompt: str) -> None:
        await self.handle(session_id).signal(names.SET_SYSTEM_PROMPT, system_prompt)

    async def cancel_turn(self, session_id: str) -> None:
        await self.handle(session_id).signal(names.CANCEL_TURN)

    async def close(self, session_id: str) -> None:
        await self.handle(session_id).signal(names.CLOSE_SESSION)

    # ----------------------------------------------------------- queries

    async def get_state(self, session_id: str) -> SessionState:
        return await self.handle(session_id).query(names.GET_STATE, result_type=SessionState)

    async def get_transcript(self, session_id: str, *, include_archived: bool = True) -> list[Message]:
        """The session's messages in order, all of them by default.

        Args:
            session_id: the session.
            include_archived: also the oldest messages that a long session moved to the
                transcript archive (see ``SessionConfig.max_carry_bytes``; needs the
                client's durable store or Redis); False: only those the workflow still holds.
        """
        live = await self.handle(session_id).query(names.GET_TRANSCRIPT, result_type=list[Message])
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
        return await self.handle(session_id).query(names.GET_PENDING_APPROVALS, result_type=list[PendingApproval])

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
        session_ids: list[str] = []
        async for execution in self.client.list_workflows(query, limit=limit):
            session_ids.append(execution.id)

        async def pending_of(session_id: str) -> list[PendingApproval]:
            try:
                found = await self.get_pending_approvals(session_id)
            except RPCError:
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
        return await self.handle(session_id).query(names.GET_TRACE, result_type=list[TraceStep])

    async def wait_for_approval(self, session_id: str, *, timeout_seconds: float = 30.0, poll_seconds: float = 0.1) -> PendingApproval:
        """Wait until the session has a pending approval and return the oldest.

        Raises:
            asyncio.TimeoutError: none appeared in time.
        """

        async def poll() -> PendingApproval:
            while True:
                try:
                    pending = await self.get_pending_approvals(session_id)
                except RPCError as err:
                    # The message that creates the session may still be on its way.
                    if err.status != RPCStatusCode.NOT_FOUND:
                        raise
                    pending = []
                if pending:
                    return pending[0]
                await asyncio.sleep(poll_seconds)

        return await asyncio.wait_for(poll(), timeout_seconds)

    # ------------------------------------------------------------- memory

    def _writer_start(self, user_id: str) -> WithStartWorkflowOperation[Any, Any]:
        from hermes.memory.models import MemoryWriterInput

        return WithStartWorkflowOperation(
            names.MEMORY_WRITER_WORKFLOW,
            MemoryWriterInput(user_id=user_id),
            id=names.memory_writer_id(user_id),
            task_queue=self.task_queue,
            id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
        )

    async def add_memories(self, user_id: str, candidates: list[Any]) -> Any:
        """Write ``candidates`` (:class:`~hermes.memory.models.MemoryCandidate`) for
        ``user_id`` now, through the user's memory writer (so the write is deduplicated and
        checked for conflicts like any other). Needs a worker.

        Returns:
            The :class:`~hermes.memory.models.WriteReport`.
        """
        from hermes.memory.models import MemoryBatch, WriteReport

        return await self.client.execute_update_with_start_workflow(
            names.WRITE_MEMORIES_NOW,
            MemoryBatch(candidates=candidates),
            start_workflow_operation=self._writer_start(user_id),
            result_type=WriteReport,
        )

    async def forget_user(self, user_id: str) -> Any:
        """Delete every long-term memory of ``user_id`` (both tables) and drop what is
        waiting to be written; a candidate said before this and delivered later is refused.

        Returns:
            The :class:`~hermes.memory.models.ForgetReport`.
        """
        from hermes.memory.models import ForgetReport

        return await self.client.execute_update_with_start_workflow(
            names.FORGET_USER, start_workflow_operation=self._writer_start(user_id), result_type=ForgetReport
        )

    async def consolidate_memories(self, *, archive_after_days: float, users: list[str] | None = None) -> Any:
        """Run the memory consolidation now (the one the schedule runs hourly) and wait.

        Returns:
            The :class:`~hermes.memory.models.ConsolidationReport`.
        """
        from hermes.memory.models import ConsolidationInput, ConsolidationReport

        return await self.client.execute_workflow(
            names.MEMORY_CONSOLIDATION_WORKFLOW,
            ConsolidationInput(archive_after_days=archive_after_days, users=users),
            id=f"hermes-memory-consolidation-manual-{uuid.uuid4()}",
            task_queue=self.task_queue,
            result_type=ConsolidationReport,
        )

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
