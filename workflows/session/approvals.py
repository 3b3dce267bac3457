"""The approval book of a session: which tool calls wait for a human, the decisions
that came in, the verdicts, the session halted on an expired approval, the audit
entries still to write, and the calls whose outcome is unknown.

Plain Python; nothing here knows of Temporal. Times come in as arguments; the workflow
writes the search attributes and the audit log from what these methods return.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from datetime import datetime, timedelta
from typing import Any

from hermes.models import (
    ApprovalAuditEntry,
    ApprovalDecision,
    ApprovalPolicy,
    DecisionRecord,
    PendingApproval,
    ToolCall,
    ToolResult,
    ToolResultCode,
    ToolSpec,
)

from workflows.session.payloads import MAX_DECISIONS, MAX_SETTLED, MAX_UNKNOWN, fingerprint

DENIALS = {
    "rejected": "the user rejected this tool call",
    "expired": "nobody approved this tool call in time",
    "cancelled": "the session closed before this tool call was approved",
}
"""Why a gated call did not run, by verdict, as the model reads it."""


class ApprovalBook:
    """Pending approvals (``pending``), verdicts not yet applied (``verdicts``), the
    settled ids (``settled``, newest ``MAX_SETTLED``), the ids the session is halted on
    (``halted_on``), every decision received (``decisions``, newest ``MAX_DECISIONS``),
    the audit entries to write (``audit_buffer``), and the calls of unknown outcome
    (``unknown``: call fingerprint -> tool call id, newest ``MAX_UNKNOWN``).

    Args:
        session_id, user_id: of the session (the requester of its calls).
        decisions, settled, unknown: carried from the previous run.
        audit_enabled: whether audit entries are kept (the run's audit-log patch); asked
            at the first entry, not before.
        identities: whether a ``confirm`` is decided only by the session's user or a
            listed approver (the run's session-identity patch; see
            :meth:`PendingApproval.may_decide`); asked at a decision on a pending call.
    """

    def __init__(
        self,
        *,
        session_id: str,
        user_id: str,
        decisions: Iterable[DecisionRecord] = (),
        settled: Iterable[str] = (),
        unknown: Mapping[str, str] | None = None,
        audit_enabled: Callable[[], bool] = lambda: True,
        identities: Callable[[], bool] = lambda: True,
    ) -> None:
        self.session_id = session_id
        self.user_id = user_id
        self.pending: dict[str, PendingApproval] = {}
        self.verdicts: dict[str, ApprovalDecision] = {}
        self.settled: list[str] = list(settled)
        self.halted_on: set[str] = set()
        self.decisions: list[DecisionRecord] = list(decisions)
        self.unknown: dict[str, str] = dict(unknown or {})
        self.audit_buffer: list[ApprovalAuditEntry] = []
        self._audit_seq = 0
        self._audit_enabled = audit_enabled
        self._identities = identities

    # ----------------------------------------------------------------- policy

    def policy(self, call: ToolCall, spec: ToolSpec, policies: Mapping[str, ApprovalPolicy]) -> tuple[ApprovalPolicy, str]:
        """What ``call`` needs before it runs (the policy of its permission; "approve"
        if none), and why beyond its permission: a non-idempotent call whose same call
        earlier has an unknown outcome is confirmed by a human even where it would run."""
        policy = policies.get(spec.permission) or ApprovalPolicy(action="approve")
        if not spec.idempotent and fingerprint(call) in self.unknown and policy.action == "run":
            earlier = self.unknown[fingerprint(call)]
            return policy.model_copy(update={"action": "confirm"}), (
                f"the same call ({earlier}) has an unknown outcome; it may already have happened"
            )
        return policy, ""

    def note_result(self, call: ToolCall, spec: ToolSpec, result: ToolResult) -> str | None:
        """Record a non-idempotent call's outcome: unknown ones are remembered (the same
        call later needs a human), a success forgets them. Returns the warning for the
        user when the outcome is unknown."""
        if spec.idempotent:
            return None
        if result.code == ToolResultCode.OUTCOME_UNKNOWN:
            self.unknown[fingerprint(call)] = call.tool_call_id
            while len(self.unknown) > MAX_UNKNOWN:
                self.unknown.pop(next(iter(self.unknown)))
            return (
                f"{call.name} ({call.tool_call_id}) may or may not have run: {result.message[:300]} "
                "It will not be run again unless a human approves."
            )
        if result.ok and self.unknown:  # (the fingerprint hashes the arguments: only when one is kept)
            self.unknown.pop(fingerprint(call), None)
        return None

    # --------------------------------------------------------------- requests

    def request(
        self,
        turn: int,
        call: ToolCall,
        spec: ToolSpec,
        policy: ApprovalPolicy,
        reason: str,
        *,
        now: datetime,
        default_timeout_seconds: float,
        requested_by: str | None = None,
    ) -> PendingApproval:
        """Put ``call`` up for a decision until ``now`` plus the policy's timeout (or
        ``default_timeout_seconds``); audited as "requested"."""
        timeout = policy.timeout_seconds or default_timeout_seconds
        pending = PendingApproval(
            tool_call_id=call.tool_call_id,
            tool_name=call.name,
            arguments=call.arguments,
            permission=spec.permission,
            turn=turn,
            requested_at=now,
            expires_at=now + timedelta(seconds=timeout),
            session_id=self.session_id,
            requester=self.user_id,
            requested_by=requested_by or "",
            action="approve" if policy.action == "approve" else "confirm",
            approvers=list(policy.approvers),
            on_expiry=policy.on_expiry,
            reason=reason,
        )
        self.pending[call.tool_call_id] = pending
        self.audit("requested", pending, now=now, reason=reason or None)
        return pending

    def decide(self, decision: ApprovalDecision, now: datetime, *, refusal: str | None = None) -> str:
        """Take a human's decision: applied when the call is pending and the approver may
        decide it (:meth:`PendingApproval.may_decide`: a ``confirm`` by the session's user
        or a listed approver, an ``approve`` by a listed approver other than the
        requester), else recorded with why not and the call stays pending. Every decision
        is recorded and audited.

        Args:
            refusal: why the decision is refused whoever it names (no valid proof of its
                sender, :mod:`hermes.security.command_auth`): recorded ``not_allowed`` with it.

        Returns:
            "applied", "already_decided", "not_allowed" or "unknown_tool_call".
        """
        tcid = decision.tool_call_id
        detail = ""
        if refusal is not None:
            outcome, detail = "not_allowed", refusal
        elif tcid in self.pending:
            refusal = self.pending[tcid].may_decide(decision.approver, identities=self._identities())
            if tcid in self.verdicts:
                outcome = "already_decided"
            elif refusal is not None:
                outcome, detail = "not_allowed", refusal
            else:
                outcome = "applied"
                self.verdicts[tcid] = decision
        elif tcid in self.settled:
            outcome = "already_decided"
        else:
            outcome = "unknown_tool_call"
        self.decisions.append(
            DecisionRecord(
                tool_call_id=tcid,
                approved=decision.approved,
                approver=decision.approver,
                reason=decision.reason,
                outcome=outcome,
                at=now,
                detail=detail,
            )
        )
        del self.decisions[:-MAX_DECISIONS]
        about = self.pending.get(tcid) or PendingApproval(
            tool_call_id=tcid, tool_name="", arguments={}, permission="write", turn=0,
            requested_at=now, expires_at=now, requester=self.user_id,
        )
        self.audit(
            "decision", about, now=now, approver=decision.approver, approved=decision.approved,
            outcome=outcome, detail=detail, reason=decision.reason,
        )
        return outcome

    def decided(self, tcid: str) -> bool:
        return tcid in self.verdicts

    def settle(self, tcid: str) -> bool:
        """The call is no longer pending (decided, expired or cancelled). Returns whether
        it was pending (then the pending count and maybe the status changed)."""
        if self.pending.pop(tcid, None) is None:
            return False
        self.settled.append(tcid)
        del self.settled[:-MAX_SETTLED]
        self.verdicts.pop(tcid, None)
        self.halted_on.discard(tcid)
        return True

    def halt(self, pending: PendingApproval, now: datetime) -> None:
        """``pending`` expired under ``on_expiry="halt"``: the session waits for a human."""
        pending.expired = True
        self.halted_on.add(pending.tool_call_id)
        self.audit("halted", pending, now=now, detail="expired with on_expiry=halt: the session waits for a human")

    def waiting_for(self) -> str:
        """The calls the session is halted on, for the refusal of a message."""
        return ", ".join(
            f"{p.tool_name} ({p.tool_call_id})" for p in self.pending.values() if p.tool_call_id in self.halted_on
        )

    def verdict_entry(self, pending: PendingApproval, verdict: str, decision: ApprovalDecision | None, now: datetime) -> None:
        """Settle ``pending`` with ``verdict`` and audit it with the decision, if any."""
        self.settle(pending.tool_call_id)
        self.audit(
            "verdict", pending, now=now, outcome=verdict,
            approver=decision.approver if decision else None,
            approved=decision.approved if decision else None,
            reason=decision.reason if decision else None,
        )

    # ------------------------------------------------------------------ audit

    def audit(self, event: str, pending: PendingApproval, *, now: datetime, **fields: Any) -> None:
        """Buffer an entry for the approval audit log (runs without the audit-log patch
        keep none)."""
        if not self._audit_enabled():
            return
        self._audit_seq += 1
        self.audit_buffer.append(
            ApprovalAuditEntry(
                entry_id=f"{pending.tool_call_id}:{event}:{int(now.timestamp() * 1_000_000)}:{self._audit_seq}",
                session_id=self.session_id,
                tool_call_id=pending.tool_call_id,
                tool_name=pending.tool_name,
                event=event,  # type: ignore[arg-type]
                at=now,
                requester=pending.requester or self.user_id,
                permission=pending.permission,
                arguments=pending.arguments if event == "requested" else {},
                # The stand-in for an unknown tool call's decision has turn 0: no turn.
                turn=pending.turn or None,
                **fields,
            )
        )

    def take_audit(self) -> list[ApprovalAuditEntry]:
        """The buffered entries, leaving the buffer empty."""
        batch, self.audit_buffer = self.audit_buffer, []
        return batch


def denial(verdict: str, decision: ApprovalDecision | None) -> ToolResult:
    """The result of a gated call that was not approved (``verdict`` is "rejected",
    "expired" or "cancelled")."""
    reason = f": {decision.reason}" if decision and decision.reason else ""
    return ToolResult(code=ToolResultCode.DENIED_BY_HUMAN, message=f"{DENIALS[verdict]}{reason}; it was not run")
