"""`ddpsweep predict`: every cell's step from the overlap model (results.model.overlap) before anything is measured,
from a profile of the workload (trainers.profile, stored per cluster) and the calibration of each placement
(results.model.costmodel, from `ddpsweep calibrate`); after a sweep, the same predictions beside its measurements.

The profile runs when the store has none for the workload, micro-batch, device and torch version: on the
cluster with --address (or RAY_ADDRESS), as a task holding one worker's resources; otherwise in this process,
with the spec's threads per worker (sweeps.predict.profiling).
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass

import numpy as np
import pandas as pd

from results.analysis.identity import CURVE_KNOBS
from results.errors import ResultsError
from results.model import predicted
from results.model.overlap import Profile
from results.storage.store import Store, load_calibration
from sweeps.plan.grid import Cell, expand
from sweeps.predict.profiling import Device, Profiler
from sweeps.spec.sweep import SweepSpec

log = logging.getLogger(__name__)


class NoCalibration(ResultsError):
    """A placement of the spec has no calibration on the cluster: the model has no t(bytes) for it."""


def profile_key(cell: Cell, device: str, torch_version: str) -> str:
    """What a profile is of: the workload (and its planned shapes), the micro-batch, the device, torch."""
    return predicted.profile_key(asdict(cell.step), device, torch_version)


def profiles(
    cells: list[Cell], store: Store, cluster: str, profiler: Profiler, device: Device
) -> dict[str, tuple[Profile, bool]]:
    """Per profile key: the stored profile, or one run by `profiler` on `device` and stored (True: run now)."""
    out: dict[str, tuple[Profile, bool]] = {}
    for cell in cells:
        key = profile_key(cell, device.type, device.torch_version)
        if key in out:
            continue
        raw, fresh = store.read_profile(cluster, key), False
        if raw is not None and not _of_planned_model(raw, cell):
            raw = None  # the workload's code changed under the same name: measured again, the new one stored
        if raw is None:
            raw, fresh = profiler.run(cell.step), True
            store.write_profile(cluster, key, raw)
        out[key] = (Profile.from_dict(raw), fresh)
    return out


def _of_planned_model(raw: dict, cell: Cell) -> bool:
    """Whether a stored profile's parameters are the planned model's (trainers.workload.planned: their count and
    bytes, in order); one warning where they are not."""
    from trainers import workload  # torch: where cells are planned

    planned = workload.planned(cell.step)[2]
    if tuple(raw["nbytes"]) == planned:
        return True
    log.warning(
        "the stored profile of %s has %d parameters (%d bytes), the planned model %d (%d bytes): profiling it again",
        cell.step.workload or cell.step.model,
        len(raw["nbytes"]),
        sum(raw["nbytes"]),
        len(planned),
        sum(planned),
    )
    return False


def placement_costs(store: Store, cluster: str, cells: list[Cell]) -> dict[tuple, predicted.Cost]:
    """Per (world size, nodes): t(bytes) from the cluster's newest calibration; NoCalibration naming the first
    placement without one."""
    costs = predicted.newest_costs(load_calibration(store.uri, cluster))
    out = {}
    for cell in cells:
        place = (cell.world_size, cell.num_nodes)
        if cell.world_size < 2 or place in out:
            continue
        if (cluster, *place) not in costs:
            raise NoCalibration(
                f"no calibration of {cell.topology} on cluster {cluster!r} in {store.uri}: run `ddpsweep calibrate "
                "SPEC` with the same --results and --cluster first (it measures t(bytes) on those ranks)"
            )
        out[place] = costs[(cluster, *place)]
    return out


def predict_cell(cell: Cell, prof: Profile, t: predicted.Cost | None, slowdown: float = 1.0) -> dict:
    """The model's step for one cell (None with the reason where it is not modeled)."""
    out = {"cell_id": cell.cell_id, "topology": cell.topology, **cell.knob_values}
    return out | {"note": None} | predicted.predict_one(asdict(cell.step), prof, t, slowdown)


@dataclass(frozen=True)
class Inputs:
    """What predictions are made from: the spec's cells, each placement's fit and each workload's profile."""

    cells: list[Cell]
    costs: dict[tuple, predicted.Cost]
    profiles: dict[str, tuple[Profile, bool]]
    device: Device
    where: str = "here"  # where new profiles ran: here | on the cluster

    def profile(self, cell: Cell) -> Profile:
        return self.profiles[profile_key(cell, self.device.type, self.device.torch_version)][0]

    @property
    def ran(self) -> int:
        """Profiles run now (none were stored)."""
        return sum(fresh for _, fresh in self.profiles.values())


def inputs(spec: SweepSpec, store: Store, cluster: str, address: str | None = None) -> Inputs:
    """Calibration fits first (a missing one fails before any profile runs), then the profiles (on the cluster
    with an address or RAY_ADDRESS)."""
    cells = expand(spec)
    costs = placement_costs(store, cluster, cells)
    with Profiler(spec, address) as profiler:
        device = profiler.device()  # on a cluster a Ray task: asked once
        return Inputs(cells, costs, profiles(cells, store, cluster, profiler, device), device, profiler.where)


def predictions(given: Inputs, slowdown: dict[tuple, float] | None = None) -> pd.DataFrame:
    """Every cell with its predicted step and whether it is its curve's predicted best (compute x `slowdown`
    per (world size, nodes), 1 where not given)."""
    rows = []
    for c in given.cells:
        s = (slowdown or {}).get((c.world_size, c.num_nodes), 1.0)
        rows.append(
            predict_cell(c, given.profile(c), given.costs.get((c.world_size, c.num_nodes)), s) | {"slowdown": s}
        )
    return mark_best(pd.DataFrame(rows))


def mark_best(table: pd.DataFrame) -> pd.DataFrame:
    """`predicted_best`: the smallest predicted step of each curve (every knob but the bucket fixed)."""
    ddp = (table["mode"] == "ddp") & table["predicted_ms"].notna()
    curve = [c for c in CURVE_KNOBS if c in table.columns]
    table["predicted_best"] = False
    for _, grp in table[ddp].groupby(curve, dropna=False):
        table.loc[grp["predicted_ms"].astype(float).idxmin(), "predicted_best"] = True
    return table


def to_text(table: pd.DataFrame, given: Inputs) -> str:
    """One line per cell, the predicted best of each curve marked."""
    lines = [f"profiles run {given.where} ({given.device.type}): {given.ran}" if given.ran else "profiles: stored"]
    for r in table.itertuples():
        bucket = "-" if r.bucket_cap_mb is None or r.bucket_cap_mb != r.bucket_cap_mb else f"{r.bucket_cap_mb:g} MB"
        what = f"{r.mode:6} {r.topology} gas {r.gas} no_sync {str(r.no_sync).lower():5} bucket {bucket:8}"
        what += "" if r.comm_hook == "none" or r.mode != "ddp" else f" hook {r.comm_hook}"
        if r.predicted_ms is None or (isinstance(r.predicted_ms, float) and np.isnan(r.predicted_ms)):
            lines.append(f"{what} not predicted: {r.note}")
            continue
        best = "  <- predicted best of its curve" if r.predicted_best else ""
        lines.append(
            f"{what} {r.predicted_ms:8.2f} ms (communication {r.comm_ms:.2f}, exposed {r.exposed_ms:.2f}){best}"
        )
    return "\n".join(lines)
