"""Runs in the fit task's process: one TorchTrainer for one group (see sweeps/trial.py for why a task)."""

from __future__ import annotations

import os
import time

from ray.train import FailureConfig, RunConfig, ScalingConfig
from ray.train.torch import TorchConfig, TorchTrainer
from ray.util.queue import Queue

from sweeps.controller import start_callbacks
from sweeps.grid import Group
from sweeps.options import TrialOptions, placement_for
from sweeps.worker import train_fn_per_worker

# Propagated by Ray Train from its driver (this task) to the controller and workers.
TRAIN_ENV = {
    "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.2",  # the controller polls every 2 s by default
    "RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S": "60",
    "RAY_TRAIN_ENABLE_PRINT_PATCH": "0",
}


def build_trainer(group: Group, opts: TrialOptions, outbox: Queue, inbox: Queue | None = None) -> TorchTrainer:
    cell = group.first
    resources = {"CPU": opts.cpus_per_worker} | ({"GPU": 1} if opts.use_gpu else {})
    threads = max(1, int(opts.cpus_per_worker))
    env = dict(opts.env) | cell.env_vars  # the spec's env, then this group's env_grid combination
    return TorchTrainer(
        train_fn_per_worker,
        train_loop_config={"group": group.to_dict(), "threads": threads, "outbox": outbox, "inbox": inbox},
        scaling_config=ScalingConfig(
            num_workers=cell.world_size,
            use_gpu=opts.use_gpu,
            resources_per_worker=resources,
            placement_strategy=placement_for(cell, opts.placement),
        ),
        torch_config=TorchConfig(backend=opts.backend, timeout_s=int(opts.collective_timeout_s)),
        run_config=RunConfig(
            name=f"{opts.sweep_id}-{group.group_id}",
            storage_path=opts.storage_path,
            failure_config=FailureConfig(max_failures=0, controller_failure_limit=0),
            worker_runtime_env={"env_vars": env} if env else None,
            callbacks=start_callbacks(outbox),  # the group's start in parts (sweeps.startmarks)
        ),
    )


def fit_group(group: Group, opts: TrialOptions, outbox: Queue, inbox: Queue | None = None) -> None:
    """Run the group on a fresh worker group; rows travel through `outbox` (rounds through `inbox` when the
    trial decides them), nothing is returned."""
    os.environ.update(TRAIN_ENV)
    outbox.put({"kind": "start_marks", "marks": {"fit_task": time.time()}})
    build_trainer(group, opts, outbox, inbox).fit()
