"""matplotlib figures over result rows (Agg backend; no screen needed)."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from results import analysis  # noqa: E402


def _ddp_cells(rows: pd.DataFrame) -> pd.DataFrame:
    t = analysis.with_baseline(rows)
    return t[t["mode"] == "ddp"]


def _finish(fig: Figure, ax, **legend) -> Figure:
    ax.legend(fontsize=8, **legend)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def u_curve_figure(rows: pd.DataFrame) -> Figure:
    """step_ms against bucket_cap_mb (log x): a panel per (cluster, gas), a line per (world size, no_sync)."""
    t = _ddp_cells(rows)
    t = t[t["bucket_cap_mb"].notna()]
    clusters, gases = sorted(t["cluster"].unique()) or ["-"], sorted(t["gas"].unique()) or [1]
    fig, axes = plt.subplots(len(clusters), len(gases), figsize=(5.5 * len(gases), 3.8 * len(clusters)), squeeze=False)
    for (i, cluster), (j, gas) in ((ci, gj) for ci in enumerate(clusters) for gj in enumerate(gases)):
        ax, sub = axes[i][j], t[(t["cluster"] == cluster) & (t["gas"] == gas)]
        for (world, ns), line in sub.groupby(["world_size", "no_sync"]):
            line = line.sort_values("bucket_cap_mb")
            ax.plot(line["bucket_cap_mb"], line["step_ms"], marker="o", label=f"{world} ranks, no_sync={bool(ns)}")
        base = sub.dropna(subset=["baseline_step_ms"])
        if not base.empty:
            scaled = " (gas x gas-1 run)" if base["baseline_source"].iloc[0] == "gas1_scaled" else ""
            ax.axhline(base["baseline_step_ms"].iloc[0], color="grey", linestyle="--",
                       label=f"single-worker baseline{scaled}")  # fmt: skip
        ax.set(xscale="log", xlabel="bucket_cap_mb (MB, log)", ylabel="step time (ms, median)",
               title=f"{cluster}: gas={gas}")  # fmt: skip
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def efficiency_figure(rows: pd.DataFrame) -> Figure:
    """Best scaling efficiency (over buckets) against world size, a line per (cluster, gas, no_sync)."""
    t = _ddp_cells(rows)
    fig, ax = plt.subplots(figsize=(6, 4))
    sizes = sorted({1, *t["world_size"].dropna().astype(int)})
    for (cluster, gas, ns), grp in t.groupby(["cluster", "gas", "no_sync"]):
        best = grp.groupby("world_size")["efficiency"].max()
        xs, ys = [1, *best.index], [100.0, *(best.values * 100)]  # one rank is the baseline: 100% by definition
        ax.plot(xs, ys, marker="o", label=f"{cluster} gas={gas} no_sync={bool(ns)}")
    ax.axhline(100, color="grey", linestyle="--", label="ideal")
    ax.set_xscale("log", base=2)
    ax.set_xticks(sizes, [str(s) for s in sizes])
    ax.set(xlabel="world size (ranks, log2)", ylabel="scaling efficiency (%)", title="Scaling efficiency (best bucket)")
    ax.set_ylim(0, 110)
    return _finish(fig, ax, loc="lower left")


def no_sync_figure(rows: pd.DataFrame) -> Figure:
    """Throughput against gas with and without no_sync (best bucket), per cluster and world size."""
    t = _ddp_cells(rows)
    fig, ax = plt.subplots(figsize=(6, 4))
    for (cluster, world, ns), grp in t.groupby(["cluster", "world_size", "no_sync"]):
        best = grp.groupby("gas")["tokens_per_s"].max() / 1e3
        style = "-" if ns else ":"
        ax.plot(best.index, best.values, style, marker="o", label=f"{cluster} {world} ranks no_sync={bool(ns)}")
    ax.set(
        xlabel="gradient accumulation steps (gas)", ylabel="throughput (ktokens/s)", title="no_sync under accumulation"
    )
    return _finish(fig, ax)


def measured_vs_predicted_figure(rows: pd.DataFrame, algbw_bytes_per_s: float) -> Figure:
    """Single-bucket exposed communication beside the no-overlap all-reduce prediction S / algbw."""
    t = analysis.measured_vs_predicted(rows, algbw_bytes_per_s)
    fig, ax = plt.subplots(figsize=(6, 4))
    labels = [f"{r.cluster}\n{r.world_size} ranks gas={r.gas}" for r in t.itertuples()]
    x = range(len(t))
    ax.bar([i - 0.2 for i in x], t["measured_single_bucket_overhead_ms"], width=0.4, label="measured (largest bucket)")
    ax.bar(
        [i + 0.2 for i in x],
        t["predicted_allreduce_ms"],
        width=0.4,
        label=f"predicted S/algbw ({algbw_bytes_per_s / 1e9:g} GB/s)",
    )
    ax.set_xticks(list(x), labels, fontsize=8)
    ax.set(ylabel="communication (ms per step)", title="All-reduce: measured vs predicted")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig
