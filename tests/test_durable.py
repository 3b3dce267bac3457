"""What must survive lives in the durable store (LanceDB), not in Redis alone: each kind is
written, Redis is flushed (``FLUSHALL``), and it is read back whole. Real Temporal, Redis
and LanceDB (this test's ``HERMES_MEMORY_URI``); only the model is scripted.
"""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import Any

import pytest
from temporalio.testing import ActivityEnvironment

from activities.model import MAX_REPLY_BYTES, ModelActivities
from activities.tools import ToolActivities, idempotency_key, to_tool_result
from activities.transcript import TranscriptActivities, read_snapshot
from hermes.content.blobs import BlobStore, value_ref
from hermes.infra.durable import NOTES, TOOL_CALLS, TOOL_RESULTS, DurableStore, DurableStoreError, Record
from hermes.infra.ledger import CallLedger
from hermes.models import (
    CallModelInput,
    CallModelResult,
    Message,
    RunToolInput,
    SessionCarry,
    SessionConfig,
    SnapshotInput,
    ToolCall,
    ToolResult,
    ToolResultCode,
)
from hermes.providers.scripted import ScriptedModel
from hermes.tools.builtin import list_notes, read_stored_content, register_builtins, save_note
from hermes.tools.registry import ToolContext, ToolRegistry
from tests.support import eventually

REF_IN_TEXT = re.compile(r"(b:[0-9a-f]{32})")


def notes_script(titles: list[str]) -> dict[str, Any]:
    """One turn per title saving a note (needs approval), and a turn listing them all."""
    turns: list[dict[str, Any]] = [
        {
            "match": f"note {title}$",
            "steps": [
                {"tool_calls": [{"name": "save_note", "arguments": {"title": title, "text": f"text of {title} ✓"}}]},
                {"reply": "{{ last_tool_result.message }}"},
            ],
        }
        for title in titles
    ]
    turns.append(
        {
            "match": "list",
            "steps": [
                {"tool_calls": [{"name": "list_notes", "arguments": {"limit": 100}}]},
                {"reply": "{{ last_tool_result.data.count }} notes"},
            ],
        }
    )
    return {"turns": turns}


async def save_notes_with_approval(hermes: Any, session_id: str, user_id: str, titles: list[str]) -> None:
    for title in titles:
        turn = asyncio.ensure_future(hermes.send_message(session_id, f"note {title}", user_id=user_id))
        try:
            pending = await hermes.wait_for_approval(session_id, timeout_seconds=30)
            await hermes.approve(session_id, pending.tool_call_id, approver=user_id)
            result = await asyncio.wait_for(turn, 60)
        finally:
            turn.cancel()
        assert result.reply == "note saved", result


async def test_notes_confirmed_as_saved_are_all_listed_after_redis_is_flushed(run_worker, session_id, redis):
    user_id = "ann o'neil"  # a quote in the id: filters must quote it
    titles = ["milk", "豆腐", "bread 🍞"]
    async with run_worker(notes_script(titles)) as hermes:
        await save_notes_with_approval(hermes, session_id, user_id, titles)
        await redis.flushall()

        listed = await hermes.send_message(session_id, "list my notes", user_id=user_id)

    assert listed.reply == "3 notes"
    notes = listed.tool_calls[0].result.data["notes"]
    assert [(n["title"], n["text"]) for n in notes] == [(t, f"text of {t} ✓") for t in titles]
    assert all(n["session_id"] == session_id for n in notes)


async def test_the_approval_audit_is_whole_after_redis_is_flushed(run_worker, session_id, redis):
    user_id = "audited-user"
    async with run_worker(notes_script(["one", "two"])) as hermes:
        await save_notes_with_approval(hermes, session_id, user_id, ["one", "two"])

        async def both_verdicts() -> list[Any]:
            entries = await hermes.get_approval_audit(session_id=session_id)
            return entries if sum(e.event == "verdict" for e in entries) == 2 else []

        before = await eventually(both_verdicts, what="both verdicts in the audit log")
        await redis.flushall()
        after = await hermes.get_approval_audit(session_id=session_id)
        across_sessions = await hermes.get_approval_audit(limit=1000)

    assert after == before
    assert [(e.event, e.outcome) for e in after if e.event != "decision"] == [
        ("requested", ""),
        ("verdict", "approved"),
    ] * 2
    assert all(e.approver == user_id for e in after if e.event == "verdict")
    assert [e for e in across_sessions if e.session_id == session_id] == after


class ReadsWhatItIsShown:
    """A stand-in model: a message naming a reference makes it read 500 characters from
    the middle of it with ``read_stored_content``; anything else gets "got it"."""

    name = "test"

    def __init__(self) -> None:
        self.reads: list[dict[str, Any]] = []

    async def complete(self, request: CallModelInput) -> CallModelResult:
        last = request.messages[-1]

        def say(content: str | None = None, calls: list[ToolCall] | None = None) -> CallModelResult:
            return CallModelResult(message=Message(role="assistant", content=content, tool_calls=calls or []), provider=self.name)

        if last.role == "tool":
            self.reads.append(json.loads(last.content or "{}"))
            return say("read it")
        found = REF_IN_TEXT.search(last.content or "")
        if last.role == "user" and found and (last.content or "").startswith("read "):
            size = int(re.search(r"size (\d+)", last.content or "").group(1))  # type: ignore[union-attr]
            arguments = {"ref": found.group(1), "offset": size // 2, "length": 500}
            return say(calls=[ToolCall(tool_call_id=f"r{request.turn}", name="read_stored_content", arguments=arguments)])
        return say("got it")


async def test_a_large_message_kept_by_reference_is_read_by_the_model_after_redis_is_flushed(run_worker, session_id, redis):
    text = "".join(f"{n:06d} 长文 Ünïcödé 🌏 \"quoted\"\n" for n in range(40_000))  # about 1.5 MB
    ref = value_ref(text)
    model = ReadsWhatItIsShown()
    async with run_worker(model) as hermes:
        first = await hermes.send_message(session_id, text)
        assert first.reply == "got it"
        await redis.flushall()

        turn = await hermes.send_message(session_id, f"read {ref} size {len(text)}")
        whole = await hermes.get_stored_content(ref)

    assert turn.reply == "read it" and turn.tool_calls[0].result.code == ToolResultCode.OK
    middle = len(text) // 2
    assert model.reads[0]["data"]["text"] == text[middle : middle + 500]
    assert whole == text


class Silent:
    name = "test"

    async def complete(self, request: CallModelInput) -> CallModelResult:  # pragma: no cover - never called
        raise AssertionError("no model call expected")


@pytest.mark.parametrize("producer", ["tool result", "model reply"])
async def test_a_large_result_or_reply_kept_by_reference_is_readable_after_redis_is_flushed(
    redis, _memory_store_per_test: Path, producer
):
    durable = DurableStore(_memory_store_per_test)
    big = "".join(f"{n:06d} résultat 結果 \"q\"\n" for n in range(20_000))
    if producer == "tool result":
        tools = ToolActivities(register_builtins(ToolRegistry()), redis, tier_seconds=lambda tier: 15.0, durable=durable)
        kept = await tools.bounded(to_tool_result({"lines": big}))
        ref, whole = kept.data["ref"], to_tool_result({"lines": big}).model_dump_json()
    else:
        model = ModelActivities(Silent(), store=BlobStore(redis, durable=durable))
        reply = CallModelResult(message=Message(role="assistant", content=big * (MAX_REPLY_BYTES // len(big) + 1)), provider="test")
        kept = await model._bounded("s", reply)
        whole = reply.message.content or ""
        (ref,) = REF_IN_TEXT.findall((kept.message.content or "")[:300])
    await redis.flushall()

    context = ToolContext(session_id="s", user_id="u", tool_call_id="c", turn=1, redis=redis, durable=durable)
    read = await read_stored_content(ref, context, offset=1000, length=3000)
    assert read.code == ToolResultCode.OK, read.message
    assert read.data["text"] == whole[1000:4000] and read.data["total_chars"] == len(whole)
    # Read once, it is in Redis again: the fast path is refilled.
    assert await BlobStore(redis).get_many([ref]) == {ref: whole}


async def test_an_archived_transcript_is_whole_after_redis_is_flushed(run_worker, session_id, redis):
    # A small carry budget: every few turns the oldest move to the transcript archive.
    config = SessionConfig(max_updates_per_run=3, max_carry_bytes=4000)
    model = ScriptedModel.from_dict({"turns": [], "fallback": "ok " + "r" * 300})
    async with run_worker(model, config=config) as hermes:
        for n in range(1, 13):
            assert (await hermes.send_message(session_id, f"message {n} " + "u" * 300)).status == "completed"
        state = await hermes.get_state(session_id)
        assert state.archived_messages > 0, "nothing was archived: the test would prove nothing"
        await redis.flushall()
        transcript = await hermes.get_transcript(session_id, include_archived=True)

    users = [m.content.split(" ")[1] for m in transcript if m.role == "user" and m.content]
    assert users == [str(n) for n in range(1, 13)]
    assert [m.role for m in transcript] == ["user", "assistant"] * 12


async def test_a_session_snapshot_is_read_from_the_durable_store_after_redis_is_flushed(redis, _memory_store_per_test: Path):
    durable = DurableStore(_memory_store_per_test)
    carry = SessionCarry(
        messages=[Message(role="user", content="hello 世界", turn=1), Message(role="assistant", content="hi", turn=1)],
        turn_count=1,
        title="it's a title",
        chain_id="chain-1",
    )
    activities = TranscriptActivities(redis, durable)
    session_id = "snap 'quoted' session"
    await ActivityEnvironment().run(activities.save_snapshot, SnapshotInput(session_id=session_id, carry=carry))
    await ActivityEnvironment().run(activities.save_snapshot, SnapshotInput(session_id=session_id, carry=carry))  # a retry
    await redis.flushall()

    assert await read_snapshot(redis, session_id, durable) == carry
    assert await read_snapshot(redis, "another session", durable) is None


def counting_registry(runs: list[str]) -> ToolRegistry:
    registry = ToolRegistry()

    def send_payment(amount: int) -> dict[str, Any]:
        """Send a payment (a side effect: runs at most once)."""
        runs.append(f"paid {amount}")
        return {"paid": amount}

    registry.register(send_payment, idempotent=False, permission="read")
    return registry


def payment_tools(redis: Any, durable: DurableStore) -> tuple[list[str], ToolActivities]:
    """Tool activities with ``send_payment`` over ``durable``, and the list of its runs."""
    runs: list[str] = []
    return runs, ToolActivities(counting_registry(runs), redis, tier_seconds=lambda tier: 15.0, durable=durable)


def payment_call(tool_call_id: str) -> RunToolInput:
    return RunToolInput(
        session_id="pay-session",
        user_id="u",
        turn=1,
        chain_id="c",
        idempotent=False,
        tool_call=ToolCall(tool_call_id=tool_call_id, name="send_payment", arguments={"amount": 5}),
    )


async def test_a_non_idempotent_call_retried_after_redis_is_flushed_is_not_run_again(redis, _memory_store_per_test: Path):
    durable = DurableStore(_memory_store_per_test)
    runs, tools = payment_tools(redis, durable)
    request = payment_call("t1")

    first = await ActivityEnvironment().run(tools.run_tool, request)
    await redis.flushall()
    retried = await ActivityEnvironment().run(tools.run_tool, request)

    assert runs == ["paid 5"]
    assert first.code == ToolResultCode.OK and retried == first
    # The Redis record is back, so later attempts take the fast path.
    assert json.loads(await redis.get(idempotency_key(request.call_key)))["state"] == "done"


STARTED = json.dumps({"state": "started", "attempt": 1, "tool": "send_payment"})
"""The claim a worker killed mid-call leaves, with no result."""


async def test_a_call_that_started_and_never_reported_is_an_unknown_outcome_after_redis_is_flushed(
    redis, _memory_store_per_test: Path
):
    durable = DurableStore(_memory_store_per_test)
    runs, tools = payment_tools(redis, durable)
    request = payment_call("t2")
    assert await CallLedger(durable).claim(request.call_key, "pay-session", STARTED) is None

    retried = await ActivityEnvironment().run(tools.run_tool, request)

    assert runs == []
    assert retried.code == ToolResultCode.OUTCOME_UNKNOWN and retried.data["outcome"] == "unknown"


async def test_a_claim_file_that_cannot_be_parsed_reads_as_started_and_the_call_is_not_run(
    redis, _memory_store_per_test: Path
):
    durable = DurableStore(_memory_store_per_test)
    runs, tools = payment_tools(redis, durable)
    request = payment_call("t-empty")
    claim, _ = CallLedger(durable)._paths(request.call_key)
    claim.parent.mkdir(parents=True)
    claim.write_bytes(b"\x00\x00")  # a disk fault

    retried = await ActivityEnvironment().run(tools.run_tool, request)

    assert runs == []
    assert retried.code == ToolResultCode.OUTCOME_UNKNOWN


async def test_an_empty_claim_left_long_ago_reads_as_started_at_once_and_a_fresh_one_is_read_again(
    _memory_store_per_test: Path, monkeypatch: pytest.MonkeyPatch
):
    import os
    import time
    from types import SimpleNamespace

    from hermes.infra import ledger as ledger_module

    slept: list[float] = []
    clock = SimpleNamespace(time=time.time, monotonic=time.monotonic, sleep=lambda s: (slept.append(s), time.sleep(s)))
    monkeypatch.setattr(ledger_module, "time", clock)
    ledger = CallLedger(DurableStore(_memory_store_per_test))
    claim, result = ledger._paths("s:c:1:empty")
    claim.parent.mkdir(parents=True)

    # Left by a writer that died between creating and writing it (a power loss): no wait.
    claim.write_bytes(b"")
    os.utime(claim, (time.time() - 60, time.time() - 60))
    assert await ledger.claim("s:c:1:empty", "s", STARTED) == {"state": "started"}
    assert await ledger.done("s:c:1:empty") is None
    assert slept == []

    # Still being written (just created): read again, for at most the settle time.
    claim.write_bytes(json.dumps({"key": "k", "owner": "s", "at": "", "value": ""})[:10].encode())
    assert await ledger.claim("s:c:1:empty", "s", STARTED) == {"state": "started"}
    assert slept and sum(slept) <= ledger_module._SETTLE_SECONDS + 1e-6

    # A whole claim beside a result cut short long ago: the claim, at once.
    slept.clear()
    claim.write_bytes(json.dumps({"key": "k", "owner": "s", "at": "", "value": STARTED}).encode())
    result.write_bytes(b'{"key": "k", "ow')
    os.utime(result, (time.time() - 60, time.time() - 60))
    assert await ledger.claim("s:c:1:empty", "s", STARTED) == json.loads(STARTED)
    assert slept == []


async def test_a_claim_kept_in_lancedb_by_an_earlier_version_still_stops_a_second_run(redis, _memory_store_per_test: Path):
    durable = DurableStore(_memory_store_per_test)
    runs, tools = payment_tools(redis, durable)
    request = payment_call("t-legacy")
    # A worker of the version before kept its claims in LanceDB (a rolling upgrade).
    await durable.insert(TOOL_CALLS, [Record(key=request.call_key, owner="pay-session", value=STARTED)])

    retried = await ActivityEnvironment().run(tools.run_tool, request)
    again = await ActivityEnvironment().run(tools.run_tool, request)

    assert runs == []
    assert retried.code == again.code == ToolResultCode.OUTCOME_UNKNOWN


async def test_claims_racing_for_one_call_grant_it_once_and_the_rest_read_its_result(_memory_store_per_test: Path):
    ledger = CallLedger(DurableStore(_memory_store_per_test))
    assert ledger.uses_files

    # Many rounds: a claim read between its creation and its write is a narrow window.
    for round_ in range(40):
        key = f"s:c:1:race{round_}"
        outcomes = await asyncio.gather(*(ledger.claim(key, "s", STARTED) for _ in range(8)))
        await ledger.finish(key, "s", json.dumps({"state": "done", "result": {"code": 0}}))

        assert outcomes.count(None) == 1
        assert all(o == json.loads(STARTED) for o in outcomes if o is not None), "a claim is never read half written"
    assert await ledger.claim("s:c:1:race0", "s", STARTED) == {"state": "done", "result": {"code": 0}}
    # Reading the result never claims: a call claimed without one, or never claimed, has none.
    assert await ledger.done("s:c:1:race0") == {"state": "done", "result": {"code": 0}}
    assert await ledger.claim("s:c:1:other", "s", STARTED) is None
    assert await ledger.done("s:c:1:other") is None and await ledger.done("s:c:1:never") is None
    assert await ledger.claim("s:c:1:never", "s", STARTED) is None, "done() claimed the call"


async def test_on_object_storage_the_ledger_is_the_lancedb_tables(s3_server: Any, monkeypatch: pytest.MonkeyPatch):
    from hermes.settings import get_settings

    for name, value in (("ENDPOINT_URL", s3_server.endpoint), ("REGION", "us-east-1"), ("ACCESS_KEY_ID", "testing"),
                        ("SECRET_ACCESS_KEY", "testing")):
        monkeypatch.setenv(f"HERMES_S3_{name}", value)
    get_settings.cache_clear()
    try:
        durable = DurableStore(s3_server.fresh_uri())
        ledger = CallLedger(durable)
        assert not ledger.uses_files

        assert await ledger.claim("s:c:1:t", "s", STARTED) is None
        assert await ledger.claim("s:c:1:t", "s", STARTED) == json.loads(STARTED)
        await ledger.finish("s:c:1:t", "s", json.dumps({"state": "done"}))

        assert await ledger.claim("s:c:1:t", "s", STARTED) == {"state": "done"}
        assert await ledger.done("s:c:1:t") == {"state": "done"} and await ledger.done("s:c:1:none") is None
        assert set(await durable.get(TOOL_CALLS, ["s:c:1:t"])) == set(await durable.get(TOOL_RESULTS, ["s:c:1:t"])) == {"s:c:1:t"}
    finally:
        get_settings.cache_clear()


async def test_a_result_recorded_in_the_claims_table_before_results_had_their_own_is_returned_not_run(
    redis, _memory_store_per_test: Path
):
    durable = DurableStore(_memory_store_per_test)
    runs, tools = payment_tools(redis, durable)
    request = payment_call("t-old")
    # What the ledger kept before results were appended to their own table: the claim's
    # row, upserted to "done" with the result.
    stored = ToolResult(code=ToolResultCode.OK, message="paid", data={"paid": 5})
    done = json.dumps({"state": "done", "result": stored.model_dump(mode="json")})
    await durable.insert(TOOL_CALLS, [Record(key=request.call_key, owner="pay-session", value=done)])

    retried = await ActivityEnvironment().run(tools.run_tool, request)

    assert runs == [] and retried == stored
    assert await durable.get(TOOL_RESULTS, [request.call_key]) == {}


@pytest.fixture
def broken_store(tmp_path: Path) -> DurableStore:
    """A durable store at a path that is a file: every open fails."""
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("x")
    return DurableStore(blocker / "store")


async def test_a_note_the_store_cannot_take_is_reported_as_not_saved(broken_store, redis):
    context = ToolContext(session_id="s", user_id="u", tool_call_id="c", turn=1, redis=redis, durable=broken_store)

    saved = await save_note("t", "x", context)
    listed = await list_notes(context)

    assert saved.code == ToolResultCode.DEPENDENCY_UNAVAILABLE and "not saved" in saved.message
    assert str(broken_store.uri) in saved.message and "note saved" not in saved.message
    assert listed.code == ToolResultCode.DEPENDENCY_UNAVAILABLE and "could not be read" in listed.message


async def test_a_non_idempotent_call_is_not_run_when_its_durable_record_cannot_be_kept(broken_store, redis):
    runs, tools = payment_tools(redis, broken_store)
    request = payment_call("t3")

    first = await ActivityEnvironment().run(tools.run_tool, request)
    retried = await ActivityEnvironment().run(tools.run_tool, request)

    assert runs == []
    assert first.code == ToolResultCode.DEPENDENCY_UNAVAILABLE and "was not run" in first.message
    assert retried == first


async def test_rows_are_selected_by_their_exact_owner_and_a_retried_write_changes_nothing(_memory_store_per_test: Path):
    store = DurableStore(_memory_store_per_test)
    assert await store.insert(NOTES, [Record(key="k1", owner="x' OR '1'='1", value="first")]) == 1
    assert await store.insert(NOTES, [Record(key="k1", owner="x' OR '1'='1", value="retried")]) == 0
    await store.insert(NOTES, [Record(key="k2", owner="someone else", value="other")])

    assert [r.value for r in await store.list(NOTES, owner="x' OR '1'='1")] == ["first"]
    assert await store.list(NOTES, owner="x") == []
    assert set(await store.get(NOTES, ["k1", "k2", "it's missing"])) == {"k1", "k2"}
    with pytest.raises(DurableStoreError, match="NUL"):
        await store.list(NOTES, owner="a\x00b")


def test_a_claim_file_is_flushed_by_its_directory_before_the_tool_may_run(tmp_path: Path, monkeypatch) -> None:
    """A claim's *name* is what stops a second run: the ledger flushed the claim's
    contents but not the directory that names it, so a power loss could lose the claim of
    a tool that ran. Each claim flushes its folder (and a new folder's parent) after the
    link (and the first claim of a process its new folders' parents); a result is written
    without a flush (a lost one reads as the claim: unknown)."""
    import os as real_os

    import hermes.infra.ledger as ledger_module

    flushed: list[str] = []

    def fsync(fd: int) -> None:
        flushed.append(real_os.readlink(f"/proc/self/fd/{fd}"))

    monkeypatch.setattr(ledger_module.os, "fsync", fsync)
    ledger = CallLedger(DurableStore(tmp_path))
    claim, result = ledger._paths("s:c1")
    assert ledger._claim_file("s:c1", "s", STARTED) is None
    ledger_dir = claim.parent.parent
    assert claim.exists() and flushed == [str(ledger_dir.parent), str(ledger_dir), str(claim.parent)]
    flushed.clear()
    ledger._write_result("s:c1", "s", json.dumps({"state": "done"}))
    assert result.exists() and flushed == []
    assert ledger._claim_file("s:c1", "s", STARTED) == {"state": "done"}  # refused: the result answers
    other_key = next(f"s:c{i}" for i in range(2, 1000) if ledger._paths(f"s:c{i}")[0].parent != claim.parent)
    other, _ = ledger._paths(other_key)
    flushed.clear()
    assert ledger._claim_file(other_key, "s", STARTED) is None
    # Another folder: made and flushed into the ledger directory with the first (one
    # fsync a process for all 256 record folders, issue 31), so only the claim's own flush.
    assert other.parent.is_dir() and flushed == [str(other.parent)]
    assert sorted(p.name for p in ledger_dir.iterdir()) == [f"{i:02x}" for i in range(256)]


def test_a_folder_made_before_is_flushed_into_its_parent_the_first_time_a_process_uses_it(tmp_path: Path, monkeypatch) -> None:
    """A folder whose maker died (or failed) before flushing it into its parent is flushed
    by the next process that claims in it (found by a break-it review)."""
    import os as real_os

    import hermes.infra.ledger as ledger_module

    claim, _ = CallLedger(DurableStore(tmp_path))._paths("s:c1")
    claim.parent.mkdir(parents=True)  # made, never flushed
    flushed: list[str] = []
    monkeypatch.setattr(ledger_module.os, "fsync", lambda fd: flushed.append(real_os.readlink(f"/proc/self/fd/{fd}")))
    assert CallLedger(DurableStore(tmp_path))._claim_file("s:c1", "s", STARTED) is None
    assert flushed == [str(claim.parent.parent.parent), str(claim.parent.parent), str(claim.parent)]


def test_a_claim_whose_folder_cannot_be_flushed_is_not_left_behind(tmp_path: Path, monkeypatch) -> None:
    """The claim is linked before its folder is flushed: when the flush fails, the call is
    reported as not run, so the claim is removed (left, a later attempt would say the tool
    may have run; found by a break-it review)."""
    import errno as errnos

    import hermes.infra.ledger as ledger_module

    ledger = CallLedger(DurableStore(tmp_path))
    claim, _ = ledger._paths("s:c1")
    ledger._folder(claim.parent)

    def fsync(fd: int) -> None:
        raise OSError(errnos.EIO, "I/O error")

    monkeypatch.setattr(ledger_module.os, "fsync", fsync)
    with pytest.raises(OSError):
        ledger._claim_file("s:c1", "s", STARTED)
    assert not claim.exists()
    monkeypatch.undo()
    assert ledger._claim_file("s:c1", "s", STARTED) is None and claim.exists()


def test_a_ledger_whose_folders_were_removed_while_it_ran_makes_them_again(tmp_path: Path) -> None:
    """The ledger remembers the folders it made; one removed meanwhile (a data directory
    cleared under a running worker) is made again, not a failed claim."""
    import shutil

    ledger = CallLedger(DurableStore(tmp_path))
    assert ledger._claim_file("s:c1", "s", STARTED) is None
    shutil.rmtree(tmp_path / "hermes_tool_ledger")
    assert ledger._claim_file("s:c1", "s", STARTED) is None  # a new claim: the old one is gone
    ledger._write_result("s:c1", "s", json.dumps({"state": "done"}))
    shutil.rmtree(tmp_path / "hermes_tool_ledger")
    ledger._write_result("s:c1", "s", json.dumps({"state": "done"}))
    assert ledger._read_files("s:c1") == {"state": "done"}
