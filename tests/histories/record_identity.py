"""Record the history that stands for sessions running before the ``session-identity``
patch (``tests/test_identity.py`` replays it): a message from a user other than the
session's was taken, and a ``write`` call was confirmed by someone who is neither the
session's user nor a listed approver. Both are refused after the patch; a run recorded
before it must still replay as it ran.

Regenerate (on purpose only; it was recorded with the code before the patch)::

    python -m tests.histories.record_identity
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

from temporalio.client import WorkflowHistory

from hermes.client import HermesClient
from hermes.models import TurnResult
from tests.histories.record import main

FOREIGN_HISTORY_PATH = Path(__file__).with_name("session_foreign_user_and_approver.json")

SCRIPT: dict[str, Any] = {
    "turns": [
        {"match": "(?i)note", "steps": [
            {"tool_calls": [{"name": "save_note", "arguments": {"title": "Shopping", "text": "milk"}}]},
            {"reply": "{{ last_tool_result.message }}"},
        ]},
        {"match": "(?i)from me", "steps": [{"reply": "Hello, whoever you are!"}]},
        {"steps": [{"reply": "Hello!"}]},
    ]
}
"""The stand-in model's lines for :func:`play_foreign`."""

OTHER_USER = "mallory"
"""Who sends a message to the session of ``user_id`` and confirms its write call."""


async def play_foreign(hermes: HermesClient, session_id: str, user_id: str) -> tuple[WorkflowHistory, list[TurnResult]]:
    """``user_id`` says hi, :data:`OTHER_USER` says hi to the same session, ``user_id``
    asks for a note (``save_note``, permission ``write``), :data:`OTHER_USER` confirms
    it, then close. Returns the closed session's history and the three replies."""
    results = [await hermes.send_message(session_id, "hi", user_id=user_id)]
    results.append(await hermes.send_message(session_id, "hi from me too", user_id=OTHER_USER))
    turn = asyncio.create_task(hermes.send_message(session_id, "note my shopping", user_id=user_id))
    pending = await hermes.wait_for_approval(session_id, timeout_seconds=30)
    await hermes.approve(session_id, pending.tool_call_id, approver=OTHER_USER)
    results.append(await asyncio.wait_for(turn, 30))
    await hermes.close(session_id)
    await asyncio.wait_for(hermes.handle(session_id).result(), 30)
    return await hermes.handle(session_id).fetch_history(), results


if __name__ == "__main__":
    asyncio.run(main(Path(sys.argv[1]) if len(sys.argv) > 1 else FOREIGN_HISTORY_PATH, play=play_foreign, script=SCRIPT))
