"""A worker is made again when the SDK's sandbox validation of the workflows fails on
Python 3.11's import-lock race (python/cpython#91351), and only then (worker._validated)."""

from __future__ import annotations

from typing import Any

import pytest

import worker as worker_module


class _Flaky:
    """Stands in for ``temporalio.worker.Worker``: its first ``failures`` makings fail as
    the SDK does when validation meets the race (a RuntimeError from a KeyError)."""

    def __init__(self, failures: int, cause: BaseException) -> None:
        self.failures, self.cause, self.calls = failures, cause, 0

    def __call__(self, *args: Any, **kwargs: Any) -> str:
        self.calls += 1
        if self.calls <= self.failures:
            try:
                raise self.cause
            except BaseException as err:
                raise RuntimeError("Failed validating workflow MemoryConsolidationWorkflow") from err
        return "worker"


def test_a_validation_that_met_the_import_lock_race_is_tried_again():
    make = _Flaky(failures=2, cause=KeyError(140230422906560))
    assert worker_module._validated(make, "client", task_queue="q") == "worker"
    assert make.calls == 3


def test_the_race_is_given_up_on_after_the_attempts():
    make = _Flaky(failures=worker_module.VALIDATION_ATTEMPTS, cause=KeyError(1))
    with pytest.raises(RuntimeError, match="Failed validating workflow"):
        worker_module._validated(make)
    assert make.calls == worker_module.VALIDATION_ATTEMPTS


def test_any_other_validation_failure_is_raised_at_once():
    make = _Flaky(failures=1, cause=ImportError("no module named nope"))
    with pytest.raises(RuntimeError, match="Failed validating workflow"):
        worker_module._validated(make)
    assert make.calls == 1
