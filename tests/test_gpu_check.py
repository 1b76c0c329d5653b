"""`make gpu-check` on a machine without CUDA, its specs through the real CLI's --dry-run (so they cannot rot),
and the device bundle's rule: only what the machine lacks goes on PYTHONPATH."""

from __future__ import annotations

import io
import json
import os
import re
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
    "1_main": "8 cells x 2 repeat(s) = 16 measurements in 1 worker group(s)",
    "2_timing": "6 cells x 3 repeat(s) = 18 measurements in 1 worker group(s)",
    "3_hooks": "4 cells x 1 repeat(s) = 4 measurements in 1 worker group(s)",
    "3_workload": "2 cells x 1 repeat(s) = 2 measurements in 1 worker group(s)",
    "4_compile": "4 cells x 1 repeat(s) = 4 measurements in 1 worker group(s)",
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
    assert all(f"sweep {name}\n" in script for name in GRIDS)


def test_the_part_limits_fit_a_lent_gpu_machine():
    """The device allows 15 minutes in all, its start included: the parts' limits sum to at most 270 s, and the
    script prints that sum up front."""
    script = (ROOT / "benchmarks" / "gpu_check.sh").read_text()
    (parts,) = re.findall(r"^PARTS=\((.*)\)$", script, re.M)
    limits = {p.split(":")[0]: int(p.split(":")[1]) for p in parts.split()}
    assert set(GRIDS) | {"0_calibration_path", "1_predict"} == set(limits)
    assert sum(limits.values()) <= 270 and 'echo "limits sum: $total s"' in script


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
    from trainers.collectives import MAX_ITERS

    out = tmp_path / "calibration_path.json"
    script = ROOT / "benchmarks" / "gpu_calibration_path.py"
    subprocess.run([sys.executable, str(script), str(out)], cwd=ROOT, check=True, capture_output=True, timeout=120)
    ran = json.loads(out.read_text())
    sizes = [r["size_bytes"] for r in ran["rows"] if r["kind"] == "all_reduce"]
    assert ran["backend"] == "gloo" and sizes == [4096 * 4**i for i in range(8)]  # 4 KiB .. 64 MiB on CPU
    collectives = [r for r in ran["rows"] if r["kind"] in ("all_reduce", "broadcast_params")]
    assert all(10 <= r["iters"] <= MAX_ITERS and r["time_ms"] > 0 and r["busbw_gbps"] == 0 for r in collectives[:-1])
    assert collectives[0]["iters"] == MAX_ITERS  # a 4 KiB all-reduce on one rank: far more than 10 fill the budget
    assert collectives[-1]["kind"] == "broadcast_params" and collectives[-1]["size_bytes"] > 0
    terms = [(r["kind"], r["buckets"], r["iters"]) for r in ran["rows"][len(collectives) :]]
    arms = ["compute_solo", "compute_alone", "compute_contended", "comm_alone", "comm_contended"]
    assert terms == [(k, None, 10) for k in arms] + [
        ("ddp_backward", b, 10) for b in (28, 1)
    ]  # the overlap terms: the tiny GPT's 28 parameters each in a bucket of its own, then all in one


def test_the_summary_sets_world_size_1_cells_beside_the_profile(tmp_path):
    """Part 1's shape on CPU: `predict` stores the profile (no calibration needed at world size 1), the cells
    measure 10% slower than predicted, and the summary's section says so per cell and per curve."""
    from dataclasses import asdict

    import torch

    sys.path.insert(0, str(ROOT / "benchmarks"))
    import gpu_summary

    from results.storage.schema import COLUMNS
    from results.storage.store import Store
    from sweeps.spec.files import parse_spec
    from tests.test_identity import base
    from trainers import workload

    text = (SPECS / "1_main.yaml").read_text().replace("model: gpt2-124m", "model: tiny")
    text = text.replace("micro_batch: 12", "micro_batch: 4").replace("seq_len: 1024", "seq_len: 32")
    text = text.replace("backend: nccl", "backend: gloo").replace("use_gpu: true", "use_gpu: false")
    spec_path = tmp_path / "1_main.yaml"
    spec_path.write_text(text.replace("cpus_per_worker: 4", "cpus_per_worker: 1"))
    root = str(tmp_path / "r")
    out = CliRunner().invoke(app, ["predict", str(spec_path), "--results", root, "--format", "json"])
    assert out.exit_code == 0, out.output
    predicted = {c["cell_id"]: c["predicted_ms"] for c in json.loads(out.output)}
    store = Store.open(root)
    from sweeps.plan.grid import expand

    for cell in (c for c in expand(parse_spec(spec_path.read_text())) if c.step.mode == "ddp"):
        knobs = asdict(cell.step) | {"world_size": 1, "num_nodes": 1, "backend": "gloo", "env_grid": "{}"}
        for rep in range(3):
            r = base("gpu-check", rep, predicted[cell.cell_id] * 1.1) | knobs | {"cell_id": cell.cell_id}
            r |= {"device_type": "cpu", "torch_version": torch.__version__, "workers_per_node": 1}
            r |= {"grad_bytes": sum(workload.planned(cell.step)[2])}  # the model the profile is of
            store.write_row({k: v for k, v in r.items() if k in set(COLUMNS)} | {"sweep_id": "1_main"})
    from results.storage.store import load

    lines = gpu_summary.prediction_lines(root, load(root))
    cells = [line for line in lines if line.startswith("| ") and line.endswith("% |")]
    assert len(cells) == 6 and all(line.endswith("| -9.1% |") for line in cells)  # 1 / 1.1 - 1
    assert sum(line.startswith("- gas ") and "median |error| 9.1% over 2 cells" in line for line in lines) == 3
    rows = load(root).assign(mode="ddp", grad_check="exact", grad_rel_error=0.0, grad_tol=1e-7, grad_check_ms=5.0)
    first = gpu_summary.summary(root).split("\n## ")[1]  # the first section: the one-rank gradient check
    assert first.startswith("Gradient check at world size 1") and "no DDP measurement was checked" in first
    assert gpu_summary.grad_check_lines(rows) == [
        "- tiny hook=none: exact 18; error median 0.00e+00 [0.00e+00, 0.00e+00], tolerance up to 1.00e-07; "
        "check 5 ms median"
    ]
