"""Every knob of a measured configuration, declared once, as typed dataclass fields (torch-free).

One field per setting that can make two measurements different configurations: its type (a `Literal` is a
choice), its default, its docstring underneath and its `Knob` metadata beside it, read with
`get_type_hints(include_extras=True)` as torchtitan declares its settings. `StepKnobs` is what every rank runs
(`trainers.config.StepConfig` subclasses it), `PlacementKnobs` what places the ranks. Everything else is derived
from `KNOBS`: the spec's axes and settings (`sweeps.spec.sweep`), the grid and the cell id (`sweeps.plan.grid`), the row
schema and what older rows read (`results.storage.schema`), and every view's notion of "the same configuration"
(`results.analysis.identity`: the analyses, compare, recommend, racing, scaling, the summary and the dashboard).

Adding a knob: one field here, and the code that applies it (a DDP keyword needs none: `trainers.replica.ddp_kwargs`
passes every knob that names one; an `applies` rule is a plain function beside the others).
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import textwrap
from collections.abc import Callable
from dataclasses import KW_ONLY, asdict, dataclass, field
from typing import Annotated, Any, Literal, get_args, get_origin, get_type_hints

LOSSY_HOOKS = ("fp16", "bf16", "powersgd")  # hooks that compress: their gradient is approximate by design


class _Unset:
    def __repr__(self) -> str:
        return "UNSET"


UNSET: Any = _Unset()
"""No value: a knob PyTorch has no default for, or one that older rows always had."""

# where a knob sits in a configuration
WORKLOAD, MEASURE, STEP, DDP, PLACEMENT, ENV = "workload", "measure", "step", "ddp", "placement", "env"
COMPILE = "compile"
# how the spec gives it
AXIS, SETTING, OWN = "axis", "setting", "own"
# when it joins the cell id
ALWAYS, CHANGED, USER_WORKLOAD = "always", "changed", "user_workload"


@dataclass(frozen=True)
class Knob:
    """One setting of a measured configuration: the metadata beside its field (the reader fills `name`, `kind`,
    `default`, `doc` and `choices` from the field itself)."""

    scope: str
    """`workload` (what is computed), `measure` (how it is timed), `step` (mode, gas, no_sync), `compile` (eager
    or torch.compile: baselines too), `ddp` (the DDP wrapper: normalized away outside ddp mode), `placement`
    (ranks, nodes, backend) or `env` (variables)."""
    spec: str = OWN
    """`axis` (a list in the spec, crossed in the grid), `setting` (one value per sweep) or `own` (the spec has
    its own field or rule for it, named in `doc`)."""
    _: KW_ONLY
    lo: float | None = None
    """Smallest value allowed (numbers)."""
    hi: float | None = None
    """Largest value allowed (numbers)."""
    nullable: bool = False
    """Null is a value a spec may give (e.g. first_bucket_mb: PyTorch's first bucket). A knob whose `off` is null
    reads null where it does not apply without being nullable."""
    hashed: str = CHANGED
    """When it joins the cell id: `always` (the first cell ids' fields), `changed` (only when it differs from
    its default, so cells stored before it existed keep their ids) or `user_workload` (only for user
    workloads)."""
    older_rows: Any = UNSET
    """What rows stored before the column existed read as (UNSET: the column is as old as the store)."""
    pytorch: Any = UNSET
    """PyTorch's own default, where a user's script chooses it (recommend compares the best with it)."""
    ddp_kwarg: str | None = None
    """The DistributedDataParallel keyword it sets (recommend's snippet writes it when not PyTorch's default)."""
    applies: Callable[[Any], bool] | None = None
    """When it applies to a StepConfig; elsewhere it reads `off`, so one cell has one spelling."""
    off: Any = UNSET
    """Its value where it does not apply (UNSET: its default)."""
    arrow: str = ""
    """The row column's Arrow type: string, int32, int64, float64 or bool (derived from `kind` when empty)."""
    name: str = ""
    """Its name in StepConfig, the spec (unless `spec` is OWN) and the row schema: the field's."""
    kind: str = ""
    """Its values: `bool`, `int`, `float`, `str` or `choice` (one of `choices`): from the field's type."""
    default: Any = None
    """The harness's default (a cell that does not set it): the field's."""
    doc: str = ""
    """What it does, as the spec reference prints it: the field's docstring."""
    choices: tuple = ()
    """`choice` knobs: the values allowed in a spec (the field's `Literal`)."""

    @property
    def value_off(self) -> Any:
        return self.default if self.off is UNSET else self.off

    @property
    def chosen(self) -> bool:
        """A setting a user picks in their own training script: recommend chooses among its measured values."""
        return self.pytorch is not UNSET

    @property
    def column_type(self) -> str:
        return self.arrow or {"bool": "bool", "int": "int32", "float": "float64"}.get(self.kind, "string")


# When a knob applies to a StepConfig (`Knob.applies`); elsewhere it reads its `off` value.


def ddp(cfg: Any) -> bool:
    return cfg.mode == "ddp"


def accumulating(cfg: Any) -> bool:
    return cfg.gas > 1 and cfg.mode != "single"


def compiled(cfg: Any) -> bool:
    return bool(cfg.compile)


def compiled_ddp(cfg: Any) -> bool:
    return cfg.mode == "ddp" and bool(cfg.compile)


def powersgd(cfg: Any) -> bool:
    return cfg.mode == "ddp" and cfg.comm_hook == "powersgd"


@dataclass(frozen=True, kw_only=True)
class StepKnobs:
    """The knobs every rank runs: StepConfig's fields, in this order."""

    model: Annotated[str, Knob(WORKLOAD, hashed=ALWAYS)] = "tiny"
    """Model preset name (trainers.presets); with `workload`, the workload's import path (spec: `model`)."""
    workload: Annotated[str | None, Knob(WORKLOAD, nullable=True, older_rows=None)] = None
    """A user workload by import path `package.module:factory` (trainers.workload); null: the preset (spec:
    `workload`)."""
    workload_args: Annotated[str, Knob(WORKLOAD, older_rows="{}")] = "{}"
    """The factory's keyword arguments as canonical JSON (sorted keys, compact) (spec: `workload_args`)."""
    workload_fingerprint: Annotated[str | None, Knob(WORKLOAD, nullable=True, hashed=USER_WORKLOAD)] = None
    """Hash of the model's parameter names, shapes and dtypes as planned; the worker refuses a model that differs.
    Joins the cell id for user workloads only (a preset's name fixes its shapes)."""
    mode: Annotated[Literal["single", "ddp", "naive"], Knob(STEP, hashed=ALWAYS)] = "ddp"
    """`single` (one process, no wrapper: the baseline), `ddp`, or `naive` (all_reduce per .grad) (spec: `modes`, the
    baseline always added)."""
    micro_batch: Annotated[int, Knob(WORKLOAD, SETTING, lo=1, hi=65536, hashed=ALWAYS)] = 8
    """Samples (sequences) per rank per micro-step."""
    seq_len: Annotated[int, Knob(WORKLOAD, SETTING, lo=1, hashed=ALWAYS)] = 64
    """Tokens per sequence, at most the preset's block size (a user workload: 1)."""
    gas: Annotated[int, Knob(STEP, AXIS, lo=1, hi=4096, hashed=ALWAYS)] = 1
    """Gradient-accumulation micro-steps per optimizer step."""
    no_sync: Annotated[bool, Knob(STEP, AXIS, hashed=ALWAYS, pytorch=False, applies=accumulating)] = False
    """Skip the gradient sync on the first gas-1 micro-steps (DDP's `no_sync()`)."""
    bucket_cap_mb: Annotated[
        float | None,
        Knob(
            DDP,
            AXIS,
            lo=0.001,
            hi=100000,
            hashed=ALWAYS,
            pytorch=25.0,
            ddp_kwarg="bucket_cap_mb",
            applies=ddp,
            off=None,
        ),
    ] = 25.0
    """DDP's bucket capacity in MB (the U-curve's x axis)."""
    gradient_as_bucket_view: Annotated[
        bool | None,
        Knob(DDP, AXIS, hashed=ALWAYS, pytorch=False, ddp_kwarg="gradient_as_bucket_view", applies=ddp, off=None),
    ] = True
    """Make each .grad a view into DDP's bucket memory (saves a copy and the memory of one gradient)."""
    warmup_steps: Annotated[int, Knob(MEASURE, SETTING, lo=0, hi=100000, hashed=ALWAYS)] = 3
    """Untimed optimizer steps per cell before measuring."""
    warmup_s: Annotated[float | None, Knob(MEASURE, SETTING, lo=0, hi=3600, nullable=True, older_rows=None)] = None
    """Seconds of further untimed steps after the warm-up steps, until this much time has passed since the warm-up
    began: an idle GPU drops to its idle clocks between cells and needs a while to return. Null: 1 s on CUDA, none
    on CPU."""
    timed_steps: Annotated[int, Knob(MEASURE, lo=1, hi=1000000, hashed=ALWAYS)] = 10
    """Timed optimizer steps; adaptive timing: the size of every batch of them (spec: `timed_steps`, an integer or
    `auto`)."""
    target_rel_ci: Annotated[float | None, Knob(MEASURE, lo=0, hi=1, nullable=True, older_rows=None)] = None
    """Adaptive timing: step until the median's 95% interval is within ±this fraction; null: fixed steps (spec:
    `target_rel_ci` with `timed_steps: auto`)."""
    max_timed_steps: Annotated[int, Knob(MEASURE, lo=1, hi=1000000, older_rows=200)] = 200
    """Adaptive timing: at most this many timed steps (spec: with `timed_steps: auto`)."""
    max_cell_s: Annotated[float, Knob(MEASURE, lo=0.001, hi=86400, older_rows=60.0)] = 60.0
    """Adaptive timing: no further batch once the timed steps took this long, s (spec: with `timed_steps: auto`)."""
    trace_comm: Annotated[bool, Knob(MEASURE, SETTING, older_rows=False, applies=ddp)] = False
    """Record each bucket's all-reduce launch and completion in untimed traced steps after the timed ones (a comm hook
    that does what DDP's own does, on a wrapper of its own: the timed steps run without it); ddp mode only."""
    seed: Annotated[int, Knob(WORKLOAD, lo=0, older_rows=1337, arrow="int64")] = 1337
    """Model-init seed (the same on every rank); data uses it with the rank and micro-step. Not in specs."""
    comm_hook: Annotated[
        Literal["none", "fp16", "bf16", "powersgd"], Knob(DDP, AXIS, older_rows="none", pytorch="none", applies=ddp)
    ] = "none"
    """DDP communication hook: `none` (DDP's own all-reduce), `fp16` / `bf16` (gradients cast for the all-reduce: half
    the bytes, rounded values; bf16 needs CUDA + NCCL) or `powersgd` (low-rank, error feedback). Every hook but
    `none` changes the numerics."""
    powersgd_rank: Annotated[int, Knob(DDP, AXIS, lo=1, hi=1024, older_rows=1, pytorch=1, applies=powersgd)] = 1
    """PowerSGD's matrix_approximation_rank (only crossed with `powersgd`)."""
    powersgd_start_iter: Annotated[
        int, Knob(DDP, SETTING, lo=2, hi=100000, older_rows=2, pytorch=2, applies=powersgd)
    ] = 2
    """PowerSGD: synchronized steps of plain all-reduce before compression starts (at most warmup_steps, so the timed
    steps are compressed)."""
    first_bucket_mb: Annotated[
        float | None, Knob(DDP, AXIS, lo=0.001, hi=100000, nullable=True, older_rows=None, pytorch=None, applies=ddp)
    ] = None
    """DDP's first bucket in MB, given as per-bucket caps `bucket_cap_mb_list=[first, cap]`; null: PyTorch's default."""
    static_graph: Annotated[
        bool, Knob(DDP, AXIS, older_rows=False, pytorch=False, ddp_kwarg="static_graph", applies=ddp)
    ] = False
    """DDP's static_graph (the graph and the parameters used are the same every step)."""
    broadcast_buffers: Annotated[
        bool, Knob(DDP, AXIS, older_rows=True, pytorch=True, ddp_kwarg="broadcast_buffers", applies=ddp)
    ] = True
    """DDP's broadcast_buffers (rank 0's buffers sent to every rank at each forward)."""
    timing: Annotated[Literal["sync", "events", "loop"], Knob(MEASURE, AXIS, older_rows="sync")] = "sync"
    """How each timed step is timed: `sync` (wall clock, the device synchronized around every step), `events` (CUDA
    events, no host sync between steps; sync on CPU) or `loop` (one interval over all timed steps: the mean step).
    Crosses every cell, baselines too."""
    find_unused_parameters: Annotated[
        bool, Knob(DDP, AXIS, older_rows=False, pytorch=False, ddp_kwarg="find_unused_parameters", applies=ddp)
    ] = False
    """DDP's find_unused_parameters: traverse the autograd graph after each forward to mark parameters that get no
    gradient (needed by models that skip some; costs a graph walk every step)."""
    compile: Annotated[bool, Knob(COMPILE, AXIS, older_rows=False, pytorch=False)] = False
    """Run the step through `torch.compile`: the DDP-wrapped model compiled (PyTorch's documented pattern; single and
    naive cells compile the bare model), compiled during warm-up until it stops recompiling. Crosses every cell,
    baselines too."""
    optimize_ddp: Annotated[
        Literal["ddp_optimizer", "python_reducer", "no_optimization"] | None,
        Knob(DDP, AXIS, older_rows=None, pytorch="ddp_optimizer", applies=compiled_ddp, off=None),
    ] = "ddp_optimizer"
    """`torch._dynamo.config.optimize_ddp` for a compiled DDP cell: `ddp_optimizer` (the graph split at the bucket
    boundaries so the all-reduces overlap the backward; its first bucket is 1 MiB, so a cap below 1 MB fails),
    `python_reducer` (the all-reduces traced into one backward graph by compiled autograd, switched on for it; no
    comm hooks) or `no_optimization` (one graph, no overlap)."""
    compile_backend: Annotated[
        Literal["inductor", "aot_eager"] | None,
        Knob(COMPILE, SETTING, older_rows=None, pytorch="inductor", applies=compiled, off=None),
    ] = "inductor"
    """torch.compile's backend for compiled cells: `inductor` (generated kernels) or `aot_eager` (the traced graphs run
    eagerly: quick checks of the compiled path)."""
    compile_mode: Annotated[
        Literal["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"] | None,
        Knob(COMPILE, SETTING, older_rows=None, pytorch="default", applies=compiled, off=None),
    ] = "default"
    """torch.compile's `mode` for compiled cells with inductor (`reduce-overhead` adds CUDA graphs)."""


@dataclass(frozen=True, kw_only=True)
class PlacementKnobs:
    """The knobs that place the ranks (a Cell's fields beside its StepConfig) and the variables they start with."""

    world_size: Annotated[int, Knob(PLACEMENT, lo=1, hi=65536, hashed=ALWAYS)] = 1
    """DDP ranks, 1 for the baseline (spec: `topology`, or `workers` x `nodes`)."""
    num_nodes: Annotated[int, Knob(PLACEMENT, lo=1, hi=4096, hashed=ALWAYS)] = 1
    """Nodes the ranks are spread over, evenly (spec: `topology`, or `nodes`)."""
    backend: Annotated[Literal["auto", "nccl", "gloo"], Knob(PLACEMENT, hashed=ALWAYS)] = "auto"
    """The process group's backend: the spec asks `auto`, `nccl` or `gloo` (spec: `backend`); rows record it as run
    (nccl | gloo | none for the baseline)."""
    env_grid: Annotated[str, Knob(ENV, older_rows="{}", pytorch="{}")] = "{}"
    """The cell's `env_grid` values as canonical JSON: variables its worker group starts with (NCCL and gloo read them
    once per process) (spec: `env_grid`)."""


def _field_docs(cls: type) -> dict[str, str]:
    """Each field's docstring: the string literal right below it in the class body."""
    body = ast.parse(textwrap.dedent(inspect.getsource(cls))).body[0].body
    return {
        node.target.id: " ".join(str(after.value.value).split())
        for node, after in zip(body, body[1:], strict=False)
        if isinstance(node, ast.AnnAssign) and isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant)
    }


def _kind(hint: Any) -> tuple[str, tuple]:
    """(kind, choices) of a field's type: a `Literal` is a choice, `X | None` is X's kind."""
    if get_origin(hint) is Literal:
        return "choice", get_args(hint)
    args = [a for a in get_args(hint) if a is not type(None)] or [hint]
    if get_origin(args[0]) is Literal:
        return "choice", get_args(args[0])
    return args[0].__name__, ()


def _read(cls: type) -> tuple[Knob, ...]:
    """The knobs of a declaration, in field order."""
    hints, docs = get_type_hints(cls, include_extras=True), _field_docs(cls)
    out = []
    for f in dataclasses.fields(cls):
        base, meta = get_args(hints[f.name])[:2]
        kind, choices = _kind(base)
        out.append(
            dataclasses.replace(meta, name=f.name, kind=kind, default=f.default, doc=docs[f.name], choices=choices)
        )
    return tuple(out)


STEP_KNOBS: tuple[Knob, ...] = _read(StepKnobs)
"""The knobs every rank runs: StepConfig's fields, in this order."""
KNOBS: tuple[Knob, ...] = STEP_KNOBS + _read(PlacementKnobs)
BY_NAME: dict[str, Knob] = {k.name: k for k in KNOBS}
SPEC_AXES: tuple[Knob, ...] = tuple(k for k in STEP_KNOBS if k.spec == AXIS)
SPEC_SETTINGS: tuple[Knob, ...] = tuple(k for k in STEP_KNOBS if k.spec == SETTING)
GRID_AXES: tuple[Knob, ...] = tuple(k for k in SPEC_AXES if k.scope == DDP)
"""The DDP wrapper's axes, crossed for every DDP cell (gas, no_sync and timing have rules of their own)."""
MODES, COMM_HOOKS, TIMINGS, BACKENDS = (BY_NAME[n].choices for n in ("mode", "comm_hook", "timing", "backend"))
OPTIMIZE_DDP, COMPILE_BACKENDS, COMPILE_MODES = (
    BY_NAME[n].choices for n in ("optimize_ddp", "compile_backend", "compile_mode")
)
SWEPT = "bucket_cap_mb"
"""The knob a U-curve is drawn over."""


def check(knob: Knob, value: Any) -> str | None:
    """What is allowed, when `value` is not a valid value of `knob` (None: valid)."""
    if value is None:
        return None if knob.nullable else _allowed(knob)
    if knob.kind == "choice":
        return None if value in knob.choices and not isinstance(value, bool) else _allowed(knob)
    if knob.kind == "bool":
        return None if isinstance(value, bool) else _allowed(knob)
    if knob.kind == "str":
        return None if isinstance(value, str) and value else _allowed(knob)
    numeric = (int,) if knob.kind == "int" else (int, float)
    if isinstance(value, bool) or not isinstance(value, numeric) or value != value:
        return _allowed(knob)
    if (knob.lo is not None and value < knob.lo) or (knob.hi is not None and value > knob.hi):
        return _allowed(knob)
    return None


def _allowed(knob: Knob) -> str:
    if knob.kind == "choice":
        text = f"one of {', '.join(knob.choices)}"
    elif knob.kind == "bool":
        text = "true or false"
    elif knob.kind == "str":
        text = "a non-empty string"
    else:
        what = "an integer" if knob.kind == "int" else "a number"
        if knob.lo is not None and knob.hi is not None:
            text = f"{what} in [{knob.lo:g}, {knob.hi:g}]"
        else:
            text = f"{what} >= {knob.lo:g}" if knob.lo is not None else what
    return text + (", or null" if knob.nullable else "")


# What a cell's run returns: the row's other half, one field per measured column (results.storage.schema derives
# those columns from these fields; the comment beside each field is its column's documentation).
@dataclass(frozen=True, kw_only=True)
class Measurement:
    """What rank 0 measured for one cell: measurements only (the configuration is the StepConfig).

    Times in ms, memory in bytes.
    """

    backend: str  # the process group's backend as run: nccl | gloo | none (single)
    device_type: str  # cuda | cpu
    n_params: int  # parameters of the model (a tied head counted once)
    grad_bytes: int  # bytes of gradient all-reduced per step (fp32)
    num_threads: int  # torch intra-op threads per rank
    setup_ms: float  # model copy + optimizer + DDP wrapper for this cell
    warmup_ms: float  # all warm-up steps of this cell (untimed steps, timed as a block)
    step_ms: float  # median of the per-step slowest-rank times
    step_ms_mean: float  # mean of the per-step slowest-rank times
    step_ms_p10: float  # 10th percentile of the per-step times
    step_ms_p90: float  # 90th percentile of the per-step times
    step_ms_cv: float | None  # std / mean of the per-step times (null for loop timing: one mean)
    tokens_per_s: float | None  # global tokens per step / median step (null where the workload gives no tokens)
    samples_per_s: float  # global samples per step / median step
    peak_mem_bytes: int | None  # max over ranks during this cell: CUDA max allocated, or VmHWM on Linux CPU
    num_buckets: int  # DDP's gradient buckets (after its rebuild)
    bucket_sizes_bytes: list[int] = field(default_factory=list)  # each bucket's bytes, from DDP's logging data
    step_times_ms: list[float] = field(default_factory=list)  # every timed step: the slowest rank's time, in order
    timed_steps_run: int = 0  # timed steps actually taken (fixed timing: timed_steps)
    converged: bool | None = None  # adaptive timing reached its target; null for fixed steps
    comm_ms: float | None = None  # trace_comm (rank 0): time with an all-reduce in flight, per step (median)
    comm_exposed_ms: float | None = None  # trace_comm: communication left after backward compute ended
    comm_overlap_frac: float | None = None  # trace_comm: 1 - exposed / comm
    comm_timeline_ms: list[list[float]] | None = None  # trace_comm: [bucket, launch, done] of the median step
    comm_bytes_per_step: int | None = None  # trace_comm: bytes all-reduced per optimizer step by rank 0 (median)
    comm_collectives_per_step: int | None = None  # trace_comm: all-reduce calls per optimizer step (median)
    replicas_in_sync: bool = True  # every rank's parameters bit-identical after the timed steps
    timing_used: str = "sync"  # how the steps were timed: sync | events | loop (events falls back to sync on CPU)
    timing_note: str | None = None  # why timing_used differs from the cell's timing, or what a loop row lacks
    grad_check: str | None = None  # exact | approximate | failed | indeterminate | off; null: not checked
    grad_rel_error: float | None = None  # DDP's gradient vs the fp64 reference: relative L2 error
    grad_tol: float | None = None  # the relative error the reduction's rounding explains (trainers.gradcheck)
    grad_check_ms: float | None = None  # the check's cost, after the timed steps: one untimed step, the fp64 sum
    grad_check_note: str | None = None  # indeterminate: why the local gradients could not be captured
    compile_s: float | None = None  # compiled cells: the warm-up steps that compiled (first and recompiles), s
    compiled_graphs: int | None = None  # compiled cells: graphs the backend compiled (ddp_optimizer: one per split)
    recompiles_timed: int | None = None  # compiled cells: frames Dynamo compiled inside the timed steps (must be 0)
    collectives_per_step: int | None = None  # all-reduce calls in one untimed step after warm-up (profiler), rank 0
    rank_compute_ms: list[list[float]] | None = None  # per rank: no_sync forward + backward per probe, ms
    rank_wait_ms: list[float] | None = None  # per rank: its median step minus its compute of the step

    def to_dict(self) -> dict:
        return asdict(self)
