"""Built-in tools: enough to exercise every path of the tool layer.

| tool          | permission | idempotent | what it exercises                         |
|---------------|------------|------------|-------------------------------------------|
| current_time  | read       | yes        | argument validation, business errors      |
| calculate     | read       | yes        | pure computation                          |
| save_note     | write      | no         | approval, exactly-once side effect        |
| list_notes    | read       | yes        | reading what a side effect wrote          |
"""

from __future__ import annotations

import ast
import json
import operator
from datetime import datetime, timezone as dt_timezone
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from hermes.models import ToolResult, ToolResultCode
from hermes.tools.registry import ToolContext, ToolRegistry

_NOTES_KEY = "hermes:notes:{user_id}"


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


def _evaluate(node: ast.AST) -> float | int:
    if isinstance(node, ast.Expression):
        return _evaluate(node.body)
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _BIN_OPS:
        left, right = _evaluate(node.left), _evaluate(node.right)
        if isinstance(node.op, ast.Pow) and (abs(right) > 1000 or abs(left) > 1e6):
            raise ValueError("exponent too large")
        return _BIN_OPS[type(node.op)](left, right)
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY_OPS:
        return _UNARY_OPS[type(node.op)](_evaluate(node.operand))
    raise ValueError(f"unsupported element {type(node).__name__}")


def calculate(expression: str) -> ToolResult:
    """Evaluate an arithmetic expression exactly: + - * / // % ** and parentheses.
    Use it for any arithmetic instead of computing in your head.

    Args:
        expression: the expression, e.g. "(17 + 25) * 3" or "2 ** 10".
    """
    try:
        value = _evaluate(ast.parse(expression.replace("×", "*").replace("÷", "/"), mode="eval"))
    except ZeroDivisionError:
        return ToolResult(code=ToolResultCode.BAD_ARGUMENTS, message="expression: division by zero")
    except (SyntaxError, ValueError, TypeError) as err:
        return ToolResult(
            code=ToolResultCode.BAD_ARGUMENTS,
            message=f"expression: expected arithmetic with numbers and + - * / // % ** ( ), received {expression!r} ({err})",
        )
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
        value = int(value)
    return ToolResult(data={"expression": expression, "value": value})


async def save_note(title: str, text: str, context: ToolContext) -> ToolResult:
    """Save a note for the user. Changes stored data, so the user confirms it first.
    Use it when the user asks to note, save or remember something for later.

    Args:
        title: short title of the note, e.g. "Shopping list".
        text: the note's content.
    """
    if context.redis is None:
        return ToolResult(code=ToolResultCode.DEPENDENCY_UNAVAILABLE, message="the note store (Redis) is not configured")
    note = {
        "note_id": context.idempotency_key,
        "title": title,
        "text": text,
        "session_id": context.session_id,
        "saved_at": datetime.now(dt_timezone.utc).isoformat(timespec="seconds"),
    }
    await context.redis.rpush(_NOTES_KEY.format(user_id=context.user_id), json.dumps(note, ensure_ascii=False))
    return ToolResult(message="note saved", data={"note_id": note["note_id"], "title": title})


async def list_notes(context: ToolContext, limit: int = 20) -> ToolResult:
    """List the user's saved notes, newest last.

    Args:
        limit: how many of the most recent notes to return, 1 to 100.
    """
    if context.redis is None:
        return ToolResult(code=ToolResultCode.DEPENDENCY_UNAVAILABLE, message="the note store (Redis) is not configured")
    if not 1 <= limit <= 100:
        return ToolResult(code=ToolResultCode.BAD_ARGUMENTS, message=f"limit: expected 1 to 100, received {limit}")
    raw = await context.redis.lrange(_NOTES_KEY.format(user_id=context.user_id), -limit, -1)
    notes = [json.loads(item) for item in raw]
    return ToolResult(data={"count": len(notes), "notes": notes})


def register_builtins(registry: ToolRegistry) -> ToolRegistry:
    """Add the built-in tools to ``registry`` and return it."""
    registry.register(current_time, tier="query", idempotent=True, permission="read")
    registry.register(calculate, tier="query", idempotent=True, permission="read")
    registry.register(save_note, tier="external", idempotent=False, permission="write")
    registry.register(list_notes, tier="query", idempotent=True, permission="read")
    return registry
