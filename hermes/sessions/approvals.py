"""Deciding a pending tool call and reading back what the session did with the decision.

One operation shared by the HTTP API (``POST .../approve`` and ``.../reject``), the CLI
(``hermes approve`` / ``hermes reject``) and every console conversation that decides
approvals while a turn runs (:func:`hermes.sessions.live_view.send_watched`).
"""

from __future__ import annotations

import asyncio

from hermes.client import HermesClient
from hermes.models import DecisionRecord

__all__ = ["decide"]

_POLL_SECONDS = 0.1
"""How often the session's state is read while its record of the decision is awaited."""


async def decide(
    hermes: HermesClient,
    session_id: str,
    tool_call_id: str,
    *,
    approved: bool,
    approver: str,
    reason: str | None = None,
    timeout_seconds: float = 10.0,
) -> DecisionRecord:
    """Approve or reject a tool call and return the session's record of the decision.

    The decision is a signal; its outcome (``applied``, ``unknown_tool_call``,
    ``already_decided``) is read back from ``get_state().decisions``.

    Args:
        hermes: a connected client.
        session_id: the session (workflow id).
        tool_call_id: the id listed by ``get_pending_approvals``.
        approved: approve (True) or reject (False).
        approver: who decided, for the audit record.
        reason: optional reason, shown to the model on a rejection.
        timeout_seconds: how long to wait for the record to appear.

    Returns:
        The newest decision record for ``tool_call_id``.

    Raises:
        asyncio.TimeoutError: the session did not record the decision in time (no worker?).
        SessionNotFoundError: no such session.
        SessionUnavailableError: Temporal did not answer (see :class:`HermesClient`).
    """
    before = sum(1 for d in (await hermes.get_state(session_id)).decisions if d.tool_call_id == tool_call_id)
    if approved:
        await hermes.approve(session_id, tool_call_id, approver=approver, reason=reason)
    else:
        await hermes.reject(session_id, tool_call_id, approver=approver, reason=reason)

    async def poll() -> DecisionRecord:
        while True:
            records = [d for d in (await hermes.get_state(session_id)).decisions if d.tool_call_id == tool_call_id]
            if len(records) > before:
                return records[-1]
            await asyncio.sleep(_POLL_SECONDS)

    return await asyncio.wait_for(poll(), timeout_seconds)
