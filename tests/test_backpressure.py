"""Backpressure, not amplification (issue 31 item 5): a saturated worker takes less work
(hermes/infra/tuning.py: the SDK's resource-based slot suppliers), what it cannot take
waits in Temporal's task queue while the client waits for its reply, and the API refuses
a keyless request it cannot name safely under load instead of sending it twice."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

import pytest
from temporalio.worker import FixedSizeSlotSupplier, ResourceBasedSlotSupplier

from hermes.api.problems import Problem
from hermes.api.retries import message_name
from hermes.errors import SessionUnavailableError
from hermes.infra.tuning import CpuReading, cpu_reading, describe_cpu_reading, worker_tuner
from hermes.settings import Settings
from tests.test_session import EchoModel


def _cgroup(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text + "\n")
    return root


def test_the_tuner_reads_a_cgroup_v2_quota_but_the_host_under_cgroup_v1_or_without_a_quota(tmp_path: Path):
    v2 = _cgroup(tmp_path / "v2", {"cpu.max": "150000 100000", "memory.current": "1000"})
    assert cpu_reading(v2) == CpuReading("cgroup-v2-quota", 1.5)
    unlimited = _cgroup(tmp_path / "v2max", {"cpu.max": "max 100000", "memory.current": "1000"})
    assert cpu_reading(unlimited) == CpuReading("host", None)
    v1 = _cgroup(tmp_path / "v1", {"cpu,cpuacct/cpu.cfs_quota_us": "50000", "cpu,cpuacct/cpu.cfs_period_us": "100000"})
    assert cpu_reading(v1) == CpuReading("host", 0.5) and cpu_reading(v1).misleading
    v1_free = _cgroup(tmp_path / "v1free", {"cpu/cpu.cfs_quota_us": "-1", "cpu/cpu.cfs_period_us": "100000"})
    assert cpu_reading(v1_free) == CpuReading("host", None) and not cpu_reading(v1_free).misleading
    assert cpu_reading(tmp_path / "nothing") == CpuReading("host", None)

    settings = Settings(worker_target_cpu=0.7)
    assert "quota of 0.5 CPUs" in (describe_cpu_reading(settings, cpu_reading(v1)) or "")
    assert "its cgroup's CPU quota is under 70%" in (describe_cpu_reading(settings, cpu_reading(v2)) or "")
    assert describe_cpu_reading(Settings(worker_tuner="fixed"), cpu_reading(v1)) is None


def test_a_resource_tuner_bounds_workflow_tasks_and_activities_by_the_settings_and_keeps_local_activities_fixed():
    tuner = worker_tuner(Settings(max_concurrent_activities=40, worker_min_activity_slots=3, worker_target_cpu=0.6))
    activities = tuner._get_activity_task_slot_supplier()  # the SDK has no public reader of a tuner's parts
    assert isinstance(activities, ResourceBasedSlotSupplier)
    assert (activities.slot_config.minimum_slots, activities.slot_config.maximum_slots) == (3, 40)
    assert activities.tuner_config.target_cpu_usage == 0.6
    assert isinstance(tuner._get_workflow_task_slot_supplier(), ResourceBasedSlotSupplier)
    assert isinstance(tuner._get_local_activity_task_slot_supplier(), FixedSizeSlotSupplier)
    # A minimum above the maximum is the maximum.
    small = worker_tuner(Settings(max_concurrent_activities=2, worker_min_activity_slots=8))
    assert small._get_activity_task_slot_supplier().slot_config.minimum_slots == 2
    fixed = worker_tuner(Settings(worker_tuner="fixed", max_concurrent_activities=7))
    assert fixed._get_activity_task_slot_supplier() == FixedSizeSlotSupplier(7)


@pytest.mark.timeout(240)
async def test_a_saturated_worker_runs_only_its_minimum_activities_while_every_client_waits_and_gets_its_reply(
    run_worker: Any, settings: Settings
):
    # Targets no machine is under: the worker counts as saturated the whole time. Memory
    # holds it there: the SDK's PID controller also weighs how fast a reading falls (its D
    # term), and a loaded CI host's CPU falling sharply handed out 3 slots; memory is steady.
    settings.worker_target_cpu = 0.001
    settings.worker_target_memory = 0.001
    settings.worker_min_activity_slots = 1
    model = EchoModel(delay_seconds=0.3)
    async with run_worker(model, memory=False) as hermes:
        # The tuner reads CPU use from two samples (sysinfo, in the SDK's core: 0% before
        # the second): a turn first, so the four below meet a worker it has measured.
        # A CI run sending at once saw two activities run at a worker's start.
        await asyncio.wait_for(hermes.send_message(f"bp-{uuid.uuid4().hex[:8]}", "warm up"), 120)
        await asyncio.sleep(1.0)
        model.calls = model.max_active = 0
        sessions = [f"bp-{uuid.uuid4().hex[:8]}" for _ in range(4)]
        results = await asyncio.wait_for(
            asyncio.gather(*(hermes.send_message(sid, f"hello {n}") for n, sid in enumerate(sessions))), 180
        )
    assert [r.reply for r in results] == [f"echo: hello {n}" for n in range(4)]
    assert model.calls == 4  # each step asked once: waiting for a slot retries nothing
    assert model.max_active == 1  # the fixed 100 slots ran all four at once


class _UnansweringSession:
    """A client whose session does not answer its queries in time (its worker saturated)."""

    async def taken_messages(self, session_id: str, prefix: str) -> list[Any]:
        raise SessionUnavailableError(
            f"get_taken_messages on session {session_id!r}: Temporal did not answer within 1 s",
            session_id=session_id, last_error="query timed out",
        )


async def test_a_keyless_request_whose_session_does_not_answer_is_refused_503_with_retry_after_and_not_sent():
    with pytest.raises(Problem) as refused:
        await message_name(_UnansweringSession(), "s1", fingerprint="ab" * 32, key=None, window_seconds=300)  # type: ignore[arg-type]
    assert refused.value.status == 503 and refused.value.headers["Retry-After"] == "5"
    assert "not sent" in refused.value.detail
    # With an Idempotency-Key the id alone dedupes a retry: it is sent under it.
    keyed = await message_name(_UnansweringSession(), "s1", fingerprint="ab" * 32, key="k1", window_seconds=300)  # type: ignore[arg-type]
    assert keyed.client_message_id == "api-k1#" + "ab" * 8 and not keyed.retry
