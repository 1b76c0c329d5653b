"""Building result rows (DESIGN.md's schema) from a cell, its measurement and its fingerprint."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from results.schema import COLUMNS
from sweeps.grid import Cell

MAX_ERROR_CHARS = 4000


@dataclass(frozen=True, kw_only=True)
class RowContext:
    """What identifies a row beyond its cell."""

    sweep_id: str
    cluster: str
    spec_name: str
    repeat: int
    cpus_per_worker: float
    placement: str  # the Ray strategy used


def now() -> datetime:
    return datetime.now(UTC)


def _base(cell: Cell, ctx: RowContext, started: datetime, wall_s: float) -> dict:
    return {
        "sweep_id": ctx.sweep_id,
        "cell_id": cell.cell_id,
        "repeat": ctx.repeat,
        "cluster": ctx.cluster,
        "spec_name": ctx.spec_name,
        "started_at": started,
        "finished_at": now(),
        "trial_wall_s": wall_s,
        "mode": cell.mode,
        "world_size": cell.world_size,
        "num_nodes": cell.num_nodes,
        "workers_per_node": cell.workers_per_node,
        "model": cell.model,
        "micro_batch": cell.micro_batch,
        "seq_len": cell.seq_len,
        "tokens_per_step": cell.micro_batch * cell.seq_len * cell.gas * cell.world_size,
        "bucket_cap_mb": cell.bucket_cap_mb,
        "gas": cell.gas,
        "no_sync": cell.no_sync,
        "gradient_as_bucket_view": cell.gradient_as_bucket_view,
        "warmup_steps": cell.warmup_steps,
        "timed_steps": cell.timed_steps,
        "cpus_per_worker": ctx.cpus_per_worker,
        "placement": ctx.placement,
    }


def ok_row(cell: Cell, ctx: RowContext, out: dict, started: datetime, wall_s: float) -> dict:
    """A measured cell: the worker's result and fingerprint under the cell's own configuration."""
    row = {k: v for k, v in out["result"].items() if k in COLUMNS}
    row.update(out["fingerprint"])
    row.update(_base(cell, ctx, started, wall_s))
    hosts = [h for h, _ in out["placement"]]
    row["hosts"] = sorted(set(hosts))
    actual_nodes = len({node for _, node in out["placement"]})
    if actual_nodes != cell.num_nodes:
        return error_row(cell, ctx, f"placement gave {actual_nodes} node(s); the cell asks for {cell.num_nodes}",
                         started, wall_s, extra=row)  # fmt: skip
    row.update(status="ok", error="")
    return row


def error_row(cell: Cell, ctx: RowContext, message: str, started: datetime, wall_s: float, extra: dict | None = None):
    """A cell that failed: its configuration, the error message, no measurement."""
    row = dict(extra or {})
    row.update(_base(cell, ctx, started, wall_s))
    if len(message) > MAX_ERROR_CHARS:
        message = message[: MAX_ERROR_CHARS // 2] + "\n…\n" + message[-MAX_ERROR_CHARS // 2 :]
    row.update(status="error", error=message)
    return row
