"""Uncertainty of step times: a hierarchical bootstrap of each cell's median, and intervals of anything
derived from medians, computed replicate by replicate.

Why hierarchical: on a shared machine the larger part of the noise is between runs (repeats), not
between the steps of one run. Each bootstrap replicate first resamples a cell's repeats (with
replacement), then the steps within each chosen repeat, and takes the median of the pooled steps, so
between-run variance is in the interval. With few repeats a bootstrap is too narrow (it sees only R
distinct runs); the replicates' spread around their centre is widened by the small-sample factor
t(0.975, R-1) / z(0.975) (1.0 from about 30 repeats on), the way a t interval would widen a normal one.
The widening is multiplicative (on the log of the step time): step times are positive and their noise
scales with them, and an additive widening of 3 noisy repeats (x 2.2) could push a replicate to zero or
below, which made an efficiency's interval start at 0.1%.

Derived figures (a ratio, a difference, an efficiency) are computed on every replicate of their inputs
— independent cells are resampled independently — and their interval is the 2.5/97.5 percentiles.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

N_BOOT = 2000
LEVEL = 0.95
_T975 = {
    1: 12.706,
    2: 4.303,
    3: 3.182,
    4: 2.776,
    5: 2.571,
    6: 2.447,
    7: 2.365,
    8: 2.306,
    9: 2.262,
    10: 2.228,
    12: 2.179,
    15: 2.131,
    20: 2.086,
    30: 2.042,
}
_Z975 = 1.959964


def t_factor(n_repeats: int) -> float:
    """t(0.975, n-1) / z(0.975): how much wider a small-sample interval is than a normal one."""
    if n_repeats < 2:
        return 1.0
    dof = n_repeats - 1
    known = max(k for k in _T975 if k <= dof) if dof < 30 else 30
    return (_T975[known] if dof < 30 else _Z975 + 2.4 / dof) / _Z975


def _padded(repeats: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """(R, T_max) array padded with NaN, and each repeat's length."""
    lens = np.array([len(r) for r in repeats])
    out = np.full((len(repeats), lens.max()), np.nan)
    for i, r in enumerate(repeats):
        out[i, : len(r)] = r
    return out, lens


def bootstrap_median(repeats: list[np.ndarray], rng: np.random.Generator, n_boot: int = N_BOOT) -> np.ndarray:
    """Replicates of the pooled median: resample repeats, then steps within each, widened for few repeats."""
    repeats = [np.asarray(r, dtype=float) for r in repeats if len(r)]
    if sum(len(r) for r in repeats) < 2:
        return np.full(n_boot, np.nan)  # one number: no information about its noise
    arr, lens = _padded(repeats)
    r, t_max = arr.shape
    pick = rng.integers(0, r, size=(n_boot, r))  # (B, R) which repeats
    steps = (rng.random((n_boot, r, t_max)) * lens[pick][..., None]).astype(int)  # (B, R, T) within each
    values = arr[pick[..., None], steps]  # (B, R, T)
    values[np.arange(t_max)[None, None, :] >= lens[pick][..., None]] = np.nan  # beyond a repeat's length
    reps = np.nanmedian(values.reshape(n_boot, -1), axis=1)
    centre = float(np.median(np.concatenate(repeats)))
    if centre > 0 and (reps > 0).all():  # step times: widen on the log scale, so a replicate never reaches 0
        return centre * np.exp(np.log(reps / centre) * t_factor(r))
    return centre + (reps - centre) * t_factor(r)


def interval(reps: np.ndarray) -> tuple[float, float]:
    """The central 95% of replicates (NaN where there are none)."""
    reps = np.asarray(reps, dtype=float)
    reps = reps[np.isfinite(reps)]
    if not len(reps):
        return math.nan, math.nan
    lo, hi = np.percentile(reps, [100 * (1 - LEVEL) / 2, 100 * (1 + LEVEL) / 2])
    return float(lo), float(hi)


def repeats_of(group: pd.DataFrame) -> list[np.ndarray]:
    """Each row's per-step times (ms); a row without them stands for one step at its median."""
    out = []
    per_step = group["step_times_ms"] if "step_times_ms" in group else [None] * len(group)
    for times, median in zip(per_step, group["step_ms"], strict=True):
        has_times = times is not None and len(times) > 0
        out.append(np.asarray(times, dtype=float) if has_times else np.array([median], dtype=float))
    return out


def cell_replicates(rows: pd.DataFrame, keys: list[str], seed: int = 0) -> pd.DataFrame:
    """One line per configuration (`keys`): pooled median step, its interval, n_repeats, n_steps and the
    bootstrap replicates (`step_ms_reps`, an array per line) for propagation."""
    rng = np.random.default_rng(seed)
    lines = []
    for key, grp in rows.groupby(keys, dropna=False, sort=True):
        reps = repeats_of(grp)
        boot = bootstrap_median(reps, rng)
        lo, hi = interval(boot)
        pooled = np.concatenate(reps)
        lines.append(
            {
                **dict(zip(keys, key, strict=True)),
                "step_ms": float(np.median(pooled)),
                "step_ms_ci_lo": lo,
                "step_ms_ci_hi": hi,
                "n_repeats": len(reps),
                "n_steps": int(sum(len(t) for t in grp.get("step_times_ms", []) if t is not None)),
                "step_ms_reps": boot,
            }
        )
    return pd.DataFrame(lines)


def rel_width(lo: float, hi: float, centre: float) -> float:
    """Interval width relative to its centre (e.g. 0.04 = ±2%)."""
    return (hi - lo) / centre if centre else math.nan
