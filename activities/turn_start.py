"""The ``begin_turn`` activity: what a turn needs before its first model call, the
worker's tool listing and the user's memories for the message, in one local activity
(issue 31: a local activity is a workflow activation and a history marker of its own,
and every turn with long-term memory ran ``list_tools`` and ``search_memories`` back to
back; their work is unchanged, and runs concurrently here)."""

from __future__ import annotations

import asyncio
import logging

from temporalio import activity

from activities.memory import MemoryActivities
from activities.tools import ToolActivities
from hermes import names
from hermes.memory.models import SearchMemoriesResult
from hermes.sessions.turn_start import BeginTurnInput, BeginTurnResult

log = logging.getLogger("hermes.activities.turn_start")

RECALL_SECONDS = 12.0
"""How long the search may take here: within the local activity's 15 s (the listing's
own bound is 8 s per MCP server); a search that takes longer is left for the session to
run again as a normal activity, rather than fail the listing with it."""


class TurnStartActivities:
    """``begin_turn`` over a worker's tool and memory activities (``memory`` None: the
    worker serves no long-term memory, and no search is made)."""

    def __init__(self, tools: ToolActivities, memory: MemoryActivities | None):
        self.tools = tools
        self.memory = memory

    @activity.defn(name=names.BEGIN_TURN)
    async def begin_turn(self, request: BeginTurnInput) -> BeginTurnResult:
        """The listing (as ``list_tools`` gives it) and the recall (as ``search_memories``).

        Raises:
            Whatever ``list_tools`` raises: the session then lists and searches with
            the two activities, as before. A failed or late search does not raise: its
            reason comes back in ``recall_failed``.
        """
        recall = asyncio.ensure_future(self._recall(request)) if self.memory is not None else None
        try:
            listing = await self.tools.list_tools(request.listing)
        except BaseException:
            if recall is not None:
                recall.cancel()
            raise
        if recall is None or self.memory is None:
            return BeginTurnResult(listing=listing)
        found, failed = await recall
        if found is not None:
            # Only now: a listing that failed sends the turn to search again, which says it.
            await self.memory.publish_recall(request.recall, found)
        return BeginTurnResult(listing=listing, recall=found, recall_failed=failed)

    async def _recall(self, request: BeginTurnInput) -> tuple[SearchMemoriesResult | None, str | None]:
        assert self.memory is not None
        try:
            async with asyncio.timeout(RECALL_SECONDS):
                return await self.memory.search_quietly(request.recall), None
        except TimeoutError:
            return None, f"the memory search took over {RECALL_SECONDS:g} s"
        except Exception as err:  # noqa: BLE001 - the session searches again
            log.warning("memory search for session %s turn %s failed: %s", request.recall.session_id, request.recall.turn, err)
            return None, f"{type(err).__name__}: {err}"[:300]
