"""Stored rows that are odd, stores that are missing or unreachable: read around, or one clear error; nothing
written is lost."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from results.errors import LabelError, ResultsError, StoreNotFound
from results.storage.store import Store, load
from service.api import ServiceSettings, create_app
from service.cli import app
from sweeps.driver import runner
from sweeps.plan.planner import plan_sweep
from sweeps.spec.files import parse_spec
from sweeps.spec.sweep import SpecError
from tests.seed_rows import seed_rows


def test_an_existing_sweep_id_is_refused_without_resume(tmp_path):
    spec = parse_spec("name: s\nbucket_cap_mb: [25]")
    Store.open(str(tmp_path)).write_manifest("local", "taken", {"cells": []})
    with pytest.raises(SpecError) as err:
        plan_sweep(spec, results=str(tmp_path), sweep_id="taken")
    assert err.value.field == "--sweep" and "--resume taken" in str(err.value)
    assert plan_sweep(spec, results=str(tmp_path), sweep_id="fresh").sweep_id == "fresh"


def test_an_alien_parquet_file_is_skipped_with_a_warning(seed_store, caplog):
    pq.write_table(pa.table({"a": [1, 2], "b": ["x", "y"]}), f"{seed_store}/cluster=pcie-8x/sweep=seed/alien.parquet")
    with caplog.at_level(logging.WARNING):
        rows = load(seed_store)
    assert len(rows) == 8 and rows["cluster"].notna().all() and set(rows["status"]) == {"ok"}
    assert "alien.parquet" in caplog.text and "not a ddpsweep row file" in caplog.text


def test_an_impossible_step_time_is_refused_at_write_and_skipped_at_read(seed_store, caplog):
    bad = seed_rows()[1] | {"cell_id": "bad", "step_ms": -1e308}
    with pytest.raises(ValueError, match="not a positive finite number"):
        Store.open(seed_store).write_row(bad)
    table = pa.Table.from_pylist([bad | {"cell_id": "sneaked"}])  # written by something else
    pq.write_table(table, f"{seed_store}/cluster=pcie-8x/sweep=seed/sneaked-r0.parquet")
    with caplog.at_level(logging.WARNING):
        rows = load(seed_store)
    assert len(rows) == 8 and "impossible measurement" in caplog.text
    assert CliRunner().invoke(app, ["report", "--results", seed_store, "--out", f"{seed_store}/r.html"]).exit_code == 0


@pytest.mark.parametrize("results", ["/etc/passwd", "foo://bar"])
def test_a_results_root_that_is_not_a_store_is_one_clear_line(results):
    out = CliRunner().invoke(app, ["query", "select 1", "--results", results])
    assert out.exit_code == 2 and out.output.startswith("error: --results") and "Traceback" not in out.output


def store_of(tmp_path, rows) -> str:
    store = Store.open(str(tmp_path))
    for r in rows:
        store.write_row(r)
    return str(tmp_path)


@pytest.mark.parametrize("value", [0.0, -1.0, float("inf")])
def test_a_stored_row_with_an_impossible_bucket_does_not_break_the_sweep_page(tmp_path, value):
    import pyarrow.parquet as pq
    from fastapi.testclient import TestClient

    from results.storage.schema import row_table
    from service.api import ServiceSettings, create_app

    root = store_of(tmp_path, seed_rows())
    bad = seed_rows()[2] | {"bucket_cap_mb": value, "cell_id": "bad", "num_nodes": 0}
    pq.write_table(row_table(bad), tmp_path / "cluster=pcie-8x" / "sweep=seed" / "bad-r0.parquet")
    client = TestClient(create_app(ServiceSettings(address=None, results=root, token="t")))
    assert client.get("/ui/sweep/pcie-8x/seed").status_code == 200


def client(**settings) -> TestClient:
    defaults = {"address": "http://127.0.0.1:9", "results": "/nonexistent/r", "token": "t"}
    return TestClient(create_app(ServiceSettings(**(defaults | settings))))


def test_rows_with_impossible_numbers_are_skipped_and_json_stays_valid(tmp_path):
    from results.analysis.recommend import recommend
    from results.storage.store import load

    store = Store.open(str(tmp_path))
    for r in seed_rows():
        store.write_row(r)
    bad = seed_rows(sweep="bad")[3]
    store.write_row(bad | {"cell_id": "nan", "step_times_ms": [float("nan")] * 5})
    store.write_row(bad | {"cell_id": "huge", "step_times_ms": [1e308] * 3 + [float("inf")]})
    store.write_row(bad | {"cell_id": "gas", "gas": 2**31 - 1})
    store.write_row(bad | {"cell_id": "bucket", "bucket_cap_mb": 1e300})
    rows = load(str(tmp_path))
    assert set(rows["sweep_id"]) == {"seed"} and len(rows) == len(seed_rows())
    assert all(r["best"]["samples_per_s"] > 0 for r in recommend(rows))
    c = client(results=str(tmp_path))

    def strict(name: str) -> None:
        raise AssertionError(f"{name} in JSON")

    for path in ("/recommend", "/cells"):
        r = c.get(path)
        assert r.status_code == 200, path
        json.loads(r.text, parse_constant=strict)
    assert c.get("/report").status_code == 200


def test_planted_rows_are_left_out_of_every_answer(tmp_path):
    from results.analysis import cells as analysis
    from results.analysis.compare import compare
    from results.analysis.recommend import recommend
    from results.storage.store import load

    store = Store.open(str(tmp_path))
    for r in seed_rows():
        slowed = r["mode"] == "ddp" and r["bucket_cap_mb"] == 25.0 and r["gas"] == 1
        store.write_row(r | ({"step_ms": r["step_ms"] * 0.5, "injected_slowdown": -0.5} if slowed else {}))
    for r in seed_rows(cluster="b"):
        store.write_row(r)
    rows = load(str(tmp_path))
    assert analysis.planted(rows).sum() == 1
    assert all(
        r["best"]["bucket_cap_mb"] != 25.0 or r["gas"] != 1 for r in recommend(rows) if r["cluster"] == "pcie-8x"
    )
    out = compare(rows, "pcie-8x", "b")
    assert out[(out["bucket_cap_mb"] == 25.0) & (out["gas"] == 1)]["measured_on"].tolist() == ["b only"]
    page = client(results=str(tmp_path)).get("/ui/sweep/pcie-8x/seed").text
    assert "1 planted" in page


def test_an_unreachable_gcs_root_fails_in_seconds_naming_results(tmp_path):

    spec = tmp_path / "s.yaml"
    spec.write_text("name: x\nworkers: [2]\nresults: gs://my-bucket/ddpsweep\n")
    done = subprocess.run(
        [sys.executable, "-m", "service.cli", "run", str(spec)], capture_output=True, text=True, timeout=180
    )
    assert done.returncode == 2, done.stderr[-2000:]
    assert "results" in done.stderr and "gs://my-bucket/ddpsweep" in done.stderr


ROOT = Path(__file__).resolve().parent.parent


SMOKE = (ROOT / "sweeps/specs/smoke.yaml").read_text()


def smoke_with(field: str, line: str) -> str:
    """The smoke spec with `field` replaced by `line`."""
    kept = [x for x in SMOKE.splitlines() if not x.startswith(f"{field}:")]
    return "\n".join(kept + [line]) + "\n"


def test_symbolic_links_in_the_store_are_never_followed(seed_store, tmp_path_factory, caplog):
    store = Store.open(seed_store)
    before = store.read_table().num_rows
    other = tmp_path_factory.mktemp("other-store")
    Store.open(str(other)).write_row(store.read_table().to_pylist()[0] | {"sweep_id": "elsewhere"})
    sweep_dir = Path(store.files()[0]).parent
    (sweep_dir / "loop").symlink_to("..")  # a loop: followed, it multiplied the rows
    (Path(seed_store) / "cluster=linked").symlink_to(other / "cluster=pcie-8x")  # another store's folder
    (sweep_dir / "linked-r0.parquet").symlink_to(Store.open(str(other)).files()[0])  # a file link
    with caplog.at_level(logging.WARNING):
        assert store.read_table().num_rows == before
        assert set(store.labels()) == {"pcie-8x"}
    assert "symbolic link" in caplog.text


def test_a_row_whose_cluster_disagrees_with_its_folder_is_skipped(seed_store, caplog):
    store = Store.open(seed_store)
    row = store.read_table().to_pylist()[0]
    store.write_row(row | {"cell_id": "misfiled", "cluster": "other"})
    path = Path(store.files("other")[0])
    moved = Path(seed_store) / "cluster=pcie-8x" / f"sweep={row['sweep_id']}" / path.name
    path.rename(moved)
    with caplog.at_level(logging.WARNING):
        rows = load(seed_store, cluster="pcie-8x")
    assert "misfiled" not in set(rows["cell_id"]) and "disagree with its folders" in caplog.text


def test_resume_paths_and_corrupt_manifests_are_clear_errors(seed_store):
    spec = parse_spec(SMOKE)
    with pytest.raises(LabelError) as e:
        plan_sweep(spec, results=seed_store, resume="../../etc")
    assert e.value.field == "--resume"
    folder = Path(seed_store) / "cluster=local" / "sweep=broken"
    folder.mkdir(parents=True)
    (folder / "_sweep.json").write_text('{"cells": [')
    with pytest.raises(ResultsError, match="corrupt"):
        plan_sweep(spec, results=seed_store, resume="broken")


def test_an_unreachable_s3_root_is_one_error_in_seconds():
    start = time.monotonic()
    with pytest.raises(StoreNotFound, match="cannot list it"):
        Store.open("s3://ddpsweep-no-such-bucket?endpoint_override=127.0.0.1:9&scheme=http").files()
    assert time.monotonic() - start < 20  # pyarrow's default retries took minutes against a dead endpoint


def test_resuming_a_finished_sweep_starts_no_ray_and_compacts_what_a_stop_left(tmp_path, monkeypatch):
    import ray

    from tests.seed_rows import row

    spec = parse_spec(smoke_with("gas", "gas: [1]"))
    plan = plan_sweep(spec, results=str(tmp_path), sweep_id="done")
    plan.store.write_manifest("local", "done", {"cells": [c.cell_id for c in plan.cells]})
    for cell, rnd in plan.todo:  # every pair measured; the driver stopped before it compacted
        plan.store.write_row(row("ddp", 2, 100.0, cluster="local", sweep="done", cell_id=cell.cell_id, repeat=rnd))
    assert len(plan.store.files()) == len(plan.todo) == 12
    resumed = plan_sweep(spec, results=str(tmp_path), resume="done")
    assert resumed.todo == [] and not ray.is_initialized()
    monkeypatch.setattr(ray, "init", lambda *a, **k: pytest.fail("a sweep with nothing to measure started Ray"))
    outcome = runner.execute(resumed)
    assert outcome.rows == [] and outcome.sweep_id == "done"
    assert [Path(p).name for p in plan.store.files()] == ["compacted.parquet"] and len(load(str(tmp_path))) == 12
