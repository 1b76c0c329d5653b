"""Configuration of one measured cell, and the result it returns."""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field

from trainers.errors import ConfigError
from trainers.knobs import BY_NAME, COMM_HOOKS, MODES, STEP_KNOBS, TIMINGS, StepKnobs, check
from trainers.presets import PRESETS

__all__ = ["COMM_HOOKS", "MODES", "TIMINGS", "Measurement", "StepConfig", "canonical_args"]

WORKLOAD_PATH = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*")


@dataclass(frozen=True, kw_only=True)
class StepConfig(StepKnobs):
    """One cell's training step, as every rank runs it: one field per knob of `trainers.knobs.StepKnobs`.

    Each field is checked against its knob; a knob that does not apply to the cell (`Knob.applies`, e.g. the
    bucket outside ddp mode) reads its `off` value, so one cell has one spelling."""

    def __post_init__(self) -> None:
        if self.workload is not None:
            self._check_workload()
        elif self.model not in PRESETS:
            raise ConfigError("model", self.model, f"one of {', '.join(PRESETS)}")
        for knob in STEP_KNOBS:
            value = getattr(self, knob.name)
            if knob.name in ("model", "workload") or (value is None and knob.value_off is None):
                continue  # checked above; null where a knob reads null when it does not apply (a None bucket)
            allowed = check(knob, value)
            if allowed is not None:
                raise ConfigError(knob.name, value, allowed)
        block = PRESETS[self.model].block_size if self.workload is None else self.seq_len
        if self.seq_len > block:
            raise ConfigError("seq_len", self.seq_len, f"1..{block} (block size of {self.model})")
        t = self.target_rel_ci
        if t is not None and not 0 < t < 1:
            raise ConfigError("target_rel_ci", t, "a fraction in (0, 1), e.g. 0.02 for ±2%")
        if self.comm_hook == "powersgd" and self.mode == "ddp" and self.powersgd_start_iter > self.warmup_steps:
            raise ConfigError(
                "powersgd_start_iter",
                self.powersgd_start_iter,
                f"at most warmup_steps ({self.warmup_steps}) so the timed steps are compressed (raise warmup_steps)",
            )
        self._check_timing()
        self._normalize()
        if self.mode == "ddp" and self.bucket_cap_mb is None:
            raise ConfigError("bucket_cap_mb", self.bucket_cap_mb, "a number of MB in [0.001, 100000]")

    def _check_workload(self) -> None:
        if not isinstance(self.workload, str) or not WORKLOAD_PATH.fullmatch(self.workload):
            raise ConfigError("workload", self.workload, "an import path `package.module:factory`")
        if self.workload.partition(":")[2].startswith("_"):
            raise ConfigError("workload", self.workload, "a public factory: a name that does not start with '_'")
        try:
            args = json.loads(self.workload_args)
        except (TypeError, ValueError):
            args = None
        if not isinstance(args, dict):
            raise ConfigError("workload_args", self.workload_args, "a JSON object of keyword arguments")
        object.__setattr__(self, "workload_args", canonical_args(args))
        object.__setattr__(self, "model", self.workload)  # rows, groups and reports name the workload
        object.__setattr__(self, "seq_len", 1)  # a preset's knob: one spelling for every workload cell

    def _check_timing(self) -> None:
        if self.timing == "loop" and self.target_rel_ci is not None:
            raise ConfigError("timing", self.timing, "sync or events with target_rel_ci (it needs per-step times)")

    def _normalize(self) -> None:
        """Knobs that do not apply to the cell read their `off` value (in table order: a knob's rule may read
        one normalized before it). gradient_as_bucket_view left None in ddp mode takes its default."""
        if self.mode == "ddp" and self.gradient_as_bucket_view is None:
            object.__setattr__(self, "gradient_as_bucket_view", BY_NAME["gradient_as_bucket_view"].default)
        for knob in STEP_KNOBS:
            if knob.applies is not None and not knob.applies(self):
                object.__setattr__(self, knob.name, knob.value_off)

    @property
    def grad_compression(self) -> str:
        """What the hook does to the gradients: none | fp16 | bf16 | powersgd-rank-N."""
        return f"powersgd-rank-{self.powersgd_rank}" if self.comm_hook == "powersgd" else self.comm_hook

    @property
    def tokens_per_rank(self) -> int | None:
        """Tokens one rank processes per optimizer step (None for a user workload: known where it runs)."""
        return None if self.workload is not None else self.micro_batch * self.seq_len * self.gas

    @property
    def samples_per_rank(self) -> int:
        """Samples (sequences for GPT) one rank processes per optimizer step."""
        return self.micro_batch * self.gas


def canonical_args(args: dict) -> str:
    """Workload arguments as canonical JSON: the same arguments always give the same text (and cell id)."""
    try:
        return json.dumps(args, sort_keys=True, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as e:
        raise ConfigError("workload_args", args, f"JSON values only ({e})") from None


@dataclass(frozen=True, kw_only=True)
class Measurement:
    """What rank 0 measured for one cell: measurements only (the configuration is the StepConfig).

    Times in ms, memory in bytes.
    """

    backend: str  # the process group's backend as run: nccl | gloo | none (single)
    device_type: str  # cuda | cpu
    n_params: int
    grad_bytes: int  # bytes
    num_threads: int  # torch intra-op threads per rank
    setup_ms: float  # model copy + optimizer + DDP wrapper for this cell
    warmup_ms: float  # all warm-up steps together (untimed steps, timed as a block)
    step_ms: float  # median of the per-step slowest-rank times
    step_ms_mean: float
    step_ms_p10: float
    step_ms_p90: float
    step_ms_cv: float | None  # std / mean (None: loop timing, one mean)
    tokens_per_s: float | None  # global tokens per step / median step time (None: the workload gives no tokens)
    samples_per_s: float  # global samples per step / median step time
    peak_mem_bytes: int | None  # max over ranks during this cell: CUDA max allocated, or VmHWM on Linux CPU
    num_buckets: int
    bucket_sizes_bytes: list[int] = field(default_factory=list)
    step_times_ms: list[float] = field(default_factory=list)
    timed_steps_run: int = 0  # how many timed steps were taken (fixed: timed_steps)
    converged: bool | None = None  # adaptive timing: the interval reached its target (None: fixed steps)
    comm_ms: float | None = None  # trace_comm, rank 0: time with an all-reduce in flight per step (median)
    comm_exposed_ms: float | None = None  # trace_comm: communication left after backward compute ended
    comm_overlap_frac: float | None = None  # trace_comm: 1 - exposed / comm
    comm_timeline_ms: list[list[float]] | None = None  # trace_comm: [bucket, launch, done] of the median step
    comm_bytes_per_step: int | None = None  # trace_comm: bytes all-reduced per optimizer step, rank 0 (median)
    comm_collectives_per_step: int | None = None  # trace_comm: all-reduce calls per optimizer step (median)
    replicas_in_sync: bool = True
    timing_used: str = "sync"  # how the steps were timed: sync | events | loop (events falls back to sync on CPU)
    timing_note: str | None = None  # why timing_used differs from the cell's timing, or what a loop row lacks
    grad_check: str | None = None  # exact | approximate | failed | indeterminate | off; None: not checked
    grad_rel_error: float | None = None  # relative L2 error of DDP's gradient against the fp64 reference
    grad_tol: float | None = None  # the relative error the reduction's rounding explains (within it: not failed)
    grad_check_ms: float | None = None  # the check's cost: one untimed step and the fp64 reduction
    grad_check_note: str | None = None  # indeterminate: why the local gradients could not be captured
    compile_s: float | None = None  # compiled cells: warm-up steps that compiled (the first, and any recompile), s
    compiled_graphs: int | None = None  # compiled cells: graphs the backend compiled (ddp_optimizer: one per split)
    recompiles_timed: int | None = None  # compiled cells: frames Dynamo compiled inside the timed steps (must be 0)
    collectives_per_step: int | None = None  # all-reduce calls in one untimed step after warm-up (profiler), rank 0
    rank_compute_ms: list[list[float]] | None = None  # each rank's no_sync forward + backward, per micro-step (PROBES)
    rank_wait_ms: list[float] | None = None  # each rank's median step minus its compute of the step (trainers.perrank)

    def to_dict(self) -> dict:
        return asdict(self)
