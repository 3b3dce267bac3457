"""Memory payloads: what crosses the workflow boundary, and the row of the store.

Pydantic only (imported by workflow code). Times are UTC.
"""

from __future__ import annotations

import hashlib
from datetime import datetime, timezone
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from hermes.memory.judge import JudgePair
from hermes.memory.rules import stated_subject
from hermes.security.proof import CommandProof

MemoryKind = Literal["working", "fact", "preference", "episode"]
"""``working``: a fact of the current task, promoted from a session after 3 references;
``fact`` / ``preference``: long-term user knowledge; ``episode``: a task's conclusion or a
summary (DESIGN.md "Memory", seed 004 §6.1)."""
MemoryStatus = Literal["active", "superseded", "merged", "archived", "expired"]
"""``active`` rows are searched. ``superseded`` rows stay in the store, linked to the row
that replaced them (``superseded_by``); ``merged``, ``archived`` and ``expired`` rows live
in the archive table."""
MemorySource = Literal["rules", "remember", "model", "promotion", "cli", "api"]
"""Where a memory came from. ``remember`` (the rules found "remember ..." / "记住...", or a
client says so) and ``cli`` (``hermes memory add``) are the user's explicit wish to keep it:
such an active row is never archived by age (:data:`hermes.memory.store.PINNED_SOURCES`)."""

MAX_MEMORY_CHARS = 500
"""Longest memory text stored; injected memories are cut further (200 characters)."""


def memory_id_for(user_id: str, text: str, source_session: str = "", source_turn: int = 0) -> str:
    """The deterministic id of a new memory: the same candidate (a retried activity, a
    resent batch) always gets the same id, so writes are upserts and never duplicate."""
    key = "\x1f".join([user_id, source_session, str(source_turn), " ".join(text.split()).casefold()])
    return "mem_" + hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()[:24]


class MemoryCandidate(BaseModel):
    """A memory the write path wants to store (from the rules, a model extraction, a
    promotion of working memory, or the CLI).

    Unknown fields are refused (pydantic ``ValidationError`` naming the field), never
    dropped: a caller's ``metadata`` or misspelt ``importnce`` would otherwise vanish
    without a word. Stored rows are :class:`MemoryRecord`, which this does not touch."""

    model_config = ConfigDict(extra="forbid")

    candidate_id: str = ""
    """Stable id of this candidate (defaults to its future ``memory_id``); a candidate
    seen twice (a retried activity) changes nothing the second time. A caller may choose
    it; memory ids are global (every user's rows share one table), so an id another user
    already has is refused (``WriteReport.refused``), never shared. The default id hashes
    the user id in, so it never collides."""
    user_id: str
    kind: MemoryKind = "fact"
    subject: str = ""
    """Key of a single-valued fact (``home_city``, ``employer``, ``answer_style``): a new
    memory with the subject of an older one, and another value, supersedes it. Empty when
    values can coexist."""
    value: str = ""
    """The subject's value as stated (``Zurich``): the same value restates the memory,
    another one supersedes it. Empty: decided by similarity."""
    text: str = Field(min_length=1, max_length=MAX_MEMORY_CHARS)
    importance: float = Field(default=0.5, ge=0.0, le=1.0)
    confidence: float = Field(default=0.8, ge=0.0, le=1.0)
    source: MemorySource = "model"
    source_session: str = ""
    source_turn: int = 0
    created_at: datetime
    valid_until: datetime | None = None

    @field_validator("created_at", "valid_until")
    @classmethod
    def _aware_utc(cls, value: datetime | None) -> datetime | None:
        # A naive time (from the API or the CLI) is UTC: compared with the writer's aware
        # ``forgotten_at``, a naive one would fail the workflow task.
        if value is None:
            return None
        return value.replace(tzinfo=timezone.utc) if value.tzinfo is None else value.astimezone(timezone.utc)

    def model_post_init(self, __context: object) -> None:
        if not self.candidate_id:
            self.candidate_id = memory_id_for(self.user_id, self.text, self.source_session, self.source_turn)
        if not self.subject and self.kind == "fact":
            # "User lives in Bern." written without a subject is still the user's home: a
            # later home (the rules' "I moved to Zurich") supersedes it (issue 30).
            self.subject, self.value = stated_subject(self.text)


class MemoryRecord(BaseModel):
    """One row of the memory store (DESIGN.md "Memory"), without its vector."""

    memory_id: str
    user_id: str
    kind: MemoryKind
    subject: str = ""
    value: str = ""
    text: str
    embedding_model: str
    importance: float
    confidence: float
    source_session: str = ""
    source_turn: int = 0
    created_at: datetime
    updated_at: datetime
    last_hit_at: datetime | None = None
    hit_count: int = 0
    mentions: int = 1
    """How many times the memory was stated (deduplicated candidates count here)."""
    valid_until: datetime | None = None
    superseded_by: str | None = None
    status: MemoryStatus = "active"


class RetrievedMemory(BaseModel):
    """A memory chosen for a context, with the scores that chose it."""

    memory_id: str
    kind: MemoryKind
    text: str
    """Cut to the injection limit (200 characters by default)."""
    updated_at: datetime
    similarity: float
    """Cosine similarity to the query (the embedding model's own scale)."""
    score: float
    """0.5 similarity + 0.2 recency + 0.2 importance + 0.1 frequency (seed 004 §6.3), each
    term in 0-1."""

    def line(self) -> str:
        """How it is shown to the model: ``(2026-11-30, score 0.87) text``."""
        return f"({self.updated_at:%Y-%m-%d}, score {self.score:.2f}) {self.text}"


class SearchMemoriesInput(BaseModel):
    user_id: str
    query: str
    session_id: str = ""
    turn: int | None = None
    """The session's turn the search is for: what it recalled is published as that turn's
    ``memories_recalled`` event (:mod:`hermes.content.events`)."""
    limit: int = Field(default=3, ge=1, le=5)
    kinds: list[MemoryKind] = Field(default_factory=lambda: ["fact", "preference", "episode", "working"])
    max_chars: int = Field(default=200, ge=20, le=MAX_MEMORY_CHARS)


def recall_warning(error: str) -> str:
    """The one sentence a turn says when its memories were not searched: the search's
    ``warning`` turn event and the turn result's ``warnings`` carry the same text, so a
    view that shows both shows one warning (issue 32 saw two wordings of each).

    Args:
        error: :attr:`SearchMemoriesResult.error` (a leading "the memory store was not
            searched: " is not said twice).
    """
    reason = error.removeprefix("the memory store was not searched: ")
    return f"Long-term memory was not searched: {reason}"


class SearchMemoriesResult(BaseModel):
    memories: list[RetrievedMemory] = Field(default_factory=list)
    error: str | None = None
    """Why no search was made (the store refused it: e.g. rows of another embedding
    model); the turn goes on without memories and says so in its warnings."""


class ConversationExcerpt(BaseModel):
    """One line of a conversation given to memory extraction."""

    turn: int
    role: Literal["user", "assistant"]
    text: str


class ExtractMemoriesInput(BaseModel):
    """Candidates the session found by rules, and (when ``use_model``) the conversation to
    ask the model about; the activity delivers what passes to the user's memory writer."""

    user_id: str
    session_id: str
    turn: int
    created_at: datetime
    rule_candidates: list[MemoryCandidate] = Field(default_factory=list)
    excerpt: list[ConversationExcerpt] = Field(default_factory=list)
    use_model: bool = False
    model: str | None = None
    min_confidence: float = 0.75
    reasons: list[str] = Field(default_factory=list)
    """Which triggers fired (``explicit``, ``correction``, ``every_8_turns``, ``close``...)."""
    usage_day: str | None = None
    """Set when a daily token budget applies: the model call's tokens count for the user's
    UTC day (``CallModelInput.usage_day``)."""


class ExtractMemoriesResult(BaseModel):
    delivered: int = 0
    dropped_low_confidence: int = 0
    model_candidates: int = 0
    error: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    """What the extraction's model call used (0 without one): counted against the token budgets."""
    user_day_tokens: int | None = None
    """The user's tokens that UTC day after this call (``usage_day`` set and Redis reachable)."""


class MemoryBatch(BaseModel):
    """Candidates for a user's memory writer (the ``add_memories`` signal)."""

    candidates: list[MemoryCandidate]
    proof: CommandProof | None = None
    """Who sends it (:mod:`hermes.security.command_auth`): the writer's user or an admin, as a
    holder of the command key vouches; a batch without a valid proof is refused."""


MEMORY_HEARTBEAT_SECONDS = 10.0
"""Default heartbeat timeout of the memory writer's and the consolidation's activities
(``HERMES_MEMORY_HEARTBEAT_SECONDS``, :attr:`hermes.settings.Settings.memory_heartbeat_seconds`
says why it is longer than a model call's)."""

class MemoryWriterInput(BaseModel):
    """Start (and continue-as-new) input of a user's memory writer."""

    user_id: str
    proof: CommandProof | None = None
    """Proof of who started the writer (command ``start_memory_writer``); a run started
    without a valid one (not continued as new) ends failed at once."""
    batch_size: int = Field(default=10, ge=1)
    batch_seconds: float = Field(default=5.0, gt=0)
    """A batch is written when it has ``batch_size`` candidates or its oldest has waited
    this long (seed 004 §9: 10 items or 5 s)."""
    idle_seconds: float = Field(default=300.0, gt=0)
    """The writer completes after this long with nothing to write (the next candidate
    starts it again)."""
    pending: list[MemoryCandidate] = Field(default_factory=list)
    seen: list[str] = Field(default_factory=list)
    """Recent candidate ids (a candidate delivered twice is written once)."""
    forgotten_at: datetime | None = None
    """Candidates created before this were said before the user asked to be forgotten."""
    heartbeat_seconds: float = Field(default=MEMORY_HEARTBEAT_SECONDS, ge=0)
    """Heartbeat timeout of the writer's store activities (``HERMES_MEMORY_HEARTBEAT_SECONDS``):
    a write on a dead worker is retried after this long; 0: none (start-to-close only)."""
    max_judge_calls: int = Field(default=0, ge=0)
    """Model calls of the memory judge per written batch (``HERMES_MEMORY_JUDGE_MAX_CALLS``);
    0: the rules decide every pair (no model)."""
    judge_model: str | None = None


class WriteMemoriesInput(BaseModel):
    user_id: str
    candidates: list[MemoryCandidate]
    judge: bool = False
    """Leave the pairs the rules cannot settle to the model (``WriteReport.judge_pairs``)."""


class WriteReport(BaseModel):
    """What a batch of writes did."""

    inserted: list[str] = Field(default_factory=list)
    updated: list[str] = Field(default_factory=list)
    """Rows a near-duplicate candidate refreshed instead of inserting (dedupe)."""
    superseded: list[str] = Field(default_factory=list)
    unchanged: int = 0
    """Candidates already applied by an earlier write (a batch sent again). A retried
    ``write_memories`` activity reports instead what its earlier attempt's write did
    (``inserted``, ``updated``, ``superseded``), read back from the rows it wrote."""
    dropped: int = 0
    """Candidates not stored: empty after cleaning, for a forgotten user, or ``refused``."""
    refused: list[str] = Field(default_factory=list)
    """One line per candidate not stored although it had content, naming its id and why
    (``memory_id 'm1' is already used by another user``); also counted in ``dropped``."""
    error: str | None = None
    """Why the batch is not written yet (it stays pending: e.g. the store holds another
    embedding model's rows until ``hermes memory reembed``)."""
    judge_pairs: list[JudgePair] = Field(default_factory=list)
    """Pairs of this batch the rules left to the model (written with ``judge=True`` only):
    the writer passes them to ``judge_memories``. Not carried by :meth:`merge`."""

    def merge(self, other: WriteReport) -> WriteReport:
        return WriteReport(
            inserted=self.inserted + other.inserted,
            updated=self.updated + other.updated,
            superseded=self.superseded + other.superseded,
            unchanged=self.unchanged + other.unchanged,
            dropped=self.dropped + other.dropped,
            refused=(self.refused + other.refused)[-200:],
        )


class ForgetReport(BaseModel):
    user_id: str
    deleted: int = 0
    """Rows deleted from the memory table and the archive."""
    pending_dropped: int = 0
    """Candidates still waiting to be written, dropped."""


class ConsolidationReport(BaseModel):
    """What one consolidation run changed (all zero when there was nothing to do)."""

    users: int = 0
    merged: int = 0
    superseded: int = 0
    archived: int = 0
    expired: int = 0
    rows_before: int = 0
    rows_after: int = 0
    details: list[str] = Field(default_factory=list)
    """One line per change, capped (``merged mem_a into mem_b``)."""
    judge_pairs: list[JudgePair] = Field(default_factory=list)
    """Pairs the rules left to the model (``judge=True`` only), at most the run's budget;
    not carried by :meth:`merge`."""

    def changed(self) -> int:
        return self.merged + self.superseded + self.archived + self.expired

    def merge(self, other: ConsolidationReport) -> ConsolidationReport:
        return ConsolidationReport(
            users=self.users + other.users,
            merged=self.merged + other.merged,
            superseded=self.superseded + other.superseded,
            archived=self.archived + other.archived,
            expired=self.expired + other.expired,
            rows_before=self.rows_before + other.rows_before,
            rows_after=self.rows_after + other.rows_after,
            details=(self.details + other.details)[:200],
        )


class ConsolidateInput(BaseModel):
    user_id: str
    now: datetime
    archive_after_days: float
    judge: bool = False
    """Leave the pairs the rules cannot settle to the model (returned in ``judge_pairs``,
    at most ``max_judge_pairs``) instead of deciding them by rules."""
    max_judge_pairs: int = Field(default=0, ge=0)
    """Rows not hit (nor restated) for this long go to the archive table (seed 002 §6.3:
    180 days; seed 000 §5.2: 7 for a personal assistant)."""


class ConsolidationInput(BaseModel):
    proof: CommandProof | None = None
    """Proof that a holder of the command key (as an ``admin``) started it (command
    ``consolidate_memories``, at any age: a Temporal Schedule starts runs with the same
    input again and again); a run without a valid one ends failed at once."""
    archive_after_days: float | None = None
    """None: the worker's setting."""
    users: list[str] | None = None
    """None: every user with memories."""
    report: ConsolidationReport = Field(default_factory=ConsolidationReport)
    """Carried across continue-as-new."""
    done_users: int = 0
    heartbeat_seconds: float = Field(default=MEMORY_HEARTBEAT_SECONDS, ge=0)
    """Heartbeat timeout of the consolidation's store activities
    (``HERMES_MEMORY_HEARTBEAT_SECONDS``); 0: none (start-to-close only)."""
    max_judge_calls: int = Field(default=0, ge=0)
    """Model calls of the memory judge for the whole run (``HERMES_MEMORY_JUDGE_MAX_CALLS``);
    0: rules only. Carried across continue-as-new as what is left."""
    judge_model: str | None = None


class WorkingItem(BaseModel):
    """A fact of the current task held in the session (seed 004 §6.1, §7.2): a tool result
    worth recalling. Promoted to long-term memory once referenced 3 times."""

    key: str
    """The identifier that marks a reference to it (an order number, a ticket id)."""
    text: str
    tool: str = ""
    turn: int = 0
    refs: int = 0
    last_ref_turn: int = 0
    promoted: bool = False
