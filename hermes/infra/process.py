"""Process-level settings of a long-running Hermes process: its allocator, waiting for its
stop signal, and leaving a process that has a Temporal client without CPython's
finalization."""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import ctypes
import os
import sys
from typing import Any, NoReturn


async def wait_until_interrupted() -> None:
    """Wait until this task is cancelled (the CLI cancels it on Ctrl-C or SIGTERM), then
    return normally, so the caller's cleanup runs as on a normal exit."""
    try:
        await asyncio.Event().wait()
    except asyncio.CancelledError:
        task = asyncio.current_task()
        if task is not None:
            task.uncancel()


def exit_now(code: Any) -> NoReturn:
    """Run the ``atexit`` handlers, flush stdout/stderr and ``os._exit(code)``.

    The Temporal SDK's Rust threads can call into Python while CPython finalizes and
    abort the process ("Fatal Python error: PyGILState_Release", exit -6) after the work
    has succeeded (temporalio/sdk-python#300). ``code``: ``None`` is 0, an int is kept,
    anything else is printed to stderr and exits 1 (as ``SystemExit`` does).
    """
    if code is None:
        code = 0
    elif not isinstance(code, int):
        print(code, file=sys.stderr)
        code = 1
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


M_MMAP_THRESHOLD = -3
M_ARENA_MAX = -8
"""``mallopt`` parameters (glibc ``malloc.h``)."""
WORKER_ARENA_MAX = 2
WORKER_MMAP_THRESHOLD_BYTES = 128 * 1024
"""glibc's own initial mmap threshold, made fixed."""


def tune_allocator(*, arena_max: int = WORKER_ARENA_MAX, mmap_threshold: int = WORKER_MMAP_THRESHOLD_BYTES) -> bool:
    """Make glibc's allocator give memory back in a long-running worker (call it before
    the process starts threads).

    A worker's heap holds its cached session runs, which grow to the replay budget and
    shrink at continue-as-new, and numpy temporaries of the embedding model and the
    memory search. glibc raises its mmap threshold each time a large block is freed (up
    to 32 MiB), so later large temporaries come from the heap and leave holes it cannot
    return; and each thread may get its own arena (8 per core). Issue 12 measured a
    worker's heap at the soak's plateau as about 40% free-but-held memory (80-107 MiB;
    ``malloc_trim`` gave back only 17-20 MiB). A fixed threshold (``mmap_threshold``
    bytes; glibc's default start value) sends every large block to ``mmap``, returned
    when freed, and ``arena_max`` arenas bound the spread (the remedy glibc's
    documentation gives for ``MALLOC_ARENA_MAX``). The environment variables
    ``MALLOC_ARENA_MAX`` and ``MALLOC_MMAP_THRESHOLD_`` win when set.

    Returns:
        Whether the settings were applied (False off glibc, e.g. macOS or musl).
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    ok = True
    if "MALLOC_ARENA_MAX" not in os.environ:
        ok &= mallopt(M_ARENA_MAX, arena_max) == 1
    if "MALLOC_MMAP_THRESHOLD_" not in os.environ:
        ok &= mallopt(M_MMAP_THRESHOLD, mmap_threshold) == 1
    return bool(ok)


def freeze_startup_heap() -> int:
    """Collect garbage once, then exclude every object alive now from the garbage
    collector's later passes (``gc.freeze``); call it once, when the process has started
    (modules, pydantic schemas, the sandbox's workflow modules loaded) and holds no work.

    CPython's full collection walks every tracked object: a worker's start-up heap is about
    200,000 of them (measured in ``bench/turn_overhead.py``), so each full collection took
    about 120 ms, on the event loop that sends heartbeats, and one ran every hundred turns
    or so. Frozen objects are never freed, which is what start-up objects are for: the
    collection before the freeze frees start-up garbage first. The remedy CPython's
    documentation gives for long-lived processes (``gc.freeze``).

    Returns:
        How many objects are frozen now.
    """
    import gc

    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()
