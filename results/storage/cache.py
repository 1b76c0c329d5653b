"""A store kept in memory for a long-running reader (the HTTP server, the dashboard).

Rows are read once and refreshed incrementally: at most every `refresh_s` a request lists the store
and reads only new or changed files (results.storage.reader.RowCache); requests that arrive while another
thread refreshes are served from the previous snapshot. Filters by cluster and sweep are applied to
the in-memory table, never by re-reading files.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
import time
import weakref
from collections.abc import Callable
from typing import TypeVar

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from results.errors import ResultsError, StoreNotFound, TooLarge, UnknownSelection
from results.sql import isolation
from results.storage.reader import RowCache
from results.storage.store import Store

STORE_MAX_ROWS = 5_000_000  # rows a server keeps in memory: `serve --max-rows` (benchmarks/cells_memory.py)
ANALYSIS_MAX_ROWS = 20_000  # rows a page, report, comparison or recommendation analyses (bootstraps)
DOWNLOAD_MAX_ROWS = 500_000  # rows `/cells` returns in one response
MEMO_ENTRIES = 64  # rendered pages and reports kept per server (each for one version of the store)
MEMO_LOCKS = 16
T = TypeVar("T")


class CachedStore:
    """Rows, calibration and profiles of one results root, in memory."""

    def __init__(self, root: str, refresh_s: float = 1.0, max_rows: int | None = STORE_MAX_ROWS) -> None:
        self.root, self.refresh_s = root, refresh_s
        self.store = Store.open(root)
        self._rows = RowCache(self.store.fs, max_rows)
        self._calibration: pd.DataFrame | None = None
        self._profiles: pa.Table | None = None
        self._profile_files: tuple = ()  # the profiles' files (path, mtime, size) as last listed
        self._listed_at = float("-inf")
        self._lock = threading.Lock()
        self._manifests: dict[tuple[str, str], dict | None] = {}
        self._ipc_dir = tempfile.mkdtemp(prefix="ddpsweep-cache-")
        self._ipc: tuple[tuple, tuple[str, ...]] | None = None  # ((rows, calibration, profiles), paths)
        self._ipc_lock = threading.Lock()
        self._memo: dict[tuple, tuple[object, object, float]] = {}  # key -> ((rows, profile files), value, s)
        self._memo_locks = [threading.Lock() for _ in range(MEMO_LOCKS)]  # by key hash: bounded, whatever is asked
        self._memo_lock = threading.Lock()
        weakref.finalize(self, shutil.rmtree, self._ipc_dir, True)

    def ipc_files(self) -> tuple[str, str, str]:
        """The current rows, calibration and profiles as Arrow IPC files (for query children to memory-map),
        written once per snapshot."""
        rows, calibration, profiles = self.table(), self.calibration(), self.profiles()
        with self._ipc_lock:
            if self._ipc is not None and _same(self._ipc[0], (rows, calibration, profiles)):
                return self._ipc[1]
            stamp = f"{time.monotonic_ns()}"
            paths = tuple(os.path.join(self._ipc_dir, f"{part}-{stamp}.arrow") for part in ("rows", "cal", "profiles"))
            isolation.write_ipc(rows, paths[0])
            isolation.write_ipc(pa.Table.from_pandas(calibration, preserve_index=False), paths[1])
            isolation.write_ipc(profiles, paths[2])
            if self._ipc is not None:  # a child still mapping the old files keeps them until it ends
                for old in self._ipc[1]:
                    os.unlink(old)
            self._ipc = ((rows, calibration, profiles), paths)
            return paths

    def table(self) -> pa.Table:
        """Every row (refreshed if the last listing is older than refresh_s)."""
        if self._rows.loaded and time.monotonic() - self._listed_at < self.refresh_s:
            return self._rows.snapshot
        self._listed_at = time.monotonic()
        before = self._rows.snapshot
        row_files, profile_files = self.store.listings()
        snapshot = self._rows.refresh(row_files)
        with self._lock:
            if snapshot is not before:  # new rows: the calibration files are written with them, re-read when needed
                self._calibration = None
            if tuple(profile_files) != self._profile_files:  # `ddpsweep predict` writes profiles, no rows
                self._profile_files, self._profiles = tuple(profile_files), None
        return snapshot

    def memo(self, key: tuple, compute: Callable[[], T]) -> T:
        """`compute()` once per version of the store (its rows snapshot, calibration files being written with
        a group's rows, and its profiles): while it runs, requests for the same key wait for its result; later
        ones reuse it until the store changes (a report renders in seconds; a burst of identical requests
        renders it once)."""
        version = (self.table(), self._profile_files)
        with self._memo_locks[hash(key) % MEMO_LOCKS]:
            hit = self._memo.get(key)
            if hit is not None and _same(hit[0], version):
                return hit[1]  # type: ignore[return-value]
            started = time.perf_counter()
            value = compute()
            with self._memo_lock:
                self._memo[key] = (version, value, time.perf_counter() - started)
                while len(self._memo) > MEMO_ENTRIES:
                    self._memo.pop(self._victim(version))
            return value

    def _victim(self, version: tuple) -> tuple:
        """The entry to drop: one of an older version of the store, else the cheapest to compute again (cheap
        pages, however many are asked, never push out an expensive report)."""
        stale = next((k for k, entry in self._memo.items() if not _same(entry[0], version)), None)
        return stale if stale is not None else min(self._memo, key=lambda k: self._memo[k][2])

    def manifest(self, cluster: str, sweep: str) -> dict | None:
        """A sweep's `_sweep.json` (its plan), read once; None where there is none or it is corrupt."""
        key = (cluster, sweep)
        if key not in self._manifests:
            try:
                self._manifests[key] = self.store.read_manifest(cluster, sweep)
            except ResultsError:
                self._manifests[key] = None
        return self._manifests[key]

    def calibration(self, cluster: str | None = None, sweep: str | None = None) -> pd.DataFrame:
        with self._lock:
            if self._calibration is None:
                self._calibration = self.store.read_calibration().to_pandas()
            cal = self._calibration
        if cluster is not None:
            cal = cal[cal["cluster"] == cluster]
        if sweep is not None:
            cal = cal[cal["sweep_id"] == sweep]
        return cal

    def profiles(self) -> pa.Table:
        """Every stored profile (Store.read_profiles), for the predictions beside the measurements."""
        with self._lock:
            if self._profiles is None:
                self._profiles = self.store.read_profiles()
            return self._profiles

    def rows(self, cluster: str | None = None, sweep: str | None = None, *, limit: int | None = None) -> pd.DataFrame:
        """The rows of one cluster and/or sweep, with load()'s errors for an empty store or unknown label, and
        TooLarge (before any conversion) for a selection of more than `limit` rows."""
        return self.selected(cluster, sweep, limit=limit).to_pandas()

    def selected(self, cluster: str | None = None, sweep: str | None = None, *, limit: int | None = None) -> pa.Table:
        """rows(), as the Arrow table it is (no copy): what a download streams batch by batch."""
        table = self.table()
        if table.num_rows == 0:
            raise StoreNotFound(f"no results under {self.root!r}: run a sweep first")
        for column, value, kind in (("cluster", cluster, "cluster"), ("sweep_id", sweep, "sweep")):
            if value is None:
                continue
            picked = table.filter(pc.equal(table[column], value))
            if picked.num_rows == 0:
                known = ", ".join(sorted(set(table[column].to_pylist())))
                raise UnknownSelection(f"{kind} {value!r} is not in {self.root!r}; {kind}s: {known[:2000]}")
            table = picked
        if limit is not None and table.num_rows > limit:
            raise TooLarge(_too_many(table.num_rows, limit, cluster, sweep))
        return table


def _too_many(rows: int, limit: int, cluster: str | None, sweep: str | None) -> str:
    what = " / ".join(f"{k} {v!r}" for k, v in (("cluster", cluster), ("sweep", sweep)) if v) or "the store"
    return (
        f"{what} holds {rows} rows, more than a page analyses ({limit}; a sweep has hundreds): select one "
        "sweep, or aggregate with SQL (`ddpsweep query`, POST /query), which has no such limit"
    )


def _same(a: tuple, b: tuple) -> bool:
    """Two versions of the store are the same: the same objects (snapshots and tables are replaced, never changed in
    place), or equal listings (tuples of files)."""
    return len(a) == len(b) and all(x is y or (isinstance(x, tuple) and x == y) for x, y in zip(a, b, strict=True))
