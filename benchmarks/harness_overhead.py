"""Does measuring slow what it measures? trainers.bench vs a bare DDP loop, interleaved, same config.

    python benchmarks/harness_overhead.py [--rounds 5] [--steps 30]

Both run under torchrun with 2 gloo ranks on the tiny preset. Prints each round and the ratio of the
median step times (harness / bare). Target: <= 1.02.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]


def run_harness(cfg: dict) -> float:
    args = [
        "--model",
        cfg["model"],
        "--micro-batch",
        str(cfg["mbs"]),
        "--seq-len",
        str(cfg["seq"]),
        "--bucket-cap-mb",
        str(cfg["bucket"]),
        "--gas",
        str(cfg["gas"]),
        "--warmup",
        str(cfg["warmup"]),
        "--steps",
        str(cfg["steps"]),
    ] + (["--no-sync"] if cfg["no_sync"] else [])
    out = subprocess.run(
        [*TORCHRUN, "-m", "trainers.bench", *args], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    return json.loads(next(line for line in out.splitlines() if line.startswith("{")))["step_ms"]


def run_bare(cfg: dict) -> float:
    args = [
        cfg["model"],
        cfg["mbs"],
        cfg["seq"],
        cfg["bucket"],
        cfg["gas"],
        int(cfg["no_sync"]),
        cfg["warmup"],
        cfg["steps"],
    ]
    out = subprocess.run(
        [*TORCHRUN, "benchmarks/bare_ddp_loop.py", *map(str, args)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONPATH": str(ROOT), **_env()},
    ).stdout
    return float(next(line for line in out.splitlines() if line.startswith("BARE")).split()[1])


def _env() -> dict:
    import os

    return dict(os.environ)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=30)
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
    for i in range(a.rounds):  # interleaved so drift in machine state hits both alike
        harness.append(run_harness(cfg))
        bare.append(run_bare(cfg))
        print(f"round {i}: harness {harness[-1]:.2f} ms  bare {bare[-1]:.2f} ms", flush=True)
    h, b = statistics.median(harness), statistics.median(bare)
    print(f"median step: harness {h:.2f} ms, bare {b:.2f} ms, ratio harness/bare = {h / b:.4f} (target <= 1.02)")


if __name__ == "__main__":
    main()
