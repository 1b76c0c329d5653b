"""Compare clusters: the same configuration measured on both, side by side, with the ratio's interval and a
verdict.

A line is one configuration — every knob of trainers.knobs, the workload's fingerprint among them
(results.analysis.identity.CONFIGURATION) — measured on both clusters; a configuration measured on one side only is
listed as such, never paired with another. The lines show the knobs that vary in the selection.
A difference is `slower` or `faster` only when the 95% interval of the step-time ratio (b / a, from the two
cells' bootstrap replicates, resampled independently) excludes 1; otherwise it is `same within noise`. Lines
whose torch or NCCL versions differ are flagged not comparable.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from results.analysis import identity
from results.analysis.cells import ok_cells
from results.analysis.uncertainty import interval
from results.errors import UnknownSelection
from results.values import plain

POSITION = identity.CONFIGURATION
"""What is matched across clusters: the whole configuration."""
MUST_AGREE = ["workload_fingerprint", "torch_version", "nccl_version"]
"""What must also agree for two measurements to be comparable; the fingerprint, part of the configuration too, is
matched as a position, so two models under one name are never paired."""
_AGREE = [k for k in MUST_AGREE if k not in POSITION]
SHOWN = ["mode", "world_size", "num_nodes", "gas", "no_sync", "bucket_cap_mb"]
"""Knobs every compare line shows; the others only where they vary in the selection."""


def _per_cluster(rows: pd.DataFrame, cluster: str) -> pd.DataFrame:
    mine = identity.with_knobs(rows[(rows["cluster"] == cluster) & (rows["status"] == "ok")])
    if mine.empty:
        raise UnknownSelection(
            f"cluster {cluster!r} has no ok rows; clusters: {', '.join(sorted(rows['cluster'].unique()))}"
        )
    # one sweep's configuration or several: pooled per configuration, never across two
    pooled = mine.assign(sweep_id="*", cluster=cluster)
    cells = _keyed(ok_cells(pooled)[[*POSITION, "step_ms", "step_ms_reps", "n_repeats"]])
    agree = (
        _keyed(mine)
        .groupby("_key")
        .agg(
            {"sweep_id": "nunique"} | {k: lambda s: ",".join(sorted({str(v) for v in s})) for k in _AGREE if k in mine}
        )
    )
    return cells.merge(agree.reset_index(), on="_key", how="left")


def _keyed(frame: pd.DataFrame) -> pd.DataFrame:
    """`frame` with `_key`: its configuration as one text (nulls and numpy types spelled alike on both sides)."""
    keys = [repr(tuple(plain(v) for v in r)) for r in frame[POSITION].itertuples(index=False)]
    return frame.assign(_key=keys)


def _verdict(lo: float, hi: float) -> str:
    if not (lo == lo and hi == hi):  # NaN: a side with a single number has no interval
        return "unknown (no interval)"
    if lo > 1:
        return "slower"
    if hi < 1:
        return "faster"
    return "same within noise"


def compare(rows: pd.DataFrame, a: str, b: str) -> pd.DataFrame:
    """One line per configuration: measured on both clusters (step_ms of each, ratio b/a with its interval, the
    verdict, `significant`, `comparable` with `why` not), or on one only (`measured_on` says which)."""
    left, right = _per_cluster(rows, a), _per_cluster(rows, b)
    both = left.merge(right.drop(columns=POSITION), on="_key", how="outer", suffixes=(f"_{a}", f"_{b}"))
    for k in POSITION:  # the configuration from whichever side measured it
        both[k] = both["_key"].map(
            dict(zip(left["_key"], left[k], strict=True)) | dict(zip(right["_key"], right[k], strict=True))
        )
    on_a, on_b = both[f"step_ms_{a}"].notna(), both[f"step_ms_{b}"].notna()
    both["measured_on"] = np.select([on_a & on_b, on_a], ["both", f"{a} only"], f"{b} only")
    both["ratio"] = both[f"step_ms_{b}"] / both[f"step_ms_{a}"]
    bounds = [
        interval(rb / ra) if isinstance(ra, np.ndarray) and isinstance(rb, np.ndarray) else (np.nan, np.nan)
        for ra, rb in zip(both[f"step_ms_reps_{a}"], both[f"step_ms_reps_{b}"], strict=True)
    ]
    both["ratio_ci_lo"] = [lo for lo, _ in bounds]
    both["ratio_ci_hi"] = [hi for _, hi in bounds]
    both["verdict"] = [
        _verdict(lo, hi) if where == "both" else f"measured on {where}"
        for (lo, hi), where in zip(bounds, both["measured_on"], strict=True)
    ]
    both["significant"] = both["verdict"].isin(["slower", "faster"])
    both["why"] = [_why(r, a, b) for _, r in both.iterrows()]
    both["comparable"] = (both["why"] == "") & (both["measured_on"] == "both")
    shown = [*SHOWN, *(k for k in identity.varying(both) if k not in SHOWN)]
    cols = [*shown, f"step_ms_{a}", f"step_ms_{b}", "ratio", "ratio_ci_lo", "ratio_ci_hi", "verdict"]
    cols += ["significant", "comparable", "why", "measured_on"]
    order = both["measured_on"].map({"both": 0}).fillna(1)
    both = both.assign(_order=order).sort_values(["_order", *SHOWN], kind="stable", na_position="first")
    return both[cols].reset_index(drop=True)


def _why(r: pd.Series, a: str, b: str) -> str:
    """What keeps a line measured on both sides from being comparable ("" if nothing)."""
    if r["measured_on"] != "both":
        return ""
    diffs = [
        f"{k} {r[f'{k}_{a}']} vs {r[f'{k}_{b}']}" for k in _AGREE if f"{k}_{a}" in r and r[f"{k}_{a}"] != r[f"{k}_{b}"]
    ]
    return "; ".join(diffs)
