"""Tools implemented by an HTTP endpoint, described in a tool file (see :mod:`hermes.tools.files`).

A request is built from templates compiled when the file is loaded:

- ``{param}`` is replaced by the tool-call argument of that name. In the url it is
  URL-encoded; a string that is exactly ``"{param}"`` in ``query`` or ``body`` keeps the
  argument's JSON type (``3`` stays a number). An entry whose template names an argument
  the call did not give is left out. ``{{`` and ``}}`` are literal braces.
- ``${ENV}`` is replaced, once, at load time, by the worker's environment variable;
  ``$${`` is a literal ``${``. Every value substituted this way is treated as a secret:
  it is never put in a :class:`~hermes.models.ToolSpec`, in ``repr()``, in an error
  message or in a result (it is replaced by ``***``), so it never reaches workflow history.

Outcome of a call -> result the model sees (``{code, message, data}``, DESIGN.md "Tool"):

=====================================  ===============================================
2xx                                    code 0, data mapped by ``response``
400 404 409 410 413 414 422            code 1 (the model can fix its call), status and
                                       a body snippet
401 403                                code 3 (permission denied)
408 429 5xx, connection failures       :class:`EndpointUnavailableError` raised: the
                                       activity retries a retry-safe tool, then code 2
read / write timeout                   ``ToolFailure(code=4)``: outcome unknown
other 3xx / 4xx, unusable 2xx body     ``ToolFailure(code=2)``, not retried
=====================================  ===============================================
"""

from __future__ import annotations

import functools
import json
import re
import ssl
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

try:
    import httpx2 as httpx  # the httpx API; already installed as the openai client's transport
except ImportError:  # pragma: no cover - a plain httpx install works the same
    import httpx  # type: ignore[no-redef]

from temporalio import activity

from hermes.errors import ToolFailure
from hermes.models import ToolResult, ToolResultCode
from hermes.security.redaction import mask_value, request_shown_as, secret_forms
from hermes.tools.registry import Tool, ToolContext

HTTP_METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE", "HEAD")
QUERY_METHODS = ("GET", "DELETE", "HEAD")
"""Methods whose unmapped arguments go to the query string by default."""
BODY_METHODS = ("POST", "PUT", "PATCH")
"""Methods whose unmapped arguments go to a JSON body by default."""

FIXABLE_STATUSES = frozenset({400, 404, 409, 410, 413, 414, 422})
"""Statuses the model can act on by changing its arguments (result code 1)."""
PERMISSION_STATUSES = frozenset({401, 403})
RETRYABLE_STATUSES = frozenset({408, 429})
"""Besides every 5xx: worth another attempt (STYLE.md: 4xx is not retried except these)."""

_SNIPPET_CHARS = 500
_DEFAULT_TIER_SECONDS = {"query": 15.0, "external": 30.0, "batch": 60.0}
"""Settings' tier defaults, used only when a tool is invoked outside an activity."""

_NAME = r"[A-Za-z_][A-Za-z0-9_]*"
TEMPLATE_TOKEN_RE = re.compile(r"\$\$\{|\$\{(" + _NAME + r")\}|\$\{|\{\{|\}\}|\{(" + _NAME + r")\}")


class EndpointUnavailableError(Exception):
    """The endpoint could not be reached or asked to be retried (408, 429, 5xx, network).

    Raised, not returned, so that the tool activity retries a retry-safe tool; after
    the last attempt the model sees code 2 (dependency unavailable).

    Args:
        message: what happened, secrets redacted.
        status_code: the HTTP status, ``None`` for a connection failure.
        retry_after_seconds: the endpoint's ``Retry-After``, if it sent one in seconds.
    """

    def __init__(self, message: str, *, status_code: int | None = None, retry_after_seconds: float | None = None):
        self.status_code = status_code
        self.retry_after_seconds = retry_after_seconds
        super().__init__(message)


class TemplateError(ValueError):
    """A template that cannot be compiled.

    Args:
        message: what is wrong and what was expected.
        path: where in the templated value, relative to it (``["headers", "Authorization"]``).
    """

    def __init__(self, message: str, path: list[str | int] | None = None):
        self.path = list(path or [])
        super().__init__(message)


_MISSING = object()


@dataclass(frozen=True)
class Template:
    """A string with ``{param}`` and resolved ``${ENV}`` parts, compiled at load time."""

    parts: tuple[tuple[str, str], ...]
    """``("text", s)``, ``("secret", resolved_value)`` or ``("arg", name)``, in order."""
    source: str
    """The text as written (``${ENV}`` unresolved): safe to show."""

    def __repr__(self) -> str:
        return f"Template({self.source!r})"

    @property
    def arguments(self) -> set[str]:
        return {value for kind, value in self.parts if kind == "arg"}

    @property
    def secrets(self) -> set[str]:
        return {value for kind, value in self.parts if kind == "secret"}

    def render(self, arguments: Mapping[str, Any], *, encode: Any = None) -> Any:
        """The value for these arguments.

        Args:
            arguments: validated tool-call arguments.
            encode: applied to each argument's text (URL-encoding for the url).

        Returns:
            The argument itself (its JSON type kept) when the template is exactly one
            ``{param}`` and ``encode`` is not set; otherwise a string; ``_MISSING`` when
            a named argument was not given.
        """
        if encode is None and len(self.parts) == 1 and self.parts[0][0] == "arg":
            return arguments.get(self.parts[0][1], _MISSING)
        out: list[str] = []
        for kind, value in self.parts:
            if kind == "arg":
                if value not in arguments:
                    return _MISSING
                text = _text(arguments[value])
                out.append(encode(text) if encode else text)
            else:
                out.append(value)
        return "".join(out)


def compile_template(value: Any, environ: Mapping[str, str], *, path: list[str | int] | None = None) -> Any:
    """``value`` with every string compiled to a :class:`Template`; nested dicts and lists too.

    Args:
        value: a string, number, boolean, null, list or mapping from a tool file.
        environ: the environment that ``${ENV}`` is resolved from (the worker's).

    Raises:
        TemplateError: an unset ``${ENV}`` (named), or a ``${`` not followed by ``NAME}``.
    """
    path = list(path or [])
    if isinstance(value, str):
        return _compile_string(value, environ, path)
    if isinstance(value, Mapping):
        return {key: compile_template(item, environ, path=[*path, key]) for key, item in value.items()}
    if isinstance(value, list):
        return [compile_template(item, environ, path=[*path, i]) for i, item in enumerate(value)]
    return value


def _compile_string(text: str, environ: Mapping[str, str], path: list[str | int]) -> Template:
    parts: list[tuple[str, str]] = []
    position = 0

    def literal(s: str) -> None:
        if not s:
            return
        if parts and parts[-1][0] == "text":
            parts[-1] = ("text", parts[-1][1] + s)
        else:
            parts.append(("text", s))

    for match in TEMPLATE_TOKEN_RE.finditer(text):
        literal(text[position : match.start()])
        position = match.end()
        token = match.group(0)
        if token == "$${":
            literal("${")
        elif token in ("{{", "}}"):
            literal(token[0])
        elif match.group(1):
            name = match.group(1)
            if name not in environ:
                raise TemplateError(
                    f"environment variable {name} is not set on this worker; expected it to be set "
                    f"for ${{{name}}} (write $${{ for a literal ${{)",
                    path,
                )
            parts.append(("secret", environ[name]))
        elif token == "${":
            raise TemplateError(
                f"expected ${{NAME}} with NAME made of letters, digits and '_' (or $${{ for a literal ${{); "
                f"found {text[match.start() : match.start() + 20]!r}",
                path,
            )
        else:
            parts.append(("arg", match.group(2)))
    literal(text[position:])
    return Template(parts=tuple(parts), source=text)


def template_arguments(value: Any) -> set[str]:
    """Every ``{param}`` named anywhere in a compiled value."""
    if isinstance(value, Template):
        return value.arguments
    if isinstance(value, dict):
        return set().union(*(template_arguments(v) for v in value.values())) if value else set()
    if isinstance(value, list):
        return set().union(*(template_arguments(v) for v in value)) if value else set()
    return set()


def template_secrets(value: Any) -> set[str]:
    """Every resolved ``${ENV}`` value anywhere in a compiled value."""
    if isinstance(value, Template):
        return value.secrets
    if isinstance(value, dict):
        return set().union(*(template_secrets(v) for v in value.values())) if value else set()
    if isinstance(value, list):
        return set().union(*(template_secrets(v) for v in value)) if value else set()
    return set()


def template_sources(value: Any) -> Any:
    """A compiled value as written (``${ENV}`` unresolved): safe to show."""
    if isinstance(value, Template):
        return value.source
    if isinstance(value, dict):
        return {k: template_sources(v) for k, v in value.items()}
    if isinstance(value, list):
        return [template_sources(v) for v in value]
    return value


def _render_tree(value: Any, arguments: Mapping[str, Any]) -> Any:
    """A compiled body/query rendered; entries naming a missing argument are left out."""
    if isinstance(value, Template):
        return value.render(arguments)
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            rendered = _render_tree(item, arguments)
            if rendered is not _MISSING:
                out[key] = rendered
        return out
    if isinstance(value, list):
        return [r for r in (_render_tree(item, arguments) for item in value) if r is not _MISSING]
    return value


def _text(value: Any) -> str:
    """An argument as text: JSON spelling for booleans, null and containers."""
    if isinstance(value, str):
        return value
    if isinstance(value, (bool, type(None), dict, list)):
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    return str(value)


def _query_value(value: Any) -> Any:
    if isinstance(value, list):
        return [_text(v) for v in value if v is not None]
    return _text(value)


def lookup_path(data: Any, path: str) -> Any:
    """The value at a dotted path (``"current"``, ``"items.0.name"``) of decoded JSON.

    Raises:
        KeyError: a key or index the data does not have.
    """
    value = data
    for part in path.split("."):
        if isinstance(value, list):
            try:
                value = value[int(part)]
            except (ValueError, IndexError):
                raise KeyError(part) from None
        elif isinstance(value, dict) and part in value:
            value = value[part]
        else:
            raise KeyError(part)
    return value


@functools.lru_cache(maxsize=1)
def _ssl_context() -> ssl.SSLContext:
    """One TLS context for every call (loading CA certificates costs milliseconds)."""
    return ssl.create_default_context()


@dataclass(kw_only=True)
class HttpEndpoint:
    """How to call the endpoint: method, compiled templates and response mapping."""

    method: str
    url: Template
    query: dict[str, Any] | None = None
    """Compiled query mapping; ``None``: the default for the method (see :meth:`build`)."""
    body: Any = None
    """Compiled body template; ``None``: the default for the method."""
    body_given: bool = False
    headers: dict[str, Template] = field(default_factory=dict)
    response_data: str | None = None
    response_message: str | None = None
    keyed_header: str | None = None

    @property
    def secrets(self) -> tuple[str, ...]:
        """Resolved ``${ENV}`` values, longest first (so a secret containing another is
        redacted whole); empty values are not secrets."""
        found = self.url.secrets | template_secrets(self.query) | template_secrets(self.body)
        found |= template_secrets(self.headers)
        return tuple(sorted((s for s in found if s), key=len, reverse=True))

    def used_arguments(self, parameters: set[str]) -> set[str]:
        """The parameters this endpoint sends somewhere (url, query, body, headers)."""
        used = self.url.arguments | template_arguments(self.query) | template_arguments(self.body)
        used |= template_arguments(self.headers)
        if (self.query is None and self.method in QUERY_METHODS) or (not self.body_given and self.method in BODY_METHODS):
            used |= parameters - self.url.arguments - template_arguments(self.query)
        return used

    def build(self, arguments: Mapping[str, Any], context: ToolContext | None) -> dict[str, Any]:
        """Keyword arguments of ``httpx.AsyncClient.request`` for one call.

        Arguments not used in the url go to the query string (GET, DELETE, HEAD) or to a
        JSON body (POST, PUT, PATCH) unless ``query`` / ``body`` map them explicitly.
        """
        in_url = self.url.arguments
        url = self.url.render(arguments, encode=_encode_url_part)
        if url is _MISSING:
            missing = sorted(in_url - set(arguments))
            raise ToolFailure(
                f"the url needs {', '.join(missing)}, which the call did not give", code=ToolResultCode.BAD_ARGUMENTS
            )
        mapped_query = template_arguments(self.query)
        rest = {k: v for k, v in arguments.items() if k not in in_url and k not in mapped_query}
        if self.query is not None:
            query = _render_tree(self.query, arguments)
        elif self.method in QUERY_METHODS:
            query = rest
        else:
            query = {}
        params = {k: _query_value(v) for k, v in query.items() if v is not None}
        request: dict[str, Any] = {"method": self.method, "url": url, "params": params}
        if self.body_given:
            request["json"] = _render_tree(self.body, arguments)
        elif self.method in BODY_METHODS:
            request["json"] = rest
        headers = {}
        for name, template in self.headers.items():
            value = template.render(arguments)
            if value is not _MISSING and value is not None:
                headers[name] = _text(value)
        if self.keyed_header and context is not None:
            headers[self.keyed_header] = context.idempotency_key
        request["headers"] = headers
        return request


@dataclass(kw_only=True, repr=False)
class HttpTool(Tool):
    """A tool implemented by an HTTP endpoint (declared in a tool file).

    Its ``repr`` shows the url as written, never a resolved ``${ENV}`` value.
    """

    endpoint: HttpEndpoint

    def __repr__(self) -> str:
        return f"HttpTool(name={self.name!r}, method={self.endpoint.method!r}, url={self.endpoint.url.source!r}, source={self.source!r})"

    __str__ = __repr__

    def redact(self, value: Any) -> Any:
        """``value`` with every secret replaced by ``***``, as it is and percent-encoded
        (strings, nested in dicts, lists and tuples; :func:`hermes.security.redaction.mask_value`)."""
        return mask_value(value, secret_forms(self.endpoint.secrets, min_chars=1))

    def _attempt_timeout_seconds(self) -> float:
        """A little under this attempt's start-to-close timeout, so that the tool reports
        its own timeout (code 4) before Temporal abandons the attempt."""
        total: float | None = None
        if activity.in_activity():
            limit = activity.info().start_to_close_timeout
            total = limit.total_seconds() if limit else None
        total = total or self.timeout_seconds or _DEFAULT_TIER_SECONDS.get(self.tier, 30.0)
        return max(total * 0.9, total - 2.0)

    async def invoke(self, arguments: Any, context: ToolContext) -> ToolResult:
        """Call the endpoint with validated arguments.

        Returns:
            Code 0 with the mapped data for a 2xx answer; code 1 (fixable status) or 3
            (401/403) with the status and a body snippet.

        Raises:
            EndpointUnavailableError: 408, 429, 5xx or a connection failure (retried).
            ToolFailure: code 4 after a timeout while the request may have been received,
                code 2 for an answer that cannot be used (redirect, other 4xx, a
                ``response`` path the body does not have).
        """
        endpoint = self.endpoint
        request = endpoint.build(self.dump_arguments(arguments), context)
        # The url as written ({param} placeholders, ${ENV} names), never as sent: the path
        # and query are built from the arguments, and this text reaches error messages,
        # failures and log lines (redaction.request_shown_as: httpx's own request line).
        where = f"{endpoint.method} {endpoint.url.source}"
        timeout = self._attempt_timeout_seconds()
        try:
            with request_shown_as(endpoint.url.source):
                async with httpx.AsyncClient(timeout=timeout, verify=_ssl_context(), follow_redirects=False) as client:
                    response = await client.request(**request)
        except (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout) as err:
            # Nothing was sent: safe to try again whatever the tool's idempotency.
            raise EndpointUnavailableError(self.redact(f"{where}: could not connect ({type(err).__name__}: {err})")) from None
        except httpx.TimeoutException:
            raise ToolFailure(
                f"{where} timed out after {timeout:.1f} s; outcome unknown (the endpoint may have acted on it)",
                code=ToolResultCode.OUTCOME_UNKNOWN,
            ) from None
        except httpx.TransportError as err:
            message = self.redact(f"{where}: the connection failed mid-request ({type(err).__name__}: {err})")
            if self.idempotent:
                raise EndpointUnavailableError(message) from None
            raise ToolFailure(f"{message}; outcome unknown", code=ToolResultCode.OUTCOME_UNKNOWN) from None
        return self._result(response, where)

    def _result(self, response: Any, where: str) -> ToolResult:
        status = response.status_code
        label = f"HTTP {status} {response.reason_phrase}".strip()
        if 200 <= status < 300:
            return self._success(response, label, where)
        snippet = self.redact(response.text[:_SNIPPET_CHARS])
        detail = f"{where} answered {label}" + (f": {snippet}" if snippet else "")
        data = {"status": status, "body": snippet}
        if status in FIXABLE_STATUSES:
            return ToolResult(code=ToolResultCode.BAD_ARGUMENTS, message=detail, data=data)
        if status in PERMISSION_STATUSES:
            return ToolResult(code=ToolResultCode.PERMISSION_DENIED, message=detail, data=data)
        if status in RETRYABLE_STATUSES or status >= 500:
            raise EndpointUnavailableError(detail, status_code=status, retry_after_seconds=_retry_after(response))
        if 300 <= status < 400:
            location = self.redact(response.headers.get("location", "?"))
            detail = f"{where} answered {label}, redirecting to {location}; redirects are not followed (fix the url in the tool file)"
        raise ToolFailure(detail, code=ToolResultCode.DEPENDENCY_UNAVAILABLE, data=data)

    def _success(self, response: Any, label: str, where: str) -> ToolResult:
        endpoint = self.endpoint
        if endpoint.method == "HEAD":
            return ToolResult(message=label, data=self.redact({"status": response.status_code, "headers": dict(response.headers)}))
        body: Any = None
        is_json = False
        if response.content:
            try:
                body, is_json = response.json(), True
            except ValueError:
                body = response.text
        message = label
        if endpoint.response_message:
            try:
                found = lookup_path(body, endpoint.response_message) if is_json else _MISSING
            except KeyError:
                found = _MISSING
            if found is not _MISSING and found is not None:
                message = _text(found)
        data = body
        if endpoint.response_data:
            if not is_json:
                raise ToolFailure(
                    f"{where} answered {label} with a body that is not JSON; expected JSON with "
                    f"{endpoint.response_data!r}: {self.redact(response.text[:_SNIPPET_CHARS])}",
                    code=ToolResultCode.DEPENDENCY_UNAVAILABLE,
                )
            try:
                data = lookup_path(body, endpoint.response_data)
            except KeyError as err:
                raise ToolFailure(
                    f"{where} answered {label} without {endpoint.response_data!r} (no {err.args[0]!r}); "
                    f"the response mapping in {self.source} does not match the endpoint",
                    code=ToolResultCode.DEPENDENCY_UNAVAILABLE,
                ) from None
        return ToolResult(message=self.redact(message), data=self.redact(data))


def _encode_url_part(text: str) -> str:
    """An argument URL-encoded for the url: ``/`` too, and a bare ``.`` or ``..`` (which
    a client would resolve as a path step, e.g. ``/files/{name}`` -> ``/``)."""
    if text in (".", ".."):
        return text.replace(".", "%2E")
    return urllib.parse.quote(text, safe="")


def _retry_after(response: Any) -> float | None:
    value = response.headers.get("retry-after")
    try:
        return max(float(value), 0.0) if value is not None else None
    except ValueError:
        return None  # an HTTP date; the activity's backoff applies
