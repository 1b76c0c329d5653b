"""Pre-flight: every cell must be schedulable on the cluster before the first trial starts.

Ray Train retries a worker group that can never be placed forever; ddpsweep refuses such a
grid up front instead, naming what is missing.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from sweeps.plan.grid import Cell
from sweeps.spec.sweep import SpecError
from sweeps.trial.options import placement_for

# The Tune trial's own bundle: memory only, so it takes no CPU from the workers (a {"cpu": 0.01}
# bundle makes 2 workers x 1 CPU unschedulable on a 2-CPU node: 2.01 > 2).
TRIAL_BUNDLE = {"memory": 2**20}  # bytes


@dataclass(frozen=True)
class ClusterResources:
    """Per alive node: its CPU and GPU count."""

    nodes: list[tuple[float, float]]  # (CPU, GPU)

    @classmethod
    def local(cls, gpus: int = 0) -> ClusterResources:
        """The embedded single-node Ray ddpsweep would start on this machine."""
        return cls(nodes=[(float(os.cpu_count() or 1), float(gpus))])

    @classmethod
    def from_ray(cls) -> ClusterResources:
        import ray

        alive = [n["Resources"] for n in ray.nodes() if n.get("Alive")]
        return cls(nodes=[(r.get("CPU", 0.0), r.get("GPU", 0.0)) for r in alive])

    @property
    def total_gpus(self) -> float:
        return sum(g for _, g in self.nodes)

    def describe(self) -> str:
        return f"{len(self.nodes)} node(s): " + ", ".join(f"{c:g} CPU/{g:g} GPU" for c, g in self.nodes)


def nodes_fitting(cpus: float, use_gpu: bool) -> list[tuple[str, int]]:
    """The alive nodes of the connected cluster as (node id, ranks of `cpus` (+ 1 GPU) it fits), most first."""
    import ray

    alive = [n for n in ray.nodes() if n.get("Alive")]
    fits = [
        (n["NodeID"], _workers_fitting((n["Resources"].get("CPU", 0.0), n["Resources"].get("GPU", 0.0)), cpus, use_gpu))
        for n in alive
    ]
    return sorted(fits, key=lambda f: (-f[1], f[0]))


def _workers_fitting(node: tuple[float, float], cpus: float, use_gpu: bool) -> int:
    cpu, gpu = node
    fit = int((cpu + 1e-9) // cpus) if cpus > 0 else 10**9
    return min(fit, int(gpu)) if use_gpu else fit


def placement_problem(cell: Cell, placement: str, nodes: int) -> str | None:
    """Why the Ray placement strategy can never place this cell's topology, or None."""
    strategy = placement_for(cell, placement)
    if strategy == "STRICT_SPREAD" and cell.world_size > 1 and (cell.workers_per_node > 1 or cell.world_size > nodes):
        return (
            f"placement STRICT_SPREAD puts every worker on its own node, but topology {cell.topology} has "
            f"{cell.workers_per_node} worker(s) per node on a cluster of {nodes} node(s): use placement auto or PACK"
        )
    if strategy == "STRICT_PACK" and cell.num_nodes > 1:
        return f"placement STRICT_PACK puts every worker on one node, but topology {cell.topology} spans nodes"
    return None


def cell_problem(cell: Cell, res: ClusterResources, cpus: float, use_gpu: bool, placement: str = "auto") -> str | None:
    """Why this cell can never be scheduled, or None."""
    hosts = sorted((_workers_fitting(n, cpus, use_gpu) for n in res.nodes), reverse=True)
    if len(hosts) < cell.num_nodes:
        return f"needs {cell.num_nodes} nodes; the cluster has {len(hosts)}"
    problem = placement_problem(cell, placement, len(res.nodes))
    if problem:
        return problem
    short = [h for h in hosts[: cell.num_nodes] if h < cell.workers_per_node]
    if short:
        unit = f"{cpus:g} CPU" + (" + 1 GPU" if use_gpu else "")
        return (
            f"needs {cell.workers_per_node} worker(s) of {unit} on each of {cell.num_nodes} node(s); "
            f"the best {cell.num_nodes} node(s) fit {hosts[: cell.num_nodes]}"
        )
    return None


def check(
    cells: list[Cell],
    res: ClusterResources,
    cpus_per_worker: float,
    use_gpu: bool,
    field: str = "workers",
    placement: str = "auto",
) -> None:
    """Raise SpecError (on `field`: workers, or topology) listing every cell that can never be scheduled,
    with the nodes and per-node resources found."""
    bad = {}
    for cell in cells:
        problem = cell_problem(cell, res, cpus_per_worker, use_gpu, placement)
        if problem:
            bad[cell] = f"  cell {cell.cell_id} ({cell.step.mode}, topology {cell.topology}): {problem}"
    if bad:
        if field != "topology" and all(c.num_nodes > len(res.nodes) for c in bad):
            field = "nodes"  # the spec's node counts are what the cluster lacks
        asked = {"topology": {c.topology for c in bad}, "nodes": {c.num_nodes for c in bad}}.get(
            field, {c.world_size for c in bad}
        )
        fits = {"topology": "topologies", "nodes": "node counts"}.get(field, "worker counts")
        found = f"{fits} that fit the cluster ({res.describe()}); unschedulable:\n"
        raise SpecError(field, sorted(asked), found + "\n".join(bad.values()))
