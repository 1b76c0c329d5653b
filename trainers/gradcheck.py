"""The gradient check: what a cell's DDP configuration computed, against an exact reference.

It runs after the timed steps (never inside them), on fixed check batches, one per rank and micro-step:

    reference   each rank's local gradients on a copy of the model outside DDP (no hook, no bucket), one
                micro-step at a time, in fp64; summed over the ranks in fp64 on the CPU through a gloo
                process group of the check's own (no NCCL setting and no hook reaches it); divided by W
    produced    the cell's DDP module on the same batches: its hook, buckets and no_sync pattern

    exact        the relative L2 error is within what fp32 reduction order explains (`tolerance`)
    approximate  a compressing hook (fp16, bf16, PowerSGD): its error is recorded, not judged
    failed       an exact configuration outside the tolerance: a wrong sum, whatever replicas_in_sync says

The tolerance. DDP's gradient is the sum of the n = W*G terms g_rm / W (W ranks, G micro-steps, g_rm one
rank's fp32 gradient of one micro-step) evaluated in fp32 in some order: autograd's accumulation over
micro-steps, DDP's division by W, the all-reduce's W-1 additions in the backend's order and the buckets'
layout; syncing every micro-step divides and re-sums the running average each time. Each term passes through
at most k = G (W + 1) roundings, so elementwise |ddp - ref| <= gamma_k * sum_rm |g_rm| / W with
gamma_k = k u / (1 - k u), u = 2**-24 (Higham, Accuracy and Stability of Numerical Algorithms, 2nd ed., §4.2:
any order of summation). In L2 over every parameter, with the triangle inequality over ranks,

    ||ddp - ref|| <= gamma_k * (1/W) * sum_r || sum_m |g_rm| ||

and `tolerance` is that bound over ||ref||. It assumes each rank's backward computes the same bits twice
(true on CPU; on CUDA, kernels that add with atomics break it: the GPU check says whether they do).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from contextlib import nullcontext
from dataclasses import asdict, dataclass

import torch
import torch.distributed as dist
from torch import nn

from trainers.knobs import LOSSY_HOOKS

U = 2.0**-24  # fp32 unit roundoff
CHECK_MICRO = 500  # check batches are micro-steps 500.. of the data generator: none the timed steps use
EXACT, APPROXIMATE, FAILED, OFF = "exact", "approximate", "failed", "off"


@dataclass(frozen=True)
class GradCheck:
    """One cell's check, as its row records it."""

    grad_check: str  # exact | approximate | failed | off
    grad_rel_error: float | None = None  # ||produced - reference|| / ||reference||, every parameter
    grad_tol: float | None = None  # the bound fp32 reduction order explains, relative (see the module docstring)
    grad_check_ms: float | None = None  # what the check cost: both passes and the fp64 reduction

    def to_dict(self) -> dict:
        return asdict(self)


def roundings(world: int, gas: int) -> int:
    """The most fp32 roundings one term of DDP's averaged gradient passes through (module docstring)."""
    return gas * (world + 1)


def tolerance(world: int, gas: int, magnitude: float, ref_norm: float) -> float:
    """The relative L2 error fp32 reduction order can explain: gamma_k * magnitude / ||ref||, where magnitude
    is (1/W) sum_r ||sum_m |g_rm|||."""
    k = roundings(world, gas)
    gamma = k * U / (1 - k * U)
    return gamma * magnitude / ref_norm if ref_norm > 0 else 0.0


def flat(grads: Iterable[torch.Tensor | None], sizes: list[int], device: torch.device) -> torch.Tensor:
    """Every parameter's gradient as one fp64 vector (zeros where a parameter got none)."""
    parts = [
        torch.zeros(n, dtype=torch.float64, device=device) if g is None else g.detach().reshape(-1).double()
        for g, n in zip(grads, sizes, strict=True)
    ]
    return torch.cat(parts)


def local_reference(
    model: nn.Module,
    loss: Callable[[nn.Module, tuple], torch.Tensor],
    batches: list[tuple],
    autocast: Callable,
    around: Callable = nullcontext,
) -> tuple[torch.Tensor, float]:
    """(sum_m g_m in fp64, ||sum_m |g_m|||) for this rank's micro-steps, on `model` itself (a copy outside DDP,
    or a compiled module that communicates nothing): each micro-step's gradient alone, as DDP's loss / gas gives
    it; `autocast` around each forward, `around` around each forward and backward."""
    params = list(model.parameters())
    sizes = [p.numel() for p in params]
    device = params[0].device
    total = torch.zeros(sum(sizes), dtype=torch.float64, device=device)
    magnitude = torch.zeros_like(total)
    for batch in batches:
        model.zero_grad(set_to_none=True)
        with around():
            with autocast():
                value = loss(model, batch)
            (value / len(batches)).backward()
        g = flat((p.grad for p in params), sizes, device)
        total += g
        magnitude += g.abs()
    model.zero_grad(set_to_none=True)
    return total, float(magnitude.norm())


def reduce_reference(total: torch.Tensor, magnitude: float, group: dist.ProcessGroup | None, world: int):
    """(the fp64 mean over the ranks of `group`, (1/W) sum_r magnitude_r): one fp64 all-reduce on the CPU (none
    for a world of one)."""
    packed = torch.cat([total.cpu(), torch.tensor([magnitude], dtype=torch.float64)])
    if world > 1:
        dist.all_reduce(packed, group=group)
    return packed[:-1] / world, float(packed[-1]) / world


def verdict(comm_hook: str, rel_error: float, tol: float) -> str:
    if comm_hook in LOSSY_HOOKS:
        return APPROXIMATE
    return EXACT if rel_error <= tol else FAILED


def compare(produced: torch.Tensor, reference: torch.Tensor) -> float:
    """||produced - reference|| / ||reference|| (fp64)."""
    ref_norm = float(reference.norm())
    diff = float((produced.to(reference.device) - reference).norm())
    return diff / ref_norm if ref_norm > 0 else diff


_WORLD_CHECK: list = []  # [(the default group, its check group)]: one per world, made on first use


def world_check_group() -> dist.ProcessGroup:
    """The check's own gloo group over the whole world (a collective on first use: call on every rank)."""
    world = dist.group.WORLD
    if not _WORLD_CHECK or _WORLD_CHECK[0][0] is not world:
        _WORLD_CHECK[:] = [(world, dist.new_group(backend="gloo"))]
    return _WORLD_CHECK[0][1]
