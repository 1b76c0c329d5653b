"""Compare clusters: the same grid position side by side, with the ratio's interval and a verdict.

A difference is `slower` or `faster` only when the 95% interval of the step-time ratio (b / a, from
the two cells' bootstrap replicates, resampled independently) excludes 1; otherwise it is `same within
noise`. Positions whose model, batch, steps or torch/NCCL versions differ are flagged not comparable.
"""

from __future__ import annotations

import pandas as pd

from results.analysis import CONFIG_KEYS, ok_cells
from results.errors import UnknownSelection
from results.uncertainty import interval

# The grid position a cell occupies: what is matched across clusters.
POSITION = ["mode", "world_size", "num_nodes", "gas", "no_sync", "bucket_cap_mb", "gradient_as_bucket_view"]
# What must also agree for the two measurements to be comparable.
MUST_AGREE = ["model", "micro_batch", "seq_len", "warmup_steps", "timed_steps", "torch_version", "nccl_version"]


def _per_cluster(rows: pd.DataFrame, cluster: str) -> pd.DataFrame:
    mine = rows[(rows["cluster"] == cluster) & (rows["status"] == "ok")]
    if mine.empty:
        raise UnknownSelection(
            f"cluster {cluster!r} has no ok rows; clusters: {', '.join(sorted(rows['cluster'].unique()))}"
        )
    # one sweep's configuration or several: pooled per grid position
    pooled = mine.assign(sweep_id="*", cluster=cluster)
    cells = ok_cells(pooled)[[*POSITION, "step_ms", "step_ms_reps", "n_repeats"]]
    agree = mine.groupby(POSITION, dropna=False).agg(
        {"sweep_id": "nunique"} | {k: lambda s: ",".join(sorted({str(v) for v in s})) for k in MUST_AGREE}
    )
    return cells.merge(agree.reset_index(), on=POSITION, how="left")


def _verdict(lo: float, hi: float) -> str:
    if not (lo == lo and hi == hi):  # NaN: a side with a single number has no interval
        return "unknown (no interval)"
    if lo > 1:
        return "slower"
    if hi < 1:
        return "faster"
    return "same within noise"


def compare(rows: pd.DataFrame, a: str, b: str) -> pd.DataFrame:
    """One line per grid position measured on both clusters: step_ms of each, ratio b/a with its interval,
    the verdict, `significant` (the interval excludes 1), and `comparable` with `why` not."""
    assert set(POSITION) <= set(CONFIG_KEYS)
    left, right = _per_cluster(rows, a), _per_cluster(rows, b)
    both = left.merge(right, on=POSITION, how="inner", suffixes=(f"_{a}", f"_{b}"))
    both["ratio"] = both[f"step_ms_{b}"] / both[f"step_ms_{a}"]
    bounds = [interval(rb / ra) for ra, rb in zip(both[f"step_ms_reps_{a}"], both[f"step_ms_reps_{b}"], strict=True)]
    both["ratio_ci_lo"] = [lo for lo, _ in bounds]
    both["ratio_ci_hi"] = [hi for _, hi in bounds]
    both["verdict"] = [_verdict(lo, hi) for lo, hi in bounds]
    both["significant"] = both["verdict"].isin(["slower", "faster"])
    why = []
    for _, r in both.iterrows():
        diffs = [f"{k} {r[f'{k}_{a}']} vs {r[f'{k}_{b}']}" for k in MUST_AGREE if r[f"{k}_{a}"] != r[f"{k}_{b}"]]
        why.append("; ".join(diffs))
    both["why"] = why
    both["comparable"] = both["why"] == ""
    cols = [
        *POSITION,
        f"step_ms_{a}",
        f"step_ms_{b}",
        "ratio",
        "ratio_ci_lo",
        "ratio_ci_hi",
        "verdict",
        "significant",
        "comparable",
        "why",
    ]
    return both[cols].sort_values(["mode", "world_size", "gas", "no_sync", "bucket_cap_mb"]).reset_index(drop=True)
