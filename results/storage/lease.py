"""Leases: one writer at a time for a sweep (its claim) and for a compaction of a sweep or a cluster's pack.

Two kinds, by filesystem, because they offer different primitives:

- **Local disk** (and NFS, where Linux emulates it with POSIX locks): an exclusive `flock` on a lock file in
  the folder. The kernel holds it, so a holder killed by SIGKILL or a crash releases it at once and no lease
  is ever stale. The lock file is never deleted (deleting a locked file lets a second process lock a new
  inode under the same name while the first still holds the old one); its text names the holder.
- **Object stores** (s3://, gs://, …): pyarrow's filesystems have no conditional put, so a lease is an object
  holding a random token and an expiry. Taking it: refuse if an unexpired lease of someone else is there;
  write ours; wait `SETTLE_S`; read it back — whoever's token is there owns it (S3 reads are strongly
  consistent since 2020, so two writers racing both read the last one's token). A holder renews it from a
  thread every `ttl_s / 3` and deletes it on release; a holder that died leaves a lease that expires.
  The window this leaves (two writers whose read-backs both come before either write lands) is closed by
  the second wall: a compaction replaces its output only if that file is unchanged since it was read
  (results.storage.compaction), and the `ddpsweep run` refuses an id whose plan (`_sweep.json`) has appeared.
"""

from __future__ import annotations

import fcntl
import json
import os
import secrets
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime

import pyarrow.fs as pafs

from results.errors import ResultsError

SETTLE_S = 0.5  # object stores: wait this long between writing a lease and reading it back
DEFAULT_TTL_S = 120.0


class LeaseHeld(ResultsError):
    """Another process holds the lease (a sweep running under this id, or a compaction of this folder).
    `holder` describes it: pid, host, what it is doing, since when."""

    http_status = 409

    def __init__(self, what: str, holder: dict) -> None:
        self.holder = holder
        who = f"pid {holder.get('pid', '?')} on {holder.get('host', '?')}"
        since = f" since {holder['since']}" if holder.get("since") else ""
        super().__init__(f"{what} is held by {who} ({holder.get('purpose', 'unknown')}{since})")


def _holder(purpose: str) -> dict:
    return {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "purpose": purpose,
        "since": datetime.now(UTC).isoformat(timespec="seconds"),
    }


@contextmanager
def lease(
    fs: pafs.FileSystem, folder: str, name: str, *, purpose: str, what: str, ttl_s: float = DEFAULT_TTL_S
) -> Iterator[dict]:
    """Hold the lease `folder/name` for the block; LeaseHeld (naming `what` and the holder) if another has it."""
    fs.create_dir(folder, recursive=True)
    if isinstance(fs, pafs.LocalFileSystem):
        with _local(f"{folder}/{name}", purpose, what) as held:
            yield held
    else:
        with _object(fs, f"{folder}/{name}", purpose, what, ttl_s) as held:
            yield held


@contextmanager
def _local(path: str, purpose: str, what: str) -> Iterator[dict]:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise LeaseHeld(what, _read_holder(fd)) from None
        held = _holder(purpose)
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(held).encode(), 0)
        try:
            yield held
        finally:
            os.ftruncate(fd, 0)
    finally:
        os.close(fd)  # releases the lock


def _read_holder(fd: int) -> dict:
    try:
        return json.loads(os.pread(fd, 4096, 0) or b"{}")
    except (OSError, ValueError):
        return {}


@contextmanager
def _object(fs: pafs.FileSystem, path: str, purpose: str, what: str, ttl_s: float) -> Iterator[dict]:
    current = _read_object(fs, path)
    if current and current.get("expires", 0) > time.time():
        raise LeaseHeld(what, current)
    held = _holder(purpose) | {"token": secrets.token_hex(8)}
    _write_object(fs, path, held, ttl_s)
    time.sleep(SETTLE_S)
    current = _read_object(fs, path)
    if not current or current.get("token") != held["token"]:
        raise LeaseHeld(what, current or {})
    stop = threading.Event()
    renewer = threading.Thread(target=_renew, args=(fs, path, held, ttl_s, stop), daemon=True)
    renewer.start()
    try:
        yield held
    finally:
        stop.set()
        renewer.join()
        current = _read_object(fs, path)
        if current and current.get("token") == held["token"]:
            fs.delete_file(path)


def _renew(fs: pafs.FileSystem, path: str, held: dict, ttl_s: float, stop: threading.Event) -> None:
    while not stop.wait(ttl_s / 3):
        try:
            _write_object(fs, path, held, ttl_s)
        except OSError:
            continue  # the next renewal tries again; the lease expires only after ttl_s without one


def _write_object(fs: pafs.FileSystem, path: str, held: dict, ttl_s: float) -> None:
    with fs.open_output_stream(path) as out:
        out.write(json.dumps(held | {"expires": time.time() + ttl_s}).encode())


def _read_object(fs: pafs.FileSystem, path: str) -> dict | None:
    try:
        with fs.open_input_stream(path) as f:
            return json.loads(f.read() or b"{}")
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return {}  # unreadable: treated as expired
