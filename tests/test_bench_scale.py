"""bench/scale.py's code path, small: two worker processes with their own homes, the Redis
Cluster and the memory store on the local S3 server, 4 sessions x 5 turns (memory write,
MCP call, recall, built-in tool, recall) and one worker SIGKILLed mid-run."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.timeout(240)
def test_two_workers_one_killed_lose_no_turn_on_s3_and_the_cluster_and_print_every_figure(tmp_path):
    """Every turn answered after the kill, no CROSSSLOT or store error ending the run, and
    every figure printed. Every answer right (``scale_correct_ratio=1.000``) is issue 28's
    open target: on a loaded 2-core machine a recall cut off with its workflow task after
    the kill still answers from no memories (bench/README.md, "scale")."""
    run = subprocess.run(
        [sys.executable, "bench/scale.py", "--workers", "2", "--sessions", "4", "--turns", "5",
         "--turn-timeout", "90", "--write-timeout", "60", "--log-dir", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=230,
    )
    lines = run.stdout.strip().splitlines()
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    figures = dict(line.split("=", 1) for line in lines if "=" in line and " " not in line.split("=", 1)[0])
    assert "SIGKILLed worker" in run.stdout
    assert figures["lost_turns"] == "0", run.stdout[-3000:]
    assert int(figures["wrong_answers"]) <= 20 and float(figures["redis_bytes_per_session"]) > 0
    assert float(figures["lance_commits_per_write"].split()[0]) > 0
    assert lines[-1].startswith("scale_correct_ratio=") and float(lines[-1].split("=")[1]) > 0, run.stdout[-3000:]
