"""The sweep spec: a mapping (a YAML file read by sweeps.specfile), validated strictly into a `SweepSpec`.

Every error is a `SpecError` naming the field's dotted path and what is allowed.
"""

from __future__ import annotations

import math
import re
import secrets
from dataclasses import dataclass, field, fields
from datetime import UTC, datetime
from typing import Any

from results.store import LABEL_RULE, valid_label
from trainers.config import COMM_HOOKS, TIMINGS, StepConfig, canonical_args
from trainers.errors import ConfigError
from trainers.presets import PRESETS

BACKENDS = ("auto", "nccl", "gloo")
PLACEMENTS = ("auto", "PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")
GRID_MODES = ("ddp", "naive")
ISOLATIONS = ("sweep", "group", "cell")
ENV_PREFIXES = ("NCCL_", "GLOO_", "TORCH_NCCL_", "TORCH_DISTRIBUTED_")


class SpecError(ConfigError):
    """A sweep spec field is invalid; `field` is its dotted path (e.g. `bucket_cap_mb[2]`)."""


@dataclass(frozen=True, kw_only=True)
class SweepSpec:
    """A sweep: fixed settings plus grid axes (lists). See sweeps/specs/*.yaml for examples."""

    name: str
    """Sweep name (a label: letters, digits, '_', '.', '-')."""
    cluster: str = "local"
    """Label the rows are filed under (cluster=<label>/ in the store)."""
    model: str = "tiny"
    """Model preset (ignored with `workload`)."""
    workload: str | None = None
    """Your own model: an import path `package.module:factory` (see README, "Your own model"); the factory's
    result gives `model`, `make_batch`, `loss` and optionally `tokens_per_sample`."""
    workload_args: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments of the workload's factory (JSON values)."""
    micro_batch: int = 8
    """Sequences per rank per micro-step."""
    seq_len: int = 64
    """Tokens per sequence."""
    warmup_steps: int = 3
    """Untimed optimizer steps per cell."""
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
    bucket_cap_mb: list[float] = field(default_factory=lambda: [25.0])
    """Grid: DDP bucket capacity in MB."""
    gas: list[int] = field(default_factory=lambda: [1])
    """Grid: gradient-accumulation micro-steps."""
    no_sync: list[bool] = field(default_factory=lambda: [False])
    """Grid: use DDP's no_sync() on the first gas-1 micro-steps."""
    gradient_as_bucket_view: list[bool] = field(default_factory=lambda: [True])
    """Grid: DDP's gradient_as_bucket_view."""
    modes: list[str] = field(default_factory=lambda: ["ddp"])
    """Grid: `ddp` and optionally `naive` (the single baseline is always added)."""
    comm_hook: list[str] = field(default_factory=lambda: ["none"])
    """Grid: DDP communication hook, `none`, `fp16`, `bf16` (CUDA + NCCL only) or `powersgd`. Every hook but
    `none` changes the numerics: rows say so in `grad_compression`, and `recommend` marks it."""
    powersgd_rank: list[int] = field(default_factory=lambda: [1])
    """Grid: PowerSGD's matrix_approximation_rank (only crossed with `powersgd`)."""
    powersgd_start_iter: int = 2
    """PowerSGD: synchronized steps of plain all-reduce before compression (>= 2, <= warmup_steps)."""
    first_bucket_mb: list[float | None] = field(default_factory=lambda: [None])
    """Grid: DDP's first bucket in MB (null: PyTorch's default), given to DDP as per-bucket caps."""
    static_graph: list[bool] = field(default_factory=lambda: [False])
    """Grid: DDP's static_graph."""
    broadcast_buffers: list[bool] = field(default_factory=lambda: [True])
    """Grid: DDP's broadcast_buffers."""
    timing: list[str] = field(default_factory=lambda: ["sync"])
    """Grid: how timed steps are timed, `sync`, `events` (CUDA events, no host sync between steps; sync on CPU)
    or `loop` (one interval over all timed steps: the mean step, no per-step distribution). Crosses every
    cell, baselines too (each method is compared with its own)."""
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
    leader by more than `tolerance` is measured no more (results/racing.py)."""
    min_rounds: int = 3
    """`search: race` / `repeats: auto`: rounds before the first decision."""
    tolerance: float = 0.02
    """`search: race`: a cell is dropped only when shown slower than the leader by more than this fraction."""
    trace_comm: bool = False
    """Record every DDP bucket's all-reduce launch and completion in the timed steps (comm_ms,
    comm_exposed_ms, comm_overlap_frac, comm_timeline_ms); off by default."""
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
        return self.search == "race" or self.repeats == "auto"

    def placements(self) -> list[tuple[int, int]]:
        """The grid's (world size, nodes) pairs, in the spec's order: its topologies, else workers x nodes
        where the nodes divide the workers evenly."""
        if self.topology:
            return [(n * w, n) for n, w in map(parse_topology, self.topology)]
        return [(w, n) for w in self.workers for n in self.nodes if w % n == 0 and w >= n]


TOPOLOGY_RE = re.compile(r"^([0-9]{1,4})x([0-9]{1,5})$")


def parse_topology(text: str) -> tuple[int, int]:
    """`"2x8"` -> (2 nodes, 8 workers per node)."""
    m = TOPOLOGY_RE.match(text)
    if not m:
        raise ValueError(text)
    return int(m[1]), int(m[2])


def _fail(path: str, value: Any, allowed: str) -> SpecError:
    return SpecError(path, value, allowed)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v: Any) -> bool:
    return (_is_int(v) or isinstance(v, float)) and math.isfinite(v)


def _check_scalar(path: str, v: Any, kind: str) -> None:
    checks = {
        "int>=1": (lambda: _is_int(v) and v >= 1, "an integer >= 1"),
        "int>=0": (lambda: _is_int(v) and v >= 0, "an integer >= 0"),
        "num>0": (lambda: _is_num(v) and v > 0, "a number > 0"),
        "bool": (lambda: isinstance(v, bool), "true or false"),
        "label": (lambda: isinstance(v, str) and valid_label(v), LABEL_RULE),
        "str": (lambda: isinstance(v, str) and bool(v), "a non-empty string"),
    }
    ok, allowed = checks[kind]
    if not ok():
        raise _fail(path, v, allowed)


def _check_choice(path: str, v: Any, choices: tuple) -> None:
    if v not in choices or isinstance(v, bool) != isinstance(choices[0], bool):
        raise _fail(path, v, f"one of {', '.join(map(str, choices))}")


def _check_list(path: str, values: Any, kind: str | tuple) -> None:
    if not isinstance(values, list) or not values:
        raise _fail(path, values, "a non-empty list")
    if len(values) > MAX_AXIS_VALUES:
        raise _fail(path, f"{len(values)} values", f"at most {MAX_AXIS_VALUES} values")
    for i, v in enumerate(values):
        if isinstance(kind, tuple):
            _check_choice(f"{path}[{i}]", v, kind)
        else:
            _check_scalar(f"{path}[{i}]", v, kind)
    if len(set(values)) != len(values):
        raise _fail(path, values, "a list without duplicates")


SCALARS = {
    "name": "label",
    "cluster": "label",
    "micro_batch": "int>=1",
    "seq_len": "int>=1",
    "warmup_steps": "int>=0",
    "cpus_per_worker": "num>0",
    "max_timed_steps": "int>=1",
    "max_cell_s": "num>0",
    "collective_timeout_s": "num>0",
    "cell_timeout_s": "num>0",
    "group_start_timeout_s": "num>0",
    "max_concurrent_trials": "int>=1",
    "max_rounds": "int>=1",
    "min_rounds": "int>=1",
    "results": "str",
    "powersgd_start_iter": "int>=1",
}
LISTS = {
    "workers": "int>=1",
    "nodes": "int>=1",
    "bucket_cap_mb": "num>0",
    "gas": "int>=1",
    "no_sync": "bool",
    "gradient_as_bucket_view": "bool",
    "modes": GRID_MODES,
    "comm_hook": COMM_HOOKS,
    "powersgd_rank": "int>=1",
    "static_graph": "bool",
    "broadcast_buffers": "bool",
    "timing": TIMINGS,
}


# Upper (and some lower) bounds: a value outside them is a typo, and would otherwise overflow a column,
# become "0 ms" in a timedelta, or expand into a grid nobody can measure.
RANGES = {
    "micro_batch": (1, 65_536),
    "warmup_steps": (0, 100_000),
    "max_timed_steps": (1, 1_000_000),
    "max_cell_s": (0.001, 86_400),
    "collective_timeout_s": (1, 86_400),
    "cell_timeout_s": (1, 7 * 86_400),
    "group_start_timeout_s": (1, 86_400),
    "max_concurrent_trials": (1, 1_024),
    "max_rounds": (1, 1_000),
    "min_rounds": (1, 1_000),
    "cpus_per_worker": (0.001, 1_024),
    "workers": (1, 65_536),
    "nodes": (1, 4_096),
    "bucket_cap_mb": (0.001, 100_000),
    "gas": (1, 4_096),
    "powersgd_rank": (1, 1_024),
    "powersgd_start_iter": (2, 100_000),
}
MAX_AXIS_VALUES = 1_000  # values in one grid list
MAX_MEASUREMENTS = 10_000  # cells x repeats in one sweep (a week of minute-long GPU cells): split larger studies
ENV_KEY_RE = re.compile(r"^[A-Z][A-Z0-9_]{0,127}$")


def _check_range(name: str, values: list) -> None:
    lo, hi = RANGES[name]
    for i, v in enumerate(values):
        if not lo <= v <= hi:
            raise _fail(name if len(values) == 1 else f"{name}[{i}]", v, f"a value in [{lo}, {hi}]")


def _check_grid_size(spec: SweepSpec) -> None:
    """Bound the grid from its axis lengths, before anything is expanded."""
    axes = [spec.bucket_cap_mb, spec.gas, spec.no_sync, spec.gradient_as_bucket_view, spec.modes, spec.comm_hook]
    axes += [spec.powersgd_rank, spec.first_bucket_mb, spec.static_graph, spec.broadcast_buffers, spec.timing]
    axes += list(spec.env_grid.values()) if isinstance(spec.env_grid, dict) else []
    places = len(spec.workers) * len(spec.nodes) if spec.topology is None else len(spec.topology)
    upper = places * math.prod(len(a) for a in axes) * spec.rounds
    if upper > MAX_MEASUREMENTS:
        raise _fail(
            "repeats" if spec.rounds > 1 else "bucket_cap_mb",
            f"{upper} measurements",
            f"at most {MAX_MEASUREMENTS} measurements (cells x repeats) per sweep: fewer axis values or "
            "repeats, or split the study into several sweeps",
        )


def _validate(spec: SweepSpec) -> None:
    for name, kind in SCALARS.items():
        _check_scalar(name, getattr(spec, name), kind)
    for name in RANGES:
        if name in SCALARS:
            _check_range(name, [getattr(spec, name)])
    if spec.timed_steps != "auto" and not (_is_int(spec.timed_steps) and spec.timed_steps >= 1):
        raise _fail("timed_steps", spec.timed_steps, "an integer >= 1, or auto (adaptive timing)")
    for name in ("target_rel_ci", "target_rel", "tolerance"):
        if not (_is_num(getattr(spec, name)) and 0 < getattr(spec, name) < 1):
            raise _fail(name, getattr(spec, name), "a fraction in (0, 1), e.g. 0.02 for 2%")
    if _is_int(spec.timed_steps) and spec.timed_steps > 1_000_000:
        raise _fail("timed_steps", spec.timed_steps, "at most 1000000, or auto")
    _validate_rounds(spec)
    for name, kind in LISTS.items():
        _check_list(name, getattr(spec, name), kind)
        if name in RANGES:
            _check_range(name, getattr(spec, name))
    if spec.topology is not None:
        _validate_topology(spec.topology)
    _check_grid_size(spec)
    if spec.workload is None:
        _check_choice("model", spec.model, tuple(PRESETS))
    else:
        _validate_workload(spec)
    _check_choice("backend", spec.backend, BACKENDS)
    _check_choice("placement", spec.placement, PLACEMENTS)
    _check_choice("isolation", spec.isolation, ISOLATIONS)
    _check_scalar("calibrate", spec.calibrate, "bool")
    _check_scalar("trace_comm", spec.trace_comm, "bool")
    if spec.use_gpu != "auto" and not isinstance(spec.use_gpu, bool):
        raise _fail("use_gpu", spec.use_gpu, "auto, true or false")
    if spec.workload is None and spec.seq_len > PRESETS[spec.model].block_size:
        raise _fail("seq_len", spec.seq_len, f"1..{PRESETS[spec.model].block_size} (block size of {spec.model})")
    _validate_env(spec.env)
    _validate_env_grid(spec.env_grid, spec.env)
    _validate_first_bucket(spec.first_bucket_mb)
    _validate_hooks(spec)
    _validate_results(spec.results)
    if spec.topology is None:
        _validate_nodes(spec)
    if spec.backend == "nccl" and spec.use_gpu is False:
        raise _fail("backend", "nccl", "gloo or auto when use_gpu is false (NCCL needs GPUs)")


def _validate_rounds(spec: SweepSpec) -> None:
    """repeats (an integer or auto) and the decision settings: racing and automatic rounds."""
    if spec.repeats != "auto" and not (_is_int(spec.repeats) and 1 <= spec.repeats <= 1_000):
        raise _fail("repeats", spec.repeats, "an integer in [1, 1000], or auto (rounds until resolved)")
    _check_choice("search", spec.search, ("grid", "race"))
    if spec.max_sweep_s is not None and not (_is_num(spec.max_sweep_s) and 0 < spec.max_sweep_s <= 30 * 86_400):
        raise _fail("max_sweep_s", spec.max_sweep_s, "seconds in (0, 2592000], or null (no limit)")
    if spec.decides and spec.min_rounds > spec.rounds:
        raise _fail("min_rounds", spec.min_rounds, f"at most the rounds planned ({spec.rounds})")
    if spec.decides and spec.isolation == "cell":
        raise _fail("isolation", spec.isolation, "sweep or group with search: race or repeats: auto (a group decides)")


def _validate_workload(spec: SweepSpec) -> None:
    """The import path's form and JSON arguments (importing it is the planner's job: sweeps.grid)."""
    if not isinstance(spec.workload_args, dict):
        raise _fail("workload_args", spec.workload_args, "a mapping of keyword arguments")
    try:
        StepConfig(workload=spec.workload, workload_args=canonical_args(spec.workload_args))
    except ConfigError as e:
        raise _fail(e.field, e.value, e.allowed) from None


def _validate_results(results: str) -> None:
    if "\0" in results:
        raise _fail("results", results, "a folder or URI without NUL bytes")
    scheme, sep, rest = results.partition("://")
    if sep and not rest.strip("/").split("/", 1)[0].split("?", 1)[0]:
        raise _fail("results", results, f"a {scheme}:// URI naming a bucket, e.g. {scheme}://bucket/ddpsweep")


def _validate_env(env: Any) -> None:
    if not isinstance(env, dict):
        raise _fail("env", env, "a mapping of variable name to string value")
    for k, v in env.items():
        _check_env_name(f"env.{k}", k)
        if not _env_value_ok(v):
            raise _fail(f"env.{k}", v, ENV_VALUE_RULE)


def _check_env_name(path: str, k: Any) -> None:
    if not isinstance(k, str) or not k.startswith(ENV_PREFIXES) or not ENV_KEY_RE.match(k):
        raise _fail(path, k, f"a variable name of A-Z, 0-9, '_' starting with {', '.join(ENV_PREFIXES)}")


ENV_VALUE_RULE = "a string or number (no NUL byte, at most 4096 characters)"


def _env_value_ok(v: Any) -> bool:
    finite = not isinstance(v, float) or math.isfinite(v)
    text_ok = isinstance(v, (str, int, float)) and not isinstance(v, bool)
    return text_ok and finite and "\0" not in str(v) and len(str(v)) <= 4096


def _validate_env_grid(grid: Any, env: dict) -> None:
    if not isinstance(grid, dict):
        raise _fail("env_grid", grid, "a mapping of variable name to a list of values")
    for k, values in grid.items():
        _check_env_name(f"env_grid.{k}", k)
        if k in env:
            raise _fail(f"env_grid.{k}", values, f"a variable not also fixed in env ({k} is)")
        if not isinstance(values, list) or not values or len(values) > MAX_AXIS_VALUES:
            raise _fail(f"env_grid.{k}", values, f"a non-empty list of at most {MAX_AXIS_VALUES} values")
        for i, v in enumerate(values):
            if not _env_value_ok(v):
                raise _fail(f"env_grid.{k}[{i}]", v, ENV_VALUE_RULE)
        if len({str(v) for v in values}) != len(values):
            raise _fail(f"env_grid.{k}", values, "a list without duplicates")


def _validate_first_bucket(values: Any) -> None:
    if not isinstance(values, list) or not values:
        raise _fail("first_bucket_mb", values, "a non-empty list of MB values or null (PyTorch's default)")
    for i, v in enumerate(values):
        if v is not None and not (_is_num(v) and 0 < v <= RANGES["bucket_cap_mb"][1]):
            raise _fail(f"first_bucket_mb[{i}]", v, f"a number of MB in (0, {RANGES['bucket_cap_mb'][1]}] or null")
    if len(set(values)) != len(values):
        raise _fail("first_bucket_mb", values, "a list without duplicates")


def _validate_hooks(spec: SweepSpec) -> None:
    """bf16 needs CUDA (refused here when the spec says CPU; runner.resolve_options checks `auto` against
    the cluster); PowerSGD compresses only after powersgd_start_iter synchronized steps, so the warm-up must
    cover them."""
    if "bf16" in spec.comm_hook and spec.use_gpu is False:
        i = spec.comm_hook.index("bf16")
        raise _fail(f"comm_hook[{i}]", "bf16", BF16_ON_CPU)
    if "powersgd" in spec.comm_hook and spec.powersgd_start_iter > spec.warmup_steps:
        raise _fail(
            "powersgd_start_iter",
            spec.powersgd_start_iter,
            f"at most warmup_steps ({spec.warmup_steps}) so the timed steps are compressed (raise warmup_steps)",
        )


BF16_ON_CPU = "none, fp16 or powersgd without GPUs: PyTorch's bf16_compress_hook needs CUDA 11+ and NCCL 2.10+"


def _validate_topology(topology: Any) -> None:
    _check_list("topology", topology, "str")
    for i, text in enumerate(topology):
        path, allowed = f"topology[{i}]", "<nodes>x<workers per node>, e.g. 1x8 or 2x8"
        try:
            nodes, per_node = parse_topology(text)
        except ValueError:
            raise _fail(path, text, allowed) from None
        if not (1 <= nodes <= RANGES["nodes"][1] and per_node >= 1 and nodes * per_node <= RANGES["workers"][1]):
            raise _fail(
                path,
                text,
                f"{allowed}, with 1..{RANGES['nodes'][1]} nodes and at most {RANGES['workers'][1]} workers in all",
            )


def _validate_nodes(spec: SweepSpec) -> None:
    if not any(w % n == 0 and w >= n for w in spec.workers for n in spec.nodes):
        raise _fail("nodes", spec.nodes, f"node counts that divide some worker count in {spec.workers}")


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
        data["env"] = {k: str(v) if _is_num(v) else v for k, v in data["env"].items()}
    if "env_grid" in data and isinstance(data["env_grid"], dict):
        data["env_grid"] = {
            k: [str(v) if _is_num(v) else v for v in vs] if isinstance(vs, list) else vs
            for k, vs in data["env_grid"].items()
        }
    return SweepSpec(**data)
