"""A tool result checked against the tool's declared output schema, without losing it.

The mcp SDK's ``ClientSession.call_tool`` checks a result against the ``outputSchema``
the tool listed and raises ``RuntimeError`` when the structured content is missing or
does not match. The server has answered by then (the tool ran, exactly once), but the
exception drops the answer: a caller sees a failure that "may have run" and retries it
or reports its outcome unknown (issue 27, "An MCP answer lost"). Servers send such
results routinely: a tool that declares a schema and answers text only (older server
SDKs, hand-written servers), or content one field off.

Here the answer is kept: the connection's session (:class:`LenientSession`) never raises
for a result's shape, and :func:`output_mismatch` says what does not match, which
:class:`hermes.mcp.tools.McpToolset` puts into the result's message as a warning (code 0:
the call is done) and into the log. The check is the SDK's: the schema's own draft
(``$schema``, else 2020-12), ``$ref`` resolved within the schema document only.
"""

from __future__ import annotations

import json
from functools import lru_cache
from typing import Any

from jsonschema.exceptions import SchemaError, best_match
from jsonschema.protocols import Validator
from jsonschema.validators import validator_for
from mcp import ClientSession, types
from referencing import Registry
from referencing.exceptions import Unresolvable

__all__ = ["MAX_WARNING_CHARS", "LenientSession", "output_mismatch"]

MAX_WARNING_CHARS = 500
"""Longest mismatch description (the schema error's first line is cut there)."""


class LenientSession(ClientSession):
    """A ``ClientSession`` whose ``call_tool`` returns every result the server sent.

    The SDK's output-schema check raises after the tool ran; callers check with
    :func:`output_mismatch` instead, keeping the answer.
    """

    async def validate_tool_result(self, name: str, result: types.CallToolResult) -> None:
        """Accept any result (checked by :func:`output_mismatch` where it is used)."""


def output_mismatch(schema: dict[str, Any] | None, result: Any) -> str | None:
    """How a tool result fails the tool's declared output schema, or None when it fits.

    A result with ``is_error`` is not checked (the MCP spec asks structured content only
    of a successful result), nor is one of a tool that declares no schema.

    Args:
        schema: the tool's ``outputSchema`` as listed (a JSON Schema object), or None.
        result: the server's ``CallToolResult``.

    Returns:
        A one-line description (at most :data:`MAX_WARNING_CHARS` characters): no
        structured content, the first schema error, or a schema that cannot be used
        (invalid, or a ``$ref`` that does not resolve); None when the result fits.
    """
    if not schema or getattr(result, "is_error", False):
        return None
    fields_set = getattr(result, "model_fields_set", set())
    structured = getattr(result, "structured_content", None)
    if structured is None and "structured_content" not in fields_set:
        return "the tool declares an output schema but sent no structured content"
    try:
        validator = _validator(json.dumps(schema, sort_keys=True))
    except SchemaError as err:
        return _line(f"the tool's output schema is not valid JSON Schema, so its result was not checked: {err.message}")
    try:
        error = best_match(validator.iter_errors(structured))
    except Unresolvable as err:
        return _line(f"the tool's output schema has a $ref that does not resolve, so its result was not checked: {err}")
    if error is None:
        return None
    where = "/".join(str(part) for part in error.absolute_path)
    return _line(f"the structured content does not match the tool's output schema{f' at {where}' if where else ''}: {error.message}")


@lru_cache(maxsize=256)
def _validator(schema_json: str) -> Validator:
    """A compiled validator per schema (compiling costs far more than validating)."""
    schema = json.loads(schema_json)
    cls = validator_for(schema)
    cls.check_schema(schema)
    return cls(schema, registry=Registry())


def _line(text: str) -> str:
    first = text.strip().splitlines()[0] if text.strip() else text
    return first if len(first) <= MAX_WARNING_CHARS else first[: MAX_WARNING_CHARS - 1] + "…"
