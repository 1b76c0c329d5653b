"""This machine, for an embedded sweep: other sweeps measuring on it, a `ray start` cluster, stale temp folders,
and what an interrupted embedded Ray leaves behind.

Two sweeps on one machine measure each other's contention (one cell read 306 ms instead of 60 ms), so each
embedded sweep holds an exclusive lock on its own file in a shared folder while it measures; a new sweep
that finds a locked file warns. A file whose lock can be taken belongs to a sweep that has ended (even by
SIGKILL: the kernel drops the lock with the process) and is removed.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

LOCK_DIR = Path(tempfile.gettempdir()) / "ddpsweep-measuring"
RAY_CURRENT_CLUSTER = Path(tempfile.gettempdir()) / "ray" / "ray_current_cluster"
STORAGE_PREFIX = "ddpsweep-"  # Tune/Train bookkeeping folders: ddpsweep-<sweep id>-pid<pid>-<random>


def _holders(lock_dir: Path, own: Path | None) -> list[str]:
    """Descriptions of the sweeps whose lock files are locked now; stale files are removed."""
    found = []
    for path in sorted(lock_dir.glob("*.lock")):
        if path == own:
            continue
        try:
            with open(path, "a+") as f:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                path.unlink(missing_ok=True)  # we got the lock: its sweep is gone
        except BlockingIOError:
            found.append(path.read_text().strip() or path.stem)
        except OSError:
            continue
    return found


@contextmanager
def measuring(sweep_id: str, lock_dir: Path = LOCK_DIR) -> Iterator[list[str]]:
    """Hold this sweep's measuring lock; yields the other sweeps measuring on this machine right now."""
    lock_dir.mkdir(mode=0o1777, parents=True, exist_ok=True)
    path = lock_dir / f"{os.getpid()}-{sweep_id}.lock"
    with open(path, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        f.write(f"sweep {sweep_id} (pid {os.getpid()})\n")
        f.flush()
        try:
            yield _holders(lock_dir, path)
        finally:
            path.unlink(missing_ok=True)


def sweeps_measuring(lock_dir: Path = LOCK_DIR) -> set[str]:
    """Ids of the sweeps measuring on this machine right now (their lock files are locked)."""
    if not lock_dir.is_dir():
        return set()
    names = {p.read_text().split()[1] for p in lock_dir.glob("*.lock") if p.is_file() and p.read_text().strip()}
    held = set(_holders(lock_dir, None))
    return {n for n in names if any(h.startswith(f"sweep {n} ") for h in held)}


def local_ray_cluster_running() -> bool:
    """Whether `ray start --head` left a cluster address on this machine (the embedded sweep ignores it)."""
    return RAY_CURRENT_CLUSTER.is_file()


def storage_dir(sweep_id: str) -> str:
    """A fresh local folder for Tune/Train bookkeeping; the pid in its name lets a later run remove it."""
    return tempfile.mkdtemp(prefix=f"{STORAGE_PREFIX}{sweep_id}-pid{os.getpid()}-")


def remove_stale_storage(tmp: Path | None = None) -> list[Path]:
    """Remove bookkeeping folders of sweeps whose process is gone (a SIGKILLed driver cannot clean up)."""
    tmp = tmp or Path(tempfile.gettempdir())
    removed = []
    for path in tmp.glob(f"{STORAGE_PREFIX}*-pid*-*"):
        pid = path.name.rsplit("-pid", 1)[-1].split("-", 1)[0]
        if path.is_dir() and pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _session_pattern(driver_pid: int) -> re.Pattern[str]:
    """Ray names a session folder session_<date>_<time>_<µs>_<pid of the driver that started it>."""
    return re.compile(rf"/session_\d{{4}}-\d\d-\d\d_\d\d-\d\d-\d\d_\d+_{driver_pid}(?![0-9])")


def session_processes(driver_pid: int | None = None) -> list:
    """The processes of the embedded Ray this driver started (psutil), found while it still runs: those whose
    command line names the driver's own session folder, and their descendants (the raylet's agents rename
    themselves `ray::DashboardAgent`, so their command line no longer names it)."""
    import psutil

    pattern = _session_pattern(driver_pid or os.getpid())
    found: dict[int, psutil.Process] = {}
    for proc in psutil.process_iter(["pid", "cmdline"]):
        if proc.info["pid"] == os.getpid() or not pattern.search(" ".join(proc.info["cmdline"] or ())):
            continue
        with contextlib.suppress(psutil.Error):
            for p in [proc, *proc.children(recursive=True)]:
                found[p.pid] = p
    return list(found.values())


def end_processes(processes: list, grace_s: float = 2.0) -> list[int]:
    """Terminate what is still running of `processes` (SIGKILL after `grace_s`); their pids."""
    import psutil

    alive = [p for p in processes if _running(p)]
    for proc in alive:
        with contextlib.suppress(psutil.Error):
            proc.terminate()
    deadline = time.monotonic() + grace_s
    stubborn = alive
    while stubborn and time.monotonic() < deadline:
        time.sleep(0.02)
        stubborn = [p for p in stubborn if _running(p)]
    for proc in stubborn:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    return [p.pid for p in alive]


def _running(proc) -> bool:
    """Alive and not a zombie: the dashboard's processes exit within ~40 ms of SIGTERM but stay zombies until
    whoever inherits them reaps them (psutil.wait_procs waited ~1.6 s of every sweep's end for that)."""
    import psutil

    try:
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False
