"""Sending messages: starting a session, and sending a message exactly once through outages.

A message is one update-with-start under an update id that names it
(:func:`hermes.client.messages.message_update_id`), resent under the same id after a
transient failure or a busy refusal as :class:`hermes.client.retry.MessageRetryPolicy`
decides; a session archived after a long idle time is started again from its snapshot.
To a session this client saw take a message, it is first a plain update under that id
(no start to ask for); the session's own refusal or failure of it is raised as a resend's
would be, and after any other failure the update-with-start above follows (a failure
after which it may have been taken counted in the retry policy first).
At most ``max_in_flight_per_session`` messages of one session are in flight from one
client (:class:`SessionSlots`).
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections import OrderedDict
from collections.abc import AsyncIterator, Iterable
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from temporalio.client import (
    WithStartWorkflowOperation,
    WorkflowFailureError,
    WorkflowUpdateFailedError,
)
from temporalio.common import (
    SearchAttributePair,
    TypedSearchAttributes,
    WorkflowIDConflictPolicy,
    WorkflowIDReusePolicy,
)
from temporalio.exceptions import ApplicationError, WorkflowAlreadyStartedError
from temporalio.service import RPCStatusCode

from hermes import names
from hermes.client.content import content_store, store_message
from hermes.client.failures import classify_failure, describe, documented_error
from hermes.client.messages import (
    check_message_text,
    message_update_id,
    too_many_tokens,
)
from hermes.client.part import ClientPart
from hermes.client.retry import MessageRetryPolicy, being_cancelled, start_answered
from hermes.errors import (
    HermesError,
    SessionBusyError,
    SessionClosedError,
    SessionExistsError,
    SessionForbiddenError,
    SessionNotFoundError,
    SessionUnavailableError,
    TemporalRequestError,
)
from hermes.models import (
    SendMessageInput,
    SessionCarry,
    SessionConfig,
    SessionInput,
    SessionState,
    StoredContent,
    TurnResult,
)

if TYPE_CHECKING:
    from hermes.client import HermesClient


KNOWN_RUNNING_SESSIONS = 10_000
"""Sessions a client remembers as running (the oldest forgotten first): a message to one
of them is a plain update, not an update-with-start (:meth:`Sender._to_running`)."""
DEFAULT_MAX_IN_FLIGHT_PER_SESSION = 8
"""Messages of one session a client keeps in flight at once. Temporal admits at most 10
updates in flight per workflow (the server's ``history.maxInFlightUpdates``); a refusal
there is not only a refusal: on the dev server measured (issue 12's flood, 100 messages at
once to one session) every one came with about ten "workflow update was aborted" of the
session's admitted updates, so a flood past the limit took no message at all for minutes.
Kept below the limit, the rest wait in the client, where "busy" is certain: never sent."""


class SessionSlots:
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


def session_start_options(user_id: str, channel: str) -> dict[str, Any]:
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



class Sender(ClientPart):
    """Starts sessions and sends messages (:meth:`hermes.client.HermesClient.send_message`).

    Args:
        hermes: the facade.
        max_in_flight_per_session: see :class:`SessionSlots`.
    """

    def __init__(self, hermes: HermesClient, max_in_flight_per_session: int):
        super().__init__(hermes)
        self.slots = SessionSlots(max_in_flight_per_session)
        self.running: OrderedDict[str, None] = OrderedDict()
        """Sessions this client saw take a message, newest last (at most
        :data:`KNOWN_RUNNING_SESSIONS`): their next message goes as a plain update."""

    def signed_start(self, inp: SessionInput, sender: str | None, roles: Iterable[str] = ()) -> SessionInput:
        """``inp`` with the proof that ``sender`` (default: the session's user) starts it."""
        return self.signed(names.START_SESSION, inp.session_id, inp, sender or inp.user_id, roles)

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
                another than ``user_id`` needs the ``admin`` role (:mod:`hermes.security.command_auth`).

        Raises:
            SessionConfigError: ``config`` has a value out of bounds or a model the workers
                do not serve (:func:`hermes.sessions.checks.check_session_config`); nothing started.
            SessionExistsError: a session with this id exists (running, closed or archived).
            SessionUnavailableError: Temporal did not answer within ``retry_timeout_seconds``.
            TemporalRequestError: Temporal refused the request itself.
        """
        config = self.hermes.check_config(config)

        async def start() -> None:
            await self.hermes.client.start_workflow(
                names.SESSION_WORKFLOW,
                self.signed_start(SessionInput(session_id=session_id, user_id=user_id, channel=channel, config=config), sender, roles),
                id=session_id,
                task_queue=self.hermes.task_queue,
                id_conflict_policy=WorkflowIDConflictPolicy.FAIL,
                id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE,
                **session_start_options(user_id, channel),
            )

        try:
            await self.call(session_id, "create_session", start, starts=True)
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
                :data:`~hermes.client.messages.MAX_STORED_MESSAGE_BYTES` in any case.
            user_id: who sends it: the owner of a new session; an existing session
                takes messages only from its own user.
            channel: where the conversation happens, e.g. ``cli``, ``web``.
            client_message_id: id for de-duplication; a resend with the same id returns
                the first reply. Generated when not given.
            config: settings of a new session (default: the client's).
            busy_timeout_seconds: how long to keep retrying while the session refuses
                the message as busy, in seconds from the first attempt.
            sender, roles: who sends it, as this client vouches with its command key
                (:mod:`hermes.security.command_auth`; default: ``user_id``). A sender other than
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
        config = self.hermes.check_config(config)
        content = content_store(self.hermes.redis, self.hermes.durable, self.hermes.content_ttl_seconds)
        size = check_message_text(text, max_message_bytes=config.max_message_bytes, can_store=content.can_keep)
        stored: StoredContent | None = None
        if size > config.max_message_bytes or (content.can_keep and too_many_tokens(text, size, config)):
            text, stored = await store_message(content, text, config.max_message_bytes)
        cid = client_message_id or f"msg-{uuid.uuid4()}"
        loop = asyncio.get_running_loop()
        busy_deadline = loop.time() + busy_timeout_seconds
        async with self.slots.hold(session_id, busy_deadline - loop.time()) as held:
            if not held:
                raise SessionBusyError(
                    f"session {session_id!r} is busy ({self.slots.limit} messages of it already in "
                    "flight from this client); the message was not sent, retry later"
                )
            who = (sender or user_id, tuple(roles))
            message = SendMessageInput(text=text, stored=stored, client_message_id=cid, user_id=user_id)
            start = SessionInput(session_id=session_id, user_id=user_id, channel=channel, config=config)
            return await self._attempts(start, message, MessageRetryPolicy(
                retry_timeout_seconds=self.hermes.retry_timeout_seconds, busy_deadline=busy_deadline), who)

    async def _attempts(
        self, session: SessionInput, message: SendMessageInput, policy: MessageRetryPolicy, who: tuple[str, tuple[str, ...]]
    ) -> TurnResult:
        """The attempts of :meth:`send_message` (its docstring says what they raise):
        ``session`` is what starts the session if needed, ``message`` the unsigned
        message; ``who``: the sender and roles each attempt's proofs vouch for."""
        loop = asyncio.get_running_loop()
        session_id, user_id, cid = session.session_id, session.user_id, message.client_message_id
        if session_id in self.running:
            answered = await self._to_running(session, message, who, policy)
            if answered is not None:
                return answered
        resume: SessionCarry | None = None
        while True:
            start = WithStartWorkflowOperation(
                names.SESSION_WORKFLOW,
                self.signed_start(session.model_copy(update={"carry": resume}), *who),
                id=session_id,
                task_queue=self.hermes.task_queue,
                id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
                # A closed session stays closed; an archived one starts again from its snapshot.
                id_reuse_policy=(
                    WorkflowIDReusePolicy.ALLOW_DUPLICATE
                    if resume is not None
                    else WorkflowIDReusePolicy.ALLOW_DUPLICATE_FAILED_ONLY
                ),
                **session_start_options(user_id, session.channel),
            )
            try:
                return self._ran(session_id, await self.hermes.client.execute_update_with_start_workflow(
                    names.SEND_MESSAGE,
                    self.signed(names.SEND_MESSAGE, session_id, message, *who),
                    start_workflow_operation=start,
                    id=message_update_id(user_id, cid),
                    result_type=TurnResult,
                ))
            except asyncio.CancelledError:
                start_answered(start)
                raise
            except Exception as err:  # noqa: BLE001 - sorted below; unknown ones re-raised
                admitted = start_answered(start)
                if being_cancelled():
                    raise asyncio.CancelledError from err
                kind = classify_failure(err, admitted=admitted, starts=True)
                failure: BaseException = err
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
                if policy.may_have_been_taken:
                    # The run that may have taken it has ended since: only its transcript tells.
                    raise SessionClosedError(
                        f"session {session_id!r} is closed; the message may have been taken before it closed "
                        f"(look for client message id {cid!r} in its transcript)"
                    ) from None
                raise SessionClosedError(f"session {session_id!r} is closed; use a new session id") from None
            reason = describe(failure)
            step = policy.after_failure(
                kind, admitted=admitted, refused_by_session=isinstance(failure, WorkflowUpdateFailedError), now=loop.time()
            )
            if step.action == "unavailable":
                raise SessionUnavailableError(
                    f"session {session_id!r} did not answer within {policy.retry_timeout_seconds:g} s "
                    f"(last error: {reason}); the message may have been taken: resend it with the same "
                    f"client message id {cid!r} to get its reply (a new id could run it twice)",
                    session_id=session_id,
                    client_message_id=cid,
                    may_have_been_taken=True,
                    last_error=reason,
                ) from failure
            if step.action == "busy" or (step.action == "ask" and not await self._taken(session_id, cid, reason)):
                raise SessionBusyError(f"session {session_id!r} is busy ({reason}); the message was not taken, retry later")
            if step.action == "ask":
                # An attempt hidden from this client (admitted, aborted, delivered again) was
                # taken after all: resend under the same id, which only waits for its reply.
                policy.taken_after_all(loop.time())
            await asyncio.sleep(step.delay_seconds)

    async def _to_running(
        self, session: SessionInput, message: SendMessageInput, who: tuple[str, tuple[str, ...]], policy: MessageRetryPolicy
    ) -> TurnResult | None:
        """``message`` as a plain update to ``session``, which this client saw running
        (issue 31: an update-with-start costs the client about 2 ms of CPU more a turn,
        for a start that is not needed), under the update id the update-with-start uses.

        Returns:
            The reply; None, with the session forgotten, when the update failed: the
            caller then sends it with start under the same update id, which finds this
            attempt's update if the session took it (one outcome per update id) and deals
            with an ended or archived session as a first message does. A failure after
            which the message may have been taken (a transport error, a timeout) is
            counted in ``policy`` first, as any attempt's is: the resends only wait for
            its reply, and the message is never reported busy (not taken) after it.

        Raises:
            asyncio.CancelledError: the caller was cancelled (the message may be taken).
            HermesError: the session itself refused or failed the message (closed, halted,
                forbidden, a failed turn): what a resend would be answered too.
        """
        session_id, user_id = session.session_id, session.user_id
        try:
            return self._ran(session_id, await self.handle(session_id).execute_update(
                names.SEND_MESSAGE, self.signed(names.SEND_MESSAGE, session_id, message, *who),
                id=message_update_id(user_id, message.client_message_id), result_type=TurnResult,
            ))
        except Exception as err:  # noqa: BLE001 - sorted below
            self.running.pop(session_id, None)
            if being_cancelled():
                raise asyncio.CancelledError from err
            # Not admitted=True: a RESOURCE_EXHAUSTED answer to a plain update is Temporal's
            # refusal before admission (updates in flight); a transport error or a timeout
            # is "transient" either way (it may have been taken).
            kind = classify_failure(err)
            if kind == "fatal" and isinstance(err, WorkflowUpdateFailedError):
                documented = documented_error(err, session_id, user_id=user_id)
                if documented is None:
                    raise
                raise documented from err
            if kind == "transient":
                loop = asyncio.get_running_loop()
                step = policy.after_failure(kind, admitted=True, refused_by_session=False, now=loop.time())
                if step.action == "resend":
                    await asyncio.sleep(step.delay_seconds)
            # Refused before it could be taken (busy), an ended run, any other refusal:
            # not taken; the update-with-start decides.
            return None

    def _ran(self, session_id: str, result: TurnResult) -> TurnResult:
        """Note that ``session_id`` took a message (unless it closed with it); ``result``."""
        if result.status == "closed":
            self.running.pop(session_id, None)
        else:
            self.running[session_id] = None
            self.running.move_to_end(session_id)
            if len(self.running) > KNOWN_RUNNING_SESSIONS:
                self.running.popitem(last=False)
        return result

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
            return await self.call(session_id, "settle_message", attempt)
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
            description = await self.call(session_id, "describe", self.handle(session_id).describe)
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
        final_run = self.hermes.client.get_workflow_handle(session_id, run_id=description.run_id, result_type=SessionState)
        with contextlib.suppress(SessionNotFoundError, TemporalRequestError, WorkflowFailureError):
            state = await self.call(session_id, "the archived run's result", final_run.result)
            if state.snapshot is not None:
                return state.snapshot
        if self.hermes.redis is not None or self.hermes.durable is not None:
            from activities.transcript import read_snapshot

            snapshot = await read_snapshot(self.hermes.redis, session_id, self.hermes.durable)
            if snapshot is not None:
                return snapshot
        raise SessionClosedError(
            f"session {session_id!r} was archived, but its snapshot is not available (the final run's result "
            "has passed the namespace's retention, and neither the durable store nor Redis has a copy); use a new session id"
        )

