"""Which commands a session takes: the proof of each command's sender (issue 26).

Every command that acts on a session carries a :class:`hermes.models.CommandProof`, an
HMAC by a command key (:mod:`hermes.security.command_auth`); a client that reaches Temporal without
one can act as nobody. The :class:`CommandGate` checks the proofs with the worker's key
ring and records what it refuses (the state's ``notices``); the shell asks it in each
handler and applies a command only when it holds.

- A **start** (the run's input, when the run is not a continuation of the session's own
  continue-as-new) needs a proof of command ``start_session`` by its ``user_id``, or by an
  admin; without one the run ends failed at once (so the id can be started properly).
- A **message** (``send_message``) needs a proof by the session's user, or by a sender with
  the ``admin`` role (recorded as the message's ``sender``); it is refused in the update's
  validator (not taken, nothing recorded in history).
- A **signal** (decisions, cancel, close, system prompt) needs a proof by the session's
  user, an admin, or (decisions) the decision's ``approver``; a refused signal changes
  nothing but a notice. A proof is taken once: the same proof again (a client resending a
  signal it is not sure arrived) is a duplicate and ignored.

Plain Python; nothing here knows of Temporal: the clock and the key ring come in as
arguments, and whether the run has the patch is the caller's to ask.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from hermes import names
from hermes.models import CommandProof, SendMessageInput, SessionInput
from hermes.security import command_auth
from hermes.security.command_auth import CommandKeyRing

MAX_SEEN_PROOFS = 500
"""Signal proofs remembered (the newest; each also only for ``command_auth.MAX_AGE``)."""
MAX_NOTICES = 20


def start_refusal(inp: SessionInput, ring: CommandKeyRing | None, *, continued: bool, now: datetime) -> str | None:
    """Why a run with input ``inp`` must not run (None: it may).

    Args:
        inp: the run's input.
        ring: the worker's command key ring.
        continued: the run continues the session's own continue-as-new (Temporal starts
            such runs only from the workflow itself; its input is the previous run's).
        now: the workflow's clock.
    """
    if continued:
        return None
    refusal = command_auth.verify(ring, names.START_SESSION, inp.session_id, inp, inp.proof, now=now)
    if refusal is None and inp.proof is not None and not command_auth.acts_for(inp.proof, inp.user_id):
        refusal = f"its proof is by {inp.proof.sender!r}, who may not start a session for {inp.user_id!r}"
    return refusal


class CommandGate:
    """The proofs of a session's commands, checked; what was refused, noted.

    Args:
        session_id, user_id: of the session.
        notices: the session's notice list (refusals are appended, the newest
            ``MAX_NOTICES`` kept).
        seen: signal proofs already taken (MAC -> issue time), carried across
            continue-as-new.
    """

    def __init__(self, *, session_id: str, user_id: str, notices: list[str], seen: Mapping[str, datetime] | None = None):
        self.session_id = session_id
        self.user_id = user_id
        self.notices = notices
        self.seen: dict[str, datetime] = dict(seen or {})

    def message(self, inp: SendMessageInput, ring: CommandKeyRing | None, now: datetime) -> tuple[str, str] | None:
        """Why message ``inp`` is refused, as ``(error type, message)``; None: it may be
        taken (its sender is then :meth:`sender_of`)."""
        refusal = command_auth.verify(ring, names.SEND_MESSAGE, self.session_id, inp, inp.proof, now=now)
        if refusal is not None:
            return "CommandRefusedError", f"message refused: {refusal}"
        assert inp.proof is not None
        if not command_auth.acts_for(inp.proof, self.user_id):
            return "SessionForbiddenError", (
                f"session {self.session_id!r} belongs to another user; {inp.proof.sender!r} may not post into it"
            )
        return None

    @staticmethod
    def sender_of(inp: SendMessageInput, user_id: str) -> str | None:
        """Who sent ``inp`` when not the session's user (``None``: its user, or a message
        of a run from before proofs)."""
        if inp.proof is None or inp.proof.sender == user_id:
            return None
        return inp.proof.sender

    def signal(
        self, command: str, payload: Any, proof: CommandProof | None, ring: CommandKeyRing | None, now: datetime,
        *, sender: str | None = None,
    ) -> str | None:
        """Whether signal ``command`` with ``payload`` may be applied.

        Args:
            sender: who the payload says sends it (a decision's ``approver``): the proof
                must be by them. None: the session's user or an admin.

        Returns:
            None to apply it; else why not (a refusal is also a notice; a duplicate is not).
        """
        refusal = command_auth.verify(ring, command, self.session_id, payload, proof, now=now)
        if refusal is None:
            assert proof is not None
            if proof.mac in self.seen:
                return "duplicate"
            if sender is not None and proof.sender != sender:
                refusal = f"its proof is by {proof.sender!r}, not by {sender!r} whom it names"
            elif sender is None and not command_auth.acts_for(proof, self.user_id):
                refusal = f"its proof is by {proof.sender!r}, who is neither the session's user nor an admin"
        if refusal is not None:
            self.note(now, f"refused a {command} signal: {refusal}")
            return refusal
        self.remember(proof.mac, proof.issued_at, now)  # type: ignore[union-attr]
        return None

    def remember(self, mac: str, issued_at: datetime, now: datetime) -> None:
        """Take proof ``mac`` once; forget those past their age and beyond the newest
        ``MAX_SEEN_PROOFS``."""
        self.seen[mac] = issued_at
        cutoff = now - command_auth.MAX_AGE
        for old in [m for m, at in self.seen.items() if at < cutoff]:
            del self.seen[old]
        while len(self.seen) > MAX_SEEN_PROOFS:
            del self.seen[next(iter(self.seen))]

    def note(self, now: datetime, text: str) -> None:
        """A notice in the session's state (the newest ``MAX_NOTICES`` kept)."""
        self.notices.append(f"{now.isoformat(timespec='seconds')}: {text}")
        del self.notices[:-MAX_NOTICES]


def admission(
    s: Any, inp: SendMessageInput, *, knows: bool, start_refused: str | None, ring: CommandKeyRing | None, now: datetime
) -> tuple[str, str, bool] | None:
    """Whether session ``s`` (a :class:`workflows.session.state.SessionCore`) takes message
    ``inp`` now: None, or the refusal as ``(error type, message, non_retryable)``.

    In this order: a message for another user's session, then one without a valid proof
    of its sender, are refused before anything else (a forger or another user gets no
    reply to a message id the session knows); a resend of a message the session knows
    (``knows``) is always taken, even while closing, rolling over or halted: its handler
    only waits for or returns the first reply, so a refusal (busy, closed, halted) always
    means "never taken". Only which updates are accepted depends on this, never the
    commands of an accepted one: replay-safe, and a validator is not run on replay.
    """
    from workflows.session import turn as turns

    if inp.user_id is not None and inp.user_id != s.inp.user_id:
        return "SessionForbiddenError", turns.foreign_sender(s.inp.session_id, inp.user_id), True
    if start_refused is not None:
        return "CommandRefusedError", f"this session was started without a valid proof ({start_refused}); it takes no message", True
    refused = s.gate.message(inp, ring, now)
    if refused is not None:
        return refused[0], refused[1], True
    if inp.client_message_id is not None and inp.client_message_id in s.replies.completed:
        return None
    if (s.status == "closed" or s.draining or s.book.halted_on) and knows:
        return None
    if s.status == "closed":
        return "SessionClosedError", "the session is closed", True
    if not inp.text or not inp.text.strip():
        return "MessageRejectedError", "the message is empty", True
    size = len(inp.text.encode("utf-8"))
    if size > s.cfg.max_message_bytes:
        return "MessageRejectedError", f"the message is {size} bytes; the limit is {s.cfg.max_message_bytes} bytes", True
    if s.draining:
        return "SessionBusyError", "the session is continuing as new; retry in a moment", False
    if s.book.halted_on:
        return "SessionHaltedError", f"the session is halted until a human approves or rejects: {s.book.waiting_for()}", True
    return None
