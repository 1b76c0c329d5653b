"""The `ddpsweep` commands that talk to a Ray cluster's job server, and the HTTP API: submit, status, logs,
stop, serve. Registered on the one app by `service.cli`."""

from __future__ import annotations

import os
from typing import Annotated

import typer

from service.cli_common import DEFAULT_RESULTS, DashboardOpt, ResultsOpt, echo, fail


def submit(
    spec: Annotated[str, typer.Argument(help="YAML sweep spec")],
    dashboard: DashboardOpt = None,
    cluster: Annotated[str | None, typer.Option(help="cluster label for the rows; default: the spec's")] = None,
    results: Annotated[str | None, typer.Option(help="results root every node can reach; default: the spec's")] = None,
    workdir: Annotated[
        str | None,
        typer.Option(help="folder holding your workload's code, shipped to the cluster (default: the current one)"),
    ] = None,
) -> None:
    """Submit a sweep to a Ray cluster as a Ray Job (validated here first; nothing submitted on error). A spec
    naming your own workload ships --workdir (default: the current directory) with the job."""
    from service import jobs
    from sweeps.spec.files import load_spec_text

    parsed, text = load_spec_text(spec)  # the text submitted is the text validated (env:NAME included)
    if workdir is None and jobs.needs_code(parsed):
        workdir = os.getcwd()  # the user's own folder, checked before anything is packaged
    sweep_id, job_id = jobs.submit(text, parsed, address=dashboard, cluster=cluster, results=results, workdir=workdir)
    echo(f"sweep {sweep_id} submitted as job {job_id}")


def status(
    sweep_id: Annotated[str | None, typer.Argument(help="one sweep (default: all)")] = None,
    dashboard: DashboardOpt = None,
) -> None:
    """Each sweep on the cluster (or one): its job state, cells written / planned, errors, where its rows go."""
    from service import jobs

    found = jobs.status(dashboard, sweep_id)
    if not found:
        echo("no sweeps on this cluster")
    for s in found:
        echo(
            f"{s.sweep_id}  {s.state:<9}  cells {s.written}/{s.planned}  errors {s.errors}  "
            f"cluster={s.cluster}  {s.results}"
        )


def logs(
    sweep_id: Annotated[str, typer.Argument(help="the sweep id")],
    dashboard: DashboardOpt = None,
    follow: Annotated[bool, typer.Option("--follow", "-f", help="stream until the job ends")] = False,
) -> None:
    """The sweep job's output (progress lines, the summary, errors); --follow streams it until the job ends."""
    import asyncio

    from service import jobs

    if not follow:
        echo(jobs.logs(dashboard, sweep_id), nl=False)
        return

    from service.progress import LogProgress

    async def stream(out: LogProgress) -> None:
        async for chunk in jobs.follow_logs(dashboard, sweep_id):
            out.feed(chunk)

    with LogProgress() as out:
        asyncio.run(stream(out))


def stop(
    sweep_id: Annotated[str, typer.Argument(help="the sweep id")],
    dashboard: DashboardOpt = None,
) -> None:
    """Stop a running sweep (rows already written stay)."""
    from service import jobs

    stopped = jobs.stop(dashboard, sweep_id)
    echo(f"sweep {sweep_id}: {'stop requested' if stopped else 'was not running'}")


def serve(
    host: Annotated[str, typer.Option(help="interface to bind")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="TCP port", min=1, max=65535)] = 8000,
    dashboard: DashboardOpt = None,
    results: ResultsOpt = DEFAULT_RESULTS,
    token: Annotated[str | None, typer.Option(help="bearer token for mutating endpoints (or DDPSWEEP_TOKEN)")] = None,
    allow_host: Annotated[
        list[str], typer.Option("--allow-host", help="another Host name to serve on loopback (e.g. behind a proxy)")
    ] = [],  # noqa: B006 — typer's list default
    allow_workload: Annotated[
        list[str],
        typer.Option("--allow-workload", help="module prefix whose workloads POST /sweeps may name (e.g. acme.models)"),
    ] = [],  # noqa: B006 — typer's list default
    allow_env: Annotated[
        list[str],
        typer.Option(
            "--allow-env", help="a variable POST /sweeps may set beyond the tuning ones (e.g. NCCL_TOPO_FILE)"
        ),
    ] = [],  # noqa: B006 — typer's list default
    workload_dir: Annotated[
        str | None,
        typer.Option(
            "--workload-dir", help="the folder shipped with sweeps naming an allowed workload (never the cwd)"
        ),
    ] = None,
    max_rows: Annotated[
        int, typer.Option("--max-rows", min=1, help="rows kept in memory (about 2 KB each); more is a 413")
    ] = 5_000_000,
) -> None:
    """The HTTP API and dashboard over a results store (OpenAPI at /openapi.json, docs at /docs). On loopback
    only requests for 127.0.0.1, localhost or ::1 (and --allow-host names) are served: a DNS-rebinding page
    cannot read the token-free endpoints."""
    import os

    import uvicorn

    from service.api import ServiceSettings, create_app
    from service.httpserver import config
    from service.jobs import is_loopback

    token = token or os.environ.get("DDPSWEEP_TOKEN")
    if not token and not is_loopback(f"http://{host}"):
        raise fail(f"--host {host} is not loopback: set --token or DDPSWEEP_TOKEN before exposing the API")
    if not token:
        import secrets

        token = secrets.token_urlsafe(24)
        echo(f"no token given: this server's bearer token is {token}", err=True)
    loopback = is_loopback(f"http://{host}")
    hosts = ("127.0.0.1", "localhost", "[::1]", "::1") if loopback else None  # beyond loopback: the token guards
    hosts = (*hosts, *allow_host) if hosts is not None else None
    settings = ServiceSettings(
        address=dashboard,
        results=results,
        token=token,
        public_reads=loopback,
        allowed_hosts=hosts,
        allow_workload=tuple(allow_workload),
        allow_env=tuple(allow_env),
        workload_dir=_workload_dir(workload_dir),
        max_rows=max_rows,
    )
    uvicorn.Server(config(create_app(settings), host, port)).run()


def _workload_dir(path: str | None) -> str | None:
    """--workload-dir, checked once at start (links that leave it, loops, size): one line and exit 2 otherwise."""
    from service.workdir import check_workdir

    return None if path is None else str(check_workdir(path, what="--workload-dir"))


COMMANDS = (submit, status, logs, stop, serve)
