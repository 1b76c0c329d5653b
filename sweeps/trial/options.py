"""What the driver resolves once and every trial and fit needs: the sweep-wide options and the placement
rule. Its own module so that `sweeps.trial.actor` (which launches the fit) and `sweeps.fit.task` (which runs it) both
import it and never each other at module level."""

from __future__ import annotations

from dataclasses import dataclass

from sweeps.plan.grid import Cell

# Benchmarks only: "<cell_id>=<fraction>,…" in the driver's environment slows those cells' timed steps by that
# fraction (sweeps.worker.group.injected_slowdown); specs cannot set it (their env takes NCCL_/GLOO_ names only).
SLOWDOWN_ENV = "DDPSWEEP_SLOWDOWN"
# Benchmarks only: "<cell_id>=<fraction>,…" scales those cells' all-reduced buckets by 1 + fraction on every rank
# (trainers.hooks.corrupted): a wrong gradient with replicas in sync, which only the gradient check catches.
CORRUPT_ENV = "DDPSWEEP_CORRUPT"
# Benchmarks only: "<cell_id>=<size>,…" adds relative noise of that size to every backward of those cells, a new
# draw on every call and rank (trainers.jitter): GPU kernels' nondeterminism, emulated on CPU.
JITTER_ENV = "DDPSWEEP_JITTER"
PLANTED_ENVS = (SLOWDOWN_ENV, CORRUPT_ENV, JITTER_ENV)  # each takes "*=<fraction>" for every cell


@dataclass(frozen=True, kw_only=True)
class TrialOptions:
    """Sweep-wide settings every trial needs (resolved against the cluster by the driver)."""

    sweep_id: str
    cluster: str
    spec_name: str
    use_gpu: bool
    backend: str  # nccl | gloo
    cpus_per_worker: float
    placement: str  # auto | a Ray strategy
    collective_timeout_s: float
    cell_timeout_s: float
    group_start_timeout_s: float
    env: dict
    storage_path: str
    sole_trial: bool  # max_concurrent_trials == 1: no other trial makes worker groups meanwhile (sweeps.trial.leftover)
    grad_check: str | bool = "first"  # when a distributed cell checks its gradient: first | every; False: never


def worker_resources(opts: TrialOptions) -> dict[str, float]:
    """One rank's bundle: its CPUs, and its GPU where the sweep uses GPUs."""
    return {"CPU": opts.cpus_per_worker} | ({"GPU": 1} if opts.use_gpu else {})


def placement_for(cell: Cell, requested: str) -> str:
    """The Ray strategy of the cell's placement group: one node STRICT_PACK, one rank per node STRICT_SPREAD;
    `n×k` with k > 1 PACK, with each rank's bundle pinned to its node (`node_selectors`)."""
    if requested != "auto":
        return requested
    if cell.num_nodes == 1:
        return "STRICT_PACK"
    return "STRICT_SPREAD" if cell.workers_per_node == 1 else "PACK"


NODE_ID_LABEL = "ray.io/node-id"  # the label Ray gives every node: its id


def pinned(cell: Cell, requested: str) -> bool:
    """Whether the cell's ranks are pinned to nodes: `n×k` with n, k > 1, where no strategy alone places k ranks
    on each of n nodes (PACK fills one node first; STRICT_SPREAD allows one rank per node)."""
    return cell.num_nodes > 1 and cell.workers_per_node > 1 and placement_for(cell, requested) != "STRICT_SPREAD"


def node_selectors(cell: Cell, nodes: list[tuple[str, int]]) -> list[dict[str, str]]:
    """One label selector per rank, k ranks on each of the cell's n nodes: the first n of `nodes` ((node id,
    ranks it fits), best first) that fit k. Ray Train orders ranks by node, so ranks 0..k-1 share a node."""
    fitting = [node for node, fits in nodes if fits >= cell.workers_per_node][: cell.num_nodes]
    if len(fitting) < cell.num_nodes:
        raise ValueError(
            f"topology {cell.topology} needs {cell.workers_per_node} rank(s) on each of {cell.num_nodes} nodes; "
            f"{len(fitting)} node(s) fit that"
        )
    return [{NODE_ID_LABEL: node} for node in fitting for _ in range(cell.workers_per_node)]
