"""The results store: one Parquet file per (cell, repeat), hive-partitioned cluster=<label>/sweep=<id>/.

A root is a local folder or any pyarrow filesystem URI (s3://, gs://, hdfs://, file://).
Files are written under a hidden temporary name and renamed, so readers never see half a file.
"""

from __future__ import annotations

import json
import logging
import os
import re
import uuid
from dataclasses import dataclass

import pandas as pd
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from results.errors import StoreNotFound, UnknownSelection
from results.schema import CALIBRATION, SCHEMA, conform, conform_to, impossible, row_table

log = logging.getLogger(__name__)
LABEL_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


def valid_label(value: str) -> bool:
    """Labels (cluster, sweep id, cell id) are safe path segments: no '/', no '..', no leading dot."""
    return bool(LABEL_RE.match(value)) and ".." not in value


def _require_label(kind: str, value: str) -> str:
    if not valid_label(value):
        raise ValueError(f"{kind} {value!r} is not a valid label: use letters, digits, '_', '.', '-' (max 64)")
    return value


@dataclass(frozen=True)
class Store:
    """A results root on some filesystem."""

    fs: pafs.FileSystem
    root: str  # path inside fs, no trailing slash
    uri: str  # as the user gave it

    @classmethod
    def open(cls, uri: str) -> Store:
        """The store at `uri`; StoreNotFound (naming --results) for a URI no filesystem serves, or a file."""
        try:
            if "://" in uri:
                fs, path = pafs.FileSystem.from_uri(uri)
            else:
                fs, path = pafs.LocalFileSystem(), os.path.abspath(os.path.expanduser(uri))
        except (pa.ArrowException, ValueError) as e:
            raise StoreNotFound(f"--results {uri!r}: not a folder or a filesystem URI pyarrow can open ({e})") from None
        if isinstance(fs, pafs.LocalFileSystem) and os.path.isfile(path):
            raise StoreNotFound(f"--results {uri!r} is a file; give the folder that holds (or will hold) the rows")
        return cls(fs=fs, root=path.rstrip("/"), uri=uri)

    @property
    def is_local(self) -> bool:
        return isinstance(self.fs, pafs.LocalFileSystem)

    def sweep_dir(self, cluster: str, sweep_id: str) -> str:
        return f"{self.root}/cluster={_require_label('cluster', cluster)}/sweep={_require_label('sweep', sweep_id)}"

    def write_row(self, row: dict) -> str:
        """Write one row atomically (temporary name, then rename). Returns the file's path."""
        table = row_table(row)
        name = f"{_require_label('cell', row['cell_id'])}-r{int(row['repeat'])}.parquet"
        return self._write_atomic(self.sweep_dir(row["cluster"], row["sweep_id"]), name,
                                  lambda out: pq.write_table(table, out))  # fmt: skip

    def _write_atomic(self, folder: str, name: str, write) -> str:
        """`write(stream)` into a hidden temporary file, then rename it to `name`: readers never see half."""
        self.fs.create_dir(folder, recursive=True)
        tmp = f"{folder}/.{name}.{uuid.uuid4().hex[:8]}.tmp"
        with self.fs.open_output_stream(tmp) as out:
            write(out)
        self.fs.move(tmp, f"{folder}/{name}")  # atomic rename on local and POSIX-like filesystems
        return f"{folder}/{name}"

    def write_calibration(self, rows: list[dict]) -> str:
        """A group's calibration rows as one new file `_calibration-<group>-<random>.parquet` in its sweep's
        folder (a leading '_' keeps it out of the cell rows; a resumed group adds a file, never replaces one)."""
        first = rows[0]
        folder = self.sweep_dir(first["cluster"], first["sweep_id"])
        name = f"_calibration-{_require_label('group', first['group_id'])}-{uuid.uuid4().hex[:6]}.parquet"
        table = pa.Table.from_pylist([{f.name: r.get(f.name) for f in CALIBRATION} for r in rows], schema=CALIBRATION)
        return self._write_atomic(folder, name, lambda out: pq.write_table(table, out))

    def read_calibration(self, cluster: str | None = None, sweep: str | None = None) -> pa.Table:
        """Every calibration row under the root (optionally one cluster / sweep), in CALIBRATION."""
        base = self.root if cluster is None else f"{self.root}/cluster={_require_label('cluster', cluster)}"
        infos = self.fs.get_file_info(pafs.FileSelector(base, recursive=True, allow_not_found=True))
        tables = []
        for info in infos:
            if info.base_name.startswith("_calibration-") and (sweep is None or f"/sweep={sweep}/" in info.path):
                try:
                    tables.append(conform_to(pq.read_table(info.path, filesystem=self.fs), CALIBRATION))
                except (pa.ArrowException, OSError) as e:
                    log.warning("skipping unreadable calibration file %s: %s", info.path, e)
        return pa.concat_tables(tables) if tables else CALIBRATION.empty_table()

    def write_manifest(self, cluster: str, sweep_id: str, manifest: dict) -> None:
        """The sweep's plan (`_sweep.json`, ignored by readers of rows), written atomically."""
        text = json.dumps(manifest, indent=1, default=str).encode()
        self._write_atomic(self.sweep_dir(cluster, sweep_id), "_sweep.json", lambda out: out.write(text))

    def read_manifest(self, cluster: str, sweep_id: str) -> dict | None:
        path = f"{self.sweep_dir(cluster, sweep_id)}/_sweep.json"
        if self.fs.get_file_info(path).type != pafs.FileType.File:
            return None
        with self.fs.open_input_stream(path) as f:
            return json.loads(f.read())

    def files(self, cluster: str | None = None, sweep: str | None = None) -> list[str]:
        """Row files under the root (optionally one cluster / sweep), hidden and temporary files excluded."""
        base = self.root
        if cluster is not None:
            base += f"/cluster={_require_label('cluster', cluster)}"
            if sweep is not None:
                base += f"/sweep={_require_label('sweep', sweep)}"
        infos = self.fs.get_file_info(pafs.FileSelector(base, recursive=True, allow_not_found=True))
        keep = []
        for info in infos:
            name = info.base_name
            is_row = info.type == pafs.FileType.File and name.endswith(".parquet") and not name.startswith((".", "_"))
            if is_row and (sweep is None or f"/sweep={sweep}/" in info.path):
                keep.append(info.path)
        return sorted(keep)

    def read_table(self, cluster: str | None = None, sweep: str | None = None) -> pa.Table:
        """All rows as one table in SCHEMA. Unreadable files are skipped with a warning naming them."""
        tables = []
        for path in self.files(cluster, sweep):
            try:
                table = pq.read_table(path, filesystem=self.fs)
            except (pa.ArrowException, OSError) as e:
                log.warning("skipping unreadable results file %s: %s", path, e)
                continue
            missing = [c for c in REQUIRED if c not in table.column_names]
            if missing:
                log.warning("skipping results file %s: not a ddpsweep row file (no %s)", path, ", ".join(missing))
                continue
            tables.append(_drop_impossible(conform(table), path))
        return pa.concat_tables(tables) if tables else SCHEMA.empty_table()

    def labels(self) -> dict[str, list[str]]:
        """{cluster: [sweep ids]} present under the root."""
        found: dict[str, set[str]] = {}
        for path in self.files():
            parts = dict(p.split("=", 1) for p in path[len(self.root) :].split("/") if "=" in p)
            if "cluster" in parts and "sweep" in parts:
                found.setdefault(parts["cluster"], set()).add(parts["sweep"])
        return {c: sorted(s) for c, s in sorted(found.items())}


REQUIRED = [f.name for f in SCHEMA if not f.nullable]


def _drop_impossible(table: pa.Table, path: str) -> pa.Table:
    """Rows whose measurement cannot be real are skipped with a warning naming the file."""
    rows = table.to_pylist()
    keep = [impossible(r) is None for r in rows]
    if all(keep):
        return table
    log.warning("skipping %d row(s) of %s with an impossible measurement", keep.count(False), path)
    return table.filter(pa.array(keep))


def load(root: str, cluster: str | None = None, sweep: str | None = None) -> pd.DataFrame:
    """The store's rows as a DataFrame (optionally one cluster and/or sweep).

    Raises StoreNotFound for a missing or empty root and UnknownSelection for a label not in it.
    """
    store = Store.open(root)
    labels = store.labels()
    if not labels:
        raise StoreNotFound(f"no results under {root!r}: run a sweep first (ddpsweep run SPEC --results {root})")
    if cluster is not None and cluster not in labels:
        raise UnknownSelection(f"cluster {cluster!r} is not in {root!r}; clusters: {', '.join(labels)}")
    sweeps = labels.get(cluster, []) if cluster else sorted({s for v in labels.values() for s in v})
    if sweep is not None and sweep not in sweeps:
        raise UnknownSelection(f"sweep {sweep!r} is not in {root!r}; sweeps: {', '.join(sweeps)}")
    return store.read_table(cluster, sweep).to_pandas()


def load_calibration(root: str, cluster: str | None = None, sweep: str | None = None) -> pd.DataFrame:
    """The store's calibration rows (all-reduce time by size on a group's own ranks) as a DataFrame."""
    return Store.open(root).read_calibration(cluster, sweep).to_pandas()
