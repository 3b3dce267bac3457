"""Secrets kept out of log lines (issue 17).

Values resolved from ``${NAME}`` for MCP servers (env, URL, headers) and for tool files'
HTTP tools are masked in what Hermes keeps (results, errors: :func:`hermes.mcp.config.redact`,
:meth:`hermes.tools.http.HttpTool`), but libraries log them too: ``httpx`` logs every
request's URL at INFO (``HTTP Request: POST http://host/t/<token>/mcp``), the ``mcp``
client logs whole messages at DEBUG, a server's own answer may quote its token. So the
secrets a worker resolves are registered here (:func:`register`), and :func:`install`
wraps the process' log-record factory once: every record, from any logger, has its
message, its exception text and its stack masked when it is made, before any handler
(a file, the console, an OpenTelemetry exporter, pytest's capture) sees it.

A record is formatted eagerly only when secrets are registered; without any the factory
is the standard one.
"""

from __future__ import annotations

import logging
import threading
import urllib.parse
from collections.abc import Iterable, Sequence
from typing import Any

REDACTED = "***"
MIN_SECRET_CHARS = 4
"""Shorter values ("1", "on") are not masked: they cannot be a credential, and masking
them would garble every line that holds the character."""

_LOCK = threading.Lock()
_FORMS: tuple[str, ...] = ()
_INSTALLED = False


def secret_forms(secrets: Iterable[str], *, min_chars: int = MIN_SECRET_CHARS) -> list[str]:
    """Every form in which ``secrets`` come back in a text, longest first: as they are and
    percent-encoded (a server that echoes the URL it was called with, ``/mcp/tok%2B1``),
    each form once (a secret containing another is masked whole).

    Args:
        secrets: resolved values.
        min_chars: shorter values are left out (default :data:`MIN_SECRET_CHARS`; a
            caller that filtered its values already passes 1).

    Returns:
        The forms, sorted by length (longest first), then text.
    """
    forms: set[str] = set()
    for secret in secrets:
        if len(secret) < max(1, min_chars):
            continue
        forms.add(secret)
        forms.add(urllib.parse.quote(secret, safe=""))
        forms.add(urllib.parse.quote(secret, safe="/"))
        forms.add(urllib.parse.quote_plus(secret))
    return sorted(forms, key=lambda s: (-len(s), s))


def mask_text(text: str, forms: Iterable[str]) -> str:
    """``text`` with every one of ``forms`` (see :func:`secret_forms`) replaced by ``***``."""
    for form in forms:
        if form in text:
            text = text.replace(form, REDACTED)
    return text


def mask_value(value: Any, forms: Sequence[str]) -> Any:
    """``value`` with every one of ``forms`` masked in its strings, nested in dicts (keys
    too), lists and tuples; other values as they are."""
    if not forms:
        return value
    if isinstance(value, str):
        return mask_text(value, forms)
    if isinstance(value, dict):
        return {mask_value(k, forms): mask_value(v, forms) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(mask_value(v, forms) for v in value)
    return value


def register(secrets: Iterable[str]) -> None:
    """Mask ``secrets`` (resolved values) in every log record from now on, and install the
    record factory if it is not yet (see the module docstring)."""
    global _FORMS
    new = set(secret_forms(secrets))
    if not new:
        return
    with _LOCK:
        if new <= set(_FORMS):
            return
        _FORMS = tuple(sorted(set(_FORMS) | new, key=lambda s: (-len(s), s)))
    install()


def registered() -> tuple[str, ...]:
    """The forms masked in log records now (longest first)."""
    return _FORMS


def mask(text: str) -> str:
    """``text`` with every registered secret masked."""
    return mask_text(text, _FORMS) if _FORMS else text


def install() -> None:
    """Wrap the log-record factory (once per process) so records are masked when made."""
    global _INSTALLED
    with _LOCK:
        if _INSTALLED:
            return
        previous = logging.getLogRecordFactory()

        def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
            record = previous(*args, **kwargs)
            forms = _FORMS
            if forms:
                _mask_record(record, forms)
            return record

        logging.setLogRecordFactory(factory)
        _INSTALLED = True


_FORMATTER = logging.Formatter()


def _mask_record(record: logging.LogRecord, forms: tuple[str, ...]) -> None:
    try:
        message = record.getMessage()
    except Exception:  # noqa: BLE001 - a bad format string is the handler's to report
        return
    masked = mask_text(message, forms)
    if masked != message:
        record.msg, record.args = masked, None
    if record.exc_info and not record.exc_text:
        record.exc_text = mask_text(_FORMATTER.formatException(record.exc_info), forms)
    if record.stack_info:
        record.stack_info = mask_text(record.stack_info, forms)
