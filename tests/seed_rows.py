"""Rows built from the seed post's own measurements (8 GPUs, micro-batch 12 x 1024, S ~ 498 MB)."""

from __future__ import annotations

from datetime import UTC, datetime

TOKENS = 12 * 1024  # per rank per micro-step
GRAD_BYTES = 497_903_616  # gpt2-124m fp32 gradients (bytes)


def row(
    mode: str,
    world: int,
    step_ms: float,
    *,
    bucket: float | None = None,
    gas: int = 1,
    no_sync: bool = False,
    cluster: str = "pcie-8x",
    sweep: str = "seed",
    cv: float = 0.01,
    repeat: int = 0,
    **extra,
) -> dict:
    tokens = TOKENS * gas * world
    cell = f"{mode}-{world}-{bucket}-{gas}-{int(no_sync)}".replace(".", "p")
    base = {
        "sweep_id": sweep,
        "cell_id": cell,
        "repeat": repeat,
        "cluster": cluster,
        "status": "ok",
        "error": "",
        "spec_name": "seed",
        "started_at": datetime(2026, 1, 1, tzinfo=UTC),
        "finished_at": datetime(2026, 1, 1, tzinfo=UTC),
        "mode": mode,
        "world_size": world,
        "num_nodes": 1,
        "workers_per_node": world,
        "backend": "nccl",
        "device_type": "cuda",
        "model": "gpt2-124m",
        "n_params": GRAD_BYTES // 4,
        "grad_bytes": GRAD_BYTES,
        "micro_batch": 12,
        "seq_len": 1024,
        "tokens_per_step": tokens,
        "bucket_cap_mb": bucket,
        "gas": gas,
        "no_sync": no_sync,
        "gradient_as_bucket_view": True if mode == "ddp" else None,
        "warmup_steps": 10,
        "timed_steps": 30,
        "step_ms": step_ms,
        "step_ms_mean": step_ms,
        "step_ms_p10": step_ms * (1 - cv),
        "step_ms_p90": step_ms * (1 + cv),
        "step_ms_cv": cv,
        "tokens_per_s": tokens / (step_ms / 1e3),
        "replicas_in_sync": True,
        "accelerator": "RTX PRO 6000 Blackwell",
        "accelerators": 8,
        "torch_version": "2.9.1",
        "nccl_version": "2.27.5",
    }
    base.update(extra)
    return base


def seed_rows(**kw) -> list[dict]:
    """Single baseline 122.2 ms; the U-curve 1 MB 152.7, 25 MB 147.1, 500 MB 172.0; gas 4 with/without no_sync."""
    gas4_sync_ms = 8 * TOKENS * 4 / 674.8e3 * 1e3  # 674.8 ktok/s without no_sync
    return [
        row("single", 1, 122.2, **kw),
        row("ddp", 8, 152.7, bucket=1.0, **kw),
        row("ddp", 8, 149.0, bucket=5.0, **kw),
        row("ddp", 8, 147.1, bucket=25.0, **kw),
        row("ddp", 8, 155.3, bucket=100.0, **kw),
        row("ddp", 8, 172.0, bucket=500.0, **kw),
        row("ddp", 8, 521.5, bucket=25.0, gas=4, no_sync=True, **kw),
        row("ddp", 8, gas4_sync_ms, bucket=25.0, gas=4, no_sync=False, **kw),
    ]
