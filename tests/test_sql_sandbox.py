"""The SQL sandbox as a hostile user tries it: nothing is written anywhere, nothing of the server leaks."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from results.errors import QueryError
from results.sql.query import query
from service.api import ServiceSettings, create_app

ESCAPES = [
    # the reported escape: EXPLAIN ANALYZE executes COPY into DuckDB's spill directory (<cwd>/.tmp)
    "SELECT count(*) FROM (SELECT DISTINCT range::VARCHAR||'x' FROM range(150000000)); "
    "EXPLAIN ANALYZE COPY (SELECT 'pwned' AS a) TO '.tmp/x.csv'; SELECT * FROM read_csv('.tmp/x.csv')",
    "EXPLAIN ANALYZE COPY (SELECT 'pwned' AS a) TO '.tmp/x.csv'",
    "EXPLAIN ANALYZE CREATE OR REPLACE VIEW cells AS SELECT 1 AS pwned",
    "EXPLAIN COPY (SELECT 1) TO 'x.csv'",
    "EXPLAIN SELECT 1",
    "COPY (SELECT 'pwned') TO 'x.csv'",
    "COPY (SELECT 'pwned') TO '{store}/cluster=x/sweep=y/pwned.parquet' (FORMAT parquet)",
    "COPY cells TO '{store}/copy.parquet'",
    "EXPORT DATABASE '{cwd}/exported'",
    "ATTACH '{cwd}/pwned.db' AS p",
    "ATTACH ':memory:' AS p; CREATE TABLE p.t AS SELECT 1",
    "CREATE TABLE t AS SELECT 1",
    "CREATE OR REPLACE VIEW cells AS SELECT 1 AS pwned",
    "CREATE MACRO m() AS 1",
    "INSERT INTO cells SELECT * FROM cells",
    "DELETE FROM cells",
    "DROP VIEW cells",
    "SET temp_directory = '{cwd}'",
    "SET enable_external_access = true",
    "RESET lock_configuration",
    "PRAGMA memory_limit='100GB'",
    "INSTALL httpfs",
    "LOAD httpfs",
    "FORCE INSTALL httpfs FROM 'http://127.0.0.1:1'",
    "CALL pragma_version()",
    "CHECKPOINT",
    "VACUUM",
    "BEGIN TRANSACTION",
    "SELECT 1; COPY (SELECT 1) TO 'x.csv'",
    "SELECT * FROM read_csv('/etc/passwd')",
    "SELECT * FROM read_text('{store}/../outside.txt')",
    "SELECT * FROM read_parquet('{store}/**/*.parquet')",
    "SELECT * FROM glob('{cwd}/*')",
    "SELECT * FROM read_blob('/etc/hostname')",
    "SELECT * FROM 'x.csv'",
    "SELECT * FROM sniff_csv('/etc/passwd')",
    "SELECT * FROM parquet_metadata('{store}/x.parquet')",
    "WITH x AS (SELECT 1) SELECT * FROM read_csv('/etc/passwd')",
]


def tree(*roots: Path) -> dict[str, tuple[int, int]]:
    """Every file and folder under the roots, with size and mtime: any write changes it."""
    seen = {}
    for root in roots:
        for dirpath, dirnames, filenames in os.walk(root):
            for name in dirnames + filenames:
                st = os.lstat(os.path.join(dirpath, name))
                seen[os.path.join(dirpath, name)] = (st.st_size, st.st_mtime_ns)
    return seen


@pytest.fixture
def sandbox_dirs(seed_store, tmp_path, monkeypatch):
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    (Path(seed_store).parent / "outside.txt").write_text("secret outside the store\n")
    monkeypatch.chdir(cwd)
    return Path(seed_store), cwd


@pytest.mark.parametrize("attempt", ESCAPES)
def test_escape_attempt_is_refused_and_writes_nothing(sandbox_dirs, attempt):
    store, cwd = sandbox_dirs
    sql = attempt.format(store=store, cwd=cwd)
    before = tree(store, cwd)
    with pytest.raises(QueryError) as err:
        query(str(store), sql, timeout_s=10)
    assert tree(store, cwd) == before
    assert not (cwd / ".tmp").exists()
    message = str(err.value)
    assert "pwned" not in message and "root:" not in message and "secret outside" not in message
    assert str(cwd) not in message and str(store) not in message and os.path.expanduser("~") + "/" not in message
    assert len(query(str(store), "select * from cells")) == 8  # the views are intact


def test_no_setting_or_error_shows_a_server_path(sandbox_dirs):
    store, cwd = sandbox_dirs
    settings = query(str(store), "select name, value from duckdb_settings()")
    home = os.path.expanduser("~")
    for value in settings["value"].map(str):
        assert str(cwd) not in value and home not in value, value
    with pytest.raises(QueryError) as err:
        query(str(store), "select * from duckdb_extensions()")
    assert home not in str(err.value) and str(cwd) not in str(err.value)


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT count(*) FROM range(1000000000000)",
        "WITH RECURSIVE r(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM r) SELECT count(*) FROM r",
        "SELECT count(*) FROM cells a, cells b, cells c, cells d, cells e, range(100000000) f",
    ],
)
def test_endless_query_stops_at_the_time_limit(sandbox_dirs, sql):
    store, _ = sandbox_dirs
    t0 = time.perf_counter()
    with pytest.raises(QueryError, match="time limit of 1 s"):
        query(str(store), sql, timeout_s=1)
    assert time.perf_counter() - t0 < 10


def test_huge_result_is_refused(sandbox_dirs):
    store, _ = sandbox_dirs
    with pytest.raises(QueryError, match="over 1000 rows"):
        query(str(store), "select * from range(5000)", max_rows=1000)
    assert len(query(str(store), "select * from range(1000)", max_rows=1000)) == 1000


def test_http_query_refuses_the_escape_and_stays_responsive(sandbox_dirs, monkeypatch):
    store, cwd = sandbox_dirs
    monkeypatch.setattr("results.sql.query.QUERY_TIMEOUT_S", 3.0)
    client = TestClient(create_app(ServiceSettings(address=None, results=str(store), token="t0k")))
    auth = {"Authorization": "Bearer t0k"}
    before = tree(store, cwd)
    r = client.post("/query", json={"sql": ESCAPES[0]}, headers=auth)
    assert r.status_code == 400 and r.json()["error"]["type"] == "QueryError"
    assert tree(store, cwd) == before and not (cwd / ".tmp").exists()
    slow = client.post("/query", json={"sql": "select count(*) from range(1000000000000)"}, headers=auth)
    assert slow.status_code == 400 and "time limit" in slow.json()["error"]["message"]
