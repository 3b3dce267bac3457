"""Long-term memory from the client: writes through the user's memory writer workflow
(deduplicated and checked like any other), reads from the memory store, consolidation."""

from __future__ import annotations

import asyncio
import uuid
from typing import TYPE_CHECKING, Any

from temporalio.client import WithStartWorkflowOperation
from temporalio.common import WorkflowIDConflictPolicy

from hermes import names
from hermes.client.part import ClientPart
from hermes.client.retry import start_answered
from hermes.security import command_auth

if TYPE_CHECKING:
    from hermes.client import HermesClient


class MemoryAccess(ClientPart):
    """The memory operations of the client.

    Args:
        hermes: the facade.
        memory_store: a :class:`hermes.memory.store.MemoryStore`, or a function of no
            arguments that opens one (called on first use), or None (reads raise).
    """

    def __init__(self, hermes: HermesClient, memory_store: Any):
        super().__init__(hermes)
        self._memory_store = memory_store
        self._memory_store_lock = asyncio.Lock()

    def writer_start(self, user_id: str) -> WithStartWorkflowOperation[Any, Any]:
        from hermes.memory.models import MemoryWriterInput

        writer_id = names.memory_writer_id(user_id)
        return WithStartWorkflowOperation(
            names.MEMORY_WRITER_WORKFLOW,
            self.signed(names.START_MEMORY_WRITER, writer_id, MemoryWriterInput(user_id=user_id), user_id),
            id=writer_id,
            task_queue=self.hermes.task_queue,
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

        batch = self.signed(names.WRITE_MEMORIES_NOW, names.memory_writer_id(user_id), MemoryBatch(candidates=candidates), user_id)
        return await self.writer_update(user_id, names.WRITE_MEMORIES_NOW, batch, WriteReport)

    async def forget_user(self, user_id: str) -> Any:
        """Delete every long-term memory of ``user_id`` (both tables) and drop what is
        waiting to be written; a candidate said before this and delivered later is refused.

        Returns:
            The :class:`~hermes.memory.models.ForgetReport`.
        """
        from hermes.memory.models import ForgetReport

        proof = command_auth.proof_now(
            names.FORGET_USER, names.memory_writer_id(user_id), None, sender=user_id, ring=self.hermes.command_keys
        )
        return await self.writer_update(user_id, names.FORGET_USER, proof, ForgetReport)

    async def writer_update(self, user_id: str, update: str, arg: Any, result_type: Any) -> Any:
        """One update of the user's memory writer (started if needed), retried like a
        message under one update id, so a resend is answered by the first attempt."""
        update_id = f"{update}-{uuid.uuid4()}"
        writer_id = names.memory_writer_id(user_id)

        async def attempt() -> Any:
            start = self.writer_start(user_id)
            try:
                return await self.hermes.client.execute_update_with_start_workflow(
                    update, *([] if arg is None else [arg]), start_workflow_operation=start, id=update_id,
                    result_type=result_type,
                )
            finally:
                start_answered(start)

        return await self.call(writer_id, update, attempt, starts=True)

    async def store(self) -> Any:
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
        store = await self.store()
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

        store = await self.store()
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
            return await self.hermes.client.execute_workflow(
                names.MEMORY_CONSOLIDATION_WORKFLOW,
                command_auth.signed(
                    ConsolidationInput(archive_after_days=archive_after_days, users=users), names.START_CONSOLIDATION,
                    names.CONSOLIDATION_TARGET, sender="hermes-client", roles=["admin"], ring=self.hermes.command_keys,
                ),
                id=workflow_id,
                task_queue=self.hermes.task_queue,
                result_type=ConsolidationReport,
                id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
            )

        return await self.call(workflow_id, "consolidate_memories", attempt, starts=True)

