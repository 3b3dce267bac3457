"""stdio MCP servers as process trees: started under a supervisor, killed as a group.

stdio process trees: a server is started through a small supervisor (``python -c``,
:data:`_SUPERVISOR`) in a session and process group of its own (``start_new_session``).
The supervisor forks the server into that group, passes it stdin/stdout/stderr, waits
for it and exits with its status. It sets Linux ``PR_SET_PDEATHSIG`` so that when the
worker dies (even by SIGKILL) it is signalled and SIGKILLs its whole process group,
grandchildren included. Closing a connection (``aclose``, idle, reconnect, failure)
closes the server's stdin, waits :data:`_EXIT_GRACE_SECONDS`, sends SIGTERM to the group,
waits :data:`KILL_GRACE_SECONDS`, then SIGKILLs the group. What escapes: a descendant
that calls ``setsid()``/``setpgid()`` to leave the group (a daemon, by design), and on
non-Linux systems the PDEATHSIG guard (close and atexit still kill the group). The
server's stderr is drained continuously (it can never fill the pipe and block the
server); its last lines go into error messages.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

import anyio
import mcp.types as types
from anyio.abc import Process
from anyio.streams.text import TextReceiveStream
from mcp.client.stdio import get_default_environment
from mcp.shared.message import SessionMessage

from hermes.mcp.config import ResolvedServer

if TYPE_CHECKING:
    from hermes.mcp.state import Connection

__all__ = [
    "KILL_GRACE_SECONDS", "StartError", "child_pid_now", "exit_code", "exit_note", "group_members", "open_stdio", "stop_tree",
]

log = logging.getLogger("hermes.mcp")

KILL_GRACE_SECONDS = 2.0
"""Between SIGTERM to a server's process group and SIGKILL."""
_EXIT_GRACE_SECONDS = 0.5
"""After closing a server's stdin, before SIGTERM (the spec's polite shutdown)."""
_REAP_SECONDS = 2.0
"""After SIGKILL, how long to wait for the kernel to report the group gone."""
STDERR_LINES = 20
"""Lines of a server's stderr kept for error messages."""
_STDERR_LINE_CHARS = 500
_POLL_SECONDS = 0.05

_SUPERVISOR = r"""
import ctypes, os, signal, sys
parent = int(sys.argv[1])
group = os.getpgrp()
def kill_group(*_):
    os.killpg(group, signal.SIGKILL)
signal.signal(signal.SIGUSR1, kill_group)
try:
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGUSR1)  # PR_SET_PDEATHSIG
except Exception:
    pass
if os.getppid() != parent:
    kill_group()
signal.signal(signal.SIGTERM, signal.SIG_IGN)
signal.signal(signal.SIGINT, signal.SIG_IGN)
pid = os.fork()
if pid == 0:
    signal.signal(signal.SIGUSR1, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    try:
        os.execvp(sys.argv[2], sys.argv[2:])
    except OSError as err:
        os.write(2, f"cannot start {sys.argv[2]!r}: {err}\n".encode())
        os._exit(127)
null = os.open(os.devnull, os.O_RDWR)
os.dup2(null, 0)
os.dup2(null, 1)
while True:
    try:
        _, status = os.waitpid(pid, 0)
        break
    except InterruptedError:
        continue
code = os.waitstatus_to_exitcode(status)
os._exit(code if code >= 0 else 128 - code)
"""
"""The supervisor (see the module docstring). argv: the worker's pid, then the server's
command and arguments. It ignores SIGTERM (the group's SIGTERM is for the server; the
supervisor exits when the server does) and SIGKILLs the group on SIGUSR1, its
parent-death signal. It exits with the server's code (128 + signal for a signal)."""

_LIVE_GROUPS: set[int] = set()
"""Process groups of running stdio servers, SIGKILLed at interpreter exit if still there
(a worker that returns without ``aclose``)."""


@atexit.register
def _kill_live_groups() -> None:
    for group in list(_LIVE_GROUPS):
        with contextlib.suppress(OSError):
            os.killpg(group, signal.SIGKILL)


class StartError(Exception):
    """A stdio server that cannot be started at all (the message says why)."""


async def _read_stdout(process: Process, conn: Connection, read_writer: Any) -> None:
    """Pass the server's stdout, one JSON-RPC message a line, to the session; a line that
    is not JSON-RPC goes to the session as an error (and into the stderr tail). When
    stdout ends, end the connection, naming the exit code when the process exited."""
    assert process.stdout is not None
    try:
        async with read_writer:
            buffer = ""
            async for chunk in TextReceiveStream(process.stdout, encoding="utf-8"):
                lines = (buffer + chunk).split("\n")
                buffer = lines.pop()
                for line in lines:
                    if not line.strip():
                        continue
                    try:
                        message = types.jsonrpc_message_adapter.validate_json(line, by_name=False)
                    except ValueError as err:
                        conn.stderr_tail.append(f"(not JSON-RPC on stdout: {line[:200]!r})")
                        await read_writer.send(err)
                        continue
                    await read_writer.send(SessionMessage(message))
    except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError, UnicodeDecodeError):
        pass
    if conn.ended.is_set():
        return
    with anyio.move_on_after(1.0):  # the exit code makes a better message
        while process.returncode is None:
            await anyio.sleep(0.01)
    if process.returncode is None:
        conn.end("the server closed its stdout")
    else:
        conn.end(f"the server process exited with code {exit_code(process)}")


@contextlib.asynccontextmanager
async def open_stdio(resolved: ResolvedServer, conn: Connection) -> AsyncIterator[tuple[Any, Any]]:
    """Start the server under the supervisor in a new process group; yield its streams.

    On exit (any cause) the whole group is killed: stdin closed, SIGTERM, SIGKILL.

    Args:
        resolved: the stdio server (its ``command`` is set).
        conn: the connection; its ``process``, ``group``, ``pid`` and ``stderr_tail`` are
            filled in here, and its ``end`` is called when the process goes.

    Yields:
        ``(read_stream, write_stream)`` of JSON-RPC messages for the MCP session.

    Raises:
        StartError: the command is not found, not executable, or cannot be started.
    """
    assert resolved.command is not None
    env = {**get_default_environment(), **resolved.env}
    command = resolved.command
    if os.sep not in command and shutil.which(command, path=env.get("PATH")) is None:
        raise StartError(f"command {command!r} not found on PATH")
    if os.sep in command and not os.access(command, os.X_OK):
        raise StartError(f"command {command!r} does not exist or is not executable")
    try:
        process = await anyio.open_process(
            [sys.executable, "-c", _SUPERVISOR, str(os.getpid()), command, *resolved.args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            cwd=resolved.cwd,
            start_new_session=True,
        )
    except OSError as err:
        raise StartError(f"cannot start {command!r}: {err}") from None
    conn.process = process
    conn.group = process.pid
    _LIVE_GROUPS.add(process.pid)
    read_writer, read_stream = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    write_stream, write_reader = anyio.create_memory_object_stream[SessionMessage](0)

    async def stdin_writer() -> None:
        assert process.stdin is not None
        try:
            async with write_reader:
                async for message in write_reader:
                    data = message.message.model_dump_json(by_alias=True, exclude_unset=True) + "\n"
                    await process.stdin.send(data.encode("utf-8"))
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
            conn.end(f"the server closed its stdin{exit_note(process)}")

    async def stderr_drain() -> None:
        assert process.stderr is not None
        buffer = b""
        with contextlib.suppress(anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
            while True:
                buffer += await process.stderr.receive(65536)
                *lines, buffer = buffer.split(b"\n")
                for line in lines:
                    text = line.decode("utf-8", "replace").strip()
                    if text:
                        conn.stderr_tail.append(text[:_STDERR_LINE_CHARS])
                buffer = buffer[-_STDERR_LINE_CHARS:]

    async def exit_watch() -> None:
        while process.returncode is None:
            await anyio.sleep(0.2)
        conn.end(f"the server process exited with code {exit_code(process)}")

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(_read_stdout, process, conn, read_writer)
            tg.start_soon(stdin_writer)
            tg.start_soon(stderr_drain)
            tg.start_soon(exit_watch)
            conn.pid = await child_pid(process.pid, exited=lambda: process.returncode is not None)
            try:
                yield read_stream, write_stream
            finally:
                with anyio.CancelScope(shield=True):
                    write_stream.close()
                    read_stream.close()
                    await stop_tree(process)
                tg.cancel_scope.cancel()
    finally:
        _LIVE_GROUPS.discard(process.pid)
        for stream in (process.stdin, process.stdout, process.stderr):
            if stream is not None:
                with contextlib.suppress(Exception):
                    await stream.aclose()
        transport = getattr(getattr(process, "_process", None), "_transport", None)
        if transport is not None:
            with contextlib.suppress(Exception):
                transport.close()

def exit_code(process: Process) -> str:
    code = process.returncode
    if code is not None and code > 128:
        with contextlib.suppress(ValueError):
            return f"{code} ({signal.Signals(code - 128).name})"
    return str(code)


def exit_note(process: Process) -> str:
    return "" if process.returncode is None else f" (the server process exited with code {exit_code(process)})"


CHILD_PID_WAIT_SECONDS = 5.0
"""How long a connection waits for its supervisor to fork the server before it goes on
without the server's pid (:func:`child_pid`; the status looks it up again later). A
count of short sleeps was not enough: on a loaded machine the fork came after 200 ms,
and a running server's status showed no pid for the rest of its life."""


async def child_pid(supervisor: int, *, exited: Callable[[], bool] = lambda: False,
                    wait_seconds: float = CHILD_PID_WAIT_SECONDS) -> int | None:
    """The server's pid: the supervisor's child (forked right after it starts), waited
    for up to ``wait_seconds`` (wall clock) or until ``exited()`` says the supervisor is
    gone; None if it has none by then."""
    deadline = time.monotonic() + wait_seconds
    while True:
        pid = child_pid_now(supervisor)
        if pid is not None or exited() or time.monotonic() >= deadline:
            return pid
        await anyio.sleep(0.005)


def child_pid_now(supervisor: int) -> int | None:
    """The supervisor's child now (Linux ``/proc``), or None."""
    with contextlib.suppress(OSError, ValueError):
        with open(f"/proc/{supervisor}/task/{supervisor}/children") as f:
            children = f.read().split()
        if children:
            return int(children[0])
    return None


def group_members(group: int) -> list[int]:
    """Live (not zombie) processes in process group ``group`` (Linux ``/proc``).

    Elsewhere: ``[group]`` while ``killpg(group, 0)`` succeeds, else ``[]``.
    """
    if not os.path.isdir("/proc/self"):
        try:
            os.killpg(group, 0)
        except ProcessLookupError:
            return []
        except PermissionError:
            pass
        return [group]
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rfind(b")") + 2 :].split()
        if len(fields) > 2 and fields[0] != b"Z" and int(fields[2]) == group:
            members.append(int(entry))
    return members


async def stop_tree(process: Process) -> None:
    """Close the server's stdin, then SIGTERM and SIGKILL its whole process group."""
    group = process.pid
    if process.stdin is not None:
        with contextlib.suppress(Exception):
            await process.stdin.aclose()
    with anyio.move_on_after(_EXIT_GRACE_SECONDS):
        while process.returncode is None:
            await anyio.sleep(0.01)
    if not group_members(group):
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(group, signal.SIGTERM)
    with anyio.move_on_after(KILL_GRACE_SECONDS):
        while group_members(group):
            await anyio.sleep(_POLL_SECONDS)
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(group, signal.SIGKILL)
    with anyio.move_on_after(_REAP_SECONDS):
        while group_members(group) or process.returncode is None:
            await anyio.sleep(0.01)
    if group_members(group):
        log.warning("MCP server process group %d survived SIGKILL", group)
