"""How much work a worker takes at once: Temporal's slot suppliers (issue 31, backpressure).

A worker holds a *slot* for each workflow task and activity it runs; it polls its task
queue only while it has a free slot, so what it cannot take waits in Temporal's task queue
(no timeout runs on it there, nothing is retried, another worker may take it) instead of
slowing what it already runs. :func:`worker_tuner` makes the SDK's tuner from the settings:

* ``HERMES_WORKER_TUNER=resource`` (the default): workflow tasks and activities get
  resource-based slot suppliers (``WorkerTuner.create_composite`` over
  ``ResourceBasedSlotSupplier``): past ``worker_min_*_slots`` the SDK hands out a slot
  only while the CPU and memory it measures are under ``worker_target_cpu`` /
  ``worker_target_memory`` (a PID controller, checked at most every 50 ms for activities),
  and never more than ``max_concurrent_*``. Local activities (memory search, token counts)
  keep fixed slots: they run inside a workflow task that already holds one.
* ``fixed``: ``max_concurrent_*`` slots whatever the load (the SDK's default shape).

What the SDK measures (temporalio 1.35, sdk-core ``worker/tuner/resource_based.rs``,
read with :func:`cpu_reading`): memory is the cgroup's (v1 or v2: its limit and its
anonymous memory) when there is one; CPU is the cgroup v2 quota's use (``cpu.stat``
``usage_usec`` over ``cpu.max``) only in a container whose own cgroup v2 is mounted at
``/sys/fs/cgroup`` with a quota; everywhere else (cgroup v1, a v2 cgroup without a
``cpu.max`` quota such as ``--cpuset-cpus``) it is the whole host's CPU (sysinfo's global
usage, ``/proc/stat``). A worker held by a cgroup v1 quota on an idle host thus looks idle
to the tuner; the worker logs it at start (:func:`describe_cpu_reading`), and
``max_concurrent_activities`` stays the bound that holds there.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

from temporalio.worker import (
    FixedSizeSlotSupplier,
    ResourceBasedSlotConfig,
    ResourceBasedSlotSupplier,
    ResourceBasedTunerConfig,
    WorkerTuner,
)

from hermes.settings import Settings

__all__ = ["CpuReading", "cpu_reading", "describe_cpu_reading", "worker_tuner"]

log = logging.getLogger("hermes.worker")

_FIXED_LOCAL_ACTIVITY_SLOTS = 100
"""The SDK's own default for local activities and Nexus tasks."""


def worker_tuner(settings: Settings) -> WorkerTuner:
    """The worker's slot suppliers as the settings say (the module docstring).

    Args:
        settings: ``worker_tuner``, ``worker_target_cpu``, ``worker_target_memory``,
            ``worker_min_workflow_task_slots``, ``worker_min_activity_slots``,
            ``max_concurrent_workflow_tasks``, ``max_concurrent_activities``.

    Returns:
        A tuner for ``Worker(tuner=...)`` (which then takes no ``max_concurrent_*``).
    """
    if settings.worker_tuner == "fixed":
        return WorkerTuner.create_fixed(
            workflow_slots=settings.max_concurrent_workflow_tasks, activity_slots=settings.max_concurrent_activities
        )
    targets = ResourceBasedTunerConfig(target_memory_usage=settings.worker_target_memory, target_cpu_usage=settings.worker_target_cpu)
    workflow_min = min(settings.worker_min_workflow_task_slots, settings.max_concurrent_workflow_tasks)
    activity_min = min(settings.worker_min_activity_slots, settings.max_concurrent_activities)
    return WorkerTuner.create_composite(
        workflow_supplier=ResourceBasedSlotSupplier(
            ResourceBasedSlotConfig(minimum_slots=workflow_min, maximum_slots=settings.max_concurrent_workflow_tasks),
            targets,
        ),
        activity_supplier=ResourceBasedSlotSupplier(
            ResourceBasedSlotConfig(
                minimum_slots=activity_min,
                maximum_slots=settings.max_concurrent_activities,
                ramp_throttle=timedelta(milliseconds=50),  # the SDK's: time for a new slot's use to show
            ),
            targets,
        ),
        local_activity_supplier=FixedSizeSlotSupplier(_FIXED_LOCAL_ACTIVITY_SLOTS),
        nexus_supplier=FixedSizeSlotSupplier(_FIXED_LOCAL_ACTIVITY_SLOTS),
    )


@dataclass(frozen=True)
class CpuReading:
    """Which CPU figure the SDK's resource-based tuner reads in this process's cgroup."""

    source: str
    """``cgroup-v2-quota``: the container's use of its ``cpu.max`` quota (right);
    ``host``: the whole machine's CPU."""
    quota_cpus: float | None
    """The CPU quota the process is held to (CPUs; cgroup v1 or v2), None when unlimited
    or unknown."""

    @property
    def misleading(self) -> bool:
        """The tuner reads the host while a quota holds the worker: a throttled worker
        may look idle to it."""
        return self.source == "host" and self.quota_cpus is not None


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def cpu_reading(root: Path = Path("/sys/fs/cgroup")) -> CpuReading:
    """What the SDK's tuner reads for CPU under the cgroup filesystem at ``root`` (the
    same files and order as sdk-core's ``RealSysInfoInner::refresh``).

    Args:
        root: where the cgroup filesystem is mounted.

    Returns:
        The figure's source and the quota in CPUs (v2 ``cpu.max``; v1 ``cpu.cfs_quota_us``
        over ``cpu.cfs_period_us`` under ``cpu`` or ``cpu,cpuacct``), if any.
    """
    v2 = _read(root / "cpu.max")
    if v2 is not None and _read(root / "memory.current") is not None:
        quota, _, period = v2.partition(" ")
        if quota != "max" and quota.isdigit() and period.isdigit() and int(period) > 0:
            return CpuReading("cgroup-v2-quota", int(quota) / int(period))
        return CpuReading("host", None)
    for name in ("cpu", "cpu,cpuacct"):
        quota_text, period_text = _read(root / name / "cpu.cfs_quota_us"), _read(root / name / "cpu.cfs_period_us")
        if quota_text is None or period_text is None:
            continue
        try:
            quota, period = int(quota_text), int(period_text)
        except ValueError:
            continue
        return CpuReading("host", quota / period if quota > 0 and period > 0 else None)
    return CpuReading("host", None)


def describe_cpu_reading(settings: Settings, reading: CpuReading | None = None) -> str | None:
    """Log (and return) what the resource-based tuner reads for CPU; a warning when it
    reads the host while a cgroup quota holds the worker. None with ``worker_tuner=fixed``.

    Args:
        settings: ``worker_tuner`` and the targets.
        reading: default :func:`cpu_reading` of this process.
    """
    if settings.worker_tuner != "resource":
        return None
    reading = reading or cpu_reading()
    if reading.misleading:
        text = (
            f"the worker tuner reads the host's CPU, not this container's quota of {reading.quota_cpus:g} CPUs "
            "(cgroup v1: the SDK reads cpu.max of cgroup v2 only): a throttled worker looks idle to it, so only "
            f"HERMES_MAX_CONCURRENT_ACTIVITIES ({settings.max_concurrent_activities}) and "
            f"HERMES_MAX_CONCURRENT_WORKFLOW_TASKS ({settings.max_concurrent_workflow_tasks}) bound its work there"
        )
        log.warning(text)
        return text
    what = "its cgroup's CPU quota" if reading.source == "cgroup-v2-quota" else "the host's CPU"
    text = (
        f"worker tuner: takes more work only while {what} is under {settings.worker_target_cpu:.0%} and memory "
        f"under {settings.worker_target_memory:.0%}"
    )
    log.info(text)
    return text
