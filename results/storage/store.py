"""The results store: one Parquet file per (cell, repeat), hive-partitioned cluster=<label>/sweep=<id>/.

A root is a local folder or any pyarrow filesystem URI (s3://, gs://, hdfs://, file://).
Files are written under a hidden temporary name and renamed, so readers never see half a file.
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import json
import logging
import math
import os
import re
import urllib.parse
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from results.errors import LabelError, ResultsError, StoreFull, StoreNotFound, UnknownSelection
from results.model.overlap import Profile
from results.storage import reader
from results.storage.reader import FileStat
from results.storage.schema import CALIBRATION, conform_to, row_table

PROFILES = pa.schema([("cluster", pa.string()), ("key", pa.string()), ("profile", pa.string())])

if TYPE_CHECKING:
    import pandas as pd

log = logging.getLogger(__name__)
COMPACTED = "compacted.parquet"  # a sweep's rows in one file (in its folder), or a cluster's pack (in the cluster's)
LABEL_RE = re.compile(reader.LABEL_PATTERN)
LABEL_RULE = "a label of letters, digits, '_', '.', '-' (max 64)"


def valid_label(value: str) -> bool:
    """Labels (cluster, sweep id, cell id) are safe path segments: no '/', no '..', no leading dot."""
    return bool(LABEL_RE.fullmatch(value)) and ".." not in value  # fullmatch: no trailing newline


def require_label(field: str, value: str) -> str:
    """`value` if it is a valid label, else LabelError naming `field` (the one label check of the project)."""
    if not isinstance(value, str) or not valid_label(value):
        raise LabelError(field, value)
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
            if uri.startswith("s3://"):
                fs, path = _s3(uri)
            elif uri.startswith(("gs://", "gcs://")):
                fs, path = _gcs(uri)
            elif "://" in uri:
                fs, path = pafs.FileSystem.from_uri(uri)
            else:
                fs, path = pafs.LocalFileSystem(), os.path.abspath(os.path.expanduser(uri))
        except (pa.ArrowException, ValueError) as e:
            raise StoreNotFound(f"--results {uri!r}: not a folder or a filesystem URI pyarrow can open ({e})") from None
        except OSError as e:  # e.g. an s3:// bucket whose region cannot be resolved (no network, no such bucket)
            raise StoreNotFound(f"--results {uri!r}: cannot reach it ({_first_line(e)})") from None
        if isinstance(fs, pafs.LocalFileSystem) and os.path.isfile(path):
            raise StoreNotFound(f"--results {uri!r} is a file; give the folder that holds (or will hold) the rows")
        return cls(fs=fs, root=path.rstrip("/"), uri=uri)

    def ensure_writable(self) -> None:
        """Create the root if needed and write (then remove) a small probe file in it: an unreachable or
        read-only root is a StoreNotFound, a full one a StoreFull, both naming it (a sweep checks this before
        Ray starts; creating a folder that exists succeeds on a read-only mount, a write does not)."""
        probe, opened = f"{self.root}/.probe-{uuid.uuid4().hex[:8]}", False
        try:
            # GCS has no folders to make, and pyarrow's create_dir there is several requests, each retried:
            # 35 s before an unreachable endpoint is an error (the probe alone: 6 s)
            if not isinstance(self.fs, pafs.GcsFileSystem):
                self.fs.create_dir(self.root, recursive=True)
            with self.fs.open_output_stream(probe) as out:
                opened = True
                out.write(b"ddpsweep")
            self.fs.delete_file(probe)
        except OSError as e:
            if opened:  # an unreachable root is not asked a second time
                with contextlib.suppress(OSError):
                    self.fs.delete_file(probe)
            if is_disk_full(e):
                raise StoreFull(f"--results {self.uri!r}: no space left on its device; free some first") from None
            raise StoreNotFound(f"--results {self.uri!r}: cannot write there ({_first_line(e)})") from None

    @property
    def is_local(self) -> bool:
        return isinstance(self.fs, pafs.LocalFileSystem)

    def sweep_dir(self, cluster: str, sweep_id: str) -> str:
        return f"{self.root}/cluster={require_label('cluster', cluster)}/sweep={require_label('sweep', sweep_id)}"

    def write_row(self, row: dict) -> str:
        """Write one row atomically (temporary name, then rename). Returns the file's path."""
        table = row_table(row)
        name = f"{require_label('cell', row['cell_id'])}-r{int(row['repeat'])}.parquet"
        return self.write_atomic(
            self.sweep_dir(row["cluster"], row["sweep_id"]), name, lambda out: pq.write_table(table, out)
        )

    def write_atomic(self, folder: str, name: str, write, before_rename=None) -> str:
        """`write(stream)` into a hidden temporary file, then rename it to `name`: readers never see half.
        `before_rename()` may raise to abandon the write. The temporary file never outlives a failure
        (a full disk, a refused check)."""
        self.fs.create_dir(folder, recursive=True)
        tmp = f"{folder}/.{name}.{uuid.uuid4().hex[:8]}.tmp"
        try:
            with self.fs.open_output_stream(tmp) as out:
                write(out)
            if before_rename is not None:
                before_rename()
            self.fs.move(tmp, f"{folder}/{name}")  # atomic rename on local and POSIX-like filesystems
        except BaseException as e:
            with contextlib.suppress(OSError):
                self.fs.delete_file(tmp)
            if is_disk_full(e):
                raise StoreFull(f"--results {self.uri!r}: no space left on its device ({folder})") from None
            raise
        return f"{folder}/{name}"

    def write_calibration(self, rows: list[dict]) -> str:
        """A group's calibration rows as one new file `_calibration-<group>-<random>.parquet` in its sweep's
        folder (a leading '_' keeps it out of the cell rows; a resumed group adds a file, never replaces one)."""
        first = rows[0]
        folder = self.sweep_dir(first["cluster"], first["sweep_id"])
        name = f"_calibration-{require_label('group', first['group_id'])}-{uuid.uuid4().hex[:6]}.parquet"
        table = pa.Table.from_pylist([{f.name: r.get(f.name) for f in CALIBRATION} for r in rows], schema=CALIBRATION)
        return self.write_atomic(folder, name, lambda out: pq.write_table(table, out))

    def read_calibration(self, cluster: str | None = None, sweep: str | None = None) -> pa.Table:
        """Every calibration row under the root (optionally one cluster / sweep), in CALIBRATION."""
        base = self.root if cluster is None else f"{self.root}/cluster={require_label('cluster', cluster)}"
        tables = []
        for path in (f.path for f in self._walk(base)):
            name = path.rsplit("/", 1)[-1]
            if name.startswith("_calibration-") and name.endswith(".parquet") and _in_sweep(path, sweep):
                try:
                    table = conform_to(pq.read_table(path, filesystem=self.fs), CALIBRATION)
                except (pa.ArrowException, OSError) as e:
                    log.warning("skipping unreadable calibration file %s: %s", path, e)
                    continue
                problem = calibration_problem(table)
                if problem:
                    log.warning("skipping calibration file %s: %s", path, problem)
                else:
                    tables.append(table)
        return pa.concat_tables(tables) if tables else CALIBRATION.empty_table()

    def write_profile(self, cluster: str, key: str, profile: dict) -> str:
        """A workload's profile (trainers.profile: one rank's micro-step) as `_profile-<key>.parquet` in the
        cluster's folder, one row; a newer profile of the same key replaces it."""
        folder = f"{self.root}/cluster={require_label('cluster', cluster)}"
        table = pa.Table.from_pylist([{"key": key, "profile": json.dumps(profile)}])
        return self.write_atomic(
            folder, f"_profile-{require_label('profile', key)}.parquet", lambda o: pq.write_table(table, o)
        )

    def read_profiles(self) -> pa.Table:
        """Every stored profile: (cluster, key, profile as JSON), for the views that set predictions beside
        measurements (results.model.predicted). A file that is not a valid profile is skipped with a warning."""
        rows = []
        for folder in self.fs.get_file_info(pafs.FileSelector(self.root, allow_not_found=True)):
            if folder.type != pafs.FileType.Directory or not folder.base_name.startswith("cluster="):
                continue
            for info in self.fs.get_file_info(pafs.FileSelector(folder.path)):
                name = info.base_name
                if info.type == pafs.FileType.File and name.startswith("_profile-") and name.endswith(".parquet"):
                    profile = self._profile_text(info.path)
                    key = name.removeprefix("_profile-").removesuffix(".parquet")
                    if profile is not None:
                        cluster = folder.base_name.removeprefix("cluster=")
                        rows.append({"cluster": cluster, "key": key, "profile": profile})
        return pa.Table.from_pylist(rows, schema=PROFILES)

    def read_profile(self, cluster: str, key: str) -> dict | None:
        """The stored profile of `key` on `cluster`, or None (none stored, or not a valid profile: measured anew)."""
        path = (
            f"{self.root}/cluster={require_label('cluster', cluster)}/_profile-{require_label('profile', key)}.parquet"
        )
        if self.fs.get_file_info(path).type != pafs.FileType.File:
            return None
        text = self._profile_text(path)
        return None if text is None else json.loads(text)

    def _profile_text(self, path: str) -> str | None:
        """A profile file's JSON where it holds a valid profile (results.model.overlap.Profile's checks), else None and
        one warning naming the file."""
        try:
            text = pq.read_table(path, filesystem=self.fs).column("profile")[0].as_py()
            Profile.from_dict(json.loads(text))
            return text
        except (pa.ArrowException, OSError, KeyError, IndexError, TypeError, ValueError, RecursionError) as e:
            log.warning("skipping profile file %s: %s", path, str(e)[:200])
            return None

    def write_manifest(self, cluster: str, sweep_id: str, manifest: dict) -> None:
        """The sweep's plan (`_sweep.json`, ignored by readers of rows), written atomically."""
        text = json.dumps(manifest, indent=1, default=str).encode()
        self.write_atomic(self.sweep_dir(cluster, sweep_id), "_sweep.json", lambda out: out.write(text))

    def read_manifest(self, cluster: str, sweep_id: str) -> dict | None:
        path = f"{self.sweep_dir(cluster, sweep_id)}/_sweep.json"
        if self.fs.get_file_info(path).type != pafs.FileType.File:
            return None
        with self.fs.open_input_stream(path) as f:
            text = f.read()
        try:
            manifest = json.loads(text)
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise ResultsError(f"sweep {sweep_id}: its _sweep.json is corrupt ({e}); start a new sweep") from None
        if not isinstance(manifest, dict) or not isinstance(manifest.get("cells"), list):
            raise ResultsError(f"sweep {sweep_id}: its _sweep.json holds no list of cells; start a new sweep instead")
        return manifest

    def files(self, cluster: str | None = None, sweep: str | None = None, packs: bool = True) -> list[str]:
        """Row files under the root (optionally one cluster / sweep), hidden and temporary files excluded."""
        return [f.path for f in self.listing(cluster, sweep, packs)]

    def listing(self, cluster: str | None = None, sweep: str | None = None, packs: bool = True) -> list[FileStat]:
        """Row files as `cluster=<c>/sweep=<s>/<name>.parquet`, and each cluster's pack
        `cluster=<c>/compacted.parquet` (rows of many sweeps; with `sweep`, included when `packs`, since it may
        hold that sweep's rows), with mtime and size, sorted by path; nothing else under the root is read."""
        return self.listings(cluster, sweep, packs)[0]

    def listings(
        self, cluster: str | None = None, sweep: str | None = None, packs: bool = True
    ) -> tuple[list[FileStat], list[FileStat]]:
        """`listing()`'s row files, and the profiles (`cluster=<c>/_profile-<key>.parquet`), from one walk."""
        base = self.root if cluster is None else f"{self.root}/cluster={require_label('cluster', cluster)}"
        if sweep is not None:
            require_label("sweep", sweep)
        keep, profiles = [], []
        for stat in self._walk(base):
            parts = stat.path[len(self.root) + 1 :].split("/")  # cluster=<c>/sweep=<s>/<name> or cluster=<c>/<pack>
            if not parts[0].startswith("cluster="):
                continue
            if len(parts) == 2 and parts[1] == COMPACTED:
                if packs:
                    keep.append(stat)
            elif len(parts) == 2 and parts[1].startswith("_profile-") and parts[1].endswith(".parquet"):
                profiles.append(stat)
            elif (
                len(parts) == 3 and parts[1].startswith("sweep=") and _row_file(parts[2]) and _in_sweep(parts[1], sweep)
            ):
                keep.append(stat)
        return sorted(keep, key=lambda f: f.path), sorted(profiles, key=lambda f: f.path)

    def _walk(self, base: str) -> list[FileStat]:
        """Every regular file under `base`. On a local root symbolic links are never followed (a link to
        another store cannot add its rows, a loop cannot multiply them); each one skipped is logged."""
        if not self.is_local:
            selector = pafs.FileSelector(base, recursive=True, allow_not_found=True)
            try:
                infos = self.fs.get_file_info(selector)
            except OSError as e:
                raise StoreNotFound(f"--results {self.uri!r}: cannot list it ({_first_line(e)})") from None
            return [FileStat(i.path, i.mtime_ns or 0, i.size or 0) for i in infos if i.type == pafs.FileType.File]
        found: list[FileStat] = []
        stack = [base]
        while stack:
            try:
                entries = list(os.scandir(stack.pop()))
            except (FileNotFoundError, NotADirectoryError):
                continue
            for entry in entries:
                if entry.is_symlink():
                    log.warning("skipping symbolic link %s in the results store (links are never followed)", entry.path)
                elif entry.is_dir(follow_symlinks=False):
                    stack.append(entry.path)
                elif entry.is_file(follow_symlinks=False):
                    try:
                        st = entry.stat(follow_symlinks=False)
                    except FileNotFoundError:
                        continue  # renamed or deleted since the listing: simply not there
                    found.append(FileStat(entry.path, st.st_mtime_ns, st.st_size))
        return found

    def read_table(
        self, cluster: str | None = None, sweep: str | None = None, columns: list[str] | None = None
    ) -> pa.Table:
        """All rows as one table in SCHEMA (or only `columns`, plus those the reader checks), read in parallel
        (see results.storage.reader for the guarantees)."""
        table = reader.combine(reader.read_files(self.fs, self.files(cluster, sweep), columns))
        return table if sweep is None else table.filter(pc.equal(table["sweep_id"], sweep))  # a pack holds many

    def labels(self) -> dict[str, list[str]]:
        """{cluster: [sweep ids]} present under the root (a pack's sweeps read from its sweep_id column)."""
        found: dict[str, set[str]] = {}
        for path in self.files():
            parts = dict(p.split("=", 1) for p in path[len(self.root) :].split("/") if "=" in p)
            if "sweep" in parts:
                found.setdefault(parts["cluster"], set()).add(parts["sweep"])
            else:
                found.setdefault(parts["cluster"], set()).update(self._pack_sweeps(path))
        return {c: sorted(s) for c, s in sorted(found.items()) if s}

    def _pack_sweeps(self, path: str) -> list[str]:
        """A pack's sweep ids, checked like folder names (a crafted pack cannot smuggle markup or paths)."""
        try:
            ids = pc.unique(pq.read_table(path, columns=["sweep_id"], filesystem=self.fs)["sweep_id"]).to_pylist()
        except (pa.ArrowException, OSError, KeyError) as e:
            log.warning("skipping unreadable results file %s: %s", path, e)
            return []
        bad = [i for i in ids if not isinstance(i, str) or not valid_label(i)]
        if bad:
            log.warning("skipping %d sweep id(s) of %s that are not valid labels: %.80r", len(bad), path, bad)
        return [i for i in ids if i not in bad]


S3_OPTIONS = ("endpoint_override", "region", "scheme", "allow_bucket_creation")


def _s3(uri: str) -> tuple[pafs.FileSystem, str]:
    """An S3 filesystem with bounded connect / request timeouts and retries: an unreachable endpoint is an
    error in about a second, not after a minute of retries. Takes pyarrow's URI options
    (`?endpoint_override=host:port&scheme=http&region=…`); credentials come from the usual AWS variables."""
    parsed = urllib.parse.urlparse(uri)
    options = dict(urllib.parse.parse_qsl(parsed.query))
    unknown = sorted(set(options) - set(S3_OPTIONS))
    if unknown:
        raise ValueError(f"unknown option(s) {', '.join(unknown)}; allowed: {', '.join(S3_OPTIONS)}")
    if "allow_bucket_creation" in options:
        options["allow_bucket_creation"] = options["allow_bucket_creation"].lower() in ("1", "true", "yes")
    fs = pafs.S3FileSystem(
        connect_timeout=3, request_timeout=10, retry_strategy=pafs.AwsStandardS3RetryStrategy(max_attempts=2), **options
    )
    return fs, f"{parsed.netloc}{parsed.path}"


GCS_RETRY_S = 5  # pyarrow's GCS client retries for 15 minutes by default, deaf to signals while it does


def _gcs(uri: str) -> tuple[pafs.FileSystem, str]:
    """A GCS filesystem whose retries stop after GCS_RETRY_S: an unreachable bucket or missing credentials are
    an error in seconds (the credential lookup adds its own), not a process that ignores Ctrl-C."""
    fs, path = pafs.FileSystem.from_uri(uri)
    if isinstance(fs, pafs.GcsFileSystem):
        fs = pafs.GcsFileSystem(retry_time_limit=datetime.timedelta(seconds=GCS_RETRY_S))
    return fs, path


def is_disk_full(e: BaseException) -> bool:
    """An OSError of a full device or quota, as the OS or pyarrow reports it."""
    return isinstance(e, OSError) and (e.errno in (errno.ENOSPC, errno.EDQUOT) or "No space left on device" in str(e))


def _first_line(e: Exception) -> str:
    return str(e).splitlines()[0][:200] if str(e) else type(e).__name__


def calibration_problem(table: pa.Table) -> str | None:
    """Why a calibration file cannot give t(bytes), or None: every time a finite positive number of ms, every size
    a positive number of bytes, and at least two sizes of all-reduce (one point fits no line)."""
    times, sizes = table.column("time_ms").to_pylist(), table.column("size_bytes").to_pylist()
    if any(t is None or not math.isfinite(t) or t <= 0 for t in times):
        return "time_ms: every time must be a finite, positive number of ms"
    if any(b is None or b <= 0 for b in sizes):
        return "size_bytes: every message must be a positive number of bytes"
    reduced = {b for b, k in zip(sizes, table.column("kind").to_pylist(), strict=True) if k == "all_reduce"}
    if len(reduced) == 1:
        return "size_bytes: one all-reduce size; the α-β fit needs at least two"
    return None


def _in_sweep(path: str, sweep: str | None) -> bool:
    return sweep is None or f"/sweep={sweep}/" in f"/{path}/"


def _row_file(name: str) -> bool:
    return name.endswith(".parquet") and not name.startswith((".", "_"))


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
