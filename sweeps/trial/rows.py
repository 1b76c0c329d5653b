"""The one place a result row (the schema in results/storage/schema.py) is assembled."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import UTC, datetime

from results.storage.schema import COLUMNS
from sweeps.plan.grid import Cell, Slot

MAX_ERROR_CHARS = 4000


@dataclass(frozen=True, kw_only=True)
class RowContext:
    """What every row of one group shares beyond its cell."""

    sweep_id: str
    cluster: str
    spec_name: str
    cpus_per_worker: float
    placement: str  # the Ray strategy used
    backend: str  # resolved for the group: nccl | gloo | none (single); a measured row records its own
    isolation: str
    group_id: str
    order_seed: int
    group_started_at: datetime
    group_setup_s: float | None = None  # known once the workers announce their first cell
    search: str = "grid"  # grid | race (results.analysis.racing)
    target_rel: float | None = None  # repeats: auto — the difference its rounds aim to resolve


def now() -> datetime:
    return datetime.now(UTC)


def _clip(message: str) -> str:
    if len(message) <= MAX_ERROR_CHARS:
        return message
    return message[: MAX_ERROR_CHARS // 2] + "\n…\n" + message[-MAX_ERROR_CHARS // 2 :]


def misplaced(cell: Cell, nodes: int | None, ranks_per_node: list[int] | None) -> str | None:
    """Why the observed placement is not the cell's topology (a measurement taken on the wrong number of
    nodes, or with ranks packed unevenly, must never be filed as the cell it is not), or None."""
    if nodes is None:
        return None  # the group reported no placement (an error row already)
    per_node = ranks_per_node or []
    if nodes != cell.num_nodes or any(n != cell.workers_per_node for n in per_node):
        seen = "+".join(map(str, per_node)) or "?"
        return (
            f"placement put the ranks {seen} on {nodes} node(s); the cell asks for topology {cell.topology} "
            f"({cell.workers_per_node} on each of {cell.num_nodes})"
        )
    return None


def build_row(
    slot: Slot, ctx: RowContext, *, started: datetime, wall_s: float, done: dict | None = None, error: str | None = None
) -> dict:
    """A row for one (cell, repeat): its configuration and placement, then the worker's `done` message
    (measurement, fingerprint, the ranks' placement) or the error. A measurement whose placement differs
    from the cell's topology is kept but becomes an error row (see misplaced)."""
    cell = slot.cell
    row = asdict(cell.step) | {
        "sweep_id": ctx.sweep_id,
        "cell_id": cell.cell_id,
        "repeat": slot.repeat,
        "cluster": ctx.cluster,
        "spec_name": ctx.spec_name,
        "started_at": started,
        "finished_at": now(),
        "trial_wall_s": wall_s,
        "world_size": cell.world_size,
        "num_nodes": cell.num_nodes,
        "workers_per_node": cell.workers_per_node,
        "tokens_per_step": None if cell.step.tokens_per_rank is None else cell.step.tokens_per_rank * cell.world_size,
        "env_grid": cell.env_grid,
        "grad_compression": cell.step.grad_compression,
        "cpus_per_worker": ctx.cpus_per_worker,
        "placement": ctx.placement,
        "backend": "none" if cell.step.mode == "single" else ctx.backend,  # a baseline may share a DDP group
        "isolation": ctx.isolation,
        "group_id": ctx.group_id,
        "round": slot.round,
        "order_in_round": slot.order_in_round,
        "order_seed": ctx.order_seed,
        "group_started_at": ctx.group_started_at,
        "group_setup_s": ctx.group_setup_s,
        "search": ctx.search,
        "target_rel": ctx.target_rel,
        "eliminated_at_round": None,  # set by the trial's round planner on the rows of a dropped cell's last round
    }
    if done is not None:
        placed = ("hosts", "rank_nodes", "rank_hosts", "rank_local_ranks", "rank_devices", "network", "ranks")
        placed += ("host_world_size",)
        row |= done.get("fingerprint", {}) | {k: done.get(k) for k in placed}
        row |= (done.get("measurement") or {}) | (done.get("control") or {})
        per_node = done.get("ranks_per_node")
        row["workers_per_node_observed"] = max(per_node) if per_node else None
        error = error or done.get("error") or misplaced(cell, done.get("nodes"), per_node)
    row = {k: v for k, v in row.items() if k in COLUMNS}
    row.update(status="error" if error else "ok", error=_clip(error or ""))
    return row
