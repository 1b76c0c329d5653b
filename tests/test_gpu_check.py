"""`make gpu-check` on a machine without CUDA, its specs through the real CLI's --dry-run (so they cannot rot),
and the device bundle's rule: only what the machine lacks goes on PYTHONPATH."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from typer.testing import CliRunner

from service.cli import app

ROOT = Path(__file__).resolve().parents[1]
SPECS = ROOT / "benchmarks" / "gpu_check"
GRIDS = {
    "1_main": "11 cells x 3 repeat(s) = 33 measurements in 1 worker group(s)",
    "2_timing": "6 cells x 5 repeat(s) = 30 measurements in 1 worker group(s)",
    "3_hooks": "4 cells x 2 repeat(s) = 8 measurements in 1 worker group(s)",
    "3_workload": "3 cells x 2 repeat(s) = 6 measurements in 1 worker group(s)",
    "3_isolation": "2 cells x 2 repeat(s) = 4 measurements in 4 worker group(s)",
    "4_compile": "8 cells x 1 repeat(s) = 8 measurements in 1 worker group(s)",
}


def test_gpu_check_says_it_needs_a_gpu_and_exits_0_without_one(tmp_path):
    env = os.environ | {"PYTHON": sys.executable, "OUT": str(tmp_path / "out")}
    done = subprocess.run(["bash", "benchmarks/gpu_check.sh"], cwd=ROOT, env=env, capture_output=True, text=True)
    assert done.returncode == 0
    assert done.stdout.strip().splitlines() == [
        "make gpu-check needs a CUDA GPU (torch.cuda.is_available() is not True here): nothing run"
    ]
    assert not (tmp_path / "out").exists()  # nothing started, nothing written


def test_every_gpu_check_part_is_run_by_the_script():
    script = (ROOT / "benchmarks" / "gpu_check.sh").read_text()
    assert {p.stem for p in SPECS.glob("*.yaml")} == set(GRIDS)
    assert all(f"sweep {name} " in script for name in GRIDS)


@pytest.mark.parametrize("name", sorted(GRIDS))
def test_gpu_check_specs_dry_run_to_their_grid(name, tmp_path):
    result = CliRunner().invoke(app, ["run", str(SPECS / f"{name}.yaml"), "--dry-run", "--results", str(tmp_path)])
    lines = result.output.strip().splitlines()
    assert GRIDS[name] in lines
    # the one complaint on this CPU machine is the GPU itself: everything else in the spec is valid
    assert result.exit_code in (0, 2) and [x for x in lines if x.startswith("error:")] in (
        [],
        [
            "error: use_gpu: got True; allowed: false or auto: the cluster has no GPUs (1 node(s): "
            f"{os.cpu_count()} CPU/0 GPU)"
        ],
    )


def _dist(tar: tarfile.TarFile, folder: str, name: str) -> None:
    data = f"Metadata-Version: 2.1\nName: {name}\nVersion: 9.9\n".encode()
    info = tarfile.TarInfo(f"./site/{folder}/{name}-9.9.dist-info/METADATA")
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def test_the_bundle_adds_only_what_this_python_lacks(tmp_path):
    bundle = tmp_path / "bundle.tar.xz"
    with tarfile.open(bundle, "w:xz") as tar:
        _dist(tar, "pandas", "pandas")  # installed here: must not shadow it
        _dist(tar, "ddpsweep_absent_dist", "ddpsweep_absent_dist")
        version = b"python test ray none\n"
        info = tarfile.TarInfo("./VERSION")
        info.size = len(version)
        tar.addfile(info, io.BytesIO(version))
    env = os.environ | {"PYTHON": sys.executable, "DEVICE_SITE": str(tmp_path / "site"), "PYTHONPATH": "/keep"}
    command = f"source benchmarks/device_env.sh {bundle} && echo PYTHONPATH=$PYTHONPATH"
    done = subprocess.run(["bash", "-c", command], cwd=ROOT, env=env, capture_output=True, text=True, check=True)
    path = done.stdout.strip().splitlines()[-1].removeprefix("PYTHONPATH=").split(":")
    assert path == [str(ROOT), str(tmp_path / "site" / "site" / "ddpsweep_absent_dist"), "/keep"]
    assert "on PYTHONPATH: 1 distributions" in done.stdout


def test_part_0_runs_the_calibration_code_on_one_rank(tmp_path):
    out = tmp_path / "calibration_path.json"
    script = ROOT / "benchmarks" / "gpu_calibration_path.py"
    subprocess.run([sys.executable, str(script), str(out)], cwd=ROOT, check=True, capture_output=True, timeout=120)
    ran = json.loads(out.read_text())
    sizes = [r["size_bytes"] for r in ran["rows"] if r["kind"] == "all_reduce"]
    assert ran["backend"] == "gloo" and sizes == [4096 * 4**i for i in range(8)]  # 4 KiB .. 64 MiB on CPU
    assert all(r["iters"] == 10 and r["time_ms"] > 0 and r["busbw_gbps"] == 0 for r in ran["rows"][:-1])
    assert ran["rows"][-1]["kind"] == "broadcast_params" and ran["rows"][-1]["size_bytes"] > 0
