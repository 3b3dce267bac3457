"""What every part of :class:`hermes.client.HermesClient` shares: the facade's live
settings, the retried call, and signing.

A part reads the facade's attributes (``client``, ``task_queue``, ``redis``, ``durable``,
``retry_timeout_seconds``, ``command_keys``...) at each call, never a copy taken at
construction: callers and tests change them on a live client (e.g. swap the Temporal
client, or give another command key ring).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from typing import TYPE_CHECKING, Any, TypeVar

from pydantic import BaseModel
from temporalio.client import WorkflowHandle

from hermes.client.retry import call_with_retries
from hermes.security import command_auth

if TYPE_CHECKING:
    from hermes.client import HermesClient

T = TypeVar("T")
M = TypeVar("M", bound=BaseModel)


class ClientPart:
    """One concern of the client, over the facade ``hermes``."""

    def __init__(self, hermes: HermesClient):
        self.hermes = hermes

    def handle(self, session_id: str) -> WorkflowHandle[Any, Any]:
        """The handle of session ``session_id``'s workflow (its current run)."""
        return self.hermes.client.get_workflow_handle(session_id)

    async def call(self, session_id: str, what: str, call: Callable[[], Awaitable[T]], *, starts: bool = False) -> T:
        """``call`` retried for the client's ``retry_timeout_seconds`` (see
        :func:`hermes.client.retry.call_with_retries`, which says what it raises)."""
        return await call_with_retries(
            session_id, what, call, retry_timeout_seconds=self.hermes.retry_timeout_seconds, starts=starts
        )

    def signed(self, command: str, session_id: str, payload: M, sender: str, roles: Iterable[str] = ()) -> M:
        """``payload`` with its ``proof`` (:mod:`hermes.security.command_auth`) that ``sender`` sends it."""
        return command_auth.signed(payload, command, session_id, sender=sender, roles=roles, ring=self.hermes.command_keys)
