"""`ddpsweep init`: the starter spec and workload written into a folder, both or neither, never over anything.

Each file is created with O_EXCL (so never through a link, dangling or not, and never over a file that appeared
meanwhile); where the second cannot be written the first is removed again, so a re-run starts from a clean slate.
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path

from trainers.errors import DDPSweepError

STARTER_DIR = Path(__file__).resolve().parent / "starter"
STARTER = ("spec.yaml", "my_workload.py")  # what `init` writes


class ScaffoldError(DDPSweepError):
    """The starter files could not be written (the folder is a file, a file or link is there, no permission)."""

    http_status = 409


def write_starter(folder: str) -> list[Path]:
    """Write STARTER into `folder` (made if missing); the paths written, in order."""
    target = Path(folder)
    if os.path.lexists(target) and not target.is_dir():
        raise ScaffoldError(f"{target}: not a folder (give a folder to write {' and '.join(STARTER)} into)")
    there = [str(target / n) for n in STARTER if os.path.lexists(target / n)]
    if there:
        raise ScaffoldError(f"{', '.join(there)}: already there (init never overwrites a file or follows a link)")
    written: list[Path] = []
    try:
        target.mkdir(parents=True, exist_ok=True)
        for name in STARTER:
            text = (STARTER_DIR / name).read_text()
            with open(target / name, "x", encoding="utf-8") as out:  # O_CREAT | O_EXCL: no link followed
                written.append(target / name)
                out.write(text)
    except OSError as e:
        for path in written:
            path.unlink(missing_ok=True)
        where = e.filename or target
        raise ScaffoldError(f"{where}: cannot write ({e.strerror or e}); nothing was written") from None
    return written


def next_step(folder: str) -> str:
    """The command to run next, from where the user stands (the spec names its workload relative to its folder)."""
    run = "ddpsweep run spec.yaml --dry-run"
    here = os.path.abspath(folder) == os.getcwd()
    return run if here else f"cd {shlex.quote(folder)} && {run}"
