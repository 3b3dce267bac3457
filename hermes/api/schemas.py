"""Request and response bodies of the HTTP API (pydantic models; their JSON Schemas are
the OpenAPI document's components). Requests refuse unknown fields (422), so a body
cannot carry a name the server would take for the caller's."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from hermes.memory.models import MemoryRecord, RetrievedMemory
from hermes.models import Message, PendingApproval, ProviderProfileName, SessionIndexEntry

__all__ = [
    "ApprovalList",
    "CreateSessionRequest",
    "DecisionRequest",
    "Health",
    "MemoryList",
    "MemorySearchResult",
    "SendMessageRequest",
    "ServerInfo",
    "SessionConfigPatch",
    "SessionCreated",
    "SessionList",
    "Transcript",
]

SESSION_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:@-]{0,199}$"
"""Session ids taken from a request: 1-200 characters, letters, digits and ``._:@-``."""


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SessionConfigPatch(_Request):
    """The settings a new session may choose; the rest come from the server's defaults."""

    system_prompt: str | None = Field(default=None, min_length=1, max_length=100_000)
    model: str | None = Field(default=None, min_length=1, max_length=200, description="The provider's model name")
    model_profile: ProviderProfileName | None = None
    max_iterations: int | None = Field(default=None, ge=1, le=50, description="Model/tool iterations per turn")
    approval_timeout_seconds: float | None = Field(default=None, gt=0, le=7 * 86400, description="Seconds")
    memory_enabled: bool | None = None


class CreateSessionRequest(_Request):
    session_id: str | None = Field(default=None, pattern=SESSION_ID_PATTERN, description="Default: a new UUID-based id")
    channel: str = Field(default="api", min_length=1, max_length=64)
    config: SessionConfigPatch | None = None


class SessionCreated(BaseModel):
    session_id: str
    user_id: str
    channel: str


class SessionList(BaseModel):
    sessions: list[SessionIndexEntry]


class SendMessageRequest(_Request):
    text: str = Field(min_length=1, description="The user's message (UTF-8 text)")


class DecisionRequest(_Request):
    """Optional body of approve/reject. The approver is the key's user, never a field."""

    reason: str | None = Field(default=None, max_length=2000, description="Shown to the model on a rejection")


class ApprovalList(BaseModel):
    approvals: list[PendingApproval]


class Transcript(BaseModel):
    session_id: str
    messages: list[Message]


class MemorySearchResult(BaseModel):
    user_id: str
    memories: list[RetrievedMemory]


class MemoryList(BaseModel):
    user_id: str
    memories: list[MemoryRecord]


class Health(BaseModel):
    status: Literal["ok", "unavailable"]
    temporal: bool = Field(description="Temporal's frontend answered a health check")
    redis: bool = Field(description="Redis answered PING")


class ServerInfo(BaseModel):
    user_id: str = Field(description="The key's user")
    roles: list[str]
    namespace: str = Field(description="The Temporal namespace of the sessions")
    temporal_ui_url: str | None = Field(description="The Temporal Web UI (a session is at {url}/namespaces/{ns}/workflows/{id})")
