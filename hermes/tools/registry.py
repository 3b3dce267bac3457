"""Tool registration: a decorated function becomes a tool the model can call.

The signature and the Google-style docstring become the JSON Schema the model sees;
pydantic validates and coerces the arguments the model sends (``"3"`` -> ``3``). Each
tool declares its tier (timeout class), whether it is idempotent, and a permission.

Example::

    @tool(tier="query", permission="read")
    def current_time(timezone: str = "UTC") -> dict:
        \"\"\"Current date and time in a time zone.

        Args:
            timezone: IANA time zone name, e.g. "Asia/Shanghai".
        \"\"\"
"""

from __future__ import annotations

import inspect
import re
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, get_type_hints

from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model

from hermes.errors import ToolArgumentsError, ToolRegistrationError
from hermes.models import Permission, Tier, ToolSpec

_NAME_RE = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
"""Function names accepted by chat-completions providers."""


@dataclass
class ToolContext:
    """What a running tool may know about its call. Declare a parameter typed
    ``ToolContext`` to receive it; it is not part of the schema the model sees."""

    session_id: str
    user_id: str
    tool_call_id: str
    turn: int
    attempt: int = 1
    redis: Any = None
    """The worker's ``redis.asyncio.Redis`` client, for tools that keep state there."""
    call_key: str = ""

    @property
    def idempotency_key(self) -> str:
        """Stable across retries of this call and unique to it for the life of the session
        id: ``session_id:chain:turn:tool_call_id`` (models reuse their tool-call ids, and a
        session id may be reused after a termination). Pass it to backends that dedupe."""
        return self.call_key or f"{self.session_id}:{self.turn}:{self.tool_call_id}"


@dataclass
class Tool:
    """A registered tool: its metadata and the code that runs it."""

    name: str
    fn: Callable[..., Any]
    description: str
    arguments_model: type[BaseModel]
    tier: Tier
    idempotent: bool
    permission: Permission
    timeout_seconds: float | None
    context_parameter: str | None = None
    parameters_schema: dict[str, Any] = field(default_factory=dict)

    def spec(self, *, tier_seconds: Callable[[str], float], heartbeat_timeout_seconds: float) -> ToolSpec:
        return ToolSpec(
            name=self.name,
            description=self.description,
            parameters=self.parameters_schema,
            tier=self.tier,
            idempotent=self.idempotent,
            permission=self.permission,
            timeout_seconds=self.timeout_seconds or tier_seconds(self.tier),
            heartbeat_timeout_seconds=heartbeat_timeout_seconds,
        )

    def validate(self, arguments: dict[str, Any]) -> BaseModel:
        """Validate and coerce the model's arguments.

        Raises:
            ToolArgumentsError: with one ``{field, expected, received}`` entry per problem.
        """
        try:
            return self.arguments_model.model_validate(arguments)
        except ValidationError as err:
            problems = []
            for e in err.errors():
                loc = ".".join(str(p) for p in e["loc"]) or "(arguments)"
                received = "nothing (missing)" if e["type"] == "missing" else repr(e.get("input"))[:200]
                problems.append({"field": loc, "expected": e["msg"], "received": received})
            raise ToolArgumentsError(self.name, problems) from None

    async def call(self, arguments: BaseModel, context: ToolContext) -> Any:
        """Run the tool; sync functions run in a thread so heartbeats continue."""
        import asyncio

        kwargs = {name: getattr(arguments, name) for name in type(arguments).model_fields}
        if self.context_parameter:
            kwargs[self.context_parameter] = context
        if inspect.iscoroutinefunction(self.fn):
            return await self.fn(**kwargs)
        return await asyncio.to_thread(self.fn, **kwargs)


def _parse_docstring(doc: str) -> tuple[str, dict[str, str]]:
    """Split a Google-style docstring into its description and ``Args:`` entries."""
    doc = inspect.cleandoc(doc or "")
    lines = doc.splitlines()
    summary: list[str] = []
    args: dict[str, str] = {}
    section: str | None = None
    current: str | None = None
    for line in lines:
        stripped = line.strip()
        header = re.match(r"^(Args|Arguments|Parameters|Returns|Raises|Yields|Examples?|Notes?):\s*$", stripped)
        if header and not line.startswith((" ", "\t")):
            section = header.group(1)
            current = None
            continue
        if section in ("Args", "Arguments", "Parameters"):
            m = re.match(r"^\s{0,8}(\*{0,2}\w+)\s*(\([^)]*\))?\s*:\s*(.*)$", line)
            if m and (len(line) - len(line.lstrip())) <= 8 and not line.startswith(" " * 9):
                current = m.group(1).lstrip("*")
                args[current] = m.group(3).strip()
            elif current and stripped:
                args[current] = f"{args[current]} {stripped}".strip()
        elif section is None:
            summary.append(line)
    return "\n".join(summary).strip(), args


class ToolRegistry:
    """A set of tools with unique names."""

    def __init__(self) -> None:
        self._tools: dict[str, Tool] = {}

    def __contains__(self, name: str) -> bool:
        return name in self._tools

    def __iter__(self):
        return iter(self._tools.values())

    def __len__(self) -> int:
        return len(self._tools)

    def get(self, name: str) -> Tool | None:
        return self._tools.get(name)

    def names(self) -> list[str]:
        return sorted(self._tools)

    def register(
        self,
        fn: Callable[..., Any],
        *,
        name: str | None = None,
        description: str | None = None,
        tier: Tier = "query",
        idempotent: bool = True,
        permission: Permission = "read",
        timeout_seconds: float | None = None,
    ) -> Tool:
        """Register ``fn`` as a tool.

        Args:
            fn: sync or async function; its parameters become the tool's arguments.
            name: tool name for the model (default: the function's name).
            description: what it does, when to use it and when not (default: docstring).
            tier: timeout class, ``query`` 15 s, ``external`` 30 s, ``batch`` 60 s.
            idempotent: whether running it twice is harmless; only then is it retried.
            permission: ``read`` runs, ``write`` and ``admin`` wait for a human's approval.
            timeout_seconds: overrides the tier's timeout for this tool.

        Raises:
            ToolRegistrationError: a duplicate or invalid name, or an unusable signature.
        """
        tool_name = fn.__name__ if name is None else name
        if not _NAME_RE.match(tool_name):
            raise ToolRegistrationError(
                f"tool name {tool_name!r} must be 1-64 characters of letters, digits, '_' or '-'"
            )
        if tool_name in self._tools:
            raise ToolRegistrationError(f"a tool named {tool_name!r} is already registered")
        if tier not in typing.get_args(Tier):
            raise ToolRegistrationError(f"tool {tool_name!r}: tier must be one of {typing.get_args(Tier)}, got {tier!r}")
        if permission not in typing.get_args(Permission):
            raise ToolRegistrationError(
                f"tool {tool_name!r}: permission must be one of {typing.get_args(Permission)}, got {permission!r}"
            )
        summary, arg_docs = _parse_docstring(fn.__doc__ or "")
        try:
            hints = get_type_hints(fn)
        except Exception as err:  # noqa: BLE001 - report any annotation problem the same way
            raise ToolRegistrationError(f"tool {tool_name!r}: cannot read type hints: {err}") from err
        fields: dict[str, Any] = {}
        context_parameter = None
        for param in inspect.signature(fn).parameters.values():
            annotation = hints.get(param.name, Any)
            if annotation is ToolContext:
                context_parameter = param.name
                continue
            if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
                raise ToolRegistrationError(f"tool {tool_name!r}: *args/**kwargs cannot be described to a model")
            default = ... if param.default is param.empty else param.default
            fields[param.name] = (annotation, Field(default, description=arg_docs.get(param.name)))
        model = create_model(  # type: ignore[call-overload]
            f"{tool_name}_arguments",
            __config__=ConfigDict(extra="forbid"),
            **fields,
        )
        schema = model.model_json_schema()
        schema.pop("title", None)
        for prop in schema.get("properties", {}).values():
            prop.pop("title", None)
        text = description or summary
        if not text:
            raise ToolRegistrationError(f"tool {tool_name!r} needs a description (a docstring or description=...)")
        registered = Tool(
            name=tool_name,
            fn=fn,
            description=text,
            arguments_model=model,
            tier=tier,
            idempotent=idempotent,
            permission=permission,
            timeout_seconds=timeout_seconds,
            context_parameter=context_parameter,
            parameters_schema=schema,
        )
        self._tools[tool_name] = registered
        return registered

    def tool(self, fn: Callable[..., Any] | None = None, **options: Any) -> Any:
        """Decorator form of :meth:`register`; usable bare or with options."""

        def decorate(f: Callable[..., Any]) -> Callable[..., Any]:
            self.register(f, **options)
            return f

        return decorate(fn) if fn is not None else decorate


default_registry = ToolRegistry()
"""The registry the worker serves unless given another one."""


def tool(fn: Callable[..., Any] | None = None, **options: Any) -> Any:
    """Register a function in :data:`default_registry`. See :meth:`ToolRegistry.register`."""
    return default_registry.tool(fn, **options)
