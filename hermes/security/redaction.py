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

The same factory keeps tool-call content out of log lines (issue 26):

- **Always**, for a request an HTTP tool makes (:func:`request_shown_as`): the HTTP
  libraries' records show the tool's url as written (``GET https://api.example/users/{user}``),
  never the url sent, whose path and query are built from the call's arguments; their
  other records (httpcore's traces: response headers) keep only their event name.
- **With encryption at rest on** (:func:`withhold_content`, switched by
  :func:`hermes.security.encryption.activate`): debug records of the libraries that log whole
  requests and messages (``openai`` its request options, ``mcp`` its JSON-RPC messages,
  ``httpx``/``httpcore``) keep only their first words, and an exception a ``temporalio``
  logger reports (a failed activity, a failed workflow task) is shown by its type alone:
  its message can quote the arguments or the result it failed on. The message is in the
  session's history, encrypted, where the codec server shows it.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import threading
import urllib.parse
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

REDACTED = "***"
MIN_SECRET_CHARS = 4
"""Shorter values ("1", "on") are not masked: they cannot be a credential, and masking
them would garble every line that holds the character."""

WITHHELD = "(details withheld: tool-call content)"
HTTP_LOGGERS = frozenset({"httpx", "httpx2", "httpcore", "httpcore2"})
"""Top-level names of the loggers of the HTTP libraries the HTTP tool calls through."""
CONTENT_LOGGERS = HTTP_LOGGERS | {"openai", "mcp"}
"""Libraries whose debug records carry whole requests, messages or headers."""

_LOCK = threading.Lock()
_FORMS: tuple[str, ...] = ()
_INSTALLED = False
_WITHHOLD = False
_REQUEST_SHOWN_AS: contextvars.ContextVar[str | None] = contextvars.ContextVar("hermes_request_shown_as", default=None)


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
            _withhold_content(record)
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


@contextlib.contextmanager
def request_shown_as(url: str) -> Iterator[None]:
    """Within this block (this task and what it awaits), the HTTP libraries' log records
    show ``url`` (a tool's url as written) instead of the url requested, and their other
    records only their event name (see the module docstring).

    Args:
        url: what to show; it must hold no argument value and no secret.
    """
    install()
    token = _REQUEST_SHOWN_AS.set(url)
    try:
        yield
    finally:
        _REQUEST_SHOWN_AS.reset(token)


def withhold_content(on: bool) -> None:
    """Switch the encryption-at-rest rules of the module docstring on or off (done by
    :func:`hermes.security.encryption.activate`, on when a key ring is active)."""
    global _WITHHOLD
    _WITHHOLD = on
    if on:
        install()


def _withhold_content(record: logging.LogRecord) -> None:
    library = record.name.split(".", 1)[0]
    shown_as = _REQUEST_SHOWN_AS.get()
    if shown_as is not None and library in HTTP_LOGGERS:
        if str(record.msg).startswith("HTTP Request:") and isinstance(record.args, tuple) and len(record.args) >= 2:
            record.args = (record.args[0], shown_as, *record.args[2:])
        else:
            _first_words(record)
        return
    if not _WITHHOLD:
        return
    if library in CONTENT_LOGGERS and record.levelno < logging.INFO:
        _first_words(record)
    elif library == "temporalio" and record.exc_info and record.exc_info[1] is not None:
        # exc_info dropped too: a handler that formats it itself would print the message.
        record.exc_text, record.exc_info = _exception_types(record.exc_info[1]), None


def _first_words(record: logging.LogRecord) -> None:
    """Keep the constant part of the record's message: its format string up to the first
    placeholder (openai's "Request options:"), or, for a message made before logging (an
    f-string: httpcore's traces, mcp's messages), its first word (the event's name)."""
    if record.args:
        text = str(record.msg).split("%", 1)[0].strip()
    else:
        text = (str(record.msg).split(None, 1) or [""])[0]
    record.msg, record.args = f"{text} {WITHHELD}", None


def _exception_types(error: BaseException) -> str:
    """``error`` and its causes by type alone: ``ApplicationError <- ValueError``."""
    names: list[str] = []
    seen: BaseException | None = error
    while seen is not None and len(names) < 8:
        names.append(type(seen).__name__)
        seen = seen.__cause__ or seen.__context__
    return f"{' <- '.join(names)} (message withheld: encryption at rest is on; the failure is in the session's history)"
