"""Texts the CLI prints that need no server: tool descriptions in ``hermes tools``, help."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

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
