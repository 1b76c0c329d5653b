"""What the driver resolves once and every trial and fit needs: the sweep-wide options and the placement
rule. Its own module so that `sweeps.trial` (which launches the fit) and `sweeps.fit` (which runs it) both
import it and never each other at module level."""

from __future__ import annotations

from dataclasses import dataclass

from sweeps.grid import Cell

# Benchmarks only: "<cell_id>=<fraction>,…" in the driver's environment slows those cells' timed steps by that
# fraction (sweeps.worker.injected_slowdown); specs cannot set it (their env takes NCCL_/GLOO_ names only).
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
    sole_trial: bool  # max_concurrent_trials == 1: no other trial makes worker groups meanwhile (sweeps.leftover)
    grad_check: str | bool = "first"  # when a distributed cell checks its gradient: first | every; False: never


def worker_resources(opts: TrialOptions) -> dict[str, float]:
    """One rank's bundle: its CPUs, and its GPU where the sweep uses GPUs."""
    return {"CPU": opts.cpus_per_worker} | ({"GPU": 1} if opts.use_gpu else {})


def placement_for(cell: Cell, requested: str) -> str:
    if requested != "auto":
        return requested
    if cell.num_nodes == 1:
        return "STRICT_PACK"
    return "STRICT_SPREAD" if cell.workers_per_node == 1 else "PACK"
