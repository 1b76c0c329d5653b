"""`ddpsweep predict`: the overlap model over a spec's cells from a stored calibration and a profile run here
(then stored), before anything is measured; a missing calibration is an error that names the fix."""

from __future__ import annotations

import json
from datetime import UTC, datetime

from typer.testing import CliRunner

from results.store import Store
from service.cli import app

SPEC = """name: p
cluster: lab
workers: [2]
micro_batch: 4
seq_len: 32
bucket_cap_mb: [0.05, 0.25, 25]
gas: [1, 2]
no_sync: [false, true]
comm_hook: [none, powersgd]
"""


def calibrate(root: str, alpha_ms: float = 0.5, gbps: float = 0.1) -> None:
    """A 1x2 calibration of t(m) = alpha + m / beta on cluster `lab` (what `ddpsweep calibrate` writes)."""
    rows = []
    for size in (2**k for k in range(10, 24, 2)):
        ms = alpha_ms + size / (gbps * 1e9) * 1e3
        rows.append(
            {"sweep_id": "cal-1", "cluster": "lab", "group_id": "g", "world_size": 2, "num_nodes": 1}
            | {"workers_per_node": 2, "backend": "gloo", "measured_at": datetime.now(UTC), "kind": "all_reduce"}
            | {"size_bytes": size, "time_ms": ms, "times_ms": [ms], "iters": 5}
        )
    Store.open(root).write_calibration(rows)


def test_predict_gives_every_cell_a_step_and_marks_each_curves_best(tmp_path):
    root = str(tmp_path / "r")
    spec = tmp_path / "p.yaml"
    spec.write_text(SPEC)
    calibrate(root)
    first = CliRunner().invoke(app, ["predict", str(spec), "--results", root, "--format", "json"])
    assert first.exit_code == 0, first.output
    cells = json.loads(first.output)
    ddp = [c for c in cells if c["mode"] == "ddp" and c["comm_hook"] == "none"]
    assert len(ddp) == 3 * 3  # three buckets on each of three curves (gas 1; gas 2 with and without no_sync)
    assert all(c["predicted_ms"] > 0 and c["comm_ms"] > 0 for c in ddp)
    for key in {(c["gas"], c["no_sync"]) for c in ddp}:
        curve = [c for c in ddp if (c["gas"], c["no_sync"]) == key]
        best = min(curve, key=lambda c: c["predicted_ms"])
        assert [c["predicted_best"] for c in curve] == [c is best for c in curve]
    single = {c["gas"]: c["predicted_ms"] for c in cells if c["mode"] == "single"}
    assert single[2] > single[1] > 0  # compute only
    by = {(c["gas"], c["no_sync"], c["bucket_cap_mb"]): c["predicted_ms"] for c in ddp}
    assert by[(2, True, 25.0)] < by[(2, False, 25.0)]  # no_sync sends once per step, not per micro-step
    powersgd = [c for c in cells if c["comm_hook"] == "powersgd"]
    assert powersgd and all(c["predicted_ms"] is None and "PowerSGD" in c["note"] for c in powersgd)
    again = CliRunner().invoke(app, ["predict", str(spec), "--results", root])
    assert again.exit_code == 0 and again.output.startswith("profiles: stored")  # the profile was kept
    assert again.output.count("<- predicted best of its curve") == 3


def test_predict_without_a_calibration_names_the_command_that_makes_one(tmp_path):
    spec = tmp_path / "p.yaml"
    spec.write_text(SPEC)
    out = CliRunner().invoke(app, ["predict", str(spec), "--results", str(tmp_path / "empty")])
    assert out.exit_code == 2
    assert "no calibration of 1x2 on cluster 'lab'" in out.output and "ddpsweep calibrate SPEC" in out.output


def test_predicted_beside_measured_gives_each_curve_its_accuracy_and_fits_one_slowdown(tmp_path):
    """Measured steps made from the model itself at compute x1.5: at slowdown 1 every prediction is low by a
    known amount, the rank order is right and the best is in the measured set; the fitted slowdown is 1.5 and
    leaves no error."""
    from dataclasses import asdict

    import pytest

    from results.schema import COLUMNS
    from results.store import load
    from sweeps import predict, predicted
    from sweeps.specfile import parse_spec
    from tests.test_identity import base

    root = str(tmp_path / "r")
    calibrate(root)
    spec = parse_spec(SPEC.replace("comm_hook: [none, powersgd]\n", ""))
    given = predict.inputs(spec, Store.open(root), "lab")
    truth = predict.predictions(given, {(2, 1): 1.5}).set_index("cell_id")["predicted_ms"]
    rows = []
    for cell in given.cells:
        if cell.step.mode != "ddp":
            continue
        for rep in range(3):
            knobs = asdict(cell.step) | {"world_size": 2, "num_nodes": 1, "backend": "gloo", "env_grid": "{}"}
            rows.append(base("lab", rep, float(truth[cell.cell_id])) | knobs | {"cell_id": cell.cell_id})
    store, columns = Store.open(root), set(COLUMNS)
    for r in rows:  # through the store and back, as a sweep's rows come (a column of nulls reads as it does there)
        store.write_row({k: v for k, v in r.items() if k in columns} | {"sweep_id": "m-1", "cluster": "lab"})
    out = predicted.compare(given, load(root, cluster="lab", sweep="m-1"))
    assert len(out["curves"]) == 3 and len(out["cells"]) == 9
    assert (out["cells"]["prediction_error"] < -0.05).all()  # compute as profiled alone: too fast
    assert out["curves"]["spearman"].min() > 0.4
    fitted = out["curves_fitted"]
    assert fitted["slowdown"].tolist() == [pytest.approx(1.5, rel=0.02)] * 3
    assert fitted["median_abs_error"].max() < 0.02 and fitted["predicted_best_in_set"].all()
    assert "slowdown fitted per placement:" in predicted.to_text(out)
