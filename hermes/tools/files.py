"""Tool files: tools described in JSON Schema and implemented elsewhere (an HTTP endpoint).

A tool file is JSON (``.json``) or YAML (``.yaml``, ``.yml``); it is read on the worker at
start-up (``HERMES_TOOL_FILES``, or :func:`register_tool_file`) and every mistake
in it is refused there, with the file, the key and what was expected. The format::

    groups:                                  # optional
      - {name: weather, description: "Weather now and soon.", keywords: [weather, 天气]}
    tools:
      - name: get_weather                    # letters, digits, '_' or '-'; unique
        description: "Current weather in a city."
        use_when: "The user asks about the weather now."      # optional
        avoid_when: "Past weather or climate averages."       # optional
        parameters:                          # JSON Schema (draft 2020-12) of the arguments
          type: object
          properties:
            city: {type: string, description: "City name", examples: [Paris]}
            units: {type: string, enum: [metric, imperial], default: metric}
          required: [city]
        returns: {type: object, description: "Temperature and conditions."}  # optional
        tier: external                       # query | external | batch (default external)
        idempotency: idempotent              # idempotent | keyed | none
                                             # (default: idempotent for GET/HEAD, else none)
        permission: read                     # read | write | admin (default read)
        group: weather
        next_possible_tools: [get_forecast]
        fallback: get_weather_backup         # same arguments, run if this one fails
        timeout_seconds: 10                  # overrides the tier's timeout
        http:
          method: GET                        # GET POST PUT PATCH DELETE HEAD
          url: "${WEATHER_URL}/weather/{city}"
          query: {units: "{units}"}          # optional; see below
          body: {...}                        # optional template; POST/PUT/PATCH/DELETE only
          headers: {Authorization: "Bearer ${WEATHER_TOKEN}"}
          response:                          # optional
            data: current                    # dotted path into the JSON answer (default: all of it)
            message: status.text             # dotted path of the result message
          keyed_header: Idempotency-Key      # sends the call's idempotency key (implies keyed)

      - name: weather_brief                  # instead of `http`: a fixed sequence of tools
        description: "..."
        parameters: {...}
        composite:
          steps:
            - {name: now, tool: get_weather, arguments: {city: "$args.city"}}
            - {tool: get_forecast, arguments: {city: "$args.city", days: 2}}

Templates (``url``, ``query``, ``body``, ``headers``): ``{param}`` is the argument of
that name (URL-encoded in the url; a string that is exactly ``"{param}"`` keeps its JSON
type); an entry naming an argument the call did not give is left out. Without
``query``, a GET, DELETE or HEAD sends the arguments not used in the url as the query
string; without ``body``, a POST, PUT or PATCH sends them as a JSON object. ``${ENV}``
is the worker's environment variable, resolved once at load; an unset one is refused
naming the variable; ``$${`` is a literal ``${``, ``{{`` and ``}}`` literal braces. Resolved values are secrets: see
:mod:`hermes.tools.http`. A ``parameters`` schema of type object without
``additionalProperties`` gets ``false``: arguments it does not name are refused.
"""

from __future__ import annotations

import difflib
import os
import re
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from hermes.security import redaction
from hermes.infra.config_files import read_document
from hermes.errors import ConfigError, ToolRegistrationError
from hermes.models import CompositeStep, Idempotency, Permission, Tier, ToolGroup
from hermes.tools import arguments as args_layer
from hermes.tools.http import (
    BODY_METHODS,
    HttpEndpoint,
    TEMPLATE_TOKEN_RE,
    HttpTool,
    Template,
    TemplateError,
    compile_template,
    template_arguments,
)
from hermes.tools.registry import TOOL_NAME_RE, CompositeTool, Tool, ToolRegistry

__all__ = ["load_tool_file", "register_tool_file"]

_HEADER_NAME_RE = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+\Z")
_PATH_RE = re.compile(r"^[^.]+(\.[^.]+)*\Z")
_ARGS_REF_RE = re.compile(r"^\$args\.([^.]+)")


# ---------------------------------------------------------------- the file's shape


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class GroupDecl(_Strict):
    """A tool group: offered when a turn is about its subject."""

    name: str
    description: str = ""
    keywords: list[str] = Field(default_factory=list)


class ResponseDecl(_Strict):
    """Which parts of a JSON answer become the result."""

    data: str | None = None
    message: str | None = None

    @field_validator("data", "message")
    @classmethod
    def _dotted(cls, value: str | None) -> str | None:
        if value is not None and not _PATH_RE.match(value):
            raise ValueError(f"expected a dotted path such as 'current' or 'items.0.name'; found {value!r}")
        return value


class HttpDecl(_Strict):
    """The endpoint that implements a tool."""

    method: Literal["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD"] = "GET"
    url: str
    query: dict[str, Any] | None = None
    body: Any = None
    headers: dict[str, str] = Field(default_factory=dict)
    response: ResponseDecl = Field(default_factory=ResponseDecl)
    keyed_header: str | None = None

    @field_validator("method", mode="before")
    @classmethod
    def _upper(cls, value: Any) -> Any:
        return value.upper() if isinstance(value, str) else value


class StepDecl(_Strict):
    """One step of a composite tool."""

    name: str | None = None
    tool: str
    arguments: dict[str, Any] = Field(default_factory=dict)


class CompositeDecl(_Strict):
    steps: list[StepDecl]


class ToolDecl(_Strict):
    """One tool of the file."""

    name: str
    description: str
    use_when: str | None = None
    avoid_when: str | None = None
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object", "properties": {}})
    returns: dict[str, Any] | None = None
    tier: Tier | None = None
    idempotency: Idempotency | None = None
    permission: Permission | None = None
    group: str | None = None
    next_possible_tools: list[str] = Field(default_factory=list)
    fallback: str | None = None
    timeout_seconds: float | None = Field(default=None, gt=0)
    http: HttpDecl | None = None
    composite: CompositeDecl | None = None


class ToolFileDecl(_Strict):
    groups: list[GroupDecl] = Field(default_factory=list)
    tools: list[ToolDecl]


# ---------------------------------------------------------------- loading


def load_tool_file(path: str | Path, *, environ: Mapping[str, str] | None = None) -> tuple[list[Tool], list[ToolGroup]]:
    """Read a tool file and build its tools and groups (not registered yet).

    Args:
        path: a ``.json``, ``.yaml`` or ``.yml`` file in the format of this module.
        environ: where ``${ENV}`` is resolved from; default: this process' environment.

    Returns:
        The tools (:class:`~hermes.tools.http.HttpTool` or
        :class:`~hermes.tools.registry.CompositeTool`) and declared groups, in file order.

    Raises:
        ConfigError: anything wrong with the file (``source`` is the file, ``key`` the
            dotted key such as ``tools[2].http.method``, the message says what was
            expected and what was found): missing or unreadable, not valid JSON/YAML
            (with the line), an unknown or misspelt key, a wrong type or value, an
            unusable JSON Schema, a duplicate name, a url placeholder that is not a
            parameter, an unset environment variable.
    """
    source = str(path)
    raw = _read(Path(path), source)
    try:
        decl = ToolFileDecl.model_validate(raw)
    except ValidationError as err:
        raise _from_validation(err, source) from None
    environ = os.environ if environ is None else environ
    _check_environment(raw, source, environ)
    groups = _groups(decl, source)
    tools: list[Tool] = []
    seen: dict[str, int] = {}
    for i, tool_decl in enumerate(decl.tools):
        key = f"tools[{i}]"
        name = tool_decl.name
        if not TOOL_NAME_RE.match(name):
            raise ConfigError(
                f"expected 1-64 letters, digits, '_' or '-' (a function name models accept); found {name!r}",
                source=source,
                key=f"{key}.name",
            )
        if name in seen:
            raise ConfigError(
                f"tool name {name!r} is already used by tools[{seen[name]}] of this file; expected unique names",
                source=source,
                key=f"{key}.name",
            )
        seen[name] = i
        tools.append(_build_tool(tool_decl, key, source, environ))
    return tools, groups


def register_tool_file(registry: ToolRegistry, path: str | Path) -> list[Tool]:
    """Register every tool and group of a tool file in ``registry``.

    This module depends on the registry, never the other way round: the registry knows
    nothing of files (issue 14: registry, files and http had imported each other).

    Args:
        registry: where the tools and groups go.
        path: a ``.json``, ``.yaml`` or ``.yml`` file in the format of this module.

    Returns:
        The registered tools, in file order.

    Raises:
        ConfigError: the file is unreadable or wrong (file, key, what was expected).
        ToolRegistrationError: a tool of the file clashes with one already registered
            (the message names the file).
    """
    tools, groups = load_tool_file(path)
    try:
        for group in groups:
            registry.add_group(group.name, description=group.description, keywords=group.keywords)
        return [registry.add(t) for t in tools]
    except ToolRegistrationError as err:
        # Name the file: the clash may be with a tool defined far from it.
        raise ToolRegistrationError(f"{path}: {err}") from None


def _check_environment(raw: Any, source: str, environ: Mapping[str, str]) -> None:
    """Refuse the file naming every unset ``${ENV}`` of its ``http`` sections at once
    (not one per start-up attempt)."""
    missing: dict[str, str] = {}

    def walk(value: Any, key: str, in_http: bool) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                walk(v, f"{key}.{k}" if key else str(k), in_http or k == "http")
        elif isinstance(value, list):
            for i, v in enumerate(value):
                walk(v, f"{key}[{i}]", in_http)
        elif in_http and isinstance(value, str):
            for match in TEMPLATE_TOKEN_RE.finditer(value):  # group 1: the name in ${NAME}
                name = match.group(1)
                if name and name not in environ:
                    missing.setdefault(name, key)

    walk(raw, "", False)
    if missing:
        names = ", ".join(missing)
        first_key = next(iter(missing.values()))
        raise ConfigError(
            f"environment variable(s) {names} not set on this worker; expected each to be set for "
            f"its ${{...}} reference (write $${{ for a literal ${{)",
            source=source,
            key=first_key,
        )


def _read(path: Path, source: str) -> Any:
    data = read_document(path, source, what="tool file", expected="a `tools` list")
    if not isinstance(data, dict):
        raise ConfigError(
            f"expected a mapping with a `tools` list (and optional `groups`); found {_kind(data)}", source=source
        )
    return data




def _groups(decl: ToolFileDecl, source: str) -> list[ToolGroup]:
    groups: list[ToolGroup] = []
    seen: dict[str, int] = {}
    for i, group in enumerate(decl.groups):
        if group.name in seen:
            raise ConfigError(
                f"group {group.name!r} is already declared by groups[{seen[group.name]}]; expected unique names",
                source=source,
                key=f"groups[{i}].name",
            )
        seen[group.name] = i
        groups.append(ToolGroup(name=group.name, description=group.description, keywords=list(group.keywords)))
    return groups


def _build_tool(decl: ToolDecl, key: str, source: str, environ: Mapping[str, str]) -> Tool:
    def refuse(message: str, sub: str = "") -> ConfigError:
        return ConfigError(message, source=source, key=f"{key}.{sub}" if sub else key)

    if not decl.description.strip():
        raise refuse("expected a description: what the tool does (and when to use it); found an empty one", "description")
    if (decl.http is None) == (decl.composite is None):
        found = "both" if decl.http is not None else "neither"
        raise refuse(f"expected exactly one of `http` (an endpoint) or `composite` (steps); found {found}")
    parameters = dict(decl.parameters)
    if parameters.get("type") == "object" and "additionalProperties" not in parameters:
        parameters["additionalProperties"] = False
    try:
        args_layer.check_schema(parameters)
    except ToolRegistrationError as err:
        raise refuse(f"expected a JSON Schema (draft 2020-12) of the arguments object: {err}", "parameters") from None
    if decl.returns is not None:
        try:
            Draft202012Validator.check_schema(decl.returns)
        except SchemaError as err:
            where = "".join(f"[{p!r}]" for p in err.path)
            raise refuse(f"expected a JSON Schema (draft 2020-12) of the result data: {where} {err.message}", "returns") from None
    description = decl.description.strip()
    if decl.use_when:
        description += f"\nUse when: {decl.use_when.strip()}"
    if decl.avoid_when:
        description += f"\nDo not use when: {decl.avoid_when.strip()}"
    common: dict[str, Any] = {
        "name": decl.name,
        "description": description,
        "parameters_schema": parameters,
        "timeout_seconds": decl.timeout_seconds,
        "group": decl.group,
        "next_possible_tools": list(decl.next_possible_tools),
        "fallback": decl.fallback,
        "returns": decl.returns,
        "source": source,
    }
    if decl.composite is not None:
        return _composite(decl, common, parameters, refuse)
    assert decl.http is not None
    endpoint = _endpoint(decl.http, parameters, refuse, environ)
    idempotency = decl.idempotency
    if endpoint.keyed_header:
        if idempotency not in (None, "keyed"):
            raise refuse(
                f"keyed_header is sent only for idempotency: keyed; expected keyed (or no idempotency, "
                f"which then means keyed); found idempotency {idempotency!r}",
                "http.keyed_header",
            )
        idempotency = "keyed"
    elif idempotency == "keyed":
        raise refuse(
            "idempotency keyed needs http.keyed_header, the request header that carries the call's "
            "idempotency key (e.g. Idempotency-Key); expected it to be set",
            "idempotency",
        )
    if idempotency is None:
        idempotency = "idempotent" if endpoint.method in ("GET", "HEAD") else "none"
    redaction.register(endpoint.secrets)  # httpx logs every URL it requests
    return HttpTool(
        **common,
        tier=decl.tier or "external",
        idempotency=idempotency,
        permission=decl.permission or "read",
        endpoint=endpoint,
    )


def _endpoint(http: HttpDecl, parameters: dict[str, Any], refuse: Any, environ: Mapping[str, str]) -> HttpEndpoint:
    properties = parameters.get("properties") if isinstance(parameters.get("properties"), dict) else {}
    names = set(properties)
    required = set(parameters.get("required") or [])

    def compile_at(value: Any, sub: str) -> Any:
        try:
            return compile_template(value, environ)
        except TemplateError as err:
            raise refuse(str(err), _join(sub, err.path)) from None

    def placeholders_known(compiled: Any, sub: str) -> None:
        unknown = sorted(template_arguments(compiled) - names)
        if unknown:
            listed = ", ".join(sorted(names)) or "none declared"
            raise refuse(
                f"placeholder {{{unknown[0]}}} is not a parameter; expected one of the parameters ({listed})", sub
            )

    url: Template = compile_at(http.url, "http.url")
    placeholders_known(url, "http.url")
    for name in sorted(url.arguments):
        if name not in required and "default" not in properties[name]:
            raise refuse(
                f"url placeholder {{{name}}} must always have a value; expected {name!r} to be required "
                "or to have a default",
                "http.url",
            )
    _check_url(url, refuse)
    query = None
    if http.query is not None:
        query = compile_at(http.query, "http.query")
        placeholders_known(query, "http.query")
    body_given = "body" in http.model_fields_set
    body = None
    if body_given:
        if http.method not in BODY_METHODS and http.method != "DELETE":
            raise refuse(f"a {http.method} request has no body; expected `query` instead, or method POST/PUT/PATCH", "http.body")
        body = compile_at(http.body, "http.body")
        placeholders_known(body, "http.body")
    headers: dict[str, Template] = {}
    for header, value in http.headers.items():
        if not _HEADER_NAME_RE.match(header):
            raise refuse(f"expected a header name (letters, digits, '-'); found {header!r}", f"http.headers.{header}")
        headers[header] = compile_at(value, f"http.headers.{header}")
        placeholders_known(headers[header], f"http.headers.{header}")
    keyed_header = http.keyed_header
    if keyed_header is not None and not _HEADER_NAME_RE.match(keyed_header):
        raise refuse(f"expected a header name such as Idempotency-Key; found {keyed_header!r}", "http.keyed_header")
    endpoint = HttpEndpoint(
        method=http.method,
        url=url,
        query=query,
        body=body,
        body_given=body_given,
        headers=headers,
        response_data=http.response.data,
        response_message=http.response.message,
        keyed_header=keyed_header,
    )
    unused = sorted(names - endpoint.used_arguments(names))
    if unused:
        where = "body" if body_given and http.method in BODY_METHODS else "query"
        raise refuse(
            f"parameter {unused[0]!r} is never sent; expected it in the url, query, body or headers "
            "(or remove it from parameters)",
            f"http.{where}",
        )
    return endpoint


def _check_url(url: Template, refuse: Any) -> None:
    """The url, with any value for its placeholders, is absolute http(s) with a host."""
    sample = url.render({name: "x" for name in url.arguments}, encode=lambda s: s)
    match = re.match(r"^(https?)://([^/?#]+)", sample)
    if not match or not re.sub(r"^[^@]*@", "", match.group(2)).strip(":"):
        raise refuse(
            f"expected an absolute http:// or https:// url with a host; found {url.source!r}"
            + (" (after ${...} was resolved)" if url.secrets else ""),
            "http.url",
        )


def _composite(decl: ToolDecl, common: dict[str, Any], parameters: dict[str, Any], refuse: Any) -> CompositeTool:
    assert decl.composite is not None
    if decl.idempotency is not None:
        raise refuse(
            "a composite tool's idempotency comes from its steps; expected no `idempotency` key", "idempotency"
        )
    if not decl.composite.steps:
        raise refuse("expected at least one step", "composite.steps")
    names = set(parameters.get("properties") or {})
    steps: list[CompositeStep] = []
    seen: dict[str, int] = {}
    for j, step in enumerate(decl.composite.steps):
        step_name = step.name or step.tool
        sub = f"composite.steps[{j}]"
        if step_name in seen:
            raise refuse(
                f"step name {step_name!r} is already used by steps[{seen[step_name]}]; expected unique step "
                "names (set `name` when a tool runs twice)",
                f"{sub}.name" if step.name else f"{sub}.tool",
            )
        seen[step_name] = j
        for arg, value in step.arguments.items():
            if isinstance(value, str):
                ref = _ARGS_REF_RE.match(value)
                if ref and ref.group(1) not in names:
                    raise refuse(
                        f"{value!r} names no parameter of this tool; expected $args.<one of: "
                        f"{', '.join(sorted(names)) or 'none declared'}>",
                        f"{sub}.arguments.{arg}",
                    )
        steps.append(CompositeStep(name=step_name, tool=step.tool, arguments=dict(step.arguments)))
    tool = CompositeTool(
        **common,
        tier=decl.tier or "batch",
        idempotency="idempotent",
        permission=decl.permission or "read",
        declared_permission=decl.permission,
        steps=steps,
    )
    return tool


# ---------------------------------------------------------------- error messages


def _from_validation(err: ValidationError, source: str) -> ConfigError:
    """The first problem pydantic found, in the file's terms (an unknown key first:
    a misspelt key also makes the intended one "missing")."""
    problems = sorted(err.errors(), key=lambda e: e["type"] != "extra_forbidden")
    first = problems[0]
    loc = list(first["loc"])
    message = _describe(first, loc)
    if len(problems) > 1:
        message += f" ({len(problems) - 1} more problem{'s' if len(problems) > 2 else ''} in this file)"
    return ConfigError(message, source=source, key=_join("", loc) or None)


def _describe(error: Any, loc: list[Any]) -> str:
    kind = error["type"]
    if kind == "extra_forbidden":
        allowed = _allowed_keys(loc[:-1])
        guess = difflib.get_close_matches(str(loc[-1]), allowed, n=1)
        hint = f" (did you mean {guess[0]!r}?)" if guess else ""
        return f"unknown key {loc[-1]!r}{hint}; expected one of: {', '.join(allowed)}"
    if kind == "missing":
        return f"required key {loc[-1]!r} is missing; expected it to be set"
    message = str(error["msg"])
    if message.startswith("Value error, "):
        message = message[len("Value error, ") :]
    if message.startswith("Input should be "):
        message = "expected " + message[len("Input should be ") :]
    if "found" not in message:
        message += f"; found {_short(error.get('input'))}"
    return message


def _allowed_keys(loc: list[Any]) -> list[str]:
    """The keys the model at ``loc`` (a pydantic location, list indexes included) takes."""
    model: Any = ToolFileDecl
    for part in loc:
        if isinstance(part, int):
            continue
        field = model.model_fields.get(part)
        if field is None:
            return []
        model = _model_in(field.annotation)
        if model is None:
            return []
    return list(model.model_fields)


def _model_in(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = _model_in(arg)
        if found is not None:
            return found
    return None


def _join(prefix: str, parts: list[Any]) -> str:
    key = prefix
    for part in parts:
        if isinstance(part, int):
            key += f"[{part}]"
        else:
            key += f".{part}" if key else str(part)
    return key


def _kind(value: Any) -> str:
    if value is None:
        return "an empty file"
    if isinstance(value, list):
        return "a list"
    return f"{type(value).__name__} {_short(value)}"


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."

