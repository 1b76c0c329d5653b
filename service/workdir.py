"""A folder shipped to the cluster as a job's working directory, checked before anything is packaged.

Ray zips the folder (following symbolic links) and refuses a package over its gRPC message limit only after
hashing and zipping it. So, before a submission: the folder exists and is a folder (not `/`), no symbolic link
in it leads outside it (a link to /etc or ~/.ssh would ship what it points to) or back up into it (a loop
packaged copies of itself), and its files add up to less than Ray's limit — each one line naming the path.
"""

from __future__ import annotations

import os
from pathlib import Path

from trainers.errors import ConfigError

MAX_BYTES = 500 * 2**20  # under Ray's 512 MiB package limit (its gRPC message size), leaving room for the zip


def check_workdir(path: str | Path, *, what: str = "--workdir", max_bytes: int = MAX_BYTES) -> Path:
    """The folder, resolved, once it is safe and small enough to ship; ConfigError naming `what` otherwise."""
    root = Path(path).expanduser()
    if not root.is_dir():
        raise ConfigError(what, str(path), "an existing folder: the one that holds your workload's code")
    root = root.resolve()
    if root == Path(root.anchor):
        raise ConfigError(what, str(path), "a folder that holds your workload's code, not the filesystem root")
    total = 0
    for folder, dirs, files in os.walk(root):  # links are not followed: each one is checked instead
        for name in dirs + files:
            entry = Path(folder, name)
            if entry.is_symlink():
                _check_link(entry, root, what)
            elif name in files:
                total += entry.lstat().st_size
                if total > max_bytes:
                    raise ConfigError(
                        what,
                        str(path),
                        f"a folder of at most {max_bytes // 2**20} MiB of files (Ray refuses packages over 512 MiB): "
                        "one with only the workload's code",
                    )
    return root


def _check_link(link: Path, root: Path, what: str) -> None:
    target = link.resolve()
    inside = target == root or root in target.parents
    if not inside:
        raise ConfigError(
            what,
            str(root),
            f"a folder whose links stay inside it: {link.relative_to(root)} leads to {target}, which Ray would ship "
            "(remove the link, or copy what the workload needs into the folder)",
        )
    if target.is_dir() and (target == link.parent or target in link.parents):
        raise ConfigError(
            what, str(root), f"a folder without loops: {link.relative_to(root)} links back to a folder above it"
        )
