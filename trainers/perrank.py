"""Each rank's own figures, measured after the timed steps (never inside them): its compute and its wait.

A DDP step takes as long as its slowest rank: every rank waits for the last bucket of every other. The step's
time therefore cannot say which rank was slow; these figures can.

- compute: forward + backward of one micro-batch under `no_sync()` (DDP's reducer skips the all-reduce; naive
  mode runs none), every rank at once as in a step, `PROBES` times after a barrier each; ms per micro-step.
- wait: the rank's own median timed step minus its compute of the step's `gas` micro-steps: what the step spent
  beyond this rank's own forward and backward (waiting for the slowest rank at the synchronization, communication
  the backward did not hide, the optimizer step). A straggler's wait is the shortest; the others' is longer by
  what the straggler costs them. None on compiled cells: the probes run eager (a compiled `no_sync` variant
  would compile again), so they compare ranks but are not the compiled step's compute.
"""

from __future__ import annotations

import os
import statistics
import time
from contextlib import nullcontext

import torch
import torch.distributed as dist

from trainers.replica import Replica, autocast, gather_all

PROBES = 5  # untimed no_sync micro-steps per rank and cell


def device_id(device: torch.device) -> str:
    """The rank's device as the cluster names it: the GPU's PCI bus id on CUDA, the process's core set on CPU."""
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        bus = [getattr(props, f"pci_{k}_id", None) for k in ("domain", "bus", "device")]
        if None not in bus:
            return f"{bus[0]:04x}:{bus[1]:02x}:{bus[2]:02x}.0"
        return f"cuda:{device.index}"
    return "cpu:" + core_list(sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else [])


def core_list(cores: list[int]) -> str:
    """[0, 1, 2, 5] -> '0-2,5' (as taskset prints a core list)."""
    spans: list[list[int]] = []
    for c in cores:
        if spans and c == spans[-1][1] + 1:
            spans[-1][1] = c
        else:
            spans.append([c, c])
    return ",".join(f"{a}-{b}" if a != b else f"{a}" for a, b in spans)


def _compute_once(rep: Replica, sync) -> float:
    """One micro-batch's forward and backward on this rank with no synchronization, eager (a compiled cell's
    `no_sync` variant would compile again); ms."""
    module = getattr(rep.module, "_orig_mod", rep.module)  # the eager wrapper under torch.compile's
    no_sync = module.no_sync() if rep.cfg.mode == "ddp" else nullcontext()
    sync()
    t0 = time.perf_counter()
    with no_sync:
        with autocast(rep.device):
            loss = rep.workload.loss(module, rep.batches[0])
        (loss / rep.cfg.gas).backward()
    sync()
    return (time.perf_counter() - t0) * 1e3


def rank_figures(rep: Replica, sync, own_step_ms: list[float]) -> dict:
    """Every rank's compute samples (ms per micro-step, `PROBES` each) and wait (ms per step), in the cell's rank
    order; collective over the cell's ranks (every rank calls it, every rank gets the same). The gradients the
    probes leave are cleared."""
    samples = []
    for _ in range(PROBES):
        dist.barrier(group=rep.group)  # the ranks compute at once, as in a step
        samples.append(_compute_once(rep, sync))
    rep.opt.zero_grad(set_to_none=True)
    wait = statistics.median(own_step_ms) - rep.cfg.gas * statistics.median(samples)
    every = gather_all([*samples, wait], rep.device, rep.group)
    waits = None if rep.cfg.compile else [r[PROBES] for r in every]  # an eager probe against a compiled step: none
    return {"rank_compute_ms": [r[:PROBES] for r in every], "rank_wait_ms": waits}
