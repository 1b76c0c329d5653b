"""Faults planted by benchmarks and tests, never by a spec: a nondeterministic backward, a rank that fails in one,
a rank whose compute is slower than its peers' (a straggler).

A backward that differs on every call, as a GPU's does (DDPSWEEP_JITTER).

On CUDA, flash attention's backward sums dQ with atomic adds and Inductor lowers an embedding's backward to one:
two backward passes of one batch differ in their last bits, on every call and every rank. The CPU computes the
same bits twice. This plant makes it differ: every backward adds independent relative noise of a given size to
the gradient entering each attention block (each `nn.Linear` where a model has no attention), a new draw on every
call and every rank. A check that compares two backward passes fails under it; one that shares the cell's own
backward (trainers.gradcheck) must not.
"""

from __future__ import annotations

import os
import time

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

_GENERATORS: dict[torch.device, torch.Generator] = {}


def _generator(device: torch.device) -> torch.Generator:
    """A generator of this process's own, seeded from the OS: draws differ by rank and by call, and the
    default generator (the data's, the model's) is never advanced."""
    if device not in _GENERATORS:
        _GENERATORS[device] = torch.Generator(device=device)
        _GENERATORS[device].manual_seed(int.from_bytes(os.urandom(8), "little") >> 1)
    return _GENERATORS[device]


class _Jitter(torch.autograd.Function):
    """Identity forward; backward multiplies the gradient by (1 + size * N(0, 1)), elementwise."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, size: float) -> torch.Tensor:
        ctx.size = size
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        noise = torch.randn(grad.shape, generator=_generator(grad.device), device=grad.device, dtype=grad.dtype)
        return grad * (1 + ctx.size * noise), None


def targets(model: nn.Module) -> list[nn.Module]:
    """The modules whose input gradient is jittered: every attention block, else every Linear."""
    attention = [m for m in model.modules() if type(m).__name__.endswith("Attention")]
    return attention or [m for m in model.modules() if isinstance(m, nn.Linear)]


def jittered(model: nn.Module, size: float) -> list[RemovableHandle]:
    """Jitter `model`'s backward by `size` (relative); the handles take it off."""

    def pre_hook(module: nn.Module, args: tuple) -> tuple:
        return tuple(_Jitter.apply(a, size) if isinstance(a, torch.Tensor) and a.requires_grad else a for a in args)

    return [m.register_forward_pre_hook(pre_hook) for m in targets(model)]


class PlantedFault(RuntimeError):
    """The planted failure of one rank in the middle of its backward (tests of the failure path)."""


def failing_backward(model: nn.Module) -> RemovableHandle:
    """Raise from the first backward that reaches the middle parameter: its peers are then inside DDP's
    all-reduce of the buckets before it."""
    params = list(model.parameters())

    def hook(grad: torch.Tensor) -> None:
        raise PlantedFault("fault planted in the middle of the backward")

    return params[len(params) // 2].register_hook(hook)


def slowed_compute(model: nn.Module, fraction: float, sync=lambda: None) -> list[RemovableHandle]:
    """Make this rank's forward + backward `fraction` slower (DDPSWEEP_SLOWDOWN=<cell>@<rank>=<fraction>): a sleep
    of `fraction` times this forward + backward's own time, taken when the first parameter's gradient is ready
    (the last in the backward's order), so that every bucket after it, and the peers waiting on them, wait too.
    The clock starts at each forward (a forward pre-hook) and holds no peer's wait, so sleeps never compound;
    eager cells only."""
    start = [0.0]  # s

    def at_forward(module: nn.Module, args: tuple) -> None:
        sync()
        start[0] = time.perf_counter()

    def at_last_grad(grad: torch.Tensor) -> None:
        sync()
        time.sleep(fraction * (time.perf_counter() - start[0]))

    first = next(p for p in model.parameters() if p.requires_grad)
    return [model.register_forward_pre_hook(at_forward), first.register_hook(at_last_grad)]
