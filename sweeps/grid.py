"""Grid expansion: a spec becomes a deterministic list of cells, each with a stable id."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from itertools import product

from sweeps.spec import SweepSpec
from trainers.config import StepConfig


@dataclass(frozen=True, kw_only=True)
class Cell:
    """One point of the grid. Settings that do not apply to a mode are normalized away (None)."""

    mode: str  # single | ddp | naive
    model: str
    micro_batch: int
    seq_len: int
    warmup_steps: int
    timed_steps: int
    world_size: int
    num_nodes: int
    gas: int
    no_sync: bool  # False wherever gas == 1 or mode == single
    bucket_cap_mb: float | None  # ddp only
    gradient_as_bucket_view: bool | None  # ddp only
    backend: str  # as the spec asks: auto | nccl | gloo

    @property
    def cell_id(self) -> str:
        """Stable hash of the configuration: the same cell always gets the same id."""
        blob = json.dumps(asdict(self), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()[:12]

    @property
    def workers_per_node(self) -> int:
        return self.world_size // self.num_nodes

    def step_config(self) -> StepConfig:
        return StepConfig(
            model=self.model,
            mode=self.mode,
            micro_batch=self.micro_batch,
            seq_len=self.seq_len,
            gas=self.gas,
            no_sync=self.no_sync,
            bucket_cap_mb=self.bucket_cap_mb or 25.0,  # unused outside ddp
            gradient_as_bucket_view=self.gradient_as_bucket_view is not False,
            warmup_steps=self.warmup_steps,
            timed_steps=self.timed_steps,
        )

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> Cell:
        return cls(**data)


def _cell(spec: SweepSpec, **axes) -> Cell:
    mode, gas = axes["mode"], axes["gas"]
    return Cell(
        mode=mode,
        model=spec.model,
        micro_batch=spec.micro_batch,
        seq_len=spec.seq_len,
        warmup_steps=spec.warmup_steps,
        timed_steps=spec.timed_steps,
        world_size=axes.get("world_size", 1),
        num_nodes=axes.get("num_nodes", 1),
        gas=gas,
        no_sync=bool(axes.get("no_sync")) and gas > 1 and mode != "single",
        bucket_cap_mb=float(axes["bucket_cap_mb"]) if mode == "ddp" else None,
        gradient_as_bucket_view=axes.get("gradient_as_bucket_view") if mode == "ddp" else None,
        backend=spec.backend,
    )


def expand(spec: SweepSpec) -> list[Cell]:
    """Baselines first (one per gas), then the DDP grid; duplicates (e.g. no_sync at gas 1) dropped."""
    cells = [_cell(spec, mode="single", gas=g) for g in sorted(spec.gas)]
    for w, n, mode, g, ns, gv, b in product(
        spec.workers, spec.nodes, spec.modes, spec.gas, spec.no_sync, spec.gradient_as_bucket_view,
        spec.bucket_cap_mb,
    ):  # fmt: skip
        if w % n == 0 and w >= n:
            cells.append(_cell(spec, mode=mode, world_size=w, num_nodes=n, gas=g, no_sync=ns,
                               gradient_as_bucket_view=gv, bucket_cap_mb=b))  # fmt: skip
    seen: dict[str, Cell] = {}
    for c in cells:
        seen.setdefault(c.cell_id, c)
    return list(seen.values())


def cells_table(cells: list[Cell], repeats: int = 1) -> str:
    """The grid as a plain-text table (for --dry-run)."""
    head = ["cell_id", "mode", "workers", "nodes", "bucket_mb", "gas", "no_sync", "grad_view", "model", "batch"]
    rows = [head]
    for c in cells:
        rows.append([c.cell_id, c.mode, str(c.world_size), str(c.num_nodes),
                     "-" if c.bucket_cap_mb is None else f"{c.bucket_cap_mb:g}", str(c.gas),
                     str(c.no_sync).lower(), "-" if c.gradient_as_bucket_view is None else
                     str(c.gradient_as_bucket_view).lower(), c.model, f"{c.micro_batch}x{c.seq_len}"])  # fmt: skip
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = ["  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    lines.append(f"{len(cells)} cells x {repeats} repeat(s) = {len(cells) * repeats} trials")
    return "\n".join(lines)
