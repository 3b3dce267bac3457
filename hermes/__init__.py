"""Hermes Agent: durable AI agent sessions on Temporal.

Each conversation (session) is a long-lived Temporal workflow; every model call and
tool call is an activity with a tiered timeout, retried only when the tool is
idempotent; approvals are signals. See ``README.md``.

The public names below are imported lazily, so that workflow code importing
``hermes.names`` or ``hermes.models`` pulls in no client library.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    "HermesClient": "hermes.client",
    "SessionConfig": "hermes.models",
    "TurnResult": "hermes.models",
    "ToolResult": "hermes.models",
    "ToolResultCode": "hermes.models",
    "Settings": "hermes.settings",
    "tool": "hermes.tools.registry",
    "ToolContext": "hermes.tools.registry",
    "ToolRegistry": "hermes.tools.registry",
    "HermesError": "hermes.errors",
    "ConfigError": "hermes.errors",
    "MessageRejectedError": "hermes.errors",
    "SessionBusyError": "hermes.errors",
    "SessionClosedError": "hermes.errors",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'hermes' has no attribute {name!r}")
