"""Sinks: calls from workflow code to its worker, made when the activation that asked for
them ends, before its completion goes back to the server.

The TypeScript SDK has them (``proxySinks``); the Python SDK does not. Workflow code may
do no I/O, yet some of what it decides is only a projection for readers outside it, which
the workflow's history does not need to hold: the session index row and the
``turn_finished`` event (:mod:`hermes.sessions.index`, :mod:`hermes.content.events`). A
local activity wrote them at every turn's end before; each is a workflow activation, an
activity task and a history marker (issue 31: about 3-5 ms of the worker's CPU in a turn
of about 35 ms on the 2-core bench machine, ``bench/turn_overhead.py``).

How it works:

* Workflow code calls :func:`emit`. This module is passed through the workflow sandbox
  (:data:`hermes.infra.activation.PASSTHROUGH_MODULES`), so the call reaches the worker's
  own module, which keeps the calls of the activation running on this thread.
* The worker's workflow runner (:func:`hermes.infra.activation.sink_runner`) collects
  them around each activation. When the activation ended in a successful completion it
  runs the named handlers, on the worker's event loop, and waits for them (at most
  :data:`SINK_WAIT_SECONDS`) before the completion is returned to the SDK: what a sink
  writes lands before the reply that follows it reaches a client, as the local
  activity's write did. A handler still running after that finishes in the background.

What a sink call is:

* **Never made on replay** (:func:`emit` drops it): a replay does not repeat what its
  run did.
* **Made again if the workflow task is run again.** A task whose completion the server
  never took (its worker stopped, or it timed out on a starved worker) runs its last
  activation again, not as a replay, and calls the sink again. Handlers are idempotent
  (the index row is an upsert; a second ``turn_finished`` of a turn is read once).
* **Lost only with a write that failed**, which the handler reports, as the local
  activity's final failure was: the worker waits for it before the task completes, so a
  worker that dies meanwhile leaves the task to be run again elsewhere. Past the wait
  (:data:`SINK_WAIT_SECONDS`, or less when the activation nears the SDK's deadlock
  bound) the call finishes in the background; one cancelled there by a worker stopping
  is logged (the session's next index write brings the row up to date).

Workflow code sees no result: a sink cannot change what the workflow decides.
"""

from __future__ import annotations

import threading
from typing import Any

from temporalio import workflow

SINK_WAIT_SECONDS = 1.5
"""How long an activation's end waits for its sink calls (the session index write takes
at most 1 s, both tries: ``SessionIndexActivities.timeout_seconds``); within the SDK's
deadlock bound (``Settings.workflow_deadlock_seconds``, 8 s), which counts this wait."""

_local = threading.local()


def emit(sink: str, value: Any) -> bool:
    """Call the worker's ``sink`` with ``value`` when this activation ends (workflow code).

    Args:
        sink: a handler's name (:func:`hermes.infra.activation.sink_runner`'s ``sinks``).
        value: handed to the handler as it is (not serialized: it must not be changed
            after the call).

    Returns:
        True if taken, or dropped because this activation is a replay; False if the
        worker's runner takes no sink calls (a worker not built by ``worker.build_worker``):
        the caller says so, nothing is written.
    """
    if workflow.unsafe.is_replaying():
        return True
    calls: list[tuple[str, Any]] | None = getattr(_local, "calls", None)
    if calls is None:
        return False
    calls.append((sink, value))
    return True


def collect() -> list[tuple[str, Any]]:
    """Start collecting this thread's sink calls (the runner, before an activation)."""
    calls: list[tuple[str, Any]] = []
    _local.calls = calls
    return calls


def stop_collecting() -> None:
    """Stop collecting this thread's sink calls (the runner, after an activation)."""
    _local.calls = None
