"""Payloads that cross the workflow boundary.

Every type here is a pydantic model carried by ``pydantic_data_converter``; new fields
always get defaults so that running sessions keep decoding. Types of openai, redis or
any other client library never appear here.

Why this module is long: it is the whole wire between workflows and activities, one
payload type after another; the types refer to each other (a model call's input names
its tool specs, its result its degradations and its turn start), and one module is
where a reader finds what a recorded history holds.
"""

from __future__ import annotations

from datetime import datetime
from enum import IntEnum
from typing import Any, Literal

from pydantic import BaseModel, Field, field_validator, model_validator

from hermes.memory.models import ExtractMemoriesInput, SearchMemoriesInput, SearchMemoriesResult, WorkingItem
from hermes.security.proof import CommandProof

Role = Literal["system", "user", "assistant", "tool"]
ProviderProfileName = Literal["openai", "openai-reasoning", "deepseek", "qwen", "moonshot", "ollama", "vllm", "llamacpp"]
"""The provider dialects of :mod:`hermes.providers.profiles`."""
Permission = Literal["read", "write", "admin"]
Tier = Literal["query", "external", "batch"]
Idempotency = Literal["idempotent", "keyed", "none"]
"""How a tool may be retried (seed 004 §4.3, DESIGN.md "Tool"):

- ``idempotent``: running it twice is harmless; retried with backoff (200 ms x2, 3 attempts).
- ``keyed``: retried; the tool receives a stable key per call (``ToolContext.idempotency_key``)
  and passes it to a backend that de-duplicates (a payment API's idempotency key).
- ``none``: executed at most once; after a timeout or a crash its outcome is "unknown"."""
PolicySource = Literal["config", "annotation", "default"]
"""What set an MCP tool's permission or idempotency (:meth:`hermes.mcp.config.ServerConfig.policy`):

- ``config``: the operator's ``mcpServers`` entry (the tool's ``tools`` entry, or the server's key);
- ``annotation``: the server's tool annotations (``destructiveHint``, ``readOnlyHint``,
  ``idempotentHint``: hints from the server, which the operator's config outranks);
- ``default``: neither said anything (``read``, ``none``)."""
OnExpiry = Literal["deny", "halt"]
SessionStatus = Literal["active", "idle", "halted", "closed", "archived"]
"""``idle``: no message for ``idle_after_seconds``; ``archived``: a snapshot was written
and the workflow completed (its next message resumes it)."""
TurnStatus = Literal[
    "completed", "cancelled", "max_iterations", "model_error", "closed", "context_too_large", "invalid_arguments",
    "budget_exceeded",
]


class ToolResultCode(IntEnum):
    """The ``code`` of every tool result the model sees (DESIGN.md, seed 002 §3.3)."""

    OK = 0
    BAD_ARGUMENTS = 1
    DEPENDENCY_UNAVAILABLE = 2
    PERMISSION_DENIED = 3
    OUTCOME_UNKNOWN = 4
    DENIED_BY_HUMAN = 5


class ToolResult(BaseModel):
    """What a tool call produced, in the one shape the model sees: ``{code, message, data}``."""

    code: ToolResultCode = ToolResultCode.OK
    message: str = "ok"
    data: Any = None

    @property
    def ok(self) -> bool:
        return self.code == ToolResultCode.OK


class ToolCall(BaseModel):
    """One tool call requested by the model."""

    tool_call_id: str
    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)
    arguments_error: str | None = None
    """Set when the model's raw arguments were not a JSON object; the call is then not run."""
    arguments_ref: str | None = None
    """Set when the arguments were larger than :data:`hermes.content.blobs.MAX_INLINE_ARGUMENTS_BYTES`:
    they are kept whole in the content store under this reference, and ``arguments`` is a
    stand-in (``kept_by_reference``, ``size_bytes``, ``preview``) that shows what they are.
    The tool activities and the provider request read the whole arguments; the session
    (workflow code, whose work must not grow with an input's size) never holds them."""


class Message(BaseModel):
    """One message of the transcript, in chat-completions roles."""

    role: Role
    content: str | None = None
    tool_calls: list[ToolCall] = Field(default_factory=list)
    tool_call_id: str | None = None
    """For ``role="tool"``: the call this message answers."""
    name: str | None = None
    """For ``role="tool"``: the tool's name."""
    turn: int = 0
    created_at: datetime | None = None
    client_message_id: str | None = None
    """For ``role="user"``: the id the client sent it with (resends are answered from it)."""
    sender: str | None = None
    """For ``role="user"``: who sent it when not the session's user (an admin posting into
    it, as its proof says); ``None``: the session's user."""
    internal: bool = False
    """Written by Hermes, not the model (e.g. "the model could not answer"): shown to the
    user and kept in the transcript, never sent to the model as if it had said it."""
    tokens: int | None = None
    """Tokens this message takes in a model's context (text plus chat-format overhead,
    :meth:`hermes.content.tokens.TokenCounter.message`), counted once when it enters the transcript."""
    ref: str | None = None
    """Content hash of the message body (:func:`hermes.content.blobs.message_ref`): model calls
    carry this reference instead of the body, which enters workflow history only once."""
    reasoning: str | None = None
    """For ``role="assistant"``: the model's reasoning, as its provider returned it
    (``reasoning_content`` / ``reasoning``; see :mod:`hermes.providers.profiles`). Kept in
    the transcript and carried across continue-as-new; never shown as the reply; sent back
    only to providers that require it (DeepSeek and Kimi thinking models, on messages with
    tool calls)."""


class Usage(BaseModel):
    prompt_tokens: int = 0
    completion_tokens: int = 0


class Summary(BaseModel):
    """The running summary of the turns folded out of the context (seed 002 §2.2)."""

    text: str
    upto_turn: int
    """Turns ``1..upto_turn`` are covered: the context leaves them out."""
    tokens: int = 0
    created_at: datetime | None = None
    usage: Usage | None = None
    """What the model call that wrote it used (counted against the token budgets)."""
    user_day_tokens: int | None = None
    """The user's tokens that UTC day after this call (set when a daily budget applies)."""


class CompositeStep(BaseModel):
    """One step of a composite tool: a registered tool and its arguments.

    Argument values may reference the composite's arguments and earlier steps' results:
    a string ``"$args.order_id"`` or ``"$steps.lookup.data.amount"`` is replaced by that
    value (whole strings only, so types are kept); anything else is taken literally.
    """

    name: str
    """Step id, unique within the composite (default: the tool's name)."""
    tool: str
    arguments: dict[str, Any] = Field(default_factory=dict)


class McpOrigin(BaseModel, frozen=True):
    """Where an MCP tool lives: the configured server and the tool's own name there."""

    server: str
    tool: str


class ToolSpec(BaseModel):
    """A tool as the workflow and the model see it (no code, only metadata)."""

    name: str
    description: str
    """What it does, when to use it and when not; the text the model reads."""
    parameters: dict[str, Any]
    """JSON Schema of the arguments object."""
    tier: Tier = "query"
    idempotent: bool = True
    """Safe to retry (``idempotency`` is ``idempotent`` or ``keyed``)."""
    idempotency: Idempotency | None = None
    permission: Permission = "read"
    timeout_seconds: float = 15.0
    """Start-to-close timeout of one attempt, from the tier unless overridden."""
    heartbeat_timeout_seconds: float = 5.0
    """A running call that stops heartbeating for this long is treated as crashed."""
    group: str | None = None
    """Tool group for per-turn routing; ``None``: always offered."""
    next_possible_tools: list[str] = Field(default_factory=list)
    """Tools that usually follow this one (a hint to the model, and offered after it runs)."""
    fallback: str | None = None
    """Tool run with the same arguments when this one fails with code 2 (or 4, if retry-safe)."""
    returns: dict[str, Any] | None = None
    """JSON Schema (or ``{"description": ...}``) of the ``data`` of a successful result."""
    composite: list[CompositeStep] | None = None
    """Set for a composite tool: its steps, run in order by a child workflow."""
    mcp: McpOrigin | None = None
    """Set for an MCP tool: the server and tool a call goes to (recorded with the list)."""
    permission_source: PolicySource | None = None
    """Set for an MCP tool: what decided ``permission`` (see :data:`PolicySource`).
    ``None`` for Hermes' own tools (their code says) and in lists recorded before it existed."""
    idempotency_source: PolicySource | None = None
    """The same for ``idempotency``."""
    tokens: int | None = None
    """Tokens its schema takes in a model's prompt (:meth:`hermes.content.tokens.TokenCounter.tools`),
    counted by the tool-listing activity with the session's encoding, so workflow code
    never encodes schemas (None: count it where needed)."""

    @model_validator(mode="after")
    def _idempotency(self) -> ToolSpec:
        if self.idempotency is None:
            self.idempotency = "idempotent" if self.idempotent else "none"
        self.idempotent = self.idempotency != "none"
        return self

    def to_openai(self) -> dict[str, Any]:
        """The tool in the chat-completions ``tools`` format."""
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }


class ToolGroup(BaseModel):
    """A group of tools offered together when a turn is about its subject."""

    name: str
    description: str = ""
    keywords: list[str] = Field(default_factory=list)
    """Words (any language) that route a user message to this group."""


class CallModelInput(BaseModel):
    """One model call. In history it carries references, not bodies (the activity reads them
    from the content store); ``messages`` and ``tools`` are what a provider receives."""

    session_id: str
    turn: int
    messages: list[Message] = Field(default_factory=list)
    tools: list[ToolSpec] = Field(default_factory=list)
    model: str | None = None
    """Overrides the worker's configured model name, if set."""
    profile: ProviderProfileName | None = None
    """Provider profile (:data:`hermes.providers.profiles.PROFILES`) for this call, from the
    session's config; None: the worker's ``HERMES_MODEL_PROFILE`` or the one its base URL names."""
    message_refs: list[str] = Field(default_factory=list)
    """Content hashes of the context's messages, in order (see :mod:`hermes.content.blobs`)."""
    context_ref: str | None = None
    """Content hash of the list of ``message_refs`` itself: what a session's model call
    carries, so that its input has the same size however long the conversation is."""
    tools_ref: str | None = None
    """Content hash of the offered tool list."""
    step: int | None = None
    """Model step within the turn (0 first)."""
    purpose: Literal["reply", "summary", "memory_extraction", "memory_judge"] = "reply"
    """``summary``: fold the messages into a summary of at most ``max_output_tokens``;
    ``memory_extraction``: answer with the JSON of :data:`hermes.memory.extraction.EXTRACTION_INSTRUCTION`."""
    max_output_tokens: int | None = None
    context_tokens: int = 0
    """The workflow's estimate of the context's tokens (corrected by reported usage)."""
    usage_user_id: str | None = None
    """With ``usage_day``, set when a daily token budget applies: the activity adds this call's
    tokens to the user's count for that UTC day (Redis ``hermes:usage:<user>:<day>``, once per
    activity, whatever its retries) and returns the day's total (``CallModelResult.user_day_tokens``)."""
    usage_day: str | None = None
    """The UTC day (``YYYY-MM-DD``, from workflow time) the call's tokens count for."""
    encoding: str = ""
    """The session's tiktoken encoding: the activity counts the reply's tokens (``Message.tokens``)."""
    bodies: dict[str, str] = Field(default_factory=dict)
    """Bodies by reference sent inline: those the content store did not take, or a step's
    few new ones (:meth:`workflows.session.context_plan.ContextPlanner.delta`)."""
    bodies_stored: bool = False
    """Every body the call reads is in the store or ``bodies`` (False: runs before ``model-context-stored``)."""
    context_base: str | None = None
    """A context list sent as a change to this one: ``context_parts`` in order."""
    context_parts: list[str | list[int]] = Field(default_factory=list)
    """Each a reference, or ``[start, end]``: the base list's references from ``start`` to ``end``."""
    turn_start: TurnStartRequest | None = None
    """A turn's first step only (runs with the ``turn-start-in-model-call`` patch): what the
    call does before it asks the provider, in place of the ``begin_turn`` local activity."""


class Degradation(BaseModel):
    """What a worker does less well than it should: a notice in the state and ``hermes.degradations``."""

    kind: str
    """``tokenizer`` (a fallback encoding), ``memory`` (not searched), ``events`` (not
    published), ``mcp`` (a server unavailable); any other kind is kept alike."""
    detail: str
    """What happened and what it costs, for a human."""


class CallModelResult(BaseModel):
    message: Message
    usage: Usage = Field(default_factory=Usage)
    provider: str = ""
    model: str = ""
    user_day_tokens: int | None = None
    """The user's tokens that UTC day after this call (``CallModelInput.usage_day`` set and
    Redis reachable; None otherwise)."""
    degraded: list[Degradation] = Field(default_factory=list)
    """What this call did less well (its turn events not all published)."""
    turn_start: TurnStartOutcome | None = None
    """What the call's ``CallModelInput.turn_start`` found; None when it had none (or a
    worker that does not know the field ran it: the call went out as it was)."""


class ArchiveMessagesInput(BaseModel):
    """Messages ``first_index ..`` of a session's transcript, to keep outside the workflow."""

    session_id: str
    first_index: int
    messages: list[Message]
    chain_id: str = ""


class ListToolsInput(BaseModel):
    known_ref: str | None = None
    """Reference of the listing the session already has: if the list is the same, only
    the reference comes back (history then records a few bytes, not every schema)."""
    encoding: str = ""
    """The session's tiktoken encoding, once known: each listed ``ToolSpec.tokens`` is
    counted with it (empty: the worker's)."""


class CountTokensInput(BaseModel):
    """A text whose tokens a session needs exactly but may not count in workflow code
    (longer than :data:`hermes.content.tokens.BOUNDED_COUNT_CHARS`)."""

    text: str
    encoding: str


class ListToolsResult(BaseModel):
    tools: list[ToolSpec]
    groups: list[ToolGroup] = Field(default_factory=list)
    ref: str | None = None
    """Content reference of ``tools`` and ``groups``."""
    unchanged: bool = False
    """The list is the one of ``ListToolsInput.known_ref``: ``tools`` and ``groups`` are empty."""
    encoding: str = ""
    """The tiktoken encoding the worker counts this session's tokens with (recorded here,
    so every replay counts with the same one)."""
    memory: bool = False
    """The worker serves long-term memory (its activities are registered)."""
    degraded: list[Degradation] = Field(default_factory=list)
    """What the worker does less well for this turn (a fallback tokenizer, an MCP server down)."""


class TurnStartRequest(BaseModel):
    """What a turn's first model call does before it asks the provider, in place of the
    ``begin_turn`` local activity (issue 31: a local activity is a workflow activation of
    its own, and every turn ran one): it checks that the worker still lists the tools
    the call offers (``listing.known_ref``), and searches the user's memories
    (``recall``), putting them into the context it was sent when they fit."""

    listing: ListToolsInput
    """As the ``list_tools`` activity takes it; ``known_ref`` is the listing the call's
    tools come from."""
    recall: SearchMemoriesInput | None = None
    """As the ``search_memories`` activity takes it; None: no recall this turn."""
    budget: int = Field(default=0, ge=0)
    """The context's token budget: the memories go in only when
    ``ceil((CallModelInput.context_tokens + their tokens) * correction) <= budget``, the
    test the session's own context build makes (:func:`hermes.content.context.build_context`)."""
    correction: float = 1.0


class TurnStartOutcome(BaseModel):
    """What a :class:`TurnStartRequest` found, and whether the call went to the provider."""

    listing: ListToolsResult | None = None
    """The worker's tools (``unchanged`` when they are the known listing); None when
    listing them failed (``why``)."""
    recall: SearchMemoriesResult | None = None
    """What the search found; None when none was asked for or it failed (``recall_failed``)."""
    recall_failed: str | None = None
    memories_tokens: int = 0
    """Tokens of the memories message put into the context (0: none was)."""
    sent: bool = False
    """The provider was asked, with the memories in the context. False: it was not (the
    result's message is empty and counts nothing); the session takes the listing and
    the recall, and calls again after ``why``."""
    why: str = ""
    """Why the call was not sent: the tools changed, the listing or search failed, or
    the memories do not fit the context as it was built."""


# Built now, with the turn-start types they name defined: never lazily, on a first use
# inside a workflow's sandbox (a schema build there cost an activation milliseconds).
CallModelInput.model_rebuild()
CallModelResult.model_rebuild()


class SummarizeInput(BaseModel):
    """Fold messages (by reference) and the previous summary into a new summary."""

    session_id: str
    message_refs: list[str]
    message_turns: list[int] = Field(default_factory=list)
    """The turn of each referenced message: a summary whose input had to be cut covers
    only the whole turns it was shown (``Summary.upto_turn``)."""
    previous_summary: str = ""
    upto_turn: int
    max_tokens: int = 800
    max_input_tokens: int = 60_000
    """The conversation text given to the model is cut to this many tokens."""
    model: str | None = None
    profile: ProviderProfileName | None = None
    """Provider profile of the session (see ``CallModelInput.profile``)."""
    encoding: str = ""
    usage_user_id: str | None = None
    """See ``CallModelInput.usage_user_id``."""
    usage_day: str | None = None
    bodies: dict[str, str] = Field(default_factory=dict)
    """See ``CallModelInput.bodies``."""
    bodies_stored: bool = False
    """See ``CallModelInput.bodies_stored``."""


class StoreBodiesInput(BaseModel):
    """Bodies (reference -> text) a model call will read, for ``store_message_bodies``."""

    session_id: str
    bodies: dict[str, str]


class StoredContent(BaseModel):
    """A large input kept by reference (a user message or tool result over the limit)."""

    ref: str
    size_bytes: int
    preview: str


class RunToolInput(BaseModel):
    session_id: str
    user_id: str
    turn: int
    tool_call: ToolCall
    idempotent: bool = True
    mcp: McpOrigin | None = None
    """For an MCP tool: the server and tool the turn's recorded list named."""
    chain_id: str = ""
    """The session's first run id (stable across continue-as-new, new if the id is reused
    after a termination), so that exactly-once records never alias across sessions."""

    @property
    def call_key(self) -> str:
        """Unique per tool call for the life of a session id: a model may reuse its ids."""
        return ":".join(p for p in (self.session_id, self.chain_id, str(self.turn), self.tool_call.tool_call_id) if p)


class ValidateToolCallResult(BaseModel):
    """Outcome of checking a tool call before it is put to a human or a child workflow."""

    arguments: dict[str, Any] = Field(default_factory=dict)
    """The coerced, validated arguments (what an approval shows and the tool receives);
    a stand-in when ``arguments_ref`` is set."""
    arguments_ref: str | None = None
    """Where the coerced arguments are kept when they are too large to return inline
    (see ``ToolCall.arguments_ref``)."""
    error: ToolResult | None = None
    """Set when the call must not run: code 1 (bad arguments) or 3 (permission)."""


class CompositeInput(BaseModel):
    """Input of the child workflow that runs a composite tool's steps."""

    session_id: str
    user_id: str
    turn: int
    chain_id: str = ""
    tool_call: ToolCall
    steps: list[CompositeStep]
    specs: dict[str, ToolSpec]
    """Specs of the step tools (from the parent's recorded tool list)."""


class SessionIndexEntry(BaseModel):
    """One row of the per-user session index kept in Redis for fast listing."""

    session_id: str
    user_id: str
    channel: str = "cli"
    status: str = "active"
    title: str = ""
    created_at: datetime
    last_active_at: datetime
    turn_count: int = 0
    finished_turn: int | None = None
    """Set when the write follows a turn's end: that turn (published as ``turn_finished``)."""
    finished_status: str | None = None
    """The finished turn's ``TurnResult.status``."""

    @classmethod
    def from_state(cls, state: SessionState, finished: tuple[int, str] | None = None) -> SessionIndexEntry:
        """The row of ``state``; ``finished``: (turn, status) of the turn that just ended."""
        return cls(
            finished_turn=finished[0] if finished else None,
            finished_status=finished[1] if finished else None,
            session_id=state.session_id,
            user_id=state.user_id,
            channel=state.channel,
            status=state.status,
            title=state.title,
            created_at=state.created_at,
            last_active_at=state.last_active_at,
            turn_count=state.turn_count,
        )


class ApprovalPolicy(BaseModel):
    """What a permission requires before a tool call runs (seed 000 §2.3, 002 §3.2).

    ``action``: ``run`` (no approval), ``confirm`` (the user confirms), ``approve`` (a
    human other than the requester approves), ``deny`` (never runs: code 3).
    """

    action: Literal["run", "confirm", "approve", "deny"]
    approvers: list[str] = Field(default_factory=list)
    """Who may decide besides the session's user, for ``confirm`` (empty: the user
    only); who may decide, for ``approve`` (empty: anyone but the requester)."""
    timeout_seconds: float | None = None
    """How long a decision may take; ``None``: ``SessionConfig.approval_timeout_seconds``."""
    on_expiry: OnExpiry = "deny"
    """``deny``: the call is denied (code 5); ``halt``: the session takes no new message
    and the call keeps waiting until a human decides."""


def _default_policies() -> dict[str, ApprovalPolicy]:
    return {
        "read": ApprovalPolicy(action="run"),
        "write": ApprovalPolicy(action="confirm"),
        "admin": ApprovalPolicy(action="approve"),
    }


class SessionConfig(BaseModel):
    """Per-session settings, fixed at creation (defaults from DESIGN.md). A value that can
    never work (a zero window, no attempts) is refused here, naming the field (pydantic
    ``ValidationError``); maxima, cross-field checks and the model name only where a session
    starts (:func:`hermes.sessions.checks.check_session_config`), so a running session's
    config, carried in its history, always decodes."""

    system_prompt: str = (
        "You are Hermes, a helpful assistant. Use the tools when they help; "
        "answer in the user's language."
    )
    model: str | None = None
    model_profile: ProviderProfileName | None = None
    """Provider profile for this session's model calls (``openai``, ``openai-reasoning``,
    ``deepseek``, ``qwen``, ``moonshot``, ``ollama``, ``vllm``, ``llamacpp``); None: the
    worker's ``HERMES_MODEL_PROFILE``, or the one its base URL names."""
    max_iterations: int = Field(default=10, ge=1)
    """Model/tool iterations per turn (seed 000 §2.2: 10)."""
    token_budget: int | None = Field(default=None, ge=1)
    """Tokens (prompt + completion, as providers report them) the session's model calls may
    use over its life, summaries included; None: no limit. A model call is not started
    once the session has used it: the turn ends ``budget_exceeded`` and the user is told."""
    user_daily_token_budget: int | None = Field(default=None, ge=1)
    """Tokens one user's model calls may use per UTC day across all their sessions
    (counted in Redis by the model activities, summaries included); None: no limit. The
    turn that finds it used ends ``budget_exceeded``; the next UTC day it works again."""
    context_window_tokens: int = Field(default=128_000, ge=1)
    """The model's context window, in tokens."""
    context_reserve_ratio: float = Field(default=0.2, ge=0.0, lt=1.0)
    """Share of the window kept free for the model's output and tool results (seed 000
    §1.2: 15-20%): the context sent is at most ``window * (1 - reserve)`` tokens."""
    context_recent_messages: int = Field(default=10, ge=1)
    """The last this-many messages go to the model whole (seed 004 §3.2: 10); a tool call
    and its results are never split."""
    context_history_turns: int = Field(default=30, ge=1)
    """Turns older than the recent messages, up to this many turns back, keep only user
    messages and final answers (seed 004 §3.2: 30); older ones are folded into the summary."""
    summary_max_tokens: int = Field(default=800, ge=50)
    """Budget of the running summary (seed 002 §2.2: about 800 tokens)."""
    summary_every_turns: int = Field(default=10, ge=1)
    """A summary is made at most once every this-many turns (DESIGN.md)."""
    summary_retry_turns: int = Field(default=3, ge=1)
    """After a failed or empty summary, wait this many turns before trying again."""
    model_timeout_seconds: float = Field(default=120.0, gt=0)
    """Start-to-close timeout of one model call attempt."""
    model_max_attempts: int = Field(default=5, ge=1)
    """Attempts of one model call (retried with backoff on provider errors worth retrying)."""
    model_heartbeat_seconds: float = Field(default=1.0, ge=0)
    """Heartbeat timeout of model calls, summaries and memory extraction: an attempt on a
    worker that died is retried after at most this long (``HERMES_MODEL_HEARTBEAT_SECONDS``);
    0: none, only ``model_timeout_seconds``."""
    approval_timeout_seconds: float = Field(default=600.0, gt=0)
    """How long a tool call waits for a human decision before it is denied."""
    max_message_bytes: int = Field(default=256 * 1024, ge=1)
    """Largest user message taken inline, in UTF-8 bytes (Temporal's payload cap is 2 MB).
    A larger one is stored by reference (a preview goes into the session) when the
    client has the content store, else refused with ``MessageRejectedError``."""
    max_history_bytes: int = Field(default=8_000_000, ge=1)
    """Continue as new once a run's history passes this size (well under Temporal's
    50 MB hard limit; Temporal itself suggests it at about 4 MiB)."""
    idle_after_seconds: float = Field(default=1800.0, gt=0)
    """A session without a message for this long is ``idle`` (seed 000 §1.3: 30 min)."""
    archive_after_seconds: float = Field(default=7 * 86400.0, gt=0)
    """An idle session writes a snapshot and completes after this long without a message
    (seed 000 §1.3: 7 days); its next message resumes it from the snapshot."""
    replay_budget_events: int = Field(default=1000, ge=0)
    """Continue-as-new (between turns) once a run's history has this many events, so a
    worker that takes the session over replays at most about this many, however long
    the session is (issue 12: a 146-turn run took 6.6 s to replay); 0: no budget."""
    max_updates_per_run: int = Field(default=500, ge=1)
    """Continue-as-new after this many messages, well below Temporal's 2,000 updates per run."""
    max_completed_ids: int = Field(default=32, ge=0)
    """How many replies are remembered for resends (returned as they were); older ids
    within ``max_answered_ids`` are answered "already answered in turn N". Every cached
    session holds these in the worker's memory (issue 12), so the default covers the
    resends clients make (the last few messages), not the whole session."""
    max_answered_ids: int = Field(default=2000, ge=0)
    """How many client message ids (with their turn) are remembered beyond the replies:
    a resend of one of them is answered "already answered in turn N", never run again."""
    max_system_prompt_bytes: int = Field(default=100_000, ge=1)
    """Larger system prompts sent by signal are refused (listed in the state's notices)."""
    approval_policies: dict[Permission, ApprovalPolicy] = Field(default_factory=_default_policies)
    """Per permission: ``read`` runs, ``write`` needs the user's confirmation, ``admin`` an
    approval by someone other than the requester; expiry denies unless ``halt``. A
    permission left out keeps its default."""

    @field_validator("approval_policies")
    @classmethod
    def _keep_default_policies(cls, value: dict[str, ApprovalPolicy]) -> dict[str, ApprovalPolicy]:
        return {**_default_policies(), **value}
    max_argument_retries: int = Field(default=3, ge=0)
    """A tool call whose arguments fail validation goes back to the model this many
    times per tool and turn; after that the user is told (seed 004 §4.2: 3)."""
    tool_routing: Literal["all", "keywords"] = "keywords"
    """``keywords``: when tools declare groups, offer only the groups the message is about
    (plus ungrouped tools); ``all``: offer every tool."""
    max_routed_groups: int = Field(default=2, ge=1)
    """At most this many groups are offered per turn by routing."""
    max_carry_bytes: int = Field(default=400_000, ge=1)
    """Byte budget of the state carried across continue-as-new (it enters history twice
    per continue-as-new, and Temporal warns above 512 KB per payload); older turns beyond
    it are archived (the durable store, table ``hermes_transcript``, with a copy in Redis) first."""
    memory_enabled: bool = True
    """Long-term memory for this session (when the worker serves it): memories recalled
    before the turn's model calls, written after its reply (DESIGN.md "Memory")."""
    memory_max_injected: int = Field(default=3, ge=0, le=5)
    """Memories given to the model per turn (seed 000 §5.2: 3; seed 004 §6.3: at most 5)."""
    memory_max_chars: int = Field(default=200, ge=20, le=500)
    """Each injected memory is cut to this many characters (seed 004 §6.3: 200)."""
    memory_extract_every_turns: int = Field(default=8, ge=1)
    """A model extraction runs at least this often (seed 002 §6.4: every 8 turns)."""
    memory_min_confidence: float = Field(default=0.75, ge=0.0, le=1.0)
    """Candidates below this confidence are dropped (seed 000 §5.2: 0.75)."""
    memory_promote_after_refs: int = Field(default=3, ge=1)
    """A working-memory item referenced this many times becomes long-term (seed 004 §7.2)."""


class SendMessageInput(BaseModel):
    text: str
    stored: StoredContent | None = None
    """Set when the message was too large to send inline: ``text`` is then its preview and
    the whole message is in the content store under ``stored.ref``."""
    client_message_id: str | None = None
    """A resend with the same id returns the first reply and runs no second turn."""
    user_id: str | None = None
    """Whose session it is addressed to: a session takes messages only for its own user
    (its ``SessionInput.user_id``) and refuses others' as ``SessionForbiddenError``, not
    taken. ``None`` (clients before issue 16): not checked."""
    proof: CommandProof | None = None
    """Who sent it (:mod:`hermes.security.command_auth`): the session's user, or a sender with the
    ``admin`` role, recorded as the message's ``sender``. Without a valid proof the
    message is refused (``CommandRefusedError``), not taken."""


class ToolCallRecord(BaseModel):
    """What happened to one tool call within a turn."""

    tool_call_id: str
    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)
    result: ToolResult
    approval: Literal["not_required", "approved", "rejected", "expired", "cancelled"] = "not_required"
    approver: str | None = None
    fallback: str | None = None
    """The fallback tool whose result this is, when the primary failed."""


class TurnResult(BaseModel):
    """The reply to one user message, with the tool calls made to produce it."""

    session_id: str
    turn: int
    reply: str
    status: TurnStatus = "completed"
    tool_calls: list[ToolCallRecord] = Field(default_factory=list)
    client_message_id: str | None = None
    tool_groups: list[str] | None = None
    """Groups the routing step offered this turn; ``None``: every tool was offered."""
    warnings: list[str] = Field(default_factory=list)
    """What the user must know whatever the model says: e.g. a side effect whose outcome
    is unknown (it may or may not have happened, and will not be repeated unasked)."""
    memories: list[str] = Field(default_factory=list)
    """Long-term memories given to the model this turn, as it saw them (date, score, text)."""


class PendingApproval(BaseModel):
    """A tool call waiting for a human decision: a durable object in the session state,
    found across sessions through the ``HermesPendingApprovals`` search attribute."""

    tool_call_id: str
    tool_name: str
    arguments: dict[str, Any]
    permission: Permission
    turn: int
    requested_at: datetime
    expires_at: datetime
    session_id: str = ""
    requester: str = ""
    """The session's user, on whose behalf the model asked."""
    requested_by: str = ""
    """Who sent the message whose turn asked for the call, when not the session's user
    (an admin posting into it); they never decide it. ``""``: the session's user."""
    action: Literal["confirm", "approve"] = "confirm"
    approvers: list[str] = Field(default_factory=list)
    """See :meth:`may_decide`: for ``confirm``, who may decide besides the requester;
    for ``approve``, who may decide (empty: anyone but the requester)."""
    on_expiry: OnExpiry = "deny"
    expired: bool = False
    """Past ``expires_at`` with ``on_expiry="halt"``: the session is halted on it."""
    reason: str = ""
    """Why a human is asked, when not only the permission (e.g. an unknown outcome)."""

    def may_decide(self, approver: str, *, identities: bool = True) -> str | None:
        """Whether ``approver`` may decide this call: ``None`` if so, else why not (one
        line, for the decision record and the audit log).

        A ``confirm`` is decided by the session's user (``requester``) or a listed
        approver; an ``approve`` by a listed approver (any one when none is listed), never
        the requester; neither ever by whoever sent the message that caused the call when
        that was not the session's user (``requested_by``: an admin posting into it).

        Args:
            approver: who decides (a user id).
            identities: False gives the rule of sessions before the ``session-identity``
                patch, under which anyone could decide a ``confirm`` with no listed
                approvers (and the requester only when listed).
        """
        if self.action == "approve" and approver == self.requester:
            return f"{approver!r} requested this call; an approval must come from someone else"
        if self.requested_by and approver == self.requested_by:
            return f"{approver!r} sent the message that caused this call; a decision must come from someone else"
        if identities and self.action == "confirm":
            if approver == self.requester or approver in self.approvers:
                return None
            listed = f" or a listed approver ({', '.join(self.approvers)})" if self.approvers else ""
            return f"{approver!r} may not confirm this call: only the session's user {self.requester!r}{listed} may"
        if self.approvers and approver not in self.approvers:
            return f"{approver!r} may not decide; allowed: {', '.join(self.approvers)}"
        return None


class ApprovalDecision(BaseModel, frozen=True):
    """A human's verdict on one pending tool call."""

    tool_call_id: str
    """Id listed by `get_pending_approvals`; unknown or already settled ids are ignored."""
    approved: bool = True
    approver: str = "user"
    reason: str | None = None
    proof: CommandProof | None = None
    """Proof that ``approver`` sent it (:mod:`hermes.security.command_auth`); a decision without a
    valid one, or whose proof names another sender, is recorded ``not_allowed``."""


class DecisionRecord(BaseModel):
    """Audit record of a decision signal and what it did."""

    tool_call_id: str
    approved: bool
    approver: str
    reason: str | None = None
    outcome: Literal["applied", "unknown_tool_call", "already_decided", "not_allowed"]
    at: datetime
    detail: str = ""
    """Why a decision was not applied."""


class ApprovalAuditEntry(BaseModel):
    """One line of the approval audit log: who asked for what, who decided, when."""

    entry_id: str
    """Unique within the session and stable across retries of its write."""
    session_id: str
    tool_call_id: str
    tool_name: str
    event: Literal["requested", "decision", "halted", "verdict"]
    """``requested``: a call was put up for decision; ``decision``: a signal arrived (with
    its ``outcome``); ``halted``: it expired under ``on_expiry="halt"``; ``verdict``: the
    call was settled (approved, rejected, expired, cancelled)."""
    at: datetime
    requester: str = ""
    permission: Permission = "write"
    arguments: dict[str, Any] = Field(default_factory=dict)
    approver: str | None = None
    approved: bool | None = None
    outcome: str = ""
    """For ``decision``: applied / unknown_tool_call / already_decided / not_allowed; for
    ``verdict``: approved / rejected / expired / cancelled."""
    detail: str = ""
    reason: str | None = None
    turn: int | None = None
    """The turn whose tool call this is (None: entries written before it was recorded, and
    a decision on a tool call the session does not know)."""


class ApprovalAuditBatch(BaseModel):
    """Audit entries written together by one local activity."""

    entries: list[ApprovalAuditEntry]


class TraceStep(BaseModel):
    """One step of a turn (seed 002 §7.3): model call, tool call or approval wait."""

    session_id: str
    turn: int
    step: int
    action_type: Literal["model", "tool", "approval", "summary", "memory"]
    provider: str = ""
    tool_name: str | None = None
    latency_ms: float = 0.0
    tokens: int = 0
    status: str = "ok"


class ContextCarry(BaseModel):
    """What a session run's context planner hands to the run that continues it
    (continue-as-new only; an archived session's snapshot holds none: days later the
    content store may have let the bodies go). Issue 31: a new run's first turn listed its
    tools, searched the memories and wrote its whole context to the content store in three
    local activities, each a workflow activation of its own, once a run."""

    listing: ListToolsResult | None = None
    """The run's last tool listing (tools, groups, reference; whether the worker serves
    memory): the next run's first turn offers it, and its first model call checks that the
    worker still lists it and searches the memories, as every later turn does."""
    sent_ref: str | None = None
    """The content reference of the last model call's context list."""
    sent_refs: list[str] = Field(default_factory=list)
    """That list's references: the next run's first call sends its list as a change to it."""
    stored: list[str] = Field(default_factory=list)
    """The references of that call (its list, messages, tool list) the run wrote to the
    content store: the next run's first call does not write them again (a body the store
    lost is written again once, as within a run)."""


MAX_CARRIED_CONTEXT_BYTES = 96_000
"""A larger :class:`ContextCarry` (JSON bytes) is not carried across continue-as-new: the next
run lists, searches and writes its context's bodies again. With the state's own limit
(``MAX_CARRY_PAYLOAD_BYTES``, 1.8 MB) the input stays under Temporal's 2 MB."""


class SessionCarry(BaseModel):
    """State carried across continue-as-new."""

    messages: list[Message] = Field(default_factory=list)
    turn_count: int = 0
    created_at: datetime | None = None
    last_active_at: datetime | None = None
    token_estimate: int = 0
    completed: dict[str, TurnResult] = Field(default_factory=dict)
    answered_ids: dict[str, int] = Field(default_factory=dict)
    """Client message ids of the newest answered messages (at most
    ``SessionConfig.max_answered_ids``) and their turns: a resend whose reply has left the
    resend cache and whose turn has left the state is recognised, never run again."""
    trace: list[TraceStep] = Field(default_factory=list)
    decisions: list[DecisionRecord] = Field(default_factory=list)
    title: str = ""
    run_index: int = 0
    system_prompt: str | None = None
    settled_tool_call_ids: list[str] = Field(default_factory=list)
    archived_messages: int = 0
    """Messages moved to the transcript archive; the carried ones follow them."""
    unknown_outcomes: dict[str, str] = Field(default_factory=dict)
    """Non-idempotent calls whose outcome is unknown: ``tool + arguments`` fingerprint ->
    tool call id. The same call again needs a human's approval."""
    notices: list[str] = Field(default_factory=list)
    tool_groups: list[str] | None = None
    """Groups routed in the last turn (a follow-up without keywords keeps them)."""
    chain_id: str = ""
    """The session's first run id (kept when it resumes from a snapshot)."""
    seen_proofs: dict[str, datetime] = Field(default_factory=dict)
    """Signal proofs already taken (MAC -> issue time, :mod:`hermes.security.command_auth`): the
    same proof sent again changes nothing."""
    summary: Summary | None = None
    summary_retry_turn: int = 0
    """No summary is attempted before this turn (after a failure or an empty summary)."""
    last_summary_turn: int = 0
    encoding: str = ""
    token_correction: float = 1.0
    context_tokens: int = 0
    """Estimated tokens of the last model call's context (``SessionState.context_tokens``):
    carried, so a session that just continued as new does not report 0."""
    """Reported prompt tokens over our estimate (moving average), applied to the budget."""
    status: str = "active"
    working_memory: list[WorkingItem] = Field(default_factory=list)
    last_extracted_turn: int = 0
    """Turns up to this one were given to a model memory extraction."""
    pending_extractions: list[ExtractMemoriesInput] = Field(default_factory=list)
    """Memory extractions not finished when the run ended: the next run sends them."""
    tokens_used: int = 0
    """Tokens the session's model calls used (prompt + completion, summaries included)."""
    user_day: str = ""
    user_day_tokens: int = 0
    """The user's tokens on ``user_day`` (UTC), as the newest model call reported them."""
    context: ContextCarry | None = None
    """What the context planner knew at continue-as-new (:class:`ContextCarry`)."""


class SnapshotInput(BaseModel):
    """The final snapshot of a session archived after ``archive_after_seconds`` idle."""

    session_id: str
    carry: SessionCarry


class SessionInput(BaseModel):
    session_id: str
    user_id: str = "anonymous"
    channel: str = "cli"
    config: SessionConfig = Field(default_factory=SessionConfig)
    carry: SessionCarry | None = None
    proof: CommandProof | None = None
    """Proof of who started the session (:mod:`hermes.security.command_auth`, command
    ``start_session``); a run started without a valid one (not continued as new) ends
    failed at once and takes no message, so its id can be started again properly."""


class TakenMessage(BaseModel):
    """One message a session took, as the ``get_taken_messages`` query answers it (what
    ``hermes serve`` reads to attach a client's retry to the turn it already started)."""

    client_message_id: str
    running: bool
    """Queued or running now: a resend under this id waits for its reply."""
    answered_at: datetime | None = None
    """When its turn ended (its last transcript message; UTC); ``None`` while running, or
    when the session no longer holds the turn (its reply or turn number is still kept)."""


class SessionState(BaseModel):
    """Answer of the ``get_state`` query."""

    session_id: str
    user_id: str
    channel: str
    status: SessionStatus
    title: str
    created_at: datetime
    last_active_at: datetime
    turn_count: int
    token_estimate: int
    system_prompt: str
    busy: bool
    queued_messages: int
    pending_approvals: list[PendingApproval]
    decisions: list[DecisionRecord]
    run_index: int
    updates_this_run: int
    history_length: int
    archived_messages: int = 0
    """Oldest messages kept in the transcript archive instead of the workflow state."""
    chain_id: str = ""
    """First run id of this session (stable across continue-as-new); keys its archive."""
    notices: list[str] = Field(default_factory=list)
    """Signals the session refused, and why (e.g. a system prompt over the size limit)."""
    summary: Summary | None = None
    """The running summary of the turns left out of the context."""
    context_tokens: int = 0
    """Estimated tokens of the last context sent to the model."""
    history_size_bytes: int = 0
    snapshot: SessionCarry | None = None
    """Set in the final state of an archived session: what its next run resumes from."""
    tokens_used: int = 0
    """Tokens the session's model calls used (prompt + completion, summaries included)."""
    token_budget: int | None = None
    user_day: str = ""
    """The UTC day (``YYYY-MM-DD``) of ``user_day_tokens``."""
    user_day_tokens: int = 0
    """The user's tokens on ``user_day`` (all sessions) as the newest model call reported them."""
    user_daily_token_budget: int | None = None
