"""Previews of long texts for the model: the head and the tail, and a marker saying what
was cut between them and how to read it (issue 27: a 6 MB tool result's preview held its
head only, while errors and totals are usually at the end).

A preview spends about two thirds of its budget on the head and one third on the tail.
Each cut moves to a line boundary when one is near (within a fifth of its part), and
never splits a character: a budget in bytes cuts between UTF-8 sequences, and a
surrogate pair (text decoded with ``surrogatepass``) is kept whole or left out whole.
The marker sits on its own line between head and tail::

    [... 5,912,345 characters (104,220 lines, 5,990,001 bytes) cut here: characters 2,654 to 5,914,999 of 5,916,330; read them with read_stored_content(...) ...]

Pure (the standard library only): workflow code may use it.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["HEAD_SHARE", "Preview", "head_and_tail"]

HEAD_SHARE = 2 / 3
"""Share of a preview's budget spent on the head; the rest goes to the tail."""
_LINE_SNAP = 0.2
"""A cut moves to a line boundary found within this share of its part."""


@dataclass(frozen=True)
class Preview:
    """A preview of a text and what it left out."""

    text: str
    """The preview: the whole text if it fit, else head, marker line, tail."""
    cut_start: int
    """Index (in characters) of the first character left out; ``len`` of the text when none."""
    cut_end: int
    """Index just past the last character left out (``cut_start`` when none)."""
    cut_chars: int = 0
    cut_lines: int = 0
    """Line breaks in the part left out (its whole lines, when both cuts are on line boundaries)."""
    cut_bytes: int = 0
    """UTF-8 bytes (``surrogatepass``) of the part left out."""

    @property
    def cut(self) -> bool:
        """Whether anything was left out."""
        return self.cut_chars > 0


def _utf8(text: str) -> bytes:
    return text.encode("utf-8", "surrogatepass")


def _head_within(part: str, max_bytes: int) -> str:
    """The longest prefix of ``part`` of at most ``max_bytes`` UTF-8 bytes (whole characters)."""
    raw = _utf8(part)
    if len(raw) <= max_bytes:
        return part
    end = max(max_bytes, 0)
    while end > 0 and raw[end] & 0xC0 == 0x80:  # a continuation byte: inside a character
        end -= 1
    return raw[:end].decode("utf-8", "surrogatepass")


def _tail_within(part: str, max_bytes: int) -> str:
    """The longest suffix of ``part`` of at most ``max_bytes`` UTF-8 bytes (whole characters)."""
    raw = _utf8(part)
    if len(raw) <= max_bytes:
        return part
    start = len(raw) - max(max_bytes, 0)
    while start < len(raw) and raw[start] & 0xC0 == 0x80:
        start += 1
    return raw[start:].decode("utf-8", "surrogatepass")


def _escape_end(text: str, at: int) -> int:
    """``at``, or past the end of the JSON string escape (``\\n``, ``\\u00e9``) that
    spans it, so a cut at the result never splits one."""
    for start in range(at - 1, max(at - 6, -1), -1):
        if text[start] != "\\":
            continue
        run = len(text[: start + 1]) - len(text[: start + 1].rstrip("\\"))
        if run % 2 == 0:
            continue  # an escaped backslash, not the start of an escape
        end = start + (6 if text[start + 1 : start + 2] == "u" else 2)
        return max(end, at)
    return at


def _marker(cut_chars: int, cut_lines: int, cut_bytes: int, start: int, end: int, total: int, how_to_read: str) -> str:
    read = how_to_read.format(start=start, end=end) if how_to_read else ""
    lines = f"{cut_lines:,} lines, " if cut_lines else ""
    return (
        f"\n[... {cut_chars:,} characters ({lines}{cut_bytes:,} bytes) cut here: characters "
        f"{start:,} to {end:,} of {total:,}" + (f"; {read}" if read else "") + " ...]\n"
    )


def head_and_tail(
    text: str,
    max_chars: int,
    *,
    max_bytes: int | None = None,
    how_to_read: str = "",
    offset_base: int = 0,
    whole_chars: int | None = None,
    json_text: bool = False,
    head_share: float = HEAD_SHARE,
) -> Preview:
    """``text`` itself if it fits, else its head and tail around a marker line that says
    how much was cut (characters, lines, bytes), where (character offsets) and how to
    read it.

    Args:
        text: the whole text.
        max_chars: the preview's most characters, marker included.
        max_bytes: also its most UTF-8 bytes, marker included (None: no byte bound).
        how_to_read: how to read the cut part, put in the marker; ``{start}`` and
            ``{end}`` in it become the cut's character offsets (e.g. ``'read_stored_content(
            ref="b:...", offset={start})'``). Empty: the marker only says what was cut.
        offset_base: added to the offsets the marker shows (where ``text`` starts in
            what ``how_to_read`` reads); the :class:`Preview`'s own offsets are in ``text``.
        whole_chars: the characters of what ``how_to_read`` reads (default:
            ``offset_base + len(text)``).
        json_text: ``text`` is JSON (a tool result's data): a line break is the escape
            ``\\n`` and no cut splits an escape.
        head_share: share of the budget for the head (0 to 1).

    Returns:
        The :class:`Preview`. When even the marker does not fit, its ``text`` is the
        marker alone (over the budget: the caller decides what to do with it).
    """
    total = len(text)
    if total <= max_chars and (max_bytes is None or len(_utf8(text)) <= max_bytes):
        return Preview(text=text, cut_start=total, cut_end=total)
    # The marker's longest form (every number at most ``total`` or its bytes) bounds its size.
    far = whole_chars if whole_chars is not None else offset_base + total
    widest = _marker(total, total, 4 * total, far, far, far, how_to_read)
    chars = max(max_chars - len(widest), 0)
    head = text[: int(chars * head_share)]
    tail = text[total - (chars - len(head)) :] if chars > len(head) else ""
    if max_bytes is not None:
        budget = max(max_bytes - len(_utf8(widest)), 0)
        head = _head_within(head, int(budget * head_share))
        tail = _tail_within(tail, budget - len(_utf8(head)))
    # On a line boundary when one is near: the model reads whole lines.
    brk = "\\n" if json_text else "\n"
    newline = head.rfind(brk, int(len(head) * (1 - _LINE_SNAP)))
    if newline >= 0 and (not json_text or _escape_end(text, newline) == newline):
        head = head[: newline + len(brk)]
    newline = tail.find(brk, 0, int(len(tail) * _LINE_SNAP) + len(brk))
    if newline >= 0 and (not json_text or _escape_end(text, total - len(tail) + newline) == total - len(tail) + newline):
        tail = tail[newline + len(brk) :]
    if json_text:
        # Never half an escape: the head stops before one it would split, the tail
        # starts after it.
        cut_at = len(head)
        while cut_at > 0 and _escape_end(text, cut_at) != cut_at:
            cut_at -= 1
        head = head[:cut_at]
        tail_at = _escape_end(text, total - len(tail))
        tail = text[tail_at:] if tail_at < total else ""
    # Never half a surrogate pair.
    if head and "\ud800" <= head[-1] <= "\udbff":
        head = head[:-1]
    if tail and "\udc00" <= tail[0] <= "\udfff":
        tail = tail[1:]
    start, end = len(head), total - len(tail)
    cut = text[start:end]
    cut_lines, cut_bytes = cut.count(brk), len(_utf8(cut))
    marker = _marker(len(cut), cut_lines, cut_bytes, offset_base + start, offset_base + end, far, how_to_read)
    if head.endswith("\n") and not json_text:
        marker = marker[1:]  # the head's own line break starts the marker's line
    return Preview(
        text=head + marker + tail, cut_start=start, cut_end=end, cut_chars=len(cut), cut_lines=cut_lines, cut_bytes=cut_bytes
    )
