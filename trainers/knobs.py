"""Every knob of a measured configuration, declared once (torch-free).

One `Knob` per setting that can make two measurements different configurations. Everything else is derived
from this table: `trainers.config.StepConfig`'s fields and their checks, the spec's axes and settings
(`sweeps.spec`), the grid and the cell id (`sweeps.grid`), the row schema and what older rows read
(`results.schema`), and every view's notion of "the same configuration" (`results.identity`: the analyses,
compare, recommend, racing, scaling, the summary and the dashboard).

Adding a knob: one entry here, and the code that applies it (a DDP keyword needs none: `trainers.step.ddp_kwargs`
passes every knob that names one).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

MODES = ("single", "ddp", "naive")
COMM_HOOKS = ("none", "fp16", "bf16", "powersgd")
LOSSY_HOOKS = ("fp16", "bf16", "powersgd")  # hooks that compress: their gradient is approximate by design
TIMINGS = ("sync", "events", "loop")
BACKENDS = ("auto", "nccl", "gloo")
OPTIMIZE_DDP = ("ddp_optimizer", "python_reducer", "no_optimization")
COMPILE_BACKENDS = ("inductor", "aot_eager")
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


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


@dataclass(frozen=True, kw_only=True)
class Knob:
    """One setting of a measured configuration."""

    name: str
    """Its name in StepConfig, the spec (unless `spec` is OWN) and the row schema."""
    kind: str
    """Its values: `bool`, `int`, `float`, `str` or `choice` (one of `choices`)."""
    default: Any
    """The harness's default (a cell that does not set it)."""
    doc: str
    """What it does, as the spec reference prints it."""
    scope: str
    """`workload` (what is computed), `measure` (how it is timed), `step` (mode, gas, no_sync), `compile` (eager
    or torch.compile: baselines too), `ddp` (the DDP wrapper: normalized away outside ddp mode), `placement`
    (ranks, nodes, backend) or `env` (variables)."""
    spec: str = OWN
    """`axis` (a list in the spec, crossed in the grid), `setting` (one value per sweep) or `own` (the spec has
    its own field or rule for it, named in `doc`)."""
    choices: tuple = ()
    """`choice` knobs: the values allowed in a spec (StepConfig may allow more, e.g. mode `single`)."""
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
    pytorch_default: Any = UNSET
    """PyTorch's own default, where a user's script chooses it (recommend compares the best with it)."""
    ddp_kwarg: str | None = None
    """The DistributedDataParallel keyword it sets (recommend's snippet writes it when not PyTorch's default)."""
    applies: Callable[[Any], bool] | None = None
    """When it applies to a StepConfig; elsewhere it reads `off`, so one cell has one spelling."""
    off: Any = UNSET
    """Its value where it does not apply (UNSET: its default)."""
    arrow: str = ""
    """The row column's Arrow type: string, int32, int64, float64 or bool (derived from `kind` when empty)."""

    @property
    def value_off(self) -> Any:
        return self.default if self.off is UNSET else self.off

    @property
    def column_type(self) -> str:
        return self.arrow or {"bool": "bool", "int": "int32", "float": "float64"}.get(self.kind, "string")

    @property
    def chosen(self) -> bool:
        """A setting a user picks in their own training script: recommend chooses among its measured values."""
        return self.pytorch_default is not UNSET


def _ddp(cfg: Any) -> bool:
    return cfg.mode == "ddp"


def _compiled(cfg: Any) -> bool:
    return bool(cfg.compile)


def _compiled_ddp(cfg: Any) -> bool:
    return cfg.mode == "ddp" and bool(cfg.compile)


def _powersgd(cfg: Any) -> bool:
    return cfg.mode == "ddp" and cfg.comm_hook == "powersgd"


KNOBS: tuple[Knob, ...] = (
    Knob(
        name="model",
        kind="str",
        default="tiny",
        scope=WORKLOAD,
        hashed=ALWAYS,
        doc="Model preset name (trainers.presets); with `workload`, the workload's import path (spec: `model`).",
    ),
    Knob(
        name="workload",
        kind="str",
        default=None,
        nullable=True,
        scope=WORKLOAD,
        older_rows=None,
        doc="A user workload by import path `package.module:factory` (trainers.workload); null: the preset "
        "(spec: `workload`).",
    ),
    Knob(
        name="workload_args",
        kind="str",
        default="{}",
        scope=WORKLOAD,
        older_rows="{}",
        doc="The factory's keyword arguments as canonical JSON (sorted keys, compact) (spec: `workload_args`).",
    ),
    Knob(
        name="workload_fingerprint",
        kind="str",
        default=None,
        nullable=True,
        scope=WORKLOAD,
        hashed=USER_WORKLOAD,
        doc="Hash of the model's parameter names, shapes and dtypes as planned; the worker refuses a model that "
        "differs. Joins the cell id for user workloads only (a preset's name fixes its shapes).",
    ),
    Knob(
        name="mode",
        kind="choice",
        choices=MODES,
        default="ddp",
        scope=STEP,
        hashed=ALWAYS,
        doc="`single` (one process, no wrapper: the baseline), `ddp`, or `naive` (all_reduce per .grad) "
        "(spec: `modes`, the baseline always added).",
    ),
    Knob(
        name="micro_batch",
        kind="int",
        default=8,
        lo=1,
        hi=65_536,
        scope=WORKLOAD,
        spec=SETTING,
        hashed=ALWAYS,
        doc="Samples (sequences) per rank per micro-step.",
    ),
    Knob(
        name="seq_len",
        kind="int",
        default=64,
        lo=1,
        scope=WORKLOAD,
        spec=SETTING,
        hashed=ALWAYS,
        doc="Tokens per sequence, at most the preset's block size (a user workload: 1).",
    ),
    Knob(
        name="gas",
        kind="int",
        default=1,
        lo=1,
        hi=4_096,
        scope=STEP,
        spec=AXIS,
        hashed=ALWAYS,
        doc="Gradient-accumulation micro-steps per optimizer step.",
    ),
    Knob(
        name="no_sync",
        kind="bool",
        default=False,
        scope=STEP,
        spec=AXIS,
        hashed=ALWAYS,
        pytorch_default=False,
        applies=lambda c: c.gas > 1 and c.mode != "single",
        doc="Skip the gradient sync on the first gas-1 micro-steps (DDP's `no_sync()`).",
    ),
    Knob(
        name="bucket_cap_mb",
        kind="float",
        default=25.0,
        lo=0.001,
        hi=100_000,
        scope=DDP,
        spec=AXIS,
        hashed=ALWAYS,
        pytorch_default=25.0,
        ddp_kwarg="bucket_cap_mb",
        applies=_ddp,
        off=None,
        doc="DDP's bucket capacity in MB (the U-curve's x axis).",
    ),
    Knob(
        name="gradient_as_bucket_view",
        kind="bool",
        default=True,
        scope=DDP,
        spec=AXIS,
        hashed=ALWAYS,
        pytorch_default=False,
        ddp_kwarg="gradient_as_bucket_view",
        applies=_ddp,
        off=None,
        doc="Make each .grad a view into DDP's bucket memory (saves a copy and the memory of one gradient).",
    ),
    Knob(
        name="warmup_steps",
        kind="int",
        default=3,
        lo=0,
        hi=100_000,
        scope=MEASURE,
        spec=SETTING,
        hashed=ALWAYS,
        doc="Untimed optimizer steps per cell before measuring.",
    ),
    Knob(
        name="timed_steps",
        kind="int",
        default=10,
        lo=1,
        hi=1_000_000,
        scope=MEASURE,
        hashed=ALWAYS,
        doc="Timed optimizer steps; adaptive timing: the size of every batch of them (spec: `timed_steps`, an "
        "integer or `auto`).",
    ),
    Knob(
        name="target_rel_ci",
        kind="float",
        default=None,
        nullable=True,
        lo=0,
        hi=1,
        scope=MEASURE,
        older_rows=None,
        doc="Adaptive timing: step until the median's 95% interval is within ±this fraction; null: fixed steps "
        "(spec: `target_rel_ci` with `timed_steps: auto`).",
    ),
    Knob(
        name="max_timed_steps",
        kind="int",
        default=200,
        lo=1,
        hi=1_000_000,
        scope=MEASURE,
        older_rows=200,
        doc="Adaptive timing: at most this many timed steps (spec: with `timed_steps: auto`).",
    ),
    Knob(
        name="max_cell_s",
        kind="float",
        default=60.0,
        lo=0.001,
        hi=86_400,
        scope=MEASURE,
        older_rows=60.0,
        doc="Adaptive timing: no further batch once the timed steps took this long, s (spec: with "
        "`timed_steps: auto`).",
    ),
    Knob(
        name="trace_comm",
        kind="bool",
        default=False,
        scope=MEASURE,
        spec=SETTING,
        older_rows=False,
        applies=_ddp,
        doc="Record each bucket's all-reduce launch and completion in the timed steps (a comm hook that does "
        "what DDP's own does); ddp mode only.",
    ),
    Knob(
        name="seed",
        kind="int",
        default=1337,
        lo=0,
        scope=WORKLOAD,
        older_rows=1337,
        arrow="int64",
        doc="Model-init seed (the same on every rank); data uses it with the rank and micro-step. Not in specs.",
    ),
    Knob(
        name="comm_hook",
        kind="choice",
        choices=COMM_HOOKS,
        default="none",
        scope=DDP,
        spec=AXIS,
        older_rows="none",
        pytorch_default="none",
        applies=_ddp,
        doc="DDP communication hook: `none` (DDP's own all-reduce), `fp16` / `bf16` (gradients cast for the "
        "all-reduce: half the bytes, rounded values; bf16 needs CUDA + NCCL) or `powersgd` (low-rank, error "
        "feedback). Every hook but `none` changes the numerics.",
    ),
    Knob(
        name="powersgd_rank",
        kind="int",
        default=1,
        lo=1,
        hi=1_024,
        scope=DDP,
        spec=AXIS,
        older_rows=1,
        pytorch_default=1,
        applies=_powersgd,
        doc="PowerSGD's matrix_approximation_rank (only crossed with `powersgd`).",
    ),
    Knob(
        name="powersgd_start_iter",
        kind="int",
        default=2,
        lo=2,
        hi=100_000,
        scope=DDP,
        spec=SETTING,
        older_rows=2,
        pytorch_default=2,
        applies=_powersgd,
        doc="PowerSGD: synchronized steps of plain all-reduce before compression starts (at most warmup_steps, "
        "so the timed steps are compressed).",
    ),
    Knob(
        name="first_bucket_mb",
        kind="float",
        default=None,
        nullable=True,
        lo=0.001,
        hi=100_000,
        scope=DDP,
        spec=AXIS,
        older_rows=None,
        pytorch_default=None,
        applies=_ddp,
        doc="DDP's first bucket in MB, given as per-bucket caps `bucket_cap_mb_list=[first, cap]`; null: "
        "PyTorch's default.",
    ),
    Knob(
        name="static_graph",
        kind="bool",
        default=False,
        scope=DDP,
        spec=AXIS,
        older_rows=False,
        pytorch_default=False,
        ddp_kwarg="static_graph",
        applies=_ddp,
        doc="DDP's static_graph (the graph and the parameters used are the same every step).",
    ),
    Knob(
        name="broadcast_buffers",
        kind="bool",
        default=True,
        scope=DDP,
        spec=AXIS,
        older_rows=True,
        pytorch_default=True,
        ddp_kwarg="broadcast_buffers",
        applies=_ddp,
        doc="DDP's broadcast_buffers (rank 0's buffers sent to every rank at each forward).",
    ),
    Knob(
        name="timing",
        kind="choice",
        choices=TIMINGS,
        default="sync",
        scope=MEASURE,
        spec=AXIS,
        older_rows="sync",
        doc="How each timed step is timed: `sync` (wall clock, the device synchronized around every step), "
        "`events` (CUDA events, no host sync between steps; sync on CPU) or `loop` (one interval over all "
        "timed steps: the mean step). Crosses every cell, baselines too.",
    ),
    Knob(
        name="find_unused_parameters",
        kind="bool",
        default=False,
        scope=DDP,
        spec=AXIS,
        older_rows=False,
        pytorch_default=False,
        ddp_kwarg="find_unused_parameters",
        applies=_ddp,
        doc="DDP's find_unused_parameters: traverse the autograd graph after each forward to mark parameters "
        "that get no gradient (needed by models that skip some; costs a graph walk every step).",
    ),
    Knob(
        name="compile",
        kind="bool",
        default=False,
        scope=COMPILE,
        spec=AXIS,
        older_rows=False,
        pytorch_default=False,
        doc="Run the step through `torch.compile`: the DDP-wrapped model compiled (PyTorch's documented pattern; "
        "single and naive cells compile the bare model), compiled during warm-up until it stops recompiling. "
        "Crosses every cell, baselines too.",
    ),
    Knob(
        name="optimize_ddp",
        kind="choice",
        choices=OPTIMIZE_DDP,
        default="ddp_optimizer",
        scope=DDP,
        spec=AXIS,
        older_rows=None,
        pytorch_default="ddp_optimizer",
        applies=_compiled_ddp,
        off=None,
        doc="`torch._dynamo.config.optimize_ddp` for a compiled DDP cell: `ddp_optimizer` (the graph split at "
        "the bucket boundaries so the all-reduces overlap the backward; its first bucket is 1 MiB, so a cap "
        "below 1 MB fails), `python_reducer` (the all-reduces traced into one backward graph by compiled "
        "autograd, switched on for it; no comm hooks) or `no_optimization` (one graph, no overlap).",
    ),
    Knob(
        name="compile_backend",
        kind="choice",
        choices=COMPILE_BACKENDS,
        default="inductor",
        scope=COMPILE,
        spec=SETTING,
        older_rows=None,
        pytorch_default="inductor",
        applies=_compiled,
        off=None,
        doc="torch.compile's backend for compiled cells: `inductor` (generated kernels) or `aot_eager` (the "
        "traced graphs run eagerly: quick checks of the compiled path).",
    ),
    Knob(
        name="compile_mode",
        kind="choice",
        choices=COMPILE_MODES,
        default="default",
        scope=COMPILE,
        spec=SETTING,
        older_rows=None,
        pytorch_default="default",
        applies=_compiled,
        off=None,
        doc="torch.compile's `mode` for compiled cells with inductor (`reduce-overhead` adds CUDA graphs).",
    ),
    Knob(
        name="world_size",
        kind="int",
        default=1,
        lo=1,
        hi=65_536,
        scope=PLACEMENT,
        hashed=ALWAYS,
        doc="DDP ranks, 1 for the baseline (spec: `topology`, or `workers` x `nodes`).",
    ),
    Knob(
        name="num_nodes",
        kind="int",
        default=1,
        lo=1,
        hi=4_096,
        scope=PLACEMENT,
        hashed=ALWAYS,
        doc="Nodes the ranks are spread over, evenly (spec: `topology`, or `nodes`).",
    ),
    Knob(
        name="backend",
        kind="choice",
        choices=BACKENDS,
        default="auto",
        scope=PLACEMENT,
        hashed=ALWAYS,
        doc="The process group's backend: the spec asks `auto`, `nccl` or `gloo` (spec: `backend`); rows "
        "record it as run (nccl | gloo | none for the baseline).",
    ),
    Knob(
        name="env_grid",
        kind="str",
        default="{}",
        scope=ENV,
        older_rows="{}",
        pytorch_default="{}",
        doc="The cell's `env_grid` values as canonical JSON: variables its worker group starts with (NCCL and "
        "gloo read them once per process) (spec: `env_grid`).",
    ),
)

BY_NAME: dict[str, Knob] = {k.name: k for k in KNOBS}
STEP_KNOBS: tuple[Knob, ...] = tuple(k for k in KNOBS if k.scope not in (PLACEMENT, ENV))
"""The knobs every rank runs: StepConfig's fields, in this order."""
SPEC_AXES: tuple[Knob, ...] = tuple(k for k in STEP_KNOBS if k.spec == AXIS)
SPEC_SETTINGS: tuple[Knob, ...] = tuple(k for k in STEP_KNOBS if k.spec == SETTING)
GRID_AXES: tuple[Knob, ...] = tuple(k for k in SPEC_AXES if k.scope == DDP)
"""The DDP wrapper's axes, crossed for every DDP cell (gas, no_sync and timing have rules of their own)."""
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


def at_default(knob: Knob, value: Any) -> bool:
    """`value` is the knob's default, or its `off` value (it does not apply): nothing a label needs to say."""
    return show(value) in (show(knob.default), show(knob.value_off))


def show(value: Any) -> str:
    """A value as text shows it: booleans lower-case, numbers short, null as a dash."""
    value = value.item() if hasattr(value, "item") else value  # numpy scalars from a frame
    if value is None or (isinstance(value, float) and value != value):
        return "-"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)
