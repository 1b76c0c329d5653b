"""The declarations results reads from trainers, in one place: the knob table and the fields of a measurement
(trainers.knobs, torch-free); and how knob values read.

Every other module of results imports them from here, never trainers, torch or Ray.
"""

from __future__ import annotations

from typing import Any

from trainers.knobs import (  # noqa: F401 — re-exported for results' modules
    BY_NAME,
    COMPILE,
    ENV,
    KNOBS,
    MEASURE,
    PLACEMENT,
    STEP_KNOBS,
    SWEPT,
    UNSET,
    WORKLOAD,
    Knob,
    Measurement,
)


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
