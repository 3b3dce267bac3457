"""Tool-call arguments: what a model sent, made valid, or precise problems when it cannot be.

Models send arguments loosely: numbers and booleans as strings, dates in whatever format the
user typed, enum values in another case, a JSON object encoded as a string. A tool's
parameters are a JSON Schema object, either produced by pydantic's ``model_json_schema()``
for a decorated Python function (``$defs``/``$ref``, ``anyOf: [X, {"type": "null"}]`` for
``Optional``, ``enum``, ``format``, numeric and length bounds, nested objects with
``additionalProperties: false``) or written by hand for a tool implemented elsewhere
(draft 2020-12, possibly with ``oneOf``, ``const``, ``type`` lists, ``default``).

The pipeline for a schema-only tool is :func:`validate_arguments`::

    normalise the top level -> coerce -> check -> apply top-level defaults

- :func:`coerce` repairs what can be repaired without guessing and never raises; a value that
  is already valid comes back unchanged (an integral float for an ``integer`` comes back as an
  ``int``, the same JSON number).
- :func:`check` validates with ``jsonschema`` (``Draft202012Validator`` plus format checks)
  and turns each failure into a problem a model can act on::

      {"field": "address.zip", "expected": "a string of 5 characters",
       "received": "'1234'", "missing": False}

  ``field`` is a dotted path (list indices as numbers, ``tags.2``) or ``"(arguments)"`` for
  the arguments as a whole; ``received`` is at most 200 characters; ``missing`` is true for a
  required argument that is absent or null, so the agent asks the user instead of calling
  the tool with a null.
- Decorated Python tools are validated by pydantic after :func:`coerce`;
  :func:`problems_from_pydantic` gives its errors the same shape.

Schemas must have passed :func:`check_schema` (at registration): :func:`check` and
:func:`validate_arguments` trust them.

Ambiguous inputs are refused rather than guessed (the check then tells the model what was
expected): relative dates ("tomorrow": they depend on a clock and a time zone), two-digit
years, a date alone for a ``date-time`` (it would invent a time), Unix timestamps for a
date or date-time (seconds or milliseconds? which zone?), thousands separators ("1,234":
a decimal comma elsewhere), ``NaN``/``Infinity``, a list given as comma-separated text.
Numeric dates with the year last are read month-first with ``/`` (US: ``03/05/2024`` is
5 March) and day-first with ``.`` or ``-`` (``05.03.2024`` is 5 March); the other order is
used only when the preferred one is not a date (``25/03/2024`` is 25 March).

The JSON Schema keywords are those of draft 2020-12
(https://json-schema.org/draft/2020-12/json-schema-validation); the date and time formats
follow RFC 3339 section 5.6, except that a ``date-time`` or ``time`` without an offset is
accepted (naive), because a Python tool taking a ``datetime`` accepts one.

What a scalar text means (numbers, booleans, dates, times, the ``format`` checks) is
:mod:`hermes.tools.scalars`, which knows no schema. Why this module is long: coercion,
checking and describing walk the same schemas through one cached context (``$ref``
resolution, ``anyOf``/``oneOf`` branches, the dotted field paths of problems) and must agree
on every keyword, so they are kept side by side rather than split across modules that
would each need the others' internals.
"""

from __future__ import annotations

import json
import math
import re
import threading
from urllib.parse import unquote
from collections import OrderedDict
from collections.abc import Iterable
from decimal import Decimal
from typing import Any

import pydantic
from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError
from jsonschema.exceptions import ValidationError as SchemaValidationError
from referencing import Registry

from hermes.errors import ToolArgumentsError, ToolRegistrationError
from hermes.tools import scalars

__all__ = [
    "ARGUMENTS_FIELD",
    "RECEIVED_MAX_CHARS",
    "check",
    "check_schema",
    "coerce",
    "missing_fields",
    "problems_from_pydantic",
    "validate_arguments",
]

ARGUMENTS_FIELD = "(arguments)"
"""The ``field`` of a problem with the arguments as a whole (not a JSON object, too deep)."""

RECEIVED_MAX_CHARS = 200
"""Longest ``received`` text in a problem; longer values are cut and end in an ellipsis."""

MAX_NESTING = 64
"""Deepest nesting of lists and objects :func:`validate_arguments` accepts; deeper input
is refused as a problem rather than risking Python's recursion limit."""

_MISSING_EXPECTED = "a value (required)"
_MISSING_RECEIVED = "nothing (missing)"

Problem = dict[str, Any]
_Path = tuple[Any, ...]


# --------------------------------------------------------------------------- JSON values


def _copy(value: Any) -> Any:
    """A deep copy of a JSON value (faster than ``copy.deepcopy`` for plain data)."""
    if isinstance(value, dict):
        return {key: _copy(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_copy(item) for item in value]
    return value


def _json_equal(left: Any, right: Any) -> bool:
    """Equality as JSON sees it: ``1 == 1.0`` but ``true != 1``."""
    if isinstance(left, bool) or isinstance(right, bool):
        return type(left) is type(right) and left == right
    if isinstance(left, (int, float)) and isinstance(right, (int, float)):
        return left == right
    if isinstance(left, dict) and isinstance(right, dict):
        return left.keys() == right.keys() and all(_json_equal(left[k], right[k]) for k in left)
    if isinstance(left, list) and isinstance(right, list):
        return len(left) == len(right) and all(_json_equal(a, b) for a, b in zip(left, right))
    return type(left) is type(right) and left == right


def _json_kinds(value: Any) -> set[str]:
    """The JSON Schema ``type`` names a value satisfies."""
    if value is None:
        return {"null"}
    if isinstance(value, bool):
        return {"boolean"}
    if isinstance(value, int):
        return {"integer", "number"}
    if isinstance(value, float):
        return {"integer", "number"} if value.is_integer() else {"number"}
    if isinstance(value, str):
        return {"string"}
    if isinstance(value, list):
        return {"array"}
    if isinstance(value, dict):
        return {"object"}
    return set()


def _nesting(value: Any, limit: int) -> int:
    """Depth of lists/objects in ``value``, counted without recursion, stopping past ``limit``."""
    deepest = 0
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (dict, list)):
            deepest = max(deepest, depth)
            if deepest > limit:
                return deepest
            children = item.values() if isinstance(item, dict) else item
            stack.extend((child, depth + 1) for child in children)
    return deepest


def _show(value: Any) -> str:
    """What came, for a problem's ``received``: strings quoted, the rest as JSON, <= 200 chars."""
    if isinstance(value, str):
        text = repr(value)
    else:
        try:
            text = json.dumps(value, ensure_ascii=False)
        except (TypeError, ValueError):
            text = repr(value)
    if len(text) > RECEIVED_MAX_CHARS:
        text = text[: RECEIVED_MAX_CHARS - 1] + "…"
    return text


def _literal(value: Any) -> str:
    if isinstance(value, str):
        return repr(value)
    try:
        return json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        return repr(value)


_PLAIN_KEY_RE = re.compile(r"[^\s.\[\]\"']+")


def _field(path: _Path) -> str:
    """``address.street``, ``tags.2``; a key that is empty or has dots or spaces is quoted as
    JSON (``meta."a.b"``); at most 200 characters."""
    if not path:
        return ARGUMENTS_FIELD
    parts = [
        str(part) if isinstance(part, int) or _PLAIN_KEY_RE.fullmatch(part) else json.dumps(part, ensure_ascii=False)
        for part in path
    ]
    text = ".".join(parts)
    return text if len(text) <= RECEIVED_MAX_CHARS else text[: RECEIVED_MAX_CHARS - 1] + "…"


def _canonical_key(name: str) -> str:
    return re.sub(r"[\s_\-]", "", name).casefold()


# --------------------------------------------------------------------------- schema context


class _Schemas:
    """One tool's schema: ``$ref`` resolution and branch checks against its root.

    Built once per distinct root (see :func:`_schemas`); holds a private copy of the root so
    a caller's later change to its dict cannot disagree with the cached validator.
    """

    def __init__(self, root: Any):
        self.root = root
        self.validator = Draft202012Validator(root, format_checker=scalars.FORMAT_CHECKER, registry=Registry())

    def resolve(self, ref: str) -> Any:
        """The subschema a local ``$ref`` (``#``, ``#/$defs/X``, ``#/definitions/X``) names, or None."""
        if not ref.startswith("#"):
            return None
        pointer = ref[1:]
        node = self.root
        if not pointer:
            return node
        if not pointer.startswith("/"):
            return None  # a named anchor; pydantic and hand-written tool schemas do not use them
        for token in pointer[1:].split("/"):
            token = unquote(token).replace("~1", "/").replace("~0", "~")
            if isinstance(node, dict) and token in node:
                node = node[token]
            elif isinstance(node, list) and token.isdigit() and int(token) < len(node):
                node = node[int(token)]
            else:
                return None
        return node

    def is_valid(self, schema: Any, value: Any) -> bool:
        """Whether ``value`` satisfies ``schema`` (a subschema of the root; refs resolve there)."""
        return self.validator.evolve(schema=schema).is_valid(value)

    def allows_null(self, schema: Any) -> bool:
        return self.is_valid(schema, None)


_SCHEMAS_CACHE: OrderedDict[str, _Schemas] = OrderedDict()
_SCHEMAS_CACHE_SIZE = 256
_SCHEMAS_LOCK = threading.Lock()


def _schemas(root: Any) -> _Schemas:
    """The (cached) context for a root schema; keyed by its JSON text, so equal schemas share one."""
    try:
        # Key order is kept (not sorted): it is the order problems list the declared arguments in.
        text = json.dumps(root, allow_nan=False)
    except (TypeError, ValueError):
        return _Schemas(root)
    with _SCHEMAS_LOCK:  # tools may be validated from several activity threads at once
        found = _SCHEMAS_CACHE.get(text)
        if found is None:
            found = _SCHEMAS_CACHE[text] = _Schemas(json.loads(text))
            while len(_SCHEMAS_CACHE) > _SCHEMAS_CACHE_SIZE:
                _SCHEMAS_CACHE.popitem(last=False)
        else:
            _SCHEMAS_CACHE.move_to_end(text)
        return found


def _declared_types(schema: dict[str, Any]) -> list[str] | None:
    declared = schema.get("type")
    if isinstance(declared, str):
        return [declared]
    if isinstance(declared, list) and all(isinstance(t, str) for t in declared):
        return list(declared)
    return None


def _inferred_types(schema: dict[str, Any]) -> list[str]:
    if any(key in schema for key in ("properties", "required", "additionalProperties", "patternProperties")):
        return ["object"]
    if "items" in schema or "prefixItems" in schema:
        return ["array"]
    return []


def _is_null_only(schema: Any) -> bool:
    return isinstance(schema, dict) and (schema.get("type") == "null" or schema.get("const", ...) is None)


# --------------------------------------------------------------------------- coerce


class _Coercer:
    def __init__(self, schemas: _Schemas):
        self.schemas = schemas

    def coerce(self, schema: Any, value: Any, active: frozenset[str]) -> Any:
        """``active``: the ``$ref``s followed since the last step into a property or item."""
        if not isinstance(schema, dict):
            return _copy(value)
        result = value
        copied = False
        ref = schema.get("$ref")
        if isinstance(ref, str):
            if ref in active:
                return _copy(value)  # a $ref cycle that never descends: nothing more to learn
            target = self.schemas.resolve(ref)
            if target is not None:
                result, copied = self.coerce(target, result, active | {ref}), True
        types = _declared_types(schema)
        if types is not None:
            result, copied = self._coerce_types(schema, types, result, declared=True), True
        else:
            inferred = _inferred_types(schema)
            if inferred:
                result, copied = self._coerce_types(schema, inferred, result, declared=False), True
            elif isinstance(result, str) and "format" in schema:
                result = self._coerce_string(schema, result)
        for branch in schema.get("allOf") or []:
            result, copied = self.coerce(branch, result, active), True
        for keyword in ("anyOf", "oneOf"):
            branches = schema.get(keyword)
            if isinstance(branches, list) and branches:
                result, copied = self._coerce_alternatives(keyword, branches, result, active), True
        members = [schema["const"]] if "const" in schema else schema.get("enum")
        if isinstance(members, list) and members:
            matched = _match_enum(result, members)
            if matched is not scalars.FAIL:
                return matched
        return result if copied else _copy(result)

    def _coerce_types(self, schema: dict[str, Any], types: list[str], value: Any, *, declared: bool) -> Any:
        kinds = _json_kinds(value)
        if kinds.intersection(types):
            if isinstance(value, float) and "integer" in types and "number" not in types:
                return int(value)
            if isinstance(value, dict) and "object" in types:
                return self._coerce_object(schema, value)
            if isinstance(value, list) and "array" in types:
                return self._coerce_array(schema, value)
            if isinstance(value, str) and "string" in types:
                return self._coerce_string(schema, value)
            return _copy(value)
        if not declared:
            return _copy(value)
        for kind in types:
            converted = self._convert(kind, schema, value)
            if converted is not scalars.FAIL:
                return converted
        return _copy(value)

    def _convert(self, kind: str, schema: dict[str, Any], value: Any) -> Any:
        if kind == "integer":
            return scalars.to_integer(value)
        if kind == "number":
            return scalars.to_number(value)
        if kind == "boolean":
            return scalars.to_boolean(value)
        if kind == "string":
            text = scalars.to_text(value)
            return scalars.FAIL if text is scalars.FAIL else self._coerce_string(schema, text)
        if kind == "null":
            return None if isinstance(value, str) and value.strip().casefold() == "null" else scalars.FAIL
        if kind == "array":
            return self._to_array(schema, value)
        if kind == "object":
            if isinstance(value, str) and value.strip().startswith("{"):
                try:
                    decoded = scalars.loads_json(value)
                except (ValueError, RecursionError):
                    return scalars.FAIL
                if isinstance(decoded, dict):
                    return self._coerce_object(schema, decoded)
            return scalars.FAIL
        return scalars.FAIL

    def _to_array(self, schema: dict[str, Any], value: Any) -> Any:
        if isinstance(value, str) and value.strip().startswith("["):
            try:
                decoded = scalars.loads_json(value)
            except (ValueError, RecursionError):
                decoded = None
            if isinstance(decoded, list):
                return self._coerce_array(schema, decoded)
        items = schema.get("items")
        if value is None or "prefixItems" in schema or not isinstance(items, dict):
            return scalars.FAIL
        # A single value where a list of such values is wanted: wrap it, if it is one.
        item = self.coerce(items, value, frozenset())
        return [item] if self.schemas.is_valid(items, item) else scalars.FAIL

    def _coerce_string(self, schema: dict[str, Any], text: str) -> str:
        fmt = schema.get("format")
        test = scalars.FORMAT_TESTS.get(fmt) if isinstance(fmt, str) else None
        if test is None or test(text):
            return text
        normalised = scalars.FORMAT_NORMALISERS[fmt](text)  # type: ignore[index]
        return normalised if normalised is not None else text

    def _coerce_array(self, schema: dict[str, Any], values: list[Any]) -> list[Any]:
        prefix = schema.get("prefixItems")
        prefix = prefix if isinstance(prefix, list) else []
        items = schema.get("items")
        result = []
        for index, item in enumerate(values):
            if index < len(prefix):
                result.append(self.coerce(prefix[index], item, frozenset()))
            elif isinstance(items, dict):
                result.append(self.coerce(items, item, frozenset()))
            else:
                result.append(_copy(item))
        return result

    def _coerce_object(self, schema: dict[str, Any], value: dict[str, Any]) -> dict[str, Any]:
        properties = schema.get("properties")
        properties = properties if isinstance(properties, dict) else {}
        patterns = schema.get("patternProperties")
        patterns = patterns if isinstance(patterns, dict) else {}
        additional = schema.get("additionalProperties", True)
        required = {name for name in schema.get("required") or [] if isinstance(name, str)}
        closed = additional is False or schema.get("unevaluatedProperties") is False

        def not_given(key: str, item: Any) -> bool:
            # An optional argument sent as null where null is not allowed means "not given":
            # it is dropped, and the default (if any) applies.
            return (
                item is None
                and key in properties
                and key not in required
                and not self.schemas.allows_null(properties[key])
            )

        value = {key: item for key, item in value.items() if not not_given(key, item)}
        renames = self._renames(properties, patterns, value) if closed else {}
        result: dict[str, Any] = {}
        for key, item in value.items():
            key = renames.get(key, key)
            if key in properties:
                if not not_given(key, item):
                    result[key] = self.coerce(properties[key], item, frozenset())
                continue
            matching = [sub for pattern, sub in patterns.items() if _pattern_matches(pattern, key)]
            if matching:
                for subschema in matching:
                    item = self.coerce(subschema, item, frozenset())
                result[key] = item
            elif isinstance(additional, dict):
                result[key] = self.coerce(additional, item, frozenset())
            else:
                result[key] = _copy(item)
        return result

    @staticmethod
    def _renames(properties: dict[str, Any], patterns: dict[str, Any], value: dict[str, Any]) -> dict[str, str]:
        """Unknown keys that are a known property in another case or separator style
        (``startDate`` for ``start_date``), when exactly one key maps to that property."""
        by_canonical: dict[str, str | None] = {}
        for name in properties:
            canonical = _canonical_key(name)
            by_canonical[canonical] = None if canonical in by_canonical else name
        claims: dict[str, list[str]] = {}
        for key in value:
            if key in properties or any(_pattern_matches(p, key) for p in patterns):
                continue
            target = by_canonical.get(_canonical_key(key))
            if target is not None and target not in value:
                claims.setdefault(target, []).append(key)
        return {keys[0]: target for target, keys in claims.items() if len(keys) == 1}

    def _coerce_alternatives(self, keyword: str, branches: list[Any], value: Any, active: frozenset[str]) -> Any:
        for branch in branches:
            if isinstance(branch, (dict, bool)) and self.schemas.is_valid(branch, value):
                return self.coerce(branch, value, active)
        whole = {keyword: branches}
        fallback: Any = scalars.FAIL
        for branch in branches:
            if not isinstance(branch, dict) or _is_null_only(branch):
                continue
            candidate = self.coerce(branch, value, active)
            if self.schemas.is_valid(branch, candidate):
                if keyword == "anyOf" or self.schemas.is_valid(whole, candidate):
                    return candidate
                if fallback is scalars.FAIL:
                    fallback = candidate
        if fallback is not scalars.FAIL:
            return fallback
        if (
            isinstance(value, str)
            and value.strip().casefold() == "null"
            and any(isinstance(b, (dict, bool)) and self.schemas.allows_null(b) for b in branches)
        ):
            return None
        return _copy(value)


def _pattern_matches(pattern: str, key: str) -> bool:
    try:
        return re.search(pattern, key) is not None
    except (re.error, TypeError):
        return False


def _match_enum(value: Any, members: list[Any]) -> Any:
    """The one enum member ``value`` loosely stands for, or ``scalars.FAIL``.

    Exact (JSON) equality first; then, for text, case-insensitive and trimmed, then also
    ignoring spaces, ``_`` and ``-`` ("in progress" for "in_progress"); text for a number
    or boolean member ("2" for 2, "yes" for true); a number for a numeric text member.
    A loose form that fits several members matches none.
    """
    for member in members:
        if _json_equal(value, member):
            return _copy(member)

    def unique(hits: list[Any]) -> Any:
        distinct: list[Any] = []
        for hit in hits:
            if not any(_json_equal(hit, seen) for seen in distinct):
                distinct.append(hit)
        return _copy(distinct[0]) if len(distinct) == 1 else scalars.FAIL

    if isinstance(value, str):
        text = scalars.nfkc(value)
        for canon in (str.casefold, _canonical_key):
            hits = [m for m in members if isinstance(m, str) and canon(scalars.nfkc(m)) == canon(text)]
            if hits:
                return unique(hits)
        number = scalars.parse_decimal(text)
        if number is not None:
            hits = [
                m
                for m in members
                if isinstance(m, (int, float)) and not isinstance(m, bool) and math.isfinite(m) and Decimal(m) == number
                or isinstance(m, float) and math.isfinite(m) and m == float(number)
            ]
            if hits:
                return unique(hits)
        truth = scalars.to_boolean(text)
        if truth is not scalars.FAIL:
            hits = [m for m in members if isinstance(m, bool) and m is truth]
            if hits:
                return unique(hits)
        if text.casefold() == "null" and None in members:
            return None
        return scalars.FAIL
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        hits = [m for m in members if isinstance(m, str) and scalars.parse_decimal(m) == Decimal(value)]
        return unique(hits) if hits else scalars.FAIL
    if isinstance(value, bool):
        word = "true" if value else "false"
        hits = [m for m in members if isinstance(m, str) and scalars.nfkc(m).casefold() == word]
        return unique(hits) if hits else scalars.FAIL
    return scalars.FAIL


def coerce(schema: dict, value: Any, *, root: dict | None = None) -> Any:
    """Best-effort repair of a model's loose argument value for a JSON Schema.

    Rules (each applies only where ``value`` does not already fit; a valid value comes back
    equal to itself):

    - ``integer`` from ``"42"``, ``" 42 "``, ``"42.0"``, ``"1e3"`` and integral floats (``42.0``);
      ``number`` from plain decimal or scientific text (never ``"NaN"``, ``"inf"``, ``"1,234"``);
      ``boolean`` from ``true/false/yes/no/on/off/1/0`` text (any case) and ``1``/``0``;
      ``string`` from a number or boolean (``42`` -> ``"42"``, ``True`` -> ``"true"``);
      ``null`` from the text ``"null"`` where null is allowed.
    - ``enum``/``const``: case-insensitive, trimmed match to a member; numbers and booleans
      as text match numeric and boolean members.
    - ``format``: ``date`` -> ``YYYY-MM-DD`` from ISO, ``2024/03/05``, ``2024.03.05``,
      ``5 March 2024``, ``March 5, 2024``, ``2024年3月5日``, ``05.03.2024`` (day first),
      ``03/05/2024`` (month first, US); ``date-time`` -> ``YYYY-MM-DDTHH:MM:SS[.f][offset]``
      from a date above plus a time, keeping a given offset and leaving a naive one naive;
      ``time`` -> ``HH:MM:SS[.f][offset]`` (also ``9:30 pm``); ``uuid`` -> canonical form.
    - ``array`` from JSON text (``"[1, 2]"``) or a single value that fits ``items`` (wrapped);
      ``object`` from JSON text (``'{"a": 1}'``).
    - Objects and arrays are repaired recursively. In an object that allows no other keys, a
      key that is a property in another case or style (``startDate``) is renamed to it. An
      optional property sent as null where null is not allowed is removed (treated as not
      given); a null where null is allowed stays null. Defaults are not filled in.
    - Local ``$ref`` (``#/$defs/...``, ``#/definitions/...``) resolve against ``root``;
      a cycle of references that never descends into a property or item is cut.
    - ``anyOf``/``oneOf``: the branch the value already fits, else the first non-null branch
      whose coerced value fits that branch (for ``oneOf``, preferring one that fits exactly
      one branch), else the value as it came.

    Args:
        schema: the JSON Schema (dict) the value should satisfy; a subschema of ``root``.
        value: any JSON value (``None``, bool, int, float, str, list, dict).
        root: the whole schema that ``$ref``s in ``schema`` point into (default ``schema``).

    Returns:
        A new value (the input is never mutated or aliased); not necessarily valid: use
        :func:`check` to find what is still wrong.

    Raises:
        Nothing: any internal failure returns a copy of ``value`` unchanged.
    """
    base = schema if root is None else root
    try:
        return _Coercer(_schemas(base)).coerce(schema, value, frozenset())
    except Exception:  # noqa: BLE001 - best effort by contract; check() reports what is left
        try:
            return _copy(value)
        except RecursionError:
            return value


# --------------------------------------------------------------------------- describe


_FORMAT_TEXT = {
    "date": "a date YYYY-MM-DD",
    "date-time": "a date-time YYYY-MM-DDTHH:MM:SS, optionally with a UTC offset such as +08:00 or Z",
    "time": "a time HH:MM:SS, optionally with a UTC offset such as +08:00 or Z",
    "email": "an email address such as name@example.com",
    "uuid": "a UUID such as 123e4567-e89b-12d3-a456-426614174000",
    "uri": "an absolute URI such as https://example.com/path",
    "ipv4": "an IPv4 address such as 192.0.2.1",
    "ipv6": "an IPv6 address such as 2001:db8::1",
}
_DESCRIBED_KEYWORDS = frozenset(
    {
        "type", "enum", "const", "format", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum",
        "multipleOf", "minLength", "maxLength", "pattern", "minItems", "maxItems", "uniqueItems", "anyOf", "oneOf",
    }
)  # fmt: skip
_MAX_DESCRIBED_MEMBERS = 20
_ANNOTATIONS = frozenset({"$ref", "title", "description", "default", "examples", "$comment", "deprecated"})
_MAX_DESCRIBE_DEPTH = 3


def _number_text(number: Any) -> str:
    if isinstance(number, float) and number.is_integer() and abs(number) < 2**53:
        return str(int(number))
    return str(number)


def _bounds_text(schema: dict[str, Any]) -> str:
    def number(key: str) -> Any:
        found = schema.get(key)
        return found if isinstance(found, (int, float)) and not isinstance(found, bool) else None

    low, low_open = number("exclusiveMinimum"), True
    if low is None:
        low, low_open = number("minimum"), False
    high, high_open = number("exclusiveMaximum"), True
    if high is None:
        high, high_open = number("maximum"), False
    if low is not None and high is not None and not low_open and not high_open:
        text = f" between {_number_text(low)} and {_number_text(high)}"
    else:
        parts = []
        if low is not None:
            parts.append(f"{'greater than' if low_open else 'at least'} {_number_text(low)}")
        if high is not None:
            parts.append(f"{'less than' if high_open else 'at most'} {_number_text(high)}")
        text = (" " + " and ".join(parts)) if parts else ""
    if number("multipleOf") is not None:
        text += f" that is a multiple of {_number_text(schema['multipleOf'])}"
    return text


def _count_text(schema: dict[str, Any], low_key: str, high_key: str, noun: str) -> str:
    low, high = schema.get(low_key), schema.get(high_key)
    low = low if isinstance(low, int) and not isinstance(low, bool) and low > 0 else None
    high = high if isinstance(high, int) and not isinstance(high, bool) else None

    def plural(count: int) -> str:
        return noun if count == 1 else f"{noun}s"

    if low is not None and high is not None:
        return f"{low} {plural(low)}" if low == high else f"{low} to {high} {plural(high)}"
    if low is not None:
        return f"at least {low} {plural(low)}"
    if high is not None:
        return f"at most {high} {plural(high)}"
    return ""


class _Describer:
    """Human text for what a (sub)schema accepts: ``"an integer between 1 and 10"``."""

    def __init__(self, schemas: _Schemas):
        self.schemas = schemas

    def describe(self, schema: Any, depth: int = 0, active: frozenset[str] = frozenset()) -> str:
        if schema is True or schema == {}:
            return "any value"
        if schema is False:
            return "no value at all"
        if not isinstance(schema, dict):
            return "any value"
        if depth > _MAX_DESCRIBE_DEPTH:
            return "a value of the documented shape"
        ref = schema.get("$ref")
        if isinstance(ref, str) and ref not in active:
            target = self.schemas.resolve(ref)
            if isinstance(target, (dict, bool)):
                if not set(schema) - _ANNOTATIONS:
                    return self.describe(target, depth, active | {ref})
        if "const" in schema:
            return f"exactly {_literal(schema['const'])}"
        enum = schema.get("enum")
        if isinstance(enum, list) and enum:
            shown = ", ".join(_literal(m) for m in enum[:_MAX_DESCRIBED_MEMBERS])
            more = f" (and {len(enum) - _MAX_DESCRIBED_MEMBERS} more)" if len(enum) > _MAX_DESCRIBED_MEMBERS else ""
            return f"exactly {shown}" if len(enum) == 1 else f"one of {shown}{more}"
        alternatives = self._alternatives(schema, depth, active)
        types = _declared_types(schema) or _inferred_types(schema)
        if alternatives and not types:
            return alternatives
        texts = [self._type_text(kind, schema, depth, active) for kind in types]
        if not texts and isinstance(schema.get("format"), str):
            texts = [self._string_text(schema)]
        if not texts and isinstance(ref, str):
            target = self.schemas.resolve(ref)
            if isinstance(target, (dict, bool)) and ref not in active:
                return self.describe(target, depth, active | {ref})
        text = " or ".join(dict.fromkeys(t for t in texts if t))
        if alternatives:
            return f"{text}, {alternatives}" if text else alternatives
        return text or "any value"

    def _alternatives(self, schema: dict[str, Any], depth: int, active: frozenset[str]) -> str:
        for keyword in ("anyOf", "oneOf"):
            branches = schema.get(keyword)
            if not isinstance(branches, list) or not branches:
                continue
            texts = [self.describe(b, depth + 1, active) for b in branches if not _is_null_only(b)]
            text = " or ".join(dict.fromkeys(texts))
            if any(_is_null_only(b) for b in branches):
                text = f"{text} or null" if text else "null"
            return text
        return ""

    def _type_text(self, kind: str, schema: dict[str, Any], depth: int, active: frozenset[str]) -> str:
        if kind == "integer":
            return "an integer" + _bounds_text(schema)
        if kind == "number":
            return "a number" + _bounds_text(schema)
        if kind == "boolean":
            return "true or false"
        if kind == "null":
            return "null"
        if kind == "string":
            return self._string_text(schema)
        if kind == "array":
            return self._array_text(schema, depth, active)
        if kind == "object":
            return self._object_text(schema, depth, active)
        return f"a value of type {kind!r}"

    @staticmethod
    def _string_text(schema: dict[str, Any]) -> str:
        fmt = schema.get("format")
        if isinstance(fmt, str):
            text = _FORMAT_TEXT.get(fmt, f"a string in the {fmt!r} format")
        else:
            text = "a string"
        count = _count_text(schema, "minLength", "maxLength", "character")
        if count:
            text += f" of {count}"
        pattern = schema.get("pattern")
        if isinstance(pattern, str):
            text += f" matching the regular expression {pattern}"
        return text

    def _array_text(self, schema: dict[str, Any], depth: int, active: frozenset[str]) -> str:
        text = "a list"
        items = schema.get("items")
        if isinstance(items, dict) and items:
            text += f" (each item {self.describe(items, depth + 1, active)})"
        count = _count_text(schema, "minItems", "maxItems", "item")
        if count:
            text += f" of {count}"
        if schema.get("uniqueItems") is True:
            text += " with no duplicates"
        return text

    def _object_text(self, schema: dict[str, Any], depth: int, active: frozenset[str]) -> str:
        properties = schema.get("properties")
        required = schema.get("required") if isinstance(schema.get("required"), list) else []
        names = list(properties) if isinstance(properties, dict) else []
        names += [r for r in required if isinstance(r, str) and r not in names]
        if not names:
            return "an object"
        shown = [f"{name} (required)" if name in required else name for name in names[:_MAX_DESCRIBED_MEMBERS]]
        more = f" (and {len(names) - _MAX_DESCRIBED_MEMBERS} more)" if len(names) > _MAX_DESCRIBED_MEMBERS else ""
        return f"an object with keys {', '.join(shown)}{more}"


# --------------------------------------------------------------------------- check


class _Checker:
    def __init__(self, schemas: _Schemas, value: Any):
        self.schemas = schemas
        self.describer = _Describer(schemas)
        self.null_required: dict[_Path, Any] = {}
        self._find_required_nulls(schemas.root, value, (), frozenset(), 0)
        self.found: list[tuple[_Path, str, str, bool]] = []

    def _find_required_nulls(self, schema: Any, value: Any, path: _Path, active: frozenset[str], depth: int) -> None:
        """Paths of required properties given as null where null is not allowed -> their schema."""
        if not isinstance(schema, dict) or depth > MAX_NESTING:
            return
        ref = schema.get("$ref")
        if isinstance(ref, str) and ref not in active:
            self._find_required_nulls(self.schemas.resolve(ref), value, path, active | {ref}, depth)
        for keyword in ("allOf", "anyOf", "oneOf"):
            for branch in schema.get(keyword) or []:
                self._find_required_nulls(branch, value, path, active, depth)
        if isinstance(value, dict):
            properties = schema.get("properties") if isinstance(schema.get("properties"), dict) else {}
            for name in schema.get("required") or []:
                if isinstance(name, str) and name in value and value[name] is None:
                    subschema = properties.get(name, True)
                    if not self.schemas.allows_null(subschema):
                        self.null_required[path + (name,)] = subschema
            for name, item in value.items():
                if name in properties and item is not None:
                    self._find_required_nulls(properties[name], item, path + (name,), frozenset(), depth + 1)
        elif isinstance(value, list):
            prefix = schema.get("prefixItems") if isinstance(schema.get("prefixItems"), list) else []
            items = schema.get("items")
            for index, item in enumerate(value):
                subschema = prefix[index] if index < len(prefix) else items
                self._find_required_nulls(subschema, item, path + (index,), frozenset(), depth + 1)

    def add(self, path: _Path, expected: str, received: str, missing: bool) -> None:
        self.found.append((path, expected, received, missing))

    def collect(self, error: SchemaValidationError) -> None:
        path = tuple(error.absolute_path)
        keyword = error.validator
        instance = error.instance
        if instance is None and path in self.null_required:
            expected = self.describer.describe(self.null_required[path])
            self.add(path, f"{expected} (required)", "null", True)
            return
        if keyword in ("anyOf", "oneOf") and error.context:
            branch_errors: dict[Any, list[SchemaValidationError]] = {}
            for sub in error.context:
                branch_errors.setdefault(sub.relative_schema_path[0], []).append(sub)
            live = [errors for errors in branch_errors.values() if not _rules_out_branch(errors)]
            if len(live) == 1:
                for sub in live[0]:
                    self.collect(sub)
                return
        if keyword == "required" and isinstance(instance, dict):
            for name in error.validator_value:
                if isinstance(name, str) and name not in instance:
                    self.add(path + (name,), _MISSING_EXPECTED, _MISSING_RECEIVED, True)
            return
        if keyword == "dependentRequired" and isinstance(instance, dict):
            for name, needed in error.validator_value.items():
                if name in instance:
                    for other in needed:
                        if other not in instance:
                            expected = f"a value (required when {name} is given)"
                            self.add(path + (other,), expected, _MISSING_RECEIVED, True)
            return
        if keyword in ("additionalProperties", "unevaluatedProperties") and error.validator_value is False:
            if isinstance(instance, dict):
                self._unexpected_keys(error.schema, instance, path, unevaluated=keyword == "unevaluatedProperties")
                return
        if path == () and keyword == "type" and _declared_types(error.schema) == ["object"]:
            self.add(path, "a JSON object", _show(instance), False)
            return
        if keyword == "oneOf" and not error.context:
            expected = f"exactly one of: {self.describer.describe(error.schema)} (it matches more than one)"
        else:
            expected = self.describer.describe(error.schema)
            if keyword not in _DESCRIBED_KEYWORDS:
                expected = f"{expected} ({error.message[:RECEIVED_MAX_CHARS]})"
        self.add(path, expected, _show(instance), False)

    def _unexpected_keys(
        self, schema: dict[str, Any], instance: dict[str, Any], path: _Path, *, unevaluated: bool
    ) -> None:
        known = self._known_properties(schema, unevaluated, frozenset())
        patterns = schema.get("patternProperties") if isinstance(schema.get("patternProperties"), dict) else {}
        names = ", ".join(known) if known else None
        noun = "argument" if not path else "key"
        expected = (
            f"no such {noun}; the {noun}s are: {names}" if names else f"no such {noun}; this takes no {noun}s"
        )
        for key in instance:
            if key not in known and not any(_pattern_matches(p, key) for p in patterns):
                self.add(path + (key,), expected, _show(instance[key]), False)

    def _known_properties(self, schema: Any, deep: bool, active: frozenset[str]) -> list[str]:
        """Property names ``schema`` declares (with ``deep``, also in its in-place subschemas)."""
        if not isinstance(schema, dict):
            return []
        names = list(schema["properties"]) if isinstance(schema.get("properties"), dict) else []
        if deep:
            ref = schema.get("$ref")
            if isinstance(ref, str) and ref not in active:
                names += self._known_properties(self.schemas.resolve(ref), deep, active | {ref})
            for keyword in ("allOf", "anyOf", "oneOf"):
                for branch in schema.get(keyword) or []:
                    names += self._known_properties(branch, deep, active)
            for keyword in ("then", "else"):
                names += self._known_properties(schema.get(keyword), deep, active)
        return list(dict.fromkeys(names))

    def problems(self) -> list[Problem]:
        unique = dict.fromkeys(self.found)
        ordered = sorted(unique, key=lambda p: (_path_sort_key(p[0]), not p[3], p[1], p[2]))
        return [
            {"field": _field(path), "expected": expected, "received": received, "missing": missing}
            for path, expected, received, missing in ordered
        ]


def _rules_out_branch(errors: list[SchemaValidationError]) -> bool:
    """Whether a failed ``anyOf``/``oneOf`` branch is plainly not the one meant: the value has
    the wrong type for it, or a ``const``/``enum`` discriminator does not match."""
    for error in errors:
        depth = len(error.relative_path)
        if error.validator == "type" and depth == 0:
            return True
        if error.validator == "enum" and depth == 0:
            return True
        if error.validator == "const" and depth <= 1:
            return True
        if error.validator is None or error.validator == "false":
            return True
    return False


def _path_sort_key(path: _Path) -> tuple[tuple[int, Any], ...]:
    return tuple((0, part) if isinstance(part, int) else (1, str(part)) for part in path)


def check(schema: dict, value: Any) -> list[Problem]:
    """Validate ``value`` against ``schema`` (structure and formats) and list what is wrong.

    Validation is ``jsonschema``'s ``Draft202012Validator`` with format checks for at least
    ``date`` (a real calendar date: ``2024-13-45`` fails), ``date-time``, ``time``, ``email``,
    ``uuid``, ``uri``, ``ipv4``, ``ipv6``. A failed ``anyOf``/``oneOf`` is reported inside
    the one branch the value was plainly meant for (right type, matching ``const``), else as
    the whole set of alternatives.

    Args:
        schema: a JSON Schema object that passed :func:`check_schema`.
        value: any JSON value.

    Returns:
        Problems sorted by field path (missing ones first within a field), each
        ``{"field": str, "expected": str, "received": str, "missing": bool}``:

        - ``field``: dotted path (``address.street``, ``tags.2``) or ``"(arguments)"``;
        - ``expected``: what would be accepted, e.g. ``"an integer between 1 and 10"``,
          ``"one of 'red', 'green'"``, ``"a date YYYY-MM-DD"``, ``"a value (required)"``,
          ``"no such argument; the arguments are: a, b"``;
        - ``received``: what came (strings quoted, the rest as JSON), at most 200 characters,
          ``"nothing (missing)"`` for an absent property;
        - ``missing``: true for a required property that is absent, or null where null is not
          allowed (the agent should ask the user rather than retry the call).

        Empty when ``value`` is valid.
    """
    schemas = _schemas(schema)
    checker = _Checker(schemas, value)
    for error in schemas.validator.iter_errors(value):
        checker.collect(error)
    return checker.problems()


# --------------------------------------------------------------------------- schemas


_IN_PLACE_LISTS = ("allOf", "anyOf", "oneOf")
_IN_PLACE_SINGLE = ("not", "if", "then", "else")
_CHILD_MAPS = ("properties", "patternProperties", "dependentSchemas", "$defs", "definitions")
_CHILD_SINGLE = (
    "items", "additionalProperties", "unevaluatedProperties", "unevaluatedItems", "contains", "propertyNames",
)  # fmt: skip
_CHILD_LISTS = ("prefixItems",)


def _subschemas(schema: dict[str, Any]) -> Iterable[tuple[str, Any]]:
    """``(where, subschema)`` for every subschema directly inside ``schema``."""
    for keyword in _CHILD_MAPS:
        mapping = schema.get(keyword)
        if isinstance(mapping, dict):
            for name, sub in mapping.items():
                yield f"{keyword}/{name}", sub
    for keyword in _CHILD_SINGLE + _IN_PLACE_SINGLE:
        if keyword in schema:
            yield keyword, schema[keyword]
    for keyword in _CHILD_LISTS + _IN_PLACE_LISTS:
        branches = schema.get(keyword)
        if isinstance(branches, list):
            for index, sub in enumerate(branches):
                yield f"{keyword}/{index}", sub


def check_schema(schema: dict) -> None:
    """Refuse a tool parameter schema that cannot be used to check arguments.

    Checks: a valid draft 2020-12 JSON Schema (``Draft202012Validator.check_schema``,
    including regular expressions); ``"type": "object"`` at the top (arguments are a JSON
    object); every ``$ref`` local (``#...``; nothing is fetched) and resolvable; no cycle of
    ``$ref``/``allOf``/``anyOf``/``oneOf``/``not``/``if``/``then``/``else`` that never steps
    into a property or item (validation would recurse forever).

    Args:
        schema: the JSON Schema for a tool's parameters.

    Raises:
        ToolRegistrationError: what is wrong and where (a JSON Pointer into the schema).
    """
    if not isinstance(schema, dict):
        raise ToolRegistrationError(f"a parameters schema must be a JSON object, got {type(schema).__name__}")
    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError as err:
        where = "/".join(str(p) for p in err.absolute_path)
        raise ToolRegistrationError(f"invalid JSON Schema at #/{where}: {err.message}") from None
    if schema.get("type") != "object":
        raise ToolRegistrationError(
            f'a parameters schema must have "type": "object" at the top (tool arguments are a JSON object), '
            f"got type {schema.get('type')!r}"
        )
    schemas = _Schemas(schema)

    def visit(node: Any, where: str) -> None:
        if not isinstance(node, dict):
            return
        ref = node.get("$ref")
        if isinstance(ref, str):
            if not ref.startswith("#"):
                raise ToolRegistrationError(
                    f"$ref {ref!r} at #{where} is not local; only '#/...' references are supported"
                )
            if schemas.resolve(ref) is None:
                raise ToolRegistrationError(f"$ref {ref!r} at #{where} does not resolve within the schema")
        for name, sub in _subschemas(node):
            visit(sub, f"{where}/{name}")

    visit(schema, "")

    # A cycle through in-place applicators only (those keep validating the same value), found
    # by a depth-first search over every subschema along those edges alone.
    nodes: list[dict[str, Any]] = []
    seen: set[int] = set()
    pending: list[Any] = [schema]
    while pending:
        node = pending.pop()
        if isinstance(node, dict) and id(node) not in seen:
            seen.add(id(node))
            nodes.append(node)
            pending.extend(sub for _, sub in _subschemas(node))

    def in_place(node: dict[str, Any]) -> Iterable[Any]:
        ref = node.get("$ref")
        if isinstance(ref, str):
            yield schemas.resolve(ref)
        for keyword in _IN_PLACE_LISTS:
            yield from node.get(keyword) or []
        for keyword in _IN_PLACE_SINGLE:
            yield node.get(keyword)
        dependent = node.get("dependentSchemas")
        if isinstance(dependent, dict):
            yield from dependent.values()

    state: dict[int, int] = {}  # 1 = on the search path, 2 = finished

    def search(node: Any) -> None:
        if not isinstance(node, dict) or state.get(id(node)) == 2:
            return
        if state.get(id(node)) == 1:
            raise ToolRegistrationError(
                "the schema refers back to itself through $ref/allOf/anyOf/oneOf/not/if without stepping "
                "into a property or item; validation would never end"
            )
        state[id(node)] = 1
        for nxt in in_place(node):
            search(nxt)
        state[id(node)] = 2

    for node in nodes:
        search(node)


# --------------------------------------------------------------------------- pipeline


def _argument_problem(expected: str, received: Any) -> Problem:
    return {"field": ARGUMENTS_FIELD, "expected": expected, "received": _show(received), "missing": False}


def _normalise_top_level(arguments: Any) -> tuple[dict[str, Any] | None, Problem | None]:
    if arguments is None:
        return {}, None
    if isinstance(arguments, dict):
        return arguments, None
    if isinstance(arguments, str):
        text = arguments.strip()
        if not text:
            return {}, None  # providers send "" for a call without arguments
        try:
            decoded = scalars.loads_json(text)
        except (ValueError, RecursionError):
            return None, _argument_problem("a JSON object (the text is not valid JSON)", arguments)
        if decoded is None:
            return {}, None
        if isinstance(decoded, dict):
            return decoded, None
        return None, _argument_problem("a JSON object", decoded)
    return None, _argument_problem("a JSON object", arguments)


def _apply_defaults(schema: dict[str, Any], arguments: dict[str, Any], schemas: _Schemas) -> None:
    properties = schema.get("properties")
    if not isinstance(properties, dict):
        return
    required = set(schema.get("required") or [])
    for name, subschema in properties.items():
        if name in arguments or name in required or not isinstance(subschema, dict):
            continue
        if "default" in subschema:
            arguments[name] = _copy(subschema["default"])
            continue
        ref = subschema.get("$ref")
        target = schemas.resolve(ref) if isinstance(ref, str) else None
        if isinstance(target, dict) and "default" in target:
            arguments[name] = _copy(target["default"])


def argument_descriptions(schema: dict[str, Any], names: Iterable[str]) -> dict[str, str | None]:
    """The ``description`` of each named top-level property of ``schema`` (None where it
    has none), in the order of ``names``: what to ask a user for a missing argument."""
    properties = schema.get("properties") if isinstance(schema, dict) else None
    properties = properties if isinstance(properties, dict) else {}
    found: dict[str, str | None] = {}
    for name in names:
        prop = properties.get(name)
        description = prop.get("description") if isinstance(prop, dict) else None
        found[name] = description if isinstance(description, str) and description else None
    return found


def normalize_arguments(tool_name: str, arguments: Any) -> dict[str, Any]:
    """The arguments object a model meant: ``None`` or ``""`` -> ``{}``; text holding a JSON
    object (or ``null``) -> that object; a dict as it is.

    Raises:
        ToolArgumentsError: anything else, or an object nested deeper than ``MAX_NESTING``
            (a problem at ``"(arguments)"``).
    """
    normalised, problem = _normalise_top_level(arguments)
    if problem is not None or normalised is None:
        raise ToolArgumentsError(tool_name, [problem or _argument_problem("a JSON object", arguments)])
    if _nesting(normalised, MAX_NESTING) > MAX_NESTING:
        expected = f"a JSON object nested at most {MAX_NESTING} levels deep"
        raise ToolArgumentsError(tool_name, [_argument_problem(expected, "(too deep to show)")])
    return normalised


def validate_arguments(tool_name: str, schema: dict, arguments: Any) -> dict:
    """Turn what a model sent into valid arguments for a schema-only tool, or say what is wrong.

    Steps: the top level is normalised (``None`` or ``""`` -> ``{}``; text holding a JSON
    object -> that object; anything else is a problem at ``"(arguments)"``), then
    :func:`coerce`, :func:`check`, and finally the ``default`` of each absent optional
    top-level property is filled in.

    Args:
        tool_name: the tool's name, for the error.
        schema: its parameters schema, which passed :func:`check_schema`.
        arguments: the model's arguments: a dict, JSON text, or anything a provider produced.

    Returns:
        A new dict of valid arguments (the input is not mutated).

    Raises:
        ToolArgumentsError: ``problems`` lists every remaining problem (see :func:`check`);
            never empty.
    """
    coerced = coerce(schema, normalize_arguments(tool_name, arguments))
    if not isinstance(coerced, dict):  # coerce keeps an object an object; be explicit anyway
        raise ToolArgumentsError(tool_name, [_argument_problem("a JSON object", coerced)])
    problems = check(schema, coerced)
    if problems:
        raise ToolArgumentsError(tool_name, problems)
    _apply_defaults(schema, coerced, _schemas(schema))
    return coerced


# --------------------------------------------------------------------------- pydantic


_PYDANTIC_SHOULD_RE = re.compile(r"^(\w+) should (be|have|match) (.*)$", re.DOTALL)
_PYDANTIC_TAGS = frozenset(
    {
        "int", "str", "float", "bool", "bytes", "none", "list", "dict", "tuple", "set", "frozenset", "date",
        "datetime", "time", "timedelta", "decimal", "uuid", "url", "multi-host-url", "json", "is-instance",
        "is-subclass", "callable", "enum", "generator", "complex",
    }
)  # fmt: skip
"""pydantic-core's names for union members, which it puts in an error's ``loc``."""


def _pydantic_expected(message: str) -> str:
    """``"Input should be a valid integer"`` -> ``"a valid integer"``."""
    match = _PYDANTIC_SHOULD_RE.match(message)
    if not match:
        return message
    noun, verb, rest = match.groups()
    subject = "a value" if noun == "Input" else f"a {noun.lower()}"
    if verb == "be":
        return rest
    if verb == "have":
        return f"{subject} with {rest}"
    return f"{subject} matching {rest}"


def _is_union_tag(part: Any) -> bool:
    return isinstance(part, str) and ("[" in part or part in _PYDANTIC_TAGS)


def problems_from_pydantic(err: pydantic.ValidationError) -> list[Problem]:
    """The problems in a pydantic validation error, in the shape :func:`check` returns.

    A ``missing`` error, or an error whose input is ``None`` for a field (null where the field
    does not allow it), is marked ``missing=True``. Union-member tags pydantic adds to ``loc``
    (``x.int``, ``x.str``) are folded into one problem for the field, whose ``expected``
    joins the alternatives with "or".

    Args:
        err: the error from ``Model.model_validate(arguments)``.

    Returns:
        Problems sorted by field path, each ``{"field", "expected", "received", "missing"}``.
    """
    errors = err.errors(include_url=False)
    # Group errors that differ only in a trailing union tag and share an input.
    grouped: dict[tuple[_Path, str], list[dict[str, Any]]] = {}
    order: list[tuple[_Path, str]] = []
    for error in errors:
        loc = tuple(error.get("loc") or ())
        if len(loc) > 1 and _is_union_tag(loc[-1]) and error.get("type") not in ("missing", "extra_forbidden"):
            key = (tuple(p for p in loc if not _is_union_tag(p)), _show(error.get("input")))
        else:
            key = (loc, f"#{len(order)}")
        if key not in grouped:
            grouped[key] = []
            order.append(key)
        grouped[key].append(error)
    found: list[tuple[_Path, str, str, bool]] = []
    for key in order:
        group = grouped[key]
        path = tuple(p for p in key[0] if not _is_union_tag(p)) if len(group) > 1 else tuple(group[0].get("loc") or ())
        first = group[0]
        if first.get("type") == "missing":
            found.append((path, _MISSING_EXPECTED, _MISSING_RECEIVED, True))
            continue
        expected = " or ".join(dict.fromkeys(_pydantic_expected(str(e.get("msg", ""))) for e in group))
        if first.get("type") == "extra_forbidden":
            expected = "no such argument" if len(path) <= 1 else "no such key"
        if "input" in first and first["input"] is None and path and isinstance(path[-1], str):
            # null for a field that does not allow it: ask for it like a missing one (a null
            # list item is just a wrong value).
            found.append((path, f"{expected} (required)", "null", True))
            continue
        found.append((path, expected, _show(first.get("input")), False))
    unique = dict.fromkeys(found)
    ordered = sorted(unique, key=lambda p: (_path_sort_key(p[0]), not p[3], p[1], p[2]))
    return [
        {"field": _field(path), "expected": expected, "received": received, "missing": missing}
        for path, expected, received, missing in ordered
    ]


def missing_fields(problems: Iterable[Problem]) -> list[str]:
    """The fields of the problems marked ``missing``, in order, each once.

    Args:
        problems: from :func:`check`, :func:`problems_from_pydantic` or a
            ``ToolArgumentsError``.

    Returns:
        Dotted field paths, e.g. ``["city", "address.street"]``.
    """
    return list(dict.fromkeys(p["field"] for p in problems if p.get("missing")))
