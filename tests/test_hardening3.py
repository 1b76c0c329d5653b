"""Hardening round 3: odd arguments are one line and a non-zero exit, never a traceback or a silent 0."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from results.storage.store import Store
from service.cli import app
from tests.seed_rows import seed_rows


def store_of(tmp_path, rows) -> str:
    store = Store.open(str(tmp_path))
    for r in rows:
        store.write_row(r)
    return str(tmp_path)


def invoke(*args: str):
    return CliRunner().invoke(app, list(args))


def test_report_of_ddp_rows_without_a_baseline_renders(tmp_path):
    root = store_of(tmp_path, [r for r in seed_rows() if r["mode"] == "ddp"])  # idxmax over all-NA before
    out = invoke("report", "--results", root, "--out", str(tmp_path / "r.html"))
    assert out.exit_code == 0, out.output
    assert "Recommendation" in (tmp_path / "r.html").read_text()


def test_report_png_of_an_all_error_store_is_an_error_not_a_silent_zero(tmp_path):
    rows = [r | {"status": "error", "error": "boom", "step_ms": None} for r in seed_rows()]
    out = invoke("report", "--results", store_of(tmp_path / "s", rows), "--out", str(tmp_path / "p"), "--format", "png")
    assert out.exit_code == 2 and "ok rows" in out.output


def test_scaling_with_an_unknown_format_is_refused_naming_the_formats(seed_store):
    out = invoke("scaling", "--results", seed_store, "--format", "xml")
    assert out.exit_code == 2 and "Traceback" not in out.output
    assert "'xml' is not one of 'table', 'csv', 'json'" in out.output  # a closed set: --help lists it too


def test_compare_with_an_unknown_sweep_names_the_sweeps_there_are(tmp_path):
    rows = seed_rows() + [r | {"cluster": "other"} for r in seed_rows()]
    out = invoke(
        "compare",
        "--cluster",
        "pcie-8x",
        "--cluster",
        "other",
        "--results",
        store_of(tmp_path, rows),
        "--sweep",
        "nosuch",
    )
    assert out.exit_code == 2 and "--sweep" in out.output and "seed" in out.output


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


def test_strict_spread_on_one_node_is_refused_by_the_preflight(tmp_path):
    """It passed the dry run before, then burned 2 x cell_timeout_s and blamed the timeout."""
    spec = tmp_path / "s.yaml"
    spec.write_text("name: s\ntopology: [1x2]\nplacement: STRICT_SPREAD\n")
    out = invoke("run", str(spec), "--dry-run", "--results", str(tmp_path / "r"))
    assert out.exit_code == 2 and "STRICT_SPREAD puts every worker on its own node" in out.output
    assert invoke("run", str(spec).replace("s.yaml", "p.yaml"), "--dry-run").exit_code == 2  # no such file


def test_strict_pack_across_nodes_is_refused():
    from sweeps.plan.grid import expand
    from sweeps.plan.preflight import placement_problem
    from sweeps.spec.files import parse_spec

    cell = next(c for c in expand(parse_spec("name: s\ntopology: [2x1]\n")) if c.num_nodes == 2)
    assert "STRICT_PACK" in placement_problem(cell, "STRICT_PACK", 2)
    assert placement_problem(cell, "auto", 2) is None


def test_a_gpu_specs_dry_run_on_a_laptop_prints_the_grid_then_the_verdict():
    out = invoke("run", "sweeps/specs/seed.yaml", "--dry-run")
    assert out.exit_code == 2
    grid_at, verdict_at = out.output.index("78 measurements"), out.output.index("embedded Ray cannot run it")
    assert grid_at < verdict_at and "--address HEAD:6379" in out.output


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ("name: a\nworkers: [1, 2\n", "line 3, column 1: expected ',' or ']'"),
        ('name: "a\n', "line 2, column 1: found unexpected end of stream"),
        ("name: a\n  b: c\n", "line 2, column 4: mapping values are not allowed here"),
        ("name: a\n\tgas: 1\n", "line 2, column 1: found character '\\t'"),
    ],
)
def test_a_yaml_syntax_error_is_one_line_with_its_line_and_column(tmp_path, text, where):
    spec = tmp_path / "broken.yaml"
    spec.write_text(text)
    result = invoke("run", str(spec), "--dry-run")
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {spec}: got 'unparseable YAML'"), result.output
    assert where in lines[0]


def big_sweep(root, rows: int) -> str:
    """One compacted sweep of `rows` rows (the seed rows, repeated) written straight as Parquet."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from results.storage.schema import row_table

    base = pa.concat_tables([row_table(r) for r in seed_rows()])
    table = pa.concat_tables([base] * (rows // base.num_rows + 1)).slice(0, rows).combine_chunks()
    for name, value in (("cluster", "big"), ("sweep_id", "huge")):
        table = table.set_column(table.schema.get_field_index(name), name, pa.array([value] * rows))
    table = table.set_column(table.schema.get_field_index("repeat"), "repeat", pa.array(range(rows), pa.int64()))
    status = pa.array(["error" if i % 4 == 0 else "ok" for i in range(rows)])
    table = table.set_column(table.schema.get_field_index("status"), "status", status)
    folder = root / "cluster=big" / "sweep=huge"
    folder.mkdir(parents=True)
    pq.write_table(table, folder / "compacted.parquet")
    return str(root)


def test_a_sweep_too_big_for_a_page_is_a_413_and_the_index_counts_it(tmp_path):
    from fastapi.testclient import TestClient

    from service.api import ServiceSettings, create_app

    client = TestClient(create_app(ServiceSettings(address=None, results=big_sweep(tmp_path, 30_000), token="t")))
    index = client.get("/ui/sweeps.json")
    assert index.status_code == 200
    assert [(s["sweep_id"], s["written"], s["errors"]) for s in index.json()] == [("huge", 30_000, 7_500)]
    for path in ("/ui/sweep/big/huge", "/report?sweep=huge", "/recommend?cluster=big"):
        page = client.get(path)
        assert page.status_code == 413, (path, page.text[:300])
        message = page.json()["error"]["message"]
        assert "holds 30000 rows, more than a page analyses (20000" in message and "ddpsweep query" in message
    counted = client.post("/query", json={"sql": "select count(*) n from cells"}, headers={"Authorization": "Bearer t"})
    assert counted.json() == [{"n": 30_000}]  # SQL aggregates it


def test_a_store_over_the_servers_row_budget_is_refused_before_it_is_read(tmp_path):
    from fastapi.testclient import TestClient

    from results.errors import TooLarge
    from results.storage.cache import CachedStore
    from service.api import ServiceSettings, create_app

    root = big_sweep(tmp_path, 3_000)
    cache = CachedStore(root, max_rows=2_000)
    with pytest.raises(TooLarge, match="about 3000 rows, more than this server keeps in memory"):
        cache.table()
    assert cache._rows.snapshot.num_rows == 0  # nothing was read
    client = TestClient(create_app(ServiceSettings(address=None, results=root, token="t", max_rows=2_000)))
    refused = client.get("/cells")
    assert refused.status_code == 413 and "--max-rows 2000" in refused.json()["error"]["message"]
