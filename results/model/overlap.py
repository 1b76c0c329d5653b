"""The DDP overlap model: a step's time from one profiled micro-step, DDP's bucket layout and the all-reduce cost.

Pure (numpy only): the inputs are a `Profile` (trainers.profile measures it on one rank, outside DDP), the
cell's knobs and t(bytes), the all-reduce time of a message on the cell's placement (results.model.costmodel fits it
to a calibration). For one micro-step, with four terms of the cluster beyond t(bytes) (`Terms`, measured by
`ddpsweep calibrate` on the placement's ranks; g = 1, c = κ = λ = 0 reproduce the plain α–β overlap model):

    g           sharing: the profile's compute (one rank alone) takes g times as long inside the group, where the
                other ranks compute too (a CPU node's cores, a GPU host's memory and PCIe); every time below is
                the profile's x g
    c           per-bucket cost on the compute stream, ms: the reducer's work for each bucket (the copy into it,
                the hook, the launch) delays everything after it in the backward
    κ           contention: compute runs at 1 / (1 + κ) of its rate while a collective is in flight (gloo's
                threads share the cores; NCCL's kernels share the SMs)
    λ           the other side of it: a collective runs at 1 / (1 + λ) of its rate while the backward's compute
                runs (on a CPU node both sides share the cores: with κ = λ = 1 overlapping buys nothing)
    buckets     DDP's assignment (reducer.cpp, compute_bucket_assignment_by_size) over the gradients in the order
                they became ready: a bucket closes once its bytes reach its limit ([first, cap, cap, …])
    w_i         compute done when bucket i is launched: the ready time of its last gradient + c·(i + 1)
    W           the backward's compute: backward + c·(number of buckets)
    τ(w)        the wall time at which compute w is done: compute advances at rate 1 outside the collectives'
                intervals [start_j, end_j) and at 1 / (1 + κ) inside them
    ready_i     τ(w_i), in ms after the backward started
    start_i     max(ready_i, end_{i-1}): one collective at a time, in bucket order (the reducer's)
    end_i       start_i + t(bytes_i) (bytes as the hook sends them, fp16 / bf16: half), the part of it beside the
                compute taking (1 + λ) times as long: the compute left at start_i, R, runs at 1 / (1 + κ)
                meanwhile, so end_i = start_i + (1 + λ) t where (1 + λ) t ≤ (1 + κ) R, else
                start_i + (1 + κ) R + t − (1 + κ) R / (1 + λ)
    synced      forward + max(τ(W), end_last)       (DDP waits for every bucket before the backward ends)
    unsynced    forward + backward                  (no_sync(): nothing is sent, no bucket is launched)
    step        synced x (gas if no no_sync else 1) + unsynced x (the rest) + optimizer

The left arm of the U-curve comes from c and κ: many small buckets put c on the critical path many times, and
start communicating early, so more of the backward runs slowed. α–β alone only charges the comm stream.

Where it is known to be wrong, in the direction it errs:
- g, c and κ are measured with one micro-batch of the calibrating spec's workload; another workload on the
  placement borrows them;
- PowerSGD and compiled steps are not modeled (None): their communication is not DDP's buckets.
One named factor per placement may absorb what remains (`fit_slowdown`: compute x s, fitted to measured cells and
shown beside the predictions as a diagnostic), never hidden in t(bytes) or in the predictions.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

MiB = 1024 * 1024  # DDP's "MB" is a MiB: bucket_cap_mb * 1024 * 1024 bytes
HALF = {"fp16", "bf16"}  # hooks that send 2 bytes per fp32 gradient element


@dataclass(frozen=True, kw_only=True)
class Profile:
    """One rank's micro-step without DDP, in ms (medians over repeats; trainers.profile)."""

    forward_ms: float
    backward_ms: float  # the backward's end, from its start
    optimizer_ms: float
    ready_ms: tuple[float, ...]  # each parameter's gradient ready, ms after the backward started (parameter order)
    nbytes: tuple[int, ...]  # each parameter's gradient, bytes (parameter order)
    order: tuple[int, ...]  # parameter indices in the order their gradients became ready
    grad_bytes: int | None = None  # bytes of the trainable parameters' gradients (None: profiles stored before it)

    @property
    def gradient_bytes(self) -> int:
        """Bytes of gradients DDP all-reduces (every parameter's where the profile predates `grad_bytes`)."""
        return sum(self.nbytes) if self.grad_bytes is None else self.grad_bytes

    @classmethod
    def from_dict(cls, raw: object) -> Profile:
        """The model's fields of a profile as trainers.profile gives it (or JSON stored it: lists); a ValueError
        naming the field where one is missing or not numbers."""
        if not isinstance(raw, dict):
            raise ValueError(f"a profile is a JSON object, not {type(raw).__name__}")
        missing = [f for f in FIELDS if f not in raw]
        if missing:
            raise ValueError(f"{missing[0]}: missing")
        given = {f: tuple(raw[f]) if isinstance(raw[f], list | tuple) else raw[f] for f in FIELDS}
        return cls(**given, grad_bytes=raw.get("grad_bytes"))

    def __post_init__(self) -> None:
        for name in ("forward_ms", "backward_ms", "optimizer_ms"):
            _times(name, (getattr(self, name),))
        _times("ready_ms", self.ready_ms)
        if self.backward_ms <= 0:
            raise ValueError(f"backward_ms: {self.backward_ms} is not a positive time")
        n = len(self.nbytes)
        if n == 0 or any(type(b) is not int or b <= 0 for b in self.nbytes):  # noqa: E721 — bool is not a size
            raise ValueError("nbytes: must be one positive whole number of bytes per parameter")
        if self.grad_bytes is not None and (type(self.grad_bytes) is not int or self.grad_bytes <= 0):  # noqa: E721
            raise ValueError(f"grad_bytes: {self.grad_bytes!r} is not a positive whole number of bytes")
        if len(self.ready_ms) != n or any(type(i) is not int for i in self.order) or sorted(self.order) != [*range(n)]:
            raise ValueError("ready_ms, nbytes and order must cover the same parameters")


def _times(name: str, values: tuple) -> None:
    """Times in ms: finite numbers, none negative."""
    for v in values:
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v < 0:
            raise ValueError(f"{name}: {v!r} is not a time in ms (finite, not negative)")


FIELDS = ("forward_ms", "backward_ms", "optimizer_ms", "ready_ms", "nbytes", "order")


@dataclass(frozen=True)
class Step:
    """A predicted step: its time and the synced micro-step's communication timeline."""

    step_ms: float
    comm_ms: float  # per synced micro-step: the collectives' own time
    exposed_ms: float  # per synced micro-step: communication left after the backward (with its bucket costs) ended
    timeline: tuple[tuple[float, float, float], ...]  # (ready, start, end) per bucket, ms after the backward started


def bucket_layout(order: Sequence[int], nbytes: Sequence[int], cap_bytes: int, first_bytes: int | None = None):
    """Buckets as lists of parameter indices, in the order they fill (DDP's assignment over `order`)."""
    limits = [cap_bytes] if first_bytes is None else [first_bytes, cap_bytes]
    buckets: list[list[int]] = []
    current: list[int] = []
    size = 0
    for i in order:
        current.append(i)
        size += nbytes[i]
        if size >= limits[min(len(buckets), len(limits) - 1)]:
            buckets.append(current)
            current, size = [], 0
    return buckets + ([current] if current else [])


def layout_for(profile: Profile, bucket_cap_mb: float, first_bucket_mb: float | None = None) -> list[list[int]]:
    """The cell's buckets: its cap (and first bucket) over the profile's gradient-ready order."""
    first = None if first_bucket_mb is None else int(first_bucket_mb * MiB)
    return bucket_layout(profile.order, profile.nbytes, int(bucket_cap_mb * MiB), first)


@dataclass(frozen=True, kw_only=True)
class Terms:
    """The cluster's costs beyond t(bytes), measured on a placement's ranks (sweeps' calibration)."""

    compute: float = 1.0
    """g: the profile's compute takes g times as long beside the group's other ranks."""
    bucket_ms: float = 0.0
    """c: compute-stream time per DDP bucket (copy into the bucket, hook, launch), ms."""
    contention: float = 0.0
    """κ: compute takes (1 + κ) times as long while a collective is in flight."""
    comm_contention: float = 0.0
    """λ: a collective takes (1 + λ) times as long while compute runs beside it."""

    def __post_init__(self) -> None:
        for name in ("compute", "bucket_ms", "contention", "comm_contention"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v < 0:
                raise ValueError(f"{name}: {v!r} is not a finite number >= 0")
        if self.compute == 0:
            raise ValueError("compute: 0 is not a factor of compute time (> 0)")


NO_TERMS = Terms()


class _Compute:
    """Compute's progress on the wall clock: rate 1, or 1 / (1 + κ) inside the collectives' intervals."""

    def __init__(self, contention: float) -> None:
        self.slow = 1.0 / (1.0 + contention)
        self.now = self.done = 0.0  # wall ms, compute ms
        self.busy: list[tuple[float, float]] = []  # the collectives' [start, end), in order, not overlapping
        self.first = 0  # the first interval that has not ended by now

    def done_by(self, wall: float) -> float:
        """Compute done by wall time `wall` (≥ now) if it ran without pause, as far as the intervals so far say
        (on a copy: this compute's own clock stays where it is)."""
        probe = copy.copy(self)  # shares `busy`, which it only reads
        while probe.now < wall:
            rate, until = probe._rate()
            step = (wall if until is None else min(wall, until)) - probe.now
            probe.done, probe.now = probe.done + step * rate, probe.now + step
        return probe.done

    def reach(self, work: float) -> float:
        """The wall time at which `work` ms of compute are done (never before now: compute is sequential)."""
        while self.done < work:
            rate, until = self._rate()
            need = (work - self.done) / rate
            if until is None or self.now + need <= until:
                self.now, self.done = self.now + need, work
                break
            self.done += (until - self.now) * rate
            self.now = until
        return self.now

    def _rate(self) -> tuple[float, float | None]:
        """Compute's rate from now, and until when it holds (None: to the end). Time only moves forward, so the
        intervals that ended before now are skipped once (a timeline costs O(buckets), not O(buckets²))."""
        while self.first < len(self.busy) and self.busy[self.first][1] <= self.now:
            self.first += 1
        if self.first == len(self.busy):
            return 1.0, None
        start, end = self.busy[self.first]
        return (self.slow, end) if start <= self.now else (1.0, start)


def timeline(
    profile: Profile, buckets: list[list[int]], t: Callable[[int], float], hook: str = "none", terms: Terms = NO_TERMS
):
    """(ready, start, end) per bucket, and the backward's end, in wall ms after the backward started: each bucket
    starts when it is launched and the previous one has ended (see the module docstring)."""
    compute = _Compute(terms.contention)
    total = profile.backward_ms + terms.bucket_ms * len(buckets)  # W
    out, end = [], 0.0
    for k, b in enumerate(buckets):
        ready = compute.reach(max(profile.ready_ms[i] for i in b) + terms.bucket_ms * (k + 1))
        sent = sum(profile.nbytes[i] for i in b) // (2 if hook in HALF else 1)
        start = max(ready, end)
        beside = (total - compute.done_by(start)) * (1 + terms.contention)  # wall ms the compute still runs
        end = start + _comm_wall(float(t(sent)), max(0.0, beside), terms.comm_contention)
        compute.busy.append((start, end))
        out.append((ready, start, end))
    return tuple(out), compute.reach(total)


def _comm_wall(alone: float, beside: float, slowed: float) -> float:
    """Wall ms of a collective of `alone` ms that has compute beside it for its first `beside` ms, running at
    1 / (1 + λ) of its rate meanwhile and at its full rate after."""
    if alone * (1 + slowed) <= beside:
        return alone * (1 + slowed)
    return beside + alone - beside / (1 + slowed)


def predict_step(
    profile: Profile,
    buckets: list[list[int]],
    t: Callable[[int], float],
    *,
    gas: int = 1,
    no_sync: bool = False,
    hook: str = "none",
    slowdown: float = 1.0,
    terms: Terms = NO_TERMS,
) -> Step:
    """The step of a DDP cell (see the module docstring); `slowdown` scales the profile's compute (beside g)."""
    slowdown *= terms.compute
    fwd, bwd, opt = (x * slowdown for x in (profile.forward_ms, profile.backward_ms, profile.optimizer_ms))
    scaled = Profile(
        forward_ms=fwd,
        backward_ms=bwd,
        optimizer_ms=opt,
        ready_ms=tuple(r * slowdown for r in profile.ready_ms),
        nbytes=profile.nbytes,
        order=profile.order,
    )
    line, backward_end = timeline(scaled, buckets, t, hook, terms)
    last = line[-1][2] if line else 0.0
    synced = fwd + max(backward_end, last)
    n_synced = 1 if no_sync else gas
    step = synced * n_synced + (fwd + bwd) * (gas - n_synced) + opt
    comm = sum(e - s for _, s, e in line)
    return Step(step_ms=step, comm_ms=comm, exposed_ms=max(0.0, last - backward_end), timeline=line)


def fit_slowdown(predict: Callable[[float], np.ndarray], measured: np.ndarray) -> float:
    """The one compute factor s (0.5..8) whose predictions have the smallest median |predicted / measured - 1|."""
    grid = np.exp(np.linspace(np.log(0.5), np.log(8.0), 241))
    errors = [np.median(np.abs(predict(s) / measured - 1)) for s in grid]
    return float(grid[int(np.argmin(errors))])


def accuracy(predicted: Sequence[float], measured: Sequence[float], best_set: set[int] | None = None) -> dict:
    """How far a curve's predictions are from its measurements: median |predicted / measured - 1|, Spearman's
    rank correlation, the predicted best's index, and whether it lies in `best_set` (the indices of the measured
    cells that cannot be told apart from the measured best)."""
    p, m = np.asarray(predicted, dtype=float), np.asarray(measured, dtype=float)
    rho = spearman(p, m)
    best = int(np.argmin(p))
    return {
        "median_abs_error": float(np.median(np.abs(p / m - 1))),
        "spearman": rho,
        "predicted_best": best,
        "predicted_best_in_set": None if best_set is None else best in best_set,
    }


def spearman(a: Sequence[float], b: Sequence[float]) -> float | None:
    """Spearman's rank correlation (average ranks for ties); None with fewer than 2 points or a constant side."""
    ra, rb = pd.Series(a, dtype=float).rank().to_numpy(), pd.Series(b, dtype=float).rank().to_numpy()
    if len(ra) < 2 or ra.std() == 0 or rb.std() == 0:
        return None
    return float(np.corrcoef(ra, rb)[0, 1])
