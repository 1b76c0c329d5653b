"""DDP communication hooks as a cell names them (`StepConfig.comm_hook`): PyTorch's own hooks, built per
replica (a PowerSGD state holds error-feedback memory and must never be shared between cells).

    none      DDP's all-reduce (divide by the world size, sum)                    exact
    fp16      gradients cast to float16 for the all-reduce, back after            half the bytes, rounded
    bf16      the same in bfloat16 (PyTorch: CUDA 11+ and NCCL 2.10+ only)        half the bytes, rounded
    powersgd  rank-r factors P and Q all-reduced instead of each matrix          error feedback, lossy
              (Vogels et al. 2019); vectors and small tensors uncompressed
"""

from __future__ import annotations

from collections.abc import Callable

import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

from trainers.config import StepConfig

HookFn = Callable  # (state, GradBucket) -> Future[Tensor]


def comm_hook(cfg: StepConfig, group: dist.ProcessGroup | None = None) -> tuple[HookFn | None, object]:
    """(hook, state) for the cell on `group` (None: the default group); (None, None) for DDP's built-in
    all-reduce (a trace then does the same arithmetic itself: trainers.commtrace)."""
    if cfg.comm_hook == "fp16":
        return default_hooks.fp16_compress_hook, group  # state: the process group (None: the default one)
    if cfg.comm_hook == "bf16":
        return default_hooks.bf16_compress_hook, group
    if cfg.comm_hook == "powersgd":
        state = powerSGD_hook.PowerSGDState(
            process_group=group,
            matrix_approximation_rank=cfg.powersgd_rank,
            start_powerSGD_iter=cfg.powersgd_start_iter,
            use_error_feedback=True,
            warm_start=True,
            random_seed=cfg.seed,
        )
        if dist.get_backend(group) == "gloo":
            return bucket_by_bucket(powerSGD_hook.powerSGD_hook), state
        return powerSGD_hook.powerSGD_hook, state
    return None, None


def bucket_by_bucket(hook: HookFn) -> HookFn:
    """`hook`, finished before the next bucket's starts. PowerSGD launches its second all-reduce (Q) from
    the first one's callback; on gloo, which has no stream to order collectives, the next bucket's first
    all-reduce can then go out before it on one rank and after it on the other: the sizes disagree and gloo
    aborts the process (seen here with two buckets). Waiting keeps one order on every rank; what it costs is
    the overlap between buckets, on gloo only."""

    def ordered(state, bucket):
        fut = hook(state, bucket)
        fut.wait()
        return fut

    return ordered


def corrupted(hook: HookFn | None, factor: float) -> HookFn:
    """Benchmarks only (DDPSWEEP_CORRUPT): `hook` (None: DDP's all-reduce), with every all-reduced bucket then
    scaled by 1 + factor on every rank: replicas stay bit-identical and the gradient is wrong, which only the
    gradient check (trainers.gradcheck) can see."""
    inner = hook if hook is not None else default_hooks.allreduce_hook

    def perturbed(state, bucket):
        return inner(state, bucket).then(lambda fut: fut.value().mul_(1 + factor))

    return perturbed
