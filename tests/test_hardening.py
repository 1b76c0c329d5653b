"""Hostile and careless input: no silent overwrite, no secrets echoed, no impossible numbers, safe CSV."""

from __future__ import annotations

import logging

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from results.sql.formats import to_csv
from results.sql.query import query
from results.storage.store import Store, load
from service.cli import app
from sweeps.plan.planner import plan_sweep
from sweeps.spec.files import load_spec, parse_spec
from sweeps.spec.sweep import SpecError
from tests.seed_rows import seed_rows


def test_an_existing_sweep_id_is_refused_without_resume(tmp_path):
    spec = parse_spec("name: s\nbucket_cap_mb: [25]")
    Store.open(str(tmp_path)).write_manifest("local", "taken", {"cells": []})
    with pytest.raises(SpecError) as err:
        plan_sweep(spec, results=str(tmp_path), sweep_id="taken")
    assert err.value.field == "--sweep" and "--resume taken" in str(err.value)
    assert plan_sweep(spec, results=str(tmp_path), sweep_id="fresh").sweep_id == "fresh"


def test_a_spec_from_the_environment_is_never_echoed(monkeypatch):
    monkeypatch.setenv("DDPS_X", "password: hunter2")
    with pytest.raises(SpecError) as err:
        load_spec("env:DDPS_X")
    assert "hunter2" not in str(err.value) and err.value.field == "password"
    result = CliRunner().invoke(app, ["run", "env:DDPS_X", "--dry-run"])
    assert result.exit_code == 2 and "hunter2" not in result.output


def test_compare_of_a_cluster_with_itself_is_a_clear_error(seed_store):
    result = CliRunner().invoke(
        app, ["compare", "--cluster", "pcie-8x", "--cluster", "pcie-8x", "--results", seed_store]
    )
    assert result.exit_code == 2 and "two different labels" in result.output


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


@pytest.mark.parametrize("text", ['=HYPERLINK("http://x")', "+1+1", "-2+3", "@SUM(A1)", "\t=1"])
def test_csv_exports_neutralize_spreadsheet_formulas(seed_store, text):
    store = Store.open(seed_store)
    store.write_row(seed_rows()[0] | {"cell_id": "err", "status": "error", "error": text, "step_ms": None})
    csv_text = to_csv(query(seed_store, "select cell_id, error from cells where cell_id = 'err'"))
    line = csv_text.splitlines()[1]
    assert ",'" in line or ",\"'" in line  # the cell starts with an apostrophe: text, not a formula


def test_a_closed_stdout_silences_progress_but_never_stops_the_sweep():
    import io

    from service.progress import SweepProgress
    from sweeps.driver.summary import progress_line

    calls = []

    class Closed(io.StringIO):
        def write(self, text):
            calls.append(text)
            raise BrokenPipeError(32, "Broken pipe")

    progress = SweepProgress(3, progress_line, stream=Closed())
    row = seed_rows()[1] | {"round": 0}
    with progress:
        for _ in range(3):
            progress(row)  # must not raise: the sweep's callback goes on writing rows
    assert len(calls) == 1 and not progress.live  # tried once, then stayed quiet; not a TTY: plain lines


def test_progress_on_a_terminal_counts_errors_and_prints_every_line():
    import io

    from service.progress import LogProgress, SweepProgress
    from sweeps.driver.summary import progress_line

    out = io.StringIO()
    ok, bad = seed_rows()[1] | {"round": 0}, seed_rows()[2] | {"round": 0, "status": "error", "error": "boom"}
    with SweepProgress(3, progress_line, stream=out, live=True) as progress:
        for row in (ok, bad, ok):
            progress(row)
    text = out.getvalue()
    assert "3/3" in text and "errors 1" in text and "ERROR boom" in text and text.count(ok["cell_id"]) >= 2
    plain = io.StringIO()
    with SweepProgress(2, progress_line, stream=plain) as progress:  # not a TTY: exactly one line per row
        progress(ok)
        progress(bad)
    assert plain.getvalue().splitlines()[0].startswith("[1/2] ") and len(plain.getvalue().splitlines()) == 2
    followed = io.StringIO()
    with LogProgress(stream=followed, live=True) as log:
        log.feed(progress_line(ok, 1, 4) + "\n" + progress_line(bad, 2, 4) + "\n")
    assert "2/4" in followed.getvalue() and "errors 1" in followed.getvalue()


def test_errors_quote_at_most_a_short_prefix_of_a_value():
    with pytest.raises(SpecError) as err:
        parse_spec("name: big\ngas: " + "x" * 100_000)  # the whole value is what is wrong
    assert len(str(err.value)) < 400 and "truncated" in str(err.value)


@pytest.mark.parametrize(
    ("text", "field", "says"),
    [
        ("name: a\ntimed_steps: 1:30\n", "timed_steps", "'1:30'"),  # YAML 1.1 would read 90
        ("name: a\ngas: [1]\ngas: [2]\n", "gas", "given twice"),  # the last one no longer wins silently
        (
            "name: a\n"
            + "x0: &a0 [1, 1, 1, 1, 1, 1, 1, 1, 1]\n"
            + "".join(f"x{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]\n" for i in range(1, 9)),
            "x",
            "too large",
        ),
        ("name: a\nenv: " + "[" * 900 + "]" * 900 + "\n", "spec", "nested too deeply"),
    ],
)
def test_yaml_traps_are_clear_errors(text, field, says):
    with pytest.raises(SpecError) as err:
        parse_spec(text)
    assert err.value.field.startswith(field) and says in str(err.value)


def test_yaml_numbers_are_yaml_1_2():
    spec = parse_spec("name: a\nbucket_cap_mb: [1e-3, 25]\ncollective_timeout_s: 1.5e2")
    assert spec.bucket_cap_mb == [0.001, 25] and spec.collective_timeout_s == 150.0


def test_a_dry_run_checks_the_grid_against_this_machine(tmp_path):
    spec = tmp_path / "big.yaml"
    spec.write_text("name: big\nworkers: [64]\nuse_gpu: false\n")
    result = CliRunner().invoke(app, ["run", str(spec), "--dry-run", "--results", str(tmp_path / "s")])
    assert result.exit_code == 2 and "error: workers:" in result.output and "unschedulable" in result.output


@pytest.mark.parametrize("results", ["/etc/passwd", "foo://bar"])
def test_a_results_root_that_is_not_a_store_is_one_clear_line(results):
    out = CliRunner().invoke(app, ["query", "select 1", "--results", results])
    assert out.exit_code == 2 and out.output.startswith("error: --results") and "Traceback" not in out.output


def test_report_out_paths_that_cannot_be_written_are_clear_errors(seed_store, tmp_path):
    runner = CliRunner()
    for args in (
        ["--out", "/nonexistent/r.html"],
        ["--out", str(tmp_path)],
        ["--format", "png", "--out", str(tmp_path / "r.txt")],
    ):
        (tmp_path / "r.txt").write_text("a file where a folder should be")
        out = runner.invoke(app, ["report", "--results", seed_store, *args])
        assert out.exit_code == 2 and out.output.startswith("error: --out: cannot write"), out.output


def test_http_spec_bodies_use_the_strict_loader(tmp_path):
    from fastapi.testclient import TestClient

    from service.api import ServiceSettings, create_app

    client = TestClient(create_app(ServiceSettings(address=None, results=str(tmp_path), token="t0k")))
    bomb = "name: a\nx0: &a0 [1, 1, 1, 1, 1, 1, 1, 1, 1]\n" + "".join(
        f"x{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]\n" for i in range(1, 9)
    )
    for body, says in ((bomb, "too large"), ("name: a\nname: b\n", "given twice")):
        r = client.post("/sweeps", content=body, headers={"Authorization": "Bearer t0k"})
        assert r.status_code == 422 and says in r.json()["error"]["message"] and len(r.content) < 2000
