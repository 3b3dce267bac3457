"""The session workflow's patches (``workflow.patched`` ids), oldest first.

A run recorded before a patch replays without it to its end; every patch is decided
once, in the run's first workflow task (:meth:`SessionWorkflow._patched`). An id is
never renamed or reused: committed histories in ``tests/histories/`` hold them.
"""

from __future__ import annotations

AUDIT_LOG = "approval-audit-log"
"""Approval requests, decisions and verdicts are also written to the audit log in Redis."""
STOP_ON_CLOSE = "stop-turn-on-close"
"""A close signal stops the running turn at the next tool call or model step."""
TOOL_LAYER_V2 = "tool-layer-v2"
"""Checks a gated call before asking, and asks for a whole step's approvals at once."""
BOUNDED_CONTEXT = "bounded-context"
"""Token-budgeted layered context, running summaries, forced compaction, idle and
archive timers, and the history-size budget (issue 5)."""
MEMORY = "long-term-memory"
"""Memories recalled before a turn's model calls and written after its reply, working
memory, "forget me" (issue 6)."""
BOUNDED_WORK = "bounded-workflow-work"
"""Workflow code does only bounded work and a run replays in bounded time (issue 12):
tokens of replies, tool schemas and long user messages are counted by activities, other
texts by :class:`hermes.content.tokens.BoundedCounter`; the run continues as new on a replay
budget (``SessionConfig.replay_budget_events``)."""
ARCHIVE_SUMMARIZED = "archive-summarized-turns"
"""At continue-as-new, turns the running summary covers go to the transcript archive
(they are no longer in any context), so a long session's state stays about
``context_history_turns`` plus one run of turns, not up to ``max_carry_bytes`` (issue 12:
a worker's memory grows with what its cached sessions hold)."""

MODEL_REISSUE = "model-step-reissue"
"""A model step whose every attempt ended in a heartbeat timeout is started again, with a
longer heartbeat timeout, up to :data:`workflows.session.calls.MODEL_REISSUES` times
(issue 12: a live worker too busy to heartbeat spent a step's attempts in seconds)."""

IDENTITY = "session-identity"
"""A ``confirm`` call (a ``write`` by default) is confirmed only by the session's user or
a listed approver; anyone else's decision is recorded and audited as ``not_allowed`` and
the call stays pending (issue 16; before it, anyone could confirm a call with no listed
approvers). The refusal of a message from another user needs no patch: an update
validator issues no command and is not run on replay."""

COMMAND_AUTH = "command-auth"
"""Signals (decisions, cancel, close, system prompt) are applied only with a valid proof of
their sender (:mod:`hermes.security.command_auth`), each proof once; a decision's proof must be by
its approver; a run started without a valid proof (not continued as new) ends failed at
once (issue 26). Messages are checked in the update's validator, which needs no patch."""

PREVIEW_HEAD_TAIL = "preview-head-and-tail"
"""A tool result too long for the model (over ``MAX_RESULT_CHARS``) keeps the head and the
tail of its data around a marker saying what was cut, not the head alone (issue 27)."""

DEGRADATION_NOTICES = "degradation-notices"
"""What a worker or an activity reports as degraded (a fallback tokenizer, memories not
searched, an MCP server unavailable) becomes a notice in the state, one per kind with a
count, and the ``hermes.degradations`` metric (issue 27). Runs recorded before it keep
their notices as they were (a continue-as-new carries the notices)."""

FREE_CALLS_MEANWHILE = "free-calls-meanwhile"
"""In a model step, calls that need nobody run while the step's gated calls wait for
their verdicts (before it, a free call after a gated one waited for its verdict); the
results still reach the model in the order of its calls (issue 27)."""

CONTEXT_CUT_NOTE = "context-cut-note"
"""A context's conversation starts with a user message (never an assistant message or a
tool step whose user message did not fit), and messages cut to fit the budget are named
in a cut note (:func:`hermes.content.context.build_context`, ``mark_cuts``; issue 27). A patch:
the note may make a context over budget (``ContextTooLarge``) that fitted before."""

RECALL_RETRY = "recall-retry"
"""A recall whose local search failed (both attempts timed out on a starved worker, or the
worker was lost) is searched again as a normal activity, which any worker of the task
queue may run, before the turn goes on without memories (issue 28: sessions moved off a
killed worker answered "nothing" on the survivor)."""

EVERYDAY_FACTS = "memory-everyday-facts"
"""The memory rules read everyday first-person facts and plain-text changes (moves with a
time or an origin, new jobs, things stopped, allergies: ``everyday`` of
:func:`hermes.memory.rules.extract_by_rules` and :func:`~hermes.memory.rules.detect_triggers`),
so such a turn starts an extraction after its reply where it started none before (issue 30:
"我二月底从利兹搬到爱丁堡了" was written only when the session closed, if at all)."""

CONTEXT_STORED = "model-context-stored"
"""Before a model call or a summary, the session writes the bodies it refers to that the
content store may lack (new messages, the context list, the tool list) with the
``store_message_bodies`` local activity (its input is not recorded in history), or sends
them inline when the store cannot take them; the activity never queries the session, and
a body the store lost is written again once (issue 31: every model call queried its
session, waiting on a workflow task of a busy worker)."""

CONTEXT_DELTA = "model-context-delta"
"""A model call whose new bodies are few and small (:data:`workflows.session.context_plan.INLINE_BODIES_CHARS`)
carries them inline, and its context list as a change to the previous call's
(``CallModelInput.context_base``), instead of a ``store_message_bodies`` local activity
before it: two local activities (each a workflow activation and a history marker) less per
turn of tool calls (issue 31: worker CPU per turn). Anything larger is written by the
local activity as before."""

BEGIN_TURN = "turn-start-together"
"""A turn whose recall can be made lists its tools and searches its memories in one
``begin_turn`` local activity instead of ``list_tools`` then ``search_memories`` (issue 31:
a local activity less per turn; each is a workflow activation and a history marker). The
recall goes with the listing when the previous listing said the worker serves memory; if
``begin_turn`` fails, the turn lists and searches apart as before."""

INDEX_SINK = "index-through-sink"
"""The session index row (and a turn's ``turn_finished``) is written through the worker's
sink when the activation that decided it ends (:mod:`hermes.infra.sinks`), not by an
``update_session_index`` local activity (issue 31: an activation, an activity task and a
history marker less per turn)."""

START_IN_CALL = "turn-start-in-model-call"
"""A turn after the run's first lists nothing and searches nothing before its first
model call: that call does both (``CallModelInput.turn_start``,
:meth:`activities.turn_start.TurnStartActivities.prepare`), offering the tools of the
run's last listing and putting the memories it finds into the context (issue 31: the
``begin_turn`` local activity was a workflow activation every turn). When the tools
changed, the search failed or the memories do not fit, the provider is not asked and
the session calls again with what the call found."""

ARCHIVE_AT_REPLY = "archive-at-reply"
"""The turn after which the run continues as new (nothing else running) archives the
summarized turns before its reply, so that the run continues as new in the workflow task
that completes the message and the next message lands on the new run; before, the
archive ran after the reply and a message sent meanwhile was refused as busy and sent
again with start (issue 31: CPU and latency at every roll-over of a busy session)."""

ALL = (
    TOOL_LAYER_V2, STOP_ON_CLOSE, AUDIT_LOG, BOUNDED_CONTEXT, MEMORY, BOUNDED_WORK, ARCHIVE_SUMMARIZED, MODEL_REISSUE,
    IDENTITY, COMMAND_AUTH, PREVIEW_HEAD_TAIL, DEGRADATION_NOTICES, FREE_CALLS_MEANWHILE, CONTEXT_CUT_NOTE,
    RECALL_RETRY, EVERYDAY_FACTS, CONTEXT_STORED, CONTEXT_DELTA, BEGIN_TURN, INDEX_SINK, START_IN_CALL, ARCHIVE_AT_REPLY,
)
"""In the order the first workflow task asks for them (the order of their markers)."""
