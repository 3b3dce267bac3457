"""Commands to a session: approvals (approve, reject) and the signals that steer it
(set_system_prompt, cancel_turn, close), each with its proof (:mod:`hermes.security.command_auth`).

Resending a signal is safe (each one is retried like a message): a decision on a tool call
that is already decided is recorded as ``already_decided`` and changes nothing
(``SessionWorkflow._decide``); close and set_system_prompt are idempotent. A cancel that
arrived although its answer was lost, then resent, finds no turn to cancel or the same one,
unless the next turn started in between (a rare outage).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from hermes import names
from hermes.client.part import ClientPart
from hermes.models import ApprovalDecision
from hermes.security import command_auth


class Commands(ClientPart):
    """Signals to sessions, signed as their sender."""

    async def signal(self, session_id: str, name: str, *args: Any) -> None:
        """Signal ``name`` with ``args`` to the session, retried (see :meth:`ClientPart.call`)."""
        handle = self.handle(session_id)
        await self.call(session_id, name, lambda: handle.signal(name, args=list(args)))

    async def signal_as(self, session_id: str, name: str, payload: Any, sender: str | None, roles: Iterable[str]) -> None:
        """Signal ``name`` with ``payload`` (or none) and its proof, as ``sender`` (default:
        the session's user, from its ``HermesUserId`` search attribute)."""
        if sender is None:
            description = await self.call(session_id, "describe", self.handle(session_id).describe)
            sender = description.typed_search_attributes.get(names.SA_USER_ID) or "anonymous"
        ring = self.hermes.command_keys
        proof = command_auth.proof_now(name, session_id, payload, sender=sender, roles=roles, ring=ring)
        await self.signal(session_id, name, *([] if payload is None else [payload]), proof)

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
            SessionUnavailableError, TemporalRequestError: as :meth:`hermes.client.HermesClient.get_state`.
        """
        decision = ApprovalDecision(tool_call_id=tool_call_id, approved=True, approver=approver, reason=reason)
        await self.signal(session_id, names.APPROVE_TOOL_CALL, self.signed(names.APPROVE_TOOL_CALL, session_id, decision, approver))

    async def reject(self, session_id: str, tool_call_id: str, *, approver: str, reason: str | None = None) -> None:
        """Reject a pending tool call; the model is told it was denied. Raises as :meth:`approve`."""
        decision = ApprovalDecision(tool_call_id=tool_call_id, approved=False, approver=approver, reason=reason)
        await self.signal(session_id, names.REJECT_TOOL_CALL, self.signed(names.REJECT_TOOL_CALL, session_id, decision, approver))

    async def set_system_prompt(
        self, session_id: str, system_prompt: str, *, sender: str | None = None, roles: Iterable[str] = ()
    ) -> None:
        """Replace the session's system prompt from its next model call on, as ``sender``
        (default: the session's user; another needs the ``admin`` role). Raises as
        :meth:`approve`."""
        await self.signal_as(session_id, names.SET_SYSTEM_PROMPT, system_prompt, sender, roles)

    async def cancel_turn(self, session_id: str, *, sender: str | None = None, roles: Iterable[str] = ()) -> None:
        """Stop the session's current turn (queued messages still run), as ``sender`` (see
        :meth:`set_system_prompt`). Raises as :meth:`approve`."""
        await self.signal_as(session_id, names.CANCEL_TURN, None, sender, roles)

    async def close(self, session_id: str, *, sender: str | None = None, roles: Iterable[str] = ()) -> None:
        """Close the session, as ``sender`` (see :meth:`set_system_prompt`): pending
        approvals are denied, new messages refused. Raises as :meth:`approve`
        (:class:`SessionClosedError` when it is closed already)."""
        await self.signal_as(session_id, names.CLOSE_SESSION, None, sender, roles)

