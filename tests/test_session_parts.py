"""The session workflow's plain parts, without a Temporal server (issue 14).

Each part under ``workflows/session/`` that is not the shell (or its durable helpers)
knows nothing of Temporal: these tests drive them with models and times only. The
workflow's own tests (test_session, test_approvals, test_long_sessions, test_replay)
check that the shell calls them in the order recorded histories hold.
"""

from __future__ import annotations

import ast
import json
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from hermes.memory.rules import detect_triggers
from hermes.models import (
    ApprovalDecision,
    ApprovalPolicy,
    ListToolsResult,
    Message,
    SessionCarry,
    SessionConfig,
    SessionIndexEntry,
    SessionInput,
    Summary,
    ToolCall,
    ToolCallRecord,
    ToolResult,
    ToolResultCode,
    ToolSpec,
    TurnResult,
)
from workflows.session import lifecycle, memory_hooks, patches
from workflows.session.approvals import ApprovalBook, denial
from workflows.session.context_plan import ContextPlanner
from workflows.session.payloads import MAX_RESULT_CHARS, MAX_SETTLED, MAX_UNKNOWN, fingerprint, message_bytes, slim
from workflows.session.replies import ReplyBook
from workflows.session.state import SessionCore
from workflows.session.tool_step import StepTally, ask_for_arguments, fallback_for, fallback_result, screen
from workflows.session.transcript import Transcript, result_content
from workflows.session.turn import ArgumentsExhausted, ContextTooLarge, ModelFailed, TurnCancelled

pytestmark = pytest.mark.timeout(30)

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)
REPO = Path(__file__).resolve().parents[1]


def turn_messages(turn: int, *, text: str = "hello", tool: bool = False) -> list[Message]:
    at = T0 + timedelta(minutes=turn)
    messages = [Message(role="user", content=f"{text} {turn}", turn=turn, created_at=at, client_message_id=f"m{turn}")]
    if tool:
        call = ToolCall(tool_call_id=f"c{turn}", name="lookup", arguments={"q": turn})
        messages.append(Message(role="assistant", tool_calls=[call], turn=turn, created_at=at))
        messages.append(
            Message(role="tool", tool_call_id=f"c{turn}", name="lookup", turn=turn, created_at=at, content=result_content(ToolResult(message="found", data={"n": turn})))
        )
    messages.append(Message(role="assistant", content=f"reply {turn}", turn=turn, created_at=at))
    return messages


def spec(name: str = "lookup", **kw) -> ToolSpec:
    return ToolSpec(name=name, description=name, **{"parameters": {"type": "object", "properties": {}}, **kw})


# ------------------------------------------------------------------ the parts are plain


def test_only_the_shell_and_its_durable_helpers_import_temporalio():
    durable = {"shell.py", "calls.py", "tool_runner.py", "model_steps.py", "memory_path.py", "signals.py"}
    plain = []
    for path in sorted((REPO / "workflows" / "session").glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        imported = {
            (node.module or "") if isinstance(node, ast.ImportFrom) else alias.name
            for node in ast.walk(tree)
            if isinstance(node, (ast.Import, ast.ImportFrom))
            for alias in node.names
        }
        uses_temporal = any(name.split(".")[0] == "temporalio" for name in imported)
        if path.name in durable:
            assert uses_temporal, f"{path.name} is listed as durable but does not use temporalio"
        elif path.name != "__init__.py":
            assert not uses_temporal, f"{path.name} must know nothing of Temporal"
            plain.append(path.name)
    assert {"transcript.py", "approvals.py", "lifecycle.py", "tool_step.py", "state.py"} <= set(plain)


def test_the_session_workflow_class_is_a_thin_shell():
    tree = ast.parse((REPO / "workflows" / "session" / "shell.py").read_text(encoding="utf-8"))
    (cls,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "SessionWorkflow"]
    assert cls.end_lineno - cls.lineno + 1 <= 500


# ----------------------------------------------------------------------- payloads


def test_message_references_are_the_ones_every_earlier_version_recorded():
    """A message's reference is recorded in session histories and names its body in the
    content store: it must never change for the same body (these were made by the
    ``model_dump`` version of ``body_json``)."""
    from hermes.content.blobs import message_ref

    messages = [
        Message(role="user", content="What is (17 + 25) * 3? 请算一下 ☃", turn=2, client_message_id="c1", tokens=9),
        Message(role="assistant", content=None, reasoning="think", tool_calls=[
            ToolCall(tool_call_id="t1", name="calculate", arguments={"expression": "(17+25)*3", "n": 1.5, "x": [True, None]})]),
        Message(role="tool", content='{"code":0,"data":{"value":126}}', tool_call_id="t1", name="calculate"),
        Message(role="assistant", content="It is 126.", internal=True),
        Message(role="assistant", tool_calls=[
            ToolCall(tool_call_id="t2", name="big", arguments={"kept_by_reference": True}, arguments_ref="b:abc")]),
        # What json.loads takes from a model's raw arguments: JSON mode writes these as null.
        Message(role="assistant", tool_calls=[ToolCall(tool_call_id="t3", name="f", arguments=json.loads('{"a": NaN, "b": Infinity}'))]),
    ]
    assert [message_ref(m) for m in messages] == [
        "m:7ccce3330b3b61ffb043f570f108b545", "m:4b453b71dfe8f9c548674fd84735f0b9", "m:1e451ed3e3914bbf216c69d073f50b23",
        "m:999e1caf603ae0c70390403489db55f6", "m:01487240c50d44999f919cc4474e96e5", "m:f24f5394ef715be1bd635b1fa7e8101d",
    ]


def test_message_bytes_counts_json_escapes_and_tool_calls():
    plain = Message(role="user", content="ab", turn=1)
    escaped = Message(role="user", content="\x00\x01", turn=1)
    assert message_bytes(escaped) - message_bytes(plain) == len(json.dumps("\x00\x01")) - len(json.dumps("ab"))
    with_call = Message(role="assistant", turn=1, tool_calls=[ToolCall(tool_call_id="c", name="n", arguments={"a": 1})])
    assert message_bytes(with_call) == 160 + 2 + 160 + 3 + len('{"a": 1}') + 3


def test_slim_drops_data_then_cuts_messages_then_the_reply():
    big = ToolResult(message="m" * 5000, data={"rows": "x" * 50_000})
    result = TurnResult(
        session_id="s", turn=1, reply="r" * 40_000,
        tool_calls=[ToolCallRecord(tool_call_id="c", name="n", arguments={"a": "y" * 10_000}, result=big)],
    )
    assert slim(result, 10_000_000) is result
    no_data = slim(result, 60_000)
    assert no_data.tool_calls[0].result.data is None and no_data.tool_calls[0].arguments == {}
    assert no_data.reply == result.reply and "left out" in no_data.warnings[-1]
    cut = slim(result, 8_000)
    assert len(cut.model_dump_json()) <= 8_000 and cut.reply.endswith("the transcript has it whole]")
    assert len(slim(result, 8_000, cut_reply=False).reply) == 40_000


def test_fingerprint_is_the_tool_and_arguments_not_the_id():
    a = ToolCall(tool_call_id="1", name="pay", arguments={"to": "x", "amount": 5})
    b = ToolCall(tool_call_id="2", name="pay", arguments={"amount": 5, "to": "x"})
    assert fingerprint(a) == fingerprint(b) and len(fingerprint(a)) == 32
    assert fingerprint(a) != fingerprint(b.model_copy(update={"arguments": {"to": "x", "amount": 6}}))


# --------------------------------------------------------------------- transcript


def test_a_transcript_indexes_sizes_and_rebuilds_a_reply_for_a_resend():
    messages = turn_messages(1) + turn_messages(2, tool=True)
    transcript = Transcript(messages, archived=4)
    assert all(m.ref in transcript.by_ref for m in messages)
    assert transcript.live_bytes == sum(message_bytes(m) for m in messages)
    answer = transcript.answer("s", "m2")
    assert answer is not None and (answer.turn, answer.reply) == (2, "reply 2")
    assert [(r.name, r.result.data) for r in answer.tool_calls] == [("lookup", {"n": 2})]
    assert transcript.answer("s", "m9") is None
    assert transcript.knows_message("m1") and not transcript.knows_message("m3")


def test_tokens_are_counted_only_once_the_encoding_is_known_and_never_for_notices():
    transcript = Transcript(turn_messages(1))
    assert all(m.tokens is None for m in transcript.messages)
    transcript.count_all(lambda m: 7)
    assert {m.tokens for m in transcript.messages} == {7}
    transcript.notice(2, "closed", T0, lambda m: 9)
    assert transcript.messages[-1].internal and transcript.messages[-1].tokens is None


def test_reused_or_empty_tool_call_ids_are_replaced_with_unique_ones():
    transcript = Transcript(turn_messages(1, tool=True))
    calls = [ToolCall(tool_call_id="c1", name="a"), ToolCall(tool_call_id="", name="b"), ToolCall(tool_call_id="ok", name="c")]
    unique = transcript.unique_tool_call_ids(calls, 2, 0, settled=["ok"])
    assert [c.tool_call_id for c in unique] == ["hc_2_0_0", "hc_2_0_1", "hc_2_0_2"]
    fresh = transcript.unique_tool_call_ids([ToolCall(tool_call_id="new", name="a")], 2, 1, settled=[])
    assert fresh[0].tool_call_id == "new"
    # Two calls of one step with one id: the second gets a minted one.
    twins = transcript.unique_tool_call_ids([ToolCall(tool_call_id="x", name="a"), ToolCall(tool_call_id="x", name="b")], 2, 2, [])
    assert [c.tool_call_id for c in twins] == ["x", "hc_2_2_1"]
    transcript.add(Message(role="assistant", turn=2, tool_calls=twins), None)
    assert transcript.unique_tool_call_ids([ToolCall(tool_call_id="x", name="a")], 3, 0, [])[0].tool_call_id == "hc_3_0_0"


def test_open_tool_calls_get_a_not_run_result_and_never_twice():
    transcript = Transcript(turn_messages(1)[:1])
    calls = [ToolCall(tool_call_id="a", name="x"), ToolCall(tool_call_id="b", name="y")]
    transcript.add(Message(role="assistant", turn=1, tool_calls=calls), None)
    transcript.tool_result(1, calls[0], ToolResult(message="done"), T0, None)
    records: list[ToolCallRecord] = []
    transcript.close_open_tool_calls(1, records, T0, None)
    transcript.close_open_tool_calls(1, records, T0, None)
    assert [(r.tool_call_id, r.approval, r.result.code) for r in records] == [("b", "cancelled", ToolResultCode.DENIED_BY_HUMAN)]
    assert [m.tool_call_id for m in transcript.messages if m.role == "tool"] == ["a", "b"]


def test_a_long_tool_result_stays_one_json_object_within_the_limit():
    content = result_content(ToolResult(message="big", data={"rows": ["x" * 100] * 2_000}))
    parsed = json.loads(content)
    assert len(content) <= MAX_RESULT_CHARS and parsed["data"]["truncated"] and parsed["data"]["preview"]


def test_the_archive_cut_keeps_whole_turns_and_drop_forgets_them():
    messages = [m for t in range(1, 6) for m in turn_messages(t, tool=True)]
    transcript = Transcript(messages)
    summary = Summary(text="turns 1-2", upto_turn=2)
    summarized = transcript.summarized_prefix(summary)
    assert summarized == 8 and transcript.messages[summarized].turn == 3
    assert transcript.summarized_prefix(None) == 0 and transcript.summarized_prefix(Summary(text=" ", upto_turn=2)) == 0
    cut, sizes, starts = transcript.archive_cut(budget=10**9, over_budget=False, summarized=summarized)
    assert cut == 8 and starts == [0, 4, 8, 12, 16, 20]
    over, _, _ = transcript.archive_cut(budget=sum(sizes) // 3, over_budget=True, summarized=0)
    assert over in starts and sum(sizes[over:]) <= sum(sizes) // 6 + max(sizes) * 4
    assert Transcript.chunks(sizes, 8, chunk_bytes=sum(sizes[:3])) == [(0, 3), (3, 6), (6, 8)]
    ref = transcript.messages[0].ref
    # A failed chunk that ended mid-turn: only the whole turns before it leave.
    assert transcript.drop_archived(6, sizes, starts) == 4
    assert transcript.archived == 4 and transcript.messages[0].turn == 2 and ref not in transcript.by_ref
    # What the run holds is what it knows: a dropped turn's message and tool call ids are
    # no longer held; the held ones still are (kept with the messages, not scanned for).
    assert not transcript.knows_message("m1") and transcript.knows_message("m2")
    again = transcript.unique_tool_call_ids([ToolCall(tool_call_id="c1", name="a"), ToolCall(tool_call_id="c2", name="a")], 6, 0, [])
    assert [c.tool_call_id for c in again] == ["c1", "hc_6_0_1"]


def test_excerpts_and_fold_refs_cover_the_asked_turns():
    transcript = Transcript([m for t in range(1, 12) for m in turn_messages(t, tool=True)])
    excerpt = transcript.excerpt(0, 11)
    assert {e.turn for e in excerpt} == set(range(4, 12))  # the newest 8 turns
    assert all(e.role in ("user", "assistant") for e in excerpt) and len(excerpt) == 16
    refs, turns = transcript.fold_refs(2, 4)
    assert set(turns) == {3, 4} and len(refs) == 8


def test_the_legacy_context_keeps_the_last_twenty_turns_within_its_budget():
    transcript = Transcript([m for t in range(1, 26) for m in turn_messages(t)])
    context = transcript.legacy_context(25, "system")
    assert context[0].role == "system" and {m.turn for m in context[1:]} == set(range(6, 26))
    huge = Transcript([Message(role="user", content="x" * 1_600_000, turn=1)])
    with pytest.raises(ValueError, match="more than one model call may carry"):
        huge.legacy_context(1, "system")


# ------------------------------------------------------------------------ replies


def test_replies_are_kept_within_count_and_bytes_and_the_newest_always_stays():
    book = ReplyBook({}, {}, max_completed=3, max_answered=5)
    for i in range(6):
        book.remember(f"m{i}", TurnResult(session_id="s", turn=i, reply=f"r{i}"))
    assert list(book.completed) == ["m3", "m4", "m5"] and list(book.answered) == ["m1", "m2", "m3", "m4", "m5"]
    book.remember("big", TurnResult(session_id="s", turn=9, reply="z" * 200_000))
    assert list(book.completed) == ["big"]
    assert list(book.answered) == ["m2", "m3", "m4", "m5", "big"]
    note = book.already_answered("s", "m2")
    assert note is not None and note.turn == 2 and "not run again" in note.warnings[0]
    assert book.already_answered("s", "m1") is None


# ---------------------------------------------------------------------- approvals


def test_the_approval_book_requests_decides_and_audits():
    book = ApprovalBook(session_id="s", user_id="alice")
    call = ToolCall(tool_call_id="c1", name="delete", arguments={"id": 1})
    pending = book.request(1, call, spec("delete", permission="admin"), ApprovalPolicy(action="approve"), "", now=T0, default_timeout_seconds=60)
    assert pending.expires_at == T0 + timedelta(seconds=60) and pending.action == "approve"
    assert book.decide(ApprovalDecision(tool_call_id="c1", approver="alice"), T0) == "not_allowed"
    assert book.decide(ApprovalDecision(tool_call_id="c1", approver="bob"), T0) == "applied"
    assert book.decide(ApprovalDecision(tool_call_id="c1", approver="carol"), T0) == "already_decided"
    assert book.decide(ApprovalDecision(tool_call_id="nope", approver="bob"), T0) == "unknown_tool_call"
    assert [d.outcome for d in book.decisions] == ["not_allowed", "applied", "already_decided", "unknown_tool_call"]
    assert book.decided("c1") and book.settle("c1") and not book.settle("c1")
    assert book.decide(ApprovalDecision(tool_call_id="c1", approver="bob"), T0) == "already_decided"
    entries = book.take_audit()
    assert [e.event for e in entries] == ["requested"] + ["decision"] * 5 and book.audit_buffer == []
    assert entries[0].arguments == {"id": 1} and entries[1].arguments == {}
    assert len({e.entry_id for e in entries}) == len(entries)


@pytest.mark.parametrize(
    ("action", "approvers", "allowed", "allowed_before_the_patch"),
    [
        ("confirm", [], ["alice"], ["alice", "bob", "lead", "anyone"]),
        ("confirm", ["lead"], ["alice", "lead"], ["lead"]),
        ("approve", [], ["bob", "lead", "anyone"], ["bob", "lead", "anyone"]),
        ("approve", ["lead", "alice"], ["lead"], ["lead"]),
    ],
)
def test_who_may_decide_a_call_with_and_without_the_identity_patch(action, approvers, allowed, allowed_before_the_patch):
    book = ApprovalBook(session_id="s", user_id="alice")
    policy = ApprovalPolicy(action=action, approvers=approvers)
    pending = book.request(1, ToolCall(tool_call_id="c", name="w"), spec("w"), policy, "", now=T0, default_timeout_seconds=5)
    people = ["alice", "bob", "lead", "anyone"]
    assert [p for p in people if pending.may_decide(p) is None] == allowed
    assert [p for p in people if pending.may_decide(p, identities=False) is None] == allowed_before_the_patch
    if action == "confirm":
        assert "only the session's user 'alice'" in (pending.may_decide("bob") or "")


@pytest.mark.parametrize("identities", [True, False])
def test_a_confirmation_by_someone_else_is_refused_and_audited_only_under_the_identity_patch(identities):
    book = ApprovalBook(session_id="s", user_id="alice", identities=lambda: identities)
    book.request(1, ToolCall(tool_call_id="c", name="w"), spec("w"), ApprovalPolicy(action="confirm"), "", now=T0, default_timeout_seconds=5)
    outcome = book.decide(ApprovalDecision(tool_call_id="c", approver="mallory"), T0)
    assert outcome == ("not_allowed" if identities else "applied")
    assert book.decided("c") is not identities and "c" in book.pending
    [entry] = [e for e in book.take_audit() if e.event == "decision"]
    assert (entry.approver, entry.outcome, bool(entry.detail)) == ("mallory", outcome, identities)
    if identities:
        assert book.decide(ApprovalDecision(tool_call_id="c", approver="alice"), T0) == "applied"


def test_no_audit_entries_without_the_patch_and_settled_ids_are_bounded():
    book = ApprovalBook(session_id="s", user_id="u", settled=[f"x{i}" for i in range(MAX_SETTLED)], audit_enabled=lambda: False)
    book.request(1, ToolCall(tool_call_id="c", name="w"), spec("w"), ApprovalPolicy(action="confirm"), "", now=T0, default_timeout_seconds=5)
    assert book.audit_buffer == []
    book.settle("c")
    assert len(book.settled) == MAX_SETTLED and book.settled[-1] == "c"


def test_a_halt_is_recorded_and_the_refusal_names_the_call():
    book = ApprovalBook(session_id="s", user_id="u")
    pending = book.request(1, ToolCall(tool_call_id="c", name="wire"), spec("wire"), ApprovalPolicy(action="confirm", on_expiry="halt"), "", now=T0, default_timeout_seconds=5)
    book.halt(pending, T0)
    assert pending.expired and book.halted_on == {"c"} and book.waiting_for() == "wire (c)"
    assert book.settle("c") and not book.halted_on


def test_an_unknown_outcome_makes_the_same_call_need_a_human_until_it_succeeds():
    book = ApprovalBook(session_id="s", user_id="u")
    pay, policies = spec("pay", idempotent=False, permission="write"), {"write": ApprovalPolicy(action="run")}
    call = ToolCall(tool_call_id="c1", name="pay", arguments={"amount": 5})
    again = call.model_copy(update={"tool_call_id": "c2"})
    assert book.policy(again, pay, policies)[0].action == "run"
    warning = book.note_result(call, pay, ToolResult(code=ToolResultCode.OUTCOME_UNKNOWN, message="timed out"))
    assert warning is not None and "may or may not have run" in warning
    policy, reason = book.policy(again, pay, policies)
    assert policy.action == "confirm" and "c1" in reason
    assert book.note_result(again, pay, ToolResult(message="paid")) is None
    assert book.policy(again, pay, policies)[0].action == "run"
    for i in range(MAX_UNKNOWN + 5):
        book.note_result(call.model_copy(update={"arguments": {"i": i}}), pay, ToolResult(code=ToolResultCode.OUTCOME_UNKNOWN))
    assert len(book.unknown) == MAX_UNKNOWN
    assert book.policy(again, spec("pay"), {}) == (ApprovalPolicy(action="approve"), "")


def test_a_denial_says_why_and_the_reason():
    result = denial("rejected", ApprovalDecision(tool_call_id="c", approved=False, reason="too much"))
    assert result.code == ToolResultCode.DENIED_BY_HUMAN and result.message == "the user rejected this tool call: too much; it was not run"
    assert denial("expired", None).message.startswith("nobody approved")


# ---------------------------------------------------------------------- tool step


def test_screening_refuses_unknown_tools_bad_arguments_and_denied_permissions():
    run, confirm, deny = ApprovalPolicy(action="run"), ApprovalPolicy(action="confirm"), ApprovalPolicy(action="deny")
    call = ToolCall(tool_call_id="c", name="lookup")
    unknown = screen(call.model_copy(update={"name": "nope"}), None, ["b", "a"], None, v2=True)
    assert unknown.screen == "refused" and unknown.result.message == "unknown tool 'nope'; available tools: a, b"
    bad = screen(call.model_copy(update={"arguments_error": "not JSON"}), spec(), ["lookup"], run, v2=True)
    assert (bad.screen, bad.result.code) == ("refused", ToolResultCode.BAD_ARGUMENTS)
    assert screen(call, spec(), ["lookup"], deny, v2=True).result.code == ToolResultCode.PERMISSION_DENIED
    assert screen(call, spec(), ["lookup"], run, v2=True).screen == "run"
    assert screen(call, spec(composite=[]), ["lookup"], run, v2=True).screen == "check"
    assert screen(call, spec(), ["lookup"], confirm, v2=True).screen == "check"
    assert screen(call, spec(), ["lookup"], confirm, v2=False).screen == "ask_later"


def test_a_fallback_runs_only_after_a_failure_safe_to_try_elsewhere():
    primary, backup = spec("primary", fallback="backup"), spec("backup")
    specs = {"primary": primary, "backup": backup}
    down = ToolResult(code=ToolResultCode.DEPENDENCY_UNAVAILABLE, message="down")
    assert fallback_for(down, primary, specs) is backup
    assert fallback_for(ToolResult(code=ToolResultCode.OUTCOME_UNKNOWN), primary, specs) is backup
    assert fallback_for(ToolResult(code=ToolResultCode.OUTCOME_UNKNOWN), primary.model_copy(update={"idempotent": False}), specs) is None
    assert fallback_for(ToolResult(code=ToolResultCode.BAD_ARGUMENTS), primary, specs) is None
    assert fallback_for(down, spec("alone"), specs) is None
    merged = fallback_result(primary, backup, down, ToolResult(message="ok from backup"))
    assert merged.message == "primary failed (down); this result is from the fallback backup: ok from backup"


def test_the_tally_suggests_next_tools_and_stops_after_too_many_bad_arguments():
    specs = {"a": spec("a", next_possible_tools=["b"]), "b": spec("b")}
    tally = StepTally()
    ok = ToolCallRecord(tool_call_id="1", name="a", result=ToolResult())
    bad = ToolCallRecord(tool_call_id="2", name="b", result=ToolResult(code=ToolResultCode.BAD_ARGUMENTS, message="x"))
    calls = [ToolCall(tool_call_id="1", name="a"), ToolCall(tool_call_id="2", name="b")]
    assert tally.count(calls, [ok, bad], specs, max_retries=1) is None and tally.suggested == {"b"}
    exhausted = tally.count(calls, [ok, bad], specs, max_retries=1)
    assert exhausted is not None and exhausted[0].name == "b" and exhausted[2] is specs["b"]


def test_the_user_is_asked_for_the_missing_arguments_by_name():
    cfg = SessionConfig()
    weather = spec("weather", parameters={"type": "object", "properties": {"city": {"type": "string", "description": "City name"}}})
    missing = ToolResult(code=ToolResultCode.BAD_ARGUMENTS, message="missing", data={"missing": ["city"]})
    call = ToolCall(tool_call_id="c", name="weather")
    assert ask_for_arguments(cfg, call, missing, weather) == "To run weather I need more information from you. Please tell me: city: City name."
    other = ask_for_arguments(cfg, call, ToolResult(code=ToolResultCode.BAD_ARGUMENTS, message="bad type"), weather)
    assert "after 4 tries (bad type)" in other


def test_each_way_a_turn_stops_has_its_status_and_reply():
    cfg = SessionConfig()
    assert (TurnCancelled().status, TurnCancelled().reply(cfg)) == ("cancelled", "This turn was cancelled.")
    assert ContextTooLarge("too big").reply(cfg).startswith("I cannot send this to the model: too big.")
    assert ModelFailed("503").status == "model_error" and "(503)" in ModelFailed("503").reply(cfg)
    stop = ArgumentsExhausted(ToolCall(tool_call_id="c", name="t"), ToolResult(message="no"), None)
    assert stop.status == "invalid_arguments" and "could not call t" in stop.reply(cfg)


# ---------------------------------------------------------------------- lifecycle


def figures(**kw) -> lifecycle.RunFigures:
    base = dict(updates=0, history_length=10, history_bytes=1000, suggested=False, live_bytes=0)
    return lifecycle.RunFigures(**{**base, **kw})


def test_roll_over_on_messages_suggestion_size_history_and_replay_budget():
    cfg = SessionConfig(max_updates_per_run=100, replay_budget_events=1000, max_carry_bytes=1000, max_history_bytes=10_000)

    def should(**kw) -> bool:
        return lifecycle.should_roll_over(cfg, figures(**kw), bounded_context=True, bounded_work=True)

    assert not should()
    assert should(updates=100) and should(suggested=True) and should(live_bytes=1501) and should(history_bytes=10_000)
    assert should(history_length=1000)
    # Runs recorded before the patches replay without those checks.
    assert not lifecycle.should_roll_over(cfg, figures(history_length=1000), bounded_context=True, bounded_work=False)
    assert not lifecycle.should_roll_over(cfg, figures(history_bytes=10_000), bounded_context=False, bounded_work=True)
    assert not lifecycle.should_roll_over(cfg.model_copy(update={"replay_budget_events": 0}), figures(history_length=10**6), bounded_context=True, bounded_work=True)


def test_a_run_must_roll_over_well_before_temporals_hard_limits():
    cfg = SessionConfig(max_updates_per_run=1000, max_history_bytes=20_000_000)
    assert lifecycle.must_roll_over(cfg, figures(updates=1500), bounded_context=False)
    assert not lifecycle.must_roll_over(cfg, figures(updates=1499), bounded_context=False)
    assert lifecycle.must_roll_over(cfg, figures(history_length=30_000), bounded_context=False)
    assert lifecycle.must_roll_over(cfg, figures(history_bytes=40_000_000), bounded_context=True)  # 3 x 20 MB capped at 40
    assert not lifecycle.must_roll_over(cfg, figures(history_bytes=40_000_000), bounded_context=False)


def test_idle_and_archive_timers_follow_the_last_message():
    cfg = SessionConfig(idle_after_seconds=1800, archive_after_seconds=7 * 86400)
    last = T0
    assert lifecycle.idle_timeout(cfg, now=T0 + timedelta(minutes=10), last_active_at=last, idle_marked=False, not_before=T0) == timedelta(minutes=20)
    assert lifecycle.idle_timeout(cfg, now=T0 + timedelta(hours=1), last_active_at=last, idle_marked=False, not_before=T0) == timedelta(seconds=1)
    week = lifecycle.idle_timeout(cfg, now=T0 + timedelta(hours=1), last_active_at=last, idle_marked=True, not_before=T0)
    assert week == timedelta(days=7) - timedelta(hours=1)
    retry = T0 + timedelta(days=8)
    assert lifecycle.idle_timeout(cfg, now=T0 + timedelta(days=7, hours=1), last_active_at=last, idle_marked=True, not_before=retry) == timedelta(hours=23)
    assert lifecycle.turns_idle(cfg, T0 + timedelta(minutes=30), last, idle_marked=False)
    assert not lifecycle.turns_idle(cfg, T0 + timedelta(minutes=30), last, idle_marked=True)
    assert lifecycle.due_for_archive(cfg, T0 + timedelta(days=7), last)
    assert lifecycle.active_since_idle(cfg, T0 + timedelta(minutes=29), last)


def test_a_summary_is_due_every_n_turns_past_the_kept_history_and_not_before_a_retry():
    cfg = SessionConfig(context_history_turns=30, summary_every_turns=10)
    assert lifecycle.summary_due(cfg, 39, covered=0, retry_turn=0) is None
    assert lifecycle.summary_due(cfg, 40, covered=0, retry_turn=0) == 10
    assert lifecycle.summary_due(cfg, 45, covered=10, retry_turn=0) is None
    assert lifecycle.summary_due(cfg, 50, covered=10, retry_turn=52) is None


# --------------------------------------------------------------------- memory hooks


def test_after_a_reply_rules_and_triggers_plan_one_extraction():
    cfg = SessionConfig(memory_extract_every_turns=8)
    transcript = Transcript(turn_messages(1, text="I live in Lyon and I prefer tea"))
    text = "I live in Lyon and I prefer tea"
    planned = memory_hooks.after_reply(
        cfg, user_id="u", session_id="s", turn=1, text=text, reply="Noted.", status="completed", records=[], specs={},
        triggers=detect_triggers(text), working=[], last_extracted_turn=0, transcript=transcript, now=T0, bounded_work=True,
    )
    assert planned.extraction is not None and planned.extraction.use_model and planned.last_extracted_turn == 1
    assert planned.extraction.rule_candidates and all(c.source_turn == 1 and c.user_id == "u" for c in planned.extraction.rule_candidates)
    assert "preference" in planned.reasons and planned.extraction.excerpt


def test_a_move_said_with_a_time_and_an_origin_is_written_after_its_turn_with_the_everyday_patch():
    cfg = SessionConfig(memory_extract_every_turns=8)
    text = "我二月底从利兹搬到爱丁堡了"
    transcript = Transcript(turn_messages(1, text=text))

    def plan(everyday: bool) -> memory_hooks.AfterReply:
        return memory_hooks.after_reply(
            cfg, user_id="u", session_id="s", turn=1, text=text, reply="好的。", status="completed", records=[], specs={},
            triggers=detect_triggers(text, everyday=everyday), working=[], last_extracted_turn=0, transcript=transcript,
            now=T0, bounded_work=True, everyday=everyday,
        )

    planned = plan(True)
    assert planned.extraction is not None and planned.extraction.use_model and "correction" in planned.reasons
    assert [(c.subject, c.value) for c in planned.extraction.rule_candidates] == [("home_city", "爱丁堡")]
    # A run recorded before the patch started no extraction here; its replay must not either.
    assert plan(False).extraction is None


def test_small_talk_gives_memory_nothing_and_forget_me_changes_nothing():
    cfg = SessionConfig(memory_extract_every_turns=8)
    transcript = Transcript(turn_messages(1, text="thanks!"))
    for text in ("thanks!", "forget everything about me"):
        planned = memory_hooks.after_reply(
            cfg, user_id="u", session_id="s", turn=1, text=text, reply="ok", status="completed", records=[], specs={},
            triggers=detect_triggers(text), working=[], last_extracted_turn=0, transcript=transcript, now=T0, bounded_work=True,
        )
        assert planned.extraction is None and planned.last_extracted_turn == 0


def test_at_the_end_the_unseen_turns_go_to_one_extraction():
    cfg = SessionConfig()
    transcript = Transcript([m for t in range(1, 4) for m in turn_messages(t)])
    covered, extraction = memory_hooks.at_end(
        cfg, user_id="u", session_id="s", turn_count=3, last_extracted_turn=1, transcript=transcript, reason="close", now=T0
    )
    assert covered == 3 and extraction is not None and {e.turn for e in extraction.excerpt} == {2, 3}
    assert extraction.reasons == ["close"] and extraction.use_model
    assert memory_hooks.at_end(cfg, user_id="u", session_id="s", turn_count=3, last_extracted_turn=3, transcript=transcript, reason="close", now=T0) == (3, None)


# -------------------------------------------------------------------- context plan


def test_a_listing_is_reused_by_reference_and_tool_lists_are_cached():
    planner = ContextPlanner()
    tools = [spec("a"), spec("b")]
    first = planner.take_listing(ListToolsResult(tools=tools, groups=[], ref="L1"), bounded=True)
    assert set(first[0]) == {"a", "b"} and planner.known_listing() == "L1" and planner.tools_generation == 1
    again = planner.take_listing(ListToolsResult(tools=[], groups=[], ref="L1", unchanged=True), bounded=True)
    assert again[0] is first[0] and planner.tools_generation == 1
    counter = planner.counter("", bounded_work=True)
    ref, tokens = planner.tool_list(tools, counter)
    assert ref is not None and tokens > 0 and planner.tool_list(tools, counter) == (ref, tokens)
    assert json.loads(planner.tool_bodies[ref])[0]["name"] == "a"
    assert planner.tool_list([], counter) == (None, 0)


def test_the_context_goes_by_reference_and_its_bodies_are_answered():
    cfg = SessionConfig()
    transcript = Transcript([m for t in range(1, 4) for m in turn_messages(t)])
    planner = ContextPlanner()
    counter = planner.counter("", bounded_work=True)
    transcript.count_all(counter.message)
    built = planner.build(
        transcript, cfg, turn=3, system_prompt="Be brief.", counter=counter, summary=None, memories=["likes tea"],
        tools=[], tool_tokens=0, correction=1.0,
    )
    ref = planner.context_ref(built, transcript, 3, 0)
    refs = planner.inflight_refs(3, 0)
    assert refs is not None and planner.inflight_refs(3, 1) is None and json.loads(planner.synthetic[ref]) == refs
    bodies = planner.bodies([ref, *refs, "unknown"], transcript)
    assert "unknown" not in bodies and set(refs) <= set(bodies)
    assert any("Be brief." in bodies[r] for r in refs) and any("likes tea" in bodies[r] for r in refs)


def test_a_turn_that_alone_does_not_fit_the_budget_is_refused_as_context_too_large():
    cfg = SessionConfig(context_window_tokens=600, context_reserve_ratio=0.0)
    transcript = Transcript([Message(role="user", content="word " * 3000, turn=1)])
    planner = ContextPlanner()
    counter = planner.counter("", bounded_work=True)
    transcript.count_all(counter.message)
    with pytest.raises(ContextTooLarge, match="600"):
        planner.build(transcript, cfg, turn=1, system_prompt="s", counter=counter, summary=None, memories=[], tools=[], tool_tokens=0, correction=1.0)


# -------------------------------------------------------------------------- state


def test_the_core_carries_what_it_was_given_and_bounds_what_grows():
    carry = SessionCarry(messages=turn_messages(1), turn_count=1, title="hello", run_index=2, notices=["n"], status="idle")
    inp = SessionInput(session_id="s", user_id="u", channel="cli", config=SessionConfig(), carry=carry)
    asked: list[str] = []
    core = SessionCore(inp, now=T0, first_run_id="run-1", patched=lambda p: asked.append(p) or True)
    assert core.chain_id == "run-1" and core.idle_marked and core.session_status() == "idle"
    out = core.carry()
    assert out.run_index == 3 and out.turn_count == 1 and out.title == "hello" and out.messages == carry.messages
    assert out.status == "idle" and core.carry_bytes() > len(out.model_dump_json())
    for i in range(150):
        core.add_trace(1, "model", T0, T0 + timedelta(milliseconds=i))
    assert len(core.trace) == 100 and core.trace[-1].step == 150 and core.trace[-1].latency_ms == 149
    assert core.knows("m1", bounded_work=False) and not core.knows("m2", bounded_work=False)
    core.replies.answered["m2"] = 2
    assert core.knows("m2", bounded_work=True) and not core.knows("m2", bounded_work=False)
    state = core.state(history_length=42, history_bytes=4096)
    assert (state.history_length, state.history_size_bytes, state.turn_count, state.status) == (42, 4096, 1, "idle")
    assert asked == []  # nothing above depended on a patch
    # The index row is the state's, built without the whole state.
    assert core.index_entry((1, "completed")) == SessionIndexEntry.from_state(state, (1, "completed"))
    assert core.index_entry() == SessionIndexEntry.from_state(state)
    core.book.halted_on.add("c")
    assert core.session_status() == "halted"
    core.status = "closed"
    assert core.session_status() == "closed"
    assert patches.BOUNDED_WORK in patches.ALL and len(set(patches.ALL)) == len(patches.ALL)


def test_a_context_part_that_is_no_transcript_message_is_referenced_by_its_whole_body():
    """The references of synthetic parts are cached by text; a part with the same text but
    another body field (an empty name, empty reasoning: ``body_json`` keeps them) must get
    its own body's reference, and a body trimmed from the planner comes back."""
    from hermes.content.blobs import message_ref

    planner = ContextPlanner()
    parts = [
        Message(role="system", content="x"),
        Message(role="system", content="x", name=""),
        Message(role="assistant", content="y"),
        Message(role="assistant", content="y", reasoning=""),
    ]
    for m in parts * 2:
        ref = planner._synthetic_ref(m)
        assert ref == message_ref(m) and ref in planner.synthetic
    planner.synthetic.clear()
    assert planner._synthetic_ref(parts[0]) in planner.synthetic


def test_the_planner_hands_its_listing_and_last_context_over_to_the_next_run_within_a_size_limit():
    """Continue-as-new carries the last listing, the last call's context list and the
    references the content store took of that call (``ContextCarry``), in their order and
    only those; a listing too large for the bound (non-ASCII counted in UTF-8 bytes) is
    not carried, and the next run lists again."""
    from hermes.models import MAX_CARRIED_CONTEXT_BYTES, ListToolsResult, ToolSpec

    def listing(description: str) -> ListToolsResult:
        tool = ToolSpec(name="calculate", description=description, parameters={"type": "object", "properties": {}})
        return ListToolsResult(tools=[tool], ref="b:tools1", memory=True, encoding="cl100k_base")

    planner = ContextPlanner()
    planner.take_listing(listing("Evaluates arithmetic."), bounded=True)
    planner.tool_bodies["b:toollist"] = "[]"
    planner.sent = ("b:list", ["m:one", "m:two", "b:summary"])
    planner.mark_stored(["b:list", "m:two", "b:toollist", "m:old-run-message", "b:summary"])
    carried = planner.handover(memory=True, encoding="cl100k_base")
    assert carried is not None and carried.listing is not None and carried.listing.memory
    assert carried.sent_ref == "b:list" and carried.sent_refs == ["m:one", "m:two", "b:summary"]
    assert carried.stored == ["b:list", "m:two", "b:summary", "b:toollist"]  # not m:old-run-message

    following = ContextPlanner()
    following.take_over(carried)
    assert following.known_listing() == "b:tools1" and following.listing is not None
    assert set(following.listing[1]) == {"calculate"}
    assert following.sent == ("b:list", ["m:one", "m:two", "b:summary"]) and "m:one" not in following.stored

    # 3 UTF-8 bytes a character: within the bound counted in characters, over it in bytes.
    big = ContextPlanner()
    big.take_listing(listing("算" * (MAX_CARRIED_CONTEXT_BYTES // 3 + 100)), bounded=True)
    assert big.handover(memory=True, encoding="cl100k_base") is None
