"""The transcript a session run holds: its messages, in order, with what is derived
from them (content references, sizes, the archive cut, excerpts, rebuilt replies).

Plain Python over :class:`hermes.models.Message`; nothing here knows of Temporal. Times
come in as arguments (the workflow passes ``workflow.now()``), so every method is
deterministic and unit-tested without a server.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Container, Iterable
from datetime import datetime

from hermes.content import previews
from hermes.content.blobs import message_ref
from hermes.memory.models import ConversationExcerpt
from hermes.models import Message, Summary, ToolCall, ToolCallRecord, ToolResult, ToolResultCode, TurnResult

from workflows.session.payloads import MAX_RESULT_CHARS, message_bytes

TokenCount = Callable[[Message], int]
"""Tokens of one message (the session's counter), or None while its encoding is unknown."""


class Transcript:
    """The messages of a run (``messages``), indexed by content reference (``by_ref``),
    with their JSON size (``live_bytes``) and how many earlier ones went to the archive
    (``archived``).

    Args:
        messages: the carried messages (taken as they are, not copied one by one).
        archived: messages of the session already in the transcript archive.
        count: tokens of a message, or None while the session's encoding is unknown.
    """

    def __init__(self, messages: Iterable[Message], archived: int = 0, count: TokenCount | None = None) -> None:
        self.messages: list[Message] = list(messages)
        self.archived = archived
        self.by_ref: dict[str, Message] = {}
        self._call_ids: Counter[str] = Counter()
        """Tool call ids of the held messages (kept with them: no scan of the run per step)."""
        self._client_ids: Counter[str] = Counter()
        """Client message ids of the held user messages."""
        self.live_bytes = sum(message_bytes(m) for m in self.messages)
        """Size of the messages held, kept up to date once per turn (:meth:`account`)."""
        for m in self.messages:
            self.index(m, count)
        self.head_and_tail: Callable[[], bool] = lambda: False
        """Whether a tool result too long for the model keeps its data's head and tail
        (the ``preview-head-and-tail`` patch), not the head alone."""

    # ------------------------------------------------------------------ adding

    def add(self, message: Message, count: TokenCount | None) -> None:
        """Append, with the body's content reference (and its tokens, once the
        session's encoding is known)."""
        self.messages.append(message)
        self.index(message, count)

    def index(self, message: Message, count: TokenCount | None) -> None:
        if message.ref is None:
            message.ref = message_ref(message)
        if message.tokens is None and count is not None and not message.internal:
            message.tokens = count(message)
        self.by_ref[message.ref] = message
        self._held(message, 1)

    def _held(self, message: Message, change: int) -> None:
        for call in message.tool_calls:
            self._call_ids[call.tool_call_id] += change
        if message.role == "user" and message.client_message_id is not None:
            self._client_ids[message.client_message_id] += change

    def count_all(self, count: TokenCount) -> None:
        """Tokens for every message without them (the session's encoding just became known)."""
        for m in self.messages:
            if m.tokens is None and not m.internal:
                m.tokens = count(m)

    def account(self, first_new: int) -> None:
        """Add the sizes of the messages from index ``first_new`` on to ``live_bytes``."""
        self.live_bytes += sum(message_bytes(m) for m in self.messages[first_new:])

    def notice(self, turn: int, text: str, now: datetime, count: TokenCount | None) -> None:
        """A reply written by Hermes, not the model: kept in the transcript, never sent
        to the model as if it had said it."""
        self.add(Message(role="assistant", content=text, turn=turn, created_at=now, internal=True), count)

    def tool_result(self, turn: int, call: ToolCall, result: ToolResult, now: datetime, count: TokenCount | None) -> None:
        """The result message of ``call``: the result as JSON, one ``{code, message,
        data}`` object of at most ``MAX_RESULT_CHARS`` characters (a longer one keeps a
        preview of its data)."""
        self.add(
            Message(
                role="tool",
                content=result_content(result, head_and_tail=self.head_and_tail()),
                tool_call_id=call.tool_call_id,
                name=call.name,
                turn=turn,
                created_at=now,
            ),
            count,
        )

    def close_open_tool_calls(
        self, turn: int, records: list[ToolCallRecord], now: datetime, count: TokenCount | None
    ) -> None:
        """Give every tool call of the last assistant message a result: never an orphan."""
        last = next((m for m in reversed(self.messages) if m.role == "assistant"), None)
        if last is None or last.turn != turn:
            return
        answered = {m.tool_call_id for m in self.messages if m.role == "tool" and m.turn == turn}
        for call in last.tool_calls:
            if call.tool_call_id not in answered:
                self.not_run(turn, call, records, now, count)

    def not_run(self, turn: int, call: ToolCall, records: list[ToolCallRecord], now: datetime, count: TokenCount | None) -> None:
        """Record ``call`` as not run, its turn ended first (in ``records`` and as its result
        message)."""
        result = ToolResult(code=ToolResultCode.DENIED_BY_HUMAN, message="the turn ended before this tool call ran; it was not run")
        records.append(
            ToolCallRecord(tool_call_id=call.tool_call_id, name=call.name, arguments=call.arguments, result=result, approval="cancelled")
        )
        self.tool_result(turn, call, result, now, count)

    def unique_tool_call_ids(self, calls: list[ToolCall], turn: int, iteration: int, settled: Container[str]) -> list[ToolCall]:
        """The model's tool calls, each with an id unique in this session.

        Some OpenAI-compatible servers send the same id (``call_0``) in every response, or
        an empty one; approvals, results and the exactly-once record are keyed by the id,
        so a reused id is replaced by one minted here (``hc_<turn>_<step>_<index>``), and
        the model sees that id from then on, with its result."""
        minted: set[str] = set()

        def used(tcid: str) -> bool:
            return self._call_ids[tcid] > 0 or tcid in settled or tcid in minted

        unique: list[ToolCall] = []
        for index, call in enumerate(calls):
            tcid = call.tool_call_id
            if not tcid or len(tcid) > 128 or used(tcid):
                tcid = f"hc_{turn}_{iteration}_{index}"
                while used(tcid):
                    tcid += "_"
                call = call.model_copy(update={"tool_call_id": tcid})
            minted.add(tcid)
            unique.append(call)
        return unique

    # ----------------------------------------------------------------- reading

    def knows_message(self, cid: str) -> bool:
        """Whether a user message with client message id ``cid`` is held."""
        return self._client_ids[cid] > 0

    def answer(self, session_id: str, cid: str) -> TurnResult | None:
        """The reply to message ``cid`` rebuilt from the held turn (its cached reply was
        evicted), so a late resend never runs a second turn; None if not held."""
        if not self.knows_message(cid):
            return None  # a new message (most calls): no scan of the run
        turn = next((m.turn for m in self.messages if m.role == "user" and m.client_message_id == cid), None)
        if turn is None:
            return None
        in_turn = [m for m in self.messages if m.turn == turn]
        results = {m.tool_call_id: m.content or "" for m in in_turn if m.role == "tool"}
        records = []
        for m in in_turn:
            for call in m.tool_calls:
                try:
                    result = ToolResult.model_validate_json(results.get(call.tool_call_id, ""))
                except ValueError:
                    result = ToolResult(message=results.get(call.tool_call_id, "")[:500])
                records.append(ToolCallRecord(tool_call_id=call.tool_call_id, name=call.name, arguments=call.arguments, result=result))
        replies = [m for m in in_turn if m.role == "assistant" and not m.tool_calls]
        return TurnResult(
            session_id=session_id,
            turn=turn,
            reply=(replies[-1].content or "") if replies else "",
            tool_calls=records,
            client_message_id=cid,
        )

    def excerpt(self, after_turn: int, upto_turn: int, max_turns: int = 8) -> list[ConversationExcerpt]:
        """The user's messages and the final replies of turns ``after_turn + 1`` to
        ``upto_turn`` (the newest ``max_turns`` of them; 2,000 characters each)."""
        first = max(after_turn + 1, upto_turn - max_turns + 1)
        lines = []
        for m in self.messages:
            if m.internal or m.turn < first or m.turn > upto_turn or not m.content:
                continue
            if m.role == "user" or (m.role == "assistant" and not m.tool_calls):
                lines.append(ConversationExcerpt(turn=m.turn, role=m.role, text=m.content[:2000]))  # type: ignore[arg-type]
        return lines

    def fold_refs(self, after_turn: int, upto_turn: int) -> tuple[list[str], list[int]]:
        """References and turns of the messages of turns ``after_turn + 1 .. upto_turn``."""
        folded = [m for m in self.messages if after_turn < m.turn <= upto_turn and not m.internal and m.ref is not None]
        return [m.ref for m in folded if m.ref is not None], [m.turn for m in folded]

    def last_tool_step(self, turn: int) -> Message | None:
        """The newest assistant message of ``turn`` that called tools."""
        return next((m for m in reversed(self.messages) if m.role == "assistant" and m.tool_calls and m.turn == turn), None)

    def newest_turn(self) -> list[Message]:
        """The messages of the newest turn held, newest first."""
        if not self.messages:
            return []
        newest = self.messages[-1].turn
        found = []
        for m in reversed(self.messages):
            if m.turn != newest:
                break
            found.append(m)
        return found

    # ----------------------------------------------------------------- archive

    def summarized_prefix(self, summary: Summary | None) -> int:
        """How many of the oldest held messages are whole turns ``summary`` covers (0
        without a summary with text): the context never sends them again, so they can
        leave the state for the transcript archive."""
        if summary is None or not summary.text.strip():
            return 0
        covered = summary.upto_turn
        last_user = 0
        for i, m in enumerate(self.messages):
            if m.turn > covered:
                # Cut right before the first newer turn when it starts there, else before
                # the last covered turn's user message (whole turns only, never part of one).
                return i if m.role == "user" else last_user
            if m.role == "user":
                last_user = i
        return 0  # every held message is covered: nothing newer to keep beside it

    def archive_cut(self, budget: int, over_budget: bool, summarized: int) -> tuple[int, list[int], list[int]]:
        """Where the archive cut falls: after the turns the summary covers
        (``summarized`` messages) and, when the state is ``over_budget``, after the
        oldest whole turns until the rest fits half of ``budget`` bytes.

        Returns:
            (the cut, as a message count; each message's size; the indexes where turns
            start, with ``len(messages)`` last).
        """
        sizes = [message_bytes(m) for m in self.messages]
        starts = [i for i, m in enumerate(self.messages) if m.role == "user"] + [len(self.messages)]
        remaining = sum(sizes)
        cut = 0
        for boundary in starts if over_budget else ():
            if remaining <= budget // 2:
                break
            remaining -= sum(sizes[cut:boundary])
            cut = boundary
        return max(cut, summarized), sizes, starts

    @staticmethod
    def chunks(sizes: list[int], cut: int, chunk_bytes: int) -> list[tuple[int, int]]:
        """``[start, end)`` ranges of the first ``cut`` messages, each at most
        ``chunk_bytes`` (or one message, if that alone is larger)."""
        ranges = []
        start = 0
        while start < cut:
            end, size = start, 0
            while end < cut and (end == start or size + sizes[end] <= chunk_bytes):
                size += sizes[end]
                end += 1
            ranges.append((start, end))
            start = end
        return ranges

    def drop_archived(self, archived_upto: int, sizes: list[int], starts: list[int]) -> int:
        """Drop the whole turns among the first ``archived_upto`` messages (written to the
        archive); a chunk that failed mid-turn is written again, by index, next time.

        Returns:
            How many messages left the state.
        """
        drop = max((b for b in starts if b <= archived_upto), default=0)
        if drop:
            self.archived += drop
            self.live_bytes -= sum(sizes[:drop])
            for m in self.messages[:drop]:
                if m.ref is not None and self.by_ref.get(m.ref) is m:
                    del self.by_ref[m.ref]
                self._held(m, -1)
            del self.messages[:drop]
        return drop

    def legacy_context(self, turn: int, system_prompt: str) -> list[Message]:
        """The context of runs recorded before ``bounded-context``: the last 20 turns,
        whole, within 1.5 MB.

        Raises:
            ValueError: this turn alone is larger than one model call may carry.
        """
        system = Message(role="system", content=system_prompt)
        by_turn: dict[int, list[Message]] = {}
        for m in self.messages:
            if not m.internal and m.turn > turn - 20:
                by_turn.setdefault(m.turn, []).append(m)
        budget = 1_500_000 - message_bytes(system)
        current = by_turn.pop(turn, [])
        used = sum(message_bytes(m) for m in current)
        if used > budget:
            raise ValueError(f"this turn's context is about {used} bytes, more than one model call may carry")
        kept: list[list[Message]] = []
        for number in sorted(by_turn, reverse=True):
            size = sum(message_bytes(m) for m in by_turn[number])
            if used + size > budget:
                break
            used += size
            kept.append(by_turn[number])
        return [system, *(m for group in reversed(kept) for m in group), *current]


def result_content(result: ToolResult, *, head_and_tail: bool = False) -> str:
    """A tool result as the model reads it: one ``{code, message, data}`` JSON object of
    at most ``MAX_RESULT_CHARS`` characters; a longer one keeps a preview of its data,
    halved until it fits (cut text would not be JSON the model can read).

    Args:
        result: the whole result.
        head_and_tail: the preview is the head and the tail of the data's JSON around a
            marker saying what was cut (:func:`hermes.content.previews.head_and_tail`); False:
            its head alone (runs before the ``preview-head-and-tail`` patch).
    """
    content = result.model_dump_json()
    if len(content) <= MAX_RESULT_CHARS:
        return content
    preview = json.dumps(result.data, ensure_ascii=False, default=str)
    keep = MAX_RESULT_CHARS // 2
    while True:
        if head_and_tail:
            shown = previews.head_and_tail(preview, keep, json_text=True, how_to_read=_NOT_SHOWN).text
        else:
            shown = preview[:keep]
        content = ToolResult(
            code=result.code,
            message=f"{result.message[:1000]} (shortened for the model: {len(preview)} characters of data)",
            data={"truncated": True, "preview": shown},
        ).model_dump_json()
        if len(content) <= MAX_RESULT_CHARS or keep == 0:
            return content
        keep //= 2


_NOT_SHOWN = "the whole result is in the session's record (hermes show), not in this conversation: ask the tool for a part"
