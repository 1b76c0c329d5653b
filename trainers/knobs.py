"""Every knob of a measured configuration, declared once (torch-free): the table is `knobs.json`, beside this file.

One `Knob` per setting that can make two measurements different configurations. The table is data so that
`results` reads the same declaration without importing this package (the layer rule: trainers and results never
import each other; results.knobs reads the file). Everything else is derived from it: `trainers.config.StepConfig`'s
fields and their checks, the spec's axes and settings (`sweeps.spec`), the grid and the cell id (`sweeps.grid`), the
row schema and what older rows read (`results.schema`), and every view's notion of "the same configuration"
(`results.identity`: the analyses, compare, recommend, racing, scaling, the summary and the dashboard).

Adding a knob: one entry in knobs.json, and the code that applies it (a DDP keyword needs none:
`trainers.replica.ddp_kwargs` passes every knob that names one; a rule for `applies` goes in APPLIES).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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
    """The row column's Arrow type: string, int32, int64, float64 or bool (derived from `kind` when empty; the
    row schema reads it, results.knobs.Knob.column_type)."""

    @property
    def value_off(self) -> Any:
        return self.default if self.off is UNSET else self.off


def _ddp(cfg: Any) -> bool:
    return cfg.mode == "ddp"


def _accumulating(cfg: Any) -> bool:
    return cfg.gas > 1 and cfg.mode != "single"


def _compiled(cfg: Any) -> bool:
    return bool(cfg.compile)


def _compiled_ddp(cfg: Any) -> bool:
    return cfg.mode == "ddp" and bool(cfg.compile)


def _powersgd(cfg: Any) -> bool:
    return cfg.mode == "ddp" and cfg.comm_hook == "powersgd"


APPLIES: dict[str, Callable[[Any], bool]] = {
    "ddp": _ddp,
    "accumulating": _accumulating,
    "compiled": _compiled,
    "compiled_ddp": _compiled_ddp,
    "powersgd": _powersgd,
}
"""The rules a knob's `applies` names in the table (knobs.json): when it applies to a StepConfig."""

TABLE = Path(__file__).with_name("knobs.json")
"""The table itself, as data: results reads the same file (results.knobs) without importing this package."""


def _knob(entry: dict[str, Any]) -> Knob:
    """One table entry as a Knob: lists become tuples, `applies` its rule."""
    fields = {k: tuple(v) if isinstance(v, list) else v for k, v in entry.items()}
    if "applies" in fields:
        fields["applies"] = APPLIES[fields["applies"]]
    return Knob(**fields)


KNOBS: tuple[Knob, ...] = tuple(_knob(e) for e in json.loads(TABLE.read_text(encoding="utf-8"))["knobs"])

BY_NAME: dict[str, Knob] = {k.name: k for k in KNOBS}
STEP_KNOBS: tuple[Knob, ...] = tuple(k for k in KNOBS if k.scope not in (PLACEMENT, ENV))
"""The knobs every rank runs: StepConfig's fields, in this order."""
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
