"""A sweep's plan: the grid expanded, the pairs still to measure (a resumed sweep's must match the grid and
method it started with), and the claim one run holds on a sweep id while it measures it. sweeps.driver.runner
executes a plan.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace

from results.analysis.racing import Rule
from results.errors import StoreNotFound
from results.storage.lease import LeaseHeld, lease
from results.storage.store import Store, require_label
from sweeps.plan.grid import Cell, Group, calibration_groups, expand, plan_groups
from sweeps.spec.sweep import SpecError, SweepSpec, new_sweep_id


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
            groups.append(replace(g, rule=rule, prior=tuple(r for r in stored if r["cell_id"] in mine)))
        return groups

    def _stored_ok(self) -> list[dict]:
        rows = self.store.read_table(self.cluster, self.sweep_id).to_pylist()
        return [r for r in rows if r["status"] == "ok"]

    def rule(self) -> Rule:
        """How the groups decide between rounds; max_sweep_s counts from now (the sweep's start)."""
        s = self.spec
        deadline = None if s.max_sweep_s is None else time.time() + s.max_sweep_s
        return Rule(
            race=s.search == "race",
            auto=s.repeats == "auto",
            min_rounds=s.min_rounds,
            max_rounds=s.rounds,
            tolerance=s.tolerance,
            target_rel=s.target_rel,
            deadline=deadline,
        )


def plan_sweep(
    spec: SweepSpec,
    *,
    results: str | None = None,
    cluster: str | None = None,
    resume: str | None = None,
    sweep_id: str | None = None,
    calibrate_only: bool = False,
    dry_run: bool = False,
) -> SweepPlan:
    """Expand the grid; with `resume`, keep only pairs with no ok row in that sweep. `dry_run`: no user code
    runs (a user workload is not imported, fingerprinted or profiled), so a spec someone sent can be looked at
    safely."""
    store = Store.open(results or spec.results)
    cluster = cluster or spec.cluster
    cells = expand(spec, run_user_code=not dry_run)
    require_label("--cluster", cluster)
    if resume is None:
        if sweep_id is not None:
            require_label("--sweep", sweep_id)
        plan = SweepPlan(spec, sweep_id or new_sweep_id(spec.name), cluster, store, cells, [])
    else:
        plan = SweepPlan(spec, require_label("--resume", resume), cluster, store, cells, [], resumed=True)
    plan.calibrate_only = calibrate_only
    # a generated id is new by construction: a dry run never touches the store (it may be unreachable from here)
    fresh = resume is None and sweep_id is None
    plan.todo = [(c, r) for c in cells for r in range(spec.rounds)] if fresh else pending(plan)
    return plan


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
        if _normal(stored[name]) != _normal(json.loads(json.dumps(now.get(name), default=str))):
            raise SpecError(
                name,
                now.get(name),
                f"{stored[name]!r}, as sweep {sweep_id} was started (--resume continues the same measurement; "
                "start a new sweep to measure differently)",
            )


def _normal(value: object) -> object:
    """A spec value as compared across a resume: numbers by value (1 and 1.0 are one bucket size), booleans apart
    from numbers, lists in order, mappings by key."""
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return (type(value).__name__, value)
    if isinstance(value, int | float):
        return ("number", float(value))
    if isinstance(value, list | tuple):
        return tuple(_normal(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((str(k), _normal(v)) for k, v in value.items()))
    return ("other", str(value))


CLAIM = "_claim.lock"  # in the sweep's folder: held by the one run measuring it (results.storage.lease)


@contextmanager
def claimed(plan: SweepPlan) -> Iterator[None]:
    """Hold the sweep's claim while it runs, taken atomically before Ray starts (local disk: flock; object
    stores: a lease object, see results.storage.lease): a second run of the same id (two `--sweep X`, two
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
