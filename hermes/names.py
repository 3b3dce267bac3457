"""Wire names: workflow, activity, signal, update and query names, search attributes.

These strings are in workflow histories and in clients; changing one breaks running
sessions. An incompatible payload change gets a new ``..._v2`` name instead.
"""

from temporalio.common import SearchAttributeKey

DEFAULT_TASK_QUEUE = "hermes-sessions"

# Workflows
SESSION_WORKFLOW = "SessionWorkflow"
SESSION_WORKFLOW_TASK_TIMEOUT_SECONDS = 30.0
"""Workflow task timeout of a session's runs (Temporal's default is 10 s; continue-as-new
keeps the first run's). A session's task holds its turn's local activities (tool
listing, memory search up to 15 s, checks, audit and index writes) and the SDK core
heartbeats it at 80% of this: at 10 s, a worker starved of CPU (load 16 on 2 cores, beside
a soak) sent that heartbeat late, the task timed out again and again, and the server then
waited about 4 minutes before each next attempt, refusing the session's messages ("Workflow
Task in failed state") meanwhile (issue 12). A worker that dies while it holds a task is
noticed after this long; one that dies between tasks (the usual case: a model or tool call
runs in an activity) is noticed by the sticky queue's timeout, as before."""
MEMORY_WRITER_WORKFLOW = "MemoryWriterWorkflow"
"""One per user (id :func:`memory_writer_id`): batches that user's memory writes."""
MEMORY_CONSOLIDATION_WORKFLOW = "MemoryConsolidationWorkflow"
MEMORY_CONSOLIDATION_SCHEDULE = "hermes-memory-consolidation"
"""The Temporal Schedule that starts the consolidation (hourly, overlap skipped)."""

# Activities
CALL_MODEL = "call_model"
RUN_TOOL = "run_tool"
LIST_TOOLS = "list_tools"
VALIDATE_TOOL_CALL = "validate_tool_call"
COMPOSITE_TOOL_WORKFLOW = "CompositeToolWorkflow"
UPDATE_SESSION_INDEX = "update_session_index"
SESSION_INDEX_SINK = "session_index"
"""The worker sink (:mod:`hermes.infra.sinks`) a session writes its index row through."""
ARCHIVE_MESSAGES = "archive_messages"
RECORD_APPROVAL_AUDIT = "record_approval_audit"
SUMMARIZE_CONTEXT = "summarize_context"
COUNT_TOKENS = "count_tokens"
STORE_MESSAGE_BODIES = "store_message_bodies"
"""Writes the bodies a model call refers to into the content store before the call (a
local activity: its input is not recorded in history), so the call never queries its session."""
SAVE_SNAPSHOT = "save_snapshot"
SEARCH_MEMORIES = "search_memories"
BEGIN_TURN = "begin_turn"
"""A turn's tool listing and memory recall in one local activity (``hermes.sessions.turn_start``)."""
EXTRACT_MEMORIES = "extract_memories"
WRITE_MEMORIES = "write_memories"
FORGET_MEMORIES = "forget_memories"
FORGET_USER_MEMORIES = "forget_user_memories"
"""From a session whose user said "forget me": the writer's ``forget`` update, started."""
LIST_MEMORY_USERS = "list_memory_users"
JUDGE_MEMORIES = "judge_memories"
CONSOLIDATE_MEMORIES = "consolidate_memories"
OPTIMIZE_MEMORIES = "optimize_memories"

# Updates
SEND_MESSAGE = "send_message"
SETTLE_MESSAGE = "settle_message"
"""Session: whether it took a message its client is about to report busy (accepted: taken;
refused by its validator: not taken, and no copy sent before can be taken later)."""
FORGET_USER = "forget_user"
"""Memory writer: drop the pending candidates and delete every row of the user."""
WRITE_MEMORIES_NOW = "write_memories_now"
"""Memory writer: write these candidates at once (the CLI's ``memory add``)."""

# Signals
ADD_MEMORIES = "add_memories"
"""Memory writer: candidates to write in the next batch (10 items or 5 s)."""
APPROVE_TOOL_CALL = "approve_tool_call"
REJECT_TOOL_CALL = "reject_tool_call"
SET_SYSTEM_PROMPT = "set_system_prompt"
CANCEL_TURN = "cancel_turn"
CLOSE_SESSION = "close_session"
START_SESSION = "start_session"
"""Not a signal: the command name a session's start input is signed under (:mod:`hermes.security.command_auth`)."""
START_MEMORY_WRITER = "start_memory_writer"
"""Not a signal: the command name a memory writer's start input is signed under."""
START_CONSOLIDATION = "start_consolidation"
"""Not a signal: the command name a consolidation's input is signed under, for the target
:data:`CONSOLIDATION_TARGET` (a scheduled run's workflow id changes every time)."""
CONSOLIDATION_TARGET = "memory-consolidation"

# Queries
GET_STATE = "get_state"
GET_TRANSCRIPT = "get_transcript"
GET_PENDING_APPROVALS = "get_pending_approvals"
GET_TRACE = "get_trace"
GET_MESSAGE_BODIES = "get_message_bodies"
"""Bodies by content reference, for a model call of a run recorded before the
``model-context-stored`` patch whose content-store read missed (newer runs write the
bodies before the call: ``STORE_MESSAGE_BODIES``)."""
GET_TAKEN_MESSAGES = "get_taken_messages"
"""The messages a session took whose client message ids start with a prefix (running, or
answered and when), for ``hermes serve`` to attach a client's retry to its turn."""
GET_MODEL_CONTEXT = "get_model_context"
"""The message references of the model call in flight (turn, step), for an activity whose
context reference the session no longer knows (it was rebuilt from history)."""

# Search attributes (registered by `hermes dev` and by the test fixtures).
SA_USER_ID = SearchAttributeKey.for_keyword("HermesUserId")
SA_CHANNEL = SearchAttributeKey.for_keyword("HermesChannel")
SA_STATUS = SearchAttributeKey.for_keyword("HermesSessionStatus")
SA_PENDING_APPROVALS = SearchAttributeKey.for_int("HermesPendingApprovals")

# Memo keys (not indexed; read back when the Redis session index is rebuilt).
MEMO_TITLE = "title"

SEARCH_ATTRIBUTE_KEYS = [SA_USER_ID, SA_CHANNEL, SA_STATUS, SA_PENDING_APPROVALS]
"""Every search attribute the product uses (for ``WorkflowEnvironment.start_local``)."""

SEARCH_ATTRIBUTES: dict[str, str] = {
    key.name: key.indexed_value_type.name.title() for key in SEARCH_ATTRIBUTE_KEYS
}
"""Name -> Temporal indexed value type, for registration on a server."""


def memory_writer_id(user_id: str) -> str:
    """The workflow id of ``user_id``'s memory writer (hashed past 200 characters)."""
    if len(user_id) <= 200:
        return f"hermes-memory-writer:{user_id}"
    import hashlib

    return "hermes-memory-writer:sha256:" + hashlib.sha256(user_id.encode("utf-8", "surrogatepass")).hexdigest()
