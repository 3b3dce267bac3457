"""``hermes deploy``: rolling deploys with Worker Versioning (:mod:`hermes.infra.deploy`).

``status`` lists the builds of ``HERMES_DEPLOYMENT_NAME``; ``set-current BUILD`` makes
BUILD the one new sessions start on (running ones move to it at continue-as-new).
"""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Annotated, Any

import typer

from hermes.cli.errors import EXIT_REFUSED, CliError, fail
from hermes.cli.output import out, print_table
from hermes.cli.root import HermesTyper, JsonOption, app
from hermes.cli.running import connect, load_settings, run_command

__all__ = ["deploy_app"]

deploy_app = HermesTyper(
    help="Rolling deploys (Worker Versioning, HERMES_DEPLOYMENT_NAME / HERMES_BUILD_ID): status, set-current.",
    no_args_is_help=True,
)
app.add_typer(deploy_app, name="deploy")
DeploymentOption = Annotated[
    str | None,
    typer.Option("--deployment", help="The Worker Deployment (default: HERMES_DEPLOYMENT_NAME)."),
]


def _deployment(name: str | None) -> str:
    settings = load_settings()
    name = name or settings.deployment_name
    if not name:
        raise fail("no deployment: set HERMES_DEPLOYMENT_NAME or pass --deployment", EXIT_REFUSED)
    return name


async def _call(rpc: Any, deployment: str) -> Any:
    """``await rpc``; a deployment or build Temporal does not know is a one-line refusal."""
    from temporalio.service import RPCError, RPCStatusCode

    try:
        return await rpc
    except RPCError as err:
        if err.status in (RPCStatusCode.NOT_FOUND, RPCStatusCode.FAILED_PRECONDITION, RPCStatusCode.INVALID_ARGUMENT):
            raise CliError(f"deployment {deployment!r}: {err.message}", EXIT_REFUSED) from None
        raise


@deploy_app.command("status")
def deploy_status(deployment: DeploymentOption = None, as_json: JsonOption = False) -> None:
    """The deployment's builds, oldest first: status (current, ramping, draining, drained,
    inactive), drainage as Temporal last checked it, and the workflow runs open on each."""
    from hermes.infra import deploy

    name = _deployment(deployment)
    settings = load_settings()

    async def main() -> list[deploy.BuildStatus]:
        hermes = await connect(settings)
        return await _call(deploy.status(hermes.client, name, settings.temporal_namespace), name)

    builds = run_command(main, settings)
    if as_json:
        typer.echo(json.dumps([asdict(b) for b in builds], indent=2))
        return
    print_table(
        ("build", "status", "drainage", "open runs"),
        ((b.build_id, b.status, b.drainage or "-", str(b.running)) for b in builds),
        title=f"deployment {name}",
    )


@deploy_app.command("set-current")
def deploy_set_current(
    build_id: Annotated[str, typer.Argument(help="The build (HERMES_BUILD_ID of workers that are polling).")],
    deployment: DeploymentOption = None,
) -> None:
    """Make BUILD current: new sessions start on it, and running ones move to it when they
    next continue as new; the previous build drains."""
    from hermes.infra import deploy

    name = _deployment(deployment)
    settings = load_settings()

    async def main() -> str:
        hermes = await connect(settings)
        return await _call(deploy.set_current(hermes.client, name, build_id, settings.temporal_namespace), name)

    previous = run_command(main, settings)
    out.print(f"{name}: current build {build_id} (was {previous or 'none'})")
