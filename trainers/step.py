"""The measured DDP GPT step. `run_cell` runs on every rank (torchrun or a Ray Train worker).

The process group must already be initialized for `ddp` and `naive` modes; `single`
runs in one process with no wrapper and no collectives. Many cells may run one after another in
the same process and group: each starts from a copy of the same initial weights, with a new
optimizer and a new DDP wrapper (trainers.replica builds it), and `release` frees it all before the next.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

import torch
import torch.distributed as dist

from trainers import compiled, gradcheck, workload
from trainers.commtrace import counting_all_reduce, summarize_trace
from trainers.config import StepConfig
from trainers.errors import StepError
from trainers.gradcheck import OFF, GradCheck
from trainers.knobs import Measurement
from trainers.model import grad_bytes, n_params
from trainers.perrank import rank_figures
from trainers.plants import failing_backward, jittered, slowed_compute
from trainers.replica import (
    Replica,
    bucket_sizes,
    distributed,
    forward_backward,
    gather_max,
    replicas_in_sync,
    setup_replica,
    train_step,
    wrap_ddp,
)
from trainers.stats import median_rel_half_width, summarize
from trainers.timing import Hook, slowed, time_events, time_loop, time_steps, timing_as_run
from trainers.workload import Built


@dataclass(frozen=True)
class Extras:
    """What a cell's run does beside its configuration (none of it is part of the configuration)."""

    grad_check: bool | None = True  # check the gradient after the timed steps (trainers.gradcheck); None: not
    # this time (the configuration was checked at its first measurement), False: the sweep turned checks off
    check_group: dist.ProcessGroup | None = None  # the check's gloo group over the cell's ranks (None: the world's)
    slowdown: float = 0.0  # benchmarks only: each timed step made this fraction slower (trainers.timing.slowed)
    corruption: float = 0.0  # benchmarks only: all-reduced buckets scaled by 1 + this (trainers.hooks.corrupted)
    jitter: float = 0.0  # benchmarks only: relative noise in every backward, as GPU atomics give (trainers.plants)
    rank_slowdown: float = 0.0  # benchmarks only: this rank's forward + backward this fraction slower (a straggler)
    fail_in_backward: bool = False  # tests only: this rank raises in the middle of its first backward


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
    _plant(rep.model, extras, sync)
    sync()
    setup_ms = (time.perf_counter() - t0) * 1e3
    t0 = time.perf_counter()
    compile_s = compiled.warm_up(lambda: train_step(rep), cfg.warmup_steps, rep.compiled, _agree(rep))
    warm_for(rep, warmup_seconds(cfg, device) - (time.perf_counter() - t0))
    sync()
    warmup_ms = (time.perf_counter() - t0) * 1e3
    counted = {"collectives_per_step": check_collectives(rep)} if distributed(cfg) else {}
    if distributed(cfg):
        dist.barrier(group=group)
    activity = rep.compiled.activity() if rep.compiled else 0
    times, own, converged, steps = timed_phase(cfg, rep, device, sync, extras.slowdown)
    if rep.compiled:
        counted |= compiled_figures(rep, compile_s, rep.compiled.activity() - activity)
    counted |= rank_figures(rep, sync, own) if distributed(cfg) else {}
    traced = traced_steps(rep, sync) if cfg.trace_comm and cfg.mode == "ddp" else {}
    in_sync, checked = True, GradCheck(OFF)
    if distributed(cfg):
        in_sync = replicas_in_sync(rep.model, device, group)
        if extras.grad_check:
            checked = check_gradient(rep, extras.check_group, sync)
        elif extras.grad_check is None:
            checked = GradCheck(None)  # checked at an earlier measurement of the configuration
    peak = peak_memory_bytes(device, window)  # the check's own memory included
    if distributed(cfg):
        peak = None if peak is None else int(gather_max([float(peak)], device, group)[0])
        if dist.get_rank(group) != 0:
            return None
    m = _measurement(cfg, rep, device, times, peak, in_sync, num_threads, (setup_ms, warmup_ms))
    numerics = checked.to_dict() if distributed(cfg) else {}
    m = replace(m, timed_steps_run=steps, converged=converged, **traced, **numerics, **counted)
    if m.recompiles_timed:
        said = f"{m.recompiles_timed} recompilation(s) inside the timed steps: their times include compiling"
        m = replace(m, timing_note="; ".join(filter(None, [m.timing_note, said])))
    return m


def _plant(model: torch.nn.Module, extras: Extras, sync: Hook) -> None:
    """The benchmarks' and tests' faults in this rank's model (trainers.plants), where the extras ask for one."""
    if extras.jitter:
        jittered(model, extras.jitter)
    if extras.fail_in_backward:
        failing_backward(model)
    if extras.rank_slowdown:
        slowed_compute(model, extras.rank_slowdown, sync)


CUDA_WARMUP_S = 1.0  # warmup_s null on CUDA: an idle GPU's clocks come back within about this


def warmup_seconds(cfg: StepConfig, device: torch.device) -> float:
    """The cell's time-based warm-up: warmup_s, or by default CUDA_WARMUP_S on CUDA and none on CPU."""
    if cfg.warmup_s is not None:
        return cfg.warmup_s
    return CUDA_WARMUP_S if device.type == "cuda" else 0.0


def warm_for(rep: Replica, seconds: float) -> None:
    """Untimed steps until `seconds` have passed on every rank (the ranks decide each step alike)."""
    agree, t0 = _agree(rep), time.perf_counter()
    while seconds > 0 and agree(time.perf_counter() - t0 < seconds):
        train_step(rep)


TRACED_STEPS = 5  # trace_comm: steps traced after the timed ones (medians over them)


def traced_steps(rep: Replica, sync: Hook) -> dict:
    """trace_comm: the cell's step on a wrapper of its own with the tracing hook (the timed wrapper has none, so no
    Python hook, event or callback runs in a timed step), a warm-up (PowerSGD: until it compresses), then
    TRACED_STEPS traced steps; their medians (trainers.commtrace)."""
    module, trace = wrap_ddp(rep.model, rep.cfg, rep.device, rep.world_size, rep.group, rep.corruption)
    state = None
    if rep.cfg.compile:
        module, state = compiled.compile_module(module, rep.cfg)
    traced = replace(rep, module=module, trace=trace, compiled=state)
    warm = rep.cfg.powersgd_start_iter if rep.cfg.comm_hook == "powersgd" else 1
    compiled.warm_up(lambda: train_step(traced), warm, state, _agree(traced))
    with counting_all_reduce(trace):
        time_steps(lambda: train_step(traced), TRACED_STEPS, sync, trace.start_step, trace.end_step)
    return summarize_trace(trace)


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
    """The gradient check (trainers.gradcheck): one untimed step as the cell runs it, each local gradient
    captured before DDP's reducer sees it, then judged against DDP's .grad over `check_group` (None: the
    world's own check group). Collective: every rank of the cell calls it; every rank gets the same verdict."""
    t0 = time.perf_counter()
    if check_group is None and rep.world_size > 1:
        if rep.group is not None:
            raise ValueError("a cell on a subgroup needs its gradient check's own group (Extras.check_group)")
        check_group = gradcheck.world_check_group()
    rep.opt.zero_grad(set_to_none=True)
    capture = gradcheck.Capture(list(rep.model.parameters()), rep.cfg.gas)
    try:
        forward_backward(replace(rep, batches=check_batches(rep)))
        sync()
    finally:
        capture.remove()
    checked = gradcheck.result(capture, check_group, rep.world_size, rep.cfg.gas, rep.cfg.comm_hook)
    del capture
    rep.opt.zero_grad(set_to_none=True)
    sync()
    return replace(checked, grad_check_ms=(time.perf_counter() - t0) * 1e3)


def timed_phase(cfg: StepConfig, rep: Replica, device: torch.device, sync: Callable[[], None], slowdown: float = 0.0):
    """(per-step slowest-rank times in ms, this rank's own, converged, steps taken). Fixed: `timed_steps` steps,
    converged None. Adaptive: batches of `timed_steps` until the median's interval is within ±target_rel_ci, or
    max_timed_steps / max_cell_s is reached. Between batches the ranks gather their times (outside any
    timed step), so every rank takes the same decision from the same numbers. `loop` timing gives one
    time, the mean step."""
    gather = (lambda t: gather_max(t, device, rep.group)) if distributed(cfg) else (lambda t: t)
    measure = _timer(cfg, device, sync, slowed(lambda: train_step(rep), slowdown, sync))
    if cfg.target_rel_ci is None:
        own = measure(cfg.timed_steps)
        return gather(own), own, None, cfg.timed_steps
    own = measure(min(cfg.timed_steps, cfg.max_timed_steps))  # the first batch is capped too
    while True:
        times = gather(own)
        converged = median_rel_half_width(times) <= cfg.target_rel_ci
        if converged or len(times) >= cfg.max_timed_steps or sum(times) / 1e3 >= cfg.max_cell_s:
            return times, own, converged, len(times)
        own += measure(min(cfg.timed_steps, cfg.max_timed_steps - len(own)))


def _timer(cfg: StepConfig, device: torch.device, sync: Hook, step: Hook) -> Callable[[int], list[float]]:
    """n -> the times of n steps, by the method `timing_as_run` picks."""
    method, _ = timing_as_run(cfg, device)
    if method == "events":
        return lambda n: time_events(step, n, device)
    if method == "loop":
        return lambda n: time_loop(step, n, sync)
    return lambda n: time_steps(step, n, sync)


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
