"""A worker's allocator gives large blocks back (issue 12: a worker's heap at the soak's
plateau was about 40% memory freed but held). Each case runs in a fresh interpreter:
``mallopt`` settings are process-wide."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

PROBE = textwrap.dedent(
    """
    import ctypes, sys
    from hermes.infra.process import tune_allocator

    class Mallinfo2(ctypes.Structure):
        _fields_ = [(n, ctypes.c_size_t) for n in
                    ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]

    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = Mallinfo2
    if sys.argv[1] == "tuned":
        assert tune_allocator()
    size = 8 * 1024 * 1024
    libc.malloc.restype = ctypes.c_void_p
    libc.free.argtypes = [ctypes.c_void_p]
    first = libc.malloc(size)
    libc.free(first)  # glibc raises its mmap threshold past 8 MiB here, unless fixed
    second = libc.malloc(size)
    print(libc.mallinfo2().hblkhd >= size)
    libc.free(second)
    """
)


def probe(mode: str) -> bool:
    out = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip() == "True"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_after_tuning_a_large_block_freed_and_asked_again_is_mapped_and_so_returned_when_freed():
    assert probe("untuned") is False  # glibc's dynamic threshold: the second block comes from the heap
    assert probe("tuned") is True


def test_the_environment_wins_over_the_tuning(monkeypatch):
    from hermes.infra import process

    calls = []

    class Mallopt:
        def __call__(self, param, value):
            calls.append(param)
            return 1

    class FakeLibc:
        mallopt = Mallopt()

    monkeypatch.setattr(process.ctypes, "CDLL", lambda name: FakeLibc())
    monkeypatch.setattr(process.sys, "platform", "linux")
    monkeypatch.setenv("MALLOC_ARENA_MAX", "4")
    monkeypatch.delenv("MALLOC_MMAP_THRESHOLD_", raising=False)
    assert process.tune_allocator()
    assert calls == [process.M_MMAP_THRESHOLD]


FREEZE_PROBE = textwrap.dedent(
    """
    import gc, time
    from hermes.infra.process import freeze_startup_heap
    import worker  # a worker's start-up modules
    held = [[i] for i in range(100_000)]  # start-up objects that live on (lists: tracked)
    cycle = []; cycle.append(cycle); del cycle  # start-up garbage: freed first, never frozen
    before = len(gc.get_objects())
    frozen = freeze_startup_heap()
    assert frozen >= 100_000 and gc.get_freeze_count() == frozen, frozen
    assert len(gc.get_objects()) < before // 10  # the collector's passes no longer walk them
    started = time.process_time(); gc.collect(); full = time.process_time() - started
    gc.unfreeze(); started = time.process_time(); gc.collect(); unfrozen = time.process_time() - started
    print(full < unfrozen, round(full * 1000, 1), round(unfrozen * 1000, 1))
    """
)


def test_a_workers_start_up_heap_is_frozen_and_a_full_collection_no_longer_walks_it():
    out = subprocess.run([sys.executable, "-c", FREEZE_PROBE], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[0] == "True", out.stdout
