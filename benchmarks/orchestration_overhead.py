"""Where does a Ray trial's time go? The smoke grid through ddpsweep (Ray Tune + Train) beside the
seed's way (one torchrun launch of trainers.bench per cell), measured in one run.

    python benchmarks/orchestration_overhead.py [--spec sweeps/specs/smoke.yaml]

Prints per cell: wall time and overhead (wall − (warmup + timed) × step_ms) for both paths, and the
ratio of step_ms measured through Ray to step_ms under torchrun (target: within 2%).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from sweeps.grid import Cell  # noqa: E402
from sweeps.runner import execute, plan_sweep  # noqa: E402
from sweeps.spec import load_spec  # noqa: E402


def torchrun_cell(cell: Cell, threads: int) -> tuple[float, float]:
    """(wall s, step_ms) of one launch of trainers.bench for the cell."""
    launcher = [sys.executable, "-m", "trainers.bench"] if cell.mode == "single" else [
        sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={cell.world_size}",
        "-m", "trainers.bench"]  # fmt: skip
    args = ["--model", cell.model, "--mode", cell.mode, "--micro-batch", str(cell.micro_batch), "--seq-len",
            str(cell.seq_len), "--gas", str(cell.gas), "--warmup", str(cell.warmup_steps), "--steps",
            str(cell.timed_steps), "--threads", str(threads), "--device", "cpu",
            "--bucket-cap-mb", str(cell.bucket_cap_mb or 25)] + (["--no-sync"] if cell.no_sync else [])  # fmt: skip
    t0 = time.perf_counter()
    out = subprocess.run([*launcher, *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    wall = time.perf_counter() - t0
    return wall, json.loads(next(x for x in out.splitlines() if x.startswith("{")))["step_ms"]


def noop_fn_per_worker(config: dict) -> None:
    """Ray Train's fixed cost: a worker group that does nothing."""


def bare_fit_s(repeats: int = 3) -> float:
    """Median wall time of TorchTrainer.fit() with 2 gloo workers doing nothing (Ray started, same env)."""
    import ray
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    from sweeps.trial import TRAIN_ENV

    os.environ.update(TRAIN_ENV)
    walls = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(repeats):
            trainer = TorchTrainer(noop_fn_per_worker, scaling_config=ScalingConfig(num_workers=2),
                                   torch_config=TorchConfig(backend="gloo"),
                                   run_config=RunConfig(name=f"noop-{i}", storage_path=tmp))  # fmt: skip
            t0 = time.perf_counter()
            trainer.fit()
            walls.append(time.perf_counter() - t0)
    assert ray.is_initialized()
    return statistics.median(walls)


def work_s(cell: Cell, step_ms: float) -> float:
    return (cell.warmup_steps + cell.timed_steps) * step_ms / 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--spec", default=str(ROOT / "sweeps/specs/smoke.yaml"))
    ap.add_argument("--timed-steps", type=int, default=40, help="override the spec's (more steps, less noise)")
    args = ap.parse_args()
    spec = dataclasses.replace(load_spec(args.spec), timed_steps=args.timed_steps)
    threads = max(1, int(spec.cpus_per_worker))
    import ray

    ray.init(num_cpus=os.cpu_count(), include_dashboard=True, dashboard_host="127.0.0.1", log_to_driver=False)
    noop = bare_fit_s()
    with tempfile.TemporaryDirectory() as tmp:
        plan = plan_sweep(spec, results=tmp)
        t0 = time.perf_counter()
        rows = {r["cell_id"]: r for r in execute(plan).rows}
        sweep_wall = time.perf_counter() - t0
    ray.shutdown()
    print(f"{'cell':<13}{'mode':<7}{'bkt':>6}{'gas':>4}{'ns':>3} | {'ray wall':>8}{'ovh':>7} | "
          f"{'trun wall':>9}{'ovh':>7} | {'ray ms':>8}{'trun ms':>8}{'ratio':>7}")  # fmt: skip
    ratios, ray_ovh, tr_ovh, tr_total = [], [], [], 0.0
    for cell in plan.cells:
        row = rows[cell.cell_id]
        wall, tr_ms = torchrun_cell(cell, threads)
        tr_total += wall
        ro, to = row["trial_wall_s"] - work_s(cell, row["step_ms"]), wall - work_s(cell, tr_ms)
        ratios.append(row["step_ms"] / tr_ms)
        ray_ovh.append(ro)
        tr_ovh.append(to)
        bucket = "-" if cell.bucket_cap_mb is None else f"{cell.bucket_cap_mb:g}"
        print(f"{cell.cell_id:<13}{cell.mode:<7}{bucket:>6}{cell.gas:>4}{int(cell.no_sync):>3} | "
              f"{row['trial_wall_s']:8.2f}{ro:7.2f} | {wall:9.2f}{to:7.2f} | "
              f"{row['step_ms']:8.2f}{tr_ms:8.2f}{ratios[-1]:7.3f}")  # fmt: skip
    print(
        f"\nmedian per-cell overhead: Ray trial {statistics.median(ray_ovh):.2f} s, "
        f"torchrun launch {statistics.median(tr_ovh):.2f} s"
    )
    print(f"of which Ray Train's own: a no-op TorchTrainer.fit() with 2 gloo workers takes {noop:.2f} s here")
    print(f"whole grid: ddpsweep {sweep_wall:.1f} s (Ray already up), torchrun loop {tr_total:.1f} s")
    print(
        f"step_ms Ray / torchrun: median ratio {statistics.median(ratios):.3f}, "
        f"range {min(ratios):.3f}..{max(ratios):.3f} (target within 2%)"
    )


if __name__ == "__main__":
    main()
