"""What a cell's run returns: its measurements, one field per column of the row (results.storage.schema derives those
columns from these fields; the comment beside each field is its column's documentation). Torch-free."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass(frozen=True, kw_only=True)
class Measurement:
    """What rank 0 measured for one cell: measurements only (the configuration is the StepConfig).

    Times in ms, memory in bytes.
    """

    backend: str  # the process group's backend as run: nccl | gloo | none (single)
    device_type: str  # cuda | cpu
    n_params: int  # parameters of the model (a tied head counted once)
    grad_bytes: int  # bytes of gradient all-reduced per step (fp32)
    num_threads: int  # torch intra-op threads per rank
    setup_ms: float  # model copy + optimizer + DDP wrapper for this cell
    warmup_ms: float  # all warm-up steps of this cell (untimed steps, timed as a block)
    step_ms: float  # median of the per-step slowest-rank times
    step_ms_mean: float  # mean of the per-step slowest-rank times
    step_ms_p10: float  # 10th percentile of the per-step times
    step_ms_p90: float  # 90th percentile of the per-step times
    step_ms_cv: float | None  # std / mean of the per-step times (null for loop timing: one mean)
    tokens_per_s: float | None  # global tokens per step / median step (null where the workload gives no tokens)
    samples_per_s: float  # global samples per step / median step
    peak_mem_bytes: int | None  # max over ranks during this cell: CUDA max allocated, or VmHWM on Linux CPU
    num_buckets: int  # DDP's gradient buckets (after its rebuild)
    bucket_sizes_bytes: list[int] = field(default_factory=list)  # each bucket's bytes, from DDP's logging data
    step_times_ms: list[float] = field(default_factory=list)  # every timed step: the slowest rank's time, in order
    timed_steps_run: int = 0  # timed steps actually taken (fixed timing: timed_steps)
    converged: bool | None = None  # adaptive timing reached its target; null for fixed steps
    comm_ms: float | None = None  # trace_comm (rank 0): time with an all-reduce in flight, per step (median)
    comm_exposed_ms: float | None = None  # trace_comm: communication left after backward compute ended
    comm_overlap_frac: float | None = None  # trace_comm: 1 - exposed / comm
    comm_timeline_ms: list[list[float]] | None = None  # trace_comm: [bucket, launch, done] of the median step
    comm_bytes_per_step: int | None = None  # trace_comm: bytes all-reduced per optimizer step by rank 0 (median)
    comm_collectives_per_step: int | None = None  # trace_comm: all-reduce calls per optimizer step (median)
    replicas_in_sync: bool = True  # every rank's parameters bit-identical after the timed steps
    timing_used: str = "sync"  # how the steps were timed: sync | events | loop (events falls back to sync on CPU)
    timing_note: str | None = None  # why timing_used differs from the cell's timing, or what a loop row lacks
    grad_check: str | None = None  # exact | approximate | failed | indeterminate | off; null: not checked
    grad_rel_error: float | None = None  # DDP's gradient vs the fp64 reference: relative L2 error
    grad_tol: float | None = None  # the relative error the reduction's rounding explains (trainers.gradcheck)
    grad_check_ms: float | None = None  # the check's cost, after the timed steps: one untimed step, the fp64 sum
    grad_check_note: str | None = None  # indeterminate: why the local gradients could not be captured
    compile_s: float | None = None  # compiled cells: the warm-up steps that compiled (first and recompiles), s
    compiled_graphs: int | None = None  # compiled cells: graphs the backend compiled (ddp_optimizer: one per split)
    recompiles_timed: int | None = None  # compiled cells: frames Dynamo compiled inside the timed steps (must be 0)
    collectives_per_step: int | None = None  # all-reduce calls in one untimed step after warm-up (profiler), rank 0
    rank_compute_ms: list[list[float]] | None = None  # per rank: no_sync forward + backward per probe, ms
    rank_wait_ms: list[float] | None = None  # per rank: its median step minus its compute of the step

    def to_dict(self) -> dict:
        return asdict(self)
