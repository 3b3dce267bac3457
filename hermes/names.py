"""Wire names: workflow, activity, signal, update and query names, search attributes.

These strings are in workflow histories and in clients; changing one breaks running
sessions. An incompatible payload change gets a new ``..._v2`` name instead.
"""

from temporalio.common import SearchAttributeKey

DEFAULT_TASK_QUEUE = "hermes-sessions"

# Workflows
SESSION_WORKFLOW = "SessionWorkflow"

# Activities
CALL_MODEL = "call_model"
RUN_TOOL = "run_tool"
LIST_TOOLS = "list_tools"
VALIDATE_TOOL_CALL = "validate_tool_call"
COMPOSITE_TOOL_WORKFLOW = "CompositeToolWorkflow"
UPDATE_SESSION_INDEX = "update_session_index"
ARCHIVE_MESSAGES = "archive_messages"
RECORD_APPROVAL_AUDIT = "record_approval_audit"
SUMMARIZE_CONTEXT = "summarize_context"
SAVE_SNAPSHOT = "save_snapshot"

# Updates
SEND_MESSAGE = "send_message"

# Signals
APPROVE_TOOL_CALL = "approve_tool_call"
REJECT_TOOL_CALL = "reject_tool_call"
SET_SYSTEM_PROMPT = "set_system_prompt"
CANCEL_TURN = "cancel_turn"
CLOSE_SESSION = "close_session"

# Queries
GET_STATE = "get_state"
GET_TRANSCRIPT = "get_transcript"
GET_PENDING_APPROVALS = "get_pending_approvals"
GET_TRACE = "get_trace"
GET_MESSAGE_BODIES = "get_message_bodies"
"""Bodies by content reference, for an activity whose content-store read missed."""
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
