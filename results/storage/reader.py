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

import json
import logging
import os
import threading
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from results.analysis.paste import ENV_NAME
from results.errors import TooLarge
from results.knobs import KNOBS
from results.storage.schema import SCHEMA, conform_to

log = logging.getLogger(__name__)
REQUIRED = [f.name for f in SCHEMA if not f.nullable]
KEY = ["cluster", "sweep_id", "cell_id", "repeat"]
# Local files in the page cache are CPU-bound to decode (one thread per core is fastest: measured 0.45 s for
# 1,104 files with 2 threads on 2 cores, 0.63 s with 8); object stores are latency-bound (many in flight).
LOCAL_THREADS = os.cpu_count() or 2
REMOTE_THREADS = 32


@dataclass(frozen=True)
class FileStat:
    """A row file as listed: its path and what tells a changed file from an unchanged one."""

    path: str
    mtime_ns: int
    size: int


# What the reader itself needs of every row: the checks (check_rows) and one row per key (latest_per_key).
CHECK_COLUMNS = [*KEY, "status", "step_ms", "finished_at"]


def projection(columns: Iterable[str] | None) -> pa.Schema:
    """SCHEMA narrowed to `columns` (None: all) plus what the reader needs, in SCHEMA's order."""
    if columns is None:
        return SCHEMA
    wanted = set(columns) | set(CHECK_COLUMNS)
    return pa.schema([f for f in SCHEMA if f.name in wanted])


def read_file(fs: pafs.FileSystem, path: str, schema: pa.Schema = SCHEMA) -> pa.Table | None:
    """One file's rows in `schema` (SCHEMA or a projection of it: only those columns are decoded); None (with
    a warning) for a file that is unreadable or not a row file. Row-level checks (impossible, mis-filed) run
    on the combined table (see check_rows)."""
    try:
        with fs.open_input_file(path) as f:
            pf = pq.ParquetFile(f)
            present = set(pf.schema_arrow.names)
            missing = [c for c in REQUIRED if c not in present]
            if missing:
                log.warning("skipping results file %s: not a ddpsweep row file (no %s)", path, ", ".join(missing))
                return None
            table = pf.read(columns=[n for n in schema.names if n in present], use_threads=False)
    except (pa.ArrowException, OSError) as e:
        log.warning("skipping unreadable results file %s: %s", path, e)
        return None
    if table.schema.equals(schema):
        return table  # the common case: written by this version, nothing to convert
    try:
        return conform_to(table, schema)
    except (pa.ArrowException, ValueError) as e:
        log.warning("skipping results file %s: a column has a type that cannot be read (%s)", path, e)
        return None


BATCH = 1000  # files consolidated into one contiguous table at a time


def read_files(
    fs: pafs.FileSystem,
    paths: Iterable[str],
    columns: Iterable[str] | None = None,
) -> dict[str, Span | None]:
    """{path: rows or None}, read on a thread pool (pyarrow decodes without holding the GIL). Every BATCH
    files are consolidated into one contiguous table and each file's rows become a slice of it: a table
    per file would cost ~100 KB of schema and column objects for a one-row file (10 GB for 100k files)."""
    paths, schema = list(paths), projection(columns)
    out: dict[str, Span | None] = {}
    local = isinstance(fs, pafs.LocalFileSystem)
    with ThreadPoolExecutor(max(1, min(LOCAL_THREADS if local else REMOTE_THREADS, len(paths)))) as pool:
        for start in range(0, len(paths), BATCH):
            batch = paths[start : start + BATCH]
            spans = scan_local(batch, schema) if local and len(batch) >= SCAN_MIN_FILES else None
            if spans is None:  # remote, few files, or a batch with a file that needs the careful reader
                tables = pool.map(lambda p: read_file(fs, p, schema), batch)
                spans = _consolidated(dict(zip(batch, tables, strict=True)))
            out.update(spans)
    return out


SCAN_MIN_FILES = 16  # below this, a DuckDB connection costs more than it saves


def scan_local(paths: list[str], schema: pa.Schema) -> dict[str, Span] | None:
    """Local files in one parallel DuckDB scan (half the time of a file-by-file read of 1,000 compacted files:
    no Python per file). None when a file needs `read_file`'s per-file checks and warnings: unreadable,
    alien (a required column missing or null), holding no rows, or of types that do not convert."""
    try:
        import duckdb  # the SQL layer imports it anyway; only local reads of many files need it here
    except ImportError:  # a machine without DuckDB (the GPU check's bundle): read file by file
        return None

    columns = ", ".join(f'"{n}"' for n in schema.names)
    sql = f"SELECT {columns}, filename AS __file FROM read_parquet(?, filename = true)"
    try:
        with duckdb.connect(config={"threads": LOCAL_THREADS}) as con:
            table = con.sql(sql, params=[paths]).to_arrow_table()
    except duckdb.Error:
        return None
    files = table["__file"].combine_chunks()
    runs = pc.run_end_encode(files)
    names = runs.values.to_pylist()
    required = [c for c in REQUIRED if c in schema.names]
    if len(names) != len(paths) or set(names) != set(paths) or any(table[c].null_count for c in required):
        return None  # a file with no rows, rows not grouped by file, or an alien file
    try:
        table = table.drop_columns(["__file"]).cast(schema).combine_chunks()
    except (pa.ArrowException, ValueError):
        return None
    ends = runs.run_ends.to_pylist()
    starts = [0, *ends[:-1]]
    return {name: Span(table, start, end - start) for name, start, end in zip(names, starts, ends, strict=True)}


@dataclass(frozen=True)
class Span:
    """A file's rows: `length` rows from `offset` of a batch table shared by the files read with it."""

    batch: pa.Table
    offset: int
    length: int

    @property
    def num_rows(self) -> int:
        return self.length


def _consolidated(tables: dict[str, pa.Table | None]) -> dict[str, Span | None]:
    good = [(p, t) for p, t in tables.items() if t is not None]
    out: dict[str, Span | None] = {p: None for p, t in tables.items() if t is None}
    if not good:
        return out
    big = pa.concat_tables([t for _, t in good]).combine_chunks()
    offset = 0
    for path, table in good:
        out[path] = Span(big, offset, table.num_rows)
        offset += table.num_rows
    return out


def combine(spans: dict[str, Span | None], skipped: set[str] | None = None) -> pa.Table:
    """One checked table of every row (check_rows), each (cluster, sweep, cell, repeat) once (the latest
    `finished_at` wins). `skipped`, if given, receives the paths of files with rows left out."""
    by_batch: dict[int, tuple[pa.Table, list[tuple[str, Span]]]] = {}
    for path, span in spans.items():
        if span is not None and span.length:
            by_batch.setdefault(id(span.batch), (span.batch, []))[1].append((path, span))
    if not by_batch:
        return next((s.batch.schema for s in spans.values() if s is not None), SCHEMA).empty_table()
    parts, order = [], []
    for batch, members in by_batch.values():
        rows = [r for _, sp in members for r in range(sp.offset, sp.offset + sp.length)]
        parts.append(batch if rows == list(range(batch.num_rows)) else batch.take(pa.array(rows, pa.int64())))
        order += members
    source = pa.DictionaryArray.from_arrays(
        pa.array([i for i, (_, sp) in enumerate(order) for _ in range(sp.length)], pa.int32()),
        pa.array([p for p, _ in order]),
    )
    return latest_per_key(check_rows(pa.concat_tables(parts).combine_chunks(), source, skipped))


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


LABEL_PATTERN = r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}"  # results.storage.store.valid_label: also no ".."


def _labels_ok(column: pa.ChunkedArray) -> pa.ChunkedArray:
    """Where `column` holds a valid label (a pack's sweep ids are checked like folder names)."""
    whole = pc.match_substring_regex(column, f"^{LABEL_PATTERN}$")
    return pc.and_(whole, pc.invert(pc.match_substring(column, ".."))).fill_null(False)


def _configuration_possible(table: pa.Table) -> pa.ChunkedArray | pa.Array:
    """Every numeric knob within its range (trainers.knobs: a bucket of 1e300 MB, gas 2**31-1 or no rank is not
    a configuration ddpsweep ran), and an ok row's per-step times positive and finite: a row that says otherwise
    was not written by ddpsweep and would break every figure and page that uses it."""
    ok = pa.array([True] * table.num_rows, pa.bool_())
    for knob in KNOBS:
        if knob.kind in ("int", "float") and knob.name in table.column_names:
            ok = pc.and_(ok, _within(table[knob.name], knob.lo, knob.hi))
        if knob.kind == "choice" and knob.name in table.column_names:
            ok = pc.and_(ok, _one_of(table[knob.name], knob.choices + ROW_ONLY.get(knob.name, ())))
    for column in ("env", "env_grid"):
        if column in table.column_names:
            ok = pc.and_(ok, _variables_ok(table[column]))
    if "step_times_ms" in table.column_names:
        ok = pc.and_(ok, _times_real(table["step_times_ms"], table["status"]))
    return ok


def _within(column: pa.ChunkedArray, lo: float | None, hi: float | None) -> pa.ChunkedArray:
    """Null, or a finite value in [lo, hi]."""
    good = pc.is_finite(column) if pa.types.is_floating(column.type) else pc.is_valid(column)
    if lo is not None:
        good = pc.and_(good, pc.greater_equal(column, lo))
    if hi is not None:
        good = pc.and_(good, pc.less_equal(column, hi))
    return pc.or_kleene(pc.is_null(column), good).fill_null(False)


ROW_ONLY = {"backend": ("none",)}  # what rows record beside a knob's choices: a single cell has no process group


def _one_of(column: pa.ChunkedArray, choices: tuple) -> pa.ChunkedArray:
    """Null, or one of the knob's choices (a row's text reaches the code recommend prints to paste)."""
    return pc.or_kleene(pc.is_null(column), pc.is_in(column, value_set=pa.array(choices))).fill_null(False)


def _variables_ok(column: pa.ChunkedArray) -> pa.ChunkedArray:
    """Null, or a JSON object whose keys are variable names and whose values are scalars: recommend writes them
    as `export NAME=value` lines to paste, so a key is never code."""
    good = [value for value in pc.unique(column).to_pylist() if value is not None and _variables_object(value)]
    return pc.or_kleene(pc.is_null(column), pc.is_in(column, value_set=pa.array(good, pa.string()))).fill_null(False)


def _variables_object(text: str) -> bool:
    try:
        env = json.loads(text)
    except ValueError:
        return False
    return isinstance(env, dict) and all(
        ENV_NAME.fullmatch(k) and isinstance(v, str | int | float | bool) for k, v in env.items()
    )


def _times_real(times: pa.ChunkedArray, status: pa.ChunkedArray) -> pa.Array:
    """Per row: not an ok row, or every per-step time positive and finite."""
    times = times.combine_chunks() if isinstance(times, pa.ChunkedArray) else times
    flat, parents = pc.list_flatten(times), pc.list_parent_indices(times)
    bad_step = pc.invert(pc.and_(pc.is_finite(flat), pc.greater(flat, 0)).fill_null(False))
    real = np.ones(len(times), dtype=bool)
    real[parents.filter(bad_step).to_numpy()] = False
    return pc.or_(pc.invert(pc.equal(status, "ok")).fill_null(True), pa.array(real))


def check_rows(table: pa.Table, source: pa.DictionaryArray, skipped: set[str] | None = None) -> pa.Table:
    """Skip, with a warning naming each file, ok rows whose step time is not a positive finite number and
    rows whose `cluster` / `sweep_id` disagree with the folders (cluster=<c>/sweep=<s>/) they sit in."""
    ms = table["step_ms"]
    real = pc.and_(pc.is_finite(ms), pc.greater(ms, 0)).fill_null(False)
    possible = pc.or_(pc.invert(pc.equal(table["status"], "ok")), real).fill_null(True)
    possible = pc.and_(possible, _configuration_possible(table))
    folders = [
        dict(p.split("=", 1) for p in path.split("/") if p.startswith(("cluster=", "sweep=")))
        for path in source.dictionary.to_pylist()
    ]
    filed = pa.array([True] * table.num_rows, pa.bool_())
    for key, column in (("cluster", "cluster"), ("sweep", "sweep_id")):
        expected = pa.array([f.get(key) for f in folders], pa.string()).take(source.indices)
        agrees = pc.or_kleene(pc.is_null(expected), pc.equal(table[column], expected)).fill_null(False)
        filed = pc.and_(filed, agrees)
    labelled = pc.and_(_labels_ok(table["cluster"]), _labels_ok(table["sweep_id"]))
    keep = pc.and_(pc.and_(possible, filed), labelled)
    table = checked_verdicts(table)
    if pc.all(keep).as_py():
        return table
    paths = source.dictionary.to_pylist()
    for mask, why in (
        (possible, "with an impossible measurement or configuration"),
        (filed, "whose cluster / sweep_id disagree with its folders"),
        (labelled, "whose cluster / sweep_id is not a valid label"),
    ):
        bad = source.indices.filter(pc.invert(mask)).to_pylist()
        for i in sorted(set(bad)):
            log.warning("skipping %d row(s) of %s %s", bad.count(i), paths[i], why)
            if skipped is not None:
                skipped.add(paths[i])
    return table.filter(keep)


VERDICTS = ("exact", "approximate", "failed", "indeterminate", "off")
"""The gradient check's labels (trainers.gradcheck); null: not checked in that measurement."""


def checked_verdicts(table: pa.Table) -> pa.Table:
    """`grad_check` as decisions may read it: a label the check never writes reads as failed, and so does `exact`
    with an error beyond the row's own tolerance (a row is data, and a wrong label must not make it an answer)."""
    if "grad_check" not in table.column_names:
        return table
    label = table["grad_check"]
    unknown = pc.and_(pc.is_valid(label), pc.invert(pc.is_in(label, pa.array(VERDICTS))))
    if {"grad_rel_error", "grad_tol"} <= set(table.column_names):
        beyond = pc.greater(table["grad_rel_error"], table["grad_tol"]).fill_null(False)
        unknown = pc.or_(unknown, pc.and_(pc.equal(label, "exact").fill_null(False), beyond))
    if not pc.any(unknown).as_py():
        return table
    fixed = pc.if_else(unknown, pa.scalar("failed", label.type), label)
    return table.set_column(table.schema.get_field_index("grad_check"), "grad_check", fixed)


class RowCache:
    """The rows of a store kept in memory and refreshed incrementally (the HTTP server's copy).

    `refresh(listing)` reads only files that are new or changed since the last refresh and forgets removed
    ones (a compaction replaces many row files by one). Readers get an immutable snapshot; a refresh that
    runs in one thread never blocks readers in others, and refreshes do not pile up.
    """

    def __init__(self, fs: pafs.FileSystem, max_rows: int | None = None) -> None:
        self.fs, self.max_rows = fs, max_rows
        self._files: dict[str, tuple[FileStat, Span | None]] = {}
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
                self._check_budget([current[p] for p in changed], removed)
                fresh = read_files(self.fs, changed)
                files = {p: v for p, v in self._files.items() if p not in removed}
                files.update({p: (current[p], fresh[p]) for p in changed})
                self._files = files
                self._snapshot = combine({p: t for p, (_, t) in files.items()})
            self.loaded = True
            return self._snapshot
        finally:
            self._refreshing.release()

    def _check_budget(self, incoming: list[FileStat], removed: set[str]) -> None:
        """TooLarge, before anything is read, when the rows kept plus those of `incoming` would pass
        max_rows (a row file holds one row; a larger file's count comes from its Parquet footer)."""
        if self.max_rows is None:
            return
        kept = sum(span.num_rows for path, (_, span) in self._files.items() if span and path not in removed)
        total = kept + sum(rows_in(self.fs, f) for f in incoming)
        if total > self.max_rows:
            raise TooLarge(
                f"the store holds about {total} rows, more than this server keeps in memory (--max-rows "
                f"{self.max_rows}, about 0.5 KB a row): serve a smaller root (e.g. one cluster's folder) or "
                "raise --max-rows"
            )


ROW_FILE_MAX_BYTES = 64 * 1024  # a one-row file is about 25 KB; anything larger is a compacted file or pack


def rows_in(fs: pafs.FileSystem, stat: FileStat) -> int:
    """Rows in a Parquet file: 1 for a small row file, the footer's count for a compacted file, a pack or
    any larger file (0 if unreadable)."""
    if stat.size <= ROW_FILE_MAX_BYTES and not stat.path.endswith("/compacted.parquet"):
        return 1
    try:
        with fs.open_input_file(stat.path) as f:
            return pq.ParquetFile(f).metadata.num_rows
    except (OSError, pa.ArrowException):
        return 0
