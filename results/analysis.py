"""Derived figures, computed from rows (never stored twice). Pure functions over DataFrames.

Definitions (the seed post's):
  scaling efficiency   = tokens/s ÷ (world_size × baseline tokens/s)
  exposed comm (ms)    = step_ms − baseline step_ms
  overlap saved (ms)   = single-bucket (largest bucket) step_ms − best step_ms
"""

from __future__ import annotations

import pandas as pd

# A measured configuration; repeats of it are aggregated (median) before any comparison.
CONFIG_KEYS = ["cluster", "sweep_id", "model", "micro_batch", "seq_len", "mode", "world_size", "num_nodes", "gas",
               "no_sync", "bucket_cap_mb", "gradient_as_bucket_view", "backend", "device_type"]  # fmt: skip
BASELINE_KEYS = ["cluster", "sweep_id", "model", "micro_batch", "seq_len"]
CURVE_KEYS = BASELINE_KEYS + ["mode", "world_size", "num_nodes", "gas", "no_sync", "gradient_as_bucket_view"]


def ok_cells(rows: pd.DataFrame) -> pd.DataFrame:
    """One line per configuration: ok rows only, median over repeats (n_repeats, worst CV kept)."""
    ok = rows[rows["status"] == "ok"]
    if ok.empty:
        return pd.DataFrame(columns=[*CONFIG_KEYS, "step_ms", "tokens_per_s", "step_ms_cv", "n_repeats",
                                     "tokens_per_step", "grad_bytes"])  # fmt: skip
    grouped = ok.groupby(CONFIG_KEYS, dropna=False)
    out = grouped.agg(step_ms=("step_ms", "median"), tokens_per_s=("tokens_per_s", "median"),
                      step_ms_cv=("step_ms_cv", "max"), n_repeats=("step_ms", "size"),
                      tokens_per_step=("tokens_per_step", "first"), grad_bytes=("grad_bytes", "first"))  # fmt: skip
    return out.reset_index()


def with_baseline(rows: pd.DataFrame) -> pd.DataFrame:
    """Every distributed configuration beside its single-worker baseline at the same gas.

    Where no baseline was measured at that gas, the gas-1 baseline scaled by gas stands in
    (`baseline_source = "gas1_scaled"`; tokens/s is unchanged by the scaling).
    """
    cells = ok_cells(rows)
    single = cells[cells["mode"] == "single"][[*BASELINE_KEYS, "gas", "step_ms", "tokens_per_s"]]
    dist = cells[cells["mode"] != "single"]
    exact = single.rename(columns={"step_ms": "baseline_step_ms", "tokens_per_s": "baseline_tokens_per_s"})
    out = dist.merge(exact, on=[*BASELINE_KEYS, "gas"], how="left")
    out["baseline_source"] = out["baseline_step_ms"].notna().map({True: "measured", False: None})
    g1 = (
        single[single["gas"] == 1]
        .drop(columns="gas")
        .rename(columns={"step_ms": "g1_step_ms", "tokens_per_s": "g1_tokens_per_s"})
    )
    out = out.merge(g1, on=BASELINE_KEYS, how="left")
    fill = out["baseline_step_ms"].isna() & out["g1_step_ms"].notna()
    out.loc[fill, "baseline_step_ms"] = out.loc[fill, "g1_step_ms"] * out.loc[fill, "gas"]
    out.loc[fill, "baseline_tokens_per_s"] = out.loc[fill, "g1_tokens_per_s"]
    out.loc[fill, "baseline_source"] = "gas1_scaled"
    out = out.drop(columns=["g1_step_ms", "g1_tokens_per_s"])
    out["efficiency"] = out["tokens_per_s"] / (out["world_size"] * out["baseline_tokens_per_s"])
    out["exposed_comm_ms"] = out["step_ms"] - out["baseline_step_ms"]
    out["exposed_comm_frac"] = out["exposed_comm_ms"] / out["baseline_step_ms"]
    return out


def u_curve(rows: pd.DataFrame) -> pd.DataFrame:
    """Per DDP curve (world size, gas, no_sync, …): best bucket, its step, the single-bucket step, overlap saved."""
    ddp = with_baseline(rows)
    ddp = ddp[(ddp["mode"] == "ddp") & ddp["bucket_cap_mb"].notna()]
    lines = []
    for key, grp in ddp.groupby(CURVE_KEYS, dropna=False):
        best = grp.loc[grp["step_ms"].idxmin()]
        largest = grp.loc[grp["bucket_cap_mb"].idxmax()]
        lines.append({**dict(zip(CURVE_KEYS, key, strict=True)),
                      "buckets": len(grp), "best_bucket_cap_mb": best["bucket_cap_mb"], "best_step_ms": best["step_ms"],
                      "best_efficiency": best["efficiency"], "largest_bucket_cap_mb": largest["bucket_cap_mb"],
                      "largest_bucket_step_ms": largest["step_ms"],
                      "overlap_saved_ms": largest["step_ms"] - best["step_ms"],
                      "baseline_step_ms": best["baseline_step_ms"]})  # fmt: skip
    return pd.DataFrame(lines)


def no_sync_gain(rows: pd.DataFrame) -> pd.DataFrame:
    """At each gas > 1: step_ms and tokens/s without vs with no_sync (same bucket and world size)."""
    ddp = with_baseline(rows)
    ddp = ddp[ddp["gas"] > 1]
    keys = [k for k in CURVE_KEYS if k != "no_sync"] + ["bucket_cap_mb"]
    on = ddp[ddp["no_sync"]].set_index(keys)
    off = ddp[~ddp["no_sync"].astype(bool)].set_index(keys)
    both = off[["step_ms", "tokens_per_s", "efficiency"]].join(
        on[["step_ms", "tokens_per_s", "efficiency"]], lsuffix="_sync", rsuffix="_no_sync", how="inner"
    )
    both["saved_ms"] = both["step_ms_sync"] - both["step_ms_no_sync"]
    both["tokens_per_s_gain"] = both["tokens_per_s_no_sync"] - both["tokens_per_s_sync"]
    return both.reset_index()


def allreduce_bytes_per_rank(grad_bytes: float, world_size: int) -> float:
    """Bytes each rank sends in a ring all-reduce of S bytes: 2(N−1)/N · S."""
    return 2 * (world_size - 1) / world_size * grad_bytes


def predicted_allreduce_ms(grad_bytes: float, algbw_bytes_per_s: float) -> float:
    """All-reduce time with no overlap: S / algbw (ms)."""
    return grad_bytes / algbw_bytes_per_s * 1e3


def busbw_from_algbw(algbw_bytes_per_s: float, world_size: int) -> float:
    """nccl-tests' bus bandwidth: algbw · 2(N−1)/N."""
    return algbw_bytes_per_s * 2 * (world_size - 1) / world_size


def measured_vs_predicted(rows: pd.DataFrame, algbw_bytes_per_s: float) -> pd.DataFrame:
    """Single-bucket exposed communication beside the no-overlap all-reduce prediction."""
    curve = u_curve(rows)
    if curve.empty:
        return curve
    cells = ok_cells(rows)
    grad = cells.groupby(BASELINE_KEYS)["grad_bytes"].max().rename("grad_bytes").reset_index()
    out = curve.merge(grad, on=BASELINE_KEYS, how="left")
    out["measured_single_bucket_overhead_ms"] = out["largest_bucket_step_ms"] - out["baseline_step_ms"]
    out["predicted_allreduce_ms"] = out["grad_bytes"].map(lambda s: predicted_allreduce_ms(s, algbw_bytes_per_s))
    out["bytes_per_rank"] = [allreduce_bytes_per_rank(s, n) for s, n in zip(out["grad_bytes"], out["world_size"],
                                                                           strict=True)]  # fmt: skip
    return out
