"""Derived figures, computed from rows (never stored twice). Pure functions over DataFrames.

Definitions (the seed post's):
  scaling efficiency   = tokens/s ÷ (world_size × baseline tokens/s)
  exposed comm (ms)    = step_ms − baseline step_ms
  overlap saved (ms)   = single-bucket (largest bucket) step_ms − best step_ms

Every figure carries a 95% interval (`<figure>_ci_lo`, `<figure>_ci_hi`): a configuration's step time
from a hierarchical bootstrap over its repeats and steps, and every derived figure computed on each
bootstrap replicate of its inputs (see results/analysis/uncertainty.py).
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import pandas as pd

from results.analysis import identity
from results.analysis.uncertainty import cell_replicates, interval, t_factor

# What is one configuration, one baseline, one curve: derived from the knob table (results.analysis.identity)
CONFIG_KEYS, BASELINE_KEYS, CURVE_KEYS = identity.CONFIG_KEYS, identity.BASELINE_KEYS, identity.CURVE_KEYS


def varying(curve: dict, frame: pd.DataFrame, shown: tuple[str, ...] = ()) -> list[str]:
    """`k=v` for each key of `curve` (beyond `shown`) whose value differs across `frame`: what tells a line apart
    from the others drawn with it (a hook, a timing, a topology, a sweep)."""
    return [
        f"{k}={'-' if pd.isna(v) else v}"
        for k, v in curve.items()
        if k not in shown and frame[k].nunique(dropna=False) > 1
    ]


DRIFT_MIN = 0.05  # a control must move at least 5% (and beyond twice its own noise) to flag its round
NOISY_CV = 3.0  # a row whose CV is over 3x its group's median CV (and over 5%) is flagged noisy


def drifted_rounds(rows: pd.DataFrame) -> pd.Series:
    """Per row: True when its round's control moved beyond its own noise, relative to the median control
    of its group's rounds: |c_r / median - 1| > max(5%, 2 x the control's relative half-width). Needs at
    least 3 rounds with a control (with 2 one cannot tell which moved)."""
    flags = pd.Series(False, index=rows.index)
    if "control_step_ms" not in rows or rows["control_step_ms"].isna().all():
        return flags
    for _, grp in rows.dropna(subset=["control_step_ms"]).groupby(["cluster", "sweep_id", "group_id"]):
        per_round = grp.groupby("round")[["control_step_ms", "control_rel_ci"]].first()
        if len(per_round) < 3:
            continue
        centre = per_round["control_step_ms"].median()
        moved = (per_round["control_step_ms"] / centre - 1).abs()
        bad = per_round.index[moved > (2 * per_round["control_rel_ci"].fillna(0)).clip(lower=DRIFT_MIN)]
        flags[grp.index[grp["round"].isin(bad)]] = True
    return flags


def noisy_rows(rows: pd.DataFrame) -> pd.Series:
    """Per row: True when its step-time CV is far above its group's (measured during interference)."""
    ok = rows["status"] == "ok"
    typical = rows[ok].groupby(["cluster", "sweep_id", "group_id"], dropna=False)["step_ms_cv"].transform("median")
    threshold = (NOISY_CV * typical).clip(lower=0.05).reindex(rows.index)
    return ok & (rows["step_ms_cv"] > threshold)


def usable(rows: pd.DataFrame) -> pd.DataFrame:
    """The rows decisions are made from: ok, replicas in sync, and not slowed on purpose (a benchmark's planted
    slowdown: `planted`). A round whose control drifted stays (its flag is a diagnostic): within a group,
    comparisons are round-blocked, so a slow round moves every cell together; dropping it cost a third of a
    3-round sweep's data and widened every interval by t(1)/z = 6.5x."""
    keep = (rows["status"] == "ok") & (rows["replicas_in_sync"] != False) & ~planted(rows)  # noqa: E712
    return identity.with_knobs(rows[keep & ~failed_check(rows)])


def failed_check(rows: pd.DataFrame) -> pd.Series:
    """Per row: its configuration failed the gradient check in at least one measurement (trainers.gradcheck). Every
    row of that configuration is left out of every answer (a setting that sometimes sums wrong is not an answer),
    and shown with its error (`failed_configurations`)."""
    if "grad_check" not in rows or not (rows["grad_check"] == "failed").any():
        return pd.Series(False, index=rows.index)
    keys = identity.with_knobs(rows)[CONFIG_KEYS].astype(str).apply(tuple, axis=1)
    return keys.isin(set(keys[rows["grad_check"] == "failed"]))


def failed_configurations(rows: pd.DataFrame) -> pd.DataFrame:
    """One line per configuration that failed the gradient check: its knobs, how many of its measurements failed,
    and the largest error beside its tolerance."""
    bad = identity.with_knobs(rows[failed_check(rows)])
    cols = [*CONFIG_KEYS, "failed", "measured", "grad_rel_error", "grad_tol"]
    if bad.empty:
        return pd.DataFrame(columns=cols)
    bad = bad.assign(failed=bad["grad_check"] == "failed", measured=bad["grad_check"].notna())
    agg = {"failed": "sum", "measured": "sum", "grad_rel_error": "max", "grad_tol": "max"}
    return bad.groupby(CONFIG_KEYS, dropna=False).agg(agg).reset_index().reindex(columns=cols)


def gradient_checks(rows: pd.DataFrame) -> pd.DataFrame:
    """Every checked configuration's gradient check: the usable ones (exact or approximate, the median error and
    its range) and the failed ones (left out of every answer, with their largest error), failed first."""
    cells = ok_cells(rows)
    if "grad_check" in cells:
        cells = cells[cells["grad_check"].notna() & (cells["grad_check"] != "off")]
    failed = failed_configurations(rows).rename(columns={"failed": "grad_checks_failed", "measured": "grad_checks"})
    failed = failed.assign(grad_check="failed", grad_rel_error_max=failed["grad_rel_error"])
    cols = [*CONFIG_KEYS, "grad_check", "grad_rel_error", "grad_rel_error_min", "grad_rel_error_max"]
    cols += ["grad_checks", "grad_checks_failed", "grad_tol"]
    parts = [p.reindex(columns=cols) for p in (failed, cells) if not p.empty]
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=cols)


PLANTS = {"injected_slowdown": "DDPSWEEP_SLOWDOWN", "injected_corruption": "DDPSWEEP_CORRUPT"}
PLANTS |= {"injected_jitter": "DDPSWEEP_JITTER"}
"""Row columns of the benchmarks' plants (trainers.plants) and the variables that set them."""


def planted(rows: pd.DataFrame) -> pd.Series:
    """Per row: measured under a plant (benchmarks only: a slowdown, a gradient corruption or jitter), never an
    answer."""
    out = pd.Series(False, index=rows.index)
    for column in (c for c in PLANTS if c in rows):
        out |= pd.to_numeric(rows[column], errors="coerce").fillna(0).astype(float) != 0
    return out


_ONCE: contextvars.ContextVar[dict | None] = contextvars.ContextVar("ok_cells_once", default=None)


@contextmanager
def computed_once() -> Iterator[None]:
    """Within the block, `ok_cells` of one rows frame is computed once (its bootstrap is most of a page's or
    report's time) and every section reads that answer; the frame is kept alive meanwhile, so its id is its own."""
    if _ONCE.get() is not None:  # inside another such block: its answers are this one's
        yield
        return
    token = _ONCE.set({})
    try:
        yield
    finally:
        _ONCE.reset(token)


def ok_cells(rows: pd.DataFrame) -> pd.DataFrame:
    """One line per configuration from the usable rows: the pooled median step over repeats with its interval,
    n_repeats, n_steps, the worst CV, and the bootstrap replicates (`step_ms_reps`) for propagation (inside
    `computed_once`, once per rows frame)."""
    memo = _ONCE.get()
    if memo is None:
        return _ok_cells(rows)
    if id(rows) not in memo:
        memo[id(rows)] = (rows, _ok_cells(rows))
    return memo[id(rows)][1].copy()


def _ok_cells(rows: pd.DataFrame) -> pd.DataFrame:
    ok = usable(rows)
    cols = [
        *CONFIG_KEYS,
        "step_ms",
        "step_ms_ci_lo",
        "step_ms_ci_hi",
        "n_repeats",
        "n_steps",
        "step_ms_reps",
        "round_var_share",
        "tokens_per_s",
        "samples_per_s",
        "step_ms_cv",
        "tokens_per_step",
        "grad_bytes",
        "bucket_sizes_bytes",
        *NUMERICS,
    ]
    if ok.empty:
        return pd.DataFrame(columns=cols)
    out = cell_replicates(ok, CONFIG_KEYS)
    firsts = {c: "first" for c in ("tokens_per_step", "grad_bytes", "bucket_sizes_bytes") if c in ok}
    grouped = ok.groupby(CONFIG_KEYS, dropna=False, sort=True)
    extra = grouped.agg({"step_ms_cv": "max", **firsts})
    extra = extra.join(_numerics(grouped)) if "grad_check" in ok else extra
    for column in extra.columns:  # the same groups in the same order as cell_replicates' lines
        out[column] = extra[column].to_numpy()
    out["tokens_per_s"] = out["tokens_per_step"] / (out["step_ms"] / 1e3)
    out["samples_per_s"] = samples_per_step(out) / (out["step_ms"] / 1e3)
    return out.reindex(columns=cols)


NUMERICS = ["grad_check", "grad_rel_error", "grad_rel_error_min", "grad_rel_error_max", "grad_checks"]
"""A configuration's gradient check over its measurements: the verdict, the median error and its range, and how
many measurements were checked."""


def _numerics(grouped) -> pd.DataFrame:
    err = grouped["grad_rel_error"]
    return pd.DataFrame(
        {
            "grad_check": grouped["grad_check"].first(),
            "grad_rel_error": err.median(),
            "grad_rel_error_min": err.min(),
            "grad_rel_error_max": err.max(),
            "grad_checks": err.count(),
        }
    )


def samples_per_step(frame: pd.DataFrame) -> pd.Series:
    """Global samples per optimizer step (every workload has them; tokens only where it gives them)."""
    return frame["micro_batch"] * frame["gas"] * frame["world_size"]


def _ci(frame: pd.DataFrame, name: str, reps: pd.Series) -> None:
    """Add `<name>_ci_lo` and `<name>_ci_hi` from a column of replicate arrays."""
    bounds = [interval(r) if isinstance(r, np.ndarray) else (np.nan, np.nan) for r in reps]
    frame[f"{name}_ci_lo"] = [b[0] for b in bounds]
    frame[f"{name}_ci_hi"] = [b[1] for b in bounds]


def _reps(frame: pd.DataFrame, column: str = "step_ms_reps") -> list:
    return [r if isinstance(r, np.ndarray) else np.full(1, np.nan) for r in frame[column]]


def with_baseline(rows: pd.DataFrame, keep_reps: bool = False) -> pd.DataFrame:
    """Every distributed configuration beside its single-worker baseline at the same gas, with intervals.

    Where no baseline was measured at that gas, the gas-1 baseline scaled by gas stands in
    (`baseline_source = "gas1_scaled"`; tokens/s is unchanged by the scaling).
    """
    cells = ok_cells(rows)
    single = cells[cells["mode"] == "single"][
        [*BASELINE_KEYS, "gas", "step_ms", "tokens_per_s", "samples_per_s", "step_ms_reps"]
    ]
    dist = cells[cells["mode"] != "single"]
    exact = single.rename(
        columns={
            "step_ms": "baseline_step_ms",
            "tokens_per_s": "baseline_tokens_per_s",
            "samples_per_s": "baseline_samples_per_s",
            "step_ms_reps": "baseline_reps",
        }
    )
    out = dist.merge(exact, on=[*BASELINE_KEYS, "gas"], how="left")
    out["baseline_source"] = out["baseline_step_ms"].notna().map({True: "measured", False: None})
    g1 = single[single["gas"] == 1].drop(columns="gas")
    g1 = g1.rename(
        columns={
            "step_ms": "g1_step_ms",
            "tokens_per_s": "g1_tokens_per_s",
            "samples_per_s": "g1_samples_per_s",
            "step_ms_reps": "g1_reps",
        }
    )
    out = out.merge(g1, on=BASELINE_KEYS, how="left")
    fill = out["baseline_step_ms"].isna() & out["g1_step_ms"].notna()
    out.loc[fill, "baseline_step_ms"] = out.loc[fill, "g1_step_ms"] * out.loc[fill, "gas"]
    out.loc[fill, "baseline_tokens_per_s"] = out.loc[fill, "g1_tokens_per_s"]
    out.loc[fill, "baseline_samples_per_s"] = out.loc[fill, "g1_samples_per_s"]
    out.loc[fill, "baseline_source"] = "gas1_scaled"
    out["baseline_reps"] = [
        g1r * gas if f else br
        for f, br, g1r, gas in zip(fill, out["baseline_reps"], out["g1_reps"], out["gas"], strict=True)
    ]
    out = out.drop(columns=["g1_step_ms", "g1_tokens_per_s", "g1_samples_per_s", "g1_reps"])
    # samples, not tokens: every workload has them, and for GPT presets the ratio is the same
    out["efficiency"] = out["samples_per_s"] / (out["world_size"] * out["baseline_samples_per_s"])
    out["exposed_comm_ms"] = out["step_ms"] - out["baseline_step_ms"]
    out["exposed_comm_frac"] = out["exposed_comm_ms"] / out["baseline_step_ms"]
    steps, bases = _reps(out), _reps(out, "baseline_reps")
    # efficiency = (tokens/step / step) / (world x tokens/step/world / (gas-matched baseline step)) = base / step / 1
    base_samples = out["baseline_samples_per_s"] * out["baseline_step_ms"] / 1e3  # baseline samples per step
    eff = [
        sps / (s / 1e3) / (w * bs / (b / 1e3))
        for sps, s, w, bs, b in zip(samples_per_step(out), steps, out["world_size"], base_samples, bases, strict=True)
    ]
    _ci(out, "efficiency", pd.Series(eff, dtype=object))
    _ci(out, "exposed_comm_ms", pd.Series([s - b for s, b in zip(steps, bases, strict=True)], dtype=object))
    return out if keep_reps else out.drop(columns=["step_ms_reps", "baseline_reps"])


def same_as(r: pd.Series, best: pd.Series) -> bool:
    """`r` cannot be told apart from `best`: the 95% interval of their step ratio, computed replicate by
    replicate (paired by round within a worker group), contains 1 (or is unknown: one number each). Either
    measured in one round only: never told apart. Its interval is over one run's steps and leaves out how runs
    differ (A/A: one configuration in two worker groups read 33.9 [30.8, 35.9] and 41.5 [38.8, 44.4] ms)."""
    if r.name != best.name and min(r["n_repeats"], best["n_repeats"]) < 2:
        return True
    lo, hi = interval(np.asarray(r["step_ms_reps"], dtype=float) / np.asarray(best["step_ms_reps"], dtype=float))
    return bool(lo <= 1 <= hi) if np.isfinite(lo) else r.name == best.name


def indistinguishable(grp: pd.DataFrame, best: pd.Series) -> list[float]:
    """Buckets that cannot be told apart from the best bucket (`same_as`): the best and those whose ratio to it
    is not resolved."""
    return sorted(float(r["bucket_cap_mb"]) for _, r in grp.iterrows() if same_as(r, best))


TARGET_REL = 0.02  # the difference a sweep is asked to resolve unless told otherwise (rounds_for_target)
MAX_ROUNDS_SHOWN = 100_000  # rounds_for_target beyond this reads as "more than"


def resolution(grp: pd.DataFrame, best: pd.Series, target_rel: float = TARGET_REL) -> dict:
    """What a curve's measurements can resolve: `min_resolvable_rel`, the half-width of the median 95% interval
    of log(cell / best) over the curve's other cells, as a relative difference (0.18: differences under 18%
    cannot be told apart here); `rounds_for_target`, the rounds that would bring it to `target_rel` (the
    variance of a median of R rounds of T steps is s_round²/R + s_step²/(RT): both levels shrink as 1/R, the
    t factor with them); and `round_var_share`, the part of that variance between rounds (near 1: more steps
    per round would not help, more rounds would)."""
    hws = []
    for _, r in grp.iterrows():
        if r.name != best.name and isinstance(r["step_ms_reps"], np.ndarray):
            lo, hi = interval(np.log(r["step_ms_reps"] / best["step_ms_reps"]))
            hws.append((hi - lo) / 2)
    hws = [h for h in hws if np.isfinite(h)]
    rounds = int(grp["n_repeats"].min())
    if not hws or rounds < 2:  # one round: how runs differ is unknown, so is what the curve resolves
        return {"min_resolvable_rel": np.nan, "rounds_for_target": None, "round_var_share": np.nan}
    hw = float(np.median(hws))
    return {
        "min_resolvable_rel": float(np.expm1(hw)),
        "rounds_for_target": rounds_for(hw, rounds, target_rel),
        "round_var_share": _median_or_nan(grp.get("round_var_share")),
    }


def _median_or_nan(values: pd.Series | None) -> float:
    """The median of the known values (NaN, without a warning, where none is known)."""
    known = values.dropna() if values is not None else pd.Series(dtype=float)
    return float(known.median()) if len(known) else np.nan


def rounds_for(half_width: float, rounds: int, target_rel: float) -> int:
    """Rounds at which a log-ratio half-width measured over `rounds` rounds reaches log(1 + target_rel)."""
    goal = float(np.log1p(target_rel))
    r = max(rounds, 1)
    while half_width * np.sqrt(rounds / r) * t_factor(r) / t_factor(rounds) > goal and r < MAX_ROUNDS_SHOWN:
        r = max(r + 1, int(r * 1.05))
    return r


def u_curve(rows: pd.DataFrame) -> pd.DataFrame:
    """Per DDP curve (world size, gas, no_sync, …): the best bucket, the buckets indistinguishable from it,
    its step and efficiency, the single-bucket step, and the overlap saved — each with its interval."""
    ddp = with_baseline(rows, keep_reps=True)
    ddp = ddp[(ddp["mode"] == "ddp") & ddp["bucket_cap_mb"].notna()]
    lines = []
    for key, grp in ddp.groupby(CURVE_KEYS, dropna=False):
        best = grp.loc[grp["step_ms"].idxmin()]
        largest = grp.loc[grp["bucket_cap_mb"].idxmax()]
        saved = interval(largest["step_ms_reps"] - best["step_ms_reps"])
        single = interval(largest["step_ms_reps"] - largest["baseline_reps"])
        line = (
            dict(zip(CURVE_KEYS, key, strict=True))
            | {
                "buckets": len(grp),
                "best_bucket_cap_mb": best["bucket_cap_mb"],
                "indistinguishable_buckets_mb": indistinguishable(grp, best),
                "largest_bucket_cap_mb": largest["bucket_cap_mb"],
                "largest_bucket_step_ms": largest["step_ms"],
                "overlap_saved_ms": largest["step_ms"] - best["step_ms"],
                "overlap_saved_ms_ci_lo": saved[0],
                "overlap_saved_ms_ci_hi": saved[1],
                "baseline_step_ms": best["baseline_step_ms"],
                "single_bucket_overhead_ms": largest["step_ms"] - largest["baseline_step_ms"],
                "single_bucket_overhead_ms_ci_lo": single[0],
                "single_bucket_overhead_ms_ci_hi": single[1],
                "n_repeats": int(grp["n_repeats"].min()),
            }
            | resolution(grp, best)
        )
        for name in ("step_ms", "efficiency"):
            for suffix in ("", "_ci_lo", "_ci_hi"):
                line[f"best_{name}{suffix}"] = best[f"{name}{suffix}"]
        lines.append(line)
    return pd.DataFrame(lines) if lines else pd.DataFrame(columns=U_CURVE_COLUMNS)  # no curve: still queryable


U_CURVE_COLUMNS = [*CURVE_KEYS, "buckets", "best_bucket_cap_mb", "indistinguishable_buckets_mb"]
U_CURVE_COLUMNS += ["largest_bucket_cap_mb", "largest_bucket_step_ms", "overlap_saved_ms", "overlap_saved_ms_ci_lo"]
U_CURVE_COLUMNS += ["overlap_saved_ms_ci_hi", "baseline_step_ms", "single_bucket_overhead_ms"]
U_CURVE_COLUMNS += ["single_bucket_overhead_ms_ci_lo", "single_bucket_overhead_ms_ci_hi", "n_repeats"]
U_CURVE_COLUMNS += ["min_resolvable_rel", "rounds_for_target", "round_var_share"]
U_CURVE_COLUMNS += [f"best_{n}{s}" for n in ("step_ms", "efficiency") for s in ("", "_ci_lo", "_ci_hi")]


def no_sync_gain(rows: pd.DataFrame) -> pd.DataFrame:
    """At each gas > 1: step_ms and tokens/s without vs with no_sync (same bucket and world size), with the
    interval of the time saved."""
    ddp = with_baseline(rows, keep_reps=True)
    ddp = ddp[ddp["gas"] > 1]
    keys = [k for k in CURVE_KEYS if k != "no_sync"] + ["bucket_cap_mb"]
    cols = ["step_ms", "tokens_per_s", "efficiency", "step_ms_reps"]
    on = ddp[ddp["no_sync"].astype(bool)].set_index(keys)
    off = ddp[~ddp["no_sync"].astype(bool)].set_index(keys)
    both = off[cols].join(on[cols], lsuffix="_sync", rsuffix="_no_sync", how="inner")
    both["saved_ms"] = both["step_ms_sync"] - both["step_ms_no_sync"]
    pairs = zip(_reps(both, "step_ms_reps_sync"), _reps(both, "step_ms_reps_no_sync"), strict=True)
    _ci(both, "saved_ms", pd.Series([a - b for a, b in pairs], index=both.index, dtype=object))
    both["tokens_per_s_gain"] = both["tokens_per_s_no_sync"] - both["tokens_per_s_sync"]
    return both.drop(columns=["step_ms_reps_sync", "step_ms_reps_no_sync"]).reset_index()


def busbw_from_algbw(algbw_bytes_per_s: float, world_size: int) -> float:
    """nccl-tests' bus bandwidth: algbw · 2(N−1)/N."""
    return algbw_bytes_per_s * 2 * (world_size - 1) / world_size
