"""The replies a session keeps for resends: exactly-once turns by client message id.

A resend of a message the session answered gets the first reply, never a second turn.
Replies are kept within a count (``SessionConfig.max_completed_ids``) and a byte budget
(``MAX_CACHE_BYTES``), since they are held by every cached session and carried across
continue-as-new; the turn numbers of answered ids are kept longer
(``SessionConfig.max_answered_ids``). Plain Python; nothing here knows of Temporal.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime

from hermes.models import Message, TakenMessage, TurnResult

from workflows.session.payloads import MAX_CACHE_BYTES, MAX_CACHED_RESULT_BYTES, slim


MAX_TAKEN_LISTED = 50
"""The most messages one ``get_taken_messages`` answer lists (those whose turns are newest)."""


class ReplyBook:
    """Cached replies (``completed``: client message id -> reply, oldest first) and the
    turns of answered ids (``answered``: id -> turn).

    Args:
        completed: carried replies.
        answered: carried answered ids.
        max_completed: how many replies to keep.
        max_answered: how many answered ids to keep.
    """

    def __init__(
        self, completed: Mapping[str, TurnResult], answered: Mapping[str, int], *, max_completed: int, max_answered: int
    ) -> None:
        self.completed: dict[str, TurnResult] = dict(completed)
        self.answered: dict[str, int] = dict(answered)
        self.sizes: dict[str, int] = {cid: len(r.model_dump_json()) for cid, r in self.completed.items()}
        self.max_completed = max_completed
        self.max_answered = max_answered

    def remember(self, cid: str, result: TurnResult) -> None:
        """Keep ``result`` for resends of ``cid`` (slimmed to ``MAX_CACHED_RESULT_BYTES``,
        the reply itself kept whole), evicting the oldest over the count or byte budget
        (the newest always stays)."""
        self.answered[cid] = result.turn
        while len(self.answered) > self.max_answered:
            self.answered.pop(next(iter(self.answered)))
        cached = slim(result, MAX_CACHED_RESULT_BYTES, cut_reply=False)
        self.completed[cid] = cached
        self.sizes[cid] = len(cached.model_dump_json())
        while len(self.completed) > self.max_completed or (
            len(self.completed) > 1 and sum(self.sizes.values()) > MAX_CACHE_BYTES
        ):
            self.evict_oldest()

    def evict_oldest(self) -> int:
        """Drop the oldest cached reply; returns its size in bytes (0 if none)."""
        if not self.completed:
            return 0
        oldest = next(iter(self.completed))
        self.completed.pop(oldest)
        return self.sizes.pop(oldest, 0)

    def already_answered(self, session_id: str, cid: str) -> TurnResult | None:
        """What a resend of ``cid`` gets when its reply is no longer cached but its turn
        number is: a reply naming the turn, with nothing run again; else None."""
        turn = self.answered.get(cid)
        if turn is None:
            return None
        return TurnResult(
            session_id=session_id,
            turn=turn,
            reply="",
            client_message_id=cid,
            warnings=[
                f"This message was already answered in turn {turn}; the reply is no longer held by the "
                "session, read it in the transcript. It was not run again."
            ],
        )


def taken_messages(
    prefix: str, *, running: Iterable[str], replies: ReplyBook, messages: Sequence[Message]
) -> list[TakenMessage]:
    """The messages a session took whose client message ids start with ``prefix``: every
    id a resend would be answered from (running or queued, reply cached, turn number kept,
    or turn still in the transcript), so a caller choosing an id knows exactly which ones
    the session would not run again.

    Args:
        prefix: the start of the client message ids wanted (``""``: all).
        running: ids of the messages queued or running now.
        replies: the session's reply book.
        messages: the transcript the run holds, oldest first.

    Returns:
        At most :data:`MAX_TAKEN_LISTED` messages, the newest last; ``answered_at`` is the
        time of the last message of the turn (``None`` while running or not held).
    """
    ended: dict[int, datetime] = {}
    turns: dict[str, int] = {}
    for m in messages:
        if m.created_at is not None and (m.turn not in ended or m.created_at > ended[m.turn]):
            ended[m.turn] = m.created_at
        cid = m.client_message_id
        if m.role == "user" and cid is not None and cid.startswith(prefix):
            turns[cid] = m.turn
    busy = {cid for cid in running if cid.startswith(prefix)}
    known = [cid for cid in (*replies.answered, *replies.completed, *turns) if cid.startswith(prefix)]
    found: dict[str, TakenMessage] = {}
    for cid in (*known, *sorted(busy)):
        turn = turns.get(cid, replies.answered.get(cid))
        found[cid] = TakenMessage(
            client_message_id=cid, running=cid in busy,
            answered_at=None if cid in busy or turn is None else ended.get(turn),
        )
    return list(found.values())[-MAX_TAKEN_LISTED:]
