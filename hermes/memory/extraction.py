"""Memory extraction by a model: the instruction, and the parsing of its answer.

The session finds the plain cases itself (:mod:`hermes.memory.rules`); for the rest
(preferences said in passing, corrections, a task's conclusion, every 8 turns, the close
of a session) the ``extract_memories`` activity asks the model for typed candidates with a
confidence, and keeps those at or above 0.75 (seed 000 §5.2).
"""

from __future__ import annotations

import json
import re
from datetime import datetime, timedelta
from typing import Any, Literal

from pydantic import BaseModel, Field, ValidationError

from hermes.memory.models import ConversationExcerpt, MemoryCandidate

EXTRACTION_INSTRUCTION = """You extract long-term memories about the user from a conversation.
Keep only what will still be useful in a later conversation: facts about the user (name, role,
employer, city, family, accounts, devices), stated preferences (formats, style, language, tastes),
corrections of earlier facts, and the conclusions of finished tasks. Never keep small talk,
one-off questions, intermediate tool results, or anything the user did not state or confirm.

Answer with JSON only, in this shape:
{"memories": [{"kind": "fact" | "preference" | "episode",
               "text": "one self-contained sentence about the user, at most 200 characters, in the user's language",
               "subject": "snake_case key when the fact has one value at a time (home_city, employer, job_title, name, email, phone, answer_style, preferred_language), else empty",
               "value": "that value, as stated (Zurich), else empty",
               "importance": 0.0-1.0,
               "confidence": 0.0-1.0,
               "valid_days": null or the number of days a temporary state stays true}]}
Answer {"memories": []} when there is nothing worth keeping."""


class ExtractedMemory(BaseModel):
    """One memory as a model returns it."""

    kind: Literal["fact", "preference", "episode"] = "fact"
    text: str = Field(min_length=1)
    subject: str = ""
    value: str = ""
    importance: float = Field(default=0.5, ge=0.0, le=1.0)
    confidence: float = Field(default=0.0, ge=0.0, le=1.0)
    valid_days: float | None = Field(default=None, gt=0, le=36500)


def extraction_prompt(excerpt: list[ConversationExcerpt], max_chars: int = 12_000) -> str:
    """The conversation as the model is shown it: the newest lines, at most ``max_chars``."""
    lines: list[str] = []
    used = 0
    for line in reversed(excerpt):
        text = f"[turn {line.turn}] {line.role}: {' '.join(line.text.split())[:1500]}"
        if used + len(text) > max_chars and lines:
            break
        lines.append(text)
        used += len(text) + 1
    return "Conversation:\n" + "\n".join(reversed(lines))


def _json_object(text: str) -> Any:
    text = text.strip()
    fenced = re.search(r"```(?:json)?\s*(.*?)```", text, re.S)
    if fenced:
        text = fenced.group(1).strip()
    start = text.find("{")
    if start < 0:
        raise ValueError("no JSON object in the answer")
    value, _ = json.JSONDecoder().raw_decode(text[start:])
    return value


def parse_extraction(
    answer: str,
    *,
    user_id: str,
    session_id: str,
    turn: int,
    created_at: datetime,
    min_confidence: float,
) -> tuple[list[MemoryCandidate], int, list[str]]:
    """The candidates in a model's ``answer`` at or above ``min_confidence``.

    Returns:
        ``(candidates, dropped_below_confidence, problems)``; an answer that is not the
        expected JSON gives no candidate and one problem (never an exception: the turn is
        over, and a bad extraction must not lose the rule candidates it came with).
    """
    problems: list[str] = []
    try:
        data = _json_object(answer)
    except (ValueError, RecursionError) as err:
        return [], 0, [f"the model's extraction is not JSON ({err}): {answer[:120]!r}"]
    items = data.get("memories") if isinstance(data, dict) else data if isinstance(data, list) else None
    if not isinstance(items, list):
        return [], 0, [f"the model's extraction has no `memories` list: {answer[:120]!r}"]
    kept: list[MemoryCandidate] = []
    dropped = 0
    for index, item in enumerate(items[:50]):
        try:
            memory = ExtractedMemory.model_validate(item)
        except ValidationError as err:
            problems.append(f"memories[{index}]: {err.errors()[0]['msg']}")
            continue
        text = " ".join(memory.text.split())[:500]
        if not text:
            problems.append(f"memories[{index}]: the text is only whitespace")
            continue
        if memory.confidence < min_confidence:
            dropped += 1
            continue
        kept.append(
            MemoryCandidate(
                user_id=user_id,
                kind=memory.kind,
                subject=memory.subject,
                value=memory.value[:200],
                text=text,
                importance=memory.importance,
                confidence=memory.confidence,
                source="model",
                source_session=session_id,
                source_turn=turn,
                created_at=created_at,
                valid_until=created_at + timedelta(days=memory.valid_days) if memory.valid_days else None,
            )
        )
    return kept, dropped, problems
