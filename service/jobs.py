"""Remote sweeps through Ray Jobs: submit `ddpsweep run` with this project's code as working_dir, track it.

The job's submission id is the sweep id, so every command takes the sweep id.
"""

from __future__ import annotations

import ipaddress
import os
import shlex
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

from results.storage.store import Store, require_label
from service.workdir import check_workdir
from sweeps.spec.files import parse_spec
from sweeps.spec.sweep import SpecError, SweepSpec, new_sweep_id
from sweeps.trial.options import PLANTED_ENVS
from trainers.errors import ALLOW_WORKLOAD_ENV, ConfigError, DDPSweepError

PROJECT_ROOT = Path(__file__).resolve().parent.parent
SPEC_ENV = "DDPSWEEP_SPEC_YAML"  # the spec travels to the job in its runtime_env
EXCLUDES = [
    ".git",
    ".venv",
    "**/__pycache__",
    ".pytest_cache",
    ".ruff_cache",
    "*.egg-info",
    "build",
    "ddpsweep-results",
    "benchmarks/out",
]


class JobsError(DDPSweepError):
    """Ray Jobs could not be reached, or refused the request."""

    http_status = 503


class SweepNotFound(JobsError):
    """No ddpsweep job with that sweep id on the cluster."""

    http_status = 404


@dataclass(frozen=True)
class SweepStatus:
    sweep_id: str
    job_id: str
    state: str  # Ray Jobs status: PENDING, RUNNING, SUCCEEDED, FAILED, STOPPED
    cluster: str
    results: str
    planned: int
    written: int
    errors: int
    message: str

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def resolve_address(address: str | None) -> str:
    """The job server: the argument, else RAY_API_SERVER_ADDRESS / RAY_ADDRESS, as Ray's own tools read them."""
    found = address or os.environ.get("RAY_API_SERVER_ADDRESS") or os.environ.get("RAY_ADDRESS")
    if not found:
        raise SpecError("--dashboard", None, "the Ray dashboard address, e.g. http://HEAD:8265 (or set RAY_ADDRESS)")
    return found if "://" in found else f"http://{found}"


def is_loopback(address: str) -> bool:
    host = urlparse(address).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


CONNECT_TIMEOUT_S = 5.0  # every call to the job server: to connect …
READ_TIMEOUT_S = 15.0  # … and between two reads of its answer


def client(address: str | None):
    """A Ray JobSubmissionClient whose every request has a timeout (Ray's own has none: a server that accepts
    TCP and never answers would hold the command forever); a timeout or refused connection is a JobsError."""
    import requests
    from ray.job_submission import JobSubmissionClient

    addr = resolve_address(address)

    class TimedClient(JobSubmissionClient):
        def _do_request(self, method: str, endpoint: str, **kwargs):
            kwargs.setdefault("timeout", (CONNECT_TIMEOUT_S, READ_TIMEOUT_S))
            try:
                return super()._do_request(method, endpoint, **kwargs)
            except requests.exceptions.Timeout:
                limits = f"{CONNECT_TIMEOUT_S:g} s to connect / {READ_TIMEOUT_S:g} s to reply"
                raise JobsError(
                    f"the Ray job server at {addr} did not answer within {limits}: "
                    "is --dashboard the dashboard (port 8265)?"
                ) from None
            except requests.exceptions.ConnectionError as e:
                raise JobsError(f"cannot reach the Ray job server at {addr}: {type(e).__name__}") from None

    try:
        return TimedClient(addr)
    except JobsError:
        raise
    except Exception as e:  # noqa: BLE001 — connection errors come in many types
        raise JobsError(f"cannot reach the Ray job server at {addr}: {e}") from None


def check_results_reachable(address: str, results: str) -> None:
    """A remote cluster cannot write into this machine's folders."""
    if "://" not in results and not is_loopback(address):
        allowed = (
            "storage every node and this client can reach (s3://…, gs://…, or a shared mount as "
            "file:///…): a local path on a remote cluster strands the rows"
        )
        raise SpecError("results", results, allowed)


PACKAGES = ("service", "sweeps", "trainers", "results")


def _ours(workload: str) -> bool:
    """Whether a workload lives in ddpsweep's own packages (the shipped examples)."""
    return workload.split(".", 1)[0].split(":", 1)[0] in PACKAGES


def needs_code(spec: SweepSpec) -> bool:
    """The spec names a workload that is not ddpsweep's own: its code must travel with the job."""
    return spec.workload is not None and not _ours(spec.workload)


def submit(
    spec_yaml: str,
    spec: SweepSpec,
    *,
    address: str | None,
    cluster: str | None = None,
    results: str | None = None,
    workdir: str | None = None,
) -> tuple[str, str]:
    """Submit `ddpsweep run` as a Ray Job. Returns (sweep_id, job_id). A spec whose workload is not one of
    ddpsweep's own ships `workdir` (checked first: service.workdir) as the job's working directory; without
    one, such a spec is refused (the caller chooses what to ship: the CLI the user's folder, the server only
    the folder it was started with)."""
    if needs_code(spec) and workdir is None:
        raise ConfigError(
            "workload",
            spec.workload,
            "a workload whose code this submission ships: give --workdir (ddpsweep submit) or start the server "
            "with --workload-dir DIR",
        )
    shipped = None if workdir is None else str(check_workdir(workdir))
    addr = resolve_address(address)
    results = results or spec.results
    cluster = cluster or spec.cluster
    require_label("cluster", cluster)
    check_results_reachable(addr, results)
    if "://" not in results:
        results = str(Path(results).expanduser().resolve())
    sweep_id = new_sweep_id(spec.name)
    entrypoint = shlex.join(
        [
            "python",
            "-m",
            "service.cli",
            "run",
            f"env:{SPEC_ENV}",
            "--results",
            results,
            "--cluster",
            cluster,
            "--sweep",
            sweep_id,
        ]
    )
    runtime_env = {
        "working_dir": str(PROJECT_ROOT),
        "excludes": EXCLUDES,
        # PLANTED_ENVS empty: a job never inherits a benchmark's planted slowdown or corruption from the cluster;
        # the one module it may run a factory from, installed or not, is its spec's workload (the submitter named
        # it, and over HTTP the server's --allow-workload admitted it before this)
        "env_vars": {
            SPEC_ENV: spec_yaml,
            **dict.fromkeys(PLANTED_ENVS, ""),
            ALLOW_WORKLOAD_ENV: spec.workload.partition(":")[0] if spec.workload else "",
            **{k: str(v) for k, v in spec.env.items()},
        },
    }
    if shipped is not None:
        # The workload's code must reach the job and its workers: the user's folder becomes the working
        # directory (importable there, as for `python -m`), and ddpsweep's own packages travel as py_modules.
        runtime_env["working_dir"] = shipped
        runtime_env["py_modules"] = [str(PROJECT_ROOT / p) for p in PACKAGES]
    metadata = {"ddpsweep": "1", "cluster": cluster, "results": results, "spec_name": spec.name}
    try:
        job_id = client(addr).submit_job(
            entrypoint=entrypoint, submission_id=sweep_id, runtime_env=runtime_env, metadata=metadata
        )
    except JobsError:
        raise
    except Exception as e:  # noqa: BLE001
        raise JobsError(f"Ray Jobs refused the submission: {e}") from None
    return sweep_id, job_id


def parse_submission(text: str) -> SweepSpec:
    """Validate a spec given as YAML or JSON text (JSON is YAML), with the same strict loader as files."""
    return parse_spec(text, source="spec")


def _require_id(sweep_id: str) -> str:
    return require_label("sweep_id", sweep_id)


def _counts(cluster: str, sweep_id: str, results: str) -> tuple[int, int, int]:
    """(planned, written, errors) from the results store, where this client can read it."""
    try:
        store = Store.open(results)
        manifest = store.read_manifest(cluster, sweep_id) or {}
        rows = store.read_table(cluster, sweep_id).column("status").to_pylist()
    except Exception:  # noqa: BLE001 — an unreachable store only means unknown counts
        return -1, -1, -1
    return int(manifest.get("planned", 0)), len(rows), rows.count("error")


def _status(info) -> SweepStatus:
    meta = info.metadata or {}
    planned, written, errors = _counts(meta.get("cluster", ""), info.submission_id, meta.get("results", ""))
    return SweepStatus(
        sweep_id=info.submission_id,
        job_id=info.job_id or info.submission_id,
        state=str(info.status.value if hasattr(info.status, "value") else info.status),
        cluster=meta.get("cluster", ""),
        results=meta.get("results", ""),
        planned=planned,
        written=written,
        errors=errors,
        message=info.message or "",
    )


def status(address: str | None, sweep_id: str | None = None) -> list[SweepStatus]:
    """One sweep, or every ddpsweep job the cluster knows, newest first."""
    c = client(address)
    if sweep_id is not None:
        return [_status(_info(c, _require_id(sweep_id)))]
    try:
        listed = c.list_jobs()
    except JobsError:
        raise
    except Exception as e:  # noqa: BLE001
        raise JobsError(f"Ray Jobs could not list jobs: {e}") from None
    jobs = [j for j in listed if (j.metadata or {}).get("ddpsweep") == "1" and j.submission_id]
    return [_status(j) for j in sorted(jobs, key=lambda j: j.start_time or 0, reverse=True)]


def _info(c, sweep_id: str):
    try:
        return c.get_job_info(sweep_id)
    except JobsError:
        raise
    except Exception as e:  # noqa: BLE001 — the SDK raises RuntimeError for unknown ids
        raise SweepNotFound(f"no sweep {sweep_id!r} on this cluster ({e})") from None


def logs(address: str | None, sweep_id: str) -> str:
    c = client(address)
    _info(c, _require_id(sweep_id))
    return c.get_job_logs(sweep_id)


async def follow_logs(address: str | None, sweep_id: str):
    c = client(address)
    _info(c, _require_id(sweep_id))
    async for chunk in c.tail_job_logs(sweep_id):
        yield chunk


def stop(address: str | None, sweep_id: str) -> bool:
    c = client(address)
    _info(c, _require_id(sweep_id))
    return bool(c.stop_job(sweep_id))
