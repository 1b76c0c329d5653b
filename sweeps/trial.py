"""Runs in the Ray Tune trial actor: builds and fits one TorchTrainer for one (cell, repeat)."""

from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import asdict, dataclass
from typing import Any

import ray.tune
from ray.train import FailureConfig, RunConfig, ScalingConfig
from ray.train.torch import TorchConfig, TorchTrainer

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


def fit_with_timeout(trainer: TorchTrainer, timeout_s: float) -> Any:
    """trainer.fit() on a thread; raise CellTimeout if it outlives timeout_s (the actor's exit reaps it)."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["result"] = trainer.fit()
        except BaseException as e:  # noqa: BLE001 — handed to the caller
            box["error"] = e

    thread = threading.Thread(target=target, daemon=True, name="ddpsweep-fit")
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        raise CellTimeout(f"cell exceeded cell_timeout_s={timeout_s:g} s")
    if "error" in box:
        raise box["error"]
    return box["result"]


def measure_row(cell: Cell, opts: TrialOptions, repeat: int) -> dict:
    """Fit the cell; any failure becomes an error row, never an exception."""
    ctx = RowContext(sweep_id=opts.sweep_id, cluster=opts.cluster, spec_name=opts.spec_name, repeat=repeat,
                     cpus_per_worker=opts.cpus_per_worker, placement=placement_for(cell, opts.placement))  # fmt: skip
    started, t0 = now(), time.perf_counter()
    try:
        os.environ.update(TRAIN_ENV)
        result = fit_with_timeout(build_trainer(cell, opts, repeat), opts.cell_timeout_s)
        if not result.return_value:
            raise RuntimeError("rank 0 returned no measurement")
        return ok_row(cell, ctx, result.return_value, started, time.perf_counter() - t0)
    except Exception as e:  # noqa: BLE001 — one bad cell never kills the grid
        message = f"{type(e).__name__}: {e}"
        return error_row(cell, ctx, message, started, time.perf_counter() - t0)


def trial_fn(config: dict) -> None:
    """The Tune trial: measure one (cell, repeat) and report its row (JSON) to the driver."""
    cell = Cell.from_dict(config["pair"]["cell"])
    opts = TrialOptions(**config["options"])
    row = measure_row(cell, opts, config["pair"]["repeat"])
    ray.tune.report({"row": json.dumps(row, default=str)})
