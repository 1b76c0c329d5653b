"""A minimal bare DDP loop of the same step as trainers.step (no harness): the reference for overhead.

torchrun --standalone --nproc_per_node=2 benchmarks/bare_ddp_loop.py tiny 8 64 25 4 1 5 30
args: model micro_batch seq_len bucket_cap_mb gas no_sync warmup steps. Rank 0 prints the median over
steps of the slowest rank's step time (ms), the statistic trainers.bench reports.
"""

import os
import statistics
import sys
import time
from contextlib import nullcontext

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from trainers.model import GPT, PRESETS

model_name, mbs, seq, bucket, gas, no_sync, warmup, steps = sys.argv[1:9]
mbs, seq, gas, warmup, steps, no_sync = int(mbs), int(seq), int(gas), int(warmup), int(steps), bool(int(no_sync))
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.set_num_threads(max(1, os.cpu_count() // int(os.environ["LOCAL_WORLD_SIZE"])))
torch.manual_seed(1337)
model = DDP(GPT(PRESETS[model_name]), bucket_cap_mb=float(bucket), gradient_as_bucket_view=True)
opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
g = torch.Generator().manual_seed(1338 + rank)
x = torch.randint(0, PRESETS[model_name].vocab_size, (mbs, seq), generator=g)


def one_step():
    for micro in range(gas):
        with model.no_sync() if no_sync and micro < gas - 1 else nullcontext():
            (model(x, x) / gas).backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


for _ in range(warmup):
    one_step()
dist.barrier()
times = []
for _ in range(steps):
    t0 = time.perf_counter()
    one_step()
    times.append((time.perf_counter() - t0) * 1e3)
# the same statistic as the harness: per step, the slowest rank (gathered after the loop)
every = [torch.zeros(steps, dtype=torch.float64) for _ in range(dist.get_world_size())]
dist.all_gather(every, torch.tensor(times, dtype=torch.float64))
slowest = torch.stack(every).max(dim=0).values.tolist()
if rank == 0:
    print(f"BARE {statistics.median(slowest)}", flush=True)
dist.barrier()
dist.destroy_process_group()
