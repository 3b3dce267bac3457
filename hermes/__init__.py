"""Hermes Agent: durable AI agent sessions on Temporal.

Each conversation (session) is a long-lived Temporal workflow; every model call and
tool call is an activity with a tiered timeout, retried only when the tool is
idempotent; approvals are signals. See ``README.md`` and ``DESIGN.md``.
"""

__version__ = "0.1.0"
