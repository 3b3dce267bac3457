"""MCP server configuration: the ``mcpServers`` JSON that editors use, plus Hermes' own keys.

A config file is JSON (``.json``) or YAML (``.yaml``, ``.yml``) in the shape Claude Desktop,
Cursor and VS Code share, so a block copied from a server's README works as it is::

    {
      "mcpServers": {
        "filesystem": {                                  # the server's name (non-empty)
          "command": "npx",                              # stdio: the program to start
          "args": ["-y", "@modelcontextprotocol/server-filesystem", "/srv/docs"],
          "env": {"LOG_LEVEL": "info"},                  # added to the worker's environment
          "cwd": "/srv"                                  # optional working directory
        },
        "tickets": {
          "url": "https://mcp.example.com/mcp",          # HTTP: an http:// or https:// url
          "headers": {"Authorization": "Bearer ${TICKETS_TOKEN}"},
          "transport": "streamable-http",                # or "sse" for older servers
          # Hermes' keys (any server):
          "timeout_seconds": 30,                         # per request, > 0 (default 30)
          "startup_timeout_seconds": 60,                 # start + initialize, > 0 (default 60)
          "allow": ["get_*", "search_*"],                # globs over the server's tool names
          "deny": ["*_admin"],                           # (fnmatch, case-sensitive; deny wins)
          "permission": "read",                          # read | write | admin (default: see below)
          "idempotency": "none",                         # idempotent | keyed | none (default: see below)
          "tools": {                                     # per tool, by the server's tool name
            "create_ticket": {"permission": "write", "idempotency": "keyed",
                              "description_suffix": "Creates a real ticket."}
          },
          "description_suffix": "Belongs to the ticket system; for CI logs use ci_* tools.",
          "list_ttl_seconds": 300,                       # tool-list refresh (0: every turn)
          "idle_seconds": 300,                           # close an unused connection after
          "enabled": true,
          "group": "tickets"                             # tool group for routing (default: the name)
        }
      }
    }

A server has ``command`` (started as a child process, spoken to over stdio) or ``url``
(streamable HTTP by default), never both. The editors' ``"type"`` key is accepted too:
``"stdio"``, ``"http"`` (= ``"streamable-http"``), ``"streamable-http"`` or ``"sse"``; so is
``"http"`` as a ``transport``. ``args``, ``env`` and ``cwd`` belong to stdio servers,
``headers`` to HTTP ones.

Idempotency: an MCP tool is not known to be safe to run twice, so by default it is run at
most once (``none``); ``idempotent`` lets the tool layer retry it; ``keyed`` means the
server de-duplicates by the call's idempotency key (see :data:`hermes.models.Idempotency`),
which the call layer passes along.

Tool annotations (MCP spec ``ToolAnnotations``, 2025-03-26 on) are hints a server sends
with each listed tool; :meth:`ServerConfig.policy` reads them under the operator's keys:

- permission: a tool's own ``tools.<tool>.permission`` wins outright, either way. Else
  ``destructiveHint: true`` (or ``readOnlyHint: false`` with no ``destructiveHint``, which
  the spec defaults to destructive) makes it ``write``: the session's user confirms each
  call, as the spec asks of a client ("a human in the loop"), without needing a second
  person as ``admin`` would. The server's ``permission`` is a floor a hint may raise but
  never lower (a server-wide key cannot have been a decision about a tool the server adds
  later); ``readOnlyHint: true`` gives ``read`` where nothing else is set. A tool with no
  annotations keeps the old default, ``read``: most servers send none, and gating every
  one of their tools would stop sessions that work today for no new reason. An operator
  who wants every tool of a server confirmed writes ``"permission": "write"``.
- idempotency: ``tools.<tool>.idempotency``, else the server's ``idempotency``, else
  ``idempotentHint: true`` gives ``idempotent`` (retried); else ``none``.

A hint can thus only add a gate the operator did not write, never remove one; a server
that lies by omission is met by the operator's keys (annotations are untrusted: spec,
"Clients should never make tool use decisions based on ToolAnnotations received from
untrusted servers"). ``openWorldHint`` changes nothing. ``description_suffix`` is the "service boundary" note
appended to each tool description of the server (seed 002 §5.4); a tool's own entry in
``tools`` replaces it (``""`` removes it for that tool).

``${NAME}`` (also the editors' ``${env:NAME}``) in ``command``, ``args``, ``cwd``, ``env``
values, ``url`` and ``headers`` values is the worker's environment variable, resolved by
:func:`resolve` on the worker; ``$${`` is a literal ``${``. :func:`load_mcp_config` and
:func:`parse_mcp_config` keep the references as written: that unresolved
:class:`ServerConfig` is the form that may travel (workflow inputs, logs). A
:class:`ResolvedServer` masks what was resolved in its ``repr()``; :func:`redact`
replaces those values in any text. Values written literally in ``env`` or ``headers``
(a token pasted from a README) are masked too, but they are part of the unresolved
config: write ``${NAME}`` for secrets.

Every mistake is refused with :class:`~hermes.errors.ConfigError` naming the file, the key
(``mcpServers.git.args[1]``) and what was expected.

Model-facing tool names are ``<server>_<tool>`` made safe for every provider by
:func:`sanitize_tool_name`; :func:`merge_tool_names` resolves the collisions that
sanitising can cause, deterministically, and says what it did.

Why this module is long: it is one file format end to end (keys, validation with
line-exact errors, variable substitution, resolution, tool-name merging), and each
step's error messages name the keys the previous step checked.
"""

from __future__ import annotations

import difflib
import fnmatch
import hashlib
import json
import os
import re
import typing
import urllib.parse
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from hermes.errors import ConfigError
from hermes.security.redaction import REDACTED, mask_value, secret_forms
from hermes.models import Idempotency, Permission, PolicySource

# Shared with tool files (hermes.tools.files); private there, imported on purpose so both
# formats read files, word errors and check headers the same way.
from hermes.infra.config_files import read_document
from hermes.tools.files import _HEADER_NAME_RE, _describe, _kind, _model_in, _short
from hermes.tools.registry import PERMISSION_RANK, TOOL_NAME_RE

__all__ = [
    "DEFAULT_IDLE_SECONDS",
    "DEFAULT_LIST_TTL_SECONDS",
    "DEFAULT_STARTUP_TIMEOUT_SECONDS",
    "DEFAULT_TIMEOUT_SECONDS",
    "TOOL_NAME_MAX_CHARS",
    "TOOL_NAME_RE",
    "McpConfig",
    "ResolvedServer",
    "ServerConfig",
    "ToolHints",
    "ToolOverride",
    "ToolPolicy",
    "Transport",
    "load_mcp_config",
    "merge_tool_names",
    "parse_mcp_config",
    "redact",
    "resolve",
    "resolve_all",
    "sanitize_tool_name",
]

Transport = Literal["stdio", "streamable-http", "sse"]

DEFAULT_TIMEOUT_SECONDS = 30.0
"""Per MCP request (seed 000 §5.2: "MCP request timeout 30 s, so nothing hangs")."""
DEFAULT_STARTUP_TIMEOUT_SECONDS = 60.0
"""How long a server has to start and answer ``initialize``. Separate from the request
timeout, as Codex's ``startup_timeout_sec`` is: ``npx -y`` fetching a package, or a Python
server importing its SDK on a loaded machine, takes longer than a request should. A caller
still waits no longer than its own request's deadline; the start goes on in the background
for the next caller (see :mod:`hermes.mcp.calls`)."""
DEFAULT_LIST_TTL_SECONDS = 300.0
"""How long a server's tool list is used before it is asked again (seed 004 §5.3)."""
DEFAULT_IDLE_SECONDS = 300.0
"""An unused stdio process or HTTP session is closed after this long (seed 004 §5.2)."""

TOOL_NAME_MAX_CHARS = 64
"""A function name as OpenAI-compatible providers accept it."""

_UNSAFE_CHARS_RE = re.compile(r"[^A-Za-z0-9_-]")
_HASH_CHARS = 8
_REF_RE = re.compile(r"\$\$\{|\$\{(?:env:)?([A-Za-z_][A-Za-z0-9_]*)\}|\$\{")
"""``$${`` (a literal ``${``), ``${NAME}`` / ``${env:NAME}``, or a ``${`` that is neither."""
_PLAIN_KEY_RE = re.compile(r"^[A-Za-z0-9_-]+\Z")
_MIN_RESOLVED_SECRET_CHARS = 4
"""A ``${NAME}`` value shorter than this is not masked ("1", "on"): it cannot be a
credential, and masking it would garble every message that contains the character."""
_MIN_LITERAL_SECRET_CHARS = 8
"""The same for values written literally in ``env`` and ``headers`` ("info", "true")."""
_EDITOR_KEY_HINTS = {
    "disabled": "Hermes writes `enabled: false` instead",
    "envFile": "list the variables in `env` (values may be ${NAME} from the worker's environment)",
    "autoApprove": "approvals follow `permission` (per server or per tool in `tools`)",
    "alwaysAllow": "approvals follow `permission` (per server or per tool in `tools`)",
    "timeout": "Hermes writes `timeout_seconds`",
    "startup_timeout_sec": "Hermes writes `startup_timeout_seconds`",
    "tool_timeout_sec": "Hermes writes `timeout_seconds`",
}
"""Keys other clients use that Hermes does not take, with what to write instead."""


# ---------------------------------------------------------------- the file's shape


class _Decl(BaseModel):
    # strict: "30" is not a number and "yes" not a boolean; a config says what it means.
    model_config = ConfigDict(extra="forbid", strict=True)


class ToolOverride(_Decl, frozen=True):
    """Settings for one tool of a server, overriding the server's."""

    permission: Permission | None = None
    """``None``: the server's ``permission``."""
    idempotency: Idempotency | None = None
    """``None``: the server's ``idempotency``."""
    description_suffix: str | None = None
    """``None``: the server's suffix; ``""``: none for this tool."""


_TransportName = Literal["stdio", "streamable-http", "sse", "http"]


class _ServerDecl(_Decl):
    """One entry of ``mcpServers`` as written."""

    command: str | None = None
    args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    cwd: str | None = None
    url: str | None = None
    headers: dict[str, str] = Field(default_factory=dict)
    transport: _TransportName | None = None
    type: _TransportName | None = None
    timeout_seconds: float = Field(DEFAULT_TIMEOUT_SECONDS, gt=0, allow_inf_nan=False)
    startup_timeout_seconds: float = Field(DEFAULT_STARTUP_TIMEOUT_SECONDS, gt=0, allow_inf_nan=False)
    allow: list[str] | None = None
    deny: list[str] = Field(default_factory=list)
    permission: Permission | None = None
    idempotency: Idempotency | None = None
    tools: dict[str, ToolOverride] = Field(default_factory=dict)
    description_suffix: str | None = None
    list_ttl_seconds: float = Field(DEFAULT_LIST_TTL_SECONDS, ge=0, allow_inf_nan=False)
    idle_seconds: float = Field(DEFAULT_IDLE_SECONDS, gt=0, allow_inf_nan=False)
    enabled: bool = True
    group: str | None = None


# ---------------------------------------------------------------- the parsed config


class ToolHints(BaseModel, frozen=True):
    """The behaviour hints of a listed tool (MCP ``ToolAnnotations``); ``None``: not sent."""

    read_only: bool | None = None
    """``readOnlyHint``: the tool does not modify its environment (spec default false)."""
    destructive: bool | None = None
    """``destructiveHint``: it may destroy, not only add (spec default true; meaningful
    only when ``read_only`` is false)."""
    idempotent: bool | None = None
    """``idempotentHint``: calling it again with the same arguments has no further effect
    (spec default false)."""

    @classmethod
    def of(cls, annotations: Any) -> ToolHints:
        """The hints of an MCP ``ToolAnnotations`` (or anything with its snake_case
        attributes); ``None`` gives no hints. A value that is not a boolean is ignored."""

        def flag(name: str) -> bool | None:
            value = getattr(annotations, name, None)
            return value if isinstance(value, bool) else None

        return cls(read_only=flag("read_only_hint"), destructive=flag("destructive_hint"), idempotent=flag("idempotent_hint"))

    @property
    def permission(self) -> Permission | None:
        """What the hints ask for: ``read`` (read-only), ``write`` (destructive, stated or
        by the spec's default for a tool declared not read-only), ``None`` (nothing said)."""
        if self.read_only:
            return "read"
        destructive = self.destructive if self.destructive is not None else (True if self.read_only is False else None)
        return "write" if destructive else None


class ToolPolicy(BaseModel, frozen=True):
    """How one tool of a server is treated: the server's settings, the tool's overrides
    and its annotations, with what decided each."""

    permission: Permission
    idempotency: Idempotency
    description_suffix: str | None
    """Appended to the tool's description; ``None`` for nothing."""
    permission_source: PolicySource = "default"
    idempotency_source: PolicySource = "default"


class ServerConfig(BaseModel):
    """One MCP server, validated and normalised, with ``${NAME}`` references as written.

    This is the form that may travel (workflow inputs, logs): it holds no resolved value.
    Build it with :func:`parse_mcp_config` (which checks everything); :func:`resolve` turns
    it into a :class:`ResolvedServer` on the worker. ``repr()`` masks ``env`` and
    ``headers`` values.
    """

    model_config = ConfigDict(frozen=True)

    name: str
    """The key in ``mcpServers``; the ``<server>_`` prefix of its tool names."""
    transport: Transport
    command: str | None = None
    args: tuple[str, ...] = ()
    env: dict[str, str] = Field(default_factory=dict)
    cwd: str | None = None
    url: str | None = None
    headers: dict[str, str] = Field(default_factory=dict)
    timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS
    """Per request, seconds (the server's start included when it is not running)."""
    startup_timeout_seconds: float = DEFAULT_STARTUP_TIMEOUT_SECONDS
    """The most a start (spawn or connect, then ``initialize``) may take, seconds."""
    allow: tuple[str, ...] | None = None
    """Globs over the server's tool names; ``None``: every tool."""
    deny: tuple[str, ...] = ()
    permission: Permission | None = None
    """Written for the server: a floor for each tool's permission (``None``: not written;
    a tool's annotations or ``read``)."""
    idempotency: Idempotency | None = None
    """Written for the server: every tool's idempotency unless the tool's own entry says
    (``None``: not written; ``idempotentHint`` or ``none``)."""
    tools: dict[str, ToolOverride] = Field(default_factory=dict)
    description_suffix: str | None = None
    list_ttl_seconds: float = DEFAULT_LIST_TTL_SECONDS
    idle_seconds: float = DEFAULT_IDLE_SECONDS
    enabled: bool = True
    group: str
    """Tool group for routing; the server's name unless set."""
    source: str | None = None
    """The file it was read from, for error messages."""

    @model_validator(mode="before")
    @classmethod
    def _defaults(cls, data: Any) -> Any:
        if isinstance(data, dict):
            data = dict(data)
            if data.get("transport") is None:
                data["transport"] = "stdio" if data.get("command") else "streamable-http"
            if not data.get("group"):
                data["group"] = data.get("name")
        return data

    def __repr_args__(self) -> Iterator[tuple[str | None, Any]]:
        for name, value in super().__repr_args__():
            if name in ("env", "headers"):
                value = {key: REDACTED for key in value}
            yield name, value

    def allows(self, tool: str) -> bool:
        """Whether the server's tool ``tool`` (its own name) is offered to the model.

        Args:
            tool: the tool's name as the server lists it (no ``<server>_`` prefix).

        Returns:
            True when ``allow`` is unset or one of its globs matches, and no ``deny``
            glob matches (:func:`fnmatch.fnmatchcase`; deny wins).
        """
        if any(fnmatch.fnmatchcase(tool, pattern) for pattern in self.deny):
            return False
        return self.allow is None or any(fnmatch.fnmatchcase(tool, pattern) for pattern in self.allow)

    def policy(self, tool: str, hints: ToolHints | None = None) -> ToolPolicy:
        """The permission, idempotency and description suffix of the server's tool ``tool``.

        The operator's keys outrank the server's hints (the module docstring has the
        rules): the tool's own entry decides outright; the server's ``permission`` is a
        floor that ``destructiveHint`` may raise; the server's ``idempotency`` decides.

        Args:
            tool: the tool's name as the server lists it.
            hints: its annotations as listed (``None``: none sent).

        Returns:
            The policy, with ``permission_source`` / ``idempotency_source`` saying which of
            ``config``, ``annotation`` or ``default`` decided.
        """
        override = self.tools.get(tool, ToolOverride())
        hints = hints or ToolHints()
        suffix = self.description_suffix if override.description_suffix is None else override.description_suffix
        hinted = hints.permission
        permission: tuple[Permission, PolicySource]
        if override.permission is not None:
            permission = (override.permission, "config")
        elif self.permission is not None:
            if hinted is not None and PERMISSION_RANK[hinted] > PERMISSION_RANK[self.permission]:
                permission = (hinted, "annotation")
            else:
                permission = (self.permission, "config")
        elif hinted is not None:
            permission = (hinted, "annotation")
        else:
            permission = ("read", "default")
        idempotency: tuple[Idempotency, PolicySource]
        if (configured := override.idempotency or self.idempotency) is not None:
            idempotency = (configured, "config")
        elif hints.idempotent:
            idempotency = ("idempotent", "annotation")
        else:
            idempotency = ("none", "default")
        return ToolPolicy(
            permission=permission[0],
            idempotency=idempotency[0],
            description_suffix=suffix or None,
            permission_source=permission[1],
            idempotency_source=idempotency[1],
        )

    def describe(self, tool: str, description: str | None) -> str:
        """The description the model sees: the server's text plus the service-boundary suffix.

        Args:
            tool: the tool's name as the server lists it.
            description: the server's description of it (may be empty or ``None``).
        """
        text = (description or "").rstrip()
        suffix = self.policy(tool).description_suffix
        if not suffix:
            return text
        return f"{text}\n\n{suffix}" if text else suffix


class McpConfig(BaseModel):
    """Every configured MCP server, by name (file order)."""

    model_config = ConfigDict(frozen=True)

    servers: dict[str, ServerConfig] = Field(default_factory=dict)
    source: str | None = None

    def enabled_servers(self) -> dict[str, ServerConfig]:
        """The servers with ``enabled: true``, in file order."""
        return {name: server for name, server in self.servers.items() if server.enabled}


@dataclass(frozen=True, repr=False)
class ResolvedServer:
    """A server with every ``${NAME}`` replaced by the worker's value: what a transport uses.

    Lives on the worker only. ``repr()`` and ``str()`` mask every secret (see
    :attr:`secrets`) and every ``env`` and ``headers`` value.
    """

    config: ServerConfig
    command: str | None
    args: tuple[str, ...]
    env: dict[str, str]
    """Only the configured variables; the transport adds them to its own environment."""
    cwd: str | None
    url: str | None
    headers: dict[str, str]
    secrets: tuple[str, ...] = field(default=())
    """Values to keep out of every message, longest first (so one containing another is
    masked whole): each ``${NAME}`` value of 4+ characters, and each ``env`` and
    ``headers`` value of 8+ characters."""

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def transport(self) -> Transport:
        return self.config.transport

    def __repr__(self) -> str:
        parts = [f"name={self.name!r}", f"transport={self.transport!r}"]
        if self.command is not None:
            parts.append(f"command={redact(self.command, self)!r}")
            parts.append(f"args={redact(list(self.args), self)!r}")
        if self.env:
            parts.append(f"env={ {key: REDACTED for key in self.env}!r}")
        if self.cwd is not None:
            parts.append(f"cwd={redact(self.cwd, self)!r}")
        if self.url is not None:
            parts.append(f"url={redact(self.url, self)!r}")
        if self.headers:
            parts.append(f"headers={ {key: REDACTED for key in self.headers}!r}")
        return f"ResolvedServer({', '.join(parts)})"

    __str__ = __repr__


# ---------------------------------------------------------------- loading


def load_mcp_config(path: str | Path, *, environ: Mapping[str, str] | None = None) -> McpConfig:
    """Read an MCP config file (``{"mcpServers": {...}}``).

    Args:
        path: a ``.json``, ``.yaml`` or ``.yml`` file in the format of this module.
        environ: when given, every ``${NAME}`` of the enabled servers must be set in it
            (as on the worker at start-up); nothing resolved is kept. ``None``: not checked.

    Returns:
        The servers, ``${NAME}`` references intact.

    Raises:
        ConfigError: anything wrong with the file (``source`` is the file, ``key`` the key
            such as ``mcpServers.git.args[1]``, the message what was expected and what was
            found): missing or unreadable, not valid JSON/YAML (with the line), a duplicate
            key, and everything :func:`parse_mcp_config` refuses.
    """
    source = str(path)
    return parse_mcp_config(_read(Path(path), source), source, environ=environ)


def parse_mcp_config(data: Any, source: str = "<mcp config>", *, environ: Mapping[str, str] | None = None) -> McpConfig:
    """Validate an already decoded MCP config.

    Args:
        data: the decoded JSON/YAML: a mapping with one key, ``mcpServers``.
        source: named in errors (the file, or a setting name).
        environ: as in :func:`load_mcp_config`.

    Returns:
        The servers, in the order given, ``${NAME}`` references intact.

    Raises:
        ConfigError: with ``source``, the key and what was expected: an unknown or
            misspelt key (with "did you mean"), a wrong type, both ``command`` and ``url``
            or neither, a url that is not http(s), an unknown transport or one that does
            not fit, stdio keys on an HTTP server (or ``headers`` on a stdio one), a bad
            header or variable name, an empty glob, a ``timeout_seconds`` <= 0, a
            malformed ``${...}``; with ``environ``, every unset variable at once.
    """
    if not isinstance(data, Mapping):
        raise ConfigError(f"expected a mapping with an `mcpServers` mapping; found {_kind(data)}", source=source)
    for key in data:
        if key != "mcpServers":
            raise ConfigError(_unknown_key(str(key), ["mcpServers"]), source=source, key=_key("", [key]))
    if "mcpServers" not in data:
        raise ConfigError(
            "required key 'mcpServers' is missing; expected "
            '{"mcpServers": {"<name>": {"command": ...} or {"url": ...}}}',
            source=source,
        )
    entries = data["mcpServers"]
    if not isinstance(entries, Mapping):
        raise ConfigError(
            f"expected a mapping of server names to servers; found {_kind(entries)}", source=source, key="mcpServers"
        )
    servers: dict[str, ServerConfig] = {}
    for name, raw in entries.items():
        servers[name] = _server(name, raw, source)
    config = McpConfig(servers=servers, source=source)
    if environ is not None:
        resolve_all(config, environ)
    return config


def _server(name: Any, raw: Any, source: str) -> ServerConfig:
    if not isinstance(name, str) or not name.strip():
        raise ConfigError(
            f"expected a non-empty string as the server name (it prefixes the server's tool names); "
            f"found {_short(name)}",
            source=source,
            key=_key("mcpServers", [str(name)]),
        )
    key = _key("mcpServers", [name])

    def refuse(message: str, *parts: str | int) -> ConfigError:
        return ConfigError(message, source=source, key=_key(key, list(parts)))

    if not isinstance(raw, Mapping):
        raise refuse(f'expected a mapping such as {{"command": ...}} or {{"url": ...}}; found {_kind(raw)}')
    try:
        decl = _ServerDecl.model_validate(dict(raw))
    except ValidationError as err:
        raise _from_validation(err, source, key) from None

    kinds = {
        field_name: "streamable-http" if value == "http" else value
        for field_name, value in (("type", decl.type), ("transport", decl.transport))
        if value is not None
    }
    if len(set(kinds.values())) > 1:
        raise refuse(
            f"`type` says {decl.type!r} and `transport` says {decl.transport!r}; expected one of them, "
            "or both the same",
            "transport",
        )
    if decl.command is not None and decl.url is not None:
        raise refuse("expected either `command` (a server started over stdio) or `url` (an HTTP server); found both")
    if decl.command is None and decl.url is None:
        raise refuse("expected either `command` (a server started over stdio) or `url` (an HTTP server); found neither")
    stated = next(iter(kinds.values()), None)
    stated_key = next(iter(kinds), "transport")
    if decl.command is not None:
        if stated not in (None, "stdio"):
            raise refuse(
                f"a server with `command` speaks stdio; expected no `{stated_key}` or 'stdio'; "
                f"found {getattr(decl, stated_key)!r}",
                stated_key,
            )
        if not decl.command.strip():
            raise refuse("expected the program to start (such as 'npx' or 'uvx'); found an empty string", "command")
        if decl.headers:
            raise refuse(
                "`headers` are sent to an HTTP server (`url`); expected none on a server started from `command`",
                "headers",
            )
        transport: Transport = "stdio"
    else:
        assert decl.url is not None
        if stated == "stdio":
            raise refuse(
                f"a stdio server is started from `command`; expected `{stated_key}` 'streamable-http' or 'sse' "
                "with `url`",
                stated_key,
            )
        for stdio_key in ("args", "env", "cwd"):
            if getattr(decl, stdio_key):  # an empty `args: []` or `env: {}` is harmless
                raise refuse(
                    f"`{stdio_key}` is for a server started from `command`; expected none on an HTTP server (`url`)",
                    stdio_key,
                )
        transport = typing.cast(Transport, stated or "streamable-http")
        _check_url(decl.url, refuse)
    _check_fields(decl, refuse)

    suffix = (decl.description_suffix or "").strip() or None
    tools = {
        tool: override.model_copy(update={"description_suffix": override.description_suffix.strip()})
        if override.description_suffix is not None
        else override
        for tool, override in decl.tools.items()
    }
    return ServerConfig(
        name=name,
        transport=transport,
        command=decl.command,
        args=tuple(decl.args),
        env=dict(decl.env),
        cwd=decl.cwd,
        url=decl.url,
        headers=dict(decl.headers),
        timeout_seconds=decl.timeout_seconds,
        startup_timeout_seconds=decl.startup_timeout_seconds,
        allow=None if decl.allow is None else tuple(decl.allow),
        deny=tuple(decl.deny),
        permission=decl.permission,
        idempotency=decl.idempotency,
        tools=tools,
        description_suffix=suffix,
        list_ttl_seconds=decl.list_ttl_seconds,
        idle_seconds=decl.idle_seconds,
        enabled=decl.enabled,
        group=(decl.group or name).strip(),
        source=source,
    )


def _check_fields(decl: _ServerDecl, refuse: Callable[..., ConfigError]) -> None:
    """The checks of one server's fields that do not depend on its transport.

    Raises:
        ConfigError: from ``refuse`` (the server's key, then the field's), naming what was
            expected and found.
    """
    if decl.cwd is not None and not decl.cwd.strip():
        raise refuse("expected a directory to start the server in; found an empty string", "cwd")
    for variable in decl.env:
        if not variable or "=" in variable or "\0" in variable:
            raise refuse(
                f"expected an environment variable name (no '=', not empty); found {variable!r}", "env", variable
            )
    for header, value in decl.headers.items():
        if not _HEADER_NAME_RE.match(header):
            raise refuse(f"expected a header name (letters, digits, '-'); found {header!r}", "headers", header)
        if "\r" in value or "\n" in value:
            raise refuse("expected a header value on one line; found a line break", "headers", header)
    for list_key in ("allow", "deny"):
        for i, pattern in enumerate(getattr(decl, list_key) or []):
            if not pattern:
                raise refuse("expected a glob over the server's tool names such as 'read_*'; found ''", list_key, i)
    for tool in decl.tools:
        if not tool:
            raise refuse("expected a tool name as the server lists it; found ''", "tools", tool)
    if decl.group is not None and not decl.group.strip():
        raise refuse("expected a tool group name (or no `group`: the server's name); found an empty string", "group")
    for parts, text in _templated(decl):
        _, problem = _substitute(text, {}, check_only=True)
        if problem:
            raise refuse(problem, *parts)


def _check_url(url: str, refuse: Any) -> None:
    """An absolute http(s) url with a host, checked as far as the text written allows
    (a url starting with ``${...}`` is checked by :func:`resolve`)."""
    if url.startswith("${"):
        return
    sample = _REF_RE.sub(lambda m: "${" if m.group(0) == "$${" else "x", url)
    if _url_problem(sample):
        raise refuse(f"expected an absolute http:// or https:// url with a host; found {url!r}", "url")


def _url_problem(url: str) -> bool:
    try:
        parts = urllib.parse.urlsplit(url)
        return parts.scheme.lower() not in ("http", "https") or not parts.hostname
    except ValueError:
        return True


# ---------------------------------------------------------------- ${NAME} on the worker


def _templated(server: _ServerDecl | ServerConfig) -> Iterator[tuple[list[str | int], str]]:
    """Every value that ``${NAME}`` is resolved in, with its key parts."""
    if server.command is not None:
        yield ["command"], server.command
    for i, arg in enumerate(server.args):
        yield ["args", i], arg
    for variable, value in server.env.items():
        yield ["env", variable], value
    if server.cwd is not None:
        yield ["cwd"], server.cwd
    if server.url is not None:
        yield ["url"], server.url
    for header, value in server.headers.items():
        yield ["headers", header], value


def _substitute(
    text: str, environ: Mapping[str, str], *, check_only: bool = False
) -> tuple[tuple[str, list[str], list[str]], str | None]:
    """``text`` with ``${NAME}`` resolved.

    Returns:
        ``((value, substituted values, unset names), problem)``; ``problem`` is a message
        for a ``${`` that is neither ``${NAME}`` nor ``$${``.
    """
    out: list[str] = []
    values: list[str] = []
    unset: list[str] = []
    position = 0
    for match in _REF_RE.finditer(text):
        out.append(text[position : match.start()])
        position = match.end()
        if match.group(0) == "$${":
            out.append("${")
        elif match.group(1):
            name = match.group(1)
            if check_only:
                continue
            if name in environ:
                out.append(environ[name])
                values.append(environ[name])
            else:
                unset.append(name)
        else:
            return ("", [], []), (
                "expected ${NAME} (or ${env:NAME}) with NAME made of letters, digits and '_', "
                f"or $${{ for a literal ${{; found {text[match.start() : match.start() + 24]!r}"
            )
    out.append(text[position:])
    return ("".join(out), values, unset), None


def resolve(config: ServerConfig, environ: Mapping[str, str] | None = None) -> ResolvedServer:
    """Resolve a server's ``${NAME}`` references with the worker's environment.

    Args:
        config: from :func:`parse_mcp_config` / :func:`load_mcp_config`.
        environ: where ``${NAME}`` is read from; default: this process' environment.

    Returns:
        The server as its transport uses it; its ``repr()`` masks what was resolved.

    Raises:
        ConfigError: naming every unset variable of the server at once (``key``: where the
            first is used); a url that is not http(s) once resolved; a header value with a
            line break once resolved. Messages never contain a resolved value.
    """
    resolved, unset = _resolve(config, os.environ if environ is None else environ)
    if unset:
        raise _unset_error(unset, config.source)
    assert resolved is not None
    return resolved


def resolve_all(config: McpConfig, environ: Mapping[str, str] | None = None) -> dict[str, ResolvedServer]:
    """Resolve every enabled server of a config (see :func:`resolve`).

    Args:
        config: the parsed config.
        environ: where ``${NAME}`` is read from; default: this process' environment.

    Returns:
        The resolved servers by name, in file order; disabled ones are left out.

    Raises:
        ConfigError: as :func:`resolve`, naming every unset variable of every enabled
            server at once.
    """
    environ = os.environ if environ is None else environ
    out: dict[str, ResolvedServer] = {}
    unset: dict[str, str] = {}
    for name, server in config.enabled_servers().items():
        resolved, missing = _resolve(server, environ)
        for variable, key in missing.items():
            unset.setdefault(variable, key)
        if resolved is not None:
            out[name] = resolved
    if unset:
        raise _unset_error(unset, config.source)
    return out


def _resolve(config: ServerConfig, environ: Mapping[str, str]) -> tuple[ResolvedServer | None, dict[str, str]]:
    server_key = _key("mcpServers", [config.name])
    values: dict[tuple[str | int, ...], str] = {}
    secrets: set[str] = set()
    unset: dict[str, str] = {}
    for parts, text in _templated(config):
        (value, substituted, missing), problem = _substitute(text, environ)
        key = _key(server_key, parts)
        if problem:
            raise ConfigError(problem, source=config.source, key=key)
        for variable in missing:
            unset.setdefault(variable, key)
        secrets.update(v for v in substituted if len(v) >= _MIN_RESOLVED_SECRET_CHARS)
        if parts[0] in ("env", "headers") and len(value) >= _MIN_LITERAL_SECRET_CHARS:
            secrets.add(value)
        values[tuple(parts)] = value
    if unset:
        return None, unset
    if config.url is not None and _url_problem(values[("url",)]):
        raise ConfigError(
            f"expected an absolute http:// or https:// url with a host; found {config.url!r} "
            "once ${...} was resolved",
            source=config.source,
            key=_key(server_key, ["url"]),
        )
    for header in config.headers:
        if any(c in values[("headers", header)] for c in "\r\n"):
            raise ConfigError(
                "expected a header value on one line; found a line break once ${...} was resolved",
                source=config.source,
                key=_key(server_key, ["headers", header]),
            )
    return (
        ResolvedServer(
            config=config,
            command=values.get(("command",)),
            args=tuple(values[("args", i)] for i in range(len(config.args))),
            env={variable: values[("env", variable)] for variable in config.env},
            cwd=values.get(("cwd",)),
            url=values.get(("url",)),
            headers={header: values[("headers", header)] for header in config.headers},
            secrets=tuple(sorted(secrets, key=lambda s: (-len(s), s))),
        ),
        {},
    )


def _unset_error(unset: Mapping[str, str], source: str | None) -> ConfigError:
    listed = ", ".join(f"{variable} (at {key})" for variable, key in unset.items())
    return ConfigError(
        f"environment variable(s) {listed} not set on this worker; expected each to be set for its "
        "${...} reference (write $${ for a literal ${)",
        source=source,
        key=next(iter(unset.values())),
    )


def redact(text: Any, resolved: ResolvedServer | Iterable[ResolvedServer]) -> Any:
    """``text`` with every secret of ``resolved`` replaced by ``***``.

    Args:
        text: a string, or dicts/lists/tuples of them (other values are returned as they are).
        resolved: one server, or several (e.g. ``resolve_all(...).values()``).

    Returns:
        The same shape, secrets masked (see :attr:`ResolvedServer.secrets`).
    """
    servers = [resolved] if isinstance(resolved, ResolvedServer) else list(resolved)
    return mask_value(text, secret_forms(s for server in servers for s in server.secrets))


# ---------------------------------------------------------------- tool names


def sanitize_tool_name(server: str, tool: str) -> str:
    """The model-facing name of a server's tool: ``<server>_<tool>``, safe for every provider.

    Args:
        server: the server's name (key in ``mcpServers``).
        tool: the tool's name as the server lists it.

    Returns:
        ``<server>_<tool>`` with every character outside ``[A-Za-z0-9_-]`` replaced by ``_``;
        when longer than 64 characters, its first 55 then ``_`` and 8 hex digits of the
        SHA-256 of the original (server, tool) pair, so two long names differ. Distinct
        pairs can still meet (``a.b`` and ``a_b``): :func:`merge_tool_names` separates them.
    """
    name = _UNSAFE_CHARS_RE.sub("_", f"{server}_{tool}")
    if len(name) <= TOOL_NAME_MAX_CHARS:
        return name
    digest = hashlib.sha256(json.dumps([server, tool]).encode()).hexdigest()[:_HASH_CHARS]
    return f"{name[: TOOL_NAME_MAX_CHARS - _HASH_CHARS - 1]}_{digest}"


def merge_tool_names(server_tools: Mapping[str, Iterable[str]]) -> tuple[dict[str, tuple[str, str]], list[str]]:
    """Name every tool of every server for the model, uniquely and deterministically.

    Each (server, tool) gets :func:`sanitize_tool_name`; when two get the same name, the
    one whose name needed no change keeps it (then the first by server, then tool name),
    and each other gets the first free ``_2``, ``_3``... (cut to stay within 64
    characters). Names that are first to their sanitised form are assigned before any
    suffix, so a suffix never takes a name another tool would have had. The result
    depends only on the set of (server, tool) pairs, not on their order.

    Args:
        server_tools: each server's tool names as the server lists them.

    Returns:
        ``(names, log_lines)``: ``names`` maps each model-facing name (matching
        ``^[A-Za-z0-9_-]{1,64}$``) to ``(server, tool)``, ordered by server then tool; every
        distinct pair appears once. ``log_lines`` describes each collision and each tool a
        server listed twice.
    """
    log: list[str] = []
    pairs: list[tuple[bool, str, str, str]] = []
    for server in sorted(server_tools):
        seen: set[str] = set()
        for tool in sorted(server_tools[server]):
            base = sanitize_tool_name(server, tool)
            if tool in seen:
                log.append(f"MCP server {server!r} lists tool {tool!r} more than once; it is offered once")
                continue
            seen.add(tool)
            pairs.append((base != f"{server}_{tool}", server, tool, base))
    pairs.sort()
    owner: dict[str, tuple[str, str]] = {}
    waiting: list[tuple[str, str, str]] = []
    for _, server, tool, base in pairs:
        if base in owner:
            waiting.append((server, tool, base))
        else:
            owner[base] = (server, tool)
    for server, tool, base in waiting:
        n = 2
        while (name := _with_suffix(base, f"_{n}")) in owner:
            n += 1
        first_server, first_tool = owner[base]
        owner[name] = (server, tool)
        log.append(
            f"MCP tool name collision: server {server!r} tool {tool!r} and server {first_server!r} tool "
            f"{first_tool!r} are both {base!r} once sanitised; the first keeps it, this one is {name!r}"
        )
    names = dict(sorted(owner.items(), key=lambda item: item[1]))
    return names, log


def _with_suffix(name: str, suffix: str) -> str:
    return name[: TOOL_NAME_MAX_CHARS - len(suffix)] + suffix


# ---------------------------------------------------------------- reading and error messages


def _read(path: Path, source: str) -> Any:
    return read_document(path, source, what="MCP config file", expected="an `mcpServers` mapping")


def _from_validation(err: ValidationError, source: str, server_key: str) -> ConfigError:
    """The first problem pydantic found in one server, in the file's terms (an unknown key
    first: a misspelt key also makes the intended one look unset)."""
    problems = sorted(err.errors(), key=lambda e: e["type"] != "extra_forbidden")
    first = problems[0]
    loc = list(first["loc"])
    if first["type"] == "extra_forbidden":
        message = _unknown_key(str(loc[-1]), _allowed_keys(loc[:-1]))
    else:
        message = _describe(first, loc)
    if len(problems) > 1:
        message += f" ({len(problems) - 1} more problem{'s' if len(problems) > 2 else ''} in this server)"
    return ConfigError(message, source=source, key=_key(server_key, loc))


def _unknown_key(key: str, allowed: list[str]) -> str:
    hint = _EDITOR_KEY_HINTS.get(key)
    if hint is None:
        guess = difflib.get_close_matches(key, allowed, n=1)
        hint = f"did you mean {guess[0]!r}?" if guess else None
    return f"unknown key {key!r}{f' ({hint})' if hint else ''}; expected one of: {', '.join(allowed)}"


def _allowed_keys(loc: list[Any]) -> list[str]:
    """The keys the model at ``loc`` (inside one server; list indexes and map keys included) takes."""
    model: type[BaseModel] = _ServerDecl
    map_key_next = False
    for part in loc:
        if map_key_next or isinstance(part, int):
            map_key_next = False
            continue
        declared = model.model_fields.get(part)
        if declared is None:
            return []
        map_key_next = typing.get_origin(declared.annotation) is dict
        found = _model_in(declared.annotation)
        if found is None:
            return []
        model = found
    return [name for name in model.model_fields]


def _key(prefix: str, parts: list[Any]) -> str:
    """``mcpServers.git.args[1]``; a name that is not a plain word is quoted:
    ``mcpServers["my server"].env["A.B"]``."""
    key = prefix
    for part in parts:
        if isinstance(part, int):
            key += f"[{part}]"
        elif _PLAIN_KEY_RE.match(str(part)):
            key += f".{part}" if key else str(part)
        else:
            key += f"[{json.dumps(str(part), ensure_ascii=False)}]"
    return key
