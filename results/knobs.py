"""The knob table as results reads it: the same data file trainers declares it in, read, not imported.

`trainers/knobs.json` is the one declaration of a configuration (trainers.knobs documents each field). The
layer rule keeps results from importing trainers, so this module finds the file where the `trainers` package
lies (`importlib.util.find_spec` runs no code of it; Ray's py_modules ship each package to a folder of its own)
and keeps of each entry what rows, schemas and views need. tests/test_identity.py holds the two readings equal.
"""

from __future__ import annotations

import importlib.util
import json
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

# where a knob sits in a configuration (trainers.knobs: the same words)
WORKLOAD, MEASURE, COMPILE, PLACEMENT, ENV = "workload", "measure", "compile", "placement", "env"
SWEPT = "bucket_cap_mb"
"""The knob a U-curve is drawn over."""


class _Unset:
    def __repr__(self) -> str:
        return "UNSET"


UNSET: Any = _Unset()
"""A field the table leaves out: no value (trainers.knobs.UNSET reads the same entries alike)."""


@dataclass(frozen=True, kw_only=True)
class Knob:
    """One table entry, as far as results reads it (the meaning of each field: trainers.knobs.Knob)."""

    name: str
    kind: str
    default: Any
    scope: str
    choices: tuple = ()
    lo: float | None = None
    hi: float | None = None
    older_rows: Any = UNSET
    pytorch_default: Any = UNSET
    ddp_kwarg: str | None = None
    applies: str | None = None
    """The rule's name: None, it applies to every cell."""
    off: Any = UNSET
    arrow: str = ""

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


def table_path() -> Path:
    """trainers/knobs.json, wherever the trainers package is installed or shipped."""
    spec = importlib.util.find_spec("trainers")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("results needs the trainers package beside it: its knobs.json declares the row columns")
    return Path(next(iter(spec.submodule_search_locations))) / "knobs.json"


_READ = {f.name for f in fields(Knob)}  # of each entry, what results keeps
KNOBS: tuple[Knob, ...] = tuple(
    Knob(**{k: tuple(v) if k == "choices" else v for k, v in entry.items() if k in _READ})
    for entry in json.loads(table_path().read_text(encoding="utf-8"))["knobs"]
)
BY_NAME: dict[str, Knob] = {k.name: k for k in KNOBS}
STEP_KNOBS: tuple[Knob, ...] = tuple(k for k in KNOBS if k.scope not in (PLACEMENT, ENV))
"""The knobs every rank runs (StepConfig's fields), in the table's order."""


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
