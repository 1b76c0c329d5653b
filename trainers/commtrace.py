"""Measured overlap: a DDP communication hook that does exactly what DDP's default hook does (divide the
bucket by the world size, all-reduce it) and records, for every bucket of every traced step, when its
all-reduce was launched and when it completed.

    launch   the hook is called when the bucket's last gradient is computed (so the last launch of a step
             is when backward compute ended)
    done     the all-reduce's future completed (gloo: the callback's wall clock; CUDA: an event recorded
             in the callback, on the stream the future's work is synchronized with)

Per step: `comm_ms` = the union of [launch, done] over buckets (time with communication in flight),
`exposed_ms` = last done − last launch (communication left after backward compute ended), and
`overlap_frac` = 1 − exposed / comm. DDP's backward returns only after every bucket is reduced, so the
exposed tail is part of the step time.
"""

# No `from __future__ import annotations` here: DDP checks the hook's annotations as real types.
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
import torch.distributed as dist


@dataclass
class CommTrace:
    """The hook's state: the current step's events, and every finished step's. `inner` is the hook it wraps
    (None: a plain all-reduce, DDP's default arithmetic) with its own state."""

    world_size: int
    cuda: bool
    inner: Callable | None = None
    inner_state: object = None
    group: dist.ProcessGroup | None = None  # the cell's ranks (None: the default group)
    recording: bool = False
    events: list[tuple[int, object, object]] = field(default_factory=list)  # (bucket, launch, done)
    steps: list[list[tuple[int, float, float]]] = field(default_factory=list)  # ms from the step's first launch
    sent: list[int] = field(default_factory=list)  # bytes of each all-reduce call of the current step
    bytes_per_step: list[int] = field(default_factory=list)  # bytes
    collectives_per_step: list[int] = field(default_factory=list)

    def _now(self):
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def start_step(self) -> None:
        self.recording, self.events, self.sent = True, [], []

    def end_step(self) -> None:
        """Close the step (after the device is synchronized): keep its events in ms from its first launch
        (events arrive in completion order, which need not be launch order), and its bytes."""
        self.recording = False
        self.bytes_per_step.append(sum(self.sent))
        self.collectives_per_step.append(len(self.sent))
        if not self.events:
            self.steps.append([])
            return
        ref = self.events[0][1]
        since = (lambda t: ref.elapsed_time(t)) if self.cuda else (lambda t: (t - ref) * 1e3)
        rel = [(b, since(launch), since(done)) for b, launch, done in self.events]
        first = min(launch for _, launch, _ in rel)
        self.steps.append(sorted((b, launch - first, done - first) for b, launch, done in rel))


def traced_hook(state: CommTrace, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """The wrapped hook (or DDP's default arithmetic: divide, then sum), with the bucket's launch and the
    completion of everything the hook ran for it recorded."""
    launch = state._now() if state.recording else None
    if state.inner is None:
        tensor = bucket.buffer().div_(state.world_size)
        fut = dist.all_reduce(tensor, group=state.group, async_op=True).get_future().then(lambda f: f.value()[0])
    else:
        fut = state.inner(state.inner_state, bucket)

    def done(f: torch.futures.Future) -> torch.Tensor:
        if launch is not None:
            state.events.append((bucket.index(), launch, state._now()))
        return f.value()

    return fut.then(done)


@contextmanager
def counting_all_reduce(trace: CommTrace | None) -> Iterator[None]:
    """Count the bytes of every `torch.distributed.all_reduce` call while the trace records (the hooks call
    it through the module, PowerSGD twice per bucket and once more from a callback): bytes actually sent,
    not assumed. Outside a traced cell, nothing is replaced."""
    if trace is None:
        yield
        return
    real = dist.all_reduce

    def counted(tensor, *args, **kwargs):
        if trace.recording:
            trace.sent.append(tensor.numel() * tensor.element_size())  # bytes
        return real(tensor, *args, **kwargs)

    dist.all_reduce = counted
    try:
        yield
    finally:
        dist.all_reduce = real


def _union_ms(intervals: list[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for lo, hi in sorted(intervals):
        if hi > end:
            total += hi - max(lo, end)
            end = hi
    return total


def summarize_trace(trace: CommTrace) -> dict:
    """Medians over the traced steps, and the timeline of the step whose communication time is the median."""
    per_step = []
    for events in trace.steps:
        if not events:
            continue
        comm = _union_ms([(launch, done) for _, launch, done in events])
        exposed = max(0.0, max(d for _, _, d in events) - max(la for _, la, _ in events))
        per_step.append((comm, exposed, events))
    if not per_step:
        return {}
    comms = [c for c, _, _ in per_step]
    median_step = min(per_step, key=lambda s: abs(s[0] - statistics.median(comms)))
    return {
        "comm_bytes_per_step": int(statistics.median(trace.bytes_per_step)) if trace.bytes_per_step else None,
        "comm_collectives_per_step": int(statistics.median(trace.collectives_per_step))
        if trace.collectives_per_step
        else None,
        "comm_ms": statistics.median(comms),
        "comm_exposed_ms": statistics.median(e for _, e, _ in per_step),
        "comm_overlap_frac": statistics.median(1 - e / c if c > 0 else 0.0 for c, e, _ in per_step),
        "comm_timeline_ms": [[float(b), la, d] for b, la, d in median_step[2]],
    }
