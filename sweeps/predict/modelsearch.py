"""`search: model`: measure only what could win. Before the sweep, the overlap model (sweeps.predict.steps) predicts
every cell from the cluster's calibration and a profile of the workload; per curve the sweep then measures the
cells the model cannot rule out, the baseline and PyTorch's default bucket, and races them (results.analysis.racing).

How many cells per curve (k): `model_k` where the spec sets it, else every cell whose predicted step is within
twice the model's own within-curve error of the curve's predicted best, at least 2. That error is measured on
this cluster: over the earlier sweeps whose workloads have a stored profile, the median |r / median(r of its
curve) − 1| of r = predicted / measured, the part of the error that can reorder a curve (a constant bias, such
as compute slowed by communication, cannot). Two cells' errors can move apart by twice it. Without an earlier
comparison the error is taken as DEFAULT_ERROR, and the choice says so.

Every measured row records why the model chose its cell (`model_choice`) and the step it predicted
(`model_predicted_ms`); the sweep's manifest keeps the whole choice, so `--resume` measures the same cells.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np
import pandas as pd

from results.analysis.identity import CURVE_KEYS, CURVE_KNOBS, config_text
from results.errors import ResultsError
from results.model import predicted
from results.storage.store import Store, load, load_calibration
from results.values import number
from sweeps.plan.grid import Cell
from sweeps.predict import steps as predict
from sweeps.spec.sweep import SweepSpec
from trainers.knobs import BY_NAME

DEFAULT_ERROR = 0.10  # within-curve error assumed where the cluster has no measured comparison yet
MIN_K = 2  # cells per curve the model always keeps: a race needs two
DEFAULT_BUCKET_MB = BY_NAME["bucket_cap_mb"].pytorch


@dataclass(frozen=True, kw_only=True)
class Choice:
    """What the model chose to measure."""

    chosen: dict[str, dict]
    """cell id -> {"why": text, "predicted_ms": the model's step or None}: the cells to measure."""
    error: float
    """The within-curve error the band was drawn from (fraction)."""
    error_from: str
    """Where `error` came from: the earlier comparisons it was measured on, or the default."""
    grid_cells: int
    """Cells in the full grid."""
    skipped: dict[str, str] = field(default_factory=dict)
    """cell id -> why it is not measured."""

    def to_dict(self) -> dict:
        return asdict(self)


def within_curve_error(store: Store, cluster: str) -> tuple[float | None, int]:
    """(median |r / curve median r − 1|, cells it was measured on) over the cluster's earlier sweeps with a
    stored profile (r = predicted / measured); (None, 0) where there is none."""
    try:
        rows = load(store.uri, cluster=cluster)
    except ResultsError:  # no earlier sweep on this cluster
        return None, 0
    out = predicted.for_rows(rows, store.read_profiles().to_pandas(), load_calibration(store.uri, cluster))
    if out is None:
        return None, 0
    cells = out["cells"][out["cells"]["predicted_ms"].notna()]
    ratio = cells["predicted_ms"] / cells["step_ms"]
    by_curve = ratio.groupby(config_text(cells, CURVE_KEYS)).transform("median")
    return float(np.median(np.abs(ratio / by_curve - 1))), len(cells)


def choose(spec: SweepSpec, cells: list[Cell], store: Store, cluster: str, address: str | None = None) -> Choice:
    """The cells to measure and why (predict.inputs raises NoCalibration naming `ddpsweep calibrate`; a missing
    profile runs on the cluster at `address` or RAY_ADDRESS, else here)."""
    table = predict.predictions(predict.inputs(spec, store, cluster, address))
    error, n = within_curve_error(store, cluster)
    source = f"measured on {n} cells of earlier sweeps on {cluster}" if error is not None else "no earlier sweep"
    error = DEFAULT_ERROR if error is None else error
    whys = dict(zip(table["cell_id"], _whys(table, spec.model_k, error), strict=True))
    steps = dict(zip(table["cell_id"], table["predicted_ms"], strict=True))
    chosen = {c.cell_id: {"why": whys[c.cell_id], "predicted_ms": number(steps[c.cell_id])} for c in cells}
    chosen = {k: v for k, v in chosen.items() if v["why"] is not None}
    skipped = _skipped(table, set(chosen))
    return Choice(chosen=chosen, error=error, error_from=source, grid_cells=len(cells), skipped=skipped)


def _skipped(table: pd.DataFrame, chosen: set[str]) -> dict[str, str]:
    """Why each cell the model left out is not measured."""
    curve = [c for c in CURVE_KNOBS if c in table]
    best = table.groupby(curve, dropna=False)["predicted_ms"].transform("min")
    layout = same_layout(table)
    return {
        r.cell_id: layout.get(r.cell_id) or f"predicted {r.predicted_ms / b:.3f}x its curve's best: outside the band"
        for r, b in zip(table.itertuples(), best, strict=True)
        if r.cell_id not in chosen
    }


def _whys(table: pd.DataFrame, model_k: int | None, error: float) -> list[str | None]:
    """Per line of the predictions table, why its cell is measured, or None."""
    whys: list[str | None] = [None] * len(table)
    for i, r in enumerate(table.itertuples()):
        if r.mode == "single":
            whys[i] = "baseline (single worker)"
        elif r.mode != "ddp":
            whys[i] = f"mode {r.mode}: not a bucket curve"
        elif number(r.predicted_ms) is None:
            whys[i] = f"not modeled ({r.note})"
    ddp = table[(table["mode"] == "ddp") & table["predicted_ms"].notna()]
    for _, curve in ddp.groupby([c for c in CURVE_KNOBS if c in table], dropna=False):
        ranked = _one_per_layout(curve).sort_values("predicted_ms", kind="stable")
        best = float(ranked["predicted_ms"].iloc[0])
        within = int((ranked["predicted_ms"] <= best * (1 + 2 * error)).sum())
        k = model_k or max(MIN_K, within)
        for place, (i, r) in enumerate(ranked.iterrows(), start=1):
            why = []
            if place <= k:
                rule = f"model_k {model_k}" if model_k else f"within 2 x {error:.1%} of the best"
                why.append(f"predicted #{place} of {len(ranked)}, {r['predicted_ms'] / best:.3f}x the best ({rule})")
            if r["bucket_cap_mb"] == DEFAULT_BUCKET_MB:
                why.append(f"PyTorch's default bucket ({DEFAULT_BUCKET_MB:g} MB)")
            whys[table.index.get_loc(i)] = "; ".join(why) or None
    return whys


def _one_per_layout(curve: pd.DataFrame) -> pd.DataFrame:
    """One cell per bucket layout: caps that give DDP the same buckets run the same step (PyTorch's default where
    it is one of them, else the smallest cap); the others are never measured."""
    if "bucket_bytes" not in curve:
        return curve
    layout = curve["bucket_bytes"].map(lambda b: tuple(b) if isinstance(b, list | tuple) else b)
    default_first = curve.assign(_d=curve["bucket_cap_mb"] != DEFAULT_BUCKET_MB, _l=layout.map(str))
    return default_first.sort_values(["_d", "bucket_cap_mb"]).drop_duplicates("_l").drop(columns=["_d", "_l"])


def same_layout(table: pd.DataFrame) -> dict[str, str]:
    """cell id -> why it is not measured, for the DDP cells whose layout another cell of their curve runs."""
    out = {}
    ddp = table[(table["mode"] == "ddp") & table["predicted_ms"].notna()]
    for _, curve in ddp.groupby([c for c in CURVE_KNOBS if c in table], dropna=False):
        kept = _one_per_layout(curve)
        layout = curve["bucket_bytes"].map(str)
        by_layout = dict(zip(layout[kept.index], kept["bucket_cap_mb"], strict=True))
        for i in curve.index.difference(kept.index):
            n = len(curve.at[i, "bucket_bytes"])
            out[curve.at[i, "cell_id"]] = f"same {n} bucket(s) as {by_layout[layout[i]]:g} MB: the same step"
    return out


def summary_line(choice: Choice) -> str:
    """What the dry run and the start of a run print."""
    same = sum(why.startswith("same ") for why in choice.skipped.values())
    left = f"; {same} share a bucket layout with a measured cell" if same else ""
    return (
        f"search: model measures {len(choice.chosen)} of {choice.grid_cells} cells (error {choice.error:.1%}, "
        f"{choice.error_from}{left}), then races them"
    )
