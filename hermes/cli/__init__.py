"""The ``hermes`` command line.

    hermes demo                  # offline demo: embedded stack + scripted model, checked
    hermes dev                   # embedded Temporal (with Web UI) + Redis + a worker
    hermes dev --no-worker       # the servers alone; prints the env for separate workers
    hermes worker                # just the worker, against configured servers
    hermes codec-server          # the Web UI shows the messages behind content references
    hermes chat [--session ID]   # talk to a session; approve tool calls inline
    hermes send ID TEXT          # one message, prints the reply (--json: the TurnResult)
    hermes sessions [--user U]   # the user's sessions (Redis index)
    hermes show ID               # state, pending approvals, transcript, trace
    hermes close ID              # close a session (its pending approvals are denied)
    hermes approve ID TOOL_CALL_ID / hermes reject ID TOOL_CALL_ID
    hermes approvals             # every pending approval across sessions
    hermes tools                 # the tools a worker would serve (checks tool files)
    hermes mcp list / hermes mcp call SERVER TOOL '{"arg": 1}'
    hermes memory search|list|add|forget|consolidate|reembed
    hermes serve                 # the HTTP API (hermes/api), with API keys
    hermes keys add --user U     # a new API key for U: printed once, its SHA-256 stored
    hermes encryption-key        # a new key for HERMES_ENCRYPTION_KEYS (payloads encrypted at rest)
    hermes doctor                # check every configured service; where each thing lives
    hermes healthcheck [worker|URL]  # a container's health check (the Dockerfile's HEALTHCHECK)
    hermes deploy status|set-current BUILD  # rolling deploys (Worker Versioning)

Every command reads :class:`hermes.settings.Settings` (``HERMES_*``, ``TEMPORAL_ADDRESS``,
``REDIS_URL``, a ``.env`` file). Expected failures print one line starting with
``error:`` on stderr, never a traceback, and exit with:

* 1: Hermes refused the request or a check failed (empty or too large message, closed
  or busy session, unknown session, a decision that was not applied, a demo step);
* 2: the servers could not be reached or started, or the configuration is wrong;
* 130: interrupted (Ctrl-C) before the command finished. ``hermes dev``, ``hermes
  worker`` and ``hermes demo --keep`` treat Ctrl-C / SIGTERM as their normal stop (0).

One module per command group; what they share has one home each:

    root.py          the root Typer app, the shared --user / --json options
    errors.py        exit codes and the one error path (explain, fail, reported_errors)
    output.py        the consoles and the one table renderer (print_table, print_fields)
    running.py       one event loop per command, Ctrl-C, a quiet client connection
    stack.py         dev, worker, codec-server
    demo.py          demo (the one importer of offline_demo.py)
    offline_demo.py  the demo itself: plays and checks a conversation (a leaf)
    conversation.py  chat, send
    sessions.py      sessions, show, close
    approvals.py     approve, reject, approvals
    tools.py         tools
    mcp.py           mcp list, mcp call
    memory.py        memory search, list, add, forget, consolidate, reembed
    serve.py         serve, keys add
    encryption.py    encryption-key
    doctor.py        doctor
    health.py        healthcheck
    deploy.py        deploy status, deploy set-current
"""

from __future__ import annotations

# The command modules register on `app` when imported; this order is `hermes --help`'s.
from hermes.cli import stack as _stack  # noqa: F401
from hermes.cli import demo as _demo  # noqa: F401
from hermes.cli import conversation as _conversation  # noqa: F401
from hermes.cli import sessions as _sessions  # noqa: F401
from hermes.cli import approvals as _approvals  # noqa: F401
from hermes.cli import tools as _tools  # noqa: F401
from hermes.cli import mcp as _mcp  # noqa: F401
from hermes.cli import memory as _memory  # noqa: F401
from hermes.cli import serve as _serve  # noqa: F401
from hermes.cli import encryption as _encryption  # noqa: F401
from hermes.cli import doctor as _doctor  # noqa: F401
from hermes.cli import health as _health  # noqa: F401
from hermes.cli import deploy as _deploy  # noqa: F401
from hermes.cli.root import app

__all__ = ["app", "main"]


def main() -> None:
    """Entry point for ``python -m hermes.cli``; the ``hermes`` script calls :data:`app`."""
    app()
