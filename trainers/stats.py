"""Summary statistics of per-step times (pure Python, no torch)."""

from __future__ import annotations

import math
import statistics


def percentile(sorted_values: list[float], q: float) -> float:
    """Linear-interpolated percentile (q in [0, 100]) of an ascending list, as numpy's default."""
    if not sorted_values:
        raise ValueError("percentile of an empty list")
    pos = (len(sorted_values) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def summarize(times_ms: list[float]) -> dict[str, float]:
    """median, mean, p10, p90 and coefficient of variation (std / mean) of step times in ms."""
    s = sorted(times_ms)
    mean = statistics.fmean(s)
    std = statistics.pstdev(s) if len(s) > 1 else 0.0
    return {
        "step_ms": statistics.median(s),
        "step_ms_mean": mean,
        "step_ms_p10": percentile(s, 10),
        "step_ms_p90": percentile(s, 90),
        "step_ms_cv": std / mean if mean else 0.0,
    }


def median_ci(values: list[float], z: float = 1.959964) -> tuple[float, float]:
    """Distribution-free 95% interval of the median: the order statistics n/2 ± z·√n/2 (needs n >= 6)."""
    s = sorted(values)
    n = len(s)
    if n < 6:
        return s[0], s[-1]
    half = z * math.sqrt(n) / 2
    lo, hi = max(0, math.floor(n / 2 - half) - 1), min(n - 1, math.ceil(n / 2 + half))
    return s[lo], s[hi]


def median_rel_half_width(values: list[float]) -> float:
    """Half the width of the median's 95% interval, relative to the median (0.02 = ±2%)."""
    lo, hi = median_ci(values)
    return (hi - lo) / 2 / statistics.median(values)
