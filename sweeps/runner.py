"""The sweep driver: plan (expand, resume, group), pre-flight, then Ray Tune with one trial per group.

Each measurement's row is written to the store by `RowWriter` on the driver the moment its cell ends.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import shutil
import time
import urllib.parse
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime

import ray
from ray import tune

from results import compaction
from results.errors import StoreFull, StoreNotFound
from results.lease import LeaseHeld, lease
from results.racing import Rule
from results.store import Store, require_label
from sweeps import machine, modelsearch, preflight
from sweeps.grid import Cell, Group, calibration_groups, expand, plan_groups
from sweeps.options import PLANTED_ENVS, TrialOptions
from sweeps.rows import build_row, now
from sweeps.session import ray_session
from sweeps.spec import BF16_ON_CPU, SpecError, SweepSpec, new_sweep_id
from sweeps.trial import row_context, trial_fn

ProgressFn = Callable[[dict], None]
log = logging.getLogger(__name__)


@dataclass
class SweepPlan:
    """What a run will measure: the cells, and which (cell, repeat) pairs still lack an ok row."""

    spec: SweepSpec
    sweep_id: str
    cluster: str
    store: Store
    cells: list[Cell]
    todo: list[tuple[Cell, int]]
    calibrate_only: bool = False  # `ddpsweep calibrate`: the groups' calibrations, no cells
    resumed: bool = False  # --resume: todo is what the stored sweep lacks
    choice: modelsearch.Choice | None = None  # search: model — the cells the model chose (`cells` are those)

    @property
    def planned(self) -> int:
        return 0 if self.calibrate_only else len(self.cells) * self.spec.rounds

    def shapes(self) -> list[Group]:
        """The pending pairs as worker groups (re-formed from what is missing on --resume), without their
        decision rule: what to count or show."""
        if self.calibrate_only:
            return calibration_groups(self.cells, sweep_id=self.sweep_id)
        spec = self.spec
        return plan_groups(self.todo, sweep_id=self.sweep_id, isolation=spec.isolation, calibrate=spec.calibrate)

    def groups(self) -> list[Group]:
        """The groups to launch, each with the rule that decides its rounds: called once, as Tune starts, so
        max_sweep_s counts from the sweep's start. A resumed decided sweep gives each group the rows its
        rounds already stored, so its looks weigh every round, not only the resumed ones."""
        rule = asdict(self.rule()) if self.spec.decides and not self.calibrate_only else None
        if rule is None:
            return self.shapes()
        stored = self._stored_ok() if self.resumed else []
        groups = []
        for g in self.shapes():
            mine = {s.cell.cell_id for s in g.slots}
            chosen = None if self.choice is None else {k: v for k, v in self.choice.chosen.items() if k in mine}
            groups.append(replace(g, rule=rule, prior=tuple(r for r in stored if r["cell_id"] in mine), chosen=chosen))
        return groups

    def _stored_ok(self) -> list[dict]:
        rows = self.store.read_table(self.cluster, self.sweep_id).to_pylist()
        return [r for r in rows if r["status"] == "ok"]

    def rule(self) -> Rule:
        """How the groups decide between rounds; max_sweep_s counts from now (the sweep's start)."""
        s = self.spec
        deadline = None if s.max_sweep_s is None else time.time() + s.max_sweep_s
        return Rule(
            race=s.search in ("race", "model"),
            auto=s.repeats == "auto",
            min_rounds=s.min_rounds,
            max_rounds=s.rounds,
            tolerance=s.tolerance,
            target_rel=s.target_rel,
            deadline=deadline,
        )


@dataclass
class SweepOutcome:
    sweep_id: str
    cluster: str
    results: str
    rows: list[dict] = field(default_factory=list)
    calibrations: int = 0  # groups whose calibration was written


def plan_sweep(
    spec: SweepSpec,
    *,
    results: str | None = None,
    cluster: str | None = None,
    resume: str | None = None,
    sweep_id: str | None = None,
    calibrate_only: bool = False,
    address: str | None = None,
) -> SweepPlan:
    """Expand the grid (with `search: model`, the cells the model chose); with `resume`, keep only pairs with
    no ok row in that sweep. `address`: the cluster where search: model profiles a workload it has no profile
    of."""
    store = Store.open(results or spec.results)
    cluster = cluster or spec.cluster
    cells = expand(spec)
    require_label("--cluster", cluster)
    if resume is None:
        if sweep_id is not None:
            require_label("--sweep", sweep_id)
        plan = SweepPlan(spec, sweep_id or new_sweep_id(spec.name), cluster, store, cells, [])
    else:
        plan = SweepPlan(spec, require_label("--resume", resume), cluster, store, cells, [], resumed=True)
    plan.calibrate_only = calibrate_only
    if spec.search == "model" and not calibrate_only:
        plan.choice = _model_choice(plan, resume, address)
        plan.cells = [c for c in cells if c.cell_id in plan.choice.chosen]
    # a generated id is new by construction: a dry run never touches the store (it may be unreachable from here)
    fresh = resume is None and sweep_id is None
    plan.todo = [(c, r) for c in cells for r in range(spec.rounds)] if fresh else pending(plan)
    return plan


def _model_choice(plan: SweepPlan, resume: str | None, address: str | None) -> modelsearch.Choice:
    """The model's choice: made now for a new sweep, the one the sweep started with for --resume."""
    if resume is None:
        return modelsearch.choose(plan.spec, plan.cells, plan.store, plan.cluster, address)
    stored = (plan.store.read_manifest(plan.cluster, resume) or {}).get("model_search")
    if stored is None:
        raise SpecError("--resume", resume, "a sweep started with search: model (its manifest has no choice)")
    return modelsearch.Choice(**stored)


def pending(plan: SweepPlan) -> list[tuple[Cell, int]]:
    """The (cell, repeat) pairs still to measure: every pair of a new sweep (whose id must be unused), the
    pairs without an ok row of a resumed one (whose grid must be the one it was started with)."""
    store, cluster, sweep_id = plan.store, plan.cluster, plan.sweep_id
    pairs = [(c, r) for c in plan.cells for r in range(plan.spec.rounds)]
    if not plan.resumed:
        if store.read_manifest(cluster, sweep_id) or sweep_id in store.labels().get(cluster, []):
            raise SpecError(
                "--sweep",
                sweep_id,
                f"a new id: that sweep exists under cluster={cluster} "
                f"(continue it with --resume {sweep_id}; its rows are never overwritten)",
            )
        return pairs
    manifest = store.read_manifest(cluster, sweep_id)
    if manifest is None:
        raise SpecError("--resume", sweep_id, f"a sweep id under cluster={cluster} in {store.uri}")
    if sorted(manifest["cells"]) != sorted(c.cell_id for c in plan.cells):
        raise SpecError("--resume", sweep_id, "the same spec the sweep was started with (its grid differs)")
    _same_measurement(manifest.get("spec") or {}, plan.spec, sweep_id)
    stored = store.read_table(cluster, sweep_id).to_pylist()
    done = {(r["cell_id"], r["repeat"]) for r in stored if r["status"] == "ok"}
    dropped = {r["cell_id"] for r in stored if r.get("eliminated_at_round") is not None}  # a race's decision stands
    return [(c, r) for c, r in pairs if (c.cell_id, r) not in done and c.cell_id not in dropped]


# What a resumed sweep may change: where rows go and how long to wait; everything else shapes what is measured
RESUMABLE = {"results", "cell_timeout_s", "group_start_timeout_s", "collective_timeout_s", "max_sweep_s"}


def _same_measurement(stored: dict, spec: SweepSpec, sweep_id: str) -> None:
    """Refuse a resume whose spec measures differently from the one the sweep started with (rounds, search,
    isolation, …: its rows would mix two methods), naming the first field that differs."""
    now = asdict(spec)
    for name in sorted(set(stored) | set(now)):
        if name in RESUMABLE or name not in stored:  # a field newer than the manifest: its default then
            continue
        if json.dumps(stored[name], sort_keys=True) != json.dumps(now.get(name), sort_keys=True, default=str):
            raise SpecError(
                name,
                now.get(name),
                f"{stored[name]!r}, as sweep {sweep_id} was started (--resume continues the same measurement; "
                "start a new sweep to measure differently)",
            )


CLAIM = "_claim.lock"  # in the sweep's folder: held by the one run measuring it (results.lease)


@contextmanager
def claimed(plan: SweepPlan) -> Iterator[None]:
    """Hold the sweep's claim while it runs, taken atomically before Ray starts (local disk: flock; object
    stores: a lease object, see results.lease): a second run of the same id (two `--sweep X`, two
    `--resume X`) is refused with the first's pid and host. Under the claim the pending pairs are worked out
    again, so a run that waited behind another measures only what that one left."""
    field = "--resume" if plan.resumed else "--sweep"
    folder = plan.store.sweep_dir(plan.cluster, plan.sweep_id)
    held = lease(plan.store.fs, folder, CLAIM, purpose="measuring", what=f"sweep {plan.sweep_id}", ttl_s=60)
    try:
        held.__enter__()
    except LeaseHeld as e:
        raise SpecError(field, plan.sweep_id, f"an id no other run is measuring now: {e}") from None
    except OSError as e:
        raise StoreNotFound(f"--results {plan.store.uri!r}: cannot write there ({str(e)[:200]})") from None
    try:
        plan.todo = pending(plan)
        yield
    finally:
        if plan.store.is_local and plan.store.read_manifest(plan.cluster, plan.sweep_id) is None:
            _remove_trace(folder)  # nothing measured (e.g. refused by the pre-flight): leave no trace
        held.__exit__(None, None, None)


def _remove_trace(folder: str) -> None:
    """Remove the claim of a sweep that wrote nothing, and its folders if they are empty now."""
    with contextlib.suppress(OSError):
        os.remove(f"{folder}/{CLAIM}")
    for path in (folder, os.path.dirname(folder)):
        with contextlib.suppress(OSError):
            os.rmdir(path)  # only if empty


def _decode_row(text: str | dict) -> dict:
    row = json.loads(text) if isinstance(text, str) else dict(text)
    for key in ("started_at", "finished_at", "group_started_at", "measured_at"):
        if row.get(key):
            row[key] = datetime.fromisoformat(row[key])
    return row


class RowWriter(tune.Callback):
    """Driver-side: writes each measurement's row to the store as soon as its trial reports it;
    when a trial dies, every slot of its group without a row gets an error row."""

    def __init__(self, store: Store, options: TrialOptions, progress: ProgressFn) -> None:
        self.store, self.options, self.progress = store, options, progress
        self.rows: list[dict] = []
        self.calibrations = 0
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

    def on_trial_result(self, iteration, trials, trial, result, **info):
        if "row" in result:
            self._write(_decode_row(result["row"]))
        if "calibration" in result:
            rows = [_decode_row(r) for r in json.loads(result["calibration"])]
            self.store.write_calibration(rows)
            self.calibrations += 1

    def on_trial_error(self, iteration, trials, trial, **info):
        group = Group.from_dict(trial.config["group"])
        ctx = row_context(group, self.options, now())
        message = f"trial died: {trial.error_file and _tail(trial.error_file) or 'unknown error'}"
        for slot in group.slots:
            if (slot.cell.cell_id, slot.repeat) not in self._done:
                self._write(build_row(slot, ctx, started=now(), wall_s=0.0, error=message))


def _tail(path: str, chars: int = 2000) -> str:
    try:
        with open(path) as f:
            return f.read()[-chars:]
    except OSError:
        return path


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
        grad_check=spec.grad_check,
    )


def planted() -> dict[str, str]:
    """The driver's DDPSWEEP_SLOWDOWN and DDPSWEEP_CORRUPT, passed on to the workers (rows record them as
    `injected_slowdown` and `injected_corruption`)."""
    return {name: os.environ[name] for name in PLANTED_ENVS if os.environ.get(name)}


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
            writer = RowWriter(plan.store, opts, progress)
            try:
                _tuner(plan, opts, writer, verbose).fit()
            except Exception:
                if writer.full is not None:
                    raise writer.full from None  # not Tune's wrapping of it (137 lines before)
                raise
            outcome.rows, outcome.calibrations = writer.rows, writer.calibrations
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
        "model_search": None if plan.choice is None else plan.choice.to_dict(),
        "backend": opts.backend,
        "use_gpu": opts.use_gpu,
        "written_at": datetime.now(UTC).isoformat(),
    }


def _tuner(plan: SweepPlan, opts: TrialOptions, writer: RowWriter, verbose: bool) -> tune.Tuner:
    if not verbose:
        os.environ["RAY_AIR_NEW_OUTPUT"] = "0"  # Tune's new console output prints even at verbose=0
    groups = [g.to_dict() for g in plan.groups()]
    return tune.Tuner(
        tune.with_resources(trial_fn, tune.PlacementGroupFactory([preflight.TRIAL_BUNDLE])),
        param_space={"group": tune.grid_search(groups), "options": asdict(opts)},
        tune_config=tune.TuneConfig(max_concurrent_trials=plan.spec.max_concurrent_trials, reuse_actors=True),
        run_config=tune.RunConfig(
            name=plan.sweep_id,
            storage_path=opts.storage_path,
            callbacks=[writer],
            verbose=1 if verbose else 0,
            failure_config=tune.FailureConfig(max_failures=0),
        ),
    )
