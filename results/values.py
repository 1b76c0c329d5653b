"""Values as Python and JSON hold them, whatever frame or array they came from, and as a person reads them in a
table: one set for every edge."""

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


def text(v: object) -> str:
    """A table cell as text: floats to 3 significant digits under 1, else one decimal; missing values as a dash; a
    list as its values joined."""
    if isinstance(v, float):  # numpy's float64 is one too
        return "–" if math.isnan(v) else short(v)
    if v is None or v is pd.NA or v is pd.NaT:
        return "–"
    if isinstance(v, list | tuple):  # a set of values, e.g. the buckets indistinguishable from the best
        return ", ".join(f"{x:g}" if isinstance(x, float) else str(x) for x in v)
    return str(v)


def short(v: float) -> str:
    return f"{v:.3g}" if abs(v) < 1 else f"{v:.1f}"


def with_intervals(df: pd.DataFrame, names: list[str]) -> pd.DataFrame:
    """Each named figure as text 'median [lo, hi]' where its interval (`NAME_ci_lo`, `NAME_ci_hi`) is known."""
    if df.empty:
        return df
    out = df.copy()
    for name in names:
        lo, hi = out.get(f"{name}_ci_lo"), out.get(f"{name}_ci_hi")
        if lo is None:
            continue
        out[name] = [
            text(v) if pd.isna(a) or pd.isna(v) else f"{short(v)} [{short(a)}, {short(b)}]"
            for v, a, b in zip(out[name], lo, hi, strict=True)
        ]
    return out
