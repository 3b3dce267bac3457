"""Tool registration: one registry for tools written in Python and tools described in files.

A decorated function becomes a :class:`FunctionTool`: its signature and Google-style
docstring become the JSON Schema the model sees (per-parameter descriptions, and
examples from ``Annotated[int, Field(examples=[3])]``); a JSON Schema file describes
tools implemented elsewhere (an HTTP endpoint; :func:`hermes.tools.files.register_tool_file`
loads such a file into a registry, which knows nothing of files); a fixed
sequence of registered tools becomes one :class:`CompositeTool`. All declare their tier
(timeout class), idempotency, permission, group and ``next_possible_tools``.

Arguments go through three layers before a tool runs (seed 004 §4.2): structure and
format (:mod:`hermes.tools.arguments`: coercion of what models send, then JSON Schema /
pydantic validation), then business rules and permission (the tool's ``checks``).

Example::

    @tool(tier="query", permission="read", group="time")
    def current_time(timezone: str = "UTC") -> dict:
        \"\"\"Current date and time in a time zone.

        Args:
            timezone: IANA time zone name, e.g. "Asia/Shanghai".
        \"\"\"
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import re
import types
import typing
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar, get_type_hints

from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model

from hermes.errors import ToolArgumentsError, ToolFailure, ToolRegistrationError
from hermes.models import CompositeStep, Idempotency, Permission, Tier, ToolGroup, ToolSpec
from hermes.tools import arguments as args_layer

TOOL_NAME_RE = re.compile(r"^[a-zA-Z0-9_-]{1,64}\Z")
"""Function names accepted by chat-completions providers."""

PERMISSION_RANK: dict[str, int] = {"read": 0, "write": 1, "admin": 2}


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
    """The worker's ``redis.asyncio.Redis`` client: a fast path, never the only copy of
    anything that must survive (that goes to ``durable``)."""
    call_key: str = ""
    durable: Any = None
    """The worker's :class:`hermes.infra.durable.DurableStore` (LanceDB), for what tools keep."""

    @property
    def idempotency_key(self) -> str:
        """Stable across every attempt of this call and unique to it for the life of the
        session id: ``session_id:chain:turn:tool_call_id`` (models reuse their tool-call
        ids, and a session id may be reused after a termination, so the bare
        ``session_id:tool_call_id`` could alias). Pass it to backends that de-duplicate."""
        return self.call_key or f"{self.session_id}:{self.turn}:{self.tool_call_id}"


Check = Callable[[Any, ToolContext], Any]
"""A business-rule or permission check: ``check(arguments, context)``, sync or async.
Raise ``ValueError`` (result code 1), ``PermissionError`` / ``ToolPermissionError``
(code 3) or :class:`ToolFailure` (its code) to stop the call before it runs."""


@dataclass(kw_only=True)
class Tool:
    """A registered tool: metadata, validation, and (in subclasses) the code that runs it."""

    name: str
    description: str
    parameters_schema: dict[str, Any]
    tier: Tier = "query"
    idempotency: Idempotency = "idempotent"
    permission: Permission = "read"
    timeout_seconds: float | None = None
    """Overrides the tier's timeout, in seconds."""
    group: str | None = None
    next_possible_tools: list[str] = field(default_factory=list)
    fallback: str | None = None
    returns: dict[str, Any] | None = None
    checks: list[Check] = field(default_factory=list)
    source: str = ""
    """Where it was defined (``module.function`` or a file path), for error messages."""

    @property
    def idempotent(self) -> bool:
        """Safe to retry (idempotent or keyed)."""
        return self.idempotency != "none"

    def model_description(self) -> str:
        """The description the model reads: what, when, and the return shape."""
        text = self.description.strip()
        if self.returns and self.returns.get("description") and "Returns" not in text:
            text += f"\nReturns: {self.returns['description']}"
        if self.next_possible_tools:
            text += f"\nUsually followed by: {', '.join(self.next_possible_tools)}."
        return text

    def spec(self, *, tier_seconds: Callable[[str], float], heartbeat_timeout_seconds: float) -> ToolSpec:
        return ToolSpec(
            name=self.name,
            description=self.model_description(),
            parameters=self.parameters_schema,
            tier=self.tier,
            idempotency=self.idempotency,
            permission=self.permission,
            timeout_seconds=self.timeout_seconds or tier_seconds(self.tier),
            heartbeat_timeout_seconds=heartbeat_timeout_seconds,
            group=self.group,
            next_possible_tools=list(self.next_possible_tools),
            fallback=self.fallback,
            returns=self.returns,
            composite=self.composite_steps(),
            mcp=getattr(self, "origin", None),
        )

    def composite_steps(self) -> list[CompositeStep] | None:
        return None

    def validate(self, arguments: Any) -> Any:
        """Structure and format: coerce what the model sent and validate it.

        Returns:
            The validated arguments (a dict, or a pydantic model for Python tools).

        Raises:
            ToolArgumentsError: with one ``{field, expected, received, missing}`` per problem.
        """
        return args_layer.validate_arguments(self.name, self.parameters_schema, arguments)

    async def run_checks(self, arguments: Any, context: ToolContext) -> None:
        """Business rules and permission (third layer); see :data:`Check`."""
        for check in self.checks:
            outcome = check(arguments, context)
            if inspect.isawaitable(outcome):
                await outcome

    async def invoke(self, arguments: Any, context: ToolContext) -> Any:
        """Run the tool with validated arguments."""
        raise ToolFailure(f"tool {self.name!r} has no implementation on this worker")

    def dump_arguments(self, arguments: Any) -> dict[str, Any]:
        """Validated arguments as JSON-ready data (what an approval shows)."""
        if isinstance(arguments, BaseModel):
            return arguments.model_dump(mode="json")
        return dict(arguments)


@dataclass(kw_only=True)
class FunctionTool(Tool):
    """A tool implemented by a Python function (sync functions run in a thread)."""

    fn: Callable[..., Any]
    arguments_model: type[BaseModel]
    context_parameter: str | None = None

    def validate(self, arguments: Any) -> BaseModel:
        arguments = args_layer.normalize_arguments(self.name, arguments)
        plain = self._plain_fields
        if plain and arguments.keys() <= plain and all(type(v) in _SCALARS for v in arguments.values()):
            # Scalars that already fit plain fields (strict: no conversion) are what
            # :func:`coerce` would return unchanged, without its walk of the schema
            # (issue 31: the walk was a tenth of a tool call's event-loop CPU).
            with contextlib.suppress(ValidationError):
                return self.arguments_model.model_validate(arguments, strict=True)
        coerced = args_layer.coerce(self.parameters_schema, arguments)
        try:
            return self.arguments_model.model_validate(coerced)
        except ValidationError as err:
            raise ToolArgumentsError(self.name, args_layer.problems_from_pydantic(err)) from None

    @functools.cached_property
    def _plain_fields(self) -> frozenset[str]:
        """The parameters whose valid values :func:`~hermes.tools.arguments.coerce` never
        rewrites: typed ``str``, ``int``, ``float`` or ``bool`` (or one of them or None),
        and described by the schema as that type and nothing else a repair reads (no
        ``format``, ``enum``, ``const``, union or a ``type`` of its own that
        ``json_schema_extra`` put there). Found by a break-it review: ``int | float``
        given ``3.0`` is repaired to ``3``, an extra ``enum`` to its member's case."""
        properties = self.parameters_schema.get("properties") or {}
        plain: set[str] = set()
        for name, field in self.arguments_model.model_fields.items():
            annotation, optional = field.annotation, False
            members = typing.get_args(annotation)
            if typing.get_origin(annotation) in (typing.Union, types.UnionType) and len(members) == 2 and type(None) in members:
                annotation, optional = next(m for m in members if m is not type(None)), True
            json_type = _JSON_TYPES.get(annotation)  # type: ignore[arg-type]
            schema = properties.get(name)
            if json_type is None or field.alias not in (None, name) or not isinstance(schema, dict):
                continue
            if optional:
                fits = schema.get("anyOf") == [{"type": json_type}, {"type": "null"}] and set(schema) <= _PLAIN_KEYWORDS | {"anyOf"}
            else:
                fits = schema.get("type") == json_type and set(schema) <= _PLAIN_KEYWORDS
            if fits:
                plain.add(name)
        return frozenset(plain)

    async def invoke(self, arguments: Any, context: ToolContext) -> Any:
        call = self.sync_call(arguments, context)
        if call is None:
            return await self.fn(**self._kwargs(arguments, context))
        return await run_in_tool_thread(call)

    def sync_call(self, arguments: Any, context: ToolContext) -> Callable[[], Any] | None:
        """The call of a synchronous function with these arguments (validated here unless
        already a model), to run in a thread (:func:`run_in_tool_thread`); None for a
        coroutine function.

        Raises:
            ToolArgumentsError: ``arguments`` are not valid.
        """
        if inspect.iscoroutinefunction(self.fn):
            return None
        return functools.partial(self.fn, **self._kwargs(arguments, context))

    def _kwargs(self, arguments: Any, context: ToolContext) -> dict[str, Any]:
        if not isinstance(arguments, BaseModel):
            arguments = self.validate(arguments)
        kwargs = {name: getattr(arguments, name) for name in type(arguments).model_fields}
        if self.context_parameter:
            kwargs[self.context_parameter] = context
        return kwargs


@dataclass(kw_only=True)
class CompositeTool(Tool):
    """A fixed sequence of registered tools exposed to the model as one tool.

    The workflow runs it as a child workflow, one durable activity per step (seed 000
    §2.3: fewer decisions for the model, no mistakes between steps)."""

    steps: list[CompositeStep]
    declared_permission: Permission | None = None
    """The permission its author declared, if any; :meth:`ToolRegistry.check_references`
    sets ``permission`` to it, or to the highest its steps need (a lower one is refused)."""

    def composite_steps(self) -> list[CompositeStep] | None:
        return self.steps


T = TypeVar("T")

_SYNC_TOOL_THREADS = 128
"""Threads for synchronous tools. Python cannot stop a thread, so a sync tool that hangs
past its timeout keeps one until it returns; the default executor (min(32, cores + 4)
threads, 6 here) would be exhausted by six of them. Threads start on demand."""


_SCALARS = (str, int, float, bool, type(None))
_JSON_TYPES = {str: "string", int: "integer", float: "number", bool: "boolean"}
_PLAIN_KEYWORDS = frozenset({
    "type", "description", "default", "title", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum",
    "multipleOf", "minLength", "maxLength", "pattern",
})
"""Schema keywords no repair of :func:`~hermes.tools.arguments.coerce` reads for a value
of the right type."""


@functools.lru_cache(maxsize=1)
def _sync_tool_pool() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max_workers=_SYNC_TOOL_THREADS, thread_name_prefix="hermes-tool")


async def run_in_tool_thread(call: Callable[[], T]) -> T:
    """Run ``call`` (a synchronous tool, with what must happen in its thread around it)
    on the threads of synchronous tools (:data:`_SYNC_TOOL_THREADS`)."""
    return await asyncio.get_running_loop().run_in_executor(_sync_tool_pool(), call)


def parse_docstring(doc: str) -> tuple[str, dict[str, str], str]:
    """Split a Google-style docstring into description, ``Args:`` entries and ``Returns:``."""
    doc = inspect.cleandoc(doc or "")
    summary: list[str] = []
    args: dict[str, str] = {}
    returns: list[str] = []
    section: str | None = None
    current: str | None = None
    for line in doc.splitlines():
        stripped = line.strip()
        header = re.match(r"^(Args|Arguments|Parameters|Returns|Raises|Yields|Examples?|Notes?):\s*(.*)$", stripped)
        if header and not line.startswith((" ", "\t")):
            section = header.group(1)
            current = None
            if section == "Returns" and header.group(2):
                returns.append(header.group(2))
            continue
        if section in ("Args", "Arguments", "Parameters"):
            m = re.match(r"^\s{0,8}(\*{0,2}\w+)\s*(\([^)]*\))?\s*:\s*(.*)$", line)
            if m and (len(line) - len(line.lstrip())) <= 8 and not line.startswith(" " * 9):
                current = m.group(1).lstrip("*")
                args[current] = m.group(3).strip()
            elif current and stripped:
                args[current] = f"{args[current]} {stripped}".strip()
        elif section == "Returns":
            if stripped:
                returns.append(stripped)
        elif section is None:
            summary.append(line)
    return "\n".join(summary).strip(), args, " ".join(returns)


def _strip_titles(schema: Any) -> None:
    if isinstance(schema, dict):
        schema.pop("title", None)
        for key, value in schema.items():
            if key in ("properties", "$defs"):
                for sub in value.values():
                    _strip_titles(sub)
            elif key != "default" and key != "examples" and key != "enum" and key != "const":
                _strip_titles(value)
    elif isinstance(schema, list):
        for item in schema:
            _strip_titles(item)


class ToolRegistry:
    """A set of tools with unique names, and the groups they belong to."""

    def __init__(self) -> None:
        self._tools: dict[str, Tool] = {}
        self._groups: dict[str, ToolGroup] = {}

    def __contains__(self, name: str) -> bool:
        return name in self._tools

    def __iter__(self) -> Iterator[Tool]:
        return iter(self._tools.values())

    def __len__(self) -> int:
        return len(self._tools)

    def get(self, name: str) -> Tool | None:
        return self._tools.get(name)

    def names(self) -> list[str]:
        return sorted(self._tools)

    @property
    def groups(self) -> list[ToolGroup]:
        """Declared groups, plus a bare entry for every group a tool names."""
        groups = dict(self._groups)
        for t in self._tools.values():
            if t.group and t.group not in groups:
                groups[t.group] = ToolGroup(name=t.group)
        return [groups[name] for name in sorted(groups)]

    def add_group(self, name: str, *, description: str = "", keywords: list[str] | None = None) -> ToolGroup:
        """Declare a group: its description and the words that route a message to it.

        Raises:
            ToolRegistrationError: a group of that name was declared already.
        """
        if name in self._groups:
            raise ToolRegistrationError(f"a tool group named {name!r} is already declared")
        group = ToolGroup(name=name, description=description, keywords=list(keywords or []))
        self._groups[name] = group
        return group

    def add(self, new: Tool) -> Tool:
        """Add a built tool (from a file, or a custom :class:`Tool` subclass).

        Raises:
            ToolRegistrationError: an invalid or duplicate name (never shadowed), an
                unknown tier, idempotency or permission, or an unusable schema.
        """
        name = new.name
        if not isinstance(name, str) or not TOOL_NAME_RE.match(name):
            raise ToolRegistrationError(
                f"tool name {name!r} must be 1-64 characters of letters, digits, '_' or '-'"
            )
        if name in self._tools:
            first = self._tools[name].source
            raise ToolRegistrationError(
                f"a tool named {name!r} is already registered{f' (from {first})' if first else ''}; "
                "two tools with the same name are refused, not shadowed"
            )
        for attr, kind in (("tier", Tier), ("permission", Permission), ("idempotency", Idempotency)):
            allowed = typing.get_args(kind)
            if getattr(new, attr) not in allowed:
                raise ToolRegistrationError(
                    f"tool {name!r}: {attr} must be one of {', '.join(allowed)}; got {getattr(new, attr)!r}"
                )
        if not new.description or not new.description.strip():
            raise ToolRegistrationError(f"tool {name!r} needs a description (what it does, when to use it)")
        if new.timeout_seconds is not None and not new.timeout_seconds > 0:
            raise ToolRegistrationError(f"tool {name!r}: timeout_seconds must be > 0; got {new.timeout_seconds!r}")
        try:
            args_layer.check_schema(new.parameters_schema)
        except ToolRegistrationError as err:
            raise ToolRegistrationError(f"tool {name!r}: parameters: {err}") from None
        self._tools[name] = new
        return new

    def register(
        self,
        fn: Callable[..., Any],
        *,
        name: str | None = None,
        description: str | None = None,
        tier: Tier = "query",
        idempotent: bool | None = None,
        idempotency: Idempotency | None = None,
        permission: Permission = "read",
        timeout_seconds: float | None = None,
        group: str | None = None,
        next_possible_tools: list[str] | None = None,
        fallback: str | None = None,
        checks: list[Check] | None = None,
    ) -> FunctionTool:
        """Register ``fn`` as a tool.

        Args:
            fn: sync or async function; its parameters become the tool's arguments (a
                parameter typed ``ToolContext`` receives the call's context instead).
            name: tool name for the model (default: the function's name).
            description: what it does, when to use it and when not (default: docstring).
            tier: timeout class, ``query`` 15 s, ``external`` 30 s, ``batch`` 60 s.
            idempotent: shorthand: ``True`` is ``idempotency="idempotent"``, ``False`` ``"none"``.
            idempotency: ``idempotent`` (retried), ``keyed`` (retried; pass
                ``context.idempotency_key`` to the backend) or ``none`` (at most once).
            permission: ``read`` runs, ``write`` needs the user's confirmation, ``admin``
                an approval by someone other than the requester (policy: ``SessionConfig``).
            timeout_seconds: overrides the tier's timeout for this tool.
            group: routing group; ungrouped tools are always offered.
            next_possible_tools: tools that usually follow this one.
            fallback: tool run with the same arguments if this one fails with code 2 (or
                4 when retry-safe); its permission may not be higher than this one's.
            checks: business-rule / permission checks run after validation.

        Raises:
            ToolRegistrationError: a duplicate or invalid name, or an unusable signature.
        """
        tool_name = fn.__name__ if name is None else name
        if idempotency is None:
            idempotency = "none" if idempotent is False else "idempotent"
        summary, arg_docs, returns_doc = parse_docstring(fn.__doc__ or "")
        try:
            hints = get_type_hints(fn, include_extras=True)
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
        try:
            model = create_model(  # type: ignore[call-overload]
                f"{tool_name}_arguments",
                __config__=ConfigDict(extra="forbid"),
                **fields,
            )
            schema = model.model_json_schema()
        except Exception as err:  # noqa: BLE001 - pydantic cannot describe this signature
            raise ToolRegistrationError(f"tool {tool_name!r}: its parameters cannot be described as JSON Schema: {err}") from err
        _strip_titles(schema)
        returns: dict[str, Any] | None = None
        ret = hints.get("return")
        from hermes.models import ToolResult

        if isinstance(ret, type) and issubclass(ret, BaseModel) and not issubclass(ret, ToolResult):
            # (A ToolResult is the envelope every result has; its data is what to describe.)
            returns = ret.model_json_schema()
            _strip_titles(returns)
            if returns_doc:
                returns["description"] = returns_doc
        elif returns_doc:
            returns = {"description": returns_doc}
        registered = FunctionTool(
            name=tool_name,
            fn=fn,
            description=description or summary,
            arguments_model=model,
            tier=tier,
            idempotency=idempotency,
            permission=permission,
            timeout_seconds=timeout_seconds,
            context_parameter=context_parameter,
            parameters_schema=schema,
            group=group,
            next_possible_tools=list(next_possible_tools or []),
            fallback=fallback,
            returns=returns,
            checks=list(checks or []),
            source=f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', tool_name)}",
        )
        self.add(registered)
        return registered

    def tool(self, fn: Callable[..., Any] | None = None, **options: Any) -> Any:
        """Decorator form of :meth:`register`; usable bare or with options."""

        def decorate(f: Callable[..., Any]) -> Callable[..., Any]:
            self.register(f, **options)
            return f

        return decorate(fn) if fn is not None else decorate

    def composite(
        self,
        name: str,
        *,
        description: str,
        parameters: dict[str, Any] | type[BaseModel],
        steps: list[CompositeStep | dict[str, Any]],
        permission: Permission | None = None,
        group: str | None = None,
        timeout_seconds: float | None = None,
        next_possible_tools: list[str] | None = None,
    ) -> CompositeTool:
        """Register a composite tool: ``steps`` run in order as one tool call.

        Args:
            name: tool name for the model.
            description: what the whole sequence does, when to use it and when not.
            parameters: JSON Schema of its arguments, or a pydantic model.
            steps: each a :class:`~hermes.models.CompositeStep` (or its dict); argument
                values ``"$args.x"`` and ``"$steps.<step>.data.<path>"`` are references.
            permission: default: the highest permission of its steps (lower is refused).
            timeout_seconds: listed only: each step runs with its own tool's timeout and
                retries, so the sequence is bounded by its steps.

        Raises:
            ToolRegistrationError: duplicate step names, or bad schema / names. Step
                tools must be registered by the time :meth:`check_references` runs.
        """
        if isinstance(parameters, type) and issubclass(parameters, BaseModel):
            parameters = parameters.model_json_schema()
            _strip_titles(parameters)
        parsed = [s if isinstance(s, CompositeStep) else CompositeStep.model_validate({"name": s.get("name") or s.get("tool"), **s}) for s in steps]
        if not parsed:
            raise ToolRegistrationError(f"composite tool {name!r} needs at least one step")
        seen: set[str] = set()
        for step in parsed:
            if step.name in seen:
                raise ToolRegistrationError(f"composite tool {name!r}: two steps are named {step.name!r}")
            seen.add(step.name)
        composite_tool = CompositeTool(
            name=name,
            description=description,
            parameters_schema=parameters,
            tier="batch",
            idempotency="idempotent",
            permission=permission or "read",
            declared_permission=permission,
            timeout_seconds=timeout_seconds,
            group=group,
            next_possible_tools=list(next_possible_tools or []),
            steps=parsed,
            source="composite",
        )
        return self.add(composite_tool)  # type: ignore[return-value]

    def check_references(self) -> None:
        """Check what tools say about each other, once all are registered (worker start-up).

        Fills in a composite's permission and idempotency from its steps.

        Raises:
            ToolRegistrationError: listing every fallback, ``next_possible_tools`` entry or
                composite step naming an unknown tool, a fallback needing more permission
                than its primary, or a composite inside a composite.
        """
        problems: list[str] = []
        for t in self._tools.values():
            for nxt in t.next_possible_tools:
                if nxt not in self._tools:
                    problems.append(f"tool {t.name!r}: next_possible_tools names unknown tool {nxt!r}")
            if t.fallback is not None:
                fb = self._tools.get(t.fallback)
                if fb is None:
                    problems.append(f"tool {t.name!r}: fallback names unknown tool {t.fallback!r}")
                elif fb.name == t.name:
                    problems.append(f"tool {t.name!r}: a tool cannot be its own fallback")
                elif t.idempotency == "none":
                    problems.append(
                        f"tool {t.name!r}: a tool that is not idempotent cannot have a fallback (after it "
                        "fails, whether it had an effect is unknown); make it keyed or idempotent"
                    )
                elif PERMISSION_RANK[fb.permission] > PERMISSION_RANK[t.permission]:
                    problems.append(
                        f"tool {t.name!r}: fallback {fb.name!r} needs permission {fb.permission!r}, "
                        f"more than {t.permission!r}; an approval of one call cannot cover it"
                    )
            if isinstance(t, CompositeTool):
                ranks = []
                for step in t.steps:
                    st = self._tools.get(step.tool)
                    if st is None:
                        problems.append(f"composite tool {t.name!r}: step {step.name!r} names unknown tool {step.tool!r}")
                        continue
                    if isinstance(st, CompositeTool):
                        problems.append(f"composite tool {t.name!r}: step {step.name!r} is itself composite")
                    ranks.append(st)
                if ranks:
                    highest = max(ranks, key=lambda s: PERMISSION_RANK[s.permission]).permission
                    declared = t.declared_permission
                    if declared is not None and PERMISSION_RANK[declared] < PERMISSION_RANK[highest]:
                        problems.append(
                            f"composite tool {t.name!r}: permission {declared!r} is lower than its steps need ({highest!r})"
                        )
                    t.permission = declared or highest
                    if any(s.idempotency == "none" for s in ranks):
                        t.idempotency = "none"
                    elif any(s.idempotency == "keyed" for s in ranks):
                        t.idempotency = "keyed"
        if problems:
            raise ToolRegistrationError("; ".join(problems))


default_registry = ToolRegistry()
"""The registry the worker serves unless given another one."""


def tool(fn: Callable[..., Any] | None = None, **options: Any) -> Any:
    """Register a function in :data:`default_registry`. See :meth:`ToolRegistry.register`."""
    return default_registry.tool(fn, **options)
