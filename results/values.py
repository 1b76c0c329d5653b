"""Values as Python and JSON hold them, whatever frame or array they came from: one set for every edge."""

from __future__ import annotations

import math

import pandas as pd


def plain(v: object) -> object:
    """A Python value: numpy scalars and arrays as Python ones; NaN, pd.NA and NaT as None."""
    v = v.tolist() if hasattr(v, "tolist") else v
    if isinstance(v, list):
        return v
    return None if v is None or (isinstance(v, float) and math.isnan(v)) or v is pd.NA or v is pd.NaT else v


def number(v: object) -> float | None:
    """A finite float, or None (missing, NaN, infinite, or not a number)."""
    try:
        x = float(v)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def json_safe(v: object) -> object:
    """A value JSON can hold: plain values all the way down, and a number that is not finite as null (JSON has
    no NaN or Infinity)."""
    if isinstance(v, dict):
        return {str(k): json_safe(x) for k, x in v.items()}
    if isinstance(v, list | tuple) or hasattr(v, "tolist") and not isinstance(v, float | int):
        v = v.tolist() if hasattr(v, "tolist") else v
        if isinstance(v, list | tuple):
            return [json_safe(x) for x in v]
    v = plain(v)
    return None if isinstance(v, float) and not math.isfinite(v) else v
