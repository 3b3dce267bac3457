"""MCP tools beside Hermes' own: discovery into tool specs, calls, results.

Every turn the workflow records one tool list (the ``list_tools`` local activity), so a
replay never depends on what a worker has cached: this module adds the MCP servers'
tools to that list, named ``<server>_<tool>`` (sanitised for the model, collisions
resolved deterministically, see :func:`hermes.mcp.config.merge_tool_names`), filtered by
the server's allow/deny globs, with its permission and idempotency (the operator's config
over the tool's annotations, see :meth:`hermes.mcp.config.ServerConfig.policy`), timeout and
"service boundary" description suffix. A call goes to the server and tool recorded in
the spec, so a renamed or vanished tool gets a clean error result, never another tool.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from hermes.errors import ToolFailure, ToolRegistrationError
from hermes.mcp.config import McpConfig, ToolHints, merge_tool_names, redact
from hermes.mcp.output import output_mismatch
from hermes.models import McpOrigin, PolicySource, ToolGroup, ToolResult, ToolResultCode, ToolSpec
from hermes.tools import arguments as args_layer
from hermes.tools.registry import Tool, ToolContext

log = logging.getLogger("hermes.mcp")

_MAX_LIST_SECONDS = 8.0
"""Longest wait for one server's whole listing (tools, resources, prompts) while a turn
starts; a slower server's tools are left out of that turn and asked again next turn.
The listing is a local activity (10 s start-to-close): it runs inside the session's
workflow task, so it must end well within that (a timed-out local activity is retried
without limit); and the shorter it is, the smaller the window in which a dying worker
holds the session (until the workflow task timeout)."""


_RETRIED_HTTP_STATUSES = frozenset({408, 409, 429})
"""HTTP 4xx statuses worth another attempt (the house rule for HTTP 4xx)."""


class McpUnavailable(Exception):
    """The server could not answer (not started, crashed, hung, protocol error, HTTP error).

    Raised, not returned: a retry-safe tool is retried, then reported as code 2; a tool
    that is not retry-safe is reported at once (code 4 if the call may have reached the
    server, see ``maybe_ran``, else code 2). An HTTP 4xx answer other than 408, 409 and
    429 is reported at once as code 2 with the server's message (asking again gets the
    same answer).

    Attributes:
        maybe_ran: whether the call may have reached the server.
        http_status: the HTTP error status the server answered, if that was the failure.
    """

    def __init__(self, message: str, *, maybe_ran: bool, http_status: int | None = None):
        self.maybe_ran = maybe_ran
        self.http_status = http_status
        super().__init__(message)


@dataclass(kw_only=True)
class McpTool(Tool):
    """A tool of an MCP server, as the model sees it."""

    origin: McpOrigin
    toolset: McpToolset = field(repr=False)
    schema_checked: bool = True
    """False when the server's input schema is not valid JSON Schema: then the arguments
    are only required to be an object and the server validates them."""
    permission_source: PolicySource = "default"
    """What decided ``permission``: the operator's config, the server's annotations, or neither."""
    idempotency_source: PolicySource = "default"
    """What decided ``idempotency``."""
    output_schema: dict[str, Any] | None = field(default=None, repr=False)
    """The tool's ``outputSchema`` as listed; a result off it is kept, with a warning."""

    def spec(self, *, tier_seconds: Callable[[str], float], heartbeat_timeout_seconds: float) -> ToolSpec:
        return super().spec(tier_seconds=tier_seconds, heartbeat_timeout_seconds=heartbeat_timeout_seconds).model_copy(
            update={"permission_source": self.permission_source, "idempotency_source": self.idempotency_source}
        )

    def validate(self, arguments: Any) -> dict[str, Any]:
        if self.schema_checked:
            return args_layer.validate_arguments(self.name, self.parameters_schema, arguments)
        return args_layer.normalize_arguments(self.name, arguments)

    async def invoke(self, arguments: Any, context: ToolContext) -> ToolResult:
        # A little under the activity's own timeout, so the server's silence is reported
        # by us (with its reason) rather than by Temporal's timer.
        timeout = self.timeout_seconds * 0.9 if self.timeout_seconds else None
        try:
            return await self.toolset.call(
                self.origin, dict(arguments), timeout_seconds=timeout, output_schema=self.output_schema
            )
        except McpUnavailable as err:
            status = err.http_status
            if status is not None and 400 <= status < 500 and status not in _RETRIED_HTTP_STATUSES:
                raise ToolFailure(str(err), code=ToolResultCode.DEPENDENCY_UNAVAILABLE, data={"http_status": status}) from None
            if not self.idempotent and err.maybe_ran:
                raise ToolFailure(
                    f"{err}; the call may have reached the server, so its outcome is unknown and it was not run again",
                    code=ToolResultCode.OUTCOME_UNKNOWN,
                ) from None
            raise


def call_result(result: Any, *, warning: str | None = None) -> ToolResult:
    """An MCP ``CallToolResult`` in the ``{code, message, data}`` shape.

    Text content comes back byte-identical. ``structured_content``, when the server
    sends it, is the data; otherwise the text (one part) or the list of parts. A result
    with ``is_error`` goes to the model as data with code 2 (the tool ran and said it
    failed), never as an exception.

    Args:
        result: the server's ``CallToolResult``.
        warning: what is wrong with a result that still counts (its mismatch with the
            tool's output schema, :func:`hermes.mcp.output.output_mismatch`): the
            message becomes ``"ok; warning: ..."``, the code stays 0.
    """
    parts: list[Any] = []
    texts: list[str] = []
    for item in getattr(result, "content", None) or []:
        kind = getattr(item, "type", None)
        if kind == "text":
            texts.append(item.text)
            parts.append(item.text)
        elif hasattr(item, "model_dump"):
            parts.append(item.model_dump(mode="json", by_alias=True, exclude_none=True))
        else:
            parts.append(item)
    structured = getattr(result, "structured_content", None)
    if structured is not None:
        data: Any = structured
    elif len(parts) == 1:
        data = parts[0]
    else:
        data = parts or None
    if getattr(result, "is_error", False):
        message = "\n".join(texts).strip() or "the MCP tool reported an error"
        return ToolResult(code=ToolResultCode.DEPENDENCY_UNAVAILABLE, message=message[:2000], data=data)
    return ToolResult(message="ok" if warning is None else f"ok; warning: {warning}", data=data)


class McpToolset:
    """The MCP side of a worker's tool layer: discovers, names and calls MCP tools.

    Args:
        config: the validated MCP configuration (``HERMES_MCP_CONFIG``).
        manager: a :class:`hermes.mcp.manager.McpManager` for ``config``.
        reserved: names already taken by Hermes' own tools (an MCP tool never shadows one).
    """

    def __init__(self, config: McpConfig, manager: Any, *, reserved: set[str] | None = None):
        self.config = config
        self.manager = manager
        self.reserved = set(reserved or ())
        self._tools: dict[str, McpTool] = {}
        self.unavailable: dict[str, str] = {}
        """Servers that could not list their tools at the last :meth:`discover`, with why
        (reported to sessions as ``mcp`` degradations)."""

    @property
    def groups(self) -> list[ToolGroup]:
        groups: dict[str, ToolGroup] = {}
        for name, server in self.config.enabled_servers().items():
            groups.setdefault(server.group, ToolGroup(name=server.group, description=f"Tools of the MCP server {name}."))
        return list(groups.values())

    async def discover(self) -> list[McpTool]:
        """The current MCP tools of every enabled server (from the manager's cache when
        fresh). A server that cannot list in time is left out, with a warning; calls
        recorded with its tools still find them (:meth:`tool_for`)."""
        servers = self.config.enabled_servers()
        unavailable: dict[str, str] = {}

        async def lists(name: str) -> tuple[list[Any], list[Any], list[Any]]:
            tools = await self.manager.list_tools(name)
            resources, prompts = await asyncio.gather(self.manager.list_resources(name), self.manager.list_prompts(name))
            return tools, resources, prompts

        async def listing(name: str) -> list[Any]:
            # One deadline for the server's three lists together (not one each).
            budget = min(servers[name].timeout_seconds, _MAX_LIST_SECONDS)
            try:
                tools, resources, prompts = await asyncio.wait_for(lists(name), budget)
            except Exception as err:  # noqa: BLE001 - one broken server must not hide the others
                why = _redacted(self.manager, name, err)
                log.warning("MCP server %s: no tool list this turn (%s)", name, why)
                unavailable[name] = str(why) or type(err).__name__
                return []
            extra = [t for t in _resource_and_prompt_tools(name, resources, prompts) if servers[name].allows(t.name)]
            return list(tools) + extra

        lists = await asyncio.gather(*(listing(name) for name in servers))
        self.unavailable = unavailable
        listed = {name: {t.name: t for t in tools} for name, tools in zip(servers, lists)}
        names, collisions = merge_tool_names({name: list(tools) for name, tools in listed.items()})
        for line in collisions:
            log.info("MCP tool names: %s", line)
        found: dict[str, McpTool] = {}
        for model_name, (server_name, tool_name) in sorted(names.items()):
            if model_name in self.reserved:
                log.warning("MCP tool %s of %s is not offered: a Hermes tool is named %r", tool_name, server_name, model_name)
                continue
            found[model_name] = self._tool(model_name, server_name, listed[server_name][tool_name])
        # A server that cannot list now (down, in its restart backoff) keeps its known tools
        # for calls already recorded with them: such a call waits for the relaunch or says
        # the server is unavailable, rather than that its tool is no longer offered.
        kept = {name: tool for name, tool in self._tools.items() if tool.origin.server in unavailable and name not in found}
        self._tools = {**kept, **found}
        return list(found.values())

    def _tool(self, model_name: str, server_name: str, listed: Any) -> McpTool:
        server = self.config.servers[server_name]
        policy = server.policy(listed.name, ToolHints.of(getattr(listed, "annotations", None)))
        if listed.name in (_READ_RESOURCE, _GET_PROMPT):  # reading never changes anything
            policy = policy.model_copy(
                update={"permission": "read", "idempotency": "idempotent", "permission_source": "default", "idempotency_source": "default"}
            )
        schema = self._masked(dict(getattr(listed, "input_schema", None) or {"type": "object"}))
        checked = True
        try:
            args_layer.check_schema(schema)
        except ToolRegistrationError as err:
            log.warning("MCP tool %s of %s: input schema not checked here (%s)", listed.name, server_name, err)
            checked = False
        return McpTool(
            name=model_name,
            description=self._masked(server.describe(listed.name, getattr(listed, "description", None)))
            or f"{listed.name} ({server_name})",
            parameters_schema=schema,
            tier="external",
            idempotency=policy.idempotency,
            permission=policy.permission,
            timeout_seconds=server.timeout_seconds,
            group=server.group,
            source=f"mcp:{server_name}",
            origin=McpOrigin(server=server_name, tool=listed.name),
            permission_source=policy.permission_source,
            idempotency_source=policy.idempotency_source,
            toolset=self,
            schema_checked=checked,
            output_schema=getattr(listed, "output_schema", None),
        )

    async def tool_for(self, name: str, origin: McpOrigin) -> McpTool | None:
        """The tool a recorded spec names, rediscovering once if this worker does not
        know it (restarted since the listing, or the list changed)."""
        known = self._tools.get(name)
        if known is None or known.origin != origin:
            await self.discover()
            known = self._tools.get(name)
        return known if known is not None and known.origin == origin else None

    async def call(
        self,
        origin: McpOrigin,
        arguments: dict[str, Any],
        *,
        timeout_seconds: float | None,
        output_schema: dict[str, Any] | None = None,
    ) -> ToolResult:
        """Call ``origin`` on its server; a server that cannot answer raises
        :class:`McpUnavailable` (code 2; retried only if the tool is retry-safe).

        A result that does not match ``output_schema`` (the tool's listed
        ``outputSchema``) is the call's result all the same, with a warning in its
        message and in the log: the server answered, so the call ran once and is done."""
        try:
            if origin.tool == _READ_RESOURCE:
                return self._masked(
                    resource_result(await self.manager.read_resource(origin.server, str(arguments.get("uri", ""))))
                )
            if origin.tool == _GET_PROMPT:
                prompt_arguments = {str(k): str(v) for k, v in (arguments.get("arguments") or {}).items()}
                return self._masked(prompt_result(
                    await self.manager.get_prompt(origin.server, str(arguments.get("name", "")), prompt_arguments)
                ))
            result = await self.manager.call_tool(origin.server, origin.tool, arguments, timeout_seconds=timeout_seconds)
        except Exception as err:  # noqa: BLE001 - every transport/process failure is "unavailable"
            raise McpUnavailable(
                f"MCP server {origin.server}: {_redacted(self.manager, origin.server, err)}",
                maybe_ran=bool(getattr(err, "maybe_ran", isinstance(err, TimeoutError))),
                http_status=getattr(err, "http_status", None),
            ) from None
        warning = output_mismatch(output_schema, result)
        if warning is not None:
            log.warning(
                "MCP tool %s of %s: %s; the result is kept, with a warning for the model",
                origin.tool, origin.server, _redacted_text(self.manager, origin.server, warning),
            )
        return self._masked(call_result(result, warning=warning))

    def _masked(self, value: Any) -> Any:
        """``value`` (a tool result, a description, a schema) with every MCP server's
        resolved secret masked (``***``; :func:`hermes.mcp.config.redact`): a server that
        echoes its token (from its env, its URL or an ``Authorization`` header) must not put
        it in workflow history, Redis, the transcript or the model's context. Every
        server's, not only the caller's: a server may know another's."""
        resolved = list(getattr(self.manager, "resolved", {}).values())
        if not resolved:
            return value
        if isinstance(value, ToolResult):
            return value.model_copy(update={"message": redact(value.message, resolved), "data": redact(value.data, resolved)})
        return redact(value, resolved)


_READ_RESOURCE = "resources.read"
_GET_PROMPT = "prompts.get"
"""Tools Hermes adds for a server that offers resources or prompts (``<server>_resources_read``,
``<server>_prompts_get``): the model reads them like any tool, read-only and retry-safe.
The server's allow/deny globs apply to these names too."""
_MAX_LISTED = 50


@dataclass
class _Listed:
    name: str
    description: str
    input_schema: dict[str, Any]


def _resource_and_prompt_tools(server: str, resources: list[Any], prompts: list[Any]) -> list[_Listed]:
    found: list[_Listed] = []
    if resources:
        uris = [str(r.uri) for r in resources[:_MAX_LISTED]]
        lines = [f"- {r.uri}: {r.name}" + (f" ({r.description})" if getattr(r, "description", None) else "") for r in resources[:_MAX_LISTED]]
        found.append(
            _Listed(
                name=_READ_RESOURCE,
                description=f"Read a resource of the MCP server {server}. Resources:\n" + "\n".join(lines),
                input_schema={
                    "type": "object",
                    "properties": {"uri": {"type": "string", "description": "One of the listed URIs.", **({"enum": uris} if len(resources) <= _MAX_LISTED else {})}},
                    "required": ["uri"],
                    "additionalProperties": False,
                },
            )
        )
    if prompts:
        lines = []
        for p in prompts[:_MAX_LISTED]:
            params = ", ".join(a.name + ("" if getattr(a, "required", False) else "?") for a in (getattr(p, "arguments", None) or []))
            lines.append(f"- {p.name}({params})" + (f": {p.description}" if getattr(p, "description", None) else ""))
        found.append(
            _Listed(
                name=_GET_PROMPT,
                description=f"Get a prompt template of the MCP server {server}, filled in. Prompts:\n" + "\n".join(lines),
                input_schema={
                    "type": "object",
                    "properties": {
                        "name": {"type": "string", "description": "One of the listed prompt names."},
                        "arguments": {"type": "object", "additionalProperties": {"type": "string"}, "description": "The prompt's arguments."},
                    },
                    "required": ["name"],
                    "additionalProperties": False,
                },
            )
        )
    return found


def resource_result(result: Any) -> ToolResult:
    """A ``ReadResourceResult``: text contents as text (byte-identical), blobs as base64."""
    parts: list[Any] = []
    for item in getattr(result, "contents", None) or []:
        if getattr(item, "text", None) is not None:
            parts.append({"uri": str(item.uri), "mime_type": getattr(item, "mime_type", None), "text": item.text})
        else:
            parts.append({"uri": str(item.uri), "mime_type": getattr(item, "mime_type", None), "blob": getattr(item, "blob", None)})
    return ToolResult(message="ok", data=parts[0] if len(parts) == 1 else parts)


def prompt_result(result: Any) -> ToolResult:
    """A ``GetPromptResult``: its messages as ``{role, text}``."""
    messages = []
    for message in getattr(result, "messages", None) or []:
        content = message.content
        text = getattr(content, "text", None)
        messages.append({"role": message.role, "text": text if text is not None else content.model_dump(mode="json")})
    return ToolResult(message="ok", data={"description": getattr(result, "description", None), "messages": messages})


def _redacted(manager: Any, server: str, err: BaseException) -> str:
    return _redacted_text(manager, server, f"{type(err).__name__}: {err}" if str(err) else type(err).__name__)


def _redacted_text(manager: Any, server: str, text: str) -> str:
    resolved = getattr(manager, "resolved", {}).get(server) if hasattr(manager, "resolved") else None
    return redact(text, resolved) if resolved is not None else text
