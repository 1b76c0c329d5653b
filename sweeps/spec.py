"""The sweep spec: a mapping (a YAML file read by sweeps.specfile), validated strictly into a `SweepSpec`.

Every error is a `SpecError` naming the field's dotted path and what is allowed. The rules of single fields
are in `sweeps.speccheck`; the checks across fields are here, beside the dataclass they read.
"""

from __future__ import annotations

import math
import secrets
from dataclasses import dataclass, field, fields, make_dataclass
from datetime import UTC, datetime
from typing import Any

from sweeps.speccheck import (
    BACKENDS,
    BF16_ON_CPU,
    ISOLATIONS,
    LISTS,
    MAX_AXIS_VALUES,
    MAX_MEASUREMENTS,
    PLACEMENTS,
    RANGES,
    SCALARS,
    SpecError,
    check_choice,
    check_list,
    check_range,
    check_scalar,
    fail,
    is_int,
    is_num,
    parse_topology,
    validate_env,
    validate_env_grid,
    validate_results,
    validate_topology,
)
from trainers.config import StepConfig, canonical_args
from trainers.errors import ConfigError
from trainers.knobs import GRID_AXES, KNOBS, OPTIMIZE_DDP, SPEC_AXES, SPEC_SETTINGS, Knob, check
from trainers.presets import PRESETS


def _knob_field(knob: Knob, axis: bool) -> tuple[str, Any, Any]:
    """A spec field for a knob of the table: a list of values (an axis) or one value (a setting)."""
    meta = {"doc": ("Grid: " if axis else "") + knob.doc, "knob": knob}
    if axis:
        return knob.name, Any, field(default_factory=lambda: [knob.default], metadata=meta)
    return knob.name, Any, field(default=knob.default, metadata=meta)


# The knobs' fields of the spec (trainers.knobs: every `axis` a list, every `setting` one value)
_SpecKnobs = make_dataclass(
    "_SpecKnobs",
    [_knob_field(k, True) for k in SPEC_AXES] + [_knob_field(k, False) for k in SPEC_SETTINGS],
    frozen=True,
    kw_only=True,
)


@dataclass(frozen=True, kw_only=True)
class SweepSpec(_SpecKnobs):
    """A sweep: fixed settings plus grid axes (lists). See sweeps/specs/*.yaml for examples.

    Besides the fields below, every knob of `trainers.knobs` the spec declares is a field: an `axis` as a
    list of values (bucket_cap_mb, gas, no_sync, comm_hook, …), a `setting` as one value (micro_batch, …)."""

    name: str
    """Sweep name (a label: letters, digits, '_', '.', '-')."""
    cluster: str = "local"
    """Label the rows are filed under (cluster=<label>/ in the store)."""
    model: str = "tiny"
    """Model preset (ignored with `workload`)."""
    workload: str | None = None
    """Your own model: an import path `package.module:factory` (docs: "Your own model"; `ddpsweep init` writes
    one); the factory's result gives `model`, `make_batch`, `loss` and optionally `tokens_per_sample`."""
    workload_args: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments of the workload's factory (JSON values)."""
    timed_steps: int | str = 10
    """Timed optimizer steps per cell, or `auto`: step until the median's 95% interval is within
    ±target_rel_ci (or max_timed_steps / max_cell_s is reached); the row records the steps and whether
    it converged."""
    target_rel_ci: float = 0.02
    """`timed_steps: auto`: the target half-width of the median's interval, as a fraction of it."""
    max_timed_steps: int = 200
    """`timed_steps: auto`: at most this many timed steps per measurement."""
    max_cell_s: float = 60.0
    """`timed_steps: auto`: stop adding steps once the timed steps have taken this long (s)."""
    topology: list[str] | None = None
    """Grid: placements as `<nodes>x<workers per node>`, e.g. [1x1, 1x8, 2x8, 4x8]. When given it is the
    placement axis and `workers` / `nodes` are not used (a spec file giving both is refused)."""
    workers: list[int] = field(default_factory=lambda: [2])
    """Grid (without `topology`): total DDP ranks (world size), crossed with `nodes`."""
    nodes: list[int] = field(default_factory=lambda: [1])
    """Grid (without `topology`): nodes the ranks are spread over (only counts dividing `workers` evenly)."""
    modes: list[str] = field(default_factory=lambda: ["ddp"])
    """Grid: `ddp` and optionally `naive` (the single baseline is always added)."""
    env_grid: dict[str, list] = field(default_factory=dict)
    """Grid: NCCL_* / GLOO_* / TORCH_NCCL_* variables and their values; every combination is its own worker
    group (NCCL reads them once per process), recorded in the rows (`env_grid`, `env`)."""
    backend: str = "auto"
    """`auto` (nccl with GPUs, gloo without), `nccl` or `gloo`."""
    use_gpu: str | bool = "auto"
    """`auto` (GPUs if the cluster has any) or a boolean."""
    cpus_per_worker: float = 1.0
    """CPUs reserved per worker; on CPU also the worker's torch thread count (floor, min 1)."""
    placement: str = "auto"
    """Ray placement strategy; `auto`: STRICT_PACK for one node, STRICT_SPREAD for one worker per node, else PACK."""
    collective_timeout_s: float = 300.0
    """Process-group timeout: a hung collective fails after this long."""
    cell_timeout_s: float = 900.0
    """A cell running longer than this becomes an error row (counted from the cell's own start)."""
    group_start_timeout_s: float = 600.0
    """A worker group not ready after this long (Ray Train's workers, process groups, model, the unrecorded
    warm-up cell, calibration) fails, and its cells are re-planned once."""
    max_concurrent_trials: int = 1
    """Cells measured at once (1: cells never contend for the same links)."""
    repeats: int | str = 1
    """Rounds: each measures every cell once, in a shuffled order, so between-run noise is visible. `auto`:
    a group adds rounds until each curve is resolved (its cells told apart from the best, or within
    ±target_rel of it), or max_rounds / max_sweep_s is reached."""
    max_rounds: int = 10
    """`repeats: auto`: at most this many rounds."""
    target_rel: float = 0.02
    """`repeats: auto`: differences smaller than this fraction count as equal."""
    max_sweep_s: float | None = None
    """`repeats: auto`: no group starts a new round once the sweep has run this long (s)."""
    search: str = "grid"
    """`grid`: every cell in every round; `race`: from min_rounds on, a cell shown slower than its curve's
    leader by more than `tolerance` is measured no more (results/racing.py); `model`: the overlap model
    (`ddpsweep predict`: the cluster's calibration and a profile of the workload) picks per curve the cells it
    cannot rule out, the baseline and PyTorch's default bucket, which are then raced (sweeps/modelsearch.py)."""
    model_k: int | None = None
    """`search: model`: cells per curve the model picks; null: every cell predicted within twice the model's
    own within-curve error on this cluster of the curve's predicted best, at least 2."""
    min_rounds: int = 3
    """`search: race` / `repeats: auto`: rounds before the first decision."""
    tolerance: float = 0.02
    """`search: race`: a cell is dropped only when shown slower than the leader by more than this fraction."""
    grad_check: bool = True
    """After each distributed cell's timed steps, check the gradient its DDP configuration produces against an
    fp64 reference (rows: `grad_check` exact | approximate | failed, `grad_rel_error`, `grad_tol`); a failed
    configuration is shown and left out of every answer. `false`: rows read `off`."""
    calibrate: bool = False
    """Start every multi-rank worker group with an all-reduce sweep over message sizes on its own ranks
    (and a parameter broadcast); rows go to the `calibration` table."""
    isolation: str = "sweep"
    """`sweep`: one warm TorchTrainer per node count (and environment) of the largest placement the sweep
    needs, every cell measured on its own ranks of it (a baseline on rank 0, a 1x2 cell on two ranks of one
    node), a fresh DDP wrapper each; `group`: one TorchTrainer per worker-group shape; `cell`: one
    TorchTrainer per (cell, repeat) (process isolation, the slow control)."""
    env: dict[str, str] = field(default_factory=dict)
    """Extra NCCL_*/GLOO_* variables for the workers."""
    results: str = "./ddpsweep-results"
    """Results root: a folder or a pyarrow filesystem URI (s3://…)."""

    def __post_init__(self) -> None:
        _validate(self)

    @property
    def rounds(self) -> int:
        """Rounds planned: `repeats`, or max_rounds under `repeats: auto`."""
        return self.max_rounds if self.repeats == "auto" else self.repeats

    @property
    def decides(self) -> bool:
        """The trial decides each next round (racing or automatic rounds)."""
        return self.search in ("race", "model") or self.repeats == "auto"

    def unused(self) -> list[str]:
        """One line per setting this spec gives (away from its default) that has no effect on what it measures."""
        d, out = {f.name: f.default for f in fields(SweepSpec)}, []
        given = [n for n in ("tolerance", "min_rounds", "max_sweep_s") if getattr(self, n) != d[n]]
        if not self.decides:
            out += [f"{n}: no effect without search: race or model, or repeats: auto" for n in given]
        if self.max_rounds != d["max_rounds"] and self.repeats != "auto":
            out.append("max_rounds: no effect with a fixed number of repeats (rounds are `repeats`)")
        if self.target_rel != d["target_rel"] and self.repeats != "auto":
            out.append("target_rel: no effect without repeats: auto")
        if "powersgd" not in self.comm_hook:
            out += [
                f"{n}: no effect without comm_hook powersgd"
                for n in ("powersgd_rank", "powersgd_start_iter")
                if getattr(self, n) != ([1] if n == "powersgd_rank" else 2)
            ]
        if True not in self.compile:
            given = {"optimize_ddp": [OPTIMIZE_DDP[0]], "compile_backend": "inductor", "compile_mode": "default"}
            out += [f"{n}: no effect without compile: [true]" for n, v in given.items() if getattr(self, n) != v]
        if self.workload_args and self.workload is None:
            out.append("workload_args: no effect without workload (the preset takes no arguments)")
        if self.model_k is not None and self.search != "model":
            out.append("model_k: no effect without search: model")
        if self.search == "race" and len(self.bucket_cap_mb) < 2:
            out.append("search: race: no curve has two cells to race (one bucket_cap_mb); every cell is measured")
        if self.modes == ["naive"]:
            ddp = [k.name for k in GRID_AXES if getattr(self, k.name) != [k.default]]
            out += [f"{n}: no effect with modes [naive] (a DDP setting)" for n in ddp]
        return out

    def warnings(self) -> list[str]:
        """What the CLI and the API warn about before a sweep: settings with no effect (`unused`), then
        combinations known to fail, measured anyway as error rows (a user may want to see them)."""
        return self.unused() + self.known_failures()

    def known_failures(self) -> list[str]:
        """One line per compiled combination PyTorch is known to refuse (each becomes an error row)."""
        if True not in self.compile or self.modes == ["naive"]:
            return []
        out = []
        small = [b for b in self.bucket_cap_mb if b < 1]
        if "ddp_optimizer" in self.optimize_ddp and small:
            out.append(
                f"optimize_ddp ddp_optimizer with bucket_cap_mb {', '.join(f'{b:g}' for b in small)}: known to "
                "fail (DDPOptimizer's first bucket is 1 MiB and must not exceed the cap: AssertionError 'First "
                "bucket should be smaller/equal to other buckets'); those cells become error rows"
            )
        hooked = [h for h in self.comm_hook if h != "none"] + (["trace_comm"] if self.trace_comm else [])
        if "python_reducer" in self.optimize_ddp and hooked:
            out.append(
                f"optimize_ddp python_reducer with {', '.join(hooked)}: known to fail (the Python reducer calls a "
                "comm hook per parameter, not per bucket); those cells become error rows"
            )
        return out

    def placements(self) -> list[tuple[int, int]]:
        """The grid's (world size, nodes) pairs, in the spec's order: its topologies, else workers x nodes
        where the nodes divide the workers evenly."""
        if self.topology:
            return [(n * w, n) for n, w in map(parse_topology, self.topology)]
        return [(w, n) for w in self.workers for n in self.nodes if w % n == 0 and w >= n]


def cells_planned(spec: SweepSpec) -> int:
    """The cells the grid expands to (sweeps.grid.expand), counted without expanding it: baselines (one per gas,
    timing and compile), then per placement, environment, timing and gas: no_sync only where gas > 1, naive once
    per compile value, and DDP once per combination of its axes, PowerSGD's rank crossed with `powersgd` only,
    optimize_ddp with compiled cells only."""
    hooks = [h for h in spec.comm_hook if h != "powersgd"]
    hook_combos = len(hooks) + (len(spec.powersgd_rank) if "powersgd" in spec.comm_hook else 0)
    own_rule = ("comm_hook", "powersgd_rank", "optimize_ddp")
    others = math.prod(len(getattr(spec, k.name)) for k in GRID_AXES if k.name not in own_rule)
    ddp_compiles = (False in spec.compile) + (True in spec.compile) * len(spec.optimize_ddp)  # optimize_ddp: compiled
    per_mode = sum(hook_combos * others * ddp_compiles if m == "ddp" else len(spec.compile) for m in spec.modes)
    syncs = sum(1 if g == 1 else len(spec.no_sync) for g in set(spec.gas))
    envs = math.prod(len(v) for v in spec.env_grid.values()) if isinstance(spec.env_grid, dict) else 1
    places = len(spec.placements())
    baselines = len(set(spec.gas)) * len(spec.timing) * len(spec.compile)
    return baselines + places * envs * len(spec.timing) * syncs * per_mode


def _check_grid_size(spec: SweepSpec) -> None:
    """Bound the measurements (the cells the grid expands to, times the rounds) before anything is expanded."""
    planned = cells_planned(spec) * spec.rounds
    if planned > MAX_MEASUREMENTS:
        raise fail(
            "repeats" if spec.rounds > 1 else "bucket_cap_mb",
            f"{planned} measurements",
            f"at most {MAX_MEASUREMENTS} measurements (cells x repeats) per sweep: fewer axis values or "
            "repeats, or split the study into several sweeps",
        )


def _check_first_bucket(spec: SweepSpec) -> None:
    """A first bucket larger than the cap is not a first bucket (DDP would make it one bucket of the cap)."""
    caps = min(spec.bucket_cap_mb)
    for i, first in enumerate(spec.first_bucket_mb):
        if first is not None and first > caps:
            raise fail(
                f"first_bucket_mb[{i}]", first, f"at most every bucket_cap_mb crossed with it (smallest {caps:g})"
            )


def _check_static_graph(spec: SweepSpec) -> None:
    """static_graph with no_sync at gas >= 2 fails on every cell in PyTorch 2.13 (DDP's reducer asserts
    `expect_autograd_hooks_` on the skipped syncs), so such a grid is refused before Ray."""
    if True in spec.static_graph and True in spec.no_sync and any(g >= 2 for g in spec.gas):
        raise fail(
            "static_graph",
            spec.static_graph,
            "false when no_sync is true at gas >= 2: PyTorch's reducer fails every such step (an internal "
            "assert on expect_autograd_hooks_); measure static_graph and no_sync in two sweeps",
        )


def _validate_knobs(spec: SweepSpec) -> None:
    """Every knob the spec declares, against its entry in trainers.knobs: a setting's one value, an axis's
    list (non-empty, bounded, without duplicates) value by value."""
    for knob in SPEC_SETTINGS:
        allowed = check(knob, getattr(spec, knob.name))
        if allowed is not None:
            raise fail(knob.name, getattr(spec, knob.name), allowed)
    for knob in SPEC_AXES:
        values = getattr(spec, knob.name)
        if not isinstance(values, list) or not values:
            raise fail(knob.name, values, "a non-empty list")
        if len(values) > MAX_AXIS_VALUES:
            raise fail(knob.name, f"{len(values)} values", f"at most {MAX_AXIS_VALUES} values")
        for i, v in enumerate(values):
            allowed = check(knob, v)
            if allowed is not None:
                raise fail(f"{knob.name}[{i}]", v, allowed)
        if len(set(values)) != len(values):
            raise fail(knob.name, values, "a list without duplicates")


def _validate(spec: SweepSpec) -> None:
    for name, kind in SCALARS.items():
        check_scalar(name, getattr(spec, name), kind)
    for name in RANGES:
        if name in SCALARS:
            check_range(name, [getattr(spec, name)])
    if spec.timed_steps != "auto" and not (is_int(spec.timed_steps) and spec.timed_steps >= 1):
        raise fail("timed_steps", spec.timed_steps, "an integer >= 1, or auto (adaptive timing)")
    for name in ("target_rel_ci", "target_rel", "tolerance"):
        if not (is_num(getattr(spec, name)) and 0 < getattr(spec, name) < 1):
            raise fail(name, getattr(spec, name), "a fraction in (0, 1), e.g. 0.02 for 2%")
    if is_int(spec.timed_steps) and spec.timed_steps > 1_000_000:
        raise fail("timed_steps", spec.timed_steps, "at most 1000000, or auto")
    _validate_rounds(spec)
    _validate_knobs(spec)
    for name, kind in LISTS.items():
        check_list(name, getattr(spec, name), kind)
        if name in RANGES:
            check_range(name, getattr(spec, name))
    if spec.topology is not None:
        validate_topology(spec.topology)
    if spec.workload is None:
        check_choice("model", spec.model, tuple(PRESETS))
    else:
        _validate_workload(spec)
    check_choice("backend", spec.backend, BACKENDS)
    check_choice("placement", spec.placement, PLACEMENTS)
    check_choice("isolation", spec.isolation, ISOLATIONS)
    check_scalar("calibrate", spec.calibrate, "bool")
    check_scalar("grad_check", spec.grad_check, "bool")
    if spec.use_gpu != "auto" and not isinstance(spec.use_gpu, bool):
        raise fail("use_gpu", spec.use_gpu, "auto, true or false")
    if spec.workload is None and spec.seq_len > PRESETS[spec.model].block_size:
        raise fail("seq_len", spec.seq_len, f"1..{PRESETS[spec.model].block_size} (block size of {spec.model})")
    validate_env(spec.env)
    validate_env_grid(spec.env_grid, spec.env)
    _validate_hooks(spec)
    validate_results(spec.results)
    if spec.topology is None:
        _validate_nodes(spec)
    if spec.backend == "nccl" and spec.use_gpu is False:
        raise fail("backend", "nccl", "gloo or auto when use_gpu is false (NCCL needs GPUs)")
    _check_static_graph(spec)
    _check_first_bucket(spec)
    _check_grid_size(spec)


def _validate_rounds(spec: SweepSpec) -> None:
    """repeats (an integer or auto) and the decision settings: racing and automatic rounds."""
    if spec.repeats != "auto" and not (is_int(spec.repeats) and 1 <= spec.repeats <= 1_000):
        raise fail("repeats", spec.repeats, "an integer in [1, 1000], or auto (rounds until resolved)")
    check_choice("search", spec.search, ("grid", "race", "model"))
    if spec.model_k is not None and not (is_int(spec.model_k) and spec.model_k >= 2):
        raise fail(
            "model_k", spec.model_k, "an integer of at least 2 (a race needs two cells), or null (from the error)"
        )
    if spec.max_sweep_s is not None and not (is_num(spec.max_sweep_s) and 0 < spec.max_sweep_s <= 30 * 86_400):
        raise fail("max_sweep_s", spec.max_sweep_s, "seconds in (0, 2592000], or null (no limit)")
    if spec.decides and spec.min_rounds < 2:
        raise fail(
            "min_rounds",
            spec.min_rounds,
            "at least 2 with search: race or model, or repeats: auto (a decision after one round has no between-round "
            "variance to test against: equal cells get dropped)",
        )
    if spec.decides and spec.min_rounds > spec.rounds:
        raise fail("min_rounds", spec.min_rounds, f"at most the rounds planned ({spec.rounds})")
    if spec.decides and spec.isolation == "cell":
        raise fail(
            "isolation", spec.isolation, "sweep or group with search: race or model, or repeats: auto (a group decides)"
        )


def _validate_workload(spec: SweepSpec) -> None:
    """The import path's form and JSON arguments (importing it is the planner's job: sweeps.grid)."""
    if not isinstance(spec.workload_args, dict):
        raise fail("workload_args", spec.workload_args, "a mapping of keyword arguments")
    try:
        StepConfig(workload=spec.workload, workload_args=canonical_args(spec.workload_args))
    except ConfigError as e:
        raise fail(e.field, e.value, e.allowed) from None


def _validate_hooks(spec: SweepSpec) -> None:
    """bf16 needs CUDA (refused here when the spec says CPU; runner.resolve_options checks `auto` against
    the cluster); PowerSGD compresses only after powersgd_start_iter synchronized steps, so the warm-up must
    cover them."""
    if "bf16" in spec.comm_hook and spec.use_gpu is False:
        i = spec.comm_hook.index("bf16")
        raise fail(f"comm_hook[{i}]", "bf16", BF16_ON_CPU)
    if "powersgd" in spec.comm_hook and spec.powersgd_start_iter > spec.warmup_steps:
        raise fail(
            "powersgd_start_iter",
            spec.powersgd_start_iter,
            f"at most warmup_steps ({spec.warmup_steps}) so the timed steps are compressed (raise warmup_steps)",
        )


def _validate_nodes(spec: SweepSpec) -> None:
    if not any(w % n == 0 and w >= n for w in spec.workers for n in spec.nodes):
        raise fail("nodes", spec.nodes, f"node counts that divide some worker count in {spec.workers}")


def new_sweep_id(name: str) -> str:
    """A fresh sweep id: the spec's name, the UTC time to the second, and 4 random hex digits."""
    return f"{name[:40]}-{datetime.now(UTC):%Y%m%d-%H%M%S}-{secrets.token_hex(2)}"


def spec_from_dict(data: Any, source: str = "spec") -> SweepSpec:
    """Build a SweepSpec from parsed YAML/JSON, rejecting unknown keys."""
    if not isinstance(data, dict):
        raise SpecError(source, type(data).__name__, "a mapping of fields (see sweeps/specs/smoke.yaml)")
    known = {f.name for f in fields(SweepSpec)}
    for key in data:
        if key not in known:
            raise SpecError(str(key), data[key], f"a known field: {', '.join(sorted(known))}")
    if "name" not in data:
        raise SpecError("name", None, "a label naming the sweep (required)")
    if "workload" in data and ("model" in data or "seq_len" in data):
        extra = "model" if "model" in data else "seq_len"
        raise SpecError(extra, data[extra], f"no {extra} beside workload: the workload builds its own model")
    both = [k for k in ("workers", "nodes") if k in data]
    if "topology" in data and both:
        raise SpecError(
            "topology",
            data["topology"],
            f"either topology or {' / '.join(both)}, not both: "
            "topology names nodes x workers per node (e.g. [1x8, 2x8])",
        )
    data = dict(data)
    if "env" in data and isinstance(data["env"], dict):
        data["env"] = {k: str(v) if is_num(v) else v for k, v in data["env"].items()}
    if "env_grid" in data and isinstance(data["env_grid"], dict):
        data["env_grid"] = {
            k: [str(v) if is_num(v) else v for v in vs] if isinstance(vs, list) else vs
            for k, vs in data["env_grid"].items()
        }
    return SweepSpec(**data)


def knob_docs() -> dict[str, str]:
    """Every knob's documentation (trainers.knobs), by name: what the generated references print beside a column
    (service reads the table through sweeps, never trainers directly)."""
    return {k.name: k.doc for k in KNOBS}
