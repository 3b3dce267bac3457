"""CPU-bound work off the worker's process: a small process pool (issue 31).

Embedding texts and counting the tokens of large content hold the GIL (or a core) for
milliseconds to seconds. Run in a thread of the worker, that starves the asyncio loop
which sends every activity's heartbeats, and a busy worker looks dead: its activities
time out and run again elsewhere, adding the very load that starved it. Here that work
runs in child processes (``concurrent.futures.ProcessPoolExecutor``, ``forkserver`` where
the platform has it, else ``spawn``: never ``fork`` of a process with threads), and the
worker's thread only waits on a pipe, without the GIL.

- :func:`shared` is the process's pool, sized by ``HERMES_CPU_WORKERS``
  (:attr:`hermes.settings.Settings.cpu_workers`; 0: no pool, the work runs inline as
  before), made on first use; :func:`shutdown_shared` ends it (the worker does on exit;
  ``concurrent.futures`` also joins it when the interpreter exits).
- Each child runs the pool's warmers first (:meth:`CpuPool.add_warmer`: the embedding
  model, the tokenizer), so no call pays for loading them mid-turn.
- A child that dies (killed, out of memory) breaks the whole executor in
  ``concurrent.futures`` (every pending future fails with ``BrokenProcessPool``, none
  hangs): the pool makes a new executor and runs the call once more; a call that breaks
  the new one as well raises :class:`CpuWorkerLostError`, which activities let Temporal
  retry.

Functions sent to the pool must be importable module-level functions, their arguments and
results picklable.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import logging
import multiprocessing
import os
import signal
import threading
from collections.abc import Callable
from concurrent.futures.process import BrokenProcessPool
from typing import Any, TypeVar

from hermes.errors import HermesError

__all__ = ["CpuPool", "CpuWorkerLostError", "run_cpu", "shared", "shutdown_shared"]

log = logging.getLogger("hermes.cpu_pool")

T = TypeVar("T")


class CpuWorkerLostError(HermesError):
    """A child process of the CPU pool died while it ran the call, twice in a row (a new
    pool was made after the first). Retryable: the pool that answers the next call is a
    fresh one."""


def _lost(fn: Callable[..., Any]) -> CpuWorkerLostError:
    name = getattr(fn, "__qualname__", repr(fn))
    return CpuWorkerLostError(f"a CPU pool process died running {name}, on a new pool too (killed, or out of memory?)")


def _ready() -> None:
    """Nothing: sent to start a child."""


def _start_method() -> str:
    return "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"


MATH_THREADS_ENV = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "BLIS_NUM_THREADS")
"""What native math libraries read for their own thread count when they load."""


def single_threaded_math() -> None:
    """Hold this process's native math libraries (numpy's OpenBLAS, any OpenMP runtime)
    to one thread each: the ones loaded already, through ``threadpoolctl``, and the ones
    loaded later, through their environment variables.

    A pool child is one of ``cpu_workers`` processes (``HERMES_CPU_WORKERS``, one by
    default): running in parallel is the pool's job, sized by that setting. A child whose
    BLAS also starts a thread per core competes
    with the worker's event loop for the same cores, and OpenBLAS's idle threads
    busy-wait: one query embedding here cost 1.85 ms of CPU single-threaded, 2.6 ms with
    OpenBLAS's two threads on an idle 2-core machine and 5.5 ms with one busy process
    beside it (issue 31: the CPU per turn that grew with load).
    """
    for name in MATH_THREADS_ENV:
        os.environ[name] = "1"
    import numpy  # noqa: F401 - loads its BLAS, so the limit below reaches it
    from threadpoolctl import threadpool_limits

    threadpool_limits(limits=1)


def _init_child(warmers: tuple[tuple[Callable[..., Any], tuple[Any, ...]], ...]) -> None:
    """A child's start: Ctrl-C is the parent's to handle (the worker stops gracefully and
    ends the pool), its math libraries on one thread (:func:`single_threaded_math`), then
    the warmers, each failure logged (a child whose initializer raises breaks the
    executor, which would be made again and break again)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        single_threaded_math()
    except Exception:  # noqa: BLE001 - a child with more threads still gives right answers
        log.warning("CPU pool child %d: could not limit its math libraries to one thread", os.getpid(), exc_info=True)
    for fn, args in warmers:
        try:
            fn(*args)
        except Exception:  # noqa: BLE001 - the call that needs it meets the error again
            log.warning("CPU pool child %d: warm-up %s failed", os.getpid(), getattr(fn, "__name__", fn), exc_info=True)


class CpuPool:
    """A lazily made process pool for CPU-bound calls, remade when a child dies.

    Args:
        workers: child processes (>= 1).
        start_method: ``forkserver`` or ``spawn`` (default: ``forkserver`` where available).
    """

    def __init__(self, workers: int, *, start_method: str | None = None) -> None:
        if workers < 1:
            raise ValueError(f"a CPU pool needs at least one worker, got {workers}")
        self.workers = workers
        self._context = multiprocessing.get_context(start_method or _start_method())
        self._executor: concurrent.futures.ProcessPoolExecutor | None = None
        self._warmers: list[tuple[Callable[..., Any], tuple[Any, ...]]] = []
        self._lock = threading.Lock()
        self._exit_hook = False
        self.restarts = 0
        """How many times a broken executor was replaced (a child died)."""
        self.calls = 0
        """Calls sent to the children (attempts; statistics)."""

    def add_warmer(self, fn: Callable[..., Any], *args: Any) -> None:
        """Have every child run ``fn(*args)`` when it starts (children started after this
        call; a pool already running is not remade for it)."""
        with self._lock:
            if (fn, args) not in self._warmers:
                self._warmers.append((fn, args))

    def _current(self) -> concurrent.futures.ProcessPoolExecutor:
        with self._lock:
            if self._executor is None:
                if not self._exit_hook:
                    # Before multiprocessing's own exit hook (atexit runs last-in first):
                    # that one joins the children, which wait for work forever unless the
                    # executor ends them. concurrent.futures ends them in threading's
                    # shutdown, which a process leaving through os._exit after the atexit
                    # hooks (the CLI: hermes.infra.process.exit_now) never runs.
                    atexit.register(self.shutdown)
                    self._exit_hook = True
                self._executor = concurrent.futures.ProcessPoolExecutor(
                    self.workers, mp_context=self._context, initializer=_init_child, initargs=(tuple(self._warmers),)
                )
            return self._executor

    def start(self) -> None:
        """Start the children now (in the background: this returns at once), so that the
        first call does not wait for them to start and run the warmers."""
        threading.Thread(target=self._start, name="hermes-cpu-pool-start", daemon=True).start()

    def _start(self) -> None:
        try:
            self._submit(_ready, ())
        except Exception:  # noqa: BLE001 - the first call meets it again
            log.warning("the CPU pool could not start", exc_info=True)

    def _replace(self, broken: concurrent.futures.ProcessPoolExecutor) -> None:
        with self._lock:
            if self._executor is broken:
                self._executor = None
                self.restarts += 1
                log.warning("a CPU pool child process died; starting a new pool")
        broken.shutdown(wait=False, cancel_futures=True)

    def _submit(self, fn: Callable[..., T], args: tuple[Any, ...]) -> tuple[concurrent.futures.ProcessPoolExecutor, concurrent.futures.Future[T]]:
        executor = self._current()
        self.calls += 1
        try:
            return executor, executor.submit(fn, *args)
        except BrokenProcessPool:  # a child died while idle: the executor refuses new work
            self._replace(executor)
            executor = self._current()
            return executor, executor.submit(fn, *args)

    def call(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` in a child process, blocking this thread (not holding the GIL)
        until it returns. Call it from a worker thread, never on the event loop
        (:meth:`run` is the loop's way).

        Raises:
            CpuWorkerLostError: the child died running it, on a fresh pool too.
            Exception: whatever ``fn`` raised (re-raised here).
        """
        for attempt in (1, 2):
            executor, future = self._submit(fn, args)
            try:
                return future.result()
            except BrokenProcessPool as err:
                self._replace(executor)
                if attempt == 2:
                    raise _lost(fn) from err
        raise AssertionError("unreachable")

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """:meth:`call` awaited on the event loop, which stays free meanwhile.

        Raises:
            CpuWorkerLostError: as :meth:`call`.
        """
        for attempt in (1, 2):
            executor, future = self._submit(fn, args)
            try:
                return await asyncio.wrap_future(future)
            except BrokenProcessPool as err:
                self._replace(executor)
                if attempt == 2:
                    raise _lost(fn) from err
        raise AssertionError("unreachable")

    def shutdown(self) -> None:
        """End the children (calls still queued are cancelled); the next call starts a new pool."""
        with self._lock:
            executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=True, cancel_futures=True)


_shared: CpuPool | None = None
_shared_lock = threading.Lock()


def shared(workers: int | None = None) -> CpuPool | None:
    """The process's CPU pool, made on first call with ``workers`` children (default:
    ``HERMES_CPU_WORKERS`` from :func:`hermes.settings.get_settings`); None when that is 0
    (the work then runs inline, in the caller's thread). Later calls return the same pool
    whatever ``workers`` they pass."""
    global _shared
    with _shared_lock:
        if _shared is None:
            if workers is None:
                from hermes.settings import get_settings

                workers = get_settings().cpu_workers
            if workers <= 0:
                return None
            _shared = CpuPool(workers)
        return _shared


def shutdown_shared() -> None:
    """End the process's CPU pool, if one was made (the worker does when it stops)."""
    global _shared
    with _shared_lock:
        pool, _shared = _shared, None
    if pool is not None:
        pool.shutdown()


async def run_cpu(fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` in the process's CPU pool (:func:`shared`), awaited; in a thread of
    this process when there is no pool (``HERMES_CPU_WORKERS=0``).

    Raises:
        CpuWorkerLostError: as :meth:`CpuPool.call`.
    """
    pool = shared()
    if pool is None:
        return await asyncio.to_thread(fn, *args)
    return await pool.run(fn, *args)
