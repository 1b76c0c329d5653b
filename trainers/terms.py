"""The overlap model's terms beyond t(bytes) (results.model.overlap.Terms), measured on a group's own ranks
with its own workload:

- sharing g: the workload's forward and backward on rank 0 while the other ranks wait (solo, as the profile
  runs), and on every rank at once (alone: no communication, but the peers' compute beside it: on a CPU node
  they share the cores and the memory bandwidth): g = alone / solo, how much slower the profile's compute runs
  inside the group (the model scales all of it by g);
- contention κ: the forward and backward on every rank at once, alone and while all-reduces are in flight the
  whole time (queued before it starts, as DDP queues its buckets): κ = contended / alone − 1;
- the other side of it, λ: the same queue of all-reduces alone (W) and beside that compute (T, from their
  launch to the last one done; the compute took C): they run (1 + λ) times as long while compute runs, so
  1 + λ = C / (C + W − T) where they outlast the compute, T / W where they end inside it;
- per-bucket cost c: the backward of DDP with every parameter in a bucket of its own, and with one bucket, both
  under a hook that does the default hook's local work (divide by the world size) and sends nothing, so the
  difference is the reducer's work per bucket on the compute stream: c = (many − one) / (their bucket counts' gap).

The six arms take turns in every repeat, in reverse order every other repeat (after untimed warm-ups); each
time is the slowest rank's (solo: rank 0's), the device synchronized around it. Call on every rank of an
initialized process group; rank 0 gets the rows (calibration rows: kind, size_bytes — the gradient's, or the
contending all-reduce's —, buckets, time_ms = the median, times_ms per repeat).
"""

from __future__ import annotations

import copy
import math
import statistics
import time
from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from trainers.replica import autocast, gather_max
from trainers.timing import time_steps

REPEATS = 15
WARMUP = 3
MESSAGE_CAP = 25 * 2**20  # bytes: the contending all-reduce is the gradient's, at most PyTorch's default bucket
COVER = 1.5  # the queued all-reduces last at least this many forward + backwards


def _sync(device: torch.device) -> None:
    """Wait for everything queued on the device (every stream)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _compute_done(device: torch.device) -> None:
    """Wait for the compute stream only: NCCL's collectives run on their own stream and may still be in flight."""
    if device.type == "cuda":
        torch.cuda.current_stream(device).synchronize()


class _Counter:
    """The no-send hook's state: how many buckets it was handed."""

    def __init__(self, world: int) -> None:
        self.world, self.calls = world, 0


def _local_only(state: _Counter, bucket):  # unannotated: DDP refuses a string annotation
    """The default hook's work on this rank (the gradient divided by the world size), and nothing sent."""
    state.calls += 1
    fut: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    fut.set_result(bucket.buffer().div_(state.world))
    return fut


def _ddp(model: nn.Module, device: torch.device, cap_mb: float) -> tuple[DDP, _Counter]:
    module = DDP(
        copy.deepcopy(model), device_ids=[device.index] if device.type == "cuda" else None, bucket_cap_mb=cap_mb
    )
    counter = _Counter(dist.get_world_size())
    module.register_comm_hook(counter, _local_only)
    return module, counter


def _timed(
    module: nn.Module,
    loss_of: Callable,
    device: torch.device,
    queue: Callable = lambda: [],
    solo: bool = False,
    forward: bool = True,
    comm: list[float] | None = None,
) -> float:
    """One forward and backward's ms (with `forward` False, the backward's alone; every rank starts together);
    `queue` launches the collectives that run beside it, waited for after the timed region (`comm` gets the ms
    from their launch to the last one done). `solo`: rank 0 alone, the others wait (0 ms)."""
    if solo and dist.get_rank() != 0:
        dist.barrier()
        dist.barrier()
        return 0.0
    if not forward:
        with autocast(device):
            loss = loss_of(module)
        _sync(device)
    dist.barrier()
    launched = time.perf_counter()
    works = queue()
    t0 = time.perf_counter()
    if forward:
        with autocast(device):
            loss = loss_of(module)
    loss.backward()
    _compute_done(device)
    ms = (time.perf_counter() - t0) * 1e3
    for w in works:
        w.wait()
    _sync(device)
    if comm is not None:
        comm.append((time.perf_counter() - launched) * 1e3)
    module.zero_grad(set_to_none=True)
    if solo:
        dist.barrier()
    return ms


def _comm_alone(queue: Callable, device: torch.device) -> float:
    """The same collectives with no compute beside them: ms from their launch to the last one done."""
    dist.barrier()
    t0 = time.perf_counter()
    for w in queue():
        w.wait()
    _sync(device)
    return (time.perf_counter() - t0) * 1e3


def measure_terms(
    model: nn.Module, loss_of: Callable, device: torch.device, grad_bytes: int, repeats: int = REPEATS
) -> list[dict] | None:
    """The six arms on every rank (`loss_of(module)`: the workload's loss of one fixed micro-batch through
    `module`), `repeats` times after WARMUP; rank 0 gets seven calibration rows, the other ranks None."""
    alone_model = copy.deepcopy(model)
    size = min(grad_bytes, MESSAGE_CAP) // 4 * 4
    buf = torch.zeros(size // 4, dtype=torch.float32, device=device)
    many, many_count = _ddp(model, device, 1e-6)  # every parameter closes its own bucket
    one, one_count = _ddp(model, device, grad_bytes / 2**20 + 1)
    compute_ms = statistics.median(_timed(alone_model, loss_of, device) for _ in range(WARMUP))
    dist.all_reduce(buf)  # warm
    allreduce_ms = statistics.median(time_steps(lambda: dist.all_reduce(buf), 5, lambda: _sync(device)))
    launches = min(200, math.ceil(gather_max([COVER * compute_ms / allreduce_ms], device)[0]) + 1)  # every rank alike

    def queue() -> list:
        return [dist.all_reduce(buf, async_op=True) for _ in range(launches)]

    comm: list[float] = []  # the contended arm's collectives, launch to done
    arms = {
        "solo": lambda: _timed(alone_model, loss_of, device, solo=True),
        "alone": lambda: _timed(alone_model, loss_of, device),
        "contended": lambda: _timed(alone_model, loss_of, device, queue, comm=comm),
        "comm_alone": lambda: _comm_alone(queue, device),
        "many": lambda: _timed(many, loss_of, device, forward=False),  # c: the reducer's work in the backward
        "one": lambda: _timed(one, loss_of, device, forward=False),
    }
    times: dict[str, list[float]] = {name: [] for name in arms}
    for r in range(WARMUP + repeats):
        many_count.calls = one_count.calls = 0
        for name in list(arms) if r % 2 == 0 else list(arms)[::-1]:  # every arm early and late in turn
            ms = arms[name]()
            if r >= WARMUP:
                times[name].append(ms)
    times["comm_contended"] = comm[WARMUP:]
    slowest = {name: gather_max(ts, device) for name, ts in times.items()}
    if dist.get_rank() != 0:
        return None
    return [
        _row("compute_solo", slowest["solo"], size_bytes=grad_bytes),
        _row("compute_alone", slowest["alone"], size_bytes=grad_bytes),
        _row("compute_contended", slowest["contended"], size_bytes=size),
        _row("comm_alone", slowest["comm_alone"], size_bytes=size),
        _row("comm_contended", slowest["comm_contended"], size_bytes=size),
        _row("ddp_backward", slowest["many"], size_bytes=grad_bytes, buckets=many_count.calls),
        _row("ddp_backward", slowest["one"], size_bytes=grad_bytes, buckets=one_count.calls),
    ]


def _row(kind: str, times: list[float], *, size_bytes: int | None = None, buckets: int | None = None) -> dict:
    return {
        "kind": kind,
        "size_bytes": size_bytes,
        "buckets": buckets,
        "time_ms": statistics.median(times),
        "times_ms": times,
        "iters": len(times),
    }
