"""The Temporal SDK core's own log lines (its Rust part), through Python's logging.

Left to itself, the core writes its warnings (``[TMPRL1104] ...``, "untracked local
activity", "Query not found", a gRPC call retried) straight to the process's output in
its own coloured format, ANSI escape codes and all, whether that output is a terminal or
a log file (issue 32). Forwarded (``temporalio.runtime.LogForwardingConfig``), each is
a record of the :data:`CORE_LOGGER` logger, formatted by the process's handlers like
every other line: plain text where they write plain text.

Every Temporal runtime Hermes makes takes its logging from :func:`core_logging`; the
processes that use the SDK's default runtime (the worker, ``hermes dev``, ``hermes
serve``) install one with :func:`install_default_runtime` before they connect.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from temporalio.runtime import LoggingConfig

__all__ = ["CORE_LOGGER", "core_logging", "install_default_runtime"]

CORE_LOGGER = "temporalio.core"
"""The logger the core's lines are records of (named ``temporalio.core-sdk_core::<target>``
by the SDK, each message starting with ``[sdk_core::<target>]``)."""


def core_logging(core_level: str = "WARN", other_level: str = "ERROR") -> LoggingConfig:
    """The logging of a Temporal runtime: the core's lines at ``core_level`` and up (and
    its libraries' at ``other_level``) forwarded to :data:`CORE_LOGGER`.

    Args:
        core_level: ``TRACE``, ``DEBUG``, ``INFO``, ``WARN`` (the SDK's default) or ``ERROR``.
        other_level: the same, for the core's dependencies (gRPC, HTTP).
    """
    from temporalio.runtime import LogForwardingConfig, LoggingConfig, TelemetryFilter

    return LoggingConfig(
        filter=TelemetryFilter(core_level=core_level, other_level=other_level),
        forwarding=LogForwardingConfig(logger=logging.getLogger(CORE_LOGGER)),
    )


def install_default_runtime(core_level: str = "WARN") -> None:
    """Make the SDK's default runtime one whose core lines go through Python's logging
    (:func:`core_logging`). Call it before the first client connects: a client already
    connected keeps the runtime it was made with.

    Args:
        core_level: see :func:`core_logging`.
    """
    from temporalio.runtime import Runtime, TelemetryConfig

    Runtime.set_default(Runtime(telemetry=TelemetryConfig(logging=core_logging(core_level))), error_if_already_set=False)
