"""Compare clusters: the same grid position side by side, flagged when not comparable or not significant."""

from __future__ import annotations

import pandas as pd

from results.errors import UnknownSelection

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
    agg = {"step_ms": "median", "tokens_per_s": "median", "step_ms_cv": "max", "sweep_id": "nunique"}
    agg |= {k: lambda s: ",".join(sorted({str(v) for v in s})) for k in MUST_AGREE}
    return mine.groupby(POSITION, dropna=False).agg(agg).reset_index()


def compare(rows: pd.DataFrame, a: str, b: str) -> pd.DataFrame:
    """One line per grid position measured on both clusters: step_ms of each, ratio b/a, flags.

    `comparable` is false (with `why`) when model, micro-batch, sequence, steps or torch/NCCL versions
    differ. `significant` is false when |b/a − 1| is within the two cells' own noise (cv_a + cv_b).
    """
    left, right = _per_cluster(rows, a), _per_cluster(rows, b)
    both = left.merge(right, on=POSITION, how="inner", suffixes=(f"_{a}", f"_{b}"))
    both["ratio"] = both[f"step_ms_{b}"] / both[f"step_ms_{a}"]
    both["noise"] = both[f"step_ms_cv_{a}"].fillna(0) + both[f"step_ms_cv_{b}"].fillna(0)
    both["significant"] = (both["ratio"] - 1).abs() > both["noise"]
    why = []
    for _, r in both.iterrows():
        diffs = [f"{k} {r[f'{k}_{a}']} vs {r[f'{k}_{b}']}" for k in MUST_AGREE if r[f"{k}_{a}"] != r[f"{k}_{b}"]]
        why.append("; ".join(diffs))
    both["why"] = why
    both["comparable"] = both["why"] == ""
    cols = [*POSITION, f"step_ms_{a}", f"step_ms_{b}", "ratio", "noise", "significant", "comparable", "why"]
    return both[cols].sort_values(["mode", "world_size", "gas", "no_sync", "bucket_cap_mb"]).reset_index(drop=True)
