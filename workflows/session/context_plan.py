"""What a model call is sent, by reference: the context (system prompt, memories,
summary, the recent turns that fit the token budget) and the offered tool list.

A model call's activity input carries content references, never the messages: its size
does not grow with the context (issue 12). Before the call, the session writes the bodies
the content store may lack (:meth:`ContextPlanner.unstored`) with a local activity, whose
input is not recorded in history, or, when they are a step's few new ones, sends them
inline with its context list as a change to the previous call's (:meth:`ContextPlanner.delta`);
runs recorded before those patches answer them with the ``get_message_bodies`` query
instead. Plain Python; nothing here knows of Temporal.
"""

from __future__ import annotations

import json
from typing import Any

from hermes.content.blobs import body_json, message_ref, value_ref
from hermes.content.context import BuiltContext, ContextOverBudget, ContextPolicy, UnitCache, build_context
from hermes.models import MAX_CARRIED_CONTEXT_BYTES, ContextCarry, ListToolsResult, Message, SessionConfig, Summary, ToolSpec
from hermes.content.tokens import DEFAULT_ENCODING, BoundedCounter, TokenCounter

from workflows.session.transcript import Transcript
from workflows.session.turn import ContextTooLarge

INLINE_BODIES_CHARS = 8192
"""Most characters of new bodies a model call carries inline (recorded in history: a
step's new messages, whose content history holds once already, in the update or an
activity's result) instead of a local activity writing them to the content store."""
CHANGE_PARTS = 16
"""Most parts of a context list sent as a change (:func:`list_change`), and most bodies
a model call carries inline."""
MAX_TOOL_LISTS = 16
"""Distinct offered tool lists kept (with their bodies) before the cache starts over."""
MAX_SYNTHETIC = 64
MAX_STORED = 4096
"""References this run wrote to the content store that it remembers; past it, it forgets
them all (the next call writes its context's bodies again: a Redis write, not history)."""
"""Bodies of context parts that are not transcript messages (system prompt, summary,
memories, context lists) kept; past it the newest half stays."""


class ContextPlanner:
    """The session's context and tool-list references, with the bodies it may be asked
    for (``synthetic``, ``tool_bodies``) and the context of the model call in flight
    (``inflight``: turn, step, references)."""

    def __init__(self) -> None:
        self.synthetic: dict[str, str] = {}
        self.tool_lists: dict[tuple[Any, ...], tuple[str, int]] = {}
        self.tool_bodies: dict[str, str] = {}
        self.tools_generation = 0
        """Counts tool listings: a cached tool list is one of the same listing."""
        self.listing: tuple[str, dict[str, ToolSpec], list[Any]] | None = None
        """The last full tool listing of this run: its reference, tools and groups."""
        self.inflight: tuple[int, int, list[str]] | None = None
        self.stored: set[str] = set()
        """References this run has written to the content store (workflow state, rebuilt
        on replay; a new run starts empty and writes its first context's bodies again)."""
        self.sent: tuple[str, list[str]] | None = None
        """The context list (reference, message references) of this run's last model call:
        the base the next call's list is sent as a change to (:meth:`delta`)."""
        self._bounded: BoundedCounter | None = None
        self._synthetic_refs: dict[tuple[str, str | None], str] = {}
        """Reference of each synthetic part's text (see :meth:`_synthetic_ref`)."""
        self.units = UnitCache()
        """The transcript's units as this run's last build read them (the next build
        reads only what was added since)."""

    def counter(self, encoding: str, bounded_work: bool) -> TokenCounter | BoundedCounter:
        """The session's token counter: bounded in cost per text (``bounded_work``: runs
        with that patch), or exact (runs recorded before it). An encoding this worker
        has not loaded counts as ``DEFAULT_ENCODING``."""
        # Loaded by the worker at its start (workflow code never loads one: file I/O); an
        # encoding this worker has not loaded counts as the default.
        exact = TokenCounter.loaded(encoding or DEFAULT_ENCODING) or TokenCounter.get(DEFAULT_ENCODING)
        if not bounded_work:
            return exact
        if self._bounded is None or self._bounded.counter is not exact:
            self._bounded = BoundedCounter(exact)
        return self._bounded

    def take_listing(self, result: ListToolsResult, *, bounded: bool) -> tuple[dict[str, ToolSpec], list[Any]]:
        """The tools of a listing: the held ones when it is unchanged (same reference),
        else the new ones (held when ``bounded``: the run's bounded-context patch)."""
        if result.unchanged and self.listing is not None and result.ref == self.listing[0]:
            _, specs, groups = self.listing
            return specs, groups
        specs, groups = {spec.name: spec for spec in result.tools}, result.groups
        self.tools_generation += 1
        if bounded and result.ref:
            self.listing = (result.ref, specs, groups)
        return specs, groups

    def known_listing(self) -> str | None:
        return self.listing[0] if self.listing else None

    def handover(self, *, memory: bool, encoding: str) -> ContextCarry | None:
        """What the next run takes over (:class:`ContextCarry`): the last listing (with
        ``memory``, whether the worker serves it, and the session's ``encoding``), the last
        call's context list, and which of that call's references the content store took,
        in their order; None when that is over ``MAX_CARRIED_CONTEXT_BYTES`` of JSON (a
        large listing: the next run lists again)."""
        listing = None
        if self.listing is not None:
            ref, specs, groups = self.listing
            listing = ListToolsResult(tools=list(specs.values()), groups=groups, ref=ref, memory=memory, encoding=encoding)
        sent_ref, sent_refs = self.sent if self.sent is not None else (None, [])
        last_call = dict.fromkeys([*([sent_ref] if sent_ref else []), *sent_refs, *self.tool_bodies])
        stored = [ref for ref in last_call if ref in self.stored]
        carried = ContextCarry(listing=listing, sent_ref=sent_ref, sent_refs=list(sent_refs), stored=stored)
        if len(carried.model_dump_json().encode("utf-8", "surrogatepass")) > MAX_CARRIED_CONTEXT_BYTES:
            return None
        return carried

    def take_over(self, carried: ContextCarry) -> None:
        """Start from what the previous run handed over (:meth:`handover`)."""
        listing = carried.listing
        if listing is not None and listing.ref:
            self.listing = (listing.ref, {spec.name: spec for spec in listing.tools}, listing.groups)
            self.tools_generation += 1
        self.stored.update(carried.stored)
        if carried.sent_ref is not None:
            self.sent = (carried.sent_ref, list(carried.sent_refs))

    def tool_list(self, tools: list[ToolSpec], counter: TokenCounter | BoundedCounter) -> tuple[str | None, int]:
        """The content reference of the offered tool list and its tokens (computed once
        per distinct list: a turn offers the same list at most steps)."""
        if not tools:
            return None, 0
        key = (self.tools_generation, *(t.name for t in tools))
        cached = self.tool_lists.get(key)
        if cached is None:
            tools_json = [t.model_dump(mode="json") for t in tools]
            ref = value_ref(tools_json)
            if len(self.tool_lists) > MAX_TOOL_LISTS:
                self.tool_lists.clear()
                self.tool_bodies.clear()
            self.tool_bodies[ref] = json.dumps(tools_json, ensure_ascii=False)
            cached = (ref, counter.tools(tools))
            self.tool_lists[key] = cached
        return cached

    def build(
        self,
        transcript: Transcript,
        cfg: SessionConfig,
        *,
        turn: int,
        system_prompt: str,
        counter: TokenCounter | BoundedCounter,
        summary: Summary | None,
        memories: list[str],
        tools: list[ToolSpec],
        tool_tokens: int | None,
        correction: float,
        mark_cuts: bool = False,
    ) -> BuiltContext:
        """System prompt, memories, summary and the recent turns that fit the token budget
        (:func:`hermes.content.context.build_context`; ``mark_cuts``: the conversation starts with
        a user message and a note names what was cut: runs with the context-cut-note patch).

        Raises:
            ContextTooLarge: the system prompt and the newest user message alone do not
                fit, or this turn's last tool step with its results does not.
        """
        if len(self.synthetic) > MAX_SYNTHETIC:
            self.synthetic = dict(list(self.synthetic.items())[-MAX_SYNTHETIC // 2 :])
        try:
            built = build_context(
                transcript.messages,
                turn=turn,
                system_prompt=system_prompt,
                policy=ContextPolicy.from_config(cfg),
                counter=counter,
                summary=summary,
                memories=memories,
                tool_tokens=counter.tools(tools) if tool_tokens is None else tool_tokens,
                correction=correction,
                mark_cuts=mark_cuts,
                unit_cache=self.units,
            )
        except ContextOverBudget as err:
            raise ContextTooLarge(str(err)) from None
        # The model must see its last step (its tool calls and their results): without
        # it, it would only ask for the same calls again.
        last_step = transcript.last_tool_step(turn)
        if last_step is not None and not any(m is last_step for m in built.messages):
            raise ContextTooLarge(
                f"the last tool step of this turn ({', '.join(c.name for c in last_step.tool_calls)}) "
                f"with its results does not fit the context budget of {built.budget} tokens"
            )
        return built

    def context_ref(self, built: BuiltContext, transcript: Transcript, turn: int, step: int) -> str:
        """One reference for the whole context of the call of ``turn`` and ``step`` (now
        the one in flight): the input's size does not grow with the context."""
        refs = []
        by_ref = transcript.by_ref
        for m in built.messages:
            if m.ref is not None and m.ref in by_ref:
                refs.append(m.ref)
            else:
                refs.append(self._synthetic_ref(m))
        context_ref = value_ref(refs)
        self.synthetic[context_ref] = json.dumps(refs)
        self.inflight = (turn, step, refs)
        return context_ref

    def _synthetic_ref(self, m: Message) -> str:
        """The reference of a context part that is not a transcript message (the system
        prompt, memories, summary, cut note: plain system messages), its body kept in
        ``synthetic``; hashed once per distinct text, not once per call."""
        plain = not m.tool_calls and m.tool_call_id is None and m.name is None and m.reasoning is None
        key = (m.role, m.content) if plain else None
        ref = self._synthetic_refs.get(key) if key is not None else None
        if ref is None or ref not in self.synthetic:
            ref = message_ref(m)
            self.synthetic[ref] = body_json(m)
            if key is not None:
                if len(self._synthetic_refs) > MAX_SYNTHETIC:
                    self._synthetic_refs.clear()
                self._synthetic_refs[key] = ref
        return ref

    def inflight_refs(self, turn: int, step: int) -> list[str] | None:
        if self.inflight is None or self.inflight[:2] != (turn, step):
            return None
        return self.inflight[2]

    def bodies(self, refs: list[str], transcript: Transcript) -> dict[str, str]:
        """Bodies (:func:`hermes.content.blobs.body_json`) of the referenced messages and tool
        lists; references not held are left out. Asked for a context list, the newest
        turn's bodies come too: the content store cannot have them yet, and the activity
        is saved a second query."""
        found = self._held(refs, transcript)
        if any(r in self.synthetic and r.startswith("b:") for r in refs):
            for m in transcript.newest_turn():
                if m.ref is not None and not m.internal:
                    found.setdefault(m.ref, body_json(m))
        return found

    def _held(self, refs: list[str], transcript: Transcript) -> dict[str, str]:
        found: dict[str, str] = {}
        for ref in refs:
            message = transcript.by_ref.get(ref)
            if message is not None:
                found[ref] = body_json(message)
            elif ref in self.synthetic:
                found[ref] = self.synthetic[ref]
            elif ref in self.tool_bodies:
                found[ref] = self.tool_bodies[ref]
        return found

    def call_refs(self, context_ref: str | None, tools_ref: str | None, turn: int, step: int) -> list[str]:
        """Every reference the model call of ``turn`` and ``step`` reads: its context list,
        the context's messages and its tool list."""
        refs = [context_ref] if context_ref else []
        refs += self.inflight_refs(turn, step) or []
        return refs + ([tools_ref] if tools_ref else [])

    def unstored(self, refs: list[str], transcript: Transcript) -> dict[str, str]:
        """Bodies of ``refs`` this run has not written to the content store yet (what the
        session holds of them; see :meth:`mark_stored`).

        Args:
            refs: ``m:`` and ``b:`` references, in any order, repeats allowed.

        Returns:
            Reference -> body, in the order of ``refs``.
        """
        if len(self.stored) > MAX_STORED:
            self.stored.clear()
        return self._held([r for r in dict.fromkeys(refs) if r not in self.stored], transcript)

    def mark_stored(self, refs: list[str]) -> None:
        """Remember that the content store took ``refs``; :meth:`forget_stored` undoes it
        when it turns out to have lost one."""
        self.stored.update(refs)

    def forget_stored(self) -> None:
        self.stored.clear()

    def delta(self, context_ref: str | None, bodies: dict[str, str]) -> dict[str, Any] | None:
        """How the model call in flight (:meth:`context_ref`) sends ``bodies``, the ones
        :meth:`unstored` found, without a local activity writing them first: the fields of
        its input, or None when they are too many or too large, one is a tool list, or
        its context list is not a change of a few parts (:func:`list_change`) to the
        previous call's (a new run's first call; then the local activity writes them).

        Returns:
            ``bodies`` (without the context list's own) and, when the list is among them,
            ``context_base`` and ``context_parts`` (see :class:`hermes.models.CallModelInput`).
        """
        inline = {ref: body for ref, body in bodies.items() if ref != context_ref}
        if (
            len(inline) > CHANGE_PARTS
            or sum(len(body) for body in inline.values()) > INLINE_BODIES_CHARS
            or any(ref in self.tool_bodies for ref in inline)  # kilobytes of schemas: never in history
        ):
            return None
        fields: dict[str, Any] = {"bodies": inline}
        if context_ref is None or context_ref not in bodies:
            return fields
        if self.sent is None or self.inflight is None or self.sent[0] not in self.stored:
            return None
        parts = list_change(self.sent[1], self.inflight[2])
        if parts is None:
            return None
        return {**fields, "context_base": self.sent[0], "context_parts": parts}

    def mark_sent(self, context_ref: str | None) -> None:
        """The call in flight sends its context list under ``context_ref``: the base of
        the next call's change."""
        if context_ref is not None and self.inflight is not None:
            self.sent = (context_ref, self.inflight[2])


def list_change(base: list[str], new: list[str], *, max_parts: int = CHANGE_PARTS) -> list[str | list[int]] | None:
    """``new`` as parts of ``base``: each a reference, or ``[start, end]``, the run
    ``base[start:end]`` (a context keeps most of the previous call's list: its system
    prompt and recent turns, with a turn's tool steps or the oldest turn dropped and new
    messages added). One pass over ``new``, with ``base``'s positions by reference.

    Returns:
        The parts, or None when more than ``max_parts`` are needed.
    """
    at: dict[str, int] = {}
    for index, ref in enumerate(base):
        at.setdefault(ref, index)
    parts: list[str | list[int]] = []
    i = 0
    while i < len(new):
        if len(parts) >= max_parts:
            return None
        start = at.get(new[i])
        if start is None:
            parts.append(new[i])
            i += 1
            continue
        end = start
        while i < len(new) and end < len(base) and new[i] == base[end]:
            i += 1
            end += 1
        parts.append([start, end])
    return parts
