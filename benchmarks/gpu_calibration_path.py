"""make gpu-check, part 0: the calibration code path on one GPU, outside Ray.

A sweep calibrates only groups of 2 or more ranks (one rank has no link to measure), so one GPU never runs
`trainers.collectives` through a sweep. This runs it directly on a 1-rank NCCL group: 20 iterations per
size up to gpt2-124m's gradient bytes, the value check, the parameter broadcast, and the overlap model's terms
(trainers.terms: the per-bucket cost c of DDP's reducer and compute's slowdown κ beside a running all-reduce,
micro-batch 2 x 1024, 10 repeats). It exercises the CUDA code (events, synchronization, the check), not a
network: busbw is 0 at one rank by definition, and κ is that of a 1-rank NCCL all-reduce beside the backward.

    python benchmarks/gpu_calibration_path.py OUT.json     (CPU: gloo, 10 iterations, sizes up to 64 MiB)
"""

from __future__ import annotations

import json
import os
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from trainers.collectives import allreduce_sweep, broadcast_time, sizes_up_to  # noqa: E402
from trainers.model import GPT, grad_bytes  # noqa: E402
from trainers.presets import PRESETS  # noqa: E402
from trainers.terms import measure_terms  # noqa: E402


def main(out: str) -> None:
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    port = 29500 + os.getpid() % 1000
    dist.init_process_group("nccl" if cuda else "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        model = GPT(PRESETS["gpt2-124m" if cuda else "tiny"]).to(device)
        top = grad_bytes(model) if cuda else 64 * 2**20  # bytes
        t0 = time.perf_counter()
        rows = allreduce_sweep(sizes_up_to(top), device, iters=20 if cuda else 10)
        rows.append(broadcast_time(model, device))
        tokens = torch.randint(0, model.cfg.vocab_size, (2, 1024 if cuda else 32), device=device)
        rows += measure_terms(model, lambda m: m(tokens, tokens), device, grad_bytes(model), repeats=10)
        wall = time.perf_counter() - t0
    finally:
        dist.destroy_process_group()
    with open(out, "w") as f:
        json.dump({"backend": "nccl" if cuda else "gloo", "wall_s": wall, "rows": rows}, f)
    print(f"calibration path: {len(rows)} rows in {wall:.1f} s -> {out}")


if __name__ == "__main__":
    main(sys.argv[1])
