"""Predicted beside measured: a sweep's cells with the overlap model's step (sweeps.predict) and each one's
`prediction_error`, and per curve how far the model can be trusted: median |predicted / measured − 1|,
Spearman's rank correlation, and whether the predicted best lies in the measured indistinguishable set.

Twice: with the profile's compute as measured alone (slowdown 1), and with one compute factor per placement
fitted to the sweep's own cells (results.overlap.fit_slowdown), shown beside it.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from results import analysis, overlap
from results.identity import CURVE_KEYS, config_text
from sweeps import predict


def measured_cells(rows: pd.DataFrame) -> pd.DataFrame:
    """The sweep's DDP configurations (ok_cells: pooled median, interval, replicates) with their cell ids."""
    cells = analysis.ok_cells(rows)
    usable = analysis.usable(rows)
    ids = dict(zip(config_text(usable), usable["cell_id"], strict=True))
    cells = cells.assign(cell_id=[ids.get(k) for k in config_text(cells)])
    return cells[(cells["mode"] == "ddp") & cells["bucket_cap_mb"].notna()].reset_index(drop=True)


def beside(pred: pd.DataFrame, cells: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(per cell: measured and predicted step, prediction_error; per curve: the accuracy figures)."""
    both = cells.merge(pred[["cell_id", "predicted_ms", "slowdown"]], on="cell_id", how="inner")
    both = both[both["predicted_ms"].notna()].reset_index(drop=True)
    both["prediction_error"] = both["predicted_ms"].astype(float) / both["step_ms"] - 1
    curves = []
    for key, grp in both.groupby(CURVE_KEYS, dropna=False):
        grp = grp.reset_index(drop=True)
        best = grp.loc[grp["step_ms"].idxmin()]
        same = {i for i, r in grp.iterrows() if analysis.same_as(r, best)}
        acc = overlap.accuracy(grp["predicted_ms"].astype(float), grp["step_ms"], same)
        curves.append(
            dict(zip(CURVE_KEYS, key, strict=True))
            | {k: acc[k] for k in ("median_abs_error", "spearman", "predicted_best_in_set")}
            | {
                "cells": len(grp),
                "predicted_best_mb": float(grp["bucket_cap_mb"].iloc[acc["predicted_best"]]),
                "measured_best_mb": float(best["bucket_cap_mb"]),
                "indistinguishable_mb": sorted(float(grp["bucket_cap_mb"].iloc[i]) for i in same),
                "slowdown": float(grp["slowdown"].iloc[0]),
            }
        )
    return both, pd.DataFrame(curves)


def fitted_slowdown(given: predict.Inputs, cells: pd.DataFrame) -> dict[tuple, float]:
    """Per placement, the compute factor whose predictions are nearest the sweep's measured cells."""
    out = {}
    for (world, nodes), grp in cells.groupby(["world_size", "num_nodes"]):
        mine = [c for c in given.cells if (c.world_size, c.num_nodes) == (world, nodes)]
        by_id = {c.cell_id: c for c in mine}
        fit = given.fits.get((int(world), int(nodes)))

        def one(cell, s: float, fit=fit) -> float | None:
            return predict.predict_cell(cell, given.profile(cell), fit, s)["predicted_ms"]

        pairs = [(by_id[i], m) for i, m in zip(grp["cell_id"], grp["step_ms"], strict=True) if i in by_id]
        pairs = [(c, m) for c, m in pairs if one(c, 1.0) is not None]  # modeled cells only
        if pairs:
            measured = np.array([m for _, m in pairs])
            out[(int(world), int(nodes))] = overlap.fit_slowdown(
                lambda s, pairs=pairs: np.array([one(c, s) for c, _ in pairs]), measured
            )
    return out


def compare(given: predict.Inputs, rows: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """The comparison at slowdown 1 and at the fitted slowdowns: cells and curves of each."""
    cells = measured_cells(rows)
    cells1, curves1 = beside(predict.predictions(given), cells)
    fitted = predict.predictions(given, fitted_slowdown(given, cells))
    cells2, curves2 = beside(fitted, cells)
    return {"cells": cells1, "curves": curves1, "cells_fitted": cells2, "curves_fitted": curves2}


def to_text(out: dict[str, pd.DataFrame]) -> str:
    lines = []
    for name, title in (
        ("curves", "compute as profiled (slowdown 1)"),
        ("curves_fitted", "slowdown fitted per placement"),
    ):
        lines.append(f"{title}:")
        for c in out[name].itertuples():
            rho = "?" if c.spearman is None or c.spearman != c.spearman else f"{c.spearman:.2f}"
            lines.append(
                f"  {c.num_nodes}x{c.world_size // c.num_nodes} gas {c.gas} no_sync {str(c.no_sync).lower()}: "
                f"median |error| {c.median_abs_error:.1%}, Spearman {rho}, predicted best {c.predicted_best_mb:g} MB "
                f"{'in' if c.predicted_best_in_set else 'NOT in'} the measured set {c.indistinguishable_mb} "
                f"(slowdown {c.slowdown:.2f})"
            )
    return "\n".join(lines)
