"""Writes that never lose rows (hardening round 3): concurrent compactions, the compare-before-rename wall,
the lease itself, a vanishing file, temporary files after a failed write."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path

import pyarrow.fs as pafs
import pytest

from results.errors import StoreFull
from results.storage import compaction, lease
from results.storage.store import Store, valid_label
from tests.seed_rows import seed_rows

ROOT = Path(__file__).resolve().parent.parent


def multiset(store: Store) -> Counter:
    """(cluster, sweep, cell, repeat, step_ms) of every row, as a multiset."""
    t = store.read_table().to_pylist()
    return Counter((r["cluster"], r["sweep_id"], r["cell_id"], r["repeat"], r["step_ms"]) for r in t)


@pytest.fixture(scope="module")
def busy_template(tmp_path_factory) -> Path:
    """3 sweeps x 8 cells x 25 repeats = 600 row files (step times differ per repeat), written once."""
    root = tmp_path_factory.mktemp("busy") / "store"
    store = Store.open(str(root))
    for sweep in ("s1", "s2", "s3"):
        for repeat in range(25):
            for r in seed_rows(sweep=sweep, repeat=repeat):
                store.write_row(r | {"step_ms": r["step_ms"] + repeat / 8})
    return root


@pytest.fixture
def busy_store(busy_template, tmp_path) -> Store:
    """A test's own copy of the 600-file store."""
    shutil.copytree(busy_template, tmp_path / "store")
    return Store.open(str(tmp_path / "store"))


def test_concurrent_compact_commands_keep_every_row(busy_store, tmp_path):
    before = multiset(busy_store)
    assert sum(before.values()) == 600
    cmd = [sys.executable, "-m", "service.cli", "compact", "--results", busy_store.uri]
    logs = [open(tmp_path / f"compact-{i}.log", "w+") for i in range(4)]  # noqa: SIM115 — closed below
    procs = [subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT) for log in logs]
    codes = [p.wait(timeout=180) for p in procs]
    for log in logs:
        log.close()
    assert codes == [0, 0, 0, 0], [(tmp_path / f"compact-{i}.log").read_text()[-2000:] for i in range(4)]
    assert multiset(busy_store) == before
    compaction.compact(busy_store)  # whatever a skipped run left is finished now
    assert busy_store.files() == [f"{busy_store.root}/cluster=pcie-8x/compacted.parquet"]
    assert multiset(busy_store) == before


def test_compactions_racing_in_threads_and_a_sweeps_end_keep_every_row(busy_store):
    before = multiset(busy_store)
    errors: list[BaseException] = []

    def work(fn, *args):
        try:
            fn(*args)
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    jobs = [(compaction.compact, busy_store)] * 3 + [(compaction.compact_sweep, busy_store, "pcie-8x", "s2")] * 3
    threads = [threading.Thread(target=work, args=job) for job in jobs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert multiset(busy_store) == before


def test_a_compaction_that_runs_between_anothers_listing_and_reading_loses_nothing(busy_store, monkeypatch):
    """The interleaving the red-team pass hit (2 of 4 tries on 990 files), made deterministic: compaction B
    lists the sweep, compaction A then runs to the end (writes, deletes the row files), then B reads."""
    before = multiset(busy_store)
    real_listing = Store.listing
    inner: list[compaction.Compaction] = []

    def listing_then_another_compaction(self, *args, **kwargs):
        found = real_listing(self, *args, **kwargs)
        if not inner:
            inner.append(compaction.compact_sweep(busy_store, "pcie-8x", "s1"))
        return found

    monkeypatch.setattr(Store, "listing", listing_then_another_compaction)
    outer = compaction.compact_sweep(busy_store, "pcie-8x", "s1")
    monkeypatch.setattr(Store, "listing", real_listing)
    assert multiset(busy_store) == before
    assert [c.skipped is None for c in (inner[0], outer)] == [False, True]  # one ran, the other stood aside


def test_a_second_compaction_is_skipped_while_the_first_holds_the_lease(busy_store):
    folder = busy_store.sweep_dir("pcie-8x", "s1")
    with lease.lease(busy_store.fs, folder, compaction.SWEEP_LEASE, purpose="compaction", what="s1"):
        done = compaction.compact_sweep(busy_store, "pcie-8x", "s1")
    assert done.files_removed == 0 and f"pid {os.getpid()}" in done.skipped
    assert compaction.compact_sweep(busy_store, "pcie-8x", "s1").files_removed == 200


def test_without_the_lease_a_replaced_output_is_never_overwritten(busy_store, monkeypatch):
    """The second wall: a compaction whose target changed after it read never renames over it."""
    compaction.compact_sweep(busy_store, "pcie-8x", "s1")
    before = multiset(busy_store)
    for r in seed_rows(sweep="s1", repeat=99):
        busy_store.write_row(r)  # new row files: the next compaction has work to do
    monkeypatch.setattr(compaction, "lease", lambda *a, **k: contextlib.nullcontext({}))
    real_write = busy_store.write_atomic

    def write_then_someone_else_replaces(folder, name, write, before_rename=None):
        path = f"{folder}/{name}"
        os.utime(path, ns=(1, 1))  # another compaction replaced the target meanwhile
        return real_write(folder, name, write, before_rename)

    monkeypatch.setattr(Store, "write_atomic", lambda self, *a, **k: write_then_someone_else_replaces(*a, **k))
    done = compaction.compact_sweep(busy_store, "pcie-8x", "s1")
    assert "replaced while this compaction ran" in done.skipped
    assert sum(multiset(busy_store).values()) == sum(before.values()) + 8
    assert not [p for p in os.listdir(busy_store.sweep_dir("pcie-8x", "s1")) if p.endswith(".tmp")]


def test_a_file_that_vanished_after_the_listing_aborts_the_compaction(busy_store, monkeypatch):
    listing = busy_store.listing("pcie-8x", "s1", packs=False)
    os.remove(listing[0].path)  # deleted by another compaction after our listing
    monkeypatch.setattr(Store, "listing", lambda self, *a, **k: listing)
    monkeypatch.setattr(compaction, "lease", lambda *a, **k: contextlib.nullcontext({}))
    done = compaction.compact_sweep(busy_store, "pcie-8x", "s1")
    assert "vanished" in done.skipped and not os.path.exists(
        f"{busy_store.sweep_dir('pcie-8x', 's1')}/compacted.parquet"
    )


def test_object_store_leases_refuse_a_second_holder_and_expire(tmp_path, monkeypatch):
    """The lease protocol for filesystems without flock, on a SubTreeFileSystem (not local, same semantics)."""
    monkeypatch.setattr(lease, "SETTLE_S", 0.01)
    fs = pafs.SubTreeFileSystem(str(tmp_path), pafs.LocalFileSystem())
    with lease.lease(fs, "a", "_l", purpose="one", what="folder a", ttl_s=30) as held:
        second = lease.lease(fs, "a", "_l", purpose="two", what="folder a")
        with pytest.raises(lease.LeaseHeld, match="folder a is held by pid"):
            second.__enter__()
        assert held["purpose"] == "one"
    assert fs.get_file_info("a/_l").type == pafs.FileType.NotFound  # released
    with lease.lease(fs, "a", "_l", purpose="dies", what="a", ttl_s=0.05):
        pass
    lease._write_object(fs, "a/_l", {"token": "x", "pid": 1}, ttl_s=-1)  # a holder that died: expired
    with lease.lease(fs, "a", "_l", purpose="three", what="a") as held:
        assert held["purpose"] == "three"


def test_labels_match_whole_strings_only():
    assert valid_label("abc") and not valid_label("abc\n") and not valid_label("a/b") and not valid_label("a..b")


def test_a_listing_skips_a_file_removed_between_scan_and_stat(busy_store, monkeypatch):
    real_scandir = os.scandir

    class Vanishing:
        def __init__(self, entry):
            self._e = entry
            self.path, self.name = entry.path, entry.name

        def is_symlink(self):
            return self._e.is_symlink()

        def is_dir(self, **kw):
            return self._e.is_dir(**kw)

        def is_file(self, **kw):
            return self._e.is_file(**kw)

        def stat(self, **kw):
            if self.name.endswith("-r0.parquet"):
                raise FileNotFoundError(self.path)
            return self._e.stat(**kw)

    monkeypatch.setattr(os, "scandir", lambda p: [Vanishing(e) for e in real_scandir(p)])
    assert len(busy_store.files()) == 600 - 3 * 8


def test_a_failed_write_leaves_no_temporary_file(tmp_path):
    store = Store.open(str(tmp_path))

    def full_disk(out):
        out.write(b"x")
        raise OSError(28, "No space left on device")

    with pytest.raises(StoreFull, match="no space left on its device"):
        store.write_atomic(str(tmp_path / "f"), "a.parquet", full_disk)
    assert os.listdir(tmp_path / "f") == []
