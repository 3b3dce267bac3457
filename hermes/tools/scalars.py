"""Loose scalar values: what a model's text means as a number, a boolean, a date or time.

The scalar half of :mod:`hermes.tools.arguments`' coercion, which knows nothing of
schemas: parsers that turn what a model sent (``"42"``, ``"yes"``, ``"March 5, 2024"``,
``"3pm UTC+8"``) into the JSON value a schema asks for, or :data:`FAIL` when that would
be a guess (see the rules in :mod:`hermes.tools.arguments`), and the ``format``
checker (:data:`FORMAT_CHECKER`) of draft 2020-12 with RFC 3339 dates and times.
"""

from __future__ import annotations

import ipaddress
import json
import math
import re
import unicodedata
import uuid
from collections.abc import Callable
from datetime import date
from decimal import Decimal, InvalidOperation
from typing import Any

from jsonschema import FormatChecker

__all__ = [
    "FAIL",
    "FORMAT_CHECKER",
    "FORMAT_NORMALISERS",
    "FORMAT_TESTS",
    "loads_json",
    "nfkc",
    "parse_decimal",
    "to_boolean",
    "to_integer",
    "to_number",
    "to_text",
]


# --------------------------------------------------------------------------- formats


_DATE_RE = re.compile(r"(\d{4})-(\d{2})-(\d{2})", re.ASCII)
_TIME_RE = re.compile(r"(\d{2}):(\d{2}):(\d{2})(?:\.\d{1,9})?(?:[Zz]|[+-](\d{2}):(\d{2}))?", re.ASCII)
_UUID_RE = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}", re.ASCII)
_EMAIL_RE = re.compile(r"[^@\s]+@[^@\s]+")
_URI_RE = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*:[^\s\x00-\x1f\x7f<>\"{}|\\^`]*")


def _is_date(text: str) -> bool:
    match = _DATE_RE.fullmatch(text)
    if not match:
        return False
    try:
        date(*(int(g) for g in match.groups()))
    except ValueError:
        return False
    return True


def _is_time(text: str) -> bool:
    match = _TIME_RE.fullmatch(text)
    if not match:
        return False
    hour, minute, second, offset_hour, offset_minute = match.groups()
    if int(hour) > 23 or int(minute) > 59 or int(second) > 59:
        return False
    return offset_hour is None or (int(offset_hour) <= 23 and int(offset_minute) <= 59)


def _is_date_time(text: str) -> bool:
    return len(text) > 11 and text[10] in "Tt" and _is_date(text[:10]) and _is_time(text[11:])


def _is_uuid(text: str) -> bool:
    return bool(_UUID_RE.fullmatch(text))


def _is_email(text: str) -> bool:
    return bool(_EMAIL_RE.fullmatch(text))


def _is_uri(text: str) -> bool:
    return bool(_URI_RE.fullmatch(text))


def _is_ip(kind: type) -> Callable[[str], bool]:
    def checker(text: str) -> bool:
        try:
            kind(text)
        except ValueError:
            return False
        return True

    return checker


FORMAT_TESTS: dict[str, Callable[[str], bool]] = {
    "date": _is_date,
    "date-time": _is_date_time,
    "time": _is_time,
    "uuid": _is_uuid,
    "email": _is_email,
    "uri": _is_uri,
    "ipv4": _is_ip(ipaddress.IPv4Address),
    "ipv6": _is_ip(ipaddress.IPv6Address),
}


def _format_checker() -> FormatChecker:
    """jsonschema's own checks, with ours for the formats tools use most.

    Ours replace jsonschema's because its ``date-time``/``time`` need an optional package
    and require an offset, and its ``email``/``uri`` checks are missing or minimal.
    """
    checker = FormatChecker()
    for name, test in FORMAT_TESTS.items():
        checker.checks(name)(lambda instance, _test=test: not isinstance(instance, str) or _test(instance))
    return checker


FORMAT_CHECKER = _format_checker()


# --------------------------------------------------------------------------- loose parsing


_NUMBER_RE = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?", re.ASCII)
_INTEGER_TEXT_RE = re.compile(r"[+-]?\d+", re.ASCII)
_TRUE_WORDS = frozenset({"true", "yes", "on", "1"})
_FALSE_WORDS = frozenset({"false", "no", "off", "0"})
FAIL = object()
"""A conversion that did not apply."""


def nfkc(text: str) -> str:
    """``text`` in Unicode NFKC form, stripped (full-width "２０２４" becomes "2024")."""
    # Full-width digits and letters ("２０２４年３月５日") are common from CJK input methods.
    return unicodedata.normalize("NFKC", text).strip()


def parse_decimal(text: str) -> Decimal | None:
    """A plain decimal or scientific number, exactly; ``None`` for anything else."""
    text = nfkc(text)
    if len(text) > 400 or not _NUMBER_RE.fullmatch(text):
        return None
    try:
        number = Decimal(text)
    except InvalidOperation:
        return None
    if number and abs(number.adjusted()) > 400:
        return None
    return number


def _decimal_is_integral(number: Decimal) -> bool:
    _, digits, exponent = number.as_tuple()
    assert isinstance(exponent, int)
    return exponent >= 0 or not any(digits[exponent:])


def to_integer(value: Any) -> Any:
    """An int for an int, an integral finite float or integral number text; else :data:`FAIL`."""
    if isinstance(value, bool):
        return FAIL
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return int(value) if math.isfinite(value) and value.is_integer() else FAIL
    if isinstance(value, str):
        number = parse_decimal(value)
        if number is not None and _decimal_is_integral(number):
            return int(number)
    return FAIL


def to_number(value: Any) -> Any:
    """An int or finite float for a number or number text (exactly, no thousands
    separators, no NaN/Infinity); else :data:`FAIL`. Booleans are not numbers."""
    if isinstance(value, bool):
        return FAIL
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else FAIL
    if isinstance(value, str):
        number = parse_decimal(value)
        if number is None:
            return FAIL
        if _INTEGER_TEXT_RE.fullmatch(nfkc(value)):
            return int(number)
        result = float(number)
        if not math.isfinite(result) or (result == 0 and number != 0):
            return FAIL
        return result
    return FAIL


def to_boolean(value: Any) -> Any:
    """True/False for a bool, 1/0, or true/yes/on/1 and false/no/off/0 (any case); else :data:`FAIL`."""
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)):
        return {1: True, 0: False}.get(value, FAIL)  # type: ignore[arg-type]
    if isinstance(value, str):
        word = nfkc(value).casefold()
        if word in _TRUE_WORDS:
            return True
        if word in _FALSE_WORDS:
            return False
    return FAIL


def to_text(value: Any) -> Any:
    """The JSON text of a bool or finite number (``42.0`` gives "42"); else :data:`FAIL`."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float) and math.isfinite(value):
        # 42.0 and 42 are the same JSON number; "42" is what the model meant.
        return str(int(value)) if value.is_integer() and abs(value) < 2**53 else repr(value)
    return FAIL


def loads_json(text: str) -> Any:
    """Parse JSON text; NaN/Infinity are refused. Raises ValueError (or RecursionError)."""

    def refuse(constant: str) -> Any:
        raise ValueError(f"{constant} is not JSON")

    return json.loads(text, parse_constant=refuse)


_MONTHS = {
    name: number
    for number, names in enumerate(
        [
            ("january", "jan"),
            ("february", "feb"),
            ("march", "mar"),
            ("april", "apr"),
            ("may",),
            ("june", "jun"),
            ("july", "jul"),
            ("august", "aug"),
            ("september", "sep", "sept"),
            ("october", "oct"),
            ("november", "nov"),
            ("december", "dec"),
        ],
        start=1,
    )
    for name in names
}
_WEEKDAY_PREFIX_RE = re.compile(
    r"^(?:mon|tue|tues|wed|thu|thur|thurs|fri|sat|sun)(?:day|sday|nesday|rsday|urday)?\.?,?\s+", re.IGNORECASE
)
_ORDINAL = r"(?:st|nd|rd|th)?"
_DATE_PATTERNS: list[tuple[re.Pattern[str], str]] = [
    (re.compile(r"(\d{4})([-/.])(\d{1,2})\2(\d{1,2})", re.ASCII), "ymd"),
    (re.compile(r"(\d{4})(\d{2})(\d{2})", re.ASCII), "ymd-compact"),
    (re.compile(r"(\d{4})\s*[年년]\s*(\d{1,2})\s*[月월]\s*(\d{1,2})\s*[日号일]?"), "ymd-cjk"),
    (re.compile(r"(\d{1,2})([-/.])(\d{1,2})\2(\d{4})", re.ASCII), "xxy"),
    (re.compile(rf"(\d{{1,2}}){_ORDINAL}(?:\s+of)?[\s\-]+([A-Za-z]+)\.?,?[\s\-]+(\d{{4}})", re.ASCII), "d-month-y"),
    (re.compile(rf"([A-Za-z]+)\.?[\s\-]+(\d{{1,2}}){_ORDINAL},?[\s\-]+(\d{{4}})", re.ASCII), "month-d-y"),
    (re.compile(r"(\d{4})[\s\-]+([A-Za-z]+)\.?[\s\-]+(\d{1,2})", re.ASCII), "y-month-d"),
]
_MIDNIGHT_RE = re.compile(
    r"(\d{4}-\d{2}-\d{2})[Tt ]00:00(?::00(?:\.0+)?)?(?:[Zz]|[+-]\d{2}:?\d{2})?", re.ASCII
)


def _make_date(year: int, month: int, day: int) -> date | None:
    try:
        return date(year, month, day)
    except ValueError:
        return None


def _parse_date(text: str) -> date | None:
    """A calendar date written in one of the common ways (see the module docstring)."""
    text = _WEEKDAY_PREFIX_RE.sub("", nfkc(text), count=1) if text else text
    midnight = _MIDNIGHT_RE.fullmatch(text)
    if midnight:
        text = midnight.group(1)
    for pattern, kind in _DATE_PATTERNS:
        match = pattern.fullmatch(text)
        if not match:
            continue
        groups = match.groups()
        if kind == "ymd":
            return _make_date(int(groups[0]), int(groups[2]), int(groups[3]))
        if kind in ("ymd-compact", "ymd-cjk"):
            return _make_date(int(groups[0]), int(groups[1]), int(groups[2]))
        if kind == "xxy":
            first, separator, second, year = int(groups[0]), groups[1], int(groups[2]), int(groups[3])
            # US order with slashes; day first with dots and dashes (Europe, Asia).
            month_first, day_first = (first, second), (second, first)
            preferred, other = (month_first, day_first) if separator == "/" else (day_first, month_first)
            return _make_date(year, *preferred) or _make_date(year, *other)
        if kind == "d-month-y":
            month = _MONTHS.get(groups[1].casefold())
            return _make_date(int(groups[2]), month, int(groups[0])) if month else None
        if kind == "month-d-y":
            month = _MONTHS.get(groups[0].casefold())
            return _make_date(int(groups[2]), month, int(groups[1])) if month else None
        if kind == "y-month-d":
            month = _MONTHS.get(groups[1].casefold())
            return _make_date(int(groups[0]), month, int(groups[2])) if month else None
    return None


_LOOSE_TIME_RE = re.compile(
    r"""(?P<hour>\d{1,2})
        (?::(?P<minute>\d{2})(?::(?P<second>\d{2})(?:[.,](?P<fraction>\d{1,9}))?)?)?
        \s*(?P<ampm>[ap]\.?\s?m\.?)?
        \s*(?P<zone>[zZ]|(?:UTC|GMT)?\s*[+-]\d{1,2}(?::?\d{2})?|UTC|GMT)?""",
    re.VERBOSE | re.IGNORECASE | re.ASCII,
)
_OFFSET_RE = re.compile(r"(?:UTC|GMT)?\s*([+-])(\d{1,2}):?(\d{2})?", re.IGNORECASE | re.ASCII)


def _parse_time(text: str) -> str | None:
    """``HH:MM:SS[.f][offset]`` from a loose time ("9:30", "9:30 pm", "21:30:00+0800")."""
    match = _LOOSE_TIME_RE.fullmatch(nfkc(text))
    if not match or (match["minute"] is None and match["ampm"] is None):
        return None
    hour, minute, second = int(match["hour"]), int(match["minute"] or 0), int(match["second"] or 0)
    if match["ampm"]:
        if not 1 <= hour <= 12:
            return None
        hour = hour % 12 + (12 if match["ampm"][0] in "pP" else 0)
    if hour > 23 or minute > 59 or second > 59:
        return None
    zone = match["zone"]
    offset = ""
    if zone:
        zone = zone.strip()
        if zone.upper() in ("Z", "UTC", "GMT"):
            offset = "Z"
        else:
            parts = _OFFSET_RE.fullmatch(zone)
            if not parts:
                return None
            offset_hour, offset_minute = int(parts[2]), int(parts[3] or 0)
            if offset_hour > 23 or offset_minute > 59:
                return None
            offset = f"{parts[1]}{offset_hour:02d}:{offset_minute:02d}"
    fraction = f".{match['fraction']}" if match["fraction"] else ""
    return f"{hour:02d}:{minute:02d}:{second:02d}{fraction}{offset}"


def _normalise_date(text: str) -> str | None:
    parsed = _parse_date(text)
    return parsed.isoformat() if parsed else None


def _normalise_date_time(text: str) -> str | None:
    text = nfkc(text)
    splits: list[tuple[str, str]] = []
    for index, char in enumerate(text):
        if char in "Tt ,_":
            splits.append((text[:index], text[index + 1 :]))
        elif index and text[index - 1] in "日号일":
            splits.append((text[:index], text[index:]))
    for left, right in splits:
        right = re.sub(r"^(?:at\s+|,\s*)", "", right.strip(), flags=re.IGNORECASE)
        day = _parse_date(left.rstrip(" ,"))
        if day is None:
            continue
        clock = _parse_time(right)
        if clock is not None:
            return f"{day.isoformat()}T{clock}"
    return None


def _normalise_uuid(text: str) -> str | None:
    text = nfkc(text)
    if text[:9].casefold() == "urn:uuid:":
        text = text[9:]
    text = text.strip("{}")
    if not re.fullmatch(r"[0-9a-fA-F]{32}|[0-9a-fA-F\-]{36}", text):
        return None
    try:
        return str(uuid.UUID(text))
    except ValueError:
        return None


def _normalise_email(text: str) -> str | None:
    text = text.strip()
    if text[:7].casefold() == "mailto:":
        text = text[7:]
    return text if _is_email(text) else None


def _strip_only(text: str) -> str | None:
    return text.strip()


FORMAT_NORMALISERS: dict[str, Callable[[str], str | None]] = {
    "date": _normalise_date,
    "date-time": _normalise_date_time,
    "time": _parse_time,
    "uuid": _normalise_uuid,
    "email": _normalise_email,
    "uri": _strip_only,
    "ipv4": _strip_only,
    "ipv6": _strip_only,
}
