"""Configuration of one measured cell, and the result it returns."""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field

from trainers.errors import ConfigError
from trainers.presets import PRESETS

MODES = ("single", "ddp", "naive")
COMM_HOOKS = ("none", "fp16", "bf16", "powersgd")
TIMINGS = ("sync", "events", "loop")
WORKLOAD_PATH = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*")


@dataclass(frozen=True, kw_only=True)
class StepConfig:
    """One cell's training step, as every rank runs it."""

    model: str = "tiny"
    """Model preset name (see `trainers.model.PRESETS`); with `workload`, the workload's import path."""
    workload: str | None = None
    """A user workload by import path, `package.module:factory` (trainers.workload); None: the preset."""
    workload_args: str = "{}"
    """The factory's keyword arguments as canonical JSON (sorted keys, compact)."""
    workload_fingerprint: str | None = None
    """Hash of the model's parameter names, shapes and dtypes, as planned (trainers.workload.fingerprint);
    the worker refuses a model that differs. For user workloads it joins the cell id, so two models filed
    under one name never mix (preset cells hash as before: a preset's name fixes its shapes)."""
    mode: str = "ddp"
    """`single` (one process, no wrapper: the baseline), `ddp`, or `naive` (all_reduce per .grad)."""
    micro_batch: int = 8
    """Sequences per rank per micro-step."""
    seq_len: int = 64
    """Tokens per sequence; at most the preset's block size."""
    gas: int = 1
    """Gradient-accumulation micro-steps per optimizer step."""
    no_sync: bool = False
    """Skip gradient sync on the first gas-1 micro-steps (DDP's `no_sync()`)."""
    bucket_cap_mb: float | None = 25.0
    """DDP bucket capacity in MB; None outside `ddp` mode (normalized away there)."""
    gradient_as_bucket_view: bool | None = True
    """Make .grad a view into DDP's bucket memory; None outside `ddp` mode."""
    warmup_steps: int = 3
    """Untimed optimizer steps before measuring."""
    timed_steps: int = 10
    """Measured optimizer steps; each one's wall time is kept. Adaptive (`target_rel_ci` set): the first
    batch, and the size of every further batch until the interval is narrow enough."""
    target_rel_ci: float | None = None
    """Adaptive timing: keep stepping until the 95% interval of the median step is within ±this fraction
    of it (0.02 = ±2%), or a cap is hit. None: exactly `timed_steps` steps."""
    max_timed_steps: int = 200
    """Adaptive timing: at most this many timed steps."""
    max_cell_s: float = 60.0
    """Adaptive timing: stop adding batches once the timed steps have taken this long (s)."""
    trace_comm: bool = False
    """Record each bucket's all-reduce launch and completion in the timed steps (a DDP comm hook doing
    what the default one does); ddp mode only."""
    seed: int = 1337
    """Model-init seed (same on every rank); data uses seed + rank."""
    comm_hook: str = "none"
    """DDP communication hook (ddp mode): `none` (DDP's own all-reduce), `fp16` / `bf16` (gradients cast to
    half precision for the all-reduce: half the bytes, rounded values), `powersgd` (a low-rank approximation
    with error feedback, Vogels et al. 2019). Every hook but `none` changes the numerics."""
    powersgd_rank: int = 1
    """`powersgd`: matrix_approximation_rank (1-4 typical); 1 for other hooks."""
    powersgd_start_iter: int = 2
    """`powersgd`: synchronized steps of plain all-reduce before compression starts (at least 2 with error
    feedback, PyTorch's rule). Under no_sync one optimizer step synchronizes once; otherwise every micro-step
    does. At most warmup_steps, so the timed steps are compressed; 2 for other hooks."""
    first_bucket_mb: float | None = None
    """Size of DDP's first bucket in MB (`torch.distributed._DEFAULT_FIRST_BUCKET_BYTES`, a private PyTorch
    knob, 1 MiB by default, set on every rank before wrapping and restored after); None: PyTorch's default."""
    static_graph: bool = False
    """DDP's static_graph (the graph and the parameters used are the same every step)."""
    broadcast_buffers: bool = True
    """DDP's broadcast_buffers (rank 0's buffers sent to every rank at each forward)."""
    timing: str = "sync"
    """How each timed step is timed: `sync` (wall clock, the device synchronized before and after every step),
    `events` (CUDA events recorded on the stream around each step and read after the loop: no host
    synchronization between steps; on CPU it falls back to `sync` and the row says so) or `loop` (the seed's
    method: one wall-clock interval over all timed steps, reported as the mean step: no per-step
    distribution, so intervals come from repeats only)."""

    def __post_init__(self) -> None:
        if self.workload is not None:
            self._check_workload()
        elif self.model not in PRESETS:
            raise ConfigError("model", self.model, f"one of {', '.join(PRESETS)}")
        if self.mode not in MODES:
            raise ConfigError("mode", self.mode, f"one of {', '.join(MODES)}")
        for name in ("micro_batch", "seq_len", "gas", "timed_steps", "max_timed_steps"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(name, value, "an integer >= 1")
        if isinstance(self.warmup_steps, bool) or not isinstance(self.warmup_steps, int) or self.warmup_steps < 0:
            raise ConfigError("warmup_steps", self.warmup_steps, "an integer >= 0")
        block = PRESETS[self.model].block_size if self.workload is None else self.seq_len
        if self.seq_len > block:
            raise ConfigError("seq_len", self.seq_len, f"1..{block} (block size of {self.model})")
        t = self.target_rel_ci
        if t is not None and (not isinstance(t, int | float) or isinstance(t, bool) or not 0 < t < 1):
            raise ConfigError("target_rel_ci", t, "a fraction in (0, 1), e.g. 0.02 for ±2%")
        if isinstance(self.max_cell_s, bool) or not isinstance(self.max_cell_s, int | float) or self.max_cell_s <= 0:
            raise ConfigError("max_cell_s", self.max_cell_s, "a number of seconds > 0")
        self._check_ddp_knobs()
        self._check_timing()
        self._normalize()
        b = self.bucket_cap_mb
        if self.mode == "ddp" and (not isinstance(b, int | float) or isinstance(b, bool) or not b > 0):
            raise ConfigError("bucket_cap_mb", self.bucket_cap_mb, "a number of MB > 0")

    def _check_workload(self) -> None:
        if not isinstance(self.workload, str) or not WORKLOAD_PATH.fullmatch(self.workload):
            raise ConfigError("workload", self.workload, "an import path `package.module:factory`")
        try:
            args = json.loads(self.workload_args)
        except (TypeError, ValueError):
            args = None
        if not isinstance(args, dict):
            raise ConfigError("workload_args", self.workload_args, "a JSON object of keyword arguments")
        object.__setattr__(self, "workload_args", canonical_args(args))
        object.__setattr__(self, "model", self.workload)  # rows, groups and reports name the workload
        object.__setattr__(self, "seq_len", 1)  # a preset's knob: one spelling for every workload cell

    def _check_ddp_knobs(self) -> None:
        if self.comm_hook not in COMM_HOOKS:
            raise ConfigError("comm_hook", self.comm_hook, f"one of {', '.join(COMM_HOOKS)}")
        for name, lo in (("powersgd_rank", 1), ("powersgd_start_iter", 2)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < lo:
                raise ConfigError(name, value, f"an integer >= {lo}")
        if self.comm_hook == "powersgd" and self.mode == "ddp" and self.powersgd_start_iter > self.warmup_steps:
            raise ConfigError(
                "powersgd_start_iter",
                self.powersgd_start_iter,
                f"at most warmup_steps ({self.warmup_steps}), so the timed steps are compressed",
            )
        f = self.first_bucket_mb
        if f is not None and (not isinstance(f, int | float) or isinstance(f, bool) or not 0 < f <= 100_000):
            raise ConfigError("first_bucket_mb", f, "a number of MB in (0, 100000], or null for PyTorch's 1 MiB")
        for name in ("static_graph", "broadcast_buffers"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(name, getattr(self, name), "true or false")

    def _check_timing(self) -> None:
        if self.timing not in TIMINGS:
            raise ConfigError("timing", self.timing, f"one of {', '.join(TIMINGS)}")
        if self.timing == "loop" and self.target_rel_ci is not None:
            raise ConfigError("timing", self.timing, "sync or events with target_rel_ci (it needs per-step times)")
        if self.timing != "sync" and self.trace_comm and self.mode == "ddp":
            raise ConfigError("timing", self.timing, "sync with trace_comm (the trace reads each step after a sync)")

    @property
    def grad_compression(self) -> str:
        """What the hook does to the gradients: none | fp16 | bf16 | powersgd-rank-N."""
        return f"powersgd-rank-{self.powersgd_rank}" if self.comm_hook == "powersgd" else self.comm_hook

    def _normalize(self) -> None:
        """Settings that do not apply to the mode become None/False, so one cell has one spelling."""
        if self.comm_hook != "powersgd":
            object.__setattr__(self, "powersgd_rank", 1)
            object.__setattr__(self, "powersgd_start_iter", 2)
        if self.mode != "ddp":
            object.__setattr__(self, "bucket_cap_mb", None)
            object.__setattr__(self, "gradient_as_bucket_view", None)
            object.__setattr__(self, "trace_comm", False)
            for name in ("comm_hook", "first_bucket_mb", "static_graph", "broadcast_buffers"):
                object.__setattr__(self, name, getattr(StepConfig, name))
            object.__setattr__(self, "powersgd_rank", 1)
            object.__setattr__(self, "powersgd_start_iter", 2)
        elif self.gradient_as_bucket_view is None:
            object.__setattr__(self, "gradient_as_bucket_view", True)
        if self.gas == 1 or self.mode == "single":
            object.__setattr__(self, "no_sync", False)

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

    def to_dict(self) -> dict:
        return asdict(self)
