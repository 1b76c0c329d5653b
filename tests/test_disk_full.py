"""A results root on a full or read-only device (hardening round 3), on a real tmpfs mount (needs root).

A sweep that fills the disk stops with one line and the command that resumes it (exit 2), leaves no
temporary file, keeps every row it wrote; `compact` on the full disk is one line too; with space freed the
resume measures exactly what is missing. A read-only root is refused before Ray starts."""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path

import pytest

from results.storage.store import Store, load
from tests.test_cli_sweep import SMOKE, ddpsweep

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root")


def mount_tmpfs(path: Path, size: str, *options: str) -> None:
    path.mkdir(parents=True, exist_ok=True)
    opts = ",".join([f"size={size}", *options])
    subprocess.run(["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(path)], check=True)


@pytest.fixture
def small_disk(tmp_path):
    path = tmp_path / "disk"
    mount_tmpfs(path, "80k")  # the claim, the manifest and two rows of about 25 KB, not more
    yield path
    subprocess.run(["umount", "-l", str(path)], check=False)


def hidden_temporaries(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.name.endswith(".tmp") or p.name.startswith(".probe-")]


@pytest.mark.ray
def test_a_full_disk_stops_the_sweep_with_a_resume_command_and_resume_completes_it(tmp_path, small_disk, shared_head):
    spec = tmp_path / "mini.yaml"
    small = {
        "gas: [1, 2]": "gas: [1]",
        "repeats: 3": "repeats: 2",
        "bucket_cap_mb: [0.05, 0.25, 25]": "bucket_cap_mb: [25]",
    }
    text = SMOKE.read_text()
    for old, new in small.items():
        text = text.replace(old, new)
    spec.write_text(text)  # a baseline and one DDP cell, 2 rounds: 4 measurements, 2 rows fit on the disk
    proc = ddpsweep("run", str(spec), "--results", str(small_disk), "--sweep", "full", *shared_head)
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 2, err[-3000:]
    assert "Traceback" not in err and "TuneError" not in err, err[-3000:]
    lines = err.strip().splitlines()
    assert lines[-2].startswith(f"error: --results '{small_disk}': no space left on its device"), err[-2000:]
    assert lines[-1].startswith("free space, then continue it with: ddpsweep run")
    assert hidden_temporaries(small_disk) == []
    before = load(str(small_disk))
    assert 1 <= len(before) < 4 and set(before["status"]) == {"ok"}

    compact = ddpsweep("compact", "--results", str(small_disk))
    _, cerr = compact.communicate(timeout=120)
    assert compact.returncode == 2 and "no space left" in cerr and "Traceback" not in cerr, cerr[-2000:]
    assert hidden_temporaries(small_disk) == [] and len(load(str(small_disk))) == len(before)

    subprocess.run(["mount", "-o", "remount,size=4m", str(small_disk)], check=True)  # space freed
    resume = ddpsweep(*shlex.split(lines[-1].split(": ", 1)[1])[1:], *shared_head)
    rout, rerr = resume.communicate(timeout=600)
    assert resume.returncode == 0, rerr[-3000:]
    assert f"{4 - len(before)} of 4 measurements to run" in rout
    after = load(str(small_disk))
    assert len(after) == 4 and not after.duplicated(["cell_id", "repeat"]).any()
    kept = after.set_index(["cell_id", "repeat"]).loc[list(before.set_index(["cell_id", "repeat"]).index)]
    assert list(kept["step_ms"]) == list(before["step_ms"])  # the rows written before the disk filled, unchanged


def test_a_read_only_root_is_refused_before_ray_starts(tmp_path):
    root = tmp_path / "ro"
    mount_tmpfs(root, "1m", "ro")
    try:
        proc = ddpsweep("run", str(SMOKE), "--results", str(root))
        out, err = proc.communicate(timeout=120)
    finally:
        subprocess.run(["umount", "-l", str(root)], check=False)
    assert proc.returncode == 2, err[-3000:]
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: --results '{root}': cannot write there"), err[-2000:]
    assert "Read-only file system" in lines[0]
    assert "[1/" not in out  # refused before anything was measured
    assert not Store.open(str(tmp_path)).files()
