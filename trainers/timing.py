"""How timed steps are timed (`StepConfig.timing`): `sync`, `events`, `loop`; and the benchmark-only
planted slowdown. Pure timing: no model, no process group."""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import torch

from trainers.config import StepConfig

Hook = Callable[[], None]


def time_steps(step: Hook, n: int, sync: Hook, before: Hook = lambda: None, after: Hook = lambda: None) -> list[float]:
    """Wall time of each of n calls (ms), the device synchronized before and after each; `before` and
    `after` run outside the timed region."""
    times = []
    for _ in range(n):
        before()
        sync()
        t0 = time.perf_counter()
        step()
        sync()
        times.append((time.perf_counter() - t0) * 1e3)
        after()
    return times


def time_events(step: Hook, n: int, device: torch.device) -> list[float]:
    """Time of each of n calls (ms) from CUDA events recorded on the current stream around it, read after the
    loop: the host never waits between steps, so it can queue step i+1 while step i runs (DDP's all-reduce
    stream is joined to the current stream before the optimizer step, so the end event covers it)."""
    torch.cuda.synchronize(device)
    pairs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(n)]
    for start, end in pairs:
        start.record()
        step()
        end.record()
    torch.cuda.synchronize(device)
    return [start.elapsed_time(end) for start, end in pairs]  # ms


def time_loop(step: Hook, n: int, sync: Hook) -> list[float]:
    """The seed's method: one wall-clock interval over n calls, synchronized once before and once after;
    returns [the mean call in ms] (there is no per-call time)."""
    sync()
    t0 = time.perf_counter()
    for _ in range(n):
        step()
    sync()
    return [(time.perf_counter() - t0) * 1e3 / n]


def timing_as_run(cfg: StepConfig, device: torch.device) -> tuple[str, str | None]:
    """(how the steps are timed here, why that differs from the cell's `timing` or what its rows lack)."""
    if cfg.timing == "events" and device.type != "cuda":
        return "sync", f"events need CUDA; timed with sync on {device.type}"
    if cfg.timing == "loop":
        return "loop", "loop: one mean over the timed steps, no per-step times (intervals from repeats only)"
    return cfg.timing, None


def slowed(step: Hook, fraction: float, sync: Hook) -> Hook:
    """Benchmark-only: `step`, then a sleep of `fraction` of the fastest step so far inside the timed region,
    so that a known difference can be planted in a real sweep (racing's validation). The fastest, not this
    step's own time: under DDP a rank's step includes waiting out its peers' sleeps, and a fraction of that
    compounds (at +900% a 2-rank cell's steps grew 0.4 s -> 14.6 s within 3 steps). It synchronizes after
    each step, so under `events` and `loop` timing a planted step is no longer asynchronous: plant
    slowdowns under `sync`."""
    if not fraction:
        return step
    fastest = [math.inf]  # s

    def run() -> None:
        t0 = time.perf_counter()
        step()
        sync()
        fastest[0] = min(fastest[0], time.perf_counter() - t0)
        time.sleep(fraction * fastest[0])

    return run
