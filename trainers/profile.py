"""One rank's micro-step without DDP, profiled for the overlap model (results.model.overlap): forward, each
parameter's gradient-ready time in the backward (post-accumulate-grad hooks), the backward's end and the
optimizer step, each the median over repeats with its p10 and p90. Untimed warm-up steps come first; on CUDA
every time is a CUDA event on the current stream (the hooks record one as the gradient is accumulated), on
CPU the wall clock (the hooks run as the gradient is accumulated).
"""

from __future__ import annotations

import time
from dataclasses import replace

import numpy as np
import torch

from trainers import workload
from trainers.config import StepConfig
from trainers.model import grad_bytes
from trainers.replica import autocast

REPEATS = 10
WARMUP = 3


class _Clock:
    """Marks on the device's timeline, read as ms after the first mark once the device is synchronized."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.marks: list = []

    def mark(self) -> int:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self.marks.append(event)
        else:
            self.marks.append(time.perf_counter())
        return len(self.marks) - 1

    def read(self) -> list[float]:
        if self.cuda:
            torch.cuda.synchronize()
            return [self.marks[0].elapsed_time(m) for m in self.marks]
        return [(m - self.marks[0]) * 1e3 for m in self.marks]


def profile_micro_step(cfg: StepConfig, device: torch.device, repeats: int = REPEATS, warmup: int = WARMUP) -> dict:
    """The profile of `cfg`'s workload and micro-batch on `device` (one rank, eager, no DDP): a dict whose
    fields are results.model.overlap.Profile's, plus each one's p10/p90 and the parameter names."""
    cfg = replace(cfg, mode="single", gas=1, compile=False)
    built = workload.build(cfg, device)
    model, params = built.model, list(built.model.parameters())
    index = {id(p): i for i, p in enumerate(params)}
    opt = torch.optim.AdamW(params, lr=3e-4, fused=device.type == "cuda")
    batch = tuple(t.to(device) for t in built.workload.make_batch(cfg.micro_batch, workload.generator(cfg.seed, 0, 0)))
    runs, order = [], []
    for r in range(warmup + repeats):
        clock, ready = _Clock(device), {}

        def stamp(p: torch.Tensor, clock: _Clock = clock, ready: dict = ready) -> None:
            ready[index[id(p)]] = clock.mark()

        handles = [p.register_post_accumulate_grad_hook(stamp) for p in params]
        start = clock.mark()
        with autocast(device):
            loss = built.workload.loss(model, batch)
        backward = clock.mark()
        loss.backward()
        done = clock.mark()
        opt.step()
        opt.zero_grad(set_to_none=True)
        stepped = clock.mark()
        for h in handles:
            h.remove()
        at = clock.read()
        if r >= warmup:
            unused = [i for i in range(len(params)) if i not in ready]  # no gradient: ready at the backward's end
            order = (
                order or sorted(ready, key=ready.get) + unused
            )  # the order the hooks fired in (marks are sequential)
            runs.append([at[backward] - at[start], at[done] - at[backward], at[stepped] - at[done]])
            runs[-1] += [at[ready.get(i, done)] - at[backward] for i in range(len(params))]
    return _summary(np.asarray(runs), params, order, model)


def _summary(runs: np.ndarray, params: list[torch.Tensor], order: list[int], model: torch.nn.Module) -> dict:
    med, p10, p90 = (np.percentile(runs, q, axis=0) for q in (50, 10, 90))
    names = [n for n, _ in model.named_parameters()]
    return {
        "forward_ms": float(med[0]),
        "backward_ms": float(med[1]),
        "optimizer_ms": float(med[2]),
        "ready_ms": tuple(float(x) for x in med[3:]),
        "nbytes": tuple(p.numel() * p.element_size() for p in params),
        "grad_bytes": grad_bytes(model),  # the trainable parameters' (what DDP all-reduces): bytes
        "order": tuple(order),
        "spread": {"p10": [float(x) for x in p10[:3]], "p90": [float(x) for x in p90[:3]]},
        "ready_p10_ms": tuple(float(x) for x in p10[3:]),
        "ready_p90_ms": tuple(float(x) for x in p90[3:]),
        "names": tuple(names),
    }
