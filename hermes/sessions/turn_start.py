"""The ``begin_turn`` local activity's input and result: a turn's tool listing and its
memory recall in one local activity (issue 31: each local activity is a workflow
activation and a history marker, and every turn ran these two back to back).

Pydantic only (imported by workflow code).
"""

from __future__ import annotations

from pydantic import BaseModel

from hermes.memory.models import SearchMemoriesInput, SearchMemoriesResult
from hermes.models import ListToolsInput, ListToolsResult


class BeginTurnInput(BaseModel):
    listing: ListToolsInput
    """As the ``list_tools`` activity takes it."""
    recall: SearchMemoriesInput
    """As the ``search_memories`` activity takes it."""


class BeginTurnResult(BaseModel):
    listing: ListToolsResult
    recall: SearchMemoriesResult | None = None
    """None when the search failed (``recall_failed`` says why) or this worker serves no
    long-term memory (``listing.memory`` False)."""
    recall_failed: str | None = None
    """Why the search raised or ran out of time: the session searches again with the
    ``search_memories`` activity, where any worker may take it."""
