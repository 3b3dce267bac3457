"""The session's commands checked where they arrive: the durable side of
:mod:`workflows.session.commands` (workflow clock, key ring, patch, log and metric).

Workflow code, no decisions: :class:`workflows.session.commands.CommandGate` decides.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from hermes.infra import telemetry
    from hermes.security import command_auth
    from hermes.models import CommandProof, SessionInput

    from workflows.session import commands, patches
    from workflows.session.state import SessionCore


class SignalGuard:
    """Checks each command's proof (:mod:`hermes.security.command_auth`) for a session.

    Args:
        s: the session's state (its ``gate`` keeps the refusals and the proofs taken).
        patched: whether the run has a patch; runs without ``command-auth`` take every
            signal as before.
    """

    def __init__(self, s: SessionCore, patched: Callable[[str], bool]) -> None:
        self._s = s
        self._patched = patched

    def start_refusal(self, inp: SessionInput) -> str | None:
        """Why this run's input must not run (:func:`commands.start_refusal`); no command."""
        continued = workflow.info().continued_run_id is not None
        return commands.start_refusal(inp, command_auth.worker_ring(), continued=continued, now=workflow.now())

    def parse(self, command: str, args: tuple[Any, ...], shape: tuple[Any, ...]) -> list[Any] | None:
        """The signal's arguments as ``shape`` says (:func:`command_auth.parse_args`), or
        None when they are not: then the signal is refused, noted and counted, never a
        failed workflow task."""
        parsed = command_auth.parse_args(args, shape)
        if isinstance(parsed, list):
            return parsed
        self._s.gate.note(workflow.now(), f"refused a {command} signal: {parsed}")
        self.count(command, parsed)
        return None

    def refusal(self, command: str, payload: Any, proof: CommandProof | None, *, sender: str | None = None) -> str | None:
        """Why signal ``command`` is not applied (None: apply it; ``"duplicate"``: a proof
        taken before, changing nothing); a refusal is noted, logged and counted."""
        if not self._patched(patches.COMMAND_AUTH):
            return None
        refusal = self._s.gate.signal(command, payload, proof, command_auth.worker_ring(), workflow.now(), sender=sender)
        if refusal is not None and refusal != "duplicate":
            self.count(command, refusal)
        return refusal

    def count(self, command: str, why: str) -> None:
        """Log and count a refused command (not again on replay)."""
        if not workflow.unsafe.is_replaying():
            workflow.logger.warning("session %s refused %s: %s", self._s.inp.session_id, command, why)
            telemetry.count_refused_command(command)

