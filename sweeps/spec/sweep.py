"""The sweep spec: a mapping (a YAML file read by sweeps.spec.files), validated strictly into a `SweepSpec`.

Every error is a `SpecError` naming the field's dotted path and what is allowed. The rules of single fields
are in `sweeps.spec.fields`, the checks across fields in `sweeps.spec.rules`; both run when a `SweepSpec` is made.
"""

from __future__ import annotations

import difflib
import secrets
from dataclasses import dataclass, field, fields, make_dataclass
from datetime import UTC, datetime
from typing import Any

from sweeps.spec.fields import (
    SpecError,
    is_num,
    parse_topology,
)
from sweeps.spec.rules import validate
from trainers.knobs import GRID_AXES, KNOBS, OPTIMIZE_DDP, SPEC_AXES, SPEC_SETTINGS, Knob


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
    leader by more than `tolerance` is measured no more (results/analysis/racing.py)."""
    min_rounds: int = 3
    """`search: race` / `repeats: auto`: rounds before the first decision."""
    tolerance: float = 0.02
    """`search: race`: a cell is dropped only when shown slower than the leader by more than this fraction."""
    grad_check: bool | str = True
    """After a distributed cell's timed steps, one untimed check step as the cell runs it: each rank's local
    gradients, captured inside that backward before DDP's reducer sees them, summed in fp64, against the
    gradient DDP produced (rows: `grad_check` exact | approximate | failed | indeterminate, `grad_rel_error`,
    `grad_tol`); a failed configuration is shown and left out of every answer. `true`: each configuration's first
    measurement in its worker group; `every`: every measurement; `false`: none (rows read `off`)."""
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
        validate(self)

    @property
    def rounds(self) -> int:
        """Rounds planned: `repeats`, or max_rounds under `repeats: auto`."""
        return self.max_rounds if self.repeats == "auto" else self.repeats

    @property
    def decides(self) -> bool:
        """The trial decides each next round (racing or automatic rounds)."""
        return self.search == "race" or self.repeats == "auto"

    def unused(self) -> list[str]:
        """One line per setting this spec gives (away from its default) that has no effect on what it measures."""
        d, out = {f.name: f.default for f in fields(SweepSpec)}, []
        given = [n for n in ("tolerance", "min_rounds", "max_sweep_s") if getattr(self, n) != d[n]]
        if not self.decides:
            out += [f"{n}: no effect without search: race or repeats: auto" for n in given]
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
        if True in self.compile and self.compile_mode == "reduce-overhead" and self.use_gpu is False:
            out.append(
                "compile_mode: reduce-overhead captures CUDA graphs, which do nothing on CPU (use_gpu: false): "
                "those cells measure what compile_mode: default does"
            )
        if self.workload_args and self.workload is None:
            out.append("workload_args: no effect without workload (the preset takes no arguments)")
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


def new_sweep_id(name: str) -> str:
    """A fresh sweep id: the spec's name, the UTC time to the second, and 4 random hex digits."""
    return f"{name[:40]}-{datetime.now(UTC):%Y%m%d-%H%M%S}-{secrets.token_hex(2)}"


MEANT = {  # names users bring from torchrun, Hugging Face and nanoGPT configs, and this spec's field for each
    "bucket_cap_mb": ("buckets", "bucket_size", "bucket_mb", "bucket_cap"),
    "comm_hook": ("hook", "hooks", "ddp_comm_hook"),
    "gas": ("gradient_accumulation_steps", "grad_accum", "grad_accum_steps", "accumulation_steps"),
    "workers": ("world_size", "num_workers", "nproc_per_node", "gpus", "num_gpus"),
    "nodes": ("nnodes", "num_nodes"),
    "micro_batch": ("batch_size", "per_device_train_batch_size", "micro_batch_size"),
    "seq_len": ("block_size", "max_seq_len", "seq_length", "sequence_length"),
    "warmup_steps": ("warmup", "warmup_iters"),
    "timed_steps": ("steps", "iters", "max_iters"),
}


def _meant(key: str, known: set[str]) -> str | None:
    """The field an unknown key most likely stands for: a name from another tool's config, or a close spelling."""
    key = key.lower().replace("-", "_")
    for field_name, names in MEANT.items():
        if key in names:
            return field_name
    close = difflib.get_close_matches(key, sorted(known), n=1, cutoff=0.7)
    return close[0] if close else None


def spec_from_dict(data: Any, source: str = "spec") -> SweepSpec:
    """Build a SweepSpec from parsed YAML/JSON, rejecting unknown keys."""
    if not isinstance(data, dict):
        raise SpecError(source, type(data).__name__, "a mapping of fields (see sweeps/specs/smoke.yaml)")
    known = {f.name for f in fields(SweepSpec)}
    for key in data:
        if key not in known:
            guess = _meant(str(key), known)
            hint = f" (did you mean {guess}?)" if guess else ""
            raise SpecError(str(key), data[key], f"a known field{hint}: {', '.join(sorted(known))}")
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
