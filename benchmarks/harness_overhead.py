"""Does measuring slow what it measures? trainers.bench vs a bare DDP loop, interleaved, same config.

    python benchmarks/harness_overhead.py [--rounds 5] [--steps 30]

Both run under torchrun with 2 gloo ranks on the tiny preset. Prints each round and the ratio of the
median step times (harness / bare). Target: <= 1.02.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]


def launch(target: list[str], marker: str) -> str:
    """Run target under torchrun (2 ranks); return rank 0's line starting with marker."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([*TORCHRUN, *target], cwd=ROOT, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(target)} failed:\n{proc.stderr[-3000:]}")
    return next(line for line in proc.stdout.splitlines() if line.startswith(marker))


def run_harness(cfg: dict) -> float:
    args = [
        "--model",
        cfg["model"],
        "--micro-batch",
        cfg["mbs"],
        "--seq-len",
        cfg["seq"],
        "--bucket-cap-mb",
        cfg["bucket"],
        "--gas",
        cfg["gas"],
        "--warmup",
        cfg["warmup"],
        "--steps",
        cfg["steps"],
    ]
    args += ["--no-sync"] if cfg["no_sync"] else []
    return json.loads(launch(["-m", "trainers.bench", *map(str, args)], "{"))["step_ms"]


def run_bare(cfg: dict) -> float:
    keys = ["model", "mbs", "seq", "bucket", "gas", "no_sync", "warmup", "steps"]
    args = [str(int(cfg[k]) if k == "no_sync" else cfg[k]) for k in keys]
    return float(launch(["benchmarks/bare_ddp_loop.py", *args], "BARE").split()[1])


def instrumentation_cost_us(n: int = 200_000) -> float:
    """What trainers.timing.time_steps adds per step around an empty step (clock reads, sync call, append)."""
    import time

    from trainers.timing import time_steps

    t0 = time.perf_counter()
    time_steps(lambda: None, n, lambda: None)
    return (time.perf_counter() - t0) / n * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--steps", type=int, default=60)
    a = ap.parse_args()
    cfg = {
        "model": "tiny",
        "mbs": 8,
        "seq": 64,
        "bucket": 25.0,
        "gas": 2,
        "no_sync": True,
        "warmup": 5,
        "steps": a.steps,
    }
    harness, bare = [], []
    for i in range(a.rounds):  # interleaved, order alternating (ABBA), so drift and order hit both alike
        if i % 2 == 0:
            harness.append(run_harness(cfg))
            bare.append(run_bare(cfg))
        else:
            bare.append(run_bare(cfg))
            harness.append(run_harness(cfg))
        print(f"round {i}: harness {harness[-1]:.2f} ms  bare {bare[-1]:.2f} ms", flush=True)
    h, b = statistics.median(harness), statistics.median(bare)
    per_step_us = instrumentation_cost_us()
    print(
        f"instrumentation inside the timed loop: {per_step_us:.2f} us/step "
        f"= {per_step_us / 1e3 / h * 100:.4f}% of a {h:.1f} ms step"
    )
    print(f"median step: harness {h:.2f} ms, bare {b:.2f} ms, ratio harness/bare = {h / b:.4f} (target <= 1.02)")


if __name__ == "__main__":
    main()
