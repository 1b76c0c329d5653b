"""The sweep driver: a plan (sweeps.plan.planner), pre-flight, then Ray Tune with one trial per group.

Each measurement's row is written to the store by `RowWriter` on the driver the moment its cell ends.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import shutil
import urllib.parse
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime

import ray
from ray import tune

from results.errors import StoreFull
from results.storage import compaction
from results.storage.store import Store
from sweeps.driver import machine
from sweeps.driver.session import raise_if_terminated, ray_session, token_asked
from sweeps.plan import preflight
from sweeps.plan.grid import Group
from sweeps.plan.planner import SweepPlan, claimed
from sweeps.spec.fields import BF16_ON_CPU
from sweeps.spec.sweep import SpecError, SweepSpec
from sweeps.trial.actor import row_context, trial_fn
from sweeps.trial.options import PLANTED_ENVS, TrialOptions
from sweeps.trial.rows import build_row, now
from trainers.errors import ALLOW_WORKLOAD_ENV

ProgressFn = Callable[[dict], None]
log = logging.getLogger(__name__)


@dataclass
class SweepOutcome:
    sweep_id: str
    cluster: str
    results: str
    rows: list[dict] = field(default_factory=list)
    calibrations: int = 0  # groups whose calibration was written
    failures: list[str] = field(default_factory=list)  # why a trial died, or a calibration group's fit failed


def _decode_row(text: str | dict) -> dict:
    row = json.loads(text) if isinstance(text, str) else dict(text)
    for key in ("started_at", "finished_at", "group_started_at", "measured_at"):
        if row.get(key):
            row[key] = datetime.fromisoformat(row[key])
    return row


class RowWriter(tune.Callback):
    """Driver-side: writes each measurement's row to the store as soon as its trial reports it;
    when a trial dies, every slot of its group without a row gets an error row."""

    def __init__(self, store: Store, options: TrialOptions, progress: ProgressFn, groups: list[Group]) -> None:
        self.store, self.options, self.progress, self.groups = store, options, progress, groups
        self.rows: list[dict] = []
        self.calibrations = 0
        self.failures: list[str] = []
        self.full: StoreFull | None = None
        self._done: set[tuple[str, int]] = set()

    def _write(self, row: dict) -> None:
        key = (row["cell_id"], row["repeat"])
        if key in self._done:
            return
        try:
            self.store.write_row(row)
        except StoreFull as e:  # raised on to Tune, which ends the run; _execute raises it again, unwrapped
            self.full = e
            raise
        self._done.add(key)
        self.rows.append(row)
        self.progress(row)

    def on_step_begin(self, iteration, trials, **info):
        raise_if_terminated()  # a SIGTERM whose exception Ray or Tune swallowed ends the loop here

    def on_trial_result(self, iteration, trials, trial, result, **info):
        if "row" in result:
            self._write(_decode_row(result["row"]))
        if "calibration" in result:
            rows = [_decode_row(r) for r in json.loads(result["calibration"])]
            self.store.write_calibration(rows)
            self.calibrations += 1
        if "failure" in result:
            self.failures.append(result["failure"])

    def on_trial_error(self, iteration, trials, trial, **info):
        group = self.groups[trial.config["group"]]
        ctx = row_context(group, self.options, now())
        message = trial_error(trial.error_file)
        self.failures.append(message)
        for slot in group.slots:
            if (slot.cell.cell_id, slot.repeat) not in self._done:
                self._write(build_row(slot, ctx, started=now(), wall_s=0.0, error=message))


def trial_error(path: str | None, chars: int = 2000) -> str:
    """`trial died: <the error's last line>`, then the end of Tune's error file (without its `Failure # 1
    (occurred at …)` header): the first line is what a progress line shows."""
    if not path:
        return "trial died: unknown error"
    try:
        with open(path) as f:
            text = f.read()[-chars:]
    except OSError:
        return f"trial died: {path}"
    lines = [line for line in text.strip().splitlines() if not line.startswith("Failure # ")]
    last = next((line.strip() for line in reversed(lines) if line.strip()), "unknown error")
    if NEVER_RAN in last and token_asked():
        last += f" {TOKEN_HINT}"
    return f"trial died: {last}\n" + "\n".join(lines)


NEVER_RAN = "it was cancelled before it started running"  # Ray's words for an actor that never ran
TOKEN_HINT = (
    "This driver asked the cluster for Ray token auth (RAY_AUTH_MODE=token in its environment), and a cluster "
    "started without auth cancels every trial before it starts: unset RAY_AUTH_MODE for this cluster."
)


def resolve_options(plan: SweepPlan, res: preflight.ClusterResources, storage_path: str) -> TrialOptions:
    spec = plan.spec
    use_gpu = res.total_gpus > 0 if spec.use_gpu == "auto" else bool(spec.use_gpu)
    if use_gpu and res.total_gpus == 0:
        raise SpecError("use_gpu", True, f"false or auto: the cluster has no GPUs ({res.describe()})")
    if spec.backend == "nccl" and not use_gpu:
        raise SpecError("backend", "nccl", f"gloo or auto: NCCL needs GPUs and the cluster has none ({res.describe()})")
    if not use_gpu and "bf16" in spec.comm_hook:
        raise SpecError(f"comm_hook[{spec.comm_hook.index('bf16')}]", "bf16", f"{BF16_ON_CPU} ({res.describe()})")
    backend = spec.backend if spec.backend != "auto" else ("nccl" if use_gpu else "gloo")
    return TrialOptions(
        sweep_id=plan.sweep_id,
        cluster=plan.cluster,
        spec_name=spec.name,
        use_gpu=use_gpu,
        backend=backend,
        cpus_per_worker=spec.cpus_per_worker,
        placement=spec.placement,
        collective_timeout_s=spec.collective_timeout_s,
        cell_timeout_s=spec.cell_timeout_s,
        group_start_timeout_s=spec.group_start_timeout_s,
        env={k: str(v) for k, v in spec.env.items()} | planted(),
        storage_path=storage_path,
        sole_trial=spec.max_concurrent_trials == 1,
        grad_check={True: "first", False: False}.get(spec.grad_check, spec.grad_check),
    )


def planted() -> dict[str, str]:
    """The driver's planted variables (sweeps.trial.options.PLANTED_ENVS), passed on to the workers (rows record them as
    `injected_slowdown`, `injected_corruption` and `injected_jitter`)."""
    passed = (*PLANTED_ENVS, ALLOW_WORKLOAD_ENV)  # and the modules --allow-workload named, for the workers
    return {name: os.environ[name] for name in passed if os.environ.get(name)}


def check_local(plan: SweepPlan) -> None:
    """Pre-flight against the embedded Ray this machine would start (before any Ray process)."""
    import torch

    res = preflight.ClusterResources.local(gpus=torch.cuda.device_count())
    opts = resolve_options(plan, res, "")
    preflight.check(
        plan.cells, res, opts.cpus_per_worker, opts.use_gpu, field=_grid_field(plan.spec), placement=opts.placement
    )


def _storage_path(plan: SweepPlan) -> str:
    """Tune/Train bookkeeping: beside the results on shared storage, else a local temp folder."""
    if plan.store.is_local:
        return machine.storage_dir(plan.sweep_id)
    uri = urllib.parse.urlsplit(plan.store.uri)  # s3://bucket/prefix?endpoint_override=…: the path goes before `?`
    path = f"{uri.path.rstrip('/')}/_ray/{plan.sweep_id}-{secrets.token_hex(3)}"
    return urllib.parse.urlunsplit(uri._replace(path=path))


def execute(
    plan: SweepPlan,
    *,
    address: str | None = None,
    verbose: bool = False,
    progress: ProgressFn = lambda row: None,
    notice: Callable[[str], None] = log.warning,
) -> SweepOutcome:
    """Run the plan's pending pairs on Ray; every row lands in the store as its trial ends. A resumed sweep with
    nothing left to measure starts no Ray: it is compacted (if a stop left row files) and done."""
    if not plan.shapes():
        plan.store.ensure_writable()
        with claimed(plan):
            _compact(plan)
        return SweepOutcome(plan.sweep_id, plan.cluster, plan.store.uri)
    if address or os.environ.get("RAY_ADDRESS") or ray.is_initialized():
        plan.store.ensure_writable()
        return _execute(plan, address, verbose, progress)
    check_local(plan)  # before anything is written: a grid this machine cannot hold leaves no trace
    plan.store.ensure_writable()
    machine.remove_stale_storage()
    if machine.local_ray_cluster_running():
        notice(
            "a Ray cluster started with `ray start` runs on this machine; this sweep starts its own "
            "embedded Ray beside it (pass --address auto to run on that cluster instead)"
        )
    with machine.measuring(plan.sweep_id) as others:
        if others:
            notice(
                f"another sweep is measuring on this machine ({'; '.join(others)}): both will read "
                "each other's contention; wait for it, or compare these rows with care"
            )
        return _execute(plan, address, verbose, progress)


def _execute(plan: SweepPlan, address: str | None, verbose: bool, progress: ProgressFn) -> SweepOutcome:
    outcome = SweepOutcome(plan.sweep_id, plan.cluster, plan.store.uri)
    storage = _storage_path(plan)
    try:
        with claimed(plan), ray_session(address, verbose):
            res = preflight.ClusterResources.from_ray()
            opts = resolve_options(plan, res, storage)
            preflight.check(
                plan.cells,
                res,
                opts.cpus_per_worker,
                opts.use_gpu,
                field=_grid_field(plan.spec),
                placement=opts.placement,
            )
            plan.store.write_manifest(plan.cluster, plan.sweep_id, _manifest(plan, opts))
            writer = RowWriter(plan.store, opts, progress, plan.groups())
            try:
                _tuner(plan, opts, writer, verbose).fit()
                raise_if_terminated()
            except Exception:
                if writer.full is not None:
                    raise writer.full from None  # the store's own error, not Tune's long traceback around it
                raise
            outcome.rows, outcome.calibrations, outcome.failures = writer.rows, writer.calibrations, writer.failures
            _compact(plan)  # under the claim: a --resume of this id cannot add rows meanwhile
    finally:
        if plan.store.is_local:
            shutil.rmtree(storage, ignore_errors=True)  # Tune/Train bookkeeping only; the rows are in the store
    return outcome


def _grid_field(spec: SweepSpec) -> str:
    """The spec field an unplaceable cell is reported under."""
    return "topology" if spec.topology else "workers"


def _compact(plan: SweepPlan) -> None:
    """The finished sweep's row files become one Parquet file; a failure here never fails the sweep (the row
    files stay, and `ddpsweep compact` can be run later)."""
    try:
        compaction.compact_sweep(plan.store, plan.cluster, plan.sweep_id)
    except Exception as e:  # noqa: BLE001 — the rows are safe either way
        log.warning("could not compact sweep %s (its row files stay; run `ddpsweep compact`): %s", plan.sweep_id, e)


def _manifest(plan: SweepPlan, opts: TrialOptions) -> dict:
    return {
        "sweep_id": plan.sweep_id,
        "cluster": plan.cluster,
        "spec": asdict(plan.spec),
        "cells": [c.cell_id for c in plan.cells],
        "repeats": plan.spec.repeats,
        "planned": plan.planned,
        "isolation": plan.spec.isolation,
        "calibrate_only": plan.calibrate_only,
        "backend": opts.backend,
        "use_gpu": opts.use_gpu,
        "written_at": datetime.now(UTC).isoformat(),
    }


def _tuner(plan: SweepPlan, opts: TrialOptions, writer: RowWriter, verbose: bool) -> tune.Tuner:
    if not verbose:
        os.environ["RAY_AIR_NEW_OUTPUT"] = "0"  # Tune's new console output prints even at verbose=0
    trial = tune.with_parameters(trial_fn, groups=writer.groups, options=opts)
    return tune.Tuner(
        tune.with_resources(trial, tune.PlacementGroupFactory([preflight.TRIAL_BUNDLE])),
        param_space={"group": tune.grid_search(list(range(len(writer.groups))))},
        tune_config=tune.TuneConfig(max_concurrent_trials=plan.spec.max_concurrent_trials, reuse_actors=True),
        run_config=tune.RunConfig(
            name=plan.sweep_id,
            storage_path=opts.storage_path,
            callbacks=[writer],
            verbose=1 if verbose else 0,
            failure_config=tune.FailureConfig(max_failures=0),
        ),
    )
