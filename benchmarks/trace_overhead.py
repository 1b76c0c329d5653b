"""Does the comm-tracing hook change the numbers? Step time with trace_comm on / off, measured in
interleaved pairs in one warm process group (ABBA order), target <= 1.01.

    torchrun --standalone --nproc_per_node=2 benchmarks/trace_overhead.py [--model small] [--pairs 12]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from trainers.config import StepConfig  # noqa: E402
from trainers.replica import build_model  # noqa: E402
from trainers.step import release, run_cell  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="small")
    ap.add_argument("--pairs", type=int, default=12)
    ap.add_argument("--bucket-cap-mb", type=float, default=1.0)
    args = ap.parse_args()
    dist.init_process_group("gloo")
    threads = max(1, (os.cpu_count() or 1) // dist.get_world_size())
    cfg = StepConfig(
        model=args.model, micro_batch=4, seq_len=64, bucket_cap_mb=args.bucket_cap_mb, warmup_steps=3, timed_steps=20
    )
    template = build_model(cfg, torch.device("cpu"))
    run_cell(cfg, torch.device("cpu"), threads, template)  # warm the processes
    ratios = []
    for i in range(args.pairs):
        order = (False, True) if i % 2 == 0 else (True, False)  # ABBA: drift cancels
        ms = {}
        for traced in order:
            m = run_cell(dataclasses.replace(cfg, trace_comm=traced), torch.device("cpu"), threads, template)
            release(torch.device("cpu"))
            ms[traced] = m.step_ms if m else None
        if dist.get_rank() == 0:
            ratios.append(ms[True] / ms[False])
    if dist.get_rank() == 0:
        boot = sorted(
            statistics.median(ratios[j] for j in torch.randint(len(ratios), (len(ratios),)).tolist())
            for _ in range(2000)
        )
        print(f"{args.model}, bucket {args.bucket_cap_mb:g} MB, {dist.get_world_size()} gloo ranks, {args.pairs} pairs")
        print(
            f"step time trace on / off: median {statistics.median(ratios):.4f} "
            f"[{boot[50]:.4f}, {boot[1949]:.4f}] (95%, bootstrap over pairs); target <= 1.01"
        )
        print("per pair: " + " ".join(f"{r:.3f}" for r in ratios))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
