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
@pytest.mark.xfail(reason="memory recall on S3 times out under concurrent writes (bench/README.md, scale.py): "
                          "remove when fixed", strict=False)
def test_two_workers_one_killed_answer_every_turn_from_the_shared_store_on_s3_and_the_cluster(tmp_path):
    run = subprocess.run(
        [sys.executable, "bench/scale.py", "--workers", "2", "--sessions", "4", "--turns", "5",
         "--turn-timeout", "90", "--write-timeout", "60", "--log-dir", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=230,
    )
    lines = run.stdout.strip().splitlines()
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    figures = dict(line.split("=", 1) for line in lines if "=" in line and " " not in line.split("=", 1)[0])
    assert "SIGKILLed worker" in run.stdout
    assert figures["wrong_answers"] == "0" and figures["lost_turns"] == "0", run.stdout[-3000:]
    assert float(figures["redis_bytes_per_session"]) > 0
    assert float(figures["lance_commits_per_write"].split()[0]) > 0
    assert lines[-1] == "scale_correct_ratio=1.000", run.stdout[-3000:]
