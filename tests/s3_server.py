"""A local S3 server for the tests of the memory store on object storage: moto's
``moto_server`` (the ``moto[server]`` package of the test extra) in a subprocess on a free
port, with one bucket; each test gets its own prefix in it.

The executable is ``$HERMES_TEST_MOTO_SERVER``, else ``moto_server`` beside this Python,
else on ``PATH``. Buckets are made with a plain HTTP ``PUT`` (moto takes any credentials),
so the tests need no AWS client library.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from hermes.stack import free_port

BUCKET = "hermes-memory"
START_SECONDS = 30.0

on_local_and_s3 = pytest.mark.parametrize("store", ["local", "s3"], indirect=True)
"""Runs a test of the ``store`` fixture (tests/conftest.py) on a local directory and on the local S3 server."""


@dataclass(frozen=True)
class S3Server:
    """A running moto S3 server."""

    endpoint: str
    """``http://127.0.0.1:<port>``."""

    def storage_options(self) -> dict[str, str]:
        """LanceDB storage options reaching this server (what the ``HERMES_S3_*`` settings make)."""
        return {
            "aws_endpoint": self.endpoint,
            "aws_region": "us-east-1",
            "aws_access_key_id": "testing",
            "aws_secret_access_key": "testing",
            "allow_http": "true",
        }

    def fresh_uri(self) -> str:
        """An ``s3://`` URI under a prefix no other test uses."""
        return f"s3://{BUCKET}/{uuid.uuid4().hex}"


def _executable() -> str:
    found = os.environ.get("HERMES_TEST_MOTO_SERVER") or shutil.which("moto_server", path=str(Path(sys.executable).parent))
    found = found or shutil.which("moto_server")
    if not found:
        raise RuntimeError("moto_server not found: install the test extra (moto[server]) or set HERMES_TEST_MOTO_SERVER")
    return found


@contextmanager
def moto_s3(log_dir: Path) -> Iterator[S3Server]:
    """Start ``moto_server``, make :data:`BUCKET`, yield the server, stop it.

    Raises:
        RuntimeError: no ``moto_server``, or it did not answer within 30 s.
    """
    port = free_port()
    log = (log_dir / "moto.log").open("wb")
    proc = subprocess.Popen([_executable(), "-H", "127.0.0.1", "-p", str(port)], stdout=log, stderr=subprocess.STDOUT)
    server = S3Server(endpoint=f"http://127.0.0.1:{port}")
    try:
        deadline = time.monotonic() + START_SECONDS
        while True:
            try:
                urllib.request.urlopen(urllib.request.Request(f"{server.endpoint}/{BUCKET}", method="PUT"), timeout=2)
                break
            except (urllib.error.URLError, ConnectionError) as err:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"moto_server did not start ({err}); see {log_dir / 'moto.log'}") from err
                time.sleep(0.1)  # polling the server's port until it answers
        yield server
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()
