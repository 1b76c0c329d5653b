"""Grid expansion and grouping.

A spec becomes a deterministic list of cells (a `StepConfig` plus what places it, with a stable id);
the (cell, repeat) pairs still to measure become groups: the pairs that can share one Ray Train
worker group, laid out in interleaved, shuffled rounds.
"""

from __future__ import annotations

import hashlib
import json
import random
from dataclasses import asdict, dataclass, replace
from itertools import product

from sweeps.spec.sweep import SpecError, SweepSpec
from trainers.config import StepConfig, canonical_args
from trainers.errors import ConfigError
from trainers.knobs import CHANGED, GRID_AXES, KNOBS, SPEC_SETTINGS, USER_WORKLOAD, WORKLOAD


def _digest(data: object, n: int = 12) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:n]


@dataclass(frozen=True, kw_only=True)
class Cell:
    """One point of the grid: the step's configuration plus what places it."""

    step: StepConfig
    """What every rank runs (settings that do not apply to its mode are None/False)."""
    world_size: int
    """DDP ranks (1 for the single baseline)."""
    num_nodes: int
    """Nodes the ranks are spread over, evenly."""
    backend: str
    """As the spec asks: auto | nccl | gloo."""
    env_grid: str = "{}"
    """The cell's `env_grid` values as canonical JSON: variables its worker group starts with (NCCL and gloo
    read them once per process, so each combination is its own group)."""

    @property
    def env_vars(self) -> dict[str, str]:
        return json.loads(self.env_grid)

    @property
    def knob_values(self) -> dict:
        """Every knob of the table (trainers.knobs) by name, as a row stores it."""
        placed = {"world_size": self.world_size, "num_nodes": self.num_nodes, "backend": self.backend}
        return asdict(self.step) | placed | {"env_grid": self.env_grid}

    @property
    def cell_id(self) -> str:
        """Stable hash of the configuration: the same cell always gets the same id.

        The hash is over the flat configuration (every knob of trainers.knobs) as ddpsweep first stored it,
        so ids of stored sweeps stay valid: knobs added since (`hashed: changed`) join it only when they
        differ from their defaults (or read their `off` value: they do not apply), the fingerprint only for user
        workloads (`Knob.hashed`).
        """
        flat = self.knob_values
        for knob in KNOBS:
            value = flat[knob.name]
            unchanged = knob.hashed == CHANGED and (value == knob.default or value == knob.value_off)
            if unchanged or (knob.hashed == USER_WORKLOAD and self.step.workload is None):
                del flat[knob.name]
        if "env_grid" in flat:  # hashed under the name it first had
            flat["env"] = flat.pop("env_grid")
        return _digest(flat)

    @property
    def workers_per_node(self) -> int:
        return self.world_size // self.num_nodes

    @property
    def topology(self) -> str:
        """`<nodes>x<workers per node>`, as specs name it."""
        return f"{self.num_nodes}x{self.workers_per_node}"

    @property
    def group_key(self) -> tuple:
        """What shapes a worker group: cells with the same key can share one (and its template model).
        Baselines always form their own group, also beside DDP cells at world size 1."""
        return (self.step.mode == "single", self.world_size, *self.sweep_key)

    @property
    def sweep_key(self) -> tuple:
        """What `isolation: sweep` groups by: cells with the same key are measured on one worker group of the
        largest placement among them, each on its own ranks (a node count is a worker group of its own)."""
        values = self.knob_values  # the workload knobs of the table: what the model and its batches are
        return (self.num_nodes, self.backend, *(values[k.name] for k in KNOBS if k.scope == WORKLOAD), self.env_grid)


def _timed_steps(spec: SweepSpec) -> dict:
    """The step's timing fields: fixed `timed_steps`, or adaptive (`auto`) in batches of AUTO_BATCH."""
    if spec.timed_steps != "auto":
        return {"timed_steps": spec.timed_steps}
    return {
        "timed_steps": AUTO_BATCH,
        "target_rel_ci": spec.target_rel_ci,
        "max_timed_steps": spec.max_timed_steps,
        "max_cell_s": spec.max_cell_s,
    }


AUTO_BATCH = 10  # adaptive timing: the first batch of timed steps, and every further one


def workload_fields(spec: SweepSpec, run_user_code: bool = True) -> dict:
    """The step fields that say what is measured: a preset, or the workload with its planned fingerprint
    (imported and built here, on the meta device where it allows: trainers.workload.planned_fingerprint).
    Without `run_user_code` (a dry run) a user workload is neither imported nor called: no fingerprint."""
    from trainers import workload  # torch: only where cells are planned, never in the trial actor

    if spec.workload is None:
        fields = {"model": spec.model, "seq_len": spec.seq_len}
    else:
        fields = {"workload": spec.workload, "workload_args": canonical_args(spec.workload_args)}
        if not run_user_code:
            return fields
    try:
        fields["workload_fingerprint"], shapes, _ = workload.planned(StepConfig(**fields))
    except ConfigError as e:
        raise SpecError(e.field, e.value, e.allowed) from None
    if "powersgd" in spec.comm_hook:
        _check_powersgd_ranks(spec, workload.useful_powersgd_rank(shapes))
    return fields


def _check_powersgd_ranks(spec: SweepSpec, useful: int) -> None:
    """A rank at which PowerSGD compresses no gradient of this model measures plain all-reduce under its name."""
    for i, rank in enumerate(spec.powersgd_rank):
        if rank > useful:
            model = spec.workload or spec.model
            raise SpecError(
                f"powersgd_rank[{i}]",
                rank,
                f"at most {useful} for {model}: above it PowerSGD compresses no gradient (a matrix is sent as "
                "rank-r factors only when they are under half its size) and sends them all uncompressed",
            )


def _cell(
    spec: SweepSpec,
    *,
    mode: str,
    gas: int,
    world_size: int = 1,
    num_nodes: int = 1,
    env_grid: str = "{}",
    what: dict,
    **step,
) -> Cell:
    settings = {k.name: getattr(spec, k.name) for k in SPEC_SETTINGS} | what  # a workload's seq_len is its own
    try:
        cfg = StepConfig(**settings, mode=mode, gas=gas, **_timed_steps(spec), **step)
    except ConfigError as e:
        raise SpecError(e.field, e.value, e.allowed) from None
    return Cell(step=cfg, world_size=world_size, num_nodes=num_nodes, backend=spec.backend, env_grid=env_grid)


def env_combinations(spec: SweepSpec) -> list[str]:
    """Every combination of the spec's env_grid, as canonical JSON ("{}" without one)."""
    names = sorted(spec.env_grid)
    return [
        canonical_args(dict(zip(names, values, strict=True))) for values in product(*(spec.env_grid[n] for n in names))
    ]


def _ddp_knobs(spec: SweepSpec) -> list[dict]:
    """The DDP wrapper's axes crossed (trainers.knobs.GRID_AXES: buckets, bucket view, hook and PowerSGD's rank,
    first bucket, DDP's flags). A value crossed where it does not apply (a rank with another hook) normalizes
    away in StepConfig, and expand's dedupe by cell id drops the copy."""
    combos = product(*(getattr(spec, k.name) for k in GRID_AXES))
    return [
        dict(zip((k.name for k in GRID_AXES), values, strict=True)) | {"bucket_cap_mb": float(values[_BUCKET])}
        for values in combos
    ]


_BUCKET = [k.name for k in GRID_AXES].index("bucket_cap_mb")


def expand(spec: SweepSpec, run_user_code: bool = True) -> list[Cell]:
    """Baselines first (one per gas, timing and compile), then the DDP grid; duplicates (e.g. no_sync at gas 1,
    optimize_ddp in eager cells) dropped. `run_user_code` False: a user workload's fingerprint is not computed."""
    what = workload_fields(spec, run_user_code)
    cells = [
        _cell(spec, mode="single", gas=g, what=what, timing=t, compile=c)
        for g, t, c in product(sorted(spec.gas), spec.timing, spec.compile)
    ]
    knobs = _ddp_knobs(spec)
    for (w, n), env, mode, g, ns, t, c in product(
        spec.placements(), env_combinations(spec), spec.modes, spec.gas, spec.no_sync, spec.timing, spec.compile
    ):
        for k in knobs if mode == "ddp" else knobs[:1]:
            place = {"world_size": w, "num_nodes": n, "env_grid": env}
            cells.append(_cell(spec, mode=mode, gas=g, no_sync=ns, what=what, timing=t, compile=c, **place, **k))
    seen: dict[str, Cell] = {}
    for c in cells:
        seen.setdefault(c.cell_id, c)
    return list(seen.values())


@dataclass(frozen=True, kw_only=True)
class Slot:
    """One planned measurement: a (cell, repeat) pair at its place in its group's rounds."""

    cell: Cell
    repeat: int
    round: int  # = repeat: round r measures every pending cell of the group once
    order_in_round: int


@dataclass(frozen=True, kw_only=True)
class Group:
    """Pairs measured one after another on one worker group (one TorchTrainer)."""

    group_id: str
    isolation: str  # sweep | group | cell
    order_seed: int  # seeds the shuffle of every round
    slots: tuple[Slot, ...]
    calibrate: bool = False  # an all-reduce sweep on the group's ranks before its first cell
    shape: Cell | None = None  # the cell that shapes the worker group (default: the first slot's)
    rule: dict | None = None  # racing.Rule as a dict: the trial decides each next round (None: as planned)
    prior: tuple[dict, ...] = ()  # --resume of a decided sweep: the ok rows its rounds already stored (evidence)

    @property
    def first(self) -> Cell:
        """The cell that shapes the worker group and seeds its template model and control probe."""
        return self.shape or self.slots[0].cell

    def rest_after(self, done: set[tuple[str, int]]) -> Group | None:
        """A fresh group for the slots not in `done` (a re-plan after the group died), or None."""
        left = tuple(s for s in self.slots if (s.cell.cell_id, s.repeat) not in done)
        return replace(self, group_id=f"{self.group_id}-replan", slots=left) if left else None


def _rounds(pairs: list[tuple[Cell, int]], seed: int) -> list[Slot]:
    """Round r holds the pairs of repeat r, shuffled with Random(seed + r). No cell runs twice in a row:
    where a round would start with the cell that ended the previous one, that cell swaps with the next."""
    slots: list[Slot] = []
    for r in sorted({rep for _, rep in pairs}):
        cells = [c for c, rep in pairs if rep == r]
        random.Random(seed + r).shuffle(cells)
        if slots and len(cells) > 1 and cells[0] == slots[-1].cell:
            cells[0], cells[1] = cells[1], cells[0]
        slots += [Slot(cell=c, repeat=r, round=r, order_in_round=i) for i, c in enumerate(cells)]
    return slots


def host_cell(cells: list[Cell]) -> Cell:
    """The worker group that can place every one of `cells` (one node count): as many nodes, and on each as
    many ranks as the widest cell; shaped like the widest DDP cell (its model, backend, environment)."""
    widest = max(cells, key=lambda c: (c.step.mode != "single", c.workers_per_node))
    per_node = max(c.workers_per_node for c in cells)
    return replace(widest, world_size=widest.num_nodes * per_node)


def plan_groups(
    pairs: list[tuple[Cell, int]], *, sweep_id: str, isolation: str = "group", calibrate: bool = False
) -> list[Group]:
    """The pairs as groups: one per node count and environment (`sweep`: every cell on its own ranks of the
    largest placement), one per worker-group shape (`group`), or one per pair (`cell`). With `calibrate`,
    every multi-rank group (the first of each shape under `cell`) starts with a calibration."""
    by_key: dict[tuple, list[tuple[Cell, int]]] = {}
    for cell, repeat in pairs:
        by_key.setdefault(cell.sweep_key if isolation == "sweep" else cell.group_key, []).append((cell, repeat))
    groups = []
    for key, members in by_key.items():
        key_id = _digest([sweep_id, list(key)], 8)
        seed = int(key_id, 16)
        slots = _rounds(members, seed)
        host = host_cell([c for c, _ in members]) if isolation == "sweep" else members[0][0]
        cal = calibrate and host.world_size > 1
        if isolation in ("group", "sweep"):
            groups.append(
                Group(
                    group_id=key_id,
                    isolation=isolation,
                    order_seed=seed,
                    slots=tuple(slots),
                    calibrate=cal,
                    shape=host if isolation == "sweep" else None,
                )
            )
        else:
            groups += [
                Group(
                    group_id=f"{key_id}-{i}", isolation=isolation, order_seed=seed, slots=(s,), calibrate=cal and i == 0
                )
                for i, s in enumerate(slots)
            ]
    return groups


def calibration_groups(cells: list[Cell], *, sweep_id: str) -> list[Group]:
    """`ddpsweep calibrate`: one group per multi-rank worker-group shape, calibration only (no cells)."""
    shapes: dict[tuple, Cell] = {}
    for cell in cells:
        if cell.world_size > 1:
            shapes.setdefault(cell.group_key, cell)
    return [
        Group(
            group_id=_digest([sweep_id, list(key)], 8),
            isolation="group",
            order_seed=0,
            slots=(),
            calibrate=True,
            shape=cell,
        )
        for key, cell in shapes.items()
    ]
