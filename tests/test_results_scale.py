"""Compaction keeps every row exactly once (also when killed halfway, also for resumed sweeps),
the parallel reader keeps the per-file guarantees, the server's cache refreshes incrementally, and the
query limits answer clearly through the CLI and HTTP."""

from __future__ import annotations

import logging
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from results.storage import compaction, reader
from results.storage.cache import CachedStore
from results.storage.compaction import COMPACTED
from results.storage.store import Store
from service.api import ServiceSettings, create_app
from tests.seed_rows import seed_rows

ROOT = Path(__file__).resolve().parent.parent


def rows_of(store: Store, sweep: str | None = None) -> list[tuple]:
    """The store's rows as a sorted multiset of (cluster, sweep, cell, repeat, step_ms, status)."""
    t = store.read_table(sweep=sweep).to_pylist()
    return sorted((r["cluster"], r["sweep_id"], r["cell_id"], r["repeat"], r["step_ms"], r["status"]) for r in t)


@pytest.fixture
def two_sweeps(tmp_path) -> Store:
    store = Store.open(str(tmp_path / "store"))
    for sweep in ("s1", "s2"):
        for r in seed_rows(sweep=sweep):
            store.write_row(r)
    return store


def test_compaction_preserves_every_row_per_sweep(two_sweeps):
    before = {s: rows_of(two_sweeps, s) for s in ("s1", "s2")}
    n_files = len(two_sweeps.files())
    done = [compaction.compact_sweep(two_sweeps, "pcie-8x", s) for s in ("s1", "s2")]
    assert sorted((c.sweep_id, c.rows, c.files_removed) for c in done) == [
        ("s1", len(before["s1"]), n_files // 2),
        ("s2", len(before["s2"]), n_files // 2),
    ]
    assert [Path(p).name for p in two_sweeps.files()] == [COMPACTED, COMPACTED]
    assert {s: rows_of(two_sweeps, s) for s in ("s1", "s2")} == before


def test_a_cluster_pack_holds_every_sweep_once(two_sweeps):
    before = {s: rows_of(two_sweeps, s) for s in ("s1", "s2")}
    done = compaction.compact(two_sweeps)  # both sweeps, then the cluster's pack
    pack = done[-1]
    assert (pack.sweep_id, pack.rows, pack.files_read, pack.files_removed) == ("*", 16, 2, 2)
    assert two_sweeps.files() == [f"{two_sweeps.root}/cluster=pcie-8x/{COMPACTED}"]
    assert {s: rows_of(two_sweeps, s) for s in ("s1", "s2")} == before  # a sweep read out of the pack
    assert two_sweeps.labels() == {"pcie-8x": ["s1", "s2"]}
    assert [c.files_removed for c in compaction.compact(two_sweeps)] == [0, 0, 0]  # idempotent
    for r in seed_rows(sweep="s3"):
        two_sweeps.write_row(r)
    s3 = rows_of(two_sweeps, "s3")
    compaction.compact(two_sweeps)  # a later sweep joins the pack
    assert len(two_sweeps.files()) == 1 and rows_of(two_sweeps, "s3") == s3 and len(s3) == 8
    assert {s: rows_of(two_sweeps, s) for s in ("s1", "s2")} == before and len(rows_of(two_sweeps)) == 24


def test_a_pack_killed_before_its_deletions_duplicates_nothing(two_sweeps, monkeypatch):
    before = rows_of(two_sweeps)
    for s in ("s1", "s2"):
        compaction.compact_sweep(two_sweeps, "pcie-8x", s)
    monkeypatch.setattr(compaction, "_remove_if_unchanged", lambda fs, stat: False)  # killed after the write
    compaction.compact_cluster(two_sweeps, "pcie-8x")
    assert len(two_sweeps.files()) == 3 and rows_of(two_sweeps) == before  # pack + both sweep files, rows once
    monkeypatch.undo()
    compaction.compact_cluster(two_sweeps, "pcie-8x")
    assert len(two_sweeps.files()) == 1 and rows_of(two_sweeps) == before


def test_the_bulk_scan_reads_what_the_file_by_file_reader_reads(two_sweeps, monkeypatch, caplog):
    paths = two_sweeps.files()
    assert len(paths) >= reader.SCAN_MIN_FILES
    scanned = reader.combine(reader.read_files(two_sweeps.fs, paths))
    assert reader.scan_local(paths, reader.SCHEMA) is not None  # these files take the bulk path
    monkeypatch.setattr(reader, "SCAN_MIN_FILES", 10**9)
    assert reader.combine(reader.read_files(two_sweeps.fs, paths)).equals(scanned)
    monkeypatch.undo()
    alien = Path(paths[0]).parent / "alien-r0.parquet"
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"sweep_id": ["s1"], "x": [1.0]}), alien)  # a Parquet file, not a row file
    assert reader.scan_local([*paths, str(alien)], reader.SCHEMA) is None  # the careful reader takes over
    with caplog.at_level(logging.WARNING):
        assert reader.combine(reader.read_files(two_sweeps.fs, two_sweeps.files())).equals(scanned)
    assert "alien-r0.parquet" in caplog.text


@pytest.mark.parametrize("deleted_before_kill", [0, 3])
def test_a_compaction_killed_between_its_steps_loses_and_duplicates_nothing(
    two_sweeps, monkeypatch, deleted_before_kill
):
    before = rows_of(two_sweeps)
    real_remove, deleted = compaction._remove_if_unchanged, []

    class Killed(BaseException):
        pass

    def remove_then_die(fs, stat):
        if len(deleted) == deleted_before_kill:
            raise Killed  # the process dies here: compacted file in place, some row files left
        deleted.append(stat.path)
        return real_remove(fs, stat)

    monkeypatch.setattr(compaction, "_remove_if_unchanged", remove_then_die)
    with pytest.raises(Killed):
        compaction.compact_sweep(two_sweeps, "pcie-8x", "s1")
    monkeypatch.setattr(compaction, "_remove_if_unchanged", real_remove)
    names = [Path(p).name for p in two_sweeps.files(sweep="s1")]
    assert COMPACTED in names and len(names) > 1
    assert rows_of(two_sweeps) == before  # every row once: the compacted copy and the leftover files agree
    compaction.compact_sweep(two_sweeps, "pcie-8x", "s1")  # a later compaction finishes the job
    assert len(two_sweeps.files(sweep="s1")) == 1 and rows_of(two_sweeps) == before


def test_a_row_measured_again_after_compaction_replaces_the_compacted_one(two_sweeps):
    compaction.compact(two_sweeps)
    old = two_sweeps.read_table(sweep="s1").to_pylist()[0]
    newer = old | {"status": "ok", "step_ms": 123.0, "finished_at": old["finished_at"] + timedelta(hours=1)}
    two_sweeps.write_row(newer)  # a resumed sweep re-measures (cell, repeat)
    got = [
        r
        for r in two_sweeps.read_table(sweep="s1").to_pylist()
        if (r["cell_id"], r["repeat"]) == (old["cell_id"], old["repeat"])
    ]
    assert [r["step_ms"] for r in got] == [123.0]
    compaction.compact_sweep(two_sweeps, "pcie-8x", "s1")
    assert 123.0 in [r["step_ms"] for r in two_sweeps.read_table(sweep="s1").to_pylist()]


def test_resume_after_compaction_measures_only_the_missing_pairs(tmp_path):
    from sweeps.plan.planner import plan_sweep
    from sweeps.spec.files import parse_spec

    spec = parse_spec("name: r\nbucket_cap_mb: [1, 5]\nrepeats: 2\nuse_gpu: false\n")
    first = plan_sweep(spec, results=str(tmp_path), sweep_id="r-1")
    first.store.write_manifest(first.cluster, first.sweep_id, {"cells": [c.cell_id for c in first.cells]})
    written = first.todo[:3]
    base = seed_rows()[0]
    for cell, repeat in written:
        first.store.write_row(
            base
            | {
                "cluster": first.cluster,
                "sweep_id": "r-1",
                "cell_id": cell.cell_id,
                "repeat": repeat,
                "finished_at": datetime.now(UTC),
            }
        )
    compaction.compact(first.store)
    assert [Path(p).name for p in first.store.files()] == [COMPACTED]
    resumed = plan_sweep(spec, results=str(tmp_path), resume="r-1")
    assert sorted((c.cell_id, r) for c, r in resumed.todo) == sorted(
        (c.cell_id, r) for c, r in first.todo if (c, r) not in written
    )


def test_the_parallel_reader_skips_bad_files_with_warnings(two_sweeps, caplog):
    folder = Path(two_sweeps.files()[0]).parent
    (folder / "corrupt-r0.parquet").write_bytes(b"PAR1 not really")
    good = len(rows_of(two_sweeps))
    with caplog.at_level(logging.WARNING):
        assert len(rows_of(two_sweeps)) == good
    assert "corrupt-r0.parquet" in caplog.text
    compaction.compact(two_sweeps)
    assert (folder / "corrupt-r0.parquet").exists()  # unreadable files are never compacted away


def test_the_cache_reads_only_new_files_and_follows_compaction(two_sweeps, monkeypatch):
    cache = CachedStore(two_sweeps.uri, refresh_s=0)
    assert cache.table().num_rows == len(rows_of(two_sweeps))
    reads = []
    real = reader.read_file
    monkeypatch.setattr(reader, "read_file", lambda fs, p, *a: reads.append(p) or real(fs, p, *a))
    row = seed_rows(sweep="s1")[0] | {"cell_id": "new-cell"}
    two_sweeps.write_row(row)
    refreshed = cache.table().num_rows
    assert [Path(p).name for p in reads] == ["new-cell-r0.parquet"]  # the one new file, nothing else
    assert refreshed == len(rows_of(two_sweeps))
    compaction.compact(two_sweeps)
    assert sorted(map(tuple, cache.rows(sweep="s1")[["cell_id", "repeat"]].values.tolist())) == sorted(
        (c, r) for _, _, c, r, _, _ in rows_of(two_sweeps, "s1")
    )


def test_query_limits_are_clear_errors_through_the_cli(seed_store):
    big = subprocess.run(
        [sys.executable, "-m", "service.cli", "query", "select * from range(200000)", "--results", seed_store],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert big.returncode == 2 and "rows" in big.stderr and "Traceback" not in big.stderr
    slow = subprocess.run(
        [
            sys.executable,
            "-m",
            "service.cli",
            "query",
            "select count(*) from range(1000000000000)",
            "--results",
            seed_store,
            "--timeout",
            "2",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert slow.returncode == 2 and "time limit" in slow.stderr


def test_query_limits_are_clear_errors_over_http(seed_store, monkeypatch):
    monkeypatch.setattr("results.sql.query.QUERY_TIMEOUT_S", 2.0)
    client = TestClient(create_app(ServiceSettings(address=None, results=seed_store, token="t")))
    auth = {"Authorization": "Bearer t"}
    big = client.post("/query", json={"sql": "select * from range(200000)"}, headers=auth)
    slow = client.post(
        "/query", json={"sql": "select count(*) from cells a, cells b, range(100000000000)"}, headers=auth
    )
    assert big.status_code == 400 and "rows" in big.json()["error"]["message"]
    assert slow.status_code == 400 and "time limit" in slow.json()["error"]["message"]


def test_the_compact_command_says_what_it_did(two_sweeps):
    def compact(*args: str) -> subprocess.CompletedProcess:
        cmd = [sys.executable, "-m", "service.cli", "compact", "--results", two_sweeps.uri, *args]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=ROOT)

    one = compact("--sweep", "s1")
    assert one.returncode == 0 and one.stdout.splitlines() == [
        "cluster=pcie-8x sweep=s1: 8 file(s) -> 1, 8 rows, 8 file(s) removed",
        "1 compacted, 0 already compact",
    ]
    rest = compact()
    assert rest.returncode == 0 and rest.stdout.splitlines() == [
        "cluster=pcie-8x sweep=s2: 8 file(s) -> 1, 8 rows, 8 file(s) removed",
        "cluster=pcie-8x pack: 2 file(s) -> 1, 16 rows, 2 file(s) removed",
        "2 compacted, 1 already compact",
    ]
    bad = compact("--cluster", "../x")
    assert bad.returncode == 2 and "--cluster" in bad.stderr and two_sweeps.files()


def test_without_duckdb_the_reader_reads_file_by_file(two_sweeps, monkeypatch):
    paths = two_sweeps.files()
    scanned = reader.combine(reader.read_files(two_sweeps.fs, paths))
    monkeypatch.setitem(sys.modules, "duckdb", None)  # `import duckdb` now raises ImportError (the GPU image)
    assert reader.scan_local(paths, reader.SCHEMA) is None
    assert reader.combine(reader.read_files(two_sweeps.fs, paths)).equals(scanned)
