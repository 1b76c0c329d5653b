"""Runs in the Ray Tune trial actor: builds and fits one TorchTrainer for one (cell, repeat)."""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass
from typing import Any

import ray
import ray.tune
from ray.exceptions import GetTimeoutError, RayTaskError
from ray.train import FailureConfig, RunConfig, ScalingConfig
from ray.train.torch import TorchConfig, TorchTrainer
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from sweeps.grid import Cell
from sweeps.rows import RowContext, error_row, now, ok_row
from sweeps.worker import train_fn_per_worker

# Propagated by Ray Train from the trial (its driver) to the controller and workers.
TRAIN_ENV = {
    "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.2",  # the controller polls every 2 s by default
    "RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S": "60",
    "RAY_TRAIN_ENABLE_PRINT_PATCH": "0",
}


class CellTimeout(TimeoutError):
    """A cell ran past the spec's cell_timeout_s."""


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
    env: dict
    storage_path: str


def placement_for(cell: Cell, requested: str) -> str:
    if requested != "auto":
        return requested
    if cell.num_nodes == 1:
        return "STRICT_PACK"
    return "STRICT_SPREAD" if cell.workers_per_node == 1 else "PACK"


def build_trainer(cell: Cell, opts: TrialOptions, repeat: int) -> TorchTrainer:
    resources = {"CPU": opts.cpus_per_worker} | ({"GPU": 1} if opts.use_gpu else {})
    threads = max(1, int(opts.cpus_per_worker))
    return TorchTrainer(
        train_fn_per_worker,
        train_loop_config={"step": asdict(cell.step_config()), "threads": threads, "cell_id": cell.cell_id},
        scaling_config=ScalingConfig(
            num_workers=cell.world_size,
            use_gpu=opts.use_gpu,
            resources_per_worker=resources,
            placement_strategy=placement_for(cell, opts.placement),
        ),
        torch_config=TorchConfig(backend=opts.backend, timeout_s=int(opts.collective_timeout_s)),
        run_config=RunConfig(
            name=f"{opts.sweep_id}-{cell.cell_id}-r{repeat}",
            storage_path=opts.storage_path,
            failure_config=FailureConfig(max_failures=0, controller_failure_limit=0),
            worker_runtime_env={"env_vars": dict(opts.env)} if opts.env else None,
        ),
    )


@ray.remote(num_cpus=0, max_retries=0)
def fit_task(cell: dict, opts: dict, repeat: int) -> Any:
    """Fit the cell's TorchTrainer in a task of its own, so a timeout can kill it with everything it owns."""
    os.environ.update(TRAIN_ENV)
    return build_trainer(Cell.from_dict(cell), TrialOptions(**opts), repeat).fit().return_value


def fit_with_timeout(cell: Cell, opts: TrialOptions, repeat: int) -> Any:
    """Rank 0's return value. Past cell_timeout_s the fit task is force-cancelled: its process dies,
    and with it the Train controller and worker group it owns, freeing their resources."""
    here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=True)
    ref = fit_task.options(scheduling_strategy=here).remote(cell.to_dict(), asdict(opts), repeat)
    try:
        return ray.get(ref, timeout=opts.cell_timeout_s)
    except GetTimeoutError:
        ray.cancel(ref, force=True)
        raise CellTimeout(f"cell exceeded cell_timeout_s={opts.cell_timeout_s:g} s") from None
    except RayTaskError as e:
        raise e.cause if isinstance(e.cause, Exception) else e from None


def measure_row(cell: Cell, opts: TrialOptions, repeat: int) -> dict:
    """Fit the cell; any failure becomes an error row, never an exception."""
    ctx = RowContext(sweep_id=opts.sweep_id, cluster=opts.cluster, spec_name=opts.spec_name, repeat=repeat,
                     cpus_per_worker=opts.cpus_per_worker, placement=placement_for(cell, opts.placement))  # fmt: skip
    started, t0 = now(), time.perf_counter()
    try:
        out = fit_with_timeout(cell, opts, repeat)
        if not out:
            raise RuntimeError("rank 0 returned no measurement")
        return ok_row(cell, ctx, out, started, time.perf_counter() - t0)
    except Exception as e:  # noqa: BLE001 — one bad cell never kills the grid
        message = f"{type(e).__name__}: {e}"
        return error_row(cell, ctx, message, started, time.perf_counter() - t0)


def trial_fn(config: dict) -> None:
    """The Tune trial: measure one (cell, repeat) and report its row (JSON) to the driver."""
    cell = Cell.from_dict(config["pair"]["cell"])
    opts = TrialOptions(**config["options"])
    row = measure_row(cell, opts, config["pair"]["repeat"])
    ray.tune.report({"row": json.dumps(row, default=str)})
