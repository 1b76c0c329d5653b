"""SQL memory bombs, deadlines and result sizes (hardening round 3): the process that runs a query is bounded,
not only DuckDB's buffer manager; the server stays up and answers the next request."""

from __future__ import annotations

import resource
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from results.sql import isolation
from service.api import ServiceSettings, create_app

ROOT = Path(__file__).resolve().parent.parent
AUTH = {"Authorization": "Bearer t"}
BOMBS = [
    "SELECT len(range(400000000))",  # 3.2 GB list: took a server to 15.6 GB before
    "SELECT length(repeat('x', 2000000000))",  # a 2 GB string
    "SELECT list_sum(range(300000000)) FROM range(4)",
]


def cli_query(sql: str, *args: str) -> subprocess.CompletedProcess:
    """`ddpsweep query SQL ARGS…` in a process of its own (its memory cap and deadline are its own)."""
    return subprocess.run(
        [sys.executable, "-m", "service.cli", "query", sql, *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )


@pytest.fixture
def client(seed_store, monkeypatch):
    monkeypatch.setattr("results.sql.query.QUERY_TIMEOUT_S", 20.0)
    return TestClient(create_app(ServiceSettings(address=None, results=seed_store, token="t")))


@pytest.mark.parametrize("sql", BOMBS)
def test_memory_bombs_over_http_are_refused_and_the_server_answers_next(client, sql):
    started = time.monotonic()
    bomb = client.post("/query", json={"sql": sql}, headers=AUTH)
    assert bomb.status_code == 400, bomb.text[:300]
    assert "memory" in bomb.json()["error"]["message"].lower()
    assert time.monotonic() - started < 20
    after = client.post("/query", json={"sql": "select count(*) as n from cells"}, headers=AUTH)
    assert after.status_code == 200 and after.json() == [{"n": 8}], after.text[:300]


def test_a_result_over_the_byte_bound_is_refused(client, monkeypatch):
    monkeypatch.setattr(isolation, "MAX_RESULT_BYTES", 1_000_000)  # handed to the child with each query
    big = client.post("/query", json={"sql": "select repeat('x', 100000) as s from range(50)"}, headers=AUTH)
    assert big.status_code == 400 and "MiB" in big.json()["error"]["message"], big.text[:300]


def test_analysis_views_run_inside_the_deadline(client, monkeypatch):
    """The views (bootstraps) are computed in the child: a deadline shorter than they take is a time-limit
    error, not a query that runs on."""
    monkeypatch.setattr("results.sql.query.QUERY_TIMEOUT_S", 0.01)
    monkeypatch.setattr(isolation, "GRACE_S", 0.0)
    late = client.post("/query", json={"sql": "select count(*) from u_curve"}, headers=AUTH)
    assert late.status_code == 400 and "time limit" in late.json()["error"]["message"], late.text[:300]


def test_server_and_cli_give_one_answer(client, seed_store):
    sql = "select COLUMNS('mod.|gas') from cells order by all limit 1"
    over_http = client.post("/query", json={"sql": sql, "format": "csv"}, headers=AUTH).text
    cli = cli_query(sql, "--results", seed_store, "--format", "csv")
    assert cli.returncode == 0 and cli.stdout.strip() == over_http.strip()
    assert over_http.splitlines()[0] == "model,mode,gas,compile_mode"  # a regex: compile_mode matches too


def test_a_memory_bomb_in_the_cli_is_one_line_with_bounded_memory(seed_store):
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    run = cli_query(BOMBS[0], "--results", seed_store)
    assert run.returncode == 2 and "memory" in run.stderr.lower() and "Traceback" not in run.stderr, run.stderr
    peak_kb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    assert max(before, peak_kb) < 3 * 2**20  # KiB: under 3 GiB, where it reached 7.3 GB before


def test_csv_headers_from_sql_aliases_are_neutralized(seed_store):
    from results.sql.formats import to_csv
    from results.sql.query import query

    csv = to_csv(query(seed_store, 'select 1 as "=HYPERLINK(1)", 2 as ok'))
    assert csv.splitlines()[0] == "'=HYPERLINK(1),ok"


def test_a_rebinding_host_is_refused_on_loopback(seed_store):
    app = create_app(ServiceSettings(address=None, results=seed_store, token="t", allowed_hosts=("127.0.0.1",)))
    ok = TestClient(app, base_url="http://127.0.0.1").get("/ui/sweeps.json")
    evil = TestClient(app, base_url="http://attacker.example").get("/ui/sweeps.json")
    assert ok.status_code == 200 and evil.status_code == 400


def test_report_labels_with_mathtext_are_plain_text(seed_store):
    """Stored text drawn on a figure is plain text: mathtext in a label made every report a 500."""
    from results.render.report import render_html
    from results.storage.store import load

    rows = load(seed_store)
    rows["cluster"] = "m$\\frac{x$"
    rows["spec_name"] = "m$\\frac{x$"
    html = render_html(rows, "report $\\frac{x$")
    assert html.count("<img") + html.count("<svg") >= 1


@pytest.mark.parametrize(
    ("sql", "says"),
    [
        ("select union_value(k := 1) u", "UNION"),
        ("select INTERVAL 1 DAY i", "INTERVAL"),
        ("select '101'::BIT b", "BIT"),
        ("select 1::VARINT v", "CAST(v AS VARCHAR)"),
        ("select '\\xff'::BLOB b", "BLOB"),
        ("select 1 as a, 2 as a", "appears twice"),
        ("select 340282366920938463463374607431768211455::UHUGEINT u", "UHUGEINT"),
        ("select '99999-01-01'::DATE d", "column 'd'"),
    ],
)
def test_types_a_result_cannot_carry_are_one_line_naming_the_column(client, sql, says):
    answer = client.post("/query", json={"sql": sql}, headers=AUTH)
    assert answer.status_code == 400 and says in answer.json()["error"]["message"], answer.text[:300]


def test_structs_export_to_csv_with_their_values_and_deep_json_is_a_422(client):
    csv = client.post("/query", json={"sql": "select {'a': 1, 'b': [1, 2]} s", "format": "csv"}, headers=AUTH)
    assert csv.status_code == 200 and '""b"": [1, 2]' in csv.text
    deep = client.post("/query", content=b"[" * 100_000 + b"]" * 100_000, headers=AUTH)
    assert deep.status_code in (413, 422), deep.text[:200]


def test_the_cli_query_gives_its_memory_cap_back(seed_store):
    """In-process (as a test runner or a notebook calls it) the cap lasts for the query only: a browser the
    same process starts later hung under it."""
    from typer.testing import CliRunner

    from service.cli import app

    before = resource.getrlimit(resource.RLIMIT_DATA)
    assert CliRunner().invoke(app, ["query", "select 1 as one", "--results", seed_store]).exit_code == 0
    assert resource.getrlimit(resource.RLIMIT_DATA) == before


# The first rows come at once, then one every 5e8 values of a huge scan: the deadline lands mid-stream.
TRICKLE = "select range as r from range(100000000000) where range < 30000 or range % 500000000 = 0"


def test_the_deadline_mid_stream_is_the_time_limit_error_in_the_cli(seed_store):
    run = cli_query(TRICKLE, "--results", seed_store, "--timeout", "3")
    assert run.returncode == 2, run.stderr[-2000:]
    assert run.stderr.strip() == "error: query exceeded the time limit of 3 s", run.stderr[-2000:]


def test_the_deadline_mid_stream_is_a_400_and_the_server_answers_next(client, monkeypatch):
    monkeypatch.setattr("results.sql.query.QUERY_TIMEOUT_S", 3.0)
    late = client.post("/query", json={"sql": TRICKLE}, headers=AUTH)
    assert late.status_code == 400, late.text[:300]
    assert late.json()["error"]["message"] == "query exceeded the time limit of 3 s"
    after = client.post("/query", json={"sql": "select count(*) as n from cells"}, headers=AUTH)
    assert after.status_code == 200 and after.json() == [{"n": 8}]


def test_a_view_that_does_not_exist_is_named_with_the_views_there_are(client, seed_store):
    """DuckDB suggested a system catalog ('Did you mean "pg_enum"?') for the name a user guessed."""
    from results.sql.views import VIEWS

    answer = client.post("/query", json={"sql": "select * from measurements"}, headers=AUTH)
    said = f"no view named 'measurements'; the views: {', '.join(VIEWS)}"
    assert answer.status_code == 400 and answer.json()["error"]["message"] == said, answer.text[:300]
    cli = cli_query("select c.cell_id from cells c join runs r using (cell_id)", "--results", seed_store)
    assert cli.returncode == 2 and cli.stderr.strip() == f"error: no view named 'runs'; the views: {', '.join(VIEWS)}"
