"""Tier 1: the Parquet store (atomic files, old schemas, corrupt files), the SQL sandbox, compare, report."""

from __future__ import annotations

import logging
import os
import re

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from results.analysis.compare import compare
from results.errors import QueryError, StoreNotFound, UnknownSelection
from results.render.report import render_html, write_pngs
from results.sql.query import query
from results.storage.schema import SCHEMA
from results.storage.store import Store, load
from service.cli import app
from tests.seed_rows import row, seed_rows


def test_rows_are_hive_partitioned_files_with_the_declared_schema(seed_store):
    store = Store.open(seed_store)
    files = store.files()
    assert len(files) == 8
    assert all("/cluster=pcie-8x/sweep=seed/" in f and f.endswith("-r0.parquet") for f in files)
    assert pq.read_schema(files[0]).equals(SCHEMA, check_metadata=False)
    leftovers = [n for _, _, names in os.walk(seed_store) for n in names if n.startswith(".")]
    assert leftovers == []  # no temporary files left behind


def test_rewriting_a_pair_replaces_its_row(seed_store):
    store = Store.open(seed_store)
    store.write_row(row("single", 1, 99.0))
    rows = load(seed_store)
    assert len(rows) == 8 and rows[rows["mode"] == "single"]["step_ms"].tolist() == [99.0]


def test_older_schema_files_read_with_missing_columns_null(tmp_path):
    old = pa.table(
        {
            "sweep_id": ["old"],
            "cell_id": ["c1"],
            "repeat": [0],
            "cluster": ["legacy"],
            "status": ["ok"],
            "mode": ["ddp"],
            "world_size": [2],
            "step_ms": [10.0],
        }
    )
    folder = tmp_path / "cluster=legacy" / "sweep=old"
    folder.mkdir(parents=True)
    pq.write_table(old, folder / "c1-r0.parquet")
    rows = load(str(tmp_path))
    assert list(rows.columns) == SCHEMA.names
    assert rows.iloc[0]["step_ms"] == 10.0 and rows.iloc[0]["world_size"] == 2
    assert rows["tokens_per_s"].isna().all() and rows["nccl_version"].isna().all()


def test_a_corrupt_file_is_skipped_with_a_warning_naming_it(seed_store, caplog):
    bad = Store.open(seed_store).files()[0]
    with open(bad, "r+b") as f:
        f.truncate(100)
    with caplog.at_level(logging.WARNING):
        rows = load(seed_store)
    assert len(rows) == 7
    assert bad in caplog.text
    assert len(query(seed_store, "select * from cells")) == 7


def test_unknown_labels_list_what_exists(seed_store, tmp_path):
    with pytest.raises(UnknownSelection, match="clusters: pcie-8x"):
        load(seed_store, cluster="nvlink")
    with pytest.raises(UnknownSelection, match="sweeps: seed"):
        load(seed_store, sweep="nope")
    with pytest.raises(StoreNotFound):
        load(str(tmp_path / "missing"))
    with pytest.raises(ValueError, match="not a valid label"):
        Store.open(seed_store).write_row(row("single", 1, 1.0, cluster="../escape"))


def test_sql_views_answer_the_seed_question(seed_store):
    df = query(seed_store, "select best_bucket_cap_mb, round(best_efficiency, 2) e from u_curve where gas = 1")
    assert df.to_dict("records") == [{"best_bucket_cap_mb": 25.0, "e": 0.83}]
    n = query(seed_store, "select count(*) n from cells_vs_baseline")["n"][0]
    assert n == 7


@pytest.mark.parametrize(
    ("sql", "reason"),
    [
        ("select * from read_csv('/etc/passwd')", "disabled by configuration"),
        ("select * from read_text('/etc/passwd')", "disabled by configuration"),
        ("COPY (select 1) TO '/tmp/ddpsweep-leak.csv'", "COPY statements are not allowed"),
        ("ATTACH '/tmp/ddpsweep-leak.db'", "ATTACH statements are not allowed"),
        ("INSTALL httpfs", "not allowed"),
        ("LOAD httpfs", "not allowed"),
        ("SET enable_external_access = true", "SET statements are not allowed"),
        ("select 1; copy (select 1) to '/tmp/x'", "COPY statements are not allowed"),
        ("create table t as select 1", "CREATE statements are not allowed"),
    ],
)
def test_sql_sandbox_refuses(seed_store, sql, reason):
    with pytest.raises(QueryError, match=re.escape(reason)):
        query(seed_store, sql)


def test_sandbox_holds_even_without_the_statement_filter(seed_store):
    from results.sql.query import sandboxed, views

    con = sandboxed(views(seed_store))
    for sql in ("select * from read_csv('/etc/passwd')", "SET enable_external_access = true", "LOAD httpfs"):
        with pytest.raises(Exception, match="disabled|locked|Permission"):
            con.execute(sql)


def noisy_repeats(r: dict, rng, repeats: int = 3, steps: int = 30, cv: float = 0.01) -> list[dict]:
    """The row as `repeats` measured repeats: per-step times around its step_ms (between-run noise too)."""
    out = []
    for k in range(repeats):
        level = r["step_ms"] * (1 + rng.normal(0, cv))
        times = list(level * (1 + rng.normal(0, cv, steps)))
        out.append(r | {"repeat": k, "step_times_ms": times, "step_ms": float(np.median(times))})
    return out


def test_compare_flags_incomparable_and_calls_only_real_differences(tmp_path):
    rng = np.random.default_rng(7)
    store = Store.open(str(tmp_path))
    for r in seed_rows(cluster="a"):
        for rep in noisy_repeats(r, rng):
            store.write_row(rep)
    for r in seed_rows(cluster="b"):
        r["step_ms"] *= 1.005 if r["bucket_cap_mb"] == 1.0 else 0.8
        if r["bucket_cap_mb"] == 500.0:
            r["nccl_version"] = "2.21.5"
        for rep in noisy_repeats(r, rng):
            store.write_row(rep)
    out = compare(load(str(tmp_path)), "a", "b").set_index(["mode", "gas", "no_sync", "bucket_cap_mb"])
    fast = out.loc[("ddp", 1, False, 25.0)]
    assert fast["ratio"] == pytest.approx(0.8, rel=0.03) and fast["ratio_ci_lo"] < fast["ratio"] < fast["ratio_ci_hi"]
    assert fast["verdict"] == "faster" and bool(fast["significant"]) and fast["ratio_ci_hi"] < 1
    same = out.loc[("ddp", 1, False, 1.0)]  # 0.5% apart with ~1% noise per run
    assert same["verdict"] == "same within noise" and not bool(same["significant"])
    assert same["ratio_ci_lo"] < 1 < same["ratio_ci_hi"]
    assert not bool(out.loc[("ddp", 1, False, 500.0), "comparable"])
    assert "nccl_version 2.27.5 vs 2.21.5" in out.loc[("ddp", 1, False, 500.0), "why"]
    assert bool(fast["comparable"])


def test_a_single_number_has_no_interval_and_no_verdict(seed_store):
    out = compare(pd.concat([load(seed_store).assign(cluster="a"), load(seed_store).assign(cluster="b")]), "a", "b")
    assert set(out["verdict"]) == {"unknown (no interval)"} and not out["significant"].any()


def test_report_is_self_contained_html_and_pngs(seed_store, tmp_path):
    rows = load(seed_store)
    page = render_html(rows, "seed")
    assert page.count("data:image/png;base64,") == 3
    assert not re.search(r"(src|href)=['\"]?(https?:)?//", page)  # no remote assets
    assert "Best bucket per curve" in page and "147.1" in page
    paths = write_pngs(rows, tmp_path / "figs")
    assert sorted(p.name for p in paths) == ["efficiency.png", "no_sync.png", "u_curve.png"]
    assert all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in paths)


def test_stored_markup_in_a_report_is_text_never_markup(seed_store):
    rows = load(seed_store)
    hostile = "<img src=x onerror=alert(1)>"
    rows["cluster"] = hostile
    rows.loc[rows.index[-1], ["status", "error"]] = ["error", hostile]
    page = render_html(rows, hostile)
    assert "<img src=x" not in page  # the template escapes every value
    escaped = "&lt;img src=x onerror=alert(1)&gt;"
    assert page.count(escaped) >= 5  # title, heading, the clusters line, the tables' cluster column, the error
    assert "<h2>Errors</h2>" in page and page.count("<table") >= 3


def test_cli_query_compare_report_errors_exit_2(seed_store, tmp_path):
    runner = CliRunner()
    ok = runner.invoke(app, ["query", "select count(*) n from cells", "--results", seed_store, "--format", "json"])
    assert ok.exit_code == 0 and ok.output.strip() == '[{"n":8}]'
    bad = runner.invoke(app, ["query", "select nope from cells", "--results", seed_store])
    assert bad.exit_code == 2 and 'column "nope" not found' in bad.output
    passwd = runner.invoke(app, ["query", "select * from read_csv('/etc/passwd')", "--results", seed_store])
    assert passwd.exit_code == 2 and "root:" not in passwd.output
    missing = runner.invoke(app, ["report", "--results", str(tmp_path / "none"), "--out", str(tmp_path / "r.html")])
    assert missing.exit_code == 2 and "no results under" in missing.output
    unknown = runner.invoke(app, ["compare", "--cluster", "pcie-8x", "--cluster", "x", "--results", seed_store])
    assert unknown.exit_code == 2 and "clusters: pcie-8x" in unknown.output
    html = runner.invoke(app, ["report", "--results", seed_store, "--out", str(tmp_path / "r.html")])
    assert html.exit_code == 0 and (tmp_path / "r.html").read_text().startswith("<!doctype html>")


def test_a_report_bootstraps_each_configuration_once(seed_store, monkeypatch):
    from results.analysis import cells as analysis
    from results.analysis import uncertainty

    calls = []
    real = uncertainty.blocked_median
    monkeypatch.setattr(uncertainty, "blocked_median", lambda *a, **k: calls.append(1) or real(*a, **k))
    rows = load(seed_store)
    configurations = len(analysis.ok_cells(rows))
    calls.clear()
    page = render_html(rows, "seed")
    assert "Best bucket per curve" in page and len(calls) == configurations == 8
