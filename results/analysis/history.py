"""A cluster's history: the same configuration across its sweeps, split where a version changed, and the changes
beyond the noise flagged.

The sweeps of one cluster are ordered by when they started. A new segment begins where any of VERSIONS differs
from the sweep before (torch, CUDA, NCCL as it reports itself, the driver, Ray). For each pair of neighbouring
segments, every configuration measured on both sides is pooled per side (results.analysis.cells.ok_cells: its median
step and bootstrap replicates) and the step ratio after / before gets an interval. A line is flagged where that
interval excludes 1 at a level corrected for the number of configurations compared (Bonferroni: 5% across all
of them) and the change is beyond what the cluster's sweeps differ by without one: the spread of a configuration's
step between sweeps of one segment (pooled over configurations and segments) sets a second bound, so drift
from sweep to sweep (another day, another state of the machine) is not taken for a regression. A history that
differs only by noise flags nothing however many configurations it holds.
"""

from __future__ import annotations

from statistics import NormalDist

import numpy as np
import pandas as pd

from results.analysis import cells as analysis
from results.analysis import identity
from results.analysis.uncertainty import interval
from results.errors import UnknownSelection

VERSIONS = ["torch_version", "cuda_version", "nccl_version", "driver_version", "ray_version"]
"""What splits a cluster's history: a change of any of these between two sweeps."""
FAMILY_ALPHA = 0.05
"""The chance, across every configuration compared at one change, that noise alone flags any of them."""
SHOWN = ["mode", "world_size", "num_nodes", "gas", "no_sync", "bucket_cap_mb"]


def sweeps_in_order(rows: pd.DataFrame) -> pd.DataFrame:
    """One line per sweep of `rows` (one cluster): when it started, its versions and its segment (0, 1, …: a new
    one wherever a version differs from the sweep before)."""
    ok = rows[rows["status"] == "ok"]
    present = [v for v in VERSIONS if v in ok]
    first = ok.groupby("sweep_id")[present].agg(lambda s: s.dropna().iloc[0] if s.notna().any() else None)
    table = first.assign(started_at=ok.groupby("sweep_id")["started_at"].min()).sort_values("started_at")
    text = table[present].map(_text)
    changed = text.ne(text.shift()).any(axis=1)
    changed.iloc[0] = False
    return table.assign(segment=changed.cumsum()).reset_index()


def history(rows: pd.DataFrame, cluster: str) -> pd.DataFrame:
    """Per version change of `cluster`'s history and configuration measured on both sides: the steps before and
    after, their ratio with its interval (family-corrected), `flagged`, and the versions on each side."""
    mine = identity.with_knobs(rows[rows["cluster"] == cluster])
    if mine.empty or not (mine["status"] == "ok").any():
        known = ", ".join(sorted(rows["cluster"].unique()))
        raise UnknownSelection(f"cluster {cluster!r} has no ok rows; clusters: {known}")
    order = sweeps_in_order(mine)
    spread = sweep_spread(mine, order)
    lines = [_change(mine, order, s, spread) for s in range(1, int(order["segment"].max()) + 1)]
    out = pd.concat(lines, ignore_index=True) if lines else pd.DataFrame(columns=[*identity.CONFIGURATION, *RESULT])
    return out[[*SHOWN, *(k for k in identity.varying(out) if k not in SHOWN), *RESULT]]


def sweep_spread(rows: pd.DataFrame, order: pd.DataFrame) -> tuple[float, int]:
    """(s, degrees of freedom): the standard deviation of log step between sweeps of one segment, per
    configuration, pooled over every configuration and segment with two sweeps or more ((nan, 0) without)."""
    ok = analysis.usable(rows)
    per = ok.assign(_key=identity.config_text(ok, identity.CONFIGURATION))
    per = per.groupby(["_key", "sweep_id"])["step_ms"].median().reset_index()
    per = per.merge(order[["sweep_id", "segment"]], on="sweep_id").assign(log=lambda f: np.log(f["step_ms"]))
    grouped = per.groupby(["_key", "segment"])["log"]
    squares = (per["log"] - grouped.transform("mean")) ** 2
    dof = int((grouped.count() - 1).clip(lower=0).sum())
    return (float(np.sqrt(squares.sum() / dof)), dof) if dof else (np.nan, 0)


def _bound(spread: tuple[float, int], n_before: int, n_after: int, alpha: float) -> float:
    """The smallest |log ratio| of two sides of n_before and n_after sweeps that sweep-to-sweep drift explains
    with probability below alpha (0 without an estimate of it)."""
    s, dof = spread
    if not dof:
        return 0.0
    z = NormalDist().inv_cdf(1 - alpha / 2)
    t = z + (z**3 + z) / (4 * dof)  # Student's t from z, its first correction for few degrees of freedom
    return float(t * s * np.sqrt(1 / n_before + 1 / n_after))


def _change(rows: pd.DataFrame, order: pd.DataFrame, segment: int, spread: tuple[float, int]) -> pd.DataFrame:
    """The configurations measured on both sides of the change into `segment`, compared."""
    sides = {name: order[order["segment"] == s] for name, s in (("before", segment - 1), ("after", segment))}
    cells = {name: _cells(rows[rows["sweep_id"].isin(side["sweep_id"])], name) for name, side in sides.items()}
    both = cells["before"].merge(cells["after"], on="_key", suffixes=("_before", "_after"))
    alpha = FAMILY_ALPHA / max(len(both), 1)
    bounds = [
        interval(b / a, 1 - alpha) if isinstance(a, np.ndarray) and isinstance(b, np.ndarray) else (np.nan, np.nan)
        for a, b in zip(both["reps_before"], both["reps_after"], strict=True)
    ]
    out = both.assign(
        ratio=both["step_ms_after"] / both["step_ms_before"],
        ratio_ci_lo=[lo for lo, _ in bounds],
        ratio_ci_hi=[hi for _, hi in bounds],
        change=_versions_text(sides["before"].iloc[-1], sides["after"].iloc[0]),
        sweeps_before=", ".join(sides["before"]["sweep_id"]),
        sweeps_after=", ".join(sides["after"]["sweep_id"]),
    )
    drift = _bound(spread, len(sides["before"]), len(sides["after"]), alpha)
    beyond = (out["ratio_ci_lo"] > 1) | (out["ratio_ci_hi"] < 1)
    out["flagged"] = beyond & (np.log(out["ratio"]).abs() > drift)
    out["drift_bound"] = np.exp(drift) - 1
    for k in identity.CONFIGURATION:
        out[k] = out[f"{k}_before"]
    return out[[*identity.CONFIGURATION, *RESULT]]


def _cells(rows: pd.DataFrame, side: str) -> pd.DataFrame:
    """Each configuration of `rows` pooled over its sweeps (one side of a change), keyed by its configuration."""
    cells = analysis.ok_cells(rows.assign(sweep_id=side))
    keys = identity.config_text(cells, identity.CONFIGURATION)
    return cells[[*identity.CONFIGURATION, "step_ms"]].assign(_key=keys, reps=cells["step_ms_reps"].to_list())


def _versions_text(before: pd.Series, after: pd.Series) -> str:
    """`torch_version 2.12.0 -> 2.13.0; …`: the versions that changed."""
    return "; ".join(
        f"{v} {_text(before[v]) or '-'} -> {_text(after[v]) or '-'}"
        for v in VERSIONS
        if v in before and _text(before[v]) != _text(after[v])
    )


def _text(value: object) -> str:
    """A version as text: missing (None, NaN) is the empty text, whichever way the frame holds it."""
    return "" if value is None or (isinstance(value, float) and value != value) else str(value)


RESULT = ["step_ms_before", "step_ms_after", "ratio", "ratio_ci_lo", "ratio_ci_hi", "drift_bound", "flagged"]
RESULT += ["change", "sweeps_before", "sweeps_after"]
