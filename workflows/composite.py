"""CompositeToolWorkflow: a composite tool's steps, run in order, each step durable.

A composite tool (seed 000 §2.3: "cancel the order, refund, notify" exposed as one
tool) is started by the session as a child workflow with a deterministic id derived
from the tool call, so a worker crash resumes it at the step it was on instead of
starting over, and a non-idempotent step still runs at most once (its activity keeps
the exactly-once record, keyed by the step's own call id).
"""

from __future__ import annotations

from typing import Any

from temporalio import workflow
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from hermes import names
    from hermes.models import CompositeInput, RunToolInput, ToolCall, ToolResult, ToolResultCode

    from workflows.tool_calls import result_from_failure, tool_activity_options


class MissingReference(LookupError):
    pass


def _lookup(value: Any, path: list[str]) -> Any:
    for part in path:
        if isinstance(value, dict) and part in value:
            value = value[part]
        elif isinstance(value, list) and part.lstrip("-").isdigit() and -len(value) <= int(part) < len(value):
            value = value[int(part)]
        else:
            raise MissingReference(part)
    return value


def resolve(template: Any, arguments: dict[str, Any], results: dict[str, ToolResult]) -> Any:
    """``template`` with ``"$args.<path>"`` and ``"$steps.<step>.<path>"`` strings replaced.

    Raises:
        MissingReference: a reference to something that is not there.
    """
    if isinstance(template, dict):
        return {k: resolve(v, arguments, results) for k, v in template.items()}
    if isinstance(template, list):
        return [resolve(v, arguments, results) for v in template]
    if isinstance(template, str) and template.startswith(("$args.", "$steps.")):
        head, _, rest = template[1:].partition(".")
        path = rest.split(".")
        if head == "args":
            try:
                return _lookup(arguments, path)
            except MissingReference:
                if len(path) == 1:
                    return None  # an optional argument the model left out
                raise MissingReference(template) from None
        step = path[0]
        if step not in results:
            raise MissingReference(template)
        try:
            return _lookup(results[step].model_dump(mode="json"), path[1:])
        except MissingReference:
            raise MissingReference(template) from None
    return template


@workflow.defn(name=names.COMPOSITE_TOOL_WORKFLOW)
class CompositeToolWorkflow:
    @workflow.run
    async def run(self, inp: CompositeInput) -> ToolResult:
        """Run the steps in order; stop at the first that fails.

        Returns:
            Code 0 with ``data = {"steps": [...], "result": <last step's data>}``, or the
            failing step's code with a message naming the step and the steps already done.
        """
        results: dict[str, ToolResult] = {}
        done: list[dict[str, Any]] = []
        total = len(inp.steps)
        for index, step in enumerate(inp.steps, start=1):
            spec = inp.specs.get(step.tool)
            failure: ToolResult | None = None
            if spec is None:
                failure = ToolResult(code=ToolResultCode.DEPENDENCY_UNAVAILABLE, message=f"tool {step.tool!r} is not available")
            else:
                try:
                    arguments = resolve(step.arguments, inp.tool_call.arguments, results)
                except MissingReference as err:
                    failure = ToolResult(
                        code=ToolResultCode.DEPENDENCY_UNAVAILABLE,
                        message=f"reference {err.args[0]!r} has no value (a step before returned no such field)",
                    )
            if failure is None:
                call = ToolCall(
                    tool_call_id=f"{inp.tool_call.tool_call_id}.{step.name}",
                    name=step.tool,
                    arguments={k: v for k, v in arguments.items() if v is not None},
                )
                try:
                    result = await workflow.execute_activity(
                        names.RUN_TOOL,
                        RunToolInput(
                            session_id=inp.session_id,
                            user_id=inp.user_id,
                            turn=inp.turn,
                            tool_call=call,
                            idempotent=spec.idempotent,
                            chain_id=inp.chain_id,
                        ),
                        result_type=ToolResult,
                        summary=f"step {index}/{total}: {step.tool}",
                        **tool_activity_options(spec),
                    )
                except ActivityError as err:
                    result = result_from_failure(err, spec)
            else:
                result = failure
            results[step.name] = result
            done.append({"step": step.name, "tool": step.tool, "code": int(result.code), "message": result.message[:300]})
            if not result.ok:
                before = ", ".join(d["step"] for d in done[:-1]) or "none"
                return ToolResult(
                    code=result.code,
                    message=f"step {index} of {total} ({step.name}: {step.tool}) failed: {result.message}; steps completed before it: {before}",
                    data={"steps": done, "failed_step": step.name},
                )
        last = results[inp.steps[-1].name]
        return ToolResult(
            message=f"all {total} steps completed",
            data={"steps": done, "result": last.data},
        )
