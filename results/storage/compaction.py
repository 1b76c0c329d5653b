"""Compaction: a finished sweep's one-file-per-row folder becomes one Parquet file; a cluster's
compacted sweeps become one pack.

One file per (cell, repeat) is right while a sweep runs (atomic, crash-safe, resumable) and wrong forever
after: every reader pays a round trip per file. `compact_sweep` writes every row of a sweep folder into
`compacted.parquet` (sorted by cell and repeat, zstd, row-group statistics), atomically (temporary name,
then rename), and only then deletes the row files it read.

The rule that keeps readers exact at every moment (results.storage.reader): a (cluster, sweep, cell, repeat) held
by both the compacted file and a row file is read once, the row that finished last winning. So a
compaction killed after its write and before (or during) its deletions leaves duplicates on disk that no
reader sees, and a row re-measured after compaction (`--resume` of an error row) replaces the compacted
one. A row file rewritten while the compaction ran is not deleted (its size or mtime changed).

Second level (`ddpsweep compact` without --sweep): a cluster's compacted sweep files and its previous pack
become one pack `cluster=<c>/compacted.parquet` (sorted by sweep, cell, repeat), and the sweep files it
covers are deleted afterwards, under the same rule. A year of sweeps is then a file per cluster: a reader
pays a few file opens, not one per sweep.
Sweep folders keep their plans and calibration files; rows added to a packed sweep later (a resume) sit
in its folder and win over the pack's by the same latest-finished rule.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import pyarrow.fs as pafs
import pyarrow.parquet as pq

from results.errors import ResultsError
from results.storage import reader
from results.storage.lease import LeaseHeld, lease
from results.storage.store import COMPACTED, Store, valid_label

log = logging.getLogger(__name__)
ROW_GROUP_ROWS = 65_536  # a sweep rarely has more rows: one row group, statistics per column


@dataclass(frozen=True)
class Compaction:
    """What one sweep's compaction did."""

    cluster: str
    sweep_id: str  # "*" for a cluster's pack
    rows: int  # rows in the compacted file
    files_read: int  # row files (and the previous compacted file) read
    files_removed: int  # row files deleted after the compacted file was in place
    skipped: str | None = field(default=None)  # why nothing was done (another compaction holds the folder)


class ConcurrentChange(ResultsError):
    """A file this compaction read (or the one it would replace) changed under it: another writer is at work.
    Nothing was written or deleted."""

    http_status = 409


SWEEP_LEASE = "_compact.lock"  # in the sweep's folder
PACK_LEASE = "_pack.lock"  # in the cluster's folder


def compact_sweep(store: Store, cluster: str, sweep_id: str) -> Compaction:
    """Compact one sweep folder (a no-op when it holds no row files beside its compacted file), holding the
    folder's lease; skipped (never an error) while another process compacts it."""
    folder = store.sweep_dir(cluster, sweep_id)
    try:
        with lease(store.fs, folder, SWEEP_LEASE, purpose="compaction", what=f"sweep {sweep_id}'s compaction"):
            listing = store.listing(cluster, sweep_id, packs=False)
            row_files = [f for f in listing if not f.path.endswith(f"/{COMPACTED}")]
            if not row_files:
                return Compaction(cluster, sweep_id, rows=0, files_read=0, files_removed=0)
            rows, removed = _merge(store, folder, listing, row_files, ["cell_id", "repeat"])
    except (LeaseHeld, ConcurrentChange) as e:
        return Compaction(cluster, sweep_id, rows=0, files_read=0, files_removed=0, skipped=str(e))
    return Compaction(cluster, sweep_id, rows=rows, files_read=len(listing), files_removed=removed)


def compact_cluster(store: Store, cluster: str) -> Compaction:
    """Pack a cluster's compacted sweep files (and its previous pack) into one file in the cluster's folder
    (a no-op when there is at most the pack), holding the cluster's pack lease. Row files are left to
    compact_sweep."""
    folder = f"{store.root}/cluster={cluster}"
    try:
        with lease(store.fs, folder, PACK_LEASE, purpose="packing", what=f"cluster {cluster}'s pack"):
            inputs = [f for f in store.listing(cluster) if f.path.endswith(f"/{COMPACTED}")]  # sweeps + old pack
            sweeps = [f for f in inputs if "/sweep=" in f.path]
            if not sweeps:
                return Compaction(cluster, "*", rows=0, files_read=0, files_removed=0)
            rows, removed = _merge(store, folder, inputs, sweeps, ["sweep_id", "cell_id", "repeat"])
    except (LeaseHeld, ConcurrentChange) as e:
        return Compaction(cluster, "*", rows=0, files_read=0, files_removed=0, skipped=str(e))
    return Compaction(cluster, "*", rows=rows, files_read=len(inputs), files_removed=removed)


def _merge(
    store: Store, folder: str, inputs: list[reader.FileStat], removable: list[reader.FileStat], order: list[str]
) -> tuple[int, int]:
    """Read `inputs` (each row once, results.storage.reader), write them sorted by `order` as folder/COMPACTED
    (atomically), then delete the `removable` files whose rows all went into it and that are unchanged
    since (unreadable, alien, impossible or mis-filed ones stay where a person can look at them).
    Returns (rows written, files removed).

    Two checks keep every row even if a second compaction slipped past the lease: an input that vanished
    after the listing (another compaction deleted it) aborts before anything is written, and the output
    replaces the existing compacted file only if that file is still the one that was read (compare before
    rename), so the new file always covers every row of the one it replaces. Both raise ConcurrentChange."""
    target = f"{folder}/{COMPACTED}"
    tables = reader.read_files(store.fs, [f.path for f in inputs])
    vanished = [f.path for f in inputs if tables.get(f.path) is None and not _exists(store.fs, f.path)]
    if vanished:
        raise ConcurrentChange(f"{len(vanished)} file(s) vanished while being read (another compaction?)")
    was = next((f for f in inputs if f.path == target), None)
    skipped: set[str] = set()
    table = reader.combine(tables, skipped).sort_by([(c, "ascending") for c in order])
    store.write_atomic(
        folder,
        COMPACTED,
        lambda out: pq.write_table(
            table, out, row_group_size=ROW_GROUP_ROWS, compression="zstd", write_statistics=True
        ),
        before_rename=lambda: _require_unchanged(store.fs, target, was),
    )
    covered = [f for f in removable if tables.get(f.path) is not None and f.path not in skipped]
    return table.num_rows, sum(_remove_if_unchanged(store.fs, f) for f in covered)


def _exists(fs: pafs.FileSystem, path: str) -> bool:
    return fs.get_file_info(path).type != pafs.FileType.NotFound


def _require_unchanged(fs: pafs.FileSystem, path: str, was: reader.FileStat | None) -> None:
    """ConcurrentChange unless `path` is as it was listed (`was`), or still absent when it was not listed."""
    info = fs.get_file_info(path)
    now = None if info.type == pafs.FileType.NotFound else (info.mtime_ns or 0, info.size or 0)
    if now != (None if was is None else (was.mtime_ns, was.size)):
        raise ConcurrentChange(f"{path.rsplit('/', 2)[-2]}/{COMPACTED} was replaced while this compaction ran")


def _remove_if_unchanged(fs: pafs.FileSystem, stat: reader.FileStat) -> bool:
    info = fs.get_file_info(stat.path)
    if info.type != pafs.FileType.File or (info.mtime_ns or 0, info.size or 0) != (stat.mtime_ns, stat.size):
        return False  # rewritten since it was read (a resumed sweep): it stays, and the newer row wins
    try:
        fs.delete_file(stat.path)
    except FileNotFoundError:
        return False  # another compaction got there first
    return True


def compact(store: Store, cluster: str | None = None, sweep: str | None = None) -> list[Compaction]:
    """Compact every sweep under the root (or one cluster, or one sweep); then, unless one sweep was asked
    for, pack each cluster's compacted sweeps into one file."""
    done = []
    for c, sweeps in store.labels().items():
        if cluster is not None and c != cluster:
            continue
        if not valid_label(c):
            done.append(Compaction(c, "*", 0, 0, 0, skipped=f"cluster={c!r} is not a valid label; left as it is"))
            continue
        for s in sweeps:
            if sweep is not None and s != sweep:
                continue
            ok = valid_label(s)
            done.append(compact_sweep(store, c, s) if ok else Compaction(c, s, 0, 0, 0, skipped="not a valid label"))
        if sweep is None:
            done.append(compact_cluster(store, c))
    return done
