"""Previews keep the head and the tail of a long text, with a marker saying what was cut
and how to read it (issue 27: a 6 MB tool result's preview held its head only, while
errors and totals are usually at the end)."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from activities.tools import cap_result, to_tool_result
from hermes.content.blobs import arguments_stand_in, stored_preview, value_ref
from hermes.content.previews import head_and_tail
from hermes.models import CallModelInput, CallModelResult, Message, ToolCall, ToolResult
from hermes.tools.builtin import register_builtins
from hermes.tools.registry import ToolRegistry
from workflows.session.payloads import MAX_RESULT_CHARS
from workflows.session.transcript import result_content

LAST_LINE = "TOTAL: 99999 rows, 3 errors (last: disk full on /var)"
MARKER = re.compile(
    r"\[\.\.\. ([\d,]+) characters \((?:([\d,]+) lines, )?([\d,]+) bytes\) cut here: characters ([\d,]+) to ([\d,]+) of ([\d,]+)"
)


def numbers(match: re.Match[str]) -> list[int]:
    return [int(g.replace(",", "")) if g else 0 for g in match.groups()]


def report(rows: int = 100_000) -> str:
    return "".join(f"row {i}: ok é 😀\n" for i in range(rows)) + LAST_LINE


def test_a_long_text_keeps_its_last_line_and_says_exactly_what_was_cut():
    text = report()
    preview = head_and_tail(text, 4000, how_to_read="read it with read_stored_content(offset={start})")
    assert preview.text.startswith("row 0: ok") and preview.text.endswith("\n" + LAST_LINE)
    assert len(preview.text) <= 4000
    (match,) = MARKER.finditer(preview.text)
    chars, lines, size, start, end, total = numbers(match)
    cut = text[start:end]
    assert (chars, lines, size, total) == (len(cut), cut.count("\n"), len(cut.encode("utf-8")), len(text))
    assert (start, end) == (preview.cut_start, preview.cut_end)
    # Cut on line boundaries: the head ends a line, the tail starts one.
    assert text[start - 1] == "\n" and text[end - 1] == "\n"
    assert f"read_stored_content(offset={start})" in preview.text
    head, tail = preview.text[: match.start()], preview.text.partition(" ...]\n")[2]
    assert text == head + cut + tail
    # About two thirds head, one third tail.
    assert 1.5 < len(head) / len(tail) < 2.5


def test_a_byte_budget_never_splits_a_character_or_a_surrogate_pair():
    emoji = "😀" * 10_000 + "end"
    preview = head_and_tail(emoji, 10_000, max_bytes=3000)
    assert len(preview.text.encode("utf-8")) <= 3000 and preview.text.endswith("😀end")
    preview.text.encode("utf-8")  # whole characters only (a split one would not encode)

    pairs = "\ud83d\ude00" * 5_000 + "end"  # a pair as text decoded with surrogatepass holds it
    for budget in range(300, 340):
        shown = head_and_tail(pairs, budget)
        head, tail = shown.text.split("\n[... ")[0], shown.text.partition(" ...]\n")[2]
        assert len(head) % 2 == 0 and (len(tail) - 3) % 2 == 0, budget
        assert not head.endswith("\ud83d") and not tail.startswith("\ude00")


def test_a_json_preview_never_splits_an_escape():
    text = json.dumps("\x01" * 3_000 + "\n".join(f"line {i}" for i in range(3)) + "\x01" * 3_000 + "END")
    for budget in range(400, 460):
        shown = head_and_tail(text, budget, json_text=True)
        head, tail = shown.text.split("\n[... ")[0], shown.text.partition(" ...]\n")[2]
        assert (len(head) - 1) % 6 == 0, (budget, head[-8:])  # '"' then whole \u0001 escapes
        assert tail.endswith('END"') and (len(tail) - 4) % 6 == 0, (budget, tail[:8])


def test_a_large_tool_result_kept_by_reference_shows_its_last_line_and_where_the_cut_starts():
    result = to_tool_result({"output": report()})
    whole = result.model_dump_json()
    ref = value_ref(whole)
    capped = cap_result(result, 64_000, ref=ref, whole_json=whole)
    preview = capped.data["preview"]
    assert preview.startswith('{"output":"row 0: ok') and preview.endswith(json.dumps(LAST_LINE)[1:] + "}")
    (match,) = MARKER.finditer(preview)
    chars, lines, size, start, end, total = numbers(match)
    assert total == len(whole) == capped.data["size_chars"]
    cut = whole[start:end]
    assert (chars, lines, size) == (len(cut), cut.count("\\n"), len(cut.encode("utf-8")))
    # The offsets are the stored result's: the head ends and the tail starts where they say.
    head = preview.partition("\n[... ")[0]
    assert whole[:start].endswith(head) and whole[end:].startswith(preview.partition(" ...]\n")[2][:200])
    assert f'read_stored_content(ref="{ref}", offset={start}, length=8000)' in preview
    assert "head and tail" in capped.message


def test_a_large_tool_result_that_could_not_be_kept_still_shows_its_tail_and_says_it_is_lost():
    capped = cap_result(to_tool_result({"output": report()}), 64_000)
    preview = capped.data["preview"]
    assert preview.endswith(json.dumps(LAST_LINE)[1:] + "}") and "it is not kept anywhere" in preview
    assert MARKER.search(preview) and "the rest is not kept" in capped.message
    assert len(capped.model_dump_json().encode("utf-8")) < 64_000


def test_a_message_kept_by_reference_shows_its_tail_and_the_read_that_fetches_the_cut():
    text = report()
    ref = value_ref(text)
    preview = stored_preview(text, ref, "message")
    header, _, body = preview.partition("\n")
    assert ref in header and "last" in header and body.endswith(LAST_LINE)
    (match,) = MARKER.finditer(body)
    start = numbers(match)[3]
    assert text[:start] == body.partition("[... ")[0]
    assert f'read_stored_content(ref="{ref}", offset={start}, length=8000)' in body


def test_a_tool_result_too_long_for_the_model_keeps_its_tail_under_the_patch():
    result = ToolResult(data={"lines": [f"line {i}" for i in range(5_000)] + [LAST_LINE]})
    content = result_content(result, head_and_tail=True)
    assert len(content) <= MAX_RESULT_CHARS
    preview = json.loads(content)["data"]["preview"]
    assert preview.startswith('{"lines": ["line 0"') and preview.endswith(json.dumps(LAST_LINE) + "]}")
    assert MARKER.search(preview) and "hermes show" in preview
    # Runs recorded before the patch keep the head alone (they replay as they ran).
    old = json.loads(result_content(result))["data"]["preview"]
    assert LAST_LINE not in old and "cut here" not in old


def test_the_stand_in_of_large_arguments_shows_their_head_and_tail():
    text = json.dumps({"command": "\n".join(f"echo {i}" for i in range(20_000)) + "\nrm -rf /tmp/build"})
    ref = value_ref(json.loads(text))
    preview = arguments_stand_in(ref, text)["preview"]
    assert len(preview) <= 1000 and preview.startswith('{"command": "echo 0\\necho 1')
    assert preview.endswith('rm -rf /tmp/build"}') and f'read_stored_content(ref="{ref}", offset=' in preview


class SeesTheResult:
    """A scripted stand-in for a model: calls ``report`` on the first message, keeps the
    tool result it is handed, then answers."""

    name = "test"

    def __init__(self) -> None:
        self.seen: list[str] = []

    async def complete(self, request: CallModelInput) -> CallModelResult:
        last = request.messages[-1]
        if last.role == "tool":
            self.seen.append(last.content or "")
            message = Message(role="assistant", content="done")
        else:
            message = Message(role="assistant", tool_calls=[ToolCall(tool_call_id="t1", name="report")])
        return CallModelResult(message=message, provider=self.name)


@pytest.mark.timeout(120)
async def test_a_session_hands_the_model_the_tail_of_a_result_too_long_for_it(run_worker, session_id):
    registry = register_builtins(ToolRegistry())
    rows = [f"row {i}: ok" for i in range(3_000)]  # about 45 KB: under the 64 KB kept whole, over 16,000 characters

    def report() -> dict[str, Any]:
        """The nightly report."""
        return {"rows": rows, "summary": LAST_LINE}

    registry.register(report)
    model = SeesTheResult()
    async with run_worker(model, registry=registry) as hermes:
        turn = await hermes.send_message(session_id, "the report please")
    assert (turn.status, turn.reply) == ("completed", "done")
    assert turn.tool_calls[0].result.data == {"rows": rows, "summary": LAST_LINE}  # the record keeps it whole
    (seen,) = model.seen
    assert len(seen) <= MAX_RESULT_CHARS
    preview = json.loads(seen)["data"]["preview"]
    assert preview.startswith('{"rows": ["row 0: ok"') and preview.endswith(f'"summary": {json.dumps(LAST_LINE)}}}')
    assert MARKER.search(preview)
