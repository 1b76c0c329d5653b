"""The measured DDP GPT step. `run_cell` runs on every rank (torchrun or a Ray Train worker).

The process group must already be initialized for `ddp` and `naive` modes; `single`
runs in one process with no wrapper and no collectives. Many cells may run one after another in
the same process and group: each starts from a copy of the same initial weights, with a new
optimizer and a new DDP wrapper, and `release` frees it all before the next.
"""

from __future__ import annotations

import copy
import gc
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, replace
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from trainers import compiled, gradcheck, hooks, workload
from trainers.commtrace import CommTrace, counting_all_reduce, summarize_trace, traced_hook
from trainers.compiled import Compiled
from trainers.config import Measurement, StepConfig
from trainers.errors import StepError
from trainers.gradcheck import OFF, GradCheck
from trainers.knobs import STEP_KNOBS
from trainers.model import grad_bytes, n_params
from trainers.stats import median_rel_half_width, summarize
from trainers.timing import Hook, slowed, time_events, time_loop, time_steps, timing_as_run
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
    trace: CommTrace | None = None  # trace_comm: the comm hook's record
    tokens_per_sample: int | None = None
    group: dist.ProcessGroup | None = None  # the ranks this cell runs on (None: every rank of the world)
    compiled: Compiled | None = None  # compile: the cell's torch.compile state (module is the compiled wrapper)


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


@dataclass(frozen=True)
class Extras:
    """What a cell's run does beside its configuration (none of it is part of the configuration)."""

    grad_check: bool = True  # check the gradient after the timed steps (trainers.gradcheck)
    check_group: dist.ProcessGroup | None = None  # the check's gloo group over the cell's ranks (None: the world's)
    slowdown: float = 0.0  # benchmarks only: each timed step made this fraction slower (trainers.timing.slowed)
    corruption: float = 0.0  # benchmarks only: all-reduced buckets scaled by 1 + this (trainers.hooks.corrupted)


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
    if cfg.mode == "ddp":
        module, trace = wrap_ddp(model, cfg, device, world, group, corruption)
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
    out = {
        k.ddp_kwarg: getattr(cfg, k.name)
        for k in STEP_KNOBS
        if k.ddp_kwarg and getattr(cfg, k.name) != k.pytorch_default
    }
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


def reset_peak_memory(device: torch.device) -> bool:
    """Start a cell's peak-memory window (CUDA statistics, or the kernel's VmHWM on Linux); False where
    it cannot be reset here."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        return True
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM, the peak resident set size (Linux >= 4.0)
        return True
    except OSError:
        return False


def peak_memory_bytes(device: torch.device, window_reset: bool = True) -> int | None:
    """Peak memory since `reset_peak_memory`: CUDA max allocated, or VmHWM on Linux; None where the window
    was not reset, since the only figure then is the process's lifetime peak, which is not this cell's."""
    if not window_reset:
        return None
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device)  # bytes
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024  # kB -> bytes
    except OSError:
        pass
    return None


def release(device: torch.device) -> None:
    """Free what the previous cell held (its replica must be unreferenced by now)."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def bucket_sizes(module: nn.Module) -> list[int]:
    """Bucket sizes in bytes from DDP's own logging data (after its bucket rebuild); a compiled wrapper's DDP."""
    module = getattr(module, "_orig_mod", module)  # torch.compile's OptimizedModule
    if not isinstance(module, DDP):
        return []
    data = module._get_ddp_logging_data()
    text = data.get("rebuilt_bucket_sizes") or data.get("bucket_sizes") or ""
    return [int(s) for s in str(text).split(",") if s.strip()]


def gather_max(values: list[float], device: torch.device, group: dist.ProcessGroup | None = None) -> list[float]:
    """Element-wise max over the ranks of `group` (after the timed loop: never inside it)."""
    mine = torch.tensor(values, dtype=torch.float64, device=device)
    every = [torch.zeros_like(mine) for _ in range(dist.get_world_size(group))]
    dist.all_gather(every, mine, group=group)
    return torch.stack(every).max(dim=0).values.tolist()


def run_cell(
    cfg: StepConfig,
    device: torch.device,
    num_threads: int,
    template: Built | None = None,
    group: dist.ProcessGroup | None = None,
    extras: Extras = Extras(),
) -> Measurement | None:
    """Set up, warm up (a compiled cell until it stops recompiling), count the collectives of one untimed step,
    time the steps, check replicas and the gradient, on the ranks of `group` (None: every rank). Returns the
    measurement on the group's rank 0, else None."""
    if device.type == "cpu":
        torch.set_num_threads(num_threads)
    with compiled.use(cfg):
        return _run_cell(cfg, device, num_threads, template, group, extras)


def _run_cell(
    cfg: StepConfig,
    device: torch.device,
    num_threads: int,
    template: Built | None,
    group: dist.ProcessGroup | None,
    extras: Extras,
) -> Measurement | None:
    window = reset_peak_memory(device)
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    t0 = time.perf_counter()
    rep = setup_replica(cfg, device, template, group, extras.corruption)
    sync()
    setup_ms = (time.perf_counter() - t0) * 1e3
    t0 = time.perf_counter()
    compile_s = compiled.warm_up(lambda: train_step(rep), cfg.warmup_steps, rep.compiled, _agree(rep))
    sync()
    warmup_ms = (time.perf_counter() - t0) * 1e3
    counted = {"collectives_per_step": check_collectives(rep)} if distributed(cfg) else {}
    if distributed(cfg):
        dist.barrier(group=group)
    activity = rep.compiled.activity() if rep.compiled else 0
    times, converged, steps = timed_phase(cfg, rep, device, sync, extras.slowdown)
    if rep.compiled:
        counted |= compiled_figures(rep, compile_s, rep.compiled.activity() - activity)
    traced = summarize_trace(rep.trace) if rep.trace else {}
    in_sync, peak, checked = True, peak_memory_bytes(device, window), GradCheck(OFF)
    if distributed(cfg):
        peak = None if peak is None else int(gather_max([float(peak)], device, group)[0])
        in_sync = replicas_in_sync(rep.model, device, group)
        if extras.grad_check:
            checked = check_gradient(rep, extras.check_group, sync)
        if dist.get_rank(group) != 0:
            return None
    m = _measurement(cfg, rep, device, times, peak, in_sync, num_threads, (setup_ms, warmup_ms))
    numerics = checked.to_dict() if distributed(cfg) else {}
    m = replace(m, timed_steps_run=steps, converged=converged, **traced, **numerics, **counted)
    if m.recompiles_timed:
        said = f"{m.recompiles_timed} recompilation(s) inside the timed steps: their times include compiling"
        m = replace(m, timing_note="; ".join(filter(None, [m.timing_note, said])))
    return m


def _agree(rep: Replica) -> Callable[[bool], bool]:
    """A flag or-ed over the cell's ranks (untimed: between warm-up steps), so that every rank decides alike."""
    if not distributed(rep.cfg):
        return lambda flag: flag
    return lambda flag: bool(gather_max([float(flag)], rep.device, rep.group)[0])


def check_collectives(rep: Replica) -> int:
    """One untimed step's all-reduce calls (the profiler's count, rank 0's); a step in which any rank ran none
    never synchronized its gradients (e.g. a compiled mode that skipped them): the cell fails rather than
    reporting a fast step."""
    mine, _ = compiled.count_collectives(lambda: train_step(rep))
    most, fewest = gather_max([float(mine), -float(mine)], rep.device, rep.group)
    if -fewest == 0:
        raise StepError(
            f"a step ran no all-reduce on some rank (at most {int(most)} on any): its gradients were never "
            f"synchronized ({rep.cfg.mode} mode{_compile_text(rep.cfg)})"
        )
    return mine


def _compile_text(cfg: StepConfig) -> str:
    if not cfg.compile:
        return ", eager"
    return f", compiled with {cfg.compile_backend}" + (f", optimize_ddp {cfg.optimize_ddp}" if cfg.optimize_ddp else "")


def compiled_figures(rep: Replica, compile_s: float, activity: int) -> dict:
    """compile_s, compiled_graphs and recompiles_timed, each the slowest or largest over the ranks."""
    assert rep.compiled is not None
    figures = [compile_s, float(rep.compiled.counter.graphs), float(activity)]
    if distributed(rep.cfg):
        figures = gather_max(figures, rep.device, rep.group)
    return {"compile_s": figures[0], "compiled_graphs": int(figures[1]), "recompiles_timed": int(figures[2])}


def check_batches(rep: Replica) -> list[tuple[torch.Tensor, ...]]:
    """The rank's fixed check batches, one per micro-step: data no timed step used."""
    rank, cfg = dist.get_rank(rep.group), rep.cfg
    gens = (workload.generator(cfg.seed, rank, gradcheck.CHECK_MICRO + m) for m in range(cfg.gas))
    return [tuple(t.to(rep.device) for t in rep.workload.make_batch(cfg.micro_batch, g)) for g in gens]


def check_gradient(rep: Replica, check_group: dist.ProcessGroup | None, sync: Hook) -> GradCheck:
    """The gradient check (trainers.gradcheck): the reference on a copy of the model and an fp64 all-reduce over
    `check_group` (None: the world's own check group), then the cell's DDP on the same check batches. Collective:
    every rank of the cell calls it; every rank gets the same verdict."""
    t0 = time.perf_counter()
    if check_group is None and rep.world_size > 1:
        if rep.group is not None:
            raise ValueError("a cell on a subgroup needs its gradient check's own group (Extras.check_group)")
        check_group = gradcheck.world_check_group()
    batches = check_batches(rep)
    total, magnitude = local_gradients(rep, batches)
    reference, magnitude = gradcheck.reduce_reference(total, magnitude, check_group, rep.world_size)
    forward_backward(replace(rep, batches=batches))
    params = list(rep.model.parameters())
    produced = gradcheck.flat((p.grad for p in params), [p.numel() for p in params], rep.device)
    rep.opt.zero_grad(set_to_none=True)
    error = gradcheck.compare(produced, reference)
    tol = gradcheck.tolerance(rep.world_size, rep.cfg.gas, magnitude, float(reference.norm()))
    sync()
    ms = (time.perf_counter() - t0) * 1e3
    return GradCheck(gradcheck.verdict(rep.cfg.comm_hook, error, tol), error, tol, ms)


def local_gradients(rep: Replica, batches: list[tuple[torch.Tensor, ...]]) -> tuple[torch.Tensor, float]:
    """This rank's gradients alone, in fp64 (gradcheck.local_reference): eager, on a copy of the model outside
    DDP; compiled, through the cell's own compiled module with no communication (`no_sync`), so the reference
    has the compiled code's bits and the check judges DDP's communication, not the compiler's rounding."""
    fwd = lambda: autocast(rep.device)  # noqa: E731
    if rep.compiled is None:
        return gradcheck.local_reference(copy.deepcopy(rep.model), rep.workload.loss, batches, fwd)
    quiet = rep.module.no_sync() if rep.cfg.mode == "ddp" else nullcontext()
    with quiet:
        ran, local = compiled.count_collectives(
            lambda: gradcheck.local_reference(
                rep.module, rep.workload.loss, batches, fwd, lambda: micro_step_context(rep)
            )
        )
    if ran:  # a reference that communicated would share whatever the cell's communication got wrong
        raise StepError(
            f"the gradient check's local pass ran {ran} all-reduce(s) under no_sync(){_compile_text(rep.cfg)}"
        )
    return local


def timed_phase(cfg: StepConfig, rep: Replica, device: torch.device, sync: Callable[[], None], slowdown: float = 0.0):
    """(per-step slowest-rank times in ms, converged, steps taken). Fixed: `timed_steps` steps, converged
    None. Adaptive: batches of `timed_steps` until the median's interval is within ±target_rel_ci, or
    max_timed_steps / max_cell_s is reached. Between batches the ranks gather their times (outside any
    timed step), so every rank takes the same decision from the same numbers. `loop` timing gives one
    time, the mean step."""
    gather = (lambda t: gather_max(t, device, rep.group)) if distributed(cfg) else (lambda t: t)
    measure = _timer(cfg, rep, device, sync, slowed(lambda: train_step(rep), slowdown, sync))
    with counting_all_reduce(rep.trace):  # counts only inside traced steps; the gathers use all_gather
        if cfg.target_rel_ci is None:
            return gather(measure(cfg.timed_steps)), None, cfg.timed_steps
        own = measure(min(cfg.timed_steps, cfg.max_timed_steps))  # the first batch is capped too
        while True:
            times = gather(own)
            converged = median_rel_half_width(times) <= cfg.target_rel_ci
            if converged or len(times) >= cfg.max_timed_steps or sum(times) / 1e3 >= cfg.max_cell_s:
                return times, converged, len(times)
            own += measure(min(cfg.timed_steps, cfg.max_timed_steps - len(own)))


def _timer(cfg: StepConfig, rep: Replica, device: torch.device, sync: Hook, step: Hook) -> Callable[[int], list[float]]:
    """n -> the times of n steps, by the method `timing_as_run` picks."""
    method, _ = timing_as_run(cfg, device)
    if method == "events":
        return lambda n: time_events(step, n, device)
    if method == "loop":
        return lambda n: time_loop(step, n, sync)
    around = (rep.trace.start_step, rep.trace.end_step) if rep.trace else (lambda: None, lambda: None)
    return lambda n: time_steps(step, n, sync, *around)


def _measurement(
    cfg: StepConfig,
    rep: Replica,
    device: torch.device,
    times: list[float],
    peak: int | None,
    in_sync: bool,
    threads: int,
    setup_warmup_ms: tuple[float, float],
) -> Measurement:
    stats = summarize(times)
    timing, note = timing_as_run(cfg, device)
    if timing == "loop":
        stats["step_ms_cv"] = None  # one mean: no spread between steps to report
    sizes = bucket_sizes(rep.module)
    samples = cfg.samples_per_rank * rep.world_size  # global samples per optimizer step
    tokens = None if rep.tokens_per_sample is None else samples * rep.tokens_per_sample
    return Measurement(
        backend=dist.get_backend(rep.group) if distributed(cfg) else "none",
        device_type=device.type,
        n_params=n_params(rep.model),
        grad_bytes=grad_bytes(rep.model),
        num_threads=threads if device.type == "cpu" else torch.get_num_threads(),
        setup_ms=setup_warmup_ms[0],
        warmup_ms=setup_warmup_ms[1],
        **stats,
        tokens_per_s=None if tokens is None else tokens / (stats["step_ms"] / 1e3),
        samples_per_s=samples / (stats["step_ms"] / 1e3),
        peak_mem_bytes=peak,
        num_buckets=len(sizes),
        bucket_sizes_bytes=sizes,
        step_times_ms=times,
        replicas_in_sync=in_sync,
        timing_used=timing,
        timing_note=note,
    )
