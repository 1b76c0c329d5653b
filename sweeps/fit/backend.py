"""Ray Train's torch backend without torch where no rank runs: the fit task and the controller.

`ray.train.torch.TorchConfig` lives in a module that imports torch, so every process that unpickles one
loads torch: the fit task that builds the trainer and Ray Train's controller, one after the other on the
group's start (2-4 s of one core each on the 2-core machine). `TorchBackendConfig` is the same backend
through Ray Train's developer API (`BackendConfig`, `Backend`): the controller-side hooks only name
functions of this module, and each of them imports Ray's own torch set-up inside the worker that runs it.
The process group is the one `TorchConfig(init_method="env")` makes: `MASTER_ADDR`/`MASTER_PORT` from
rank 0, Ray's `LOCAL_RANK`/`RANK`/`WORLD_SIZE` variables, then `init_process_group` on every rank.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass

import ray
from ray.train._internal.utils import get_address_and_port
from ray.train.backend import Backend, BackendConfig
from ray.train.v2._internal.util import TrainingFramework

SHUTDOWN_TIMEOUT_S = 30


@dataclass
class TorchBackendConfig(BackendConfig):
    """What `ray.train.torch.TorchConfig` configures, for `DataParallelTrainer(backend_config=...)`."""

    backend: str | None = None
    """gloo, nccl, ...; None: nccl where the workers have GPUs, else gloo."""
    timeout_s: int = 1800
    """Seconds a collective may wait before the process group fails it."""

    @property
    def backend_cls(self):
        return _TorchBackend

    @property
    def train_func_context(self):
        return _DeviceContext

    @property
    def framework(self):
        return TrainingFramework.TORCH

    def to_dict(self) -> dict:
        return {"backend": self.backend, "init_method": "env", "timeout_s": self.timeout_s}


class _TorchBackend(Backend):
    share_cuda_visible_devices: bool = True  # as Ray's: the ranks of a node see each other's GPUs (NCCL P2P)

    def on_start(self, worker_group, backend_config: TorchBackendConfig) -> None:
        gpus = worker_group.get_resources_per_worker().get("GPU", 0)
        backend = backend_config.backend or ("nccl" if gpus > 0 else "gloo")
        addr, port = worker_group.execute_single(0, get_address_and_port)
        worker_group.execute(_set_env_on_worker, addr=addr, port=port)
        futures = [
            worker_group.execute_single_async(
                rank,
                _init_process_group_on_worker,
                backend=backend,
                world_rank=rank,
                world_size=len(worker_group),
                timeout_s=backend_config.timeout_s,
            )
            for rank in range(len(worker_group))
        ]
        ray.get(futures)

    def on_shutdown(self, worker_group, backend_config: TorchBackendConfig) -> None:
        futures = worker_group.execute_async(_shutdown_on_worker, destroy_process_group=len(worker_group) > 1)
        with contextlib.suppress(ray.exceptions.GetTimeoutError):  # as Ray's: left to the workers' exit
            ray.get(futures, timeout=SHUTDOWN_TIMEOUT_S)


def _set_env_on_worker(addr: str, port: int) -> None:
    """Runs on every rank: the rendezvous address (init_method env), then Ray's rank variables."""
    from ray.train.torch.config import _set_torch_distributed_env_vars

    os.environ["MASTER_ADDR"] = addr
    os.environ["MASTER_PORT"] = str(port)
    _set_torch_distributed_env_vars()


def _init_process_group_on_worker(backend: str, world_rank: int, world_size: int, timeout_s: int) -> None:
    """Runs on every rank: gloo bound to the node's interface (sweeps.worker.bind), then the default group; on NCCL with
    the rank's device (`device_id`: the communicator is made at once, on the right GPU), and with the
    communicators of a failed collective aborted, never the process (a failed cell is one error row: its ranks
    make its groups anew, sweeps.worker.ranks)."""
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    from sweeps.worker.bind import bind_gloo, harness_default

    bind_gloo(ray.util.get_node_ip_address())
    device_id = None
    if backend == "nccl":
        harness_default("TORCH_NCCL_ASYNC_ERROR_HANDLING", "2")  # CleanUpOnly: abort, keep the process
        device_id = torch.device("cuda", _local_gpu_index())
    timeout = timedelta(seconds=timeout_s)
    dist.init_process_group(
        backend, init_method="env://", rank=world_rank, world_size=world_size, timeout=timeout, device_id=device_id
    )


def _local_gpu_index() -> int:
    """This rank's GPU among the node's visible ones (Ray shares CUDA_VISIBLE_DEVICES across a node's ranks)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")
    mine = [str(g) for g in ray.get_gpu_ids()]
    return visible.index(mine[0]) if mine and mine[0] in visible else 0


def _shutdown_on_worker(destroy_process_group: bool) -> None:
    from ray.train.torch.config import _shutdown_torch

    _shutdown_torch(destroy_process_group=destroy_process_group)


class _DeviceContext:
    """Wraps the train function on every rank: the rank's CUDA device is the current one (Ray's own)."""

    def __enter__(self):
        from ray.train.torch.config import TorchConfigContextManager

        self._inner = TorchConfigContextManager()
        return self._inner.__enter__()

    def __exit__(self, *exc) -> bool:
        return self._inner.__exit__(*exc)
