"""Rolling deploys with Temporal Worker Versioning (README "Rolling deploys").

A worker with ``HERMES_DEPLOYMENT_NAME`` and ``HERMES_BUILD_ID`` set belongs to that
Worker Deployment Version (:func:`deployment_config`). Every Hermes workflow is PINNED:
a run completes on the build it started on, so code within a run never changes under it.
A session (or a memory writer) moves to the deployment's current build when it continues
as new (``initial_versioning_behavior=AUTO_UPGRADE`` on its continue-as-new), so an old
build drains as its runs roll over; new sessions start on the current build.

:func:`set_current` promotes a build (``hermes deploy set-current``); :func:`status`
lists the builds with their status, drainage and running workflows
(``hermes deploy status``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hermes.errors import ConfigError
from hermes.settings import Settings

__all__ = ["BuildStatus", "deployment_config", "set_current", "status"]


def deployment_config(settings: Settings) -> Any:
    """The worker's ``WorkerDeploymentConfig``, or None when versioning is off (neither
    ``deployment_name`` nor ``build_id`` set: an unversioned worker, as before).

    Returns:
        ``temporalio.worker.WorkerDeploymentConfig`` with ``use_worker_versioning=True``
        and PINNED as the default behaviour of every workflow type, or None.

    Raises:
        ConfigError: only one of the two settings is set.
    """
    from temporalio.common import VersioningBehavior, WorkerDeploymentVersion
    from temporalio.worker import WorkerDeploymentConfig

    name, build = settings.deployment_name, settings.build_id
    if not name and not build:
        return None
    if not name or not build:
        missing = "HERMES_DEPLOYMENT_NAME" if not name else "HERMES_BUILD_ID"
        raise ConfigError("set both HERMES_DEPLOYMENT_NAME and HERMES_BUILD_ID, or neither", source="environment", key=missing)
    return WorkerDeploymentConfig(
        version=WorkerDeploymentVersion(deployment_name=name, build_id=build),
        use_worker_versioning=True,
        default_versioning_behavior=VersioningBehavior.PINNED,
    )


@dataclass(frozen=True)
class BuildStatus:
    """One build (Worker Deployment Version) of a deployment."""

    build_id: str
    status: str
    """Temporal's version status: ``current``, ``ramping``, ``draining``, ``drained``,
    ``inactive``."""
    drainage: str
    """``draining`` / ``drained`` as the server last checked it (refreshed every few
    minutes, only for a build neither current nor ramping), else ``""``."""
    running: int
    """Workflow runs open on this build now (from visibility: ``TemporalWorkerDeploymentVersion``)."""


def _enum_name(value: int, enum: Any, prefix: str) -> str:
    name = enum.Name(value)
    return "" if name.endswith("UNSPECIFIED") else name.removeprefix(prefix).lower()


async def status(client: Any, deployment_name: str, namespace: str = "default") -> list[BuildStatus]:
    """The builds of ``deployment_name``, oldest first.

    Args:
        client: a connected ``temporalio.client.Client``.
        deployment_name: the Worker Deployment (``HERMES_DEPLOYMENT_NAME``).
        namespace: the Temporal namespace.

    Raises:
        temporalio.service.RPCError: NOT_FOUND when no worker of that deployment has polled yet.
    """
    from temporalio.api.enums.v1 import (
        VersionDrainageStatus,
        WorkerDeploymentVersionStatus,
    )
    from temporalio.api.workflowservice.v1 import DescribeWorkerDeploymentRequest

    reply = await client.workflow_service.describe_worker_deployment(
        DescribeWorkerDeploymentRequest(namespace=namespace, deployment_name=deployment_name)
    )
    builds = []
    for summary in sorted(reply.worker_deployment_info.version_summaries, key=lambda v: v.create_time.ToDatetime()):
        build_id = summary.deployment_version.build_id
        running = await client.count_workflows(
            f"TemporalWorkerDeploymentVersion = '{deployment_name}:{build_id}' AND ExecutionStatus = 'Running'"
        )
        builds.append(
            BuildStatus(
                build_id=build_id,
                status=_enum_name(summary.status, WorkerDeploymentVersionStatus, "WORKER_DEPLOYMENT_VERSION_STATUS_"),
                drainage=_enum_name(summary.drainage_status, VersionDrainageStatus, "VERSION_DRAINAGE_STATUS_"),
                running=running.count,
            )
        )
    return builds


async def set_current(client: Any, deployment_name: str, build_id: str, namespace: str = "default") -> str:
    """Make ``build_id`` the current build of ``deployment_name``: new sessions start on
    it, and running ones move to it at their next continue-as-new.

    Args:
        client: a connected ``temporalio.client.Client``.
        deployment_name: the Worker Deployment (``HERMES_DEPLOYMENT_NAME``).
        build_id: a build whose workers have polled (``HERMES_BUILD_ID`` of the new workers).
        namespace: the Temporal namespace.

    Returns:
        The build that was current before ("" for none).

    Raises:
        temporalio.service.RPCError: the build is unknown or has no pollers (FAILED_PRECONDITION).
    """
    from temporalio.api.workflowservice.v1 import (
        SetWorkerDeploymentCurrentVersionRequest,
    )

    reply = await client.workflow_service.set_worker_deployment_current_version(
        SetWorkerDeploymentCurrentVersionRequest(
            namespace=namespace, deployment_name=deployment_name, build_id=build_id, identity=client.identity
        )
    )
    return reply.previous_deployment_version.build_id
