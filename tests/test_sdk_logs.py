"""The Temporal SDK core's own log lines are plain lines of Python's logging (issue 32:
raw ANSI-coloured ``TMPRL1104`` / "untracked local activity" warnings in a log file).

A real worker against the suite's Temporal server, in a child process whose output is a
pipe, not a terminal; the core's ``Initializing worker`` line (INFO, so that one comes for
certain: the warnings the issue saw need a loaded machine) must come through the
process's logging format with no escape code anywhere.
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

CHILD = """
import asyncio, logging, sys
from temporalio import activity
from temporalio.client import Client
from temporalio.worker import Worker
from hermes.infra.sdk_logs import install_default_runtime

logging.basicConfig(level=logging.INFO, format="PLAIN %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
install_default_runtime(core_level="INFO")

@activity.defn
async def noop() -> None:
    pass

async def main() -> None:
    client = await Client.connect(sys.argv[1])
    async with Worker(client, task_queue=sys.argv[2], activities=[noop]):
        await asyncio.sleep(0.3)  # the worker polls a moment; its core logs as it starts
    await asyncio.sleep(0.3)  # forwarded lines are buffered a few milliseconds

asyncio.run(main())
"""


@pytest.mark.timeout(120)
async def test_the_sdk_cores_log_lines_are_plain_lines_of_the_processs_logging(temporal_env, task_queue):
    address = temporal_env.client.service_client.config.target_host
    child = await asyncio.create_subprocess_exec(
        sys.executable, "-c", CHILD, address, task_queue,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(ROOT), "NO_COLOR": "", "FORCE_COLOR": ""},
    )
    stdout, stderr = await asyncio.wait_for(child.communicate(), 90)
    output = stdout.decode() + stderr.decode()
    assert child.returncode == 0, output
    assert "\x1b[" not in output, output
    core = [line for line in stderr.decode().splitlines() if "Initializing worker" in line]
    assert core and core[0].startswith("PLAIN INFO temporalio.core"), output
