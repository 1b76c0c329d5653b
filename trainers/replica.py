"""One rank's replica of a cell: its model copy, optimizer, DDP wrapper (or none) and fixed micro-batches, the
optimizer step it takes, and what the ranks compare about it (parameter checksums, a max over the ranks).

Model code never knows about this: the workload builds the bare model (trainers.workload), this module wraps it.
"""

from __future__ import annotations

import copy
from contextlib import nullcontext
from dataclasses import dataclass, replace
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from trainers import compiled, hooks, workload
from trainers.commtrace import CommTrace, traced_hook
from trainers.compiled import Compiled
from trainers.config import StepConfig
from trainers.knobs import STEP_KNOBS
from trainers.workload import Built


@dataclass
class Replica:
    """One rank's model, optimizer and fixed micro-batches."""

    cfg: StepConfig
    workload: Any  # the workload object: make_batch, loss (trainers.workload)
    model: nn.Module  # the bare model (parameters, .grad)
    module: nn.Module  # what forward runs through: DDP(model) in ddp mode, else model
    opt: torch.optim.Optimizer
    batches: list[tuple[torch.Tensor, ...]]  # one per micro-step, on the device
    world_size: int
    device: torch.device
    trace: CommTrace | None = None  # the comm hook's record, on the traced steps' own wrapper only
    tokens_per_sample: int | None = None
    group: dist.ProcessGroup | None = None  # the ranks this cell runs on (None: every rank of the world)
    compiled: Compiled | None = None  # compile: the cell's torch.compile state (module is the compiled wrapper)
    corruption: float = 0.0  # benchmarks only: the planted corruption its hook applies (trainers.hooks.corrupted)


def distributed(cfg: StepConfig) -> bool:
    return cfg.mode != "single"


def make_batches(built: Built, cfg: StepConfig, rank: int, device: torch.device) -> list[tuple[torch.Tensor, ...]]:
    """The rank's fixed micro-batches (one per micro-step), the same on every call for (seed, rank, micro)."""
    out = []
    for micro in range(cfg.gas):
        batch = built.workload.make_batch(cfg.micro_batch, workload.generator(cfg.seed, rank, micro))
        out.append(tuple(t.to(device) for t in batch))
    return out


def build_model(cfg: StepConfig, device: torch.device) -> Built:
    """The cell's workload with its model on `device`: the same initial weights on every rank (seeded), fp32."""
    return workload.build(cfg, device)


def setup_replica(
    cfg: StepConfig,
    device: torch.device,
    template: Built | None = None,
    group: dist.ProcessGroup | None = None,
    corruption: float = 0.0,
) -> Replica:
    """A fresh replica: `template`'s weights copied (or a seeded build), a new optimizer and wrapper, on the
    ranks of `group` (None: the whole world; its rank 0 must be the world's rank 0)."""
    built = template if template is not None else build_model(cfg, device)
    model = copy.deepcopy(built.model)
    rank, world = (dist.get_rank(group), dist.get_world_size(group)) if distributed(cfg) else (0, 1)
    module: nn.Module = model
    trace = None
    if cfg.mode == "ddp":  # the timed wrapper never traces (trainers.step.traced_steps wraps its own)
        module, trace = wrap_ddp(model, replace(cfg, trace_comm=False), device, world, group, corruption)
    elif cfg.mode == "naive":
        for p in model.parameters():  # start from rank 0's weights, as DDP does
            dist.broadcast(p.data, src=0, group=group)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=device.type == "cuda")
    batches = make_batches(built, cfg, rank, device)
    state = None
    if cfg.compile:
        module, state = compiled.compile_module(module, cfg)
    return Replica(
        cfg=cfg,
        workload=built.workload,
        model=model,
        module=module,
        opt=opt,
        batches=batches,
        world_size=world,
        device=device,
        trace=trace,
        tokens_per_sample=built.tokens_per_sample,
        group=group,
        compiled=state,
        corruption=corruption,
    )


def wrap_ddp(
    model: nn.Module,
    cfg: StepConfig,
    device: torch.device,
    world: int,
    group: dist.ProcessGroup | None = None,
    corruption: float = 0.0,
) -> tuple[DDP, CommTrace | None]:
    """DDP over `group` with the cell's DDP keywords (ddp_kwargs) and communication hook (`corruption`,
    benchmarks only: its result perturbed); with trace_comm, the hook runs inside the trace (which records its
    collectives and bytes)."""
    module = DDP(
        model,
        device_ids=[device.index] if device.type == "cuda" else None,
        process_group=group,
        **ddp_kwargs(cfg),
    )
    hook, state = hooks.comm_hook(cfg, group)
    if corruption:
        state = state if hook is not None else group  # DDP's own all-reduce takes the process group
        hook = hooks.corrupted(hook, corruption)
    if cfg.trace_comm:
        trace = CommTrace(world_size=world, cuda=device.type == "cuda", inner=hook, inner_state=state, group=group)
        module.register_comm_hook(trace, traced_hook)
        return module, trace
    if hook is not None:
        module.register_comm_hook(state, hook)
    return module, None


def ddp_kwargs(cfg: StepConfig) -> dict:
    """DDP's keywords from the knobs that name one (`trainers.knobs.Knob.ddp_kwarg`), each given only where it
    differs from PyTorch's default (torch 2.13 warns on every wrapper given broadcast_buffers), the bucket cap
    always, and the first bucket's cap where the cell sets one."""
    out = {k.ddp_kwarg: getattr(cfg, k.name) for k in STEP_KNOBS if k.ddp_kwarg and getattr(cfg, k.name) != k.pytorch}
    return out | {"bucket_cap_mb": cfg.bucket_cap_mb} | first_bucket_kwargs(cfg)


def first_bucket_kwargs(cfg: StepConfig) -> dict:
    """The first bucket's size: PyTorch 2.13 gives the first bucket the same cap as the others once
    bucket_cap_mb is passed (its 1 MiB `_DEFAULT_FIRST_BUCKET_BYTES` applies only to the default cap), so a
    first_bucket_mb goes in as per-bucket caps [first, rest] (`bucket_cap_mb_list`)."""
    if cfg.first_bucket_mb is None:
        return {}
    return {"bucket_cap_mb_list": [cfg.first_bucket_mb, cfg.bucket_cap_mb]}


def _naive_all_reduce(rep: Replica) -> None:
    """The seed's naive DP: one blocking all_reduce per .grad after backward, then average."""
    for p in rep.model.parameters():
        if p.grad is not None:
            dist.all_reduce(p.grad, group=rep.group)
            p.grad.div_(rep.world_size)


def autocast(device: torch.device):
    """The step's autocast: bf16 on CUDA, none on CPU."""
    return torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else nullcontext()


def forward_backward(rep: Replica) -> None:
    """The gas micro-steps of one optimizer step: loss / gas, no_sync on the first gas-1."""
    cfg = rep.cfg
    for micro in range(cfg.gas):
        skip_sync = cfg.no_sync and micro < cfg.gas - 1
        ctx = rep.module.no_sync() if skip_sync and cfg.mode == "ddp" else nullcontext()
        with ctx, micro_step_context(rep):
            with autocast(rep.device):
                loss = rep.workload.loss(rep.module, rep.batches[micro])
            (loss / cfg.gas).backward()
        if cfg.mode == "naive" and not skip_sync:
            _naive_all_reduce(rep)


def micro_step_context(rep: Replica):
    """What a micro-step (forward and backward) runs in: compiled autograd for the Python reducer, else nothing."""
    return rep.compiled.step_context() if rep.compiled else nullcontext()


def train_step(rep: Replica) -> None:
    """One optimizer step: forward_backward, AdamW, zero_grad(set_to_none=True)."""
    forward_backward(rep)
    rep.opt.step()
    rep.opt.zero_grad(set_to_none=True)


def params_checksum(model: nn.Module) -> int:
    """A bit-exact checksum of all parameters: equal iff (with overwhelming odds) bits are equal."""
    total = 0
    for i, p in enumerate(model.parameters()):
        bits = p.detach().reshape(-1).view(torch.int32).to(torch.int64)  # raw fp32 bits
        weights = torch.arange(bits.numel(), device=bits.device) % 65521 + 1
        total = (total + (i + 1) * int((bits * weights).sum())) % (1 << 61)
    return total


def replicas_in_sync(model: nn.Module, device: torch.device, group: dist.ProcessGroup | None = None) -> bool:
    """All-gather every rank's checksum; True when all are equal. Collective: call on every rank of `group`."""
    mine = torch.tensor([params_checksum(model)], dtype=torch.int64, device=device)
    every = [torch.zeros_like(mine) for _ in range(dist.get_world_size(group))]
    dist.all_gather(every, mine, group=group)
    return all(int(t) == int(mine) for t in every)


def bucket_sizes(module: nn.Module) -> list[int]:
    """Bucket sizes in bytes from DDP's own logging data (after its bucket rebuild); a compiled wrapper's DDP."""
    module = getattr(module, "_orig_mod", module)  # torch.compile's OptimizedModule
    if not isinstance(module, DDP):
        return []
    data = module._get_ddp_logging_data()
    text = data.get("rebuilt_bucket_sizes") or data.get("bucket_sizes") or ""
    return [int(s) for s in str(text).split(",") if s.strip()]


def gather_all(values: list[float], device: torch.device, group: dist.ProcessGroup | None = None) -> list[list[float]]:
    """Every rank's `values`, in the rank order of `group` (after the timed loop: never inside it)."""
    mine = torch.tensor(values, dtype=torch.float64, device=device)
    every = [torch.zeros_like(mine) for _ in range(dist.get_world_size(group))]
    dist.all_gather(every, mine, group=group)
    return [t.tolist() for t in every]


def gather_max(values: list[float], device: torch.device, group: dist.ProcessGroup | None = None) -> list[float]:
    """Element-wise max over the ranks of `group` (after the timed loop: never inside it)."""
    return [max(column) for column in zip(*gather_all(values, device, group), strict=True)]
