"""``hermes healthcheck``: whether the Hermes command running in this container serves.

The image's ``HEALTHCHECK`` (``Dockerfile``) and the compose services run it::

    hermes healthcheck worker                           # a worker of this host polls the task queue
    hermes healthcheck http://127.0.0.1:8000/health     # the URL answers 2xx within 3 s
    hermes healthcheck                                  # whichever fits the `hermes` process here

Exit 0: healthy; 1: not (one line on stderr says why). Without a target it finds the
``hermes worker`` / ``hermes serve`` / ``hermes codec-server`` process of this machine in
``/proc`` and checks that one, so one image serves all three commands with one
``HEALTHCHECK``.

A worker has no port: it is healthy when Temporal lists a poller of its task queue whose
identity is the SDK's default, ``<pid>@<host name>``, with this machine's host name (a
container's), seen within the last 90 s (a long poll lasts up to about 70 s).
"""

from __future__ import annotations

import os
import socket
import sys
import urllib.error
import urllib.request
from collections.abc import Iterable
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from hermes.cli.errors import EXIT_REFUSED, fail
from hermes.cli.output import out
from hermes.cli.root import app
from hermes.cli.running import load_settings, quiet_runtime, run_command

if TYPE_CHECKING:
    from hermes.settings import Settings

__all__ = ["HTTP_TIMEOUT_SECONDS", "POLLER_SEEN_WITHIN_SECONDS", "healthcheck", "target_of", "worker_polls"]

HTTP_TIMEOUT_SECONDS = 3.0
"""How long an HTTP target has to answer."""
POLLER_SEEN_WITHIN_SECONDS = 90.0
"""A worker's poller last seen longer ago than this does not count (long polls last ~70 s)."""

_SERVE_PORT = 8080  # `hermes serve`'s default --port


def _option(args: list[str], name: str) -> str | None:
    for i, arg in enumerate(args):
        if arg == name and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    return None


def _local(host: str | None) -> str:
    if host in (None, "", "0.0.0.0", "::"):
        return "127.0.0.1"
    return f"[{host}]" if ":" in host else host


def target_of(argv: list[str], settings: Settings) -> str | None:
    """What to check for one process' command line.

    Args:
        argv: the process' arguments, e.g. ``["/opt/venv/bin/python", "/opt/venv/bin/hermes",
            "serve", "--host", "0.0.0.0", "--port", "8000"]``.
        settings: for the codec server's default port (``HERMES_CODEC_PORT``).

    Returns:
        ``"worker"``, the ``/health`` URL of a ``serve`` or ``codec-server`` process (on
        127.0.0.1 when it listens on every interface), or None when ``argv`` runs none of them.
    """
    for i, arg in enumerate(argv):
        if Path(arg).name != "hermes" and not (arg == "hermes.cli" and i > 0 and argv[i - 1] == "-m"):
            continue
        rest = argv[i + 1 :]
        command = next((a for a in rest if not a.startswith("-")), None)
        host = _local(_option(rest, "--host"))
        if command == "worker":
            return "worker"
        if command == "serve":
            return f"http://{host}:{_option(rest, '--port') or _SERVE_PORT}/health"
        if command == "codec-server":
            return f"http://{host}:{_option(rest, '--port') or settings.codec_port}/health"
    return None


def _processes(proc: Path = Path("/proc")) -> Iterable[list[str]]:
    own = os.getpid()
    for entry in proc.iterdir():
        if not entry.name.isdigit() or int(entry.name) == own:
            continue
        try:
            raw = (entry / "cmdline").read_bytes()
        except OSError:  # gone since it was listed, or not ours to read
            continue
        if raw:
            yield raw.rstrip(b"\0").decode(errors="replace").split("\0")


def _check_http(url: str) -> str | None:
    try:
        with urllib.request.urlopen(url, timeout=HTTP_TIMEOUT_SECONDS) as response:  # noqa: S310 - a URL the operator gave
            return None if 200 <= response.status < 300 else f"{url} answered {response.status}"
    except urllib.error.HTTPError as err:
        return f"{url} answered {err.code}"
    except (OSError, ValueError) as err:
        return f"{url} did not answer: {getattr(err, 'reason', err)}"


async def worker_polls(settings: Settings, host_name: str) -> str | None:
    """Whether a worker of ``host_name`` polls the settings' task queue for workflow tasks.

    Args:
        settings: Temporal's address, TLS and namespace, and the task queue.
        host_name: the host part of the worker's identity (``<pid>@<host name>``).

    Returns:
        None when Temporal lists such a poller seen within :data:`POLLER_SEEN_WITHIN_SECONDS`,
        else why not (Temporal unreachable, no such poller).
    """
    from temporalio.api.enums.v1 import TaskQueueKind, TaskQueueType
    from temporalio.api.taskqueue.v1 import TaskQueue
    from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest

    from hermes.infra.connections import connect_temporal

    try:
        client = await connect_temporal(settings, runtime=quiet_runtime())
        described = await client.workflow_service.describe_task_queue(
            DescribeTaskQueueRequest(
                namespace=client.namespace,
                task_queue=TaskQueue(name=settings.task_queue, kind=TaskQueueKind.TASK_QUEUE_KIND_NORMAL),
                task_queue_type=TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW,
            ),
            timeout=timedelta(seconds=HTTP_TIMEOUT_SECONDS),
        )
    except Exception as err:  # noqa: BLE001 - any failure is "not healthy", said in one line
        return f"Temporal {settings.resolved_temporal_address} did not describe task queue {settings.task_queue!r}: {err}"
    now = datetime.now(timezone.utc)
    for poller in described.pollers:
        seen = poller.last_access_time.ToDatetime(tzinfo=timezone.utc) if poller.HasField("last_access_time") else now
        if poller.identity.endswith(f"@{host_name}") and (now - seen).total_seconds() <= POLLER_SEEN_WITHIN_SECONDS:
            return None
    return f"no worker of host {host_name!r} polls task queue {settings.task_queue!r} (Temporal lists {len(described.pollers)} poller(s))"


@app.command("healthcheck")
def healthcheck(
    target: Annotated[
        str | None,
        typer.Argument(help="`worker`, or a URL that must answer 2xx; default: the hermes process running here."),
    ] = None,
) -> None:
    """Exit 0 when this container's Hermes command serves, 1 when not (the image's HEALTHCHECK)."""
    settings = load_settings()
    if target is None:
        found = {t for argv in _processes() if (t := target_of(argv, settings)) is not None}
        if len(found) != 1:
            what = "no hermes worker, serve or codec-server process" if not found else f"several: {sorted(found)}"
            raise fail(f"nothing to check: {what} runs here; name one (worker or a URL)", EXIT_REFUSED)
        (target,) = found
    if target == "worker":
        problem = run_command(lambda: worker_polls(settings, socket.gethostname()), settings)
    elif target.startswith(("http://", "https://")):
        problem = _check_http(target)
    else:
        raise fail(f"unknown target {target!r}: expected worker or an http(s) URL", EXIT_REFUSED)
    if problem is not None:
        raise fail(problem, EXIT_REFUSED)
    out.print(f"healthy: {target}")
    sys.stdout.flush()
