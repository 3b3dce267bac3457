"""bench/overload.py's and bench/recovery.py --deploy's code paths, small (issue 31's checks):
one worker process, the model a local OpenAI-wire endpoint counting requests per model
step, 3 sessions x 5 turns per phase (memory write, built-in tool, MCP call, a write call
approved by the session's user, recall), one CPU hog per core in the starved phase; and one
SIGTERM to a worker during a model call."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from bench.overload import model_reply

ROOT = Path(__file__).resolve().parent.parent


def _figures(stdout: str) -> dict[str, str]:
    lines = stdout.strip().splitlines()
    return dict(line.split("=", 1) for line in lines if "=" in line and " " not in line.split("=", 1)[0])


def test_the_bench_model_answers_a_tool_turn_from_the_tool_result_and_says_when_it_has_none():
    """The reply is made from the tool result's data; a failed tool result reads "not available"
    (what the bench counts as a lost tool result), and the same step names the same tool call."""
    ask = [{"role": "user", "content": "What is (1 + 2) * 3"}]
    first = model_reply("What is (1 + 2) * 3", [], ask, "s1")
    again = model_reply("What is (1 + 2) * 3", [], ask, "s1")
    assert first["tool_calls"][0]["function"]["name"] == "calculate"
    assert first["tool_calls"][0]["id"] == again["tool_calls"][0]["id"]
    ok = [first, {"role": "tool", "content": '{"code": 0, "message": "ok", "data": {"value": 9}}'}]
    failed = [first, {"role": "tool", "content": '{"code": 4, "message": "outcome unknown", "data": null}'}]
    assert model_reply("What is (1 + 2) * 3", ok, ask, "s1")["content"] == "= 9"
    assert model_reply("What is (1 + 2) * 3", failed, ask, "s1")["content"] == "= not available"


@pytest.mark.timeout(300)
def test_overload_bench_runs_its_three_phases_and_prints_every_figure_with_the_cpu_ratio_last(tmp_path):
    run = subprocess.run(
        [sys.executable, "bench/overload.py", "--sessions", "3", "--turns", "5", "--reference-rounds", "1",
         "--hogs-per-core", "1", "--turn-timeout", "120", "--log-dir", str(tmp_path)],
        check=False, cwd=ROOT, capture_output=True, text=True, timeout=290,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    figures = _figures(run.stdout)
    assert figures["lost_turns"] == "0", run.stdout[-3000:]
    for name in ("wrong_replies", "lost_tool_results", "cpu_ms_per_turn_ref", "cpu_ms_per_turn_starved"):
        assert name in figures, run.stdout[-3000:]
    steps = re.search(r"^provider_calls_per_step max=(\d+) mean=([\d.]+)$", run.stdout, re.MULTILINE)
    assert steps is not None and int(steps.group(1)) >= 1 and float(steps.group(2)) >= 1, run.stdout[-3000:]
    assert float(figures["concurrency_cpu_ratio"]) > 0
    last = run.stdout.strip().splitlines()[-1]
    assert last.startswith("overload_cpu_ratio=") and float(last.split("=")[1]) > 0, run.stdout[-3000:]
    assert (tmp_path / "temporal-server.log").exists()


@pytest.mark.timeout(300)
def test_recovery_deploy_bench_sigterms_a_worker_during_a_model_call_and_counts_its_provider_calls(tmp_path):
    run = subprocess.run(
        [sys.executable, "bench/recovery.py", "--quick", "--deploy", "-r", "1", "--turns", "2",
         "--hogs-per-core", "1", "--log-dir", str(tmp_path)],
        check=False, cwd=ROOT, capture_output=True, text=True, timeout=290,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "provider calls" in run.stdout and "after the SIGTERM" in run.stdout, run.stdout[-3000:]
    last = run.stdout.strip().splitlines()[-1]
    assert last.startswith("deploy_provider_calls=") and int(last.split("=")[1]) >= 1, run.stdout[-3000:]
