"""Predicted beside measured: each measured DDP cell with the overlap model's step (results.model.overlap) from the
cluster's stored profile of its workload and the newest calibration of its placement, its `prediction_error`,
and per curve how far the model can be trusted: median |predicted / measured − 1|, Spearman's rank correlation,
and whether the predicted best lies in the measured indistinguishable set.

Twice: with the profile's compute as measured alone and the overlap terms its calibration measured (slowdown 1,
what `ddpsweep predict` says before a sweep), and, as a diagnostic beside it, with one compute factor per
placement fitted to the sweep's own cells (`overlap.fit_slowdown`).
Pure over data (rows, profiles, calibration): the query views, the dashboard and the report call it.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np
import pandas as pd

from results.analysis import cells as analysis
from results.analysis.identity import CONFIG_KEYS, CURVE_KEYS, config_text
from results.knobs import KNOBS, WORKLOAD
from results.model import costmodel, overlap
from results.model.overlap import Profile
from results.values import plain

PROFILE_FIELDS = tuple(k.name for k in KNOBS if k.scope == WORKLOAD)
"""What a profile is of (with the device type and torch version): the workload, its shapes, the micro-batch."""
NOT_MODELED = {"powersgd": "PowerSGD's low-rank exchange is not DDP's buckets"}
NO_PROFILE = "no profile of this workload on the cluster: run `ddpsweep predict SPEC` (it profiles one rank)"
OTHER_MODEL = (
    "the stored profile is of another model ({} bytes of gradients, the rows' {}): run `ddpsweep predict SPEC` "
    "to profile it again"
)
NO_CALIBRATION = "no calibration of this placement on the cluster: run `ddpsweep calibrate SPEC`"
PLACE = ["cluster", "sweep_id", "world_size", "num_nodes"]  # one fitted slowdown each

Profiles = Mapping[tuple[str, str], Profile]  # (cluster, profile key) -> profile


@dataclass(frozen=True)
class Cost:
    """A placement's communication as the overlap model takes it, from one calibration: t(bytes) in ms, and the
    terms measured beside it (none where the calibration predates them)."""

    t: Callable[[int], float]
    terms: overlap.Terms = overlap.NO_TERMS

    def __call__(self, nbytes: int) -> float:
        return self.t(nbytes)


def profile_key(knobs: Mapping, device: str, torch_version: str) -> str:
    """The key a profile of these knobs (a StepConfig's or a row's) is stored under."""
    what = [plain(knobs[f]) for f in PROFILE_FIELDS]
    return hashlib.sha256(json.dumps([*what, device, torch_version]).encode()).hexdigest()[:16]


def profiles_of(table: pd.DataFrame | None) -> dict[tuple[str, str], Profile]:
    """Store.read_profiles()'s table (cluster, key, profile JSON) as profiles by (cluster, key)."""
    if table is None or len(table) == 0:
        return {}
    return {
        (c, k): Profile.from_dict(json.loads(p))
        for c, k, p in zip(table["cluster"], table["key"], table["profile"], strict=True)
    }


def newest_costs(calibration: pd.DataFrame) -> dict[tuple[str, int, int], Cost]:
    """Per (cluster, world size, nodes): t(bytes) and the terms of its newest calibration (by when it was
    measured: sweep ids begin with the spec's name, so they do not sort by time)."""
    if len(calibration) == 0:
        return {}
    when = calibration.groupby("sweep_id")["measured_at"].max()
    fits = costmodel.fits(calibration)
    fits = fits.assign(measured_at=fits["sweep_id"].map(when)).sort_values("measured_at")
    measured = costmodel.terms(calibration)
    by_fit = {tuple(r[k] for k in costmodel.FIT_KEYS): r for _, r in measured.iterrows()}
    out = {}
    for _, r in fits.iterrows():
        found = by_fit.get(tuple(r[k] for k in costmodel.FIT_KEYS))
        terms = overlap.NO_TERMS if found is None else terms_of(found)
        out[(r["cluster"], int(r["world_size"]), int(r["num_nodes"]))] = Cost(cost(r), terms)
    return out


def terms_of(measured: pd.Series) -> overlap.Terms:
    """The model's terms from costmodel.terms()' line: each median, g at least 1 and c, κ, λ at least 0 (beyond
    them is a term this calibration could not tell from nothing); a term not measured has its neutral value."""

    def median(name: str, neutral: float) -> float:
        v = measured.get(name)
        return neutral if v is None or pd.isna(v) else max(neutral, float(v))

    g, c, k = median("compute", 1.0), median("bucket_ms", 0.0), median("contention", 0.0)
    return overlap.Terms(compute=g, bucket_ms=c, contention=k, comm_contention=median("comm_contention", 0.0))


def cost(fit: pd.Series) -> Callable[[int], float]:
    """t(bytes), the all-reduce time in ms of a message on the fit's placement, memoized: the slowdown fit asks
    the same sizes hundreds of times."""
    return functools.lru_cache(maxsize=None)(lambda nbytes: float(costmodel.predict_ms(fit, [nbytes])[0]))


def predict_one(knobs: Mapping, prof: Profile, t: Cost | None, slowdown: float = 1.0) -> dict:
    """The model's step for one configuration (knobs of a StepConfig or a row; `t`: its placement's cost, None
    for one rank): predicted_ms, comm_ms (per synced micro-step), exposed_ms, and `note`, the reason where it
    is not modeled (then the times are None)."""
    mode, gas, no_sync = knobs["mode"], int(knobs["gas"]), bool(knobs["no_sync"])
    if knobs.get("compile") or knobs["comm_hook"] in NOT_MODELED:
        why = "compiled steps are not modeled" if knobs.get("compile") else NOT_MODELED[knobs["comm_hook"]]
        return {"predicted_ms": None, "comm_ms": None, "exposed_ms": None, "note": why}
    compute = (prof.forward_ms + prof.backward_ms) * slowdown
    if mode == "single" or t is None:
        return {"predicted_ms": compute * gas + prof.optimizer_ms * slowdown, "comm_ms": 0.0, "exposed_ms": 0.0}
    if mode == "naive":  # one blocking all-reduce per gradient after the backward
        comm = sum(t(b) for b in prof.nbytes)
        synced = 1 if no_sync else gas
        predicted = compute * gas + comm * synced + prof.optimizer_ms * slowdown
        return {"predicted_ms": predicted, "comm_ms": comm, "exposed_ms": comm}
    buckets = overlap.layout_for(prof, float(knobs["bucket_cap_mb"]), plain(knobs.get("first_bucket_mb")))
    hook, terms = knobs["comm_hook"], t.terms
    step = overlap.predict_step(prof, buckets, t, gas=gas, no_sync=no_sync, hook=hook, slowdown=slowdown, terms=terms)
    sizes = tuple(sum(prof.nbytes[i] for i in b) for b in buckets)  # bytes per bucket, in the order they fill
    return {"predicted_ms": step.step_ms, "comm_ms": step.comm_ms, "exposed_ms": step.exposed_ms, "bucket_bytes": sizes}


def measured_cells(rows: pd.DataFrame) -> pd.DataFrame:
    """The DDP configurations of the rows (ok_cells: pooled median, interval, replicates) with their cell id and
    torch version (what their profile is keyed by)."""
    cells = analysis.ok_cells(rows)
    usable = analysis.usable(rows)
    seen = dict(zip(config_text(usable), zip(usable["cell_id"], usable["torch_version"], strict=True), strict=True))
    found = [seen.get(k, (None, None)) for k in config_text(cells)]
    cells = cells.assign(cell_id=[f[0] for f in found], torch_version=[f[1] for f in found])
    return cells[(cells["mode"] == "ddp") & cells["bucket_cap_mb"].notna()].reset_index(drop=True)


def _inputs(cell: pd.Series, profiles: Profiles, costs: Mapping) -> tuple[Profile | None, Cost | None, str]:
    """The cell's profile and cost, or the reason one is missing."""
    prof = profiles.get((cell["cluster"], profile_key(cell, cell["device_type"], cell["torch_version"])))
    t = costs.get((cell["cluster"], int(cell["world_size"]), int(cell["num_nodes"])))
    if prof is None:
        return None, None, NO_PROFILE
    if pd.notna(cell.get("grad_bytes")) and int(cell["grad_bytes"]) != prof.gradient_bytes:
        return None, None, OTHER_MODEL.format(prof.gradient_bytes, int(cell["grad_bytes"]))
    if t is None and int(cell["world_size"]) > 1:
        return None, None, NO_CALIBRATION
    return prof, t, ""


def fitted_slowdown(cells: pd.DataFrame, profiles: Profiles, costs: Mapping) -> dict[tuple, float]:
    """Per placement of a sweep (cluster, sweep, world size, nodes): the compute factor whose predictions are
    nearest its measured cells."""
    out = {}
    for place, grp in cells.groupby(PLACE):
        models = []
        for _, c in grp.iterrows():
            prof, t, _ = _inputs(c, profiles, costs)
            if prof is not None and predict_one(c, prof, t)["predicted_ms"] is not None:
                models.append((functools.partial(predict_one, c, prof, t), c["step_ms"]))
        if models:
            measured = np.array([m for _, m in models])
            predict = lambda s, models=models: np.array([f(s)["predicted_ms"] for f, _ in models])  # noqa: E731
            out[tuple(place)] = overlap.fit_slowdown(predict, measured)
    return out


def with_predictions(cells: pd.DataFrame, profiles: Profiles, costs: Mapping, slowdown: Mapping | None = None):
    """`cells` with predicted_ms, prediction_error, prediction_note and slowdown (1 where not fitted)."""
    out = []
    for _, c in cells.iterrows():
        s = (slowdown or {}).get(tuple(c[k] for k in PLACE), 1.0)
        prof, t, why = _inputs(c, profiles, costs)
        got = predict_one(c, prof, t, s) if prof is not None else {"predicted_ms": None, "note": why}
        out.append({"predicted_ms": got["predicted_ms"], "prediction_note": got.get("note"), "slowdown": s})
    extra = pd.DataFrame(out, index=cells.index, columns=["predicted_ms", "prediction_note", "slowdown"])
    extra["predicted_ms"] = extra["predicted_ms"].astype(float)
    extra["prediction_error"] = extra["predicted_ms"] / cells["step_ms"] - 1
    return pd.concat([cells, extra], axis=1)


def curves(cells: pd.DataFrame) -> pd.DataFrame:
    """Per curve with predictions: median |error|, Spearman, the predicted and measured best buckets and
    whether the predicted best is in the measured indistinguishable set."""
    lines = []
    for key, grp in cells[cells["predicted_ms"].notna()].groupby(CURVE_KEYS, dropna=False):
        grp = grp.reset_index(drop=True)
        best = grp.loc[grp["step_ms"].idxmin()]
        same = {i for i, r in grp.iterrows() if analysis.same_as(r, best)}
        acc = overlap.accuracy(grp["predicted_ms"], grp["step_ms"], same)
        lines.append(
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
    return pd.DataFrame(lines, columns=[*CURVE_KEYS, *CURVE_COLUMNS])


CURVE_COLUMNS = ["median_abs_error", "spearman", "predicted_best_in_set", "cells", "predicted_best_mb"]
CURVE_COLUMNS += ["measured_best_mb", "indistinguishable_mb", "slowdown"]


def compare(rows: pd.DataFrame, profiles: Profiles, calibration: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """The comparison at slowdown 1 and at the fitted slowdowns: cells and curves of each."""
    cells, costs = measured_cells(rows), newest_costs(calibration)
    first = with_predictions(cells, profiles, costs)
    fitted = with_predictions(cells, profiles, costs, fitted_slowdown(cells, profiles, costs))
    return {"cells": first, "curves": curves(first), "cells_fitted": fitted, "curves_fitted": curves(fitted)}


def for_rows(rows: pd.DataFrame, profiles: pd.DataFrame | None, calibration: pd.DataFrame) -> dict | None:
    """compare() for a page or report: None where the rows' clusters have no profile (Store.read_profiles'
    table) or no curve could be predicted."""
    given = {k: v for k, v in profiles_of(profiles).items() if k[0] in set(rows["cluster"])}
    if not given or rows.empty:
        return None
    out = compare(rows, given, calibration)
    return None if out["curves"].empty else out


ACCURACY_COLUMNS = ["world_size", "gas", "no_sync", "predicted_best_mb", "measured_best_mb", "indistinguishable_mb"]
ACCURACY_COLUMNS += ["predicted_best_in_set", "median_abs_error", "spearman", "slowdown_fitted"]
ACCURACY_COLUMNS += ["median_abs_error_fitted", "spearman_fitted", "predicted_best_in_set_fitted"]


def accuracy_table(out: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """Each curve's accuracy at slowdown 1 beside its accuracy at the fitted slowdown (the same curves, in the
    same order: the slowdown changes no curve's membership)."""
    fitted = out["curves_fitted"]
    extra = {f"{c}_fitted": fitted[c].to_numpy() for c in ("median_abs_error", "spearman", "predicted_best_in_set")}
    return out["curves"].assign(slowdown_fitted=fitted["slowdown"].to_numpy(), **extra)


def to_text(out: dict[str, pd.DataFrame]) -> str:
    """Each curve's accuracy, at slowdown 1 and at the fitted slowdowns."""
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
    notes = out["cells"]["prediction_note"].dropna().unique()
    return "\n".join([*lines, *(f"not predicted: {n}" for n in notes)])


CELL_COLUMNS = ["cell_id", "step_ms", "step_ms_ci_lo", "step_ms_ci_hi", "predicted_ms", "prediction_error"]
CELL_COLUMNS += ["prediction_note", "slowdown_fitted", "predicted_ms_fitted", "prediction_error_fitted"]


def cell_view(out: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """The `predicted` view: each measured DDP configuration, its step predicted at slowdown 1 and at the fitted
    slowdown, and each one's prediction_error."""
    cells, fitted = out["cells"], out["cells_fitted"]
    view = cells.assign(
        slowdown_fitted=fitted["slowdown"],
        predicted_ms_fitted=fitted["predicted_ms"],
        prediction_error_fitted=fitted["prediction_error"],
    )
    return view[[*(k for k in CONFIG_KEYS if k in view), *CELL_COLUMNS]]


def empty_view() -> pd.DataFrame:
    """The `predicted` view where no profile is stored: still queryable, no lines."""
    return pd.DataFrame(columns=[*CONFIG_KEYS, *CELL_COLUMNS])


U_CURVE_COLUMNS = {  # u_curve's column <- curves()' column (slowdown 1; `_fitted`: at the fitted slowdown)
    "predicted_best_bucket_cap_mb": "predicted_best_mb",
    "predicted_best_in_set": "predicted_best_in_set",
    "prediction_median_abs_error": "median_abs_error",
    "prediction_spearman": "spearman",
}


def with_accuracy(u_curve: pd.DataFrame, out: dict[str, pd.DataFrame] | None) -> pd.DataFrame:
    """The u_curve view with each curve's prediction figures (null where nothing was predicted)."""
    u_curve = u_curve.copy()
    keys = config_text(u_curve, CURVE_KEYS) if len(u_curve) else []
    for name, suffix in (("curves", ""), ("curves_fitted", "_fitted")):
        got = pd.DataFrame(columns=[*CURVE_KEYS, *CURVE_COLUMNS]) if out is None else out[name]
        by = dict(zip(config_text(got, CURVE_KEYS), got.to_dict("records"), strict=True)) if len(got) else {}
        for column, source in U_CURVE_COLUMNS.items():
            u_curve[column + suffix] = [by[k][source] if k in by else None for k in keys]
        if suffix:
            u_curve["prediction_slowdown_fitted"] = [by[k]["slowdown"] if k in by else None for k in keys]
    return u_curve
