"""Leaving a process that has a Temporal client without CPython's finalization."""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
from typing import Any, NoReturn


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
