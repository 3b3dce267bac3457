"""The session workflow: a durable shell over plain, deterministic parts.

Where each concern lives (issue 14):

- ``shell.py``: :class:`SessionWorkflow`, the durable shell: its handlers (the
  ``send_message`` and ``settle_message`` updates, the approval, prompt, cancel and close
  signals, the queries), ``run`` (the idle / archive / continue-as-new loop), and the
  order in which activities, timers and search attributes happen.
- ``calls.py``: how each activity is called (timeouts, retries, heartbeats).
- ``turn.py``: how a turn stops early (cancel, context too large, model failure, close,
  bad arguments) and what the user is told.
- ``tool_step.py``: which calls of a model step are refused, run, or checked and put up
  for a human; fallbacks; asking the user for arguments.
- ``approvals.py``: the approval book (pending, decisions, verdicts, halts, the audit
  entries, calls of unknown outcome).
- ``transcript.py``: the messages a run holds, their references and sizes, the archive
  cut, excerpts, replies rebuilt for resends.
- ``context_plan.py``: the model call's context and tool list, by reference.
- ``lifecycle.py``: when a run idles, is archived, continues as new; when a summary is due.
- ``memory_hooks.py``: what long-term memory is given after a reply and at the end.
- ``replies.py``: the replies kept for resends (exactly-once turns).
- ``payloads.py``: sizes against Temporal's payload limits.
- ``patches.py``: the ``workflow.patched()`` ids.

Only the shell and its durable helpers (``calls.py``, ``tool_runner.py``,
``model_steps.py``, ``memory_path.py``) import ``temporalio``; the rest are unit-tested
without a server (``tests/test_session_parts.py``).

This ``__init__`` imports nothing at import time (``SessionWorkflow`` is loaded on first
access, PEP 562): Temporal's sandbox re-imports ``workflows.session.shell`` for every
worker it validates and every run it starts, and a package ``__init__`` that imported
the module being imported made that a nested import of the same module, which Python
3.11's import locks can fail with ``KeyError(<thread id>)`` when another thread imports
at the same time (python/cpython#91351; seen once in a fresh clone's test run, and once
in 9 runs of tests/test_tool_layer.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from workflows.session.shell import SessionWorkflow

__all__ = ["SessionWorkflow"]


def __getattr__(name: str) -> Any:
    if name == "SessionWorkflow":
        from workflows.session.shell import SessionWorkflow

        return SessionWorkflow
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
