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

Derived figures (a ratio, a difference, an efficiency) are computed on every replicate of their inputs, and
their interval is the 2.5/97.5 percentiles. Round-blocked: the cells of one worker group are measured seconds
apart in the same round, so every replicate draws the group's rounds once and resamples all its cells with
those draws; a slow round then moves every cell together and cancels in a ratio between them. Cells of
different groups, sweeps or clusters are resampled independently (unpaired).
"""

from __future__ import annotations

import math
import warnings

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
    """Replicates of one cell's pooled median, its repeats resampled on their own (unpaired)."""
    units = {("cell", i): np.asarray(r, dtype=float) for i, r in enumerate(repeats) if len(r)}
    picks = round_picks({"cell": list(range(len(repeats)))}, rng, n_boot)
    return blocked_median(units, picks, rng, n_boot)


def round_picks(rounds: dict[object, list], rng: np.random.Generator, n_boot: int = N_BOOT) -> dict:
    """Per block (a worker group): its rounds and which of them each replicate draws, (B, n_rounds). Every
    cell of a block is resampled with the same draws, so a slow round moves all of them together."""
    return {b: (list(rs), rng.integers(0, len(rs), size=(n_boot, len(rs)))) for b, rs in rounds.items()}


def blocked_median(
    units: dict[tuple, np.ndarray], picks: dict, rng: np.random.Generator, n_boot: int = N_BOOT
) -> np.ndarray:
    """Replicates of a cell's pooled median from its measurements `units` ({(block, round): step times}):
    each replicate takes the rounds its blocks drew (a round the cell missed adds nothing), then steps
    within each, widened for few rounds (see the module docstring)."""
    units = {u: np.asarray(t, dtype=float) for u, t in units.items() if len(t)}
    if sum(len(t) for t in units.values()) < 2:
        return np.full(n_boot, np.nan)  # one number: no information about its noise
    index = {u: i for i, u in enumerate(units)}
    blocks = sorted({b for b, _ in units}, key=str)
    which = np.concatenate(
        [np.array([index.get((b, r), -1) for r in picks[b][0]])[picks[b][1]] for b in blocks], axis=1
    )  # (B, D): the cell's unit behind each drawn round, -1 where it has none
    arr, lens = _padded(list(units.values()))
    t_max = arr.shape[1]
    drawn_lens = np.where(which >= 0, lens[np.maximum(which, 0)], 0)  # (B, D)
    steps = (rng.random((n_boot, which.shape[1], t_max)) * drawn_lens[..., None]).astype(int)  # (B, D, T)
    values = arr[np.maximum(which, 0)[..., None], steps]
    values[np.arange(t_max)[None, None, :] >= drawn_lens[..., None]] = np.nan
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a replicate that drew only missed rounds: NaN
        reps = np.nanmedian(values.reshape(n_boot, -1), axis=1)
    return _widened(reps, float(np.median(np.concatenate(list(units.values())))), t_factor(len(units)))


def _widened(reps: np.ndarray, centre: float, factor: float) -> np.ndarray:
    """Replicates' spread around `centre` times `factor`: on the log scale for step times (never reaching 0),
    the same factor for every cell, so paired replicates stay paired."""
    finite = reps[np.isfinite(reps)]
    if centre > 0 and (finite > 0).all():
        return centre * np.exp(np.log(reps / centre) * factor)
    return centre + (reps - centre) * factor


def interval(reps: np.ndarray, level: float = LEVEL) -> tuple[float, float]:
    """The central `level` (95%) of replicates (NaN where there are none)."""
    reps = np.asarray(reps, dtype=float)
    reps = reps[np.isfinite(reps)]
    if not len(reps):
        return math.nan, math.nan
    lo, hi = np.percentile(reps, [100 * (1 - level) / 2, 100 * (1 + level) / 2])
    return float(lo), float(hi)


def repeats_of(group: pd.DataFrame) -> list[np.ndarray]:
    """Each row's per-step times (ms); a row without them stands for one step at its median."""
    out = []
    per_step = group["step_times_ms"] if "step_times_ms" in group else [None] * len(group)
    for times, median in zip(per_step, group["step_ms"], strict=True):
        has_times = times is not None and len(times) > 0
        out.append(np.asarray(times, dtype=float) if has_times else np.array([median], dtype=float))
    return out


GROUP = ["cluster", "sweep_id", "group_id"]  # a worker group: its rounds are resampled jointly


def _units_of(rows: pd.DataFrame, keys: list[str]) -> tuple[pd.Series, pd.Series]:
    """Each row's block and round: its worker group and round where the configuration was measured in one
    group, else a block of the configuration's own with the row's position as its round (unpaired: under
    `isolation: cell` every measurement is a group of its own; after a re-plan a cell spans two)."""
    config = rows.groupby(keys, dropna=False, sort=True).ngroup()
    block = "config " + config.astype(str)
    rnd = rows.groupby(keys, dropna=False, sort=True).cumcount().astype(int)
    if all(c in rows for c in [*GROUP, "round"]):
        named = rows["cluster"].astype(str) + "/" + rows["sweep_id"].astype(str) + "/" + rows["group_id"].astype(str)
        known = rows[[*GROUP, "round"]].notna().all(axis=1)
        one_group = named.where(known).groupby(config).transform("nunique").eq(1) & known.groupby(config).transform(
            "all"
        )
        block = block.where(~one_group, named)
        rnd = rnd.where(~one_group, rows["round"].where(one_group, -1).astype(int))
    return block, rnd


def cell_replicates(rows: pd.DataFrame, keys: list[str], seed: int = 0, n_boot: int | None = None) -> pd.DataFrame:
    """One line per configuration (`keys`): pooled median step, its interval, n_repeats, n_steps and the
    bootstrap replicates (`step_ms_reps`, an array per line) for propagation. Configurations measured in
    the same worker group share their round draws (round-blocked): a ratio of two of them, computed
    replicate by replicate, is paired by round; across groups, sweeps and clusters it is unpaired."""
    rng, n_boot = np.random.default_rng(seed), n_boot or N_BOOT
    rows = rows.reset_index(drop=True)  # a concatenation may repeat labels
    block, rnd = _units_of(rows, keys)
    rounds = {b: sorted(set(r)) for b, r in rnd.groupby(block)}
    picks = round_picks(dict(sorted(rounds.items())), rng, n_boot)
    lines = []
    for key, grp in rows.groupby(keys, dropna=False, sort=True):
        reps = repeats_of(grp)
        units: dict[tuple, np.ndarray] = {}
        for unit, times in zip(zip(block[grp.index], rnd[grp.index], strict=True), reps, strict=True):
            units[unit] = np.concatenate([units[unit], times]) if unit in units else times
        boot = blocked_median(units, picks, rng, n_boot)
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
                "round_var_share": round_var_share(list(units.values())),
            }
        )
    return pd.DataFrame(lines)


def round_var_share(rounds: list[np.ndarray]) -> float:
    """Of the variance of a round's median (log scale), the part between rounds: var(round medians) minus what
    the steps alone explain (a median of T steps varies about pi/2 * s²/T), over the total (Kalibera & Jones:
    find the level the variance is at before choosing what to repeat). NaN under two rounds."""
    logs = [np.log(r[r > 0]) for r in rounds if (np.asarray(r) > 0).sum() >= 2]
    if len(logs) < 2:
        return math.nan
    within = float(np.mean([math.pi / 2 * np.var(x, ddof=1) / len(x) for x in logs]))
    between = float(np.var([np.median(x) for x in logs], ddof=1))
    total = max(between, within)
    return (total - within) / total if total > 0 else 0.0


def rel_width(lo: float, hi: float, centre: float) -> float:
    """Interval width relative to its centre (e.g. 0.04 = ±2%)."""
    return (hi - lo) / centre if centre else math.nan
