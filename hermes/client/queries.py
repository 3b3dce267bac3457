"""Reading sessions: their state, transcript, approvals and trace (queries), and the
listings across sessions (pending approvals, the session index, the approval audit, the
workers polling the task queue)."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from hermes import names
from hermes.client.part import ClientPart
from hermes.errors import SessionNotFoundError, TemporalRequestError
from hermes.models import (
    ApprovalAuditEntry,
    Message,
    PendingApproval,
    SessionIndexEntry,
    SessionState,
    TakenMessage,
    TraceStep,
)

log = logging.getLogger("hermes.client")


class Queries(ClientPart):
    """Queries of one session, and listings across sessions."""

    async def query(self, session_id: str, name: str, result_type: Any, *args: Any) -> Any:
        """Query ``name`` of the session, retried (see :meth:`ClientPart.call`)."""
        handle = self.handle(session_id)
        return await self.call(session_id, name, lambda: handle.query(name, args=list(args), result_type=result_type))

    async def get_state(self, session_id: str) -> SessionState:
        """The session's state (status, turn count, pending approvals, decisions...).

        Raises:
            SessionNotFoundError: no such session.
            SessionUnavailableError: Temporal or the session's worker did not answer
                within ``retry_timeout_seconds`` of the first failure.
            TemporalRequestError: Temporal refused the query.
        """
        return await self.query(session_id, names.GET_STATE, SessionState)

    async def taken_messages(self, session_id: str, prefix: str) -> list[TakenMessage]:
        """The messages the session took whose client message ids start with ``prefix``:
        every id a resend would be answered from, not run again (queued or running,
        answered and when), the newest last.

        Raises:
            SessionNotFoundError, SessionUnavailableError, TemporalRequestError: as
                :meth:`get_state` (a worker older than this query: TemporalRequestError).
        """
        return await self.query(session_id, names.GET_TAKEN_MESSAGES, list[TakenMessage], prefix)

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
        live = await self.query(session_id, names.GET_TRANSCRIPT, list[Message])
        if not include_archived or (self.hermes.redis is None and self.hermes.durable is None):
            return live
        from activities.transcript import read_archive

        state = await self.get_state(session_id)
        archived = await read_archive(self.hermes.redis, session_id, state.chain_id, self.hermes.durable)
        if not live:
            return archived
        # Whole turns are archived, so turn numbers join the two without overlap, even if
        # the archive was written just before a continue-as-new that this query missed.
        return [m for m in archived if m.turn < live[0].turn] + live

    async def get_pending_approvals(self, session_id: str) -> list[PendingApproval]:
        """The session's pending approvals, oldest first. Raises as :meth:`get_state`."""
        return await self.query(session_id, names.GET_PENDING_APPROVALS, list[PendingApproval])

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
        from hermes.sessions.index import sessions_query

        query = sessions_query("ExecutionStatus = 'Running'", f"{names.SA_PENDING_APPROVALS.name} > 0", user_id=user_id)

        async def listing() -> list[str]:
            return [execution.id async for execution in self.hermes.client.list_workflows(query, limit=limit)]

        session_ids = await self.call("*", "list_pending_approvals", listing)

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

        if self.hermes.redis is None and self.hermes.durable is None:
            raise RuntimeError("the approval audit log needs the durable store or a Redis connection")
        return await read_audit(self.hermes.redis, session_id=session_id, limit=limit, durable=self.hermes.durable)

    async def get_trace(self, session_id: str) -> list[TraceStep]:
        """One record per step of the session (model calls, tool calls). Raises as :meth:`get_state`."""
        return await self.query(session_id, names.GET_TRACE, list[TraceStep])

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

    async def list_sessions(self, user_id: str, *, limit: int = 50, rebuild: bool = False) -> list[SessionIndexEntry]:
        """The user's sessions, newest activity first, from the Redis index.

        Args:
            user_id: whose sessions.
            limit: at most this many.
            rebuild: first add the sessions Temporal knows and the index lacks. Done
                anyway when the index has none for the user (e.g. Redis was flushed).
        """
        from hermes.sessions.index import list_entries, rebuild_index

        if self.hermes.redis is None:
            raise RuntimeError("list_sessions needs a Redis connection")
        if rebuild:
            await rebuild_index(self.hermes.client, self.hermes.redis, user_id)
        entries = await list_entries(self.hermes.redis, user_id, limit=limit)
        if not entries and await rebuild_index(self.hermes.client, self.hermes.redis, user_id):
            entries = await list_entries(self.hermes.redis, user_id, limit=limit)
        return entries

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
            namespace=self.hermes.client.namespace,
            task_queue=TaskQueue(name=self.hermes.task_queue, kind=TaskQueueKind.TASK_QUEUE_KIND_NORMAL),
            task_queue_type=TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW,
        )
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 5.0
        while True:  # a loaded server's one failed answer is not "nobody knows": 5 s in all
            try:
                left = max(0.5, deadline - loop.time())
                described = await self.hermes.client.workflow_service.describe_task_queue(request, timeout=timedelta(seconds=left))
                break
            except Exception as err:  # noqa: BLE001 - an unknown answer, not an error of the caller
                log.debug("DescribeTaskQueue of %s failed: %r", self.hermes.task_queue, err)
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

