"""A scripted model: a file of steps that stands in for a remote LLM.

It is an honest stand-in, used by the offline demo and the tests; it does not
understand anything. A script is YAML (or JSON)::

    fallback: "I am a scripted model and have no step for that."   # optional
    turns:
      - match: "(?i)time|时间"          # optional regex searched in the user's message
        steps:
          - tool_calls:
              - name: current_time
                arguments: {timezone: Asia/Shanghai}
          - reply: "It is {{ last_tool_result.data.time }} in Shanghai."
      - steps:                          # no `match`: used in order
          - reply: "Hello!"

A reply may use ``{{ user }}``, ``{{ tool_results[i].data... }}``, ``{{ last_tool_result... }}``
and ``{{ memory }}`` / ``{{ memories[i] }}`` (the long-term memories the session injected,
as the model sees them: ``(date, score) text``; ``{{ memory_texts }}``: the same without the
date and score).

Captures: the groups of a turn's ``match`` are ``{{ match.NAME }}`` (named groups) and
``{{ match[1] }}``... (numbered; ``match[0]`` is the whole match), in replies and in the
string values of tool-call arguments, so a script can pass on what the user asked for::

      - match: "(?i)what is (?P<expression>[-+*/().\\d\\s]*\\d[-+*/().\\d\\s]*)"
        steps:
          - tool_calls:
              - name: calculate
                arguments: {expression: "{{ match.expression }}"}
          - reply: "{{ match.expression }} = {{ last_tool_result.data.value }}."

An argument that is exactly one template gets the value itself (a number stays a number).
Filters follow a ``|``: ``{{ memory_texts | join }}`` (a list as one line, items separated
by a space), ``{{ match.text | short }}`` (at most 40 characters, cut at a word end with
"…"), and the name of a table of the script's ``tables`` (``{{ match.city | timezone }}``:
the value of that key, compared case-insensitively; a key not in the table stays as it is).
A filter that is neither is a :class:`ConfigError` when the script is loaded.

Which turn answers a user message: the first turn whose ``match`` is found in it;
otherwise the next unused turn without ``match``, in file order (user messages older
than the context the model is sent count as having used one each). Which step: the
number of assistant messages since that user message. The script is stateless: the
position comes from the conversation itself, so retries and replays agree. With no
turn or no step left and no ``fallback``, it raises :class:`ScriptExhaustedError`
(like a test double that fails on an unexpected call).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
import threading
from collections import OrderedDict
from importlib import resources
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, Field, ValidationError, field_validator

from hermes.content.events import model_text
from hermes.content.tokens import count_text_tokens, prompt_overhead_tokens, prompt_texts
from hermes.errors import ConfigError, ContextTooLongError, ScriptExhaustedError
from hermes.models import CallModelInput, CallModelResult, Message, ToolCall, Usage

_TEMPLATE_RE = re.compile(r"\{\{\s*([\w.\[\]-]+)((?:\s*\|\s*[\w-]+)*)\s*\}\}")
_BUILTIN_FILTERS = ("join", "short")
_SHORT_CHARS = 40
_MEMORY_PREFIX_RE = re.compile(r"^\(\d{4}-\d\d-\d\d, score [\d.]+\) ")


class ScriptedToolCall(BaseModel):
    name: str
    arguments: dict[str, Any] | str = Field(default_factory=dict)
    """A dict, or a raw string (to script a model that sends malformed JSON)."""


class ScriptedStep(BaseModel):
    reply: str | None = None
    tool_calls: list[ScriptedToolCall] = Field(default_factory=list)

    def model_post_init(self, __context: Any) -> None:
        if self.reply is None and not self.tool_calls:
            raise ValueError("a step needs `reply` or `tool_calls`")


class ScriptedTurn(BaseModel):
    match: str | None = None
    steps: list[ScriptedStep]

    @field_validator("match")
    @classmethod
    def _compiles(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                re.compile(value)
            except re.error as err:
                raise ValueError(f"`match` is not a valid regular expression: {err}") from err
        return value


class ScriptedMemory(BaseModel):
    """What the scripted model "extracts" when ``match`` is found in the conversation."""

    match: str
    kind: Literal["fact", "preference", "episode"] = "fact"
    text: str
    subject: str = ""
    value: str = ""
    importance: float = 0.5
    confidence: float = 0.9
    valid_days: float | None = None

    @field_validator("match")
    @classmethod
    def _compiles(cls, value: str) -> str:
        try:
            re.compile(value)
        except re.error as err:
            raise ValueError(f"`match` is not a valid regular expression: {err}") from err
        return value


class ScriptedJudgement(BaseModel):
    """What the scripted model answers to a memory-judge request whose OLDER memory matches
    ``older`` and whose NEWER one matches ``newer`` (regular expressions)."""

    older: str
    newer: str
    verdict: Literal["same", "update", "different", "contradicts"]


class Script(BaseModel):
    turns: list[ScriptedTurn]
    fallback: str | None = None
    summary: str | None = None
    """Answer to summary requests (``{{ user }}`` is the text to summarize); default: the
    lines of the text to summarize that start with ``user:``, joined (a faithful, dumb
    stand-in for a model's summary)."""
    memories: list[ScriptedMemory] = Field(default_factory=list)
    """Answers to memory-extraction requests: every entry whose ``match`` is found in the
    conversation shown; none matching (or none given) answers ``{"memories": []}``."""
    judgements: list[ScriptedJudgement] = Field(default_factory=list)
    """Answers to memory-judge requests (``{"verdict": ...}``): the first entry matching both
    memories; none: ``judgement_default``."""
    judgement_default: Literal["same", "update", "different", "contradicts"] | None = None
    """None: an answer without a verdict (the judge then keeps its rules' verdict, as
    without a model)."""
    max_context_tokens: int | None = None
    """When set, a request whose messages exceed this many tokens is refused with
    :class:`ContextTooLongError`, as a provider with that context window would."""
    stream_chunk_seconds: float = Field(default=0.0, ge=0, le=10)
    """When above 0, a reply's text is handed out as it would stream from a provider: word
    by word, two characters at a time in Chinese (:func:`stream_pieces`, to
    :func:`hermes.content.events.model_text`), this many seconds apart; 0: at once. The
    packaged demo script streams at 0.02 s (50 words a second, a fast model's pace)."""
    tables: dict[str, dict[str, Any]] = Field(default_factory=dict)
    """Lookup tables used as template filters: ``{{ match.city | timezone }}`` with a table
    ``timezone: {paris: Europe/Paris, ...}``."""

    def model_post_init(self, __context: Any) -> None:
        known = set(_BUILTIN_FILTERS) | set(self.tables)
        for turn in self.turns:
            for step in turn.steps:
                texts = [step.reply or ""] + [
                    text for call in step.tool_calls for text in _strings(call.arguments)
                ]
                for text in texts:
                    for template in _TEMPLATE_RE.finditer(text):
                        for name in _filter_names(template.group(2)):
                            if name not in known:
                                raise ValueError(
                                    f"unknown template filter {name!r} in {template.group(0)!r}: expected "
                                    f"one of {sorted(known)} (a table of `tables`, or join, short)"
                                )


def _strings(value: Any) -> list[str]:
    """Every string inside ``value`` (dicts and lists walked)."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for v in value.values() for s in _strings(v)]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return []


def _filter_names(spec: str) -> list[str]:
    return [name.strip() for name in spec.split("|")[1:]]


def _short(text: str, limit: int = _SHORT_CHARS) -> str:
    """``text`` in at most ``limit`` characters, cut at a word end with an ellipsis."""
    text = " ".join(text.split())
    if len(text) <= limit:
        return text
    cut = text[: limit - 1]
    if " " in cut:
        cut = cut.rsplit(" ", 1)[0]
    return cut.rstrip(" ,;:，。；：") + "…"


def _match_values(match: re.Match[str] | None) -> dict[str, Any]:
    """A turn's captures for templates: named groups, and ``"0"``, ``"1"``... by number."""
    if match is None:
        return {}
    values: dict[str, Any] = {str(i): (match.group(i) or "") for i in range(len(match.groups()) + 1)}
    values.update({k: (v or "").strip() for k, v in match.groupdict().items()})
    return values


def _lookup(root: dict[str, Any], path: str) -> Any:
    value: Any = root
    for part in re.findall(r"[^.\[\]]+", path):
        if isinstance(value, list):
            value = value[int(part)]
        elif isinstance(value, dict):
            value = value[part]
        else:
            raise KeyError(part)
    return value


_CJK = "\u2e80-\u9fff\uf900-\ufaff\uff00-\uffef"
_PIECE = re.compile(rf"[{_CJK}]{{1,2}}\s*|[^\s{_CJK}]+\s*|\s+")


def stream_pieces(text: str) -> list[str]:
    """``text`` cut as a provider streams it: a word with its trailing space, or two
    characters of Chinese, Japanese or Korean (written without spaces, a sentence would
    otherwise arrive at once). The pieces joined are ``text``."""
    return _PIECE.findall(text)


class ScriptedModel:
    """A :class:`~hermes.providers.base.ModelProvider` that plays a script."""

    name = "scripted"

    def __init__(self, script: Script, *, source: str = "<script>"):
        self.script = script
        self.source = source

    @classmethod
    def from_dict(cls, data: dict[str, Any], *, source: str = "<dict>") -> ScriptedModel:
        try:
            return cls(Script.model_validate(data), source=source)
        except ValidationError as err:
            first = err.errors()[0]
            key = ".".join(str(p) for p in first["loc"])
            raise ConfigError(first["msg"], source=source, key=key) from None

    @classmethod
    def from_file(cls, path: str | Path) -> ScriptedModel:
        """Load a YAML or JSON script.

        Raises:
            ConfigError: the file is missing or not a valid script (file, key, what was expected).
        """
        path = Path(path)
        try:
            data = yaml.safe_load(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise ConfigError("scripted-model file not found", source=str(path)) from None
        except yaml.YAMLError as err:
            raise ConfigError(f"not valid YAML/JSON: {err}", source=str(path)) from None
        if not isinstance(data, dict):
            raise ConfigError("expected a mapping with a `turns` list", source=str(path))
        return cls.from_dict(data, source=str(path))

    @classmethod
    def demo(cls) -> ScriptedModel:
        """The packaged script used by `hermes demo` and the default worker."""
        text = resources.files("hermes").joinpath("scripts/demo.yaml").read_text(encoding="utf-8")
        return cls.from_dict(yaml.safe_load(text), source="hermes/scripts/demo.yaml")

    def _choose_turn(self, messages: list[Message], turn_number: int = 0) -> tuple[ScriptedTurn | None, str]:
        user_texts = [m.content or "" for m in messages if m.role == "user"]
        if not user_texts:
            raise ScriptExhaustedError("the scripted model was called with no user message")
        current = user_texts[-1]
        matched = [t for t in self.script.turns if t.match]
        ordered = [t for t in self.script.turns if not t.match]

        def find_match(text: str) -> ScriptedTurn | None:
            return next((t for t in matched if re.search(t.match or "", text)), None)

        hit = find_match(current)
        if hit is not None:
            return hit, current
        # Earlier turns outside the context window the model was sent count as unmatched.
        unseen = max(0, turn_number - 1 - len(user_texts[:-1]))
        position = unseen + sum(1 for text in user_texts[:-1] if find_match(text) is None)
        return (ordered[position] if position < len(ordered) else None), current

    def next_message(self, request: CallModelInput) -> Message:
        """The scripted assistant message for this point of the conversation.

        Raises:
            ScriptExhaustedError: no turn or step is scripted here and there is no fallback.
        """
        messages = request.messages
        last_user = max(i for i, m in enumerate(messages) if m.role == "user") if any(m.role == "user" for m in messages) else -1
        turn, user_text = self._choose_turn(messages, request.turn)
        # The session says which step this is; the count of assistant messages is the
        # fallback for requests without it (a long turn's oldest steps may be left out).
        step_index = (
            request.step
            if request.step is not None
            else sum(1 for m in messages[last_user + 1 :] if m.role == "assistant")
        )
        if turn is None or step_index >= len(turn.steps):
            if self.script.fallback is not None:
                return Message(role="assistant", content=self.script.fallback)
            where = "no scripted turn" if turn is None else f"no step {step_index + 1} in its turn"
            raise ScriptExhaustedError(f"{self.source}: {where} for the user message {user_text[:80]!r}")
        step = turn.steps[step_index]
        root = self._root(messages, user_text, re.search(turn.match, user_text) if turn.match else None)
        if step.tool_calls:
            calls = []
            for i, call in enumerate(step.tool_calls):
                tcid = f"call_{request.turn}_{step_index}_{i}"
                if isinstance(call.arguments, str):
                    from hermes.providers.base import parse_tool_call

                    calls.append(parse_tool_call(tcid, call.name, call.arguments))
                else:
                    arguments = self._render_value(call.arguments, root)
                    calls.append(ToolCall(tool_call_id=tcid, name=call.name, arguments=arguments))
            return Message(role="assistant", content=step.reply, tool_calls=calls)
        return Message(role="assistant", content=self._render(step.reply or "", root))

    def _root(self, messages: list[Message], user_text: str, match: re.Match[str] | None) -> dict[str, Any]:
        """What templates can name: the user's message, the turn's captures, tool results, memories."""
        results = []
        for m in messages:
            if m.role == "tool":
                try:
                    results.append(json.loads(m.content or "null"))
                except json.JSONDecodeError:
                    results.append(m.content)
        from hermes.content.context import MEMORIES_HEADER

        memories = [
            line[2:]
            for m in messages
            if m.role == "system" and (m.content or "").startswith(MEMORIES_HEADER)
            for line in (m.content or "").splitlines()[1:]
            if line.startswith("- ")
        ]
        return {
            "user": user_text,
            "match": _match_values(match),
            "tool_results": results,
            "last_tool_result": results[-1] if results else None,
            "memories": memories,
            "memory_texts": [_MEMORY_PREFIX_RE.sub("", m) for m in memories],
            "memory": memories[0] if memories else "(no memory)",
        }

    def _value(self, template: re.Match[str], root: dict[str, Any]) -> Any:
        """The value a ``{{ path | filter ... }}`` template names, filters applied."""
        try:
            value = _lookup(root, template.group(1))
        except (KeyError, IndexError, ValueError, TypeError):
            return f"<{template.group(1)}: not available>"
        for name in _filter_names(template.group(2)):
            if name == "join":
                value = " ".join(v if isinstance(v, str) else json.dumps(v, ensure_ascii=False) for v in value) if isinstance(value, list) else value
            elif name == "short":
                value = _short(value) if isinstance(value, str) else value
            else:
                table = self.script.tables[name]
                key = str(value)
                folded = {str(k).casefold(): v for k, v in table.items()}
                value = table.get(key, folded.get(key.casefold(), value))
        return value

    def _render(self, text: str, root: dict[str, Any]) -> str:
        def substitute(template: re.Match[str]) -> str:
            value = self._value(template, root)
            return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)

        return _TEMPLATE_RE.sub(substitute, text)

    def _render_value(self, value: Any, root: dict[str, Any]) -> Any:
        """Tool-call arguments with their templates filled; a string that is exactly one
        template becomes the value itself (a number stays a number)."""
        if isinstance(value, dict):
            return {k: self._render_value(v, root) for k, v in value.items()}
        if isinstance(value, list):
            return [self._render_value(v, root) for v in value]
        if isinstance(value, str):
            whole = _TEMPLATE_RE.fullmatch(value.strip())
            return self._value(whole, root) if whole else self._render(value, root)
        return value

    def summary_message(self, request: CallModelInput) -> Message:
        """The scripted answer to a summary request."""
        text = request.messages[-1].content or "" if request.messages else ""
        if self.script.summary is not None:
            return Message(role="assistant", content=self.script.summary.replace("{{ user }}", text))
        said = [line[len("user: "):] for line in text.splitlines() if line.startswith("user: ")]
        previous = text.split("\n\nConversation", 1)[0].removeprefix("Previous summary:\n") if text.startswith("Previous summary:") else ""
        parts = ([previous.strip()] if previous.strip() else []) + [f"The user said: {s}" for s in said]
        return Message(role="assistant", content="\n".join(parts))

    def extraction_message(self, request: CallModelInput) -> Message:
        """The scripted answer to a memory-extraction request (JSON, as a model would)."""
        text = "\n".join(m.content or "" for m in request.messages if m.role == "user")
        found = [
            m.model_dump(exclude={"match"}, exclude_none=True)
            for m in self.script.memories
            if re.search(m.match, text)
        ]
        return Message(role="assistant", content=json.dumps({"memories": found}, ensure_ascii=False))

    def judge_message(self, request: CallModelInput) -> Message:
        """The scripted answer to a memory-judge request (``OLDER: ...`` / ``NEWER: ...``)."""
        text = "\n".join(m.content or "" for m in request.messages if m.role == "user")
        older = re.search(r"^OLDER: (.*)$", text, re.M)
        newer = re.search(r"^NEWER: (.*)$", text, re.M)
        verdict = self.script.judgement_default
        for j in self.script.judgements:
            if older and newer and re.search(j.older, older.group(1)) and re.search(j.newer, newer.group(1)):
                verdict = j.verdict
                break
        return Message(role="assistant", content=json.dumps({"verdict": verdict}))

    async def complete(self, request: CallModelInput) -> CallModelResult:
        prompt_tokens = await _prompt_tokens(request.messages)
        if self.script.max_context_tokens is not None and prompt_tokens > self.script.max_context_tokens:
            raise ContextTooLongError(
                f"400 from scripted: this model's maximum context length is {self.script.max_context_tokens} "
                f"tokens; the messages have {prompt_tokens} tokens (context_length_exceeded)",
                status_code=400,
            )
        if request.purpose == "summary":
            message = self.summary_message(request)
        elif request.purpose == "memory_extraction":
            message = self.extraction_message(request)
        elif request.purpose == "memory_judge":
            message = self.judge_message(request)
        else:
            message = self.next_message(request)
            if self.script.stream_chunk_seconds > 0 and message.content:
                for piece in stream_pieces(message.content):
                    await asyncio.sleep(self.script.stream_chunk_seconds)
                    model_text(piece)
        completion = count_text_tokens(message.content or "") + sum(
            count_text_tokens(json.dumps(c.arguments, ensure_ascii=False)) for c in message.tool_calls
        )
        return CallModelResult(
            message=message,
            usage=Usage(prompt_tokens=prompt_tokens, completion_tokens=completion),
            provider=self.name,
            model=f"scripted:{Path(self.source).name}",
        )


_COUNTED_TEXTS_MAX = 8192
"""Texts whose token counts the scripted model remembers."""
_KEYED_BY_TEXT_CHARS = 1024
"""Texts up to this long are remembered by the text itself (a string's hash is computed
once per string, and a context's messages are the same strings at every step), longer ones
by digest: at most 8 Mi characters of text held (up to 32 MiB in memory)."""
_COUNT_IN_THREAD_CHARS = 20_000
"""New text at least this long is counted in a thread, off the event loop that sends the
activity's heartbeats (tiktoken releases the GIL while it encodes)."""
_counted: OrderedDict[str | tuple[int, bytes], int] = OrderedDict()
_counted_lock = threading.Lock()


def _text_key(text: str) -> str | tuple[int, bytes]:
    if len(text) <= _KEYED_BY_TEXT_CHARS:
        return text
    return len(text), hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).digest()


def _key_chars(key: str | tuple[int, bytes]) -> int:
    return len(key) if isinstance(key, str) else key[0]


def _count_new(texts: dict[str | tuple[int, bytes], str]) -> dict[str | tuple[int, bytes], int]:
    return {key: count_text_tokens(text) for key, text in texts.items()}


async def _prompt_tokens(messages: list[Message]) -> int:
    """The prompt tokens a provider would report for ``messages``: the same figure as
    :func:`hermes.content.tokens.count_message_tokens` (per-message overhead, reply primer).

    A real provider counts remotely; this in-process stand-in remembers the count of each
    text it has seen (a session sends its transcript again on every call), so that the
    CPU a bench or a loaded demo measures is the worker's, not the stand-in's, and counts
    a large new text in a thread rather than on the event loop.
    """
    texts = prompt_texts(messages)
    keys = [_text_key(t) for t in texts]
    known: dict[str | tuple[int, bytes], int] = {}
    with _counted_lock:
        for k in keys:
            if k in _counted:
                _counted.move_to_end(k)  # recently used: evicted last
                known[k] = _counted[k]
    new = {k: t for k, t in zip(keys, texts, strict=True) if k not in known}
    if new:
        large = sum(_key_chars(k) for k in new) >= _COUNT_IN_THREAD_CHARS
        fresh = await asyncio.to_thread(_count_new, new) if large else _count_new(new)
        with _counted_lock:
            _counted.update(fresh)
            while len(_counted) > _COUNTED_TEXTS_MAX:
                _counted.popitem(last=False)
        known.update(fresh)
    return prompt_overhead_tokens(messages) + sum(known[k] for k in keys)
