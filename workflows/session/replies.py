"""The replies a session keeps for resends: exactly-once turns by client message id.

A resend of a message the session answered gets the first reply, never a second turn.
Replies are kept within a count (``SessionConfig.max_completed_ids``) and a byte budget
(``MAX_CACHE_BYTES``), since they are held by every cached session and carried across
continue-as-new; the turn numbers of answered ids are kept longer
(``SessionConfig.max_answered_ids``). Plain Python; nothing here knows of Temporal.
"""

from __future__ import annotations

from collections.abc import Mapping

from hermes.models import TurnResult

from workflows.session.payloads import MAX_CACHE_BYTES, MAX_CACHED_RESULT_BYTES, slim


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
