"""Runs in the fit task's process: one TorchTrainer for one group (see sweeps/trial/actor.py for why a task).

The trainer is Ray Train's `DataParallelTrainer` with `sweeps.fit.backend.TorchBackendConfig`, which is what
`TorchTrainer` is, except that neither this process nor the controller imports torch: only the ranks do."""

from __future__ import annotations

import os

from ray.train import FailureConfig, RunConfig, ScalingConfig
from ray.train.v2._internal.execution.scaling_policy import FixedScalingPolicy
from ray.train.v2.api.data_parallel_trainer import DataParallelTrainer
from ray.util.queue import Queue

from sweeps.fit.backend import TorchBackendConfig
from sweeps.plan.grid import Group
from sweeps.plan.preflight import nodes_fitting
from sweeps.trial.options import TrialOptions, node_selectors, pinned, placement_for, worker_resources

# Propagated by Ray Train from its driver (this task) to the controller and workers.
TRAIN_ENV = {
    "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.2",  # the controller polls every 2 s by default
    "RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S": "60",
    "RAY_TRAIN_ENABLE_PRINT_PATCH": "0",
    # max_failures=0: a group whose node is drained is not restarted, so the watcher that would restart it is one
    # more actor process per group (about 2 s of CPU here) that does nothing for a sweep
    "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER": "0",
}


def train_fn_per_worker(config: dict) -> None:
    """Runs on every rank; imports the measuring code (torch) there, never in the fit task or the controller."""
    from sweeps.worker.group import train_fn_per_worker as measure_group

    measure_group(config)


class FixedGroup(FixedScalingPolicy):
    """Ray Train's fixed-size policy without its resource requests to Ray Data's autoscaling coordinator: a
    detached actor that the controller creates on a cluster's first fit and waits for (one more process that
    imports Ray: 1.4 s on the path to the workers here). A group's placement group is what asks an autoscaler
    for its nodes."""

    def after_controller_start(self, train_run_context) -> None:
        return None

    def _maybe_send_resource_request(self) -> None:
        return None


class SweepTrainer(DataParallelTrainer):
    """Ray Train's trainer without the helper actors a sweep's fit never uses: each is one more process that
    imports Ray (about 1.5 s of CPU here) while the ranks start and warm up beside it. The datasets manager
    (a sweep passes no datasets); with one trial at a time, the placement-group cleaner, whose work
    sweeps.trial.leftover does for a fit that ends any way but cleanly."""

    def __init__(self, *args, keep_cleaner: bool, **kwargs) -> None:
        self._keep_cleaner = keep_cleaner
        super().__init__(*args, **kwargs)

    def _create_default_callbacks(self) -> list:
        unused = {"DatasetsCallback"} | (set() if self._keep_cleaner else {"PlacementGroupCleanerCallback"})
        return [cb for cb in super()._create_default_callbacks() if type(cb).__name__ not in unused]

    def _initialize_and_run_controller(self, **controller_init_kwargs):
        controller_init_kwargs["scaling_policy"] = FixedGroup(self.scaling_config)
        return super()._initialize_and_run_controller(**controller_init_kwargs)


def build_trainer(group: Group, opts: TrialOptions, outbox: Queue, inbox: Queue | None = None) -> DataParallelTrainer:
    cell = group.first
    resources = worker_resources(opts)
    threads = max(1, int(opts.cpus_per_worker))
    env = dict(opts.env) | cell.env_vars  # the spec's env, then this group's env_grid combination
    return SweepTrainer(
        train_fn_per_worker,
        keep_cleaner=not opts.sole_trial,
        train_loop_config={
            "group": group,  # Ray pickles it to every rank
            "threads": threads,
            "outbox": outbox,
            "inbox": inbox,
            "env": env,
            "grad_check": opts.grad_check,
            "collective_timeout_s": opts.collective_timeout_s,
        },
        scaling_config=ScalingConfig(
            num_workers=cell.world_size,
            use_gpu=opts.use_gpu,
            resources_per_worker=resources,
            placement_strategy=placement_for(cell, opts.placement),
            label_selector=_selectors(group, opts),
        ),
        backend_config=TorchBackendConfig(backend=opts.backend, timeout_s=int(opts.collective_timeout_s)),
        run_config=RunConfig(
            name=f"{opts.sweep_id}-{group.group_id}",
            storage_path=opts.storage_path,
            failure_config=FailureConfig(max_failures=0, controller_failure_limit=0),
            worker_runtime_env={"env_vars": env} if env else None,
        ),
    )


def _selectors(group: Group, opts: TrialOptions) -> list[dict[str, str]] | None:
    """`n×k` (n, k > 1): each rank pinned to one of n nodes, k on each (sweeps.trial.options.node_selectors);
    else None."""
    cell = group.first
    if not pinned(cell, opts.placement):
        return None
    return node_selectors(cell, nodes_fitting(opts.cpus_per_worker, opts.use_gpu))


def fit_group(group: Group, opts: TrialOptions, outbox: Queue, inbox: Queue | None = None) -> None:
    """Run the group on a fresh worker group; rows travel through `outbox` (rounds through `inbox` when the
    trial decides them), nothing is returned."""
    os.environ.update(TRAIN_ENV)
    build_trainer(group, opts, outbox, inbox).fit()
