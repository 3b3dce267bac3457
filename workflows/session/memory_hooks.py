"""What a session gives long-term memory after a reply and when it ends.

The write path (seed 000 §4.2, seed 004 §6.2): rule candidates at once; a model
extraction on the design's triggers (remember, a preference, a correction, a stated
fact, a task's conclusion, every ``memory_extract_every_turns`` turns); working memory
counted and promoted (seed 004 §7.2: results of queries go to working memory, those of
write tools to long-term memory). Plain functions; nothing here knows of Temporal: the
workflow starts the extraction activity with what they return.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from hermes.memory.models import ExtractMemoriesInput, MemoryCandidate, WorkingItem
from hermes.memory.rules import Triggers, extract_by_rules
from hermes.memory.working import REFERENCE_SCAN_CHARS, add_items, items_from_tool_result, note_references
from hermes.models import SessionConfig, ToolCallRecord, ToolSpec

from workflows.session.transcript import Transcript


@dataclass
class AfterReply:
    """The outcome of :func:`after_reply`: the session's working memory, the turn the
    last model extraction covers, and the extraction to start (None: nothing to give)."""

    working: list[WorkingItem]
    last_extracted_turn: int
    extraction: ExtractMemoriesInput | None = None
    reasons: list[str] = field(default_factory=list)


def after_reply(
    cfg: SessionConfig,
    *,
    user_id: str,
    session_id: str,
    turn: int,
    text: str,
    reply: str,
    status: str,
    records: list[ToolCallRecord],
    specs: Mapping[str, ToolSpec],
    triggers: Triggers,
    working: list[WorkingItem],
    last_extracted_turn: int,
    transcript: Transcript,
    now: datetime,
    bounded_work: bool,
    everyday: bool = False,
) -> AfterReply:
    """Plan the write path of turn ``turn`` (the user's ``text``, the ``reply``, the
    turn's ``status`` and tool-call ``records``). ``bounded_work``: references are
    looked for in the first ``REFERENCE_SCAN_CHARS`` characters only (the run's patch).
    ``everyday``: the rules also read everyday facts and plain-text changes, so a move
    or a stop is written after this turn, not when the session closes (the run's
    ``memory-everyday-facts`` patch; ``triggers`` must be detected the same way)."""
    if triggers.forget_me:
        return AfterReply(working, last_extracted_turn)
    candidates = [
        MemoryCandidate(
            user_id=user_id,
            kind=rc.kind,
            subject=rc.subject,
            value=rc.value,
            text=rc.text,
            importance=rc.importance,
            confidence=rc.confidence,
            source="remember" if rc.explicit else "rules",
            source_session=session_id,
            source_turn=turn,
            created_at=now,
            valid_until=now + timedelta(days=rc.valid_until_days) if rc.valid_until_days else None,
        )
        for rc in extract_by_rules(text, everyday=everyday)
    ]
    for record in records:
        spec = specs.get(record.name)
        if record.result.ok and spec is not None and spec.permission == "read":
            working = add_items(working, items_from_tool_result(record.name, record.result.data, turn))
    scan = REFERENCE_SCAN_CHARS if bounded_work else None
    for item in note_references(working, [text, reply], turn, cfg.memory_promote_after_refs, scan):
        candidates.append(
            MemoryCandidate(
                user_id=user_id,
                kind="fact",
                text=item.text,
                importance=0.6,
                confidence=0.9,
                source="promotion",
                source_session=session_id,
                source_turn=turn,
                created_at=now,
            )
        )
    reasons = [name for name in ("explicit", "preference", "correction", "fact") if getattr(triggers, name)]
    # A task's conclusion: a side effect that happened.
    if status == "completed" and any(
        r.result.ok and (spec := specs.get(r.name)) is not None and spec.permission != "read" for r in records
    ):
        reasons.append("conclusion")
    if turn - last_extracted_turn >= cfg.memory_extract_every_turns:
        reasons.append(f"every_{cfg.memory_extract_every_turns}_turns")
    use_model = bool(reasons) and not (triggers.small_talk and not candidates)
    if not candidates and not use_model:
        return AfterReply(working, last_extracted_turn)
    excerpt = transcript.excerpt(last_extracted_turn, turn) if use_model else []
    if use_model:
        last_extracted_turn = turn
    extraction = _extraction(cfg, user_id, session_id, turn, now, excerpt, reasons, use_model=use_model, candidates=candidates)
    return AfterReply(working, last_extracted_turn, extraction, reasons)


def _extraction(
    cfg: SessionConfig, user_id: str, session_id: str, turn: int, now: datetime, excerpt: list[Any],
    reasons: list[str], *, use_model: bool, candidates: list[MemoryCandidate] | None = None,
) -> ExtractMemoriesInput:
    return ExtractMemoriesInput(
        user_id=user_id, session_id=session_id, turn=turn, created_at=now, rule_candidates=candidates or [],
        excerpt=excerpt, use_model=use_model, model=cfg.model, min_confidence=cfg.memory_min_confidence, reasons=reasons,
    )


def at_end(
    cfg: SessionConfig,
    *,
    user_id: str,
    session_id: str,
    turn_count: int,
    last_extracted_turn: int,
    transcript: Transcript,
    reason: str,
    now: datetime,
) -> tuple[int, ExtractMemoriesInput | None]:
    """The session closes or is archived (``reason``): the turns no extraction has seen
    yet go to one. Returns the turn the extractions now cover and the extraction (None
    when every turn was seen or the turns have no text)."""
    if turn_count <= last_extracted_turn:
        return last_extracted_turn, None
    excerpt = transcript.excerpt(last_extracted_turn, turn_count)
    if not excerpt:
        return turn_count, None
    return turn_count, _extraction(cfg, user_id, session_id, turn_count, now, excerpt, [reason], use_model=True)
