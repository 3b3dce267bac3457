"""Texts the CLI prints that need no server: tool descriptions in ``hermes tools``, help."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from hermes.cli.tools import description_summary
from hermes.tools.builtin import current_time

ROOT = Path(__file__).resolve().parents[1]


def test_a_description_is_shown_in_whole_sentences():
    doc = current_time.__doc__ or ""
    assert description_summary(doc) == (
        'Current date and time in a time zone. Use it for "what time is it", dates and weekdays; '
        "do not use it for arithmetic on dates."
    )
    long = "First sentence is short. " + "Second one goes on " * 10 + "and ends."
    assert description_summary(long, limit=60) == "First sentence is short."


def test_a_description_without_a_sentence_end_that_fits_is_cut_at_a_word_end_with_an_ellipsis():
    summary = description_summary("word " * 60, limit=50)
    assert summary.endswith("word…") and len(summary) <= 50


def test_hermes_tools_prints_each_description_to_a_sentence_end(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "300"}
    env.pop("HERMES_TOOL_FILES", None)
    env.pop("HERMES_TOOL_MODULES", None)
    run = subprocess.run(
        [sys.executable, "-m", "hermes.cli", "tools"], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120
    )
    assert run.returncode == 0, run.stderr
    assert "do not use it for arithmetic on dates." in run.stdout
    assert "Use it for any arithmetic instead of computing in your head." in run.stdout


def test_the_user_option_says_what_the_user_id_is():
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"}
    run = subprocess.run(
        [sys.executable, "-m", "hermes.cli", "chat", "--help"], capture_output=True, text=True, env=env, timeout=120
    )
    assert run.returncode == 0, run.stderr
    text = " ".join(run.stdout.replace("│", " ").split())
    assert "owns the session" in text and "long-term memories" in text, text


def test_a_library_warning_with_a_traceback_is_one_line_on_the_terminal_and_whole_in_the_log_file(tmp_path, capsys):
    # Under load the SDK logs a retried activity's cancellation with its traceback; in
    # `hermes demo` that read as a crash (tests/test_cli.py checks "Traceback" is absent).
    import logging

    from hermes.cli.running import console_logging

    root = logging.getLogger()
    saved = (root.handlers[:], root.level)
    root.handlers.clear()
    log_file = tmp_path / "logs" / "hermes.log"
    try:
        console_logging(log_file)
        try:
            raise TimeoutError("activity heartbeat timed out\nsecond line")
        except TimeoutError:
            logging.getLogger("temporalio.activity").warning("Completing activity as failed", exc_info=True)
        logging.getLogger("temporalio.worker").info("worker serving")
        for handler in root.handlers:
            handler.flush()
        err = capsys.readouterr().err
        assert err.strip() == "warning: Completing activity as failed (TimeoutError: activity heartbeat timed out)"
        written = log_file.read_text(encoding="utf-8")
        assert "Traceback" in written and "second line" in written and "worker serving" in written

        console_logging(tmp_path / "other.log")  # a configured root is left alone
        assert len(root.handlers) == 2 and not (tmp_path / "other.log").exists()
    finally:
        for handler in root.handlers:
            handler.close()
        root.handlers[:] = saved[0]
        root.setLevel(saved[1])


def test_a_cancelled_activity_attempt_is_not_shown_on_the_terminal_but_other_warnings_are() -> None:
    import asyncio
    import logging
    import sys

    from temporalio.exceptions import CancelledError

    from hermes.cli.running import not_a_cancelled_attempt

    def record(name: str, message: str, err: BaseException | None) -> logging.LogRecord:
        exc_info = None
        if err is not None:
            try:
                raise err
            except BaseException:  # noqa: BLE001
                exc_info = sys.exc_info()
        return logging.LogRecord(name, logging.WARNING, __file__, 1, message, None, exc_info)

    failed = "Completing activity as failed ({'activity_type': 'call_model', 'attempt': 1})"
    assert not not_a_cancelled_attempt(record("temporalio.activity", failed, CancelledError("Activity cancelled")))
    assert not not_a_cancelled_attempt(record("temporalio.activity", failed, asyncio.CancelledError()))
    assert not_a_cancelled_attempt(record("temporalio.activity", failed, ValueError("provider said no")))
    assert not_a_cancelled_attempt(record("hermes.memory", "memory store still opening", None))


def test_every_commands_one_line_help_is_its_docstrings_first_paragraph_on_one_line() -> None:
    import typer

    from hermes.cli import app

    def walk(command: Any, path: str) -> list[tuple[str, str | None]]:
        found = [(path, command.short_help)]
        for name, sub in getattr(command, "commands", {}).items():  # a group (Typer's own click)
            found += walk(sub, f"{path} {name}")
        return found

    helps = walk(typer.main.get_command(app), "hermes")[1:]
    assert len(helps) > 20
    groups = {"hermes mcp", "hermes memory", "hermes keys", "hermes deploy"}
    ragged = [(path, text) for path, text in helps if path not in groups and (not text or "\n" in text or "  " in text)]
    assert ragged == []
