"""`ddpsweep predict`: the overlap model over a spec's cells from a stored calibration and a profile run here
(then stored), before anything is measured; a missing calibration is an error that names the fix."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest
from typer.testing import CliRunner

from results.storage.store import Store
from service.cli import app
from tests.test_dashboard import drawn

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


def calibrate(
    root: str,
    alpha_ms: float = 0.5,
    gbps: float = 0.1,
    cluster: str = "lab",
    sweep: str = "cal-1",
    when=None,
    terms: bool = False,
) -> None:
    """A 1x2 calibration of t(m) = alpha + m / beta on `cluster` (what `ddpsweep calibrate` writes); with
    `terms`, the overlap terms' rows too: g = 10 / 8 = 1.25, c = (13 − 10.2) / (29 − 1) = 0.1 ms per bucket,
    κ = 12 / 10 − 1 = 0.2, λ = 12 / (12 + 20 − 26) − 1 = 1."""
    rows = [*term_rows()] if terms else []
    for size in (2**k for k in range(10, 24, 2)):
        ms = alpha_ms + size / (gbps * 1e9) * 1e3
        rows.append({"kind": "all_reduce", "size_bytes": size, "time_ms": ms, "times_ms": [ms], "iters": 5})
    common = {"sweep_id": sweep, "cluster": cluster, "group_id": "g", "world_size": 2, "num_nodes": 1}
    common |= {"workers_per_node": 2, "backend": "gloo", "measured_at": when or datetime.now(UTC)}
    Store.open(root).write_calibration([common | r for r in rows])


def term_rows() -> list[dict]:
    """trainers.terms' seven rows, 15 repeats each; one repeat per arm is off (the medians are not)."""

    def arm(kind: str, ms: float, **extra) -> dict:
        times = [ms] * 14 + [ms * 3]
        return {"kind": kind, "time_ms": ms, "times_ms": times, "iters": 15} | extra

    return [
        arm("compute_solo", 8.0, size_bytes=1 << 20),
        arm("compute_alone", 10.0, size_bytes=1 << 20),
        arm("compute_contended", 12.0, size_bytes=1 << 20),
        arm("comm_alone", 20.0, size_bytes=1 << 20),
        arm("comm_contended", 26.0, size_bytes=1 << 20),
        arm("ddp_backward", 13.0, size_bytes=1 << 20, buckets=29),
        arm("ddp_backward", 10.2, size_bytes=1 << 20, buckets=1),
    ]


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


def measured(root: str, slowdown: float = 1.5, sweep: str = "m-1") -> tuple:
    """A calibrated store with a profile, and a sweep whose steps are the model's own at compute x `slowdown`
    (3 repeats each, through the store: a column of nulls reads back as it does from a sweep); (given, truth at
    slowdown 1 by cell id)."""
    from dataclasses import asdict

    import torch

    from results.storage.schema import COLUMNS
    from sweeps.predict import steps as predict
    from sweeps.spec.files import parse_spec
    from tests.test_identity import base

    calibrate(root)
    spec = parse_spec(SPEC.replace("comm_hook: [none, powersgd]\n", ""))
    given = predict.inputs(spec, Store.open(root), "lab")
    slowed = predict.predictions(given, {(2, 1): slowdown}).set_index("cell_id")["predicted_ms"]
    store, columns = Store.open(root), set(COLUMNS)
    for cell in (c for c in given.cells if c.step.mode == "ddp"):
        knobs = asdict(cell.step) | {"world_size": 2, "num_nodes": 1, "backend": "gloo", "env_grid": "{}"}
        knobs |= {"device_type": "cpu", "torch_version": torch.__version__}  # what the profile is keyed by
        knobs |= {"grad_bytes": given.profile(cell).gradient_bytes}  # the model the profile is of
        for rep in range(3):
            r = base("lab", rep, float(slowed[cell.cell_id])) | knobs | {"cell_id": cell.cell_id}
            store.write_row({k: v for k, v in r.items() if k in columns} | {"sweep_id": sweep, "cluster": "lab"})
    return given, predict.predictions(given).set_index("cell_id")["predicted_ms"]


def test_predicted_beside_measured_gives_each_curve_its_accuracy_and_fits_one_slowdown(tmp_path):
    """Measured steps made from the model itself at compute x1.5: at slowdown 1 every prediction is low by a
    known amount, the rank order is right and the best is in the measured set; the fitted slowdown is 1.5 and
    leaves no error."""
    import pytest

    from results.model import predicted
    from results.storage.store import load, load_calibration

    root = str(tmp_path / "r")
    measured(root)
    profiles = predicted.profiles_of(Store.open(root).read_profiles().to_pandas())
    out = predicted.compare(load(root, cluster="lab", sweep="m-1"), profiles, load_calibration(root, "lab"))
    assert len(out["curves"]) == 3 and len(out["cells"]) == 9
    assert (out["cells"]["prediction_error"] < -0.05).all()  # compute as profiled alone: too fast
    assert out["curves"]["spearman"].min() > 0.4
    fitted = out["curves_fitted"]
    assert fitted["slowdown"].tolist() == [pytest.approx(1.5, rel=0.02)] * 3
    assert fitted["median_abs_error"].max() < 0.02 and fitted["predicted_best_in_set"].all()
    assert "slowdown fitted per placement:" in predicted.to_text(out)


def query(root: str, sql: str) -> list[dict]:
    out = CliRunner().invoke(app, ["query", sql, "--results", root, "--format", "json"])
    assert out.exit_code == 0, out.output
    return json.loads(out.output)


def test_the_views_the_page_and_the_report_set_predictions_beside_measurements(tmp_path):
    """After a sweep on a cluster with a stored profile: the `predicted` view (CLI and the server's child), the
    u_curve view's accuracy columns, the sweep page's dashed predicted lines and table, the report's sections."""

    import pytest
    from fastapi.testclient import TestClient

    from service.api import ServiceSettings, create_app

    root = str(tmp_path / "r")
    _, truth = measured(root)
    cells = query(root, "select cell_id, step_ms, predicted_ms, prediction_error, slowdown_fitted from predicted")
    assert len(cells) == 9
    for c in cells:
        assert c["predicted_ms"] == pytest.approx(truth[c["cell_id"]])
        assert c["prediction_error"] == pytest.approx(c["predicted_ms"] / c["step_ms"] - 1)
        assert c["slowdown_fitted"] == pytest.approx(1.5, rel=0.02)
    curves = query(root, "select * from u_curve")
    assert len(curves) == 3 and all(c["prediction_slowdown_fitted"] == pytest.approx(1.5, rel=0.02) for c in curves)
    assert all(c["predicted_best_bucket_cap_mb"] in (0.05, 0.25, 25) for c in curves)
    assert all(c["prediction_median_abs_error_fitted"] < 0.02 for c in curves)
    client = TestClient(create_app(ServiceSettings(address=None, results=root, token="t")))
    sql = "select count(*) as n from predicted where predicted_ms > 0"
    got = client.post("/query", json={"sql": sql}, headers={"Authorization": "Bearer t"}).json()
    assert got == [{"n": 9}]  # the server's query child has the profiles too
    page = client.get("/ui/sweep/lab/m-1").text
    dashed = [ys for name, ys in drawn(page, "u_curve") if name.endswith(" predicted")]
    assert len(dashed) == 3  # one predicted line per curve
    points = sorted(y for ys in dashed for y in ys)
    assert points == pytest.approx(sorted(truth[truth.index.isin([c["cell_id"] for c in cells])]), rel=1e-5)
    assert "id='prediction'" in page and "Predicted beside measured" in page
    html = tmp_path / "report.html"
    out = CliRunner().invoke(app, ["report", "--out", str(html), "--results", root])
    assert out.exit_code == 0, out.output
    assert "Predicted beside measured: each curve" in html.read_text()
    assert "Predicted beside measured" in client.get("/report", params={"cluster": "lab"}).text


def test_without_a_profile_the_prediction_columns_are_null_and_the_view_empty(tmp_path):
    root = str(tmp_path / "r")
    measured(root)
    for path in (tmp_path / "r").rglob("_profile-*.parquet"):
        path.unlink()
    assert query(root, "select * from predicted") == []
    curves = query(root, "select predicted_best_bucket_cap_mb, prediction_spearman_fitted from u_curve")
    assert len(curves) == 3 and all(v is None for c in curves for v in c.values())


def test_the_newest_calibration_is_the_one_measured_last_whatever_its_name(tmp_path):
    from datetime import timedelta

    from results.model import predicted
    from results.storage.store import load_calibration

    root = str(tmp_path)
    now = datetime.now(UTC)
    calibrate(root, alpha_ms=9.0, sweep="zz-older", when=now - timedelta(hours=1))
    calibrate(root, alpha_ms=1.0, sweep="aa-newer", when=now)
    t = predicted.newest_costs(load_calibration(root, "lab"))[("lab", 2, 1)]
    assert t(0) == pytest.approx(1.0, rel=0.05)  # alpha of aa-newer: sweep ids begin with a spec's name


def test_the_measured_overlap_terms_reach_the_prediction_and_the_alpha_beta_view(tmp_path):
    from results.model import overlap, predicted
    from results.sql.query import query
    from results.storage.store import load_calibration

    root = str(tmp_path)
    calibrate(root, terms=True)
    cost = predicted.newest_costs(load_calibration(root, "lab"))[("lab", 2, 1)]
    got = cost.terms
    assert (got.compute, got.bucket_ms, got.contention, got.comm_contention) == pytest.approx((1.25, 0.1, 0.2, 1.0))
    view = query(root, "select compute, bucket_ms, bucket_ms_ci_lo, contention, comm_contention from alpha_beta")
    assert view.iloc[0].to_dict() == pytest.approx(
        {"compute": 1.25, "bucket_ms": 0.1, "bucket_ms_ci_lo": 0.1, "contention": 0.2, "comm_contention": 1.0}
    )
    prof = overlap.Profile(
        forward_ms=5, backward_ms=8, optimizer_ms=1, ready_ms=(6.0, 4.0), nbytes=(4000, 4000), order=(1, 0)
    )
    knobs = {"mode": "ddp", "gas": 1, "no_sync": False, "comm_hook": "none", "bucket_cap_mb": 1e-6}
    with_terms = predicted.predict_one(knobs, prof, cost)["predicted_ms"]
    without = predicted.predict_one(knobs, prof, predicted.Cost(cost.t))["predicted_ms"]
    assert with_terms > 1.25 * without  # compute x 1.25, 2 x 0.1 ms on the backward, and contention beside them
    calibrate(str(tmp_path / "old"))  # a calibration from before the terms: the plain model, and nulls in the view
    assert (
        predicted.newest_costs(load_calibration(str(tmp_path / "old"), "lab"))[("lab", 2, 1)].terms == overlap.NO_TERMS
    )


def test_the_server_sees_a_profile_stored_after_it_started_without_new_rows(tmp_path):
    """`ddpsweep predict` stores a profile and writes no rows: the server's views, query children and pages pick
    it up on their next listing, not only when a sweep next writes rows."""
    import time

    from fastapi.testclient import TestClient

    from service.api import ServiceSettings, create_app

    root = str(tmp_path / "r")
    measured(root)
    stored = {path: path.read_bytes() for path in (tmp_path / "r").rglob("_profile-*.parquet")}
    assert len(stored) == 1
    for path in stored:
        path.unlink()
    client = TestClient(create_app(ServiceSettings(address=None, results=root, token="t")))
    sql = {"sql": "select count(*) as n from predicted"}
    auth = {"Authorization": "Bearer t"}
    assert client.post("/query", json=sql, headers=auth).json() == [{"n": 0}]
    assert "Predicted beside measured" not in client.get("/ui/sweep/lab/m-1").text
    for path, data in stored.items():
        path.write_bytes(data)
    time.sleep(1.2)  # the server lists the store at most once a second
    assert client.post("/query", json=sql, headers=auth).json() == [{"n": 9}]
    assert "Predicted beside measured" in client.get("/ui/sweep/lab/m-1").text
