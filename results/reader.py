"""Reading row files: in parallel, each file checked on its own, every (cell, repeat) exactly once.

Guarantees, whatever reads the store (CLI, HTTP server, compaction):
- an unreadable file, or one that is not a ddpsweep row file (no required column), is skipped with a
  warning naming it; files of older schemas are null-filled to the current one;
- rows whose measurement cannot be real, or whose `cluster` / `sweep_id` disagree with the folders they
  sit in, are skipped with a warning naming the file;
- each (cluster, sweep_id, cell_id, repeat) appears once: where a compacted file and a row file (or a row
  re-measured after compaction) both hold it, the row that finished last wins — so a store read while a
  compaction is half done, or after it was killed between its steps, has no duplicates and no losses.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from results.schema import SCHEMA, conform

log = logging.getLogger(__name__)
REQUIRED = [f.name for f in SCHEMA if not f.nullable]
KEY = ["cluster", "sweep_id", "cell_id", "repeat"]
READ_THREADS = max(8, 4 * (os.cpu_count() or 1))  # files are small: reading is latency (disk, network), not CPU


@dataclass(frozen=True)
class FileStat:
    """A row file as listed: its path and what tells a changed file from an unchanged one."""

    path: str
    mtime_ns: int
    size: int


def read_file(fs: pafs.FileSystem, path: str) -> pa.Table | None:
    """One file's rows in SCHEMA, checked; None (with a warning) for a file that holds no usable rows."""
    try:
        table = pq.read_table(path, filesystem=fs)
    except (pa.ArrowException, OSError) as e:
        log.warning("skipping unreadable results file %s: %s", path, e)
        return None
    missing = [c for c in REQUIRED if c not in table.column_names]
    if missing:
        log.warning("skipping results file %s: not a ddpsweep row file (no %s)", path, ", ".join(missing))
        return None
    try:
        table = conform(table)
    except (pa.ArrowException, ValueError) as e:
        log.warning("skipping results file %s: a column has a type that cannot be read (%s)", path, e)
        return None
    return drop_misfiled(drop_impossible(table, path), path)


def read_files(fs: pafs.FileSystem, paths: Iterable[str]) -> dict[str, pa.Table | None]:
    """{path: rows or None}, read on a thread pool (pyarrow decodes without holding the GIL)."""
    paths = list(paths)
    if len(paths) < 4:
        return {p: read_file(fs, p) for p in paths}
    with ThreadPoolExecutor(min(READ_THREADS, len(paths))) as pool:
        return dict(zip(paths, pool.map(lambda p: read_file(fs, p), paths), strict=True))


def combine(tables: Iterable[pa.Table | None]) -> pa.Table:
    """One table of every row, each (cluster, sweep, cell, repeat) once (the latest `finished_at` wins)."""
    tables = [t for t in tables if t is not None and t.num_rows]
    if not tables:
        return SCHEMA.empty_table()
    return latest_per_key(pa.concat_tables(tables))


def latest_per_key(table: pa.Table) -> pa.Table:
    """Keep one row per KEY: the one with the latest finished_at (ties: the later in the table)."""
    keys = pc.binary_join_element_wise(*[pc.cast(table[k], pa.string()) for k in KEY], "\x1f")
    if pc.count_distinct(keys).as_py() == table.num_rows:
        return table  # the common case: no duplicates, nothing to sort
    order = pa.table({"k": keys, "t": table["finished_at"], "i": pa.array(range(table.num_rows))})
    order = order.sort_by([("k", "ascending"), ("t", "descending"), ("i", "descending")])
    ks = order["k"].to_pylist()
    keep = [i for j, i in enumerate(order["i"].to_pylist()) if j == 0 or ks[j] != ks[j - 1]]
    return table.take(pa.array(sorted(keep)))


def drop_impossible(table: pa.Table, path: str) -> pa.Table:
    """Ok rows whose step time is not a positive finite number are skipped with a warning naming the file."""
    ms = table["step_ms"]
    real = pc.and_(pc.is_finite(ms), pc.greater(ms, 0)).fill_null(False)
    keep = pc.or_(pc.invert(pc.equal(table["status"], "ok")), real).fill_null(True)
    dropped = table.num_rows - pc.sum(keep.cast(pa.int64())).as_py() if table.num_rows else 0
    if not dropped:
        return table
    log.warning("skipping %d row(s) of %s with an impossible measurement", dropped, path)
    return table.filter(keep)


def drop_misfiled(table: pa.Table, path: str) -> pa.Table:
    """Rows whose `cluster` / `sweep_id` disagree with the folders they sit in (cluster=<c>/sweep=<s>/) are
    skipped with a warning: a filter by folder and a filter by column must never disagree."""
    parts = dict(p.split("=", 1) for p in path.split("/") if p.startswith(("cluster=", "sweep=")))
    keep = pa.array([True] * table.num_rows, type=pa.bool_())
    for folder_key, column in (("cluster", "cluster"), ("sweep", "sweep_id")):
        if folder_key in parts:
            keep = pc.and_(keep, pc.equal(table[column], parts[folder_key]).fill_null(False))
    dropped = table.num_rows - pc.sum(keep.cast(pa.int64())).as_py() if table.num_rows else 0
    if not dropped:
        return table
    log.warning("skipping %d row(s) of %s whose cluster / sweep_id disagree with its folders", dropped, path)
    return table.filter(keep)


class RowCache:
    """The rows of a store kept in memory and refreshed incrementally (the HTTP server's copy).

    `refresh(listing)` reads only files that are new or changed since the last refresh and forgets removed
    ones (a compaction replaces many row files by one). Readers get an immutable snapshot; a refresh that
    runs in one thread never blocks readers in others, and refreshes do not pile up.
    """

    def __init__(self, fs: pafs.FileSystem) -> None:
        self.fs = fs
        self._files: dict[str, tuple[FileStat, pa.Table | None]] = {}
        self._snapshot: pa.Table = SCHEMA.empty_table()
        self._refreshing = threading.Lock()
        self.loaded = False  # until the first refresh finishes, readers wait for it

    @property
    def snapshot(self) -> pa.Table:
        return self._snapshot

    def refresh(self, listing: list[FileStat]) -> pa.Table:
        """Bring the cache up to `listing`; returns the new snapshot (the current one if another thread is
        refreshing right now, once a first refresh has finished)."""
        if not self._refreshing.acquire(blocking=not self.loaded):
            return self._snapshot
        try:
            current = {f.path: f for f in listing}
            changed = [f.path for f in listing if f.path not in self._files or self._files[f.path][0] != f]
            removed = set(self._files) - set(current)
            if changed or removed:
                fresh = read_files(self.fs, changed)
                files = {p: v for p, v in self._files.items() if p not in removed}
                files.update({p: (current[p], fresh[p]) for p in changed})
                self._files = files
                self._snapshot = combine(t for _, t in files.values())
            self.loaded = True
            return self._snapshot
        finally:
            self._refreshing.release()
