"""Built-in tools: enough to exercise every path of the tool layer.

| tool          | permission | idempotent | what it exercises                         |
|---------------|------------|------------|-------------------------------------------|
| current_time  | read       | yes        | argument validation, business errors      |
| calculate     | read       | yes        | pure computation                          |
| save_note     | write      | no         | approval, exactly-once side effect        |
| list_notes    | read       | yes        | reading what a side effect wrote          |
| read_stored_content | read | yes        | large inputs kept by reference            |

Notes are kept in the durable store (:mod:`hermes.infra.durable`, table ``hermes_notes``), not in
Redis: "note saved" is said only after that write, and the notes outlive a ``FLUSHALL``.
"""

from __future__ import annotations

import ast
import json
import math
import operator
import re
from datetime import datetime, timezone as dt_timezone
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from hermes.content.blobs import BlobStore
from hermes.infra.durable import NOTES, DurableStoreError, Record
from hermes.models import ToolResult, ToolResultCode
from hermes.tools.registry import ToolContext, ToolRegistry


def current_time(timezone: str = "UTC") -> ToolResult:
    """Current date and time in a time zone. Use it for "what time is it", dates and
    weekdays; do not use it for arithmetic on dates.

    Args:
        timezone: IANA time zone name such as "Asia/Shanghai", "Europe/Paris" or "UTC".
    """
    try:
        zone = ZoneInfo(timezone.strip())
    except (ZoneInfoNotFoundError, ValueError):
        return ToolResult(
            code=ToolResultCode.BAD_ARGUMENTS,
            message=f"timezone: expected an IANA time zone name such as 'Asia/Shanghai', received {timezone!r}",
        )
    now = datetime.now(dt_timezone.utc).astimezone(zone)
    return ToolResult(
        data={
            "timezone": timezone,
            "iso": now.isoformat(timespec="seconds"),
            "time": now.strftime("%H:%M"),
            "date": now.strftime("%Y-%m-%d"),
            "weekday": now.strftime("%A"),
        }
    )


_BIN_OPS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY_OPS = {ast.UAdd: operator.pos, ast.USub: operator.neg}

_MAX_EXPRESSION_CHARS = 1000
"""Longest expression taken: a sum of hundreds of numbers fits, and parsing stays cheap."""
_MAX_INTEGER_DIGITS = 1000
"""Largest exact integer, in decimal digits, of a result or any intermediate value."""
_INTEGER_LIMIT = 10**_MAX_INTEGER_DIGITS


def _checked(value: float | int) -> float | int:
    if isinstance(value, int) and abs(value) >= _INTEGER_LIMIT:
        raise OverflowError(f"more than {_MAX_INTEGER_DIGITS} digits")
    if isinstance(value, float) and not math.isfinite(value):
        raise OverflowError("beyond the float range")  # 1e308 * 10 is inf, not an error
    return value


def _evaluate(tree: ast.AST) -> float | int:
    """Evaluate an arithmetic syntax tree with an explicit stack, so that a deeply nested
    expression (``- - - ... 1``) cannot exhaust the interpreter's recursion limit.

    Raises:
        ValueError: an element that is not a number or an arithmetic operator, or a
            power too large to compute.
        OverflowError: an integer beyond ``_MAX_INTEGER_DIGITS`` or a float out of range
            (also one that Python's arithmetic would turn into ``inf`` or ``nan``).
        ZeroDivisionError, TypeError: as Python's arithmetic.
    """
    values: list[float | int] = []
    pending: list[tuple[ast.AST, bool]] = [(tree, False)]
    while pending:
        node, operands_done = pending.pop()
        if isinstance(node, ast.Expression):
            pending.append((node.body, False))
        elif isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
            values.append(_checked(node.value))
        elif isinstance(node, ast.BinOp) and type(node.op) in _BIN_OPS:
            if not operands_done:
                # Popped in reverse: the left operand is evaluated first.
                pending.extend([(node, True), (node.right, False), (node.left, False)])
                continue
            right = values.pop()
            left = values.pop()
            if isinstance(node.op, ast.Pow) and (abs(right) > 1000 or abs(left) > 1e6):
                raise ValueError("exponent too large")
            values.append(_checked(_BIN_OPS[type(node.op)](left, right)))
        elif isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY_OPS:
            if not operands_done:
                pending.extend([(node, True), (node.operand, False)])
                continue
            values.append(_UNARY_OPS[type(node.op)](values.pop()))
        else:
            raise ValueError(f"unsupported element {type(node).__name__}")
    return values.pop()


def calculate(expression: str) -> ToolResult:
    """Evaluate an arithmetic expression exactly: + - * / // % ** and parentheses.
    Use it for any arithmetic instead of computing in your head.

    Args:
        expression: the expression, e.g. "(17 + 25) * 3" or "2 ** 10"; at most 1000 characters.
    """
    if len(expression) > _MAX_EXPRESSION_CHARS:
        return ToolResult(
            code=ToolResultCode.BAD_ARGUMENTS,
            message=f"expression: expected at most {_MAX_EXPRESSION_CHARS} characters, received "
            f"{len(expression)} characters; split the calculation into smaller steps",
        )
    try:
        value = _evaluate(ast.parse(expression.replace("×", "*").replace("÷", "/"), mode="eval"))
    except ZeroDivisionError:
        return ToolResult(code=ToolResultCode.BAD_ARGUMENTS, message="expression: division by zero")
    except OverflowError:
        return _too_large(expression)
    except (RecursionError, MemoryError):
        # ast.parse builds the tree recursively; how deep it can go depends on the stack
        # left to the calling thread.
        return ToolResult(
            code=ToolResultCode.BAD_ARGUMENTS,
            message=f"expression: nested too deeply to evaluate, received {expression!r}; "
            "split the calculation into smaller steps",
        )
    except (SyntaxError, ValueError, TypeError) as err:
        return ToolResult(
            code=ToolResultCode.BAD_ARGUMENTS,
            message=f"expression: expected arithmetic with numbers and + - * / // % ** ( ), received {expression!r} ({err})",
        )
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
        value = int(value)
    return ToolResult(data={"expression": expression, "value": value})


def _too_large(expression: str) -> ToolResult:
    return ToolResult(
        code=ToolResultCode.BAD_ARGUMENTS,
        message=f"expression: the result or a value on the way is too large (integers up to "
        f"{_MAX_INTEGER_DIGITS} digits, decimals up to about 1.8e308), received {expression!r}",
    )


async def save_note(title: str, text: str, context: ToolContext) -> ToolResult:
    """Save a note for the user. Changes stored data, so the user confirms it first.
    Use it when the user asks to note, save or remember something for later.

    Args:
        title: short title of the note, e.g. "Shopping list".
        text: the note's content.
    """
    if context.durable is None:
        return ToolResult(code=ToolResultCode.DEPENDENCY_UNAVAILABLE, message="the note store is not configured; the note was not saved")
    saved_at = datetime.now(dt_timezone.utc)
    note = {
        "note_id": context.idempotency_key,
        "title": title,
        "text": text,
        "session_id": context.session_id,
        "saved_at": saved_at.isoformat(timespec="seconds"),
    }
    try:
        record = Record(key=note["note_id"], owner=context.user_id, at=saved_at, value=json.dumps(note, ensure_ascii=False))
        await context.durable.insert(NOTES, [record])
    except DurableStoreError as err:
        return ToolResult(code=ToolResultCode.DEPENDENCY_UNAVAILABLE, message=f"the note was not saved: {err}")
    return ToolResult(message="note saved", data={"note_id": note["note_id"], "title": title})


async def list_notes(context: ToolContext, limit: int = 20) -> ToolResult:
    """List the user's saved notes, newest last.

    Args:
        limit: how many of the most recent notes to return, 1 to 100.
    """
    if not 1 <= limit <= 100:
        return ToolResult(code=ToolResultCode.BAD_ARGUMENTS, message=f"limit: expected 1 to 100, received {limit}")
    if context.durable is None:
        return ToolResult(code=ToolResultCode.DEPENDENCY_UNAVAILABLE, message="the note store is not configured")
    try:
        records = await context.durable.list(NOTES, owner=context.user_id, limit=limit)
    except DurableStoreError as err:
        return ToolResult(code=ToolResultCode.DEPENDENCY_UNAVAILABLE, message=f"the notes could not be read: {err}")
    notes = [json.loads(r.value) for r in records]
    return ToolResult(data={"count": len(notes), "notes": notes})


STORED_REF_RE = re.compile(r"^b:[0-9a-f]{32}\Z")
"""A reference to content kept by reference (:func:`hermes.content.blobs.value_ref`)."""
READ_MAX_CHARS = 12_000
"""Most characters one ``read_stored_content`` call returns: with its JSON escaping the
result stays under what the session hands the model whole (16,000 characters) and under
``tool_result_max_bytes`` (64 KB), so a slice is never itself cut to a preview."""


def _json_chars(char: str) -> int:
    """Characters ``char`` takes inside a JSON string (non-ASCII is not escaped)."""
    if char in '"\\':
        return 2
    if char < " ":
        return 2 if char in "\b\f\n\r\t" else 6
    return 1


async def read_stored_content(ref: str, context: ToolContext, offset: int = 0, length: int = 8000) -> ToolResult:
    """Read a slice of a large input kept by reference: a user message, tool result or
    reply too large for the conversation appears as a preview that says "kept by
    reference as b:..." and names its size. Use it when you need more than the preview
    shows (e.g. the user asks about the middle of a pasted document); read only what the
    task needs, a slice at a time, continuing from `next_offset`. Do not use it for
    anything without such a reference.

    Args:
        ref: the reference exactly as the preview names it: "b:" followed by 32 hex digits.
        offset: the first character to read, counted in characters from 0; to continue, the
            `next_offset` of the previous read.
        length: how many characters to read, 1 to 12000 (a slice of quote-heavy JSON may
            come back shorter: continue from `next_offset`).

    Returns:
        {ref, offset, text, returned_chars, total_chars, total_bytes, more, next_offset}:
        the characters offset .. offset + returned_chars of the content; `more` is true
        while characters follow (then read on from `next_offset`).
    """
    if not isinstance(ref, str) or not STORED_REF_RE.match(ref.strip()):
        return ToolResult(
            code=ToolResultCode.BAD_ARGUMENTS,
            message=f'ref: expected "b:" followed by 32 lowercase hex digits, as a preview names it, received {ref!r}',
        )
    ref = ref.strip()
    if offset < 0:
        return ToolResult(code=ToolResultCode.BAD_ARGUMENTS, message=f"offset: expected 0 or more, received {offset}")
    if not 1 <= length <= READ_MAX_CHARS:
        return ToolResult(
            code=ToolResultCode.BAD_ARGUMENTS,
            message=f"length: expected 1 to {READ_MAX_CHARS} characters, received {length}; read larger content in slices",
        )
    store = BlobStore(context.redis, durable=context.durable)
    if not store.can_keep:
        return ToolResult(code=ToolResultCode.DEPENDENCY_UNAVAILABLE, message="the content store is not configured")
    try:
        text = (await store.read_many([ref])).get(ref)
    except Exception as err:  # noqa: BLE001 - Redis and the durable store both failed
        return ToolResult(
            code=ToolResultCode.DEPENDENCY_UNAVAILABLE, message=f"the content store cannot be read: {type(err).__name__}: {err}"
        )
    if text is None:
        return ToolResult(
            code=ToolResultCode.BAD_ARGUMENTS,
            message=f"ref: no content is stored under {ref}; use a reference exactly as a preview names it",
        )
    total = len(text)
    if offset > total:
        return ToolResult(
            code=ToolResultCode.BAD_ARGUMENTS,
            message=f"offset: {offset} is past the end of {ref} ({total} characters); read from 0 to {total}",
        )
    piece = text[offset : offset + length]
    budget, used = READ_MAX_CHARS, 0
    for index, char in enumerate(piece):
        used += _json_chars(char)
        if used > budget:
            piece = piece[:index]
            break
    end = offset + len(piece)
    return ToolResult(
        message=f"characters {offset} to {end} of {total}" + (f"; more follows from offset {end}" if end < total else "; the end"),
        data={
            "ref": ref,
            "offset": offset,
            "text": piece,
            "returned_chars": len(piece),
            "total_chars": total,
            "total_bytes": len(text.encode("utf-8", "surrogatepass")),
            "more": end < total,
            "next_offset": end if end < total else None,
        },
    )


def register_builtins(registry: ToolRegistry) -> ToolRegistry:
    """Add the built-in tools to ``registry`` and return it."""
    registry.register(current_time, tier="query", idempotent=True, permission="read")
    registry.register(calculate, tier="query", idempotent=True, permission="read")
    registry.register(save_note, tier="external", idempotent=False, permission="write")
    registry.register(list_notes, tier="query", idempotent=True, permission="read")
    registry.register(read_stored_content, tier="query", idempotent=True, permission="read")
    return registry
