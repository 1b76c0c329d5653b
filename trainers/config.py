"""Configuration of one measured cell, and the result it returns."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from trainers.errors import ConfigError
from trainers.model import PRESETS

MODES = ("single", "ddp", "naive")


@dataclass(frozen=True, kw_only=True)
class StepConfig:
    """One cell's training step, as every rank runs it."""

    model: str = "tiny"
    """Model preset name (see `trainers.model.PRESETS`)."""
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
    bucket_cap_mb: float = 25.0
    """DDP bucket capacity in MB (ignored outside `ddp` mode)."""
    gradient_as_bucket_view: bool = True
    """Make .grad a view into DDP's bucket memory."""
    warmup_steps: int = 3
    """Untimed optimizer steps before measuring."""
    timed_steps: int = 10
    """Measured optimizer steps; each one's wall time is kept."""
    seed: int = 1337
    """Model-init seed (same on every rank); data uses seed + rank."""

    def __post_init__(self) -> None:
        if self.model not in PRESETS:
            raise ConfigError("model", self.model, f"one of {', '.join(PRESETS)}")
        if self.mode not in MODES:
            raise ConfigError("mode", self.mode, f"one of {', '.join(MODES)}")
        for name in ("micro_batch", "seq_len", "gas", "timed_steps"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(name, value, "an integer >= 1")
        if isinstance(self.warmup_steps, bool) or not isinstance(self.warmup_steps, int) or self.warmup_steps < 0:
            raise ConfigError("warmup_steps", self.warmup_steps, "an integer >= 0")
        block = PRESETS[self.model].block_size
        if self.seq_len > block:
            raise ConfigError("seq_len", self.seq_len, f"1..{block} (block size of {self.model})")
        if isinstance(self.bucket_cap_mb, bool) or not self.bucket_cap_mb > 0:
            raise ConfigError("bucket_cap_mb", self.bucket_cap_mb, "a number of MB > 0")

    @property
    def tokens_per_rank(self) -> int:
        """Tokens one rank processes per optimizer step."""
        return self.micro_batch * self.seq_len * self.gas


@dataclass(frozen=True, kw_only=True)
class CellResult:
    """What rank 0 reports for one measured cell. Times in ms, memory in bytes."""

    mode: str
    world_size: int
    backend: str
    device_type: str
    model: str
    n_params: int
    grad_bytes: int  # bytes
    micro_batch: int
    seq_len: int
    tokens_per_step: int  # global: all ranks, all micro-steps
    bucket_cap_mb: float
    gas: int
    no_sync: bool
    gradient_as_bucket_view: bool
    warmup_steps: int
    timed_steps: int
    num_threads: int
    step_ms: float  # median of the per-step slowest-rank times
    step_ms_mean: float
    step_ms_p10: float
    step_ms_p90: float
    step_ms_cv: float  # std / mean
    tokens_per_s: float  # tokens_per_step / median step time
    peak_mem_bytes: int  # max over ranks: CUDA max allocated, or peak RSS on CPU
    num_buckets: int
    bucket_sizes_bytes: list[int] = field(default_factory=list)
    step_times_ms: list[float] = field(default_factory=list)
    replicas_in_sync: bool = True

    def to_dict(self) -> dict:
        return asdict(self)
