"""What the CLI prints and writes: progress, tables, CSV, reports, comparisons, and their errors."""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from results.sql.formats import to_csv
from results.sql.query import query
from results.storage.store import Store
from service.api import ServiceSettings, create_app
from service.cli import app
from tests.seed_rows import seed_rows


def test_compare_of_a_cluster_with_itself_is_a_clear_error(seed_store):
    result = CliRunner().invoke(
        app, ["compare", "--cluster", "pcie-8x", "--cluster", "pcie-8x", "--results", seed_store]
    )
    assert result.exit_code == 2 and "two different labels" in result.output


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


def client(**settings) -> TestClient:
    defaults = {"address": "http://127.0.0.1:9", "results": "/nonexistent/r", "token": "t"}
    return TestClient(create_app(ServiceSettings(**(defaults | settings))))


def post(c: TestClient, text: str):
    return c.post("/sweeps", content=text, headers={"Authorization": "Bearer t"})


def test_text_output_escapes_control_characters_from_stored_rows(tmp_path):
    store = Store.open(str(tmp_path))
    osc52 = "\x1b]52;c;ZXZpbA==\x07"
    for r in seed_rows():
        store.write_row(r | {"env": json.dumps({"NCCL_ALGO": f"Ring{osc52}; touch pwned"})})
    store.write_row(seed_rows()[1] | {"cell_id": "bad", "status": "error", "error": f"boom{osc52}\x1b[2J"})
    runner = CliRunner()
    rec = runner.invoke(app, ["recommend", "--results", str(tmp_path)])
    query = runner.invoke(app, ["query", "select error from cells where status = 'error'", "--results", str(tmp_path)])
    for out in (rec.output, query.output):
        assert "\x1b" not in out and "\x07" not in out
    assert "\\x1b]52" in rec.output and "\\x1b[2J" in query.output
    assert "export NCCL_ALGO='Ring" in rec.output  # quoted: `; touch pwned` stays inside the value


def test_comparing_a_label_with_itself_and_submitting_without_a_cluster_are_clear(tmp_path):
    store = Store.open(str(tmp_path))
    for r in seed_rows():
        store.write_row(r)
    c = client(results=str(tmp_path))
    same = c.get("/ui/compare", params={"a": "pcie-8x", "b": "pcie-8x"})
    assert same.status_code == 422 and same.json()["error"]["field"] == "b"
    r = post(client(address=None), "name: x\n")
    assert (
        r.status_code == 503
        and "--dashboard" in r.json()["error"]["message"]
        and "serve" in r.json()["error"]["message"]
    )


def test_the_scaling_table_shows_each_figure_with_its_interval_as_the_report_does(tmp_path):
    """`--format table` is for people: 'median [lo, hi]' with short numbers and a dash where nothing is known (the
    first topology has no previous one); csv keeps every bound in a column of its own."""
    import re

    from tests.test_recommend import noisy

    root = store_of(tmp_path, noisy(seed_rows(), cv=0.01, repeats=3))
    table = invoke("scaling", "--results", root)
    assert table.exit_code == 0, table.output
    head, *lines = table.output.strip().splitlines()
    assert head.split()[:7] == ["cluster", "gas", "no_sync", "bucket_cap_mb", "topology", "world_size", "step_ms"]
    assert "_ci_" not in head and "nan" not in table.output.lower() and len(lines) == 7
    interval = r"\d+\.\d \[\d+\.\d, \d+\.\d\]"  # step_ms, tokens/s: one decimal
    assert all(re.search(rf"1x8\s+8\s+{interval}\s+{interval}\s+0\.\d+ \[0\.\d+, 0\.\d+\]\s+–", x) for x in lines)
    data = invoke("scaling", "--results", root, "--format", "csv")
    columns = data.output.splitlines()[0].split(",")
    assert {"step_ms", "step_ms_ci_lo", "step_ms_ci_hi", "efficiency_ci_lo", "tokens_per_s_ci_hi"} <= set(columns)
    assert float(data.output.splitlines()[1].split(",")[columns.index("step_ms_ci_lo")]) > 0
