"""`POST /sweeps` and the job server behind it: what a submitted spec may name (the operator's allowlists), the
submission itself, and the cap on requests that wait on the job server."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from service import jobs
from service.errors import ApiError
from sweeps.spec import envvars

if TYPE_CHECKING:
    from service.api import ServiceSettings


def check_workload_allowed(workload: str | None, prefixes: tuple[str, ...]) -> None:
    """A workload is code the cluster will import and run: over HTTP only from the operator's allowlist."""
    if workload is None:
        return
    module = workload.partition(":")[0]
    if any(module == p or module.startswith(p + ".") for p in prefixes):
        return
    allowed = ", ".join(prefixes) if prefixes else "none"
    raise ApiError(
        403,
        "Forbidden",
        f"workload {workload!r}: an import path runs code on the cluster, and this server allows modules under: "
        f"{allowed}. Start it with `ddpsweep serve --allow-workload <module prefix>` to accept it, or submit "
        "with `ddpsweep submit` (the spec is then your own)",
        "workload",
    )


def check_env_allowed(spec, allowed: tuple[str, ...]) -> None:
    """Over HTTP a spec sets tuning variables only (sweeps.spec.envvars): NCCL also reads variables that load a
    library or write a file at a path they name."""
    refused = envvars.refused_over_http(spec.env, spec.env_grid, allowed)
    if refused:
        name = refused[0].partition(".")[2]
        why = envvars.warning(name) or f"{name} is not one of the tuning variables this server accepts"
        raise ApiError(
            403,
            "Forbidden",
            f"{refused[0]}: {why}. Start the server with `ddpsweep serve --allow-env {name}` to accept it, or "
            "submit with `ddpsweep submit` (the spec is then your own)",
            refused[0],
        )


JOB_CALLS = 4  # requests that may wait on the cluster's job server at once; more are a 503 at once


@contextmanager
def job_server_call(gate: threading.BoundedSemaphore) -> Iterator[None]:
    """A request that waits on Ray Jobs (up to service.jobs' timeouts) holds a worker thread meanwhile: at most
    JOB_CALLS do, so a hung job server or a flood of `GET /sweeps` never holds every thread of the server."""
    if not gate.acquire(blocking=False):
        raise ApiError(
            503, "Busy", f"{JOB_CALLS} requests are waiting on the cluster's job server; try again in a moment"
        )
    try:
        yield
    finally:
        gate.release()


def cluster_address(settings: ServiceSettings, what: str) -> str:
    """The Ray cluster's job server address; a 503 where the server was started without one."""
    if not settings.address:
        raise ApiError(
            503,
            "Unavailable",
            f"this server was started without a Ray cluster: it reads results but cannot {what} "
            "(its operator starts it with `ddpsweep serve --dashboard http://HEAD:8265`)",
        )
    return settings.address


def submit_spec(settings: ServiceSettings, text: str, cluster: str | None) -> dict:
    """Validate a submitted spec (422 naming the field), apply the server's allowlists (403), submit it."""
    spec = jobs.parse_submission(text)
    check_workload_allowed(spec.workload, settings.allow_workload)
    check_env_allowed(spec, settings.allow_env)
    address = cluster_address(settings, "submit sweeps")
    workdir = settings.workload_dir if jobs.needs_code(spec) else None
    sweep_id, job_id = jobs.submit(
        text, spec, address=address, cluster=cluster, results=settings.results, workdir=workdir
    )
    return {"sweep_id": sweep_id, "job_id": job_id, "warnings": spec.warnings()}
