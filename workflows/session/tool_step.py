"""The tool step of a turn: which of a model step's tool calls run at once, which are
checked and put up for a human first, which are refused before anything runs, and what
a fallback returns.

Plain functions; nothing here knows of Temporal. The workflow runs the calls in the
order of the model's step, exactly one result per call (:meth:`SessionWorkflow._run_step`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from hermes.models import ApprovalPolicy, SessionConfig, ToolCall, ToolCallRecord, ToolResult, ToolResultCode, ToolSpec
from hermes.tools.arguments import argument_descriptions

Screen = Literal["refused", "run", "check", "ask_later"]
"""What happens to a call before the step runs: ``refused`` (its result is known now:
an unknown tool, arguments that did not parse, a denied permission), ``run`` (it needs
nobody: runs in its turn), ``check`` (its arguments are checked now and, unless its
policy runs it, a human is asked now, with the step's other gated calls), ``ask_later``
(runs recorded before the tool-layer-v2 patch: asked when its turn comes, unchecked)."""


@dataclass(frozen=True)
class Screening:
    """How one call of a step is handled; ``result`` for refused calls."""

    screen: Screen
    result: ToolResult | None = None


def screen(
    call: ToolCall, spec: ToolSpec | None, specs: Iterable[str], policy: ApprovalPolicy | None, *, v2: bool
) -> Screening:
    """Screen ``call`` (its ``spec``, None if no such tool; ``specs``: the tool names
    offered; ``policy``: what its permission needs, None only without a spec; ``v2``:
    the run has tool-layer-v2)."""
    if spec is None:
        return Screening(
            "refused",
            ToolResult(
                code=ToolResultCode.BAD_ARGUMENTS,
                message=f"unknown tool {call.name!r}; available tools: {', '.join(sorted(specs)) or 'none'}",
            ),
        )
    if call.arguments_error is not None:
        return Screening("refused", ToolResult(code=ToolResultCode.BAD_ARGUMENTS, message=call.arguments_error))
    if policy is None or policy.action == "deny":
        return Screening(
            "refused",
            ToolResult(
                code=ToolResultCode.PERMISSION_DENIED,
                message=f"tools needing permission {spec.permission!r} are not allowed in this session",
            ),
        )
    if policy.action == "run" and spec.composite is None:
        return Screening("run")
    return Screening("check" if v2 else "ask_later")


def checked_call(call: ToolCall, arguments: dict[str, Any], arguments_ref: str | None) -> ToolCall:
    """``call`` with the arguments its check returned (coerced; a large value by
    reference)."""
    update: dict[str, Any] = {"arguments": arguments}
    if call.arguments_ref is not None or arguments_ref is not None:
        update["arguments_ref"] = arguments_ref
    return call.model_copy(update=update)


def closed_before_run() -> ToolResult:
    """The result of a call the session's close stopped before it ran (a new object each
    time: results go into records and transcripts that may be changed later)."""
    return ToolResult(
        code=ToolResultCode.DENIED_BY_HUMAN, message="the session was closed before this tool call ran; it was not run"
    )


def cancelled_while_running() -> ToolResult:
    """The result of a call that ran when its turn was cancelled: its outcome is unknown."""
    return ToolResult(
        code=ToolResultCode.OUTCOME_UNKNOWN,
        message="the turn was cancelled while this tool call ran; its outcome is unknown",
    )


def fallback_for(result: ToolResult, spec: ToolSpec, specs: Mapping[str, ToolSpec]) -> ToolSpec | None:
    """The fallback tool to run after ``result``: only when the tool has one and the
    failure is safe to try elsewhere (its dependency is down, or an idempotent call's
    outcome is unknown)."""
    fallback = specs.get(spec.fallback) if spec.fallback else None
    retry_safe = result.code == ToolResultCode.DEPENDENCY_UNAVAILABLE or (
        result.code == ToolResultCode.OUTCOME_UNKNOWN and spec.idempotent
    )
    return fallback if retry_safe else None


def fallback_call(call: ToolCall, fallback: ToolSpec) -> ToolCall:
    """The fallback's call: the same arguments, id ``<id>.fallback``."""
    return call.model_copy(update={"tool_call_id": f"{call.tool_call_id}.fallback", "name": fallback.name})


def fallback_result(spec: ToolSpec, fallback: ToolSpec, failed: ToolResult, result: ToolResult) -> ToolResult:
    """The fallback's ``result``, saying which tool failed and why (2,000 characters)."""
    message = f"{spec.name} failed ({failed.message[:300]}); this result is from the fallback {fallback.name}: {result.message}"
    return result.model_copy(update={"message": message[:2000]})


@dataclass
class StepTally:
    """What a turn learns from its steps: the tools suggested next (``next_possible_tools``
    of calls that succeeded) and how often each tool got bad arguments."""

    suggested: set[str] = field(default_factory=set)
    bad_arguments: dict[str, int] = field(default_factory=dict)

    def count(
        self, calls: list[ToolCall], records: list[ToolCallRecord], specs: Mapping[str, ToolSpec], max_retries: int
    ) -> tuple[ToolCall, ToolResult, ToolSpec | None] | None:
        """Tally one step (its ``calls`` and their ``records``, in order). Returns the
        first call whose tool got bad arguments more than ``max_retries`` times in the
        turn (the turn then asks the user), else None."""
        for call, record in zip(calls, records):
            spec = specs.get(call.name)
            if spec is not None and record.result.ok:
                self.suggested.update(spec.next_possible_tools)
            if record.result.code == ToolResultCode.BAD_ARGUMENTS:
                self.bad_arguments[call.name] = self.bad_arguments.get(call.name, 0) + 1
                if self.bad_arguments[call.name] > max_retries:
                    return call, record.result, spec
        return None


def ask_for_arguments(cfg: SessionConfig, call: ToolCall, result: ToolResult, spec: ToolSpec | None) -> str:
    """What the user is told when the model could not produce valid arguments for
    ``call``: the missing ones with their descriptions, or the last error."""
    data = result.data if isinstance(result.data, dict) else {}
    missing = [m for m in data.get("missing", []) if isinstance(m, str)]
    tries = cfg.max_argument_retries + 1
    if missing:
        descriptions = argument_descriptions(spec.parameters if spec else {}, missing)
        wanted = "; ".join(f"{name}: {text}" if text else name for name, text in descriptions.items())
        return f"To run {call.name} I need more information from you. Please tell me: {wanted}."
    return (
        f"I could not call {call.name} with valid arguments after {tries} tries "
        f"({result.message[:500]}). Could you rephrase or give the exact values?"
    )
