"""The gradient check: what a cell's communication did to its gradient, judged inside DDP's own backward.

One untimed check step after the timed steps, run as the cell runs every step (its hook, buckets, no_sync
pattern, compile mode). Both sides of the comparison come from that one backward:

    local      each parameter's local gradient as autograd produces it, captured by a tensor hook (it fires
               before the gradient is accumulated into .grad, so before DDP's reducer sees it), summed in fp64
               over the micro-steps; summed over the ranks in fp64 through a gloo group of the check's own, in
               chunks of at most CHUNK_BYTES, and divided by W: the exact mean of what the ranks computed
    produced   DDP's .grad after the same step

Kernel nondeterminism (atomics in flash attention's or an embedding's backward), dropout masks and a compiler's
reordering are shared by both sides, so what can differ is what happened between the local gradients and .grad:
DDP's division, buckets and all-reduce, or the hook. No copy of the model and no second backward.

    exact          the relative L2 error is within what fp32 reduction order explains (`tolerance`)
    approximate    a compressing hook: fp16 / bf16 within what their own rounding explains; PowerSGD's error
                   recorded, not judged (low rank is not a rounding)
    failed         outside the bound: a wrong sum, whatever replicas_in_sync says
    indeterminate  the local gradients could not be captured in this mode (the reason is recorded)

The bound. DDP's gradient is the sum of the n = W*G terms g_rm / W (W ranks, G micro-steps) evaluated in some
order: autograd's accumulation over micro-steps, DDP's division by W, the all-reduce's W-1 additions and the
buckets' layout; syncing every micro-step divides and re-sums the running average each time. Each term passes
through at most k = G (W + 1) roundings, so elementwise |ddp - ref| <= gamma_k * sum_rm |g_rm| / W with
gamma_k = k u / (1 - k u) (Higham, Accuracy and Stability of Numerical Algorithms, 2nd ed., §4.2: any order).
In L2, with the triangle inequality over ranks, ||ddp - ref|| <= gamma_k (1/W) sum_r || sum_m |g_rm| ||, and
the tolerance is that bound over ||ref||. u is fp32's 2**-24, or a casting hook's wire format's, fp16 2**-11 or
bf16 2**-8, whose cast is one more rounding per synced micro-step (k = G (W + 2)); fp16 adds its underflow, at
most 2**-25 absolute per element and rounding below its smallest normal (sqrt(n) k 2**-25 in L2).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass

import torch
import torch.distributed as dist
from torch import nn

from trainers.knobs import LOSSY_HOOKS

U = 2.0**-24  # fp32 unit roundoff
UNIT_ROUNDOFF = {"none": U, "fp16": 2.0**-11, "bf16": 2.0**-8}  # the wire format's; PowerSGD has no bound
UNDERFLOW = {"fp16": 2.0**-25}  # half fp16's subnormal spacing: an absolute error per element and rounding
CASTING = ("fp16", "bf16")  # hooks that cast the bucket to their wire format: one more rounding per sync
CHUNK_BYTES = 64 * 2**20  # the most the check moves or copies at once, bytes
SLICE = 2**20  # elements: the most the check converts or compares at once (8 MB in fp64)
CHECK_MICRO = 500  # check batches are micro-steps 500.. of the data generator: none the timed steps use
EXACT, APPROXIMATE, FAILED, INDETERMINATE, OFF = "exact", "approximate", "failed", "indeterminate", "off"
FIRST, EVERY = "first", "every"  # when a configuration is checked: its first measurement, or every one


@dataclass(frozen=True)
class GradCheck:
    """One cell's check, as its row records it."""

    grad_check: str | None  # exact | approximate | failed | indeterminate | off; None: not checked this time
    grad_rel_error: float | None = None  # ||produced - reference|| / ||reference||, every parameter
    grad_tol: float | None = None  # the bound the reduction's rounding explains, relative (module docstring)
    grad_check_ms: float | None = None  # what the check cost: the check step and the fp64 reduction
    grad_check_note: str | None = None  # indeterminate: why the local gradients could not be captured

    def to_dict(self) -> dict:
        return asdict(self)


def roundings(world: int, gas: int, comm_hook: str = "none") -> int:
    """The most roundings one term of DDP's averaged gradient passes through (module docstring); a casting hook
    adds one per synced micro-step (the cast to its wire format)."""
    return gas * (world + (2 if comm_hook in CASTING else 1))


def tolerance(world: int, gas: int, magnitude: float, ref_norm: float, comm_hook: str = "none", n: int = 0) -> float:
    """The relative L2 error the reduction's rounding can explain: (gamma_k * magnitude + sqrt(n) k eta) / ||ref||,
    magnitude = (1/W) sum_r ||sum_m |g_rm|||, u and eta the hook's wire format's, n the gradient's elements."""
    k = roundings(world, gas, comm_hook)
    u = UNIT_ROUNDOFF.get(comm_hook, U)
    gamma = k * u / (1 - k * u)
    floor = math.sqrt(n) * k * UNDERFLOW.get(comm_hook, 0.0)
    return (gamma * magnitude + floor) / ref_norm if ref_norm > 0 else 0.0


def verdict(comm_hook: str, rel_error: float, tol: float) -> str:
    if comm_hook in LOSSY_HOOKS and comm_hook not in UNIT_ROUNDOFF:
        return APPROXIMATE  # PowerSGD: low rank, not a rounding
    if rel_error > tol:
        return FAILED
    return APPROXIMATE if comm_hook in LOSSY_HOOKS else EXACT


def _slices(n: int, elements: int) -> Iterator[slice]:
    return (slice(i, min(i + elements, n)) for i in range(0, n, elements))


class Capture:
    """Each parameter's local gradient, as autograd produces it, summed in fp64 over the micro-steps (and, for
    the bound, the sum of its absolute values where there is more than one micro-step). Tensor hooks: they fire
    before accumulation into .grad, so before DDP's reducer; `remove` takes them off."""

    def __init__(self, params: list[nn.Parameter], gas: int) -> None:
        self.params = params
        self.sums = [torch.zeros(p.numel(), dtype=torch.float64, device=p.device) for p in params]
        self.mags = [torch.zeros_like(s) for s in self.sums] if gas > 1 else None  # gas 1: |g| sums to ||sum||
        self.calls = [0] * len(params)
        self.handles = [p.register_hook(self._hook(i)) for i, p in enumerate(params)]

    def _hook(self, i: int) -> Callable[[torch.Tensor], None]:
        def hook(grad: torch.Tensor) -> None:
            self.calls[i] += 1
            flat = grad.detach().reshape(-1)
            for s in _slices(flat.numel(), SLICE):  # no full-size temporary
                self.sums[i][s].add_(flat[s])
                if self.mags is not None:
                    self.mags[i][s].add_(flat[s].abs())

        return hook

    def remove(self) -> None:
        for h in self.handles:
            h.remove()

    def missed(self) -> int:
        """Parameters that hold a gradient though their hook never fired (a mode that bypasses tensor hooks)."""
        return sum(1 for p, c in zip(self.params, self.calls, strict=True) if c == 0 and p.grad is not None)

    def magnitude(self) -> float:
        """||sum_m |g_m||| over every parameter, this rank's."""
        parts = self.mags if self.mags is not None else self.sums
        return math.sqrt(sum(float(t.dot(t)) for t in parts))


def _chunks(sizes: list[int], elements: int) -> Iterator[list[tuple[int, slice]]]:
    """(parameter, slice) pieces, packed in order into chunks of at most `elements` elements."""
    chunk: list[tuple[int, slice]] = []
    room = elements
    for i, n in enumerate(sizes):
        start = 0
        while start < n:
            take = min(room, n - start)
            chunk.append((i, slice(start, start + take)))
            start, room = start + take, room - take
            if room == 0:
                yield chunk
                chunk, room = [], elements
    if chunk:
        yield chunk


def _gather(parts: list[torch.Tensor], chunk: list[tuple[int, slice]], out: torch.Tensor) -> torch.Tensor:
    """The chunk's pieces of `parts`, copied in order into `out` (fp64, on the CPU): no temporary of their size."""
    at = 0
    for i, s in chunk:
        n = s.stop - s.start
        out[at : at + n].copy_(parts[i][s])
        at += n
    return out[:at]


def _error2(produced: list[torch.Tensor], chunk: list[tuple[int, slice]], ref: torch.Tensor) -> float:
    """||produced - ref||^2 over the chunk, a SLICE at a time."""
    total, at = 0.0, 0
    for i, s in chunk:
        for sub in _slices(s.stop - s.start, SLICE):
            got = produced[i][s.start + sub.start : s.start + sub.stop].to("cpu", torch.float64, copy=True)
            got.sub_(ref[at + sub.start : at + sub.stop])
            total += float(got.dot(got))
        at += s.stop - s.start
    return total


def judge(capture: Capture, group: dist.ProcessGroup | None, world: int) -> tuple[float, float, float]:
    """(max over ranks of ||produced - ref||^2, ||ref||^2, (1/W) sum_r magnitude_r): the fp64 sum over the ranks
    of `group` in chunks of at most CHUNK_BYTES on the CPU, one buffer (a collective over `group`: every rank
    calls it; none for a world of one)."""
    produced = [
        torch.zeros(p.numel(), dtype=torch.float32, device=p.device) if p.grad is None else p.grad.detach().reshape(-1)
        for p in capture.params
    ]
    elements = CHUNK_BYTES // 8
    buffer = torch.empty(elements, dtype=torch.float64)
    err2 = ref2 = 0.0
    for chunk in _chunks([s.numel() for s in capture.sums], elements):
        ref = _gather(capture.sums, chunk, buffer)
        if world > 1:
            dist.all_reduce(ref, group=group)
        ref /= world
        err2 += _error2(produced, chunk, ref)
        ref2 += float(ref.dot(ref))
    small = torch.tensor([err2, capture.magnitude()], dtype=torch.float64)
    if world > 1:
        every = [torch.zeros_like(small) for _ in range(world)]
        dist.all_gather(every, small, group=group)
        err2 = max(float(t[0]) for t in every)
        return err2, ref2, sum(float(t[1]) for t in every) / world
    return err2, ref2, float(small[1])


def result(capture: Capture, group: dist.ProcessGroup | None, world: int, gas: int, comm_hook: str) -> GradCheck:
    """The verdict on the captured step (collective over `group`); indeterminate where hooks were bypassed."""
    missed = torch.tensor([float(capture.missed())], dtype=torch.float64)
    if world > 1:
        dist.all_reduce(missed, group=group, op=dist.ReduceOp.MAX)
    if missed.item() > 0:
        why = f"{int(missed.item())} parameter(s) got a gradient without passing its tensor hook in this mode"
        return GradCheck(INDETERMINATE, grad_check_note=why)
    err2, ref2, magnitude = judge(capture, group, world)
    rel = math.sqrt(err2 / ref2) if ref2 > 0 else math.sqrt(err2)
    n = sum(s.numel() for s in capture.sums)
    tol = tolerance(world, gas, magnitude, math.sqrt(ref2), comm_hook, n)
    return GradCheck(verdict(comm_hook, rel, tol), rel, tol)


_WORLD_CHECK: list = []  # [(the default group, its check group)]: one per world, made on first use


def world_check_group() -> dist.ProcessGroup:
    """The check's own gloo group over the whole world (a collective on first use: call on every rank)."""
    world = dist.group.WORLD
    if not _WORLD_CHECK or _WORLD_CHECK[0][0] is not world:
        _WORLD_CHECK[:] = [(world, dist.new_group(backend="gloo"))]
    return _WORLD_CHECK[0][1]
