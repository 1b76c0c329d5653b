"""Collective micro-benchmarks on the ranks a group's cells use: all-reduce time by message size (as
nccl-tests define algbw and busbw), with a check of the reduced values, and the parameter broadcast DDP's
constructor does. Call on every rank of an initialized process group; rank 0 gets the rows.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import nn

from trainers.errors import DDPSweepError
from trainers.replica import gather_max
from trainers.timing import time_steps

AllReduce = Callable[[torch.Tensor], None]


class CalibrationError(DDPSweepError):
    """An all-reduce returned a wrong value: the collective (or the link) is broken, not slow."""


def sizes_up_to(max_bytes: int, *, start: int = 4096, factor: int = 4) -> list[int]:
    """Message sizes start, start·factor, … up to and including one at or above max_bytes."""
    sizes = [start]
    while sizes[-1] < max_bytes:
        sizes.append(sizes[-1] * factor)
    return sizes


def _wrong_value(t: torch.Tensor, world: int) -> str | None:
    """Every element of an all-reduce (sum) of `rank + 1` must be world·(world+1)/2, exactly (nccl-tests' -c)."""
    expected = world * (world + 1) / 2
    wrong = (t != expected).nonzero()
    if not len(wrong):
        return None
    i = int(wrong[0][0])
    return (
        f"all-reduce of {t.numel() * 4} bytes returned {float(t[i])} at element {i}; expected {expected:g} "
        f"({len(wrong)} wrong element(s))"
    )


def _any_rank(flag: bool, device: torch.device) -> bool:
    t = torch.tensor([float(flag)], device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item() > 0


def _row(kind: str, size: int, times: list[float], world: int) -> dict:
    ms = statistics.median(times)
    algbw = size / (ms / 1e3)  # bytes/s
    return {
        "kind": kind,
        "size_bytes": size,
        "time_ms": ms,
        "times_ms": times,
        "iters": len(times),
        "algbw_gbps": algbw / 1e9,
        "busbw_gbps": algbw * 2 * (world - 1) / world / 1e9,
    }


BUDGET_MS = 200.0  # timed all-reduces per size: at least `iters`, more where they take less than this in all
MAX_ITERS = 200


def allreduce_sweep(
    sizes: list[int], device: torch.device, *, warmup: int = 5, iters: int = 10, all_reduce: AllReduce = dist.all_reduce
) -> list[dict] | None:
    """Per size: the slowest rank's time per all-reduce (median over its iterations), algbw, busbw. Each size
    runs at least `iters` timed all-reduces and as many more as fill BUDGET_MS (at most MAX_ITERS): a small
    message's median of 10 lands on either mode where a few of them stall (on a 2-vCPU VM: 4 ms stalls, the
    timer tick, in a tenth of 64 KB all-reduces). The values are checked after every size; a wrong one raises
    CalibrationError on every rank."""
    world, rank = dist.get_world_size(), dist.get_rank()
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    rows = []
    for size in sizes:
        t = torch.empty(size // 4, dtype=torch.float32, device=device)  # fp32, as DDP's gradients
        op = lambda t=t: all_reduce(t)
        warm = time_steps(op, warmup, sync)
        times = time_steps(op, _iterations(warm, iters, device), sync)
        t.fill_(rank + 1)
        all_reduce(t)
        sync()
        error = _wrong_value(t, world)
        if _any_rank(error is not None, device):  # every rank stops, none is left waiting in a collective
            raise CalibrationError(error or f"all-reduce of {size} bytes returned a wrong value on another rank")
        rows.append(_row("all_reduce", size, gather_max(times, device), world))
        del t
    return rows if rank == 0 else None


def _iterations(warm_ms: list[float], least: int, device: torch.device) -> int:
    """How many all-reduces fill BUDGET_MS at the warm-ups' median pace (between `least` and MAX_ITERS); the
    largest count of any rank, so that every rank runs the same number."""
    pace = statistics.median(warm_ms) if warm_ms else BUDGET_MS
    wanted = min(MAX_ITERS, max(least, math.ceil(BUDGET_MS / max(pace, 1e-3))))
    return int(gather_max([float(wanted)], device)[0])


def broadcast_time(model: nn.Module, device: torch.device, iters: int = 3) -> dict | None:
    """Broadcast every parameter from rank 0, as DDP's constructor does: one row, size = parameter bytes."""
    world = dist.get_world_size()
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    params = [p.detach() for p in model.parameters()]
    size = sum(p.numel() * p.element_size() for p in params)

    def op() -> None:
        for p in params:
            dist.broadcast(p, src=0)

    op()
    times = gather_max(time_steps(op, iters, sync), device)
    return _row("broadcast_params", size, times, world) if dist.get_rank() == 0 else None
