"""Files a results store holds beside its rows (profiles, calibrations) are data someone else may have written:
one that is not valid is skipped with a warning naming it, and never breaks a page, a query or a prediction."""

from __future__ import annotations

import json
import logging
import math

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from fastapi.testclient import TestClient

from results.model.overlap import Profile
from results.storage.store import Store
from service.api import ServiceSettings, create_app
from tests.seed_rows import seed_rows
from tests.test_predict import calibrate

GOOD = {
    "forward_ms": 3.0,
    "backward_ms": 6.0,
    "optimizer_ms": 1.0,
    "ready_ms": [2.0, 5.0],
    "nbytes": [4096, 1024],
    "order": [1, 0],
}
BAD = {
    "one parameter of zero bytes": GOOD | {"ready_ms": [1.0], "nbytes": [0], "order": [0]},
    "negated bytes": GOOD | {"nbytes": [-4096, 1024]},
    "a negative time": GOOD | {"backward_ms": -999999.0},
    "NaN": GOOD | {"forward_ms": math.nan},
    "an infinite time": GOOD | {"ready_ms": [2.0, math.inf]},
    "a short list": GOOD | {"ready_ms": [2.0]},
    "a missing field": {k: v for k, v in GOOD.items() if k != "backward_ms"},
    "a string for a time": GOOD | {"optimizer_ms": "fast"},
    "an order that is no permutation": GOOD | {"order": [0, 0]},
    "a list, not an object": [1, 2, 3],
}


@pytest.mark.parametrize("why", BAD)
def test_a_profile_that_is_not_valid_is_refused_naming_the_field(why):
    with pytest.raises(ValueError, match=r"\w"):
        Profile.from_dict(json.loads(json.dumps(BAD[why])))
    assert Profile.from_dict(GOOD).gradient_bytes == 5120


def _profile_file(root, name: str, text: str | None) -> str:
    folder = root / "cluster=pcie-8x"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"_profile-{name}.parquet"
    if text is None:
        path.write_text("not parquet")
    else:
        pq.write_table(pa.Table.from_pylist([{"key": name, "profile": text}]), path)
    return str(path)


@pytest.mark.parametrize("why", [*BAD, "not parquet", "not JSON"])
def test_a_stored_profile_that_is_not_valid_is_skipped_with_a_warning_naming_the_file(tmp_path, caplog, why):
    text = {"not parquet": None, "not JSON": "{nope"}.get(why, json.dumps(BAD.get(why)))
    path = _profile_file(tmp_path, "deadbeef", text)
    _profile_file(tmp_path, "good", json.dumps(GOOD))
    store = Store.open(str(tmp_path))
    with caplog.at_level(logging.WARNING):
        assert store.read_profiles().column("key").to_pylist() == ["good"]
        assert store.read_profile("pcie-8x", "deadbeef") is None  # measured again by `ddpsweep predict`
    assert path in caplog.text


def test_one_bad_profile_file_breaks_no_page_query_or_report(tmp_path):
    store = Store.open(str(tmp_path))
    for r in seed_rows():
        store.write_row(r)
    _profile_file(tmp_path, "deadbeef", None)
    _profile_file(tmp_path, "cafef00d", json.dumps({"forward_ms": 1.0}))  # valid Parquet, bad JSON
    c = TestClient(create_app(ServiceSettings(address=None, results=str(tmp_path), token="t")))
    answer = c.post("/query", json={"sql": "select count(*) as n from cells"}, headers={"Authorization": "Bearer t"})
    assert answer.status_code == 200 and answer.json() == [{"n": 8}]
    sweep = seed_rows()[0]["sweep_id"]
    for url in ("/report", "/report?cluster=pcie-8x", f"/ui/sweep/pcie-8x/{sweep}", "/recommend"):
        assert c.get(url).status_code == 200, url


@pytest.mark.parametrize(
    ("why", "change"),
    [
        ("time_ms", lambda r: r | {"time_ms": 0.0}),
        ("time_ms", lambda r: r | {"time_ms": math.nan}),
        ("time_ms", lambda r: r | {"time_ms": -r["time_ms"]}),
        ("size_bytes", lambda r: r | {"size_bytes": 0}),
        ("one all-reduce size", lambda r: r | {"size_bytes": 1024}),
    ],
)
def test_a_calibration_that_cannot_give_a_fit_is_skipped_with_a_warning_naming_the_file(tmp_path, caplog, why, change):
    root = str(tmp_path)
    calibrate(root, sweep="good")
    calibrate(root, sweep="bad")
    store = Store.open(root)
    [bad] = [f for f in tmp_path.rglob("_calibration-*.parquet") if "sweep=bad" in str(f)]
    rows = [change(r) for r in pq.read_table(bad).to_pylist()]
    pq.write_table(pa.Table.from_pylist(rows, schema=pq.read_schema(bad)), bad)
    with caplog.at_level(logging.WARNING):
        table = store.read_calibration("lab")
    assert set(table.column("sweep_id").to_pylist()) == {"good"}
    assert str(bad) in caplog.text and why.split()[0] in caplog.text


def test_a_profile_of_another_model_is_not_used_beside_the_rows(tmp_path):
    import pandas as pd

    from results.model import predicted

    knobs = dict.fromkeys(predicted.PROFILE_FIELDS)
    cell = pd.Series(knobs | {"cluster": "lab", "world_size": 2, "num_nodes": 1, "grad_bytes": 999_999})
    cell = cell.reindex([*cell.index, "device_type", "torch_version"]).fillna({"device_type": "cpu"})
    profiles = {("lab", predicted.profile_key(cell, "cpu", cell["torch_version"])): Profile.from_dict(GOOD)}
    prof, _, why = predicted._inputs(cell, profiles, {("lab", 2, 1): lambda b: 1.0})
    assert prof is None and "another model (5120 bytes of gradients, the rows' 999999)" in why


def test_a_stored_profile_of_another_model_is_measured_again(tmp_path, caplog):
    from sweeps.plan.grid import expand
    from sweeps.predict import steps as predict
    from sweeps.predict.profiling import Device
    from sweeps.spec.files import parse_spec

    spec = parse_spec("name: p\ncluster: lab\nworkers: [2]\nmicro_batch: 2\nseq_len: 16\nbucket_cap_mb: [25]\n")
    cells = expand(spec)
    store, device = Store.open(str(tmp_path)), Device("cpu", "x")
    key = predict.profile_key(cells[0], device.type, device.torch_version)
    store.write_profile("lab", key, GOOD)  # two parameters: not the planned GPT

    class Profiler:
        ran = 0

        def run(self, step):
            Profiler.ran += 1
            return GOOD | {"nbytes": list(planned), "ready_ms": [1.0] * n, "order": list(range(n))}

    from trainers import workload

    planned = workload.planned(cells[0].step)[2]
    n = len(planned)
    with caplog.at_level(logging.WARNING):
        got = predict.profiles(cells, store, "lab", Profiler(), device)
    assert Profiler.ran == 1 and got[key][1] is True and got[key][0].nbytes == planned
    assert "profiling it again" in caplog.text
    assert tuple(store.read_profile("lab", key)["nbytes"]) == planned  # the new one replaced it
