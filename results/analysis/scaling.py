"""The scaling report: throughput and strong-scaling efficiency by topology, and where scaling breaks.

For each series — one configuration but its placement (every knob of trainers.knobs but world size and nodes) —
every topology
(nodes x workers per node) measured with it: tokens/s and scaling efficiency, each with its 95% interval
(propagated from the step-time bootstrap, results.analysis.cells), the communication share of the step
(exposed communication / step), and where the sweep calibrated, the all-reduce bus bandwidth that
topology's ranks reached at their largest calibrated message.

Topologies are ordered by world size, then nodes; `vs_previous` is each one's per-rank tokens/s over the
previous one's (the baseline cancels), with its interval. A step whose whole interval lies below
1 - KNEE_DROP is a significant drop (`knee_why` describes it, saying whether it crossed nodes); the
knee is the steepest of them — where adding ranks stopped paying, beyond the noise. Where either topology was
measured in one round, its interval is over one run's steps and leaves out how runs differ (an A/A of one
configuration in two worker groups read 22% apart with disjoint intervals), so no knee is called there:
`knee_why` says so.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from results.analysis import cells as analysis
from results.analysis.uncertainty import interval

SERIES = [k for k in analysis.CONFIG_KEYS if k not in ("world_size", "num_nodes")]
"""One scaling series: every knob but the placement (a hook, timing or environment is a series of its own)."""
COLUMNS = ["cluster", "gas", "no_sync", "bucket_cap_mb", "topology", "world_size", "step_ms", "tokens_per_s"]
COLUMNS += ["efficiency", "vs_previous", "comm_share", "busbw_gbps", "knee", "n_repeats"]  # the table people read
INTERVALS = ["step_ms", "tokens_per_s", "efficiency", "vs_previous"]  # shown as 'median [lo, hi]' there
KNEE_DROP = 0.10  # per-rank throughput must fall by at least 10% (the whole interval) to be the knee
ONE_ROUND_FIX = "repeats: 2 or more"  # a topology measured in one round: its interval is over one run's steps


def topologies(rows: pd.DataFrame) -> int:
    """How many (world size, nodes) placements the DDP rows of `rows` measured."""
    ddp = rows[(rows["mode"] == "ddp") & (rows["status"] == "ok")]
    return len(ddp[["world_size", "num_nodes"]].drop_duplicates())


def _busbw(calibration: pd.DataFrame | None) -> pd.DataFrame:
    """Per (cluster, sweep, world size, nodes): busbw (GB/s) at the largest all-reduce size calibrated."""
    keys = ["cluster", "sweep_id", "world_size", "num_nodes"]
    if calibration is None or calibration.empty:
        return pd.DataFrame(columns=[*keys, "busbw_gbps", "busbw_at_bytes"])
    ar = calibration[calibration["kind"] == "all_reduce"]
    top = ar[ar["size_bytes"] == ar.groupby(keys)["size_bytes"].transform("max")]
    return top.groupby(keys, as_index=False).agg(
        busbw_gbps=("busbw_gbps", "median"), busbw_at_bytes=("size_bytes", "max")
    )


def scaling(rows: pd.DataFrame, calibration: pd.DataFrame | None = None) -> pd.DataFrame:
    """One line per (series, topology), ordered by world size then nodes, with the knee flagged."""
    cells = analysis.with_baseline(rows, keep_reps=True)
    ddp = cells[cells["mode"] == "ddp"].copy()
    if ddp.empty:
        return pd.DataFrame()
    ddp["workers_per_node"] = ddp["world_size"] // ddp["num_nodes"]
    ddp["topology"] = [f"{n}x{w}" for n, w in zip(ddp["num_nodes"], ddp["workers_per_node"], strict=True)]
    reps = [r if isinstance(r, np.ndarray) else np.full(1, np.nan) for r in ddp["step_ms_reps"]]
    tps = [tokens / (r / 1e3) for tokens, r in zip(ddp["tokens_per_step"], reps, strict=True)]
    ddp["tokens_per_s_ci_lo"], ddp["tokens_per_s_ci_hi"] = zip(*(interval(t) for t in tps), strict=True)
    ddp["comm_share"] = ddp["exposed_comm_ms"] / ddp["step_ms"]
    ddp = ddp.merge(_busbw(calibration), on=["cluster", "sweep_id", "world_size", "num_nodes"], how="left")
    ddp = ddp.sort_values([*SERIES, "world_size", "num_nodes"], kind="stable")
    ddp = ddp.reset_index(drop=True)
    ddp["vs_previous"], ddp["vs_previous_ci_lo"], ddp["vs_previous_ci_hi"] = np.nan, np.nan, np.nan
    ddp["knee"], ddp["knee_why"] = False, ""
    for _, grp in ddp.groupby(SERIES, dropna=False, sort=False):
        _flag_knee(ddp, grp)
    columns = [
        *SERIES,
        "topology",
        "world_size",
        "num_nodes",
        "workers_per_node",
        "step_ms",
        "step_ms_ci_lo",
        "step_ms_ci_hi",
        "tokens_per_s",
        "tokens_per_s_ci_lo",
        "tokens_per_s_ci_hi",
        "efficiency",
        "efficiency_ci_lo",
        "efficiency_ci_hi",
        "vs_previous",
        "vs_previous_ci_lo",
        "vs_previous_ci_hi",
        "comm_share",
        "busbw_gbps",
        "busbw_at_bytes",
        "knee",
        "knee_why",
        "n_repeats",
    ]
    return ddp.reindex(columns=columns).reset_index(drop=True)


def _per_rank(line: pd.Series) -> np.ndarray:
    """Replicates of the line's tokens/s per rank."""
    reps = line["step_ms_reps"] if isinstance(line["step_ms_reps"], np.ndarray) else np.array([line["step_ms"]])
    return line["tokens_per_step"] / (reps / 1e3) / line["world_size"]


def _flag_knee(table: pd.DataFrame, series: pd.DataFrame) -> None:
    """Fill `vs_previous` for the series' topologies, describe each significant drop, mark the steepest."""
    prev, drops = None, []
    for idx, line in series.iterrows():
        if prev is not None:
            lo, hi = interval(_per_rank(line) / _per_rank(prev))  # independent cells: replicates paired at random
            centre = float(_per_rank_point(line) / _per_rank_point(prev))
            table.loc[idx, ["vs_previous", "vs_previous_ci_lo", "vs_previous_ci_hi"]] = [centre, lo, hi]
            if hi < 1 - KNEE_DROP:
                crossed = line["num_nodes"] > prev["num_nodes"]
                where = f"crosses from {prev['num_nodes']} to {line['num_nodes']} node(s)" if crossed else "same nodes"
                why = f"per-rank throughput x{centre:.2f} [{lo:.2f}, {hi:.2f}] of {prev['topology']}'s; {where}"
                if min(line["n_repeats"], prev["n_repeats"]) < 2:  # as analysis.same_as: one run's steps only
                    why += f"; one round: not called a knee (runs differ by more), measure {ONE_ROUND_FIX}"
                else:
                    drops.append((centre, idx))
                table.loc[idx, "knee_why"] = why
        prev = line
    if drops:
        table.loc[min(drops)[1], "knee"] = True


def _per_rank_point(line: pd.Series) -> float:
    return line["tokens_per_step"] / (line["step_ms"] / 1e3) / line["world_size"]


def lines(table: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """The scaling curves to draw, by label: `one node` (every 1xW), and for each W measured on several
    nodes, `W per node` (1xW, 2xW, …) — intra-node and inter-node scaling told apart."""
    out = {}
    one = table[table["num_nodes"] == 1]
    if len(one) > 1:
        out["one node"] = one
    for w, grp in table.groupby("workers_per_node"):
        if (grp["num_nodes"] > 1).any():
            out[f"{w} per node"] = grp.sort_values("num_nodes")
    return out
