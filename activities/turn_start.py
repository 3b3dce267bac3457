"""What a turn needs before its first model call: the worker's tool listing and the
user's memories for the message.

Two ways (issue 31: a local activity is a workflow activation and a history marker of
its own, and every turn ran one):

- the ``begin_turn`` local activity lists and searches concurrently (a run's first turn,
  when the session knows no listing yet, and runs recorded before the
  ``turn-start-in-model-call`` patch);
- every later turn's first model call does it (:meth:`TurnStartActivities.prepare`,
  ``CallModelInput.turn_start``): it checks that the worker still lists the tools the
  call offers, searches, and puts the memories into the context before asking the
  provider. When the tools changed, a search failed or the memories do not fit, the
  provider is not asked: the session takes what was found and calls again.
"""

from __future__ import annotations

import asyncio
import logging
import math

from temporalio import activity

from activities.memory import MemoryActivities
from activities.tools import ToolActivities
from hermes import names
from hermes.content.context import memories_message
from hermes.content.events import TurnEvent
from hermes.content.tokens import BoundedCounter, TokenCounter
from hermes.memory.models import SearchMemoriesInput, SearchMemoriesResult
from hermes.models import CallModelInput, TurnStartOutcome
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
        recall = asyncio.ensure_future(self._recall(request.recall)) if self.memory is not None else None
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

    async def prepare(self, request: CallModelInput, resolved: CallModelInput) -> tuple[CallModelInput, TurnStartOutcome]:
        """A turn's first model call's start (``request.turn_start``): the listing checked,
        the memories searched and, when they fit, put into ``resolved`` (the call with its
        context read) as the session's context build would (after the system prompt).

        Returns:
            The call to send and the outcome; when ``outcome.sent`` is False the call must
            not be sent (``outcome.why``).

        Raises:
            asyncio.CancelledError: the attempt was cancelled (the search is cancelled too).
        """
        start = request.turn_start
        assert start is not None
        search = start.recall
        recall = asyncio.ensure_future(self._recall(search, announce=False)) if search is not None and self.memory is not None else None
        try:
            listing = await self.tools.list_tools(start.listing)
        except Exception as err:  # noqa: BLE001 - the session lists with its own activity
            if recall is not None:
                recall.cancel()
            log.warning("tool listing of session %s turn %s failed: %s", request.session_id, request.turn, err)
            return resolved, TurnStartOutcome(why=f"listing the tools failed ({type(err).__name__}: {err})"[:300])
        except BaseException:
            if recall is not None:
                recall.cancel()
            raise
        found, failed = (await recall) if recall is not None else (None, None)
        if search is not None and self.memory is None:
            failed = "this worker serves no long-term memory"
        outcome = TurnStartOutcome(listing=listing, recall=found, recall_failed=failed)
        if not listing.unchanged:
            return resolved, outcome.model_copy(update={"why": "the worker's tools changed since the session listed them"})
        if failed is not None:
            return resolved, outcome.model_copy(update={"why": f"the memory search failed ({failed})"})
        lines = [m.line() for m in found.memories] if found is not None else []
        if not lines:
            return resolved, outcome.model_copy(update={"sent": True})
        message = memories_message(lines)
        # The session's kind of counter (ContextPlanner.counter); the message is at most
        # limit x max_chars characters.
        tokens = BoundedCounter(TokenCounter.get_or_default(request.encoding)).message(message)
        if math.ceil((request.context_tokens + tokens) * start.correction) > start.budget or not resolved.messages:
            return resolved, outcome.model_copy(update={"why": "the memories do not fit the context as it was built"})
        messages = [resolved.messages[0], message, *resolved.messages[1:]]
        return resolved.model_copy(update={"messages": messages}), outcome.model_copy(update={"sent": True, "memories_tokens": tokens})

    def recall_events(self, request: CallModelInput, outcome: TurnStartOutcome) -> list[TurnEvent]:
        """The events saying what :meth:`prepare` recalled (``memories_recalled``, or the
        search's warning; final: the session keeps the recall whatever follows), which the
        model call publishes after ``turn_started``, sent or not."""
        search = request.turn_start.recall if request.turn_start is not None else None
        if search is None or outcome.recall is None or self.memory is None:
            return []
        return self.memory.recall_events(search, outcome.recall)

    async def _recall(self, search: SearchMemoriesInput, *, announce: bool = True) -> tuple[SearchMemoriesResult | None, str | None]:
        assert self.memory is not None
        try:
            async with asyncio.timeout(RECALL_SECONDS):
                return await self.memory.search_quietly(search, announce=announce), None
        except TimeoutError:
            return None, f"the memory search took over {RECALL_SECONDS:g} s"
        except Exception as err:  # noqa: BLE001 - the session searches again
            log.warning("memory search for session %s turn %s failed: %s", search.session_id, search.turn, err)
            return None, f"{type(err).__name__}: {err}"[:300]
