"""The one place a result row (the schema in results/schema.py) is assembled."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import UTC, datetime

from results.schema import COLUMNS
from sweeps.grid import Slot

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


def now() -> datetime:
    return datetime.now(UTC)


def _clip(message: str) -> str:
    if len(message) <= MAX_ERROR_CHARS:
        return message
    return message[: MAX_ERROR_CHARS // 2] + "\n…\n" + message[-MAX_ERROR_CHARS // 2 :]


def build_row(slot: Slot, ctx: RowContext, *, started: datetime, wall_s: float, done: dict | None = None,
              error: str | None = None) -> dict:  # fmt: skip
    """A row for one (cell, repeat): its configuration and placement, then the worker's `done` message
    (measurement, fingerprint, the ranks' hosts) or the error. A measurement taken on the wrong number
    of nodes is kept but becomes an error row: it must never be filed as the cell it is not."""
    cell = slot.cell
    row = asdict(cell.step) | {
        "sweep_id": ctx.sweep_id, "cell_id": cell.cell_id, "repeat": slot.repeat, "cluster": ctx.cluster,
        "spec_name": ctx.spec_name, "started_at": started, "finished_at": now(), "trial_wall_s": wall_s,
        "world_size": cell.world_size, "num_nodes": cell.num_nodes, "workers_per_node": cell.workers_per_node,
        "tokens_per_step": cell.step.tokens_per_rank * cell.world_size, "cpus_per_worker": ctx.cpus_per_worker,
        "placement": ctx.placement, "backend": ctx.backend, "isolation": ctx.isolation, "group_id": ctx.group_id,
        "round": slot.round, "order_in_round": slot.order_in_round, "order_seed": ctx.order_seed,
        "group_started_at": ctx.group_started_at, "group_setup_s": ctx.group_setup_s,
    }  # fmt: skip
    if done is not None:
        row |= done.get("fingerprint", {}) | {"hosts": done.get("hosts")}
        row |= (done.get("measurement") or {}) | (done.get("control") or {})
        error = error or done.get("error")
        if not error and done.get("nodes") != cell.num_nodes:
            error = f"placement gave {done.get('nodes')} node(s); the cell asks for {cell.num_nodes}"
    row = {k: v for k, v in row.items() if k in COLUMNS}
    row.update(status="error" if error else "ok", error=_clip(error or ""))
    return row
