"""Where a workload's profile (trainers.profile) runs: in this process, or, with a Ray cluster (an address, or
RAY_ADDRESS as in a Ray Job), as a task on one of its nodes holding one worker's resources: the spec's CPUs and,
where its workers use GPUs, one GPU. So the profile is of the cluster's device and torch, not of the machine
`ddpsweep predict` runs on (a laptop, a CPU-only head node)."""

from __future__ import annotations

import math
import os
from contextlib import ExitStack
from dataclasses import asdict, dataclass

import ray

from sweeps.spec.sweep import SweepSpec
from trainers.config import StepConfig
from trainers.errors import DDPSweepError

PROFILE_TIMEOUT_S = 900.0  # one profile task on the cluster, from submission to its answer


class ProfileTimeout(DDPSweepError):
    """A profile task on the cluster did not answer in time (it was cancelled)."""

    http_status = 504


@dataclass(frozen=True)
class Device:
    """What a profile's numbers depend on beyond the workload: the device type and the torch version."""

    type: str  # cuda | cpu
    torch_version: str


def device_here(use_gpu: bool) -> Device:
    import torch

    gpu = use_gpu and torch.cuda.is_available()
    return Device("cuda" if gpu else "cpu", torch.__version__)


def profile_here(step: dict, use_gpu: bool, cpus: float) -> dict:
    """The profile of `step`'s workload in this process (on CPU with the worker's threads)."""
    import torch

    from trainers.profile import profile_micro_step

    device = torch.device(device_here(use_gpu).type)
    if device.type == "cpu":
        torch.set_num_threads(max(1, math.floor(cpus)))
    return profile_micro_step(StepConfig(**step), device)


class Profiler:
    """Runs profiles here or on the cluster (a context manager: it holds the Ray session while open)."""

    def __init__(self, spec: SweepSpec, address: str | None = None) -> None:
        self.spec, self.address = spec, address
        self.remote = bool(address or os.environ.get("RAY_ADDRESS"))
        self._stack = ExitStack()
        self._gpu = spec.use_gpu is True or spec.use_gpu == "auto"

    def __enter__(self) -> Profiler:
        if self.remote:
            from sweeps.driver.session import ray_session

            self._stack.enter_context(ray_session(self.address, verbose=False))
            self._gpu = self.spec.use_gpu is True or (
                self.spec.use_gpu == "auto" and ray.cluster_resources().get("GPU", 0) > 0
            )
            self._check_fits()
        return self

    def _check_fits(self) -> None:
        """Refuse, before a task waits forever for resources, a profile no node of the cluster can run."""
        from sweeps.plan.preflight import ClusterResources, nodes_fitting
        from sweeps.spec.fields import SpecError

        fits = nodes_fitting(self.spec.cpus_per_worker, self._gpu)
        if not fits or fits[0][1] < 1:
            found = ClusterResources.from_ray().describe()
            self._stack.close()
            need = f"{self.spec.cpus_per_worker:g} CPU(s)" + (" and a GPU" if self._gpu else "")
            raise SpecError(
                "cpus_per_worker",
                self.spec.cpus_per_worker,
                f"what one node of the cluster holds ({found}): the profile runs "
                f"as one worker's task and needs {need} on one node",
            )

    def _get(self, ref):
        """A task's answer within PROFILE_TIMEOUT_S; the task cancelled and one line beyond it."""
        try:
            return ray.get(ref, timeout=PROFILE_TIMEOUT_S)
        except ray.exceptions.GetTimeoutError:
            ray.cancel(ref, force=True)
            raise ProfileTimeout(
                f"the profile task on the cluster did not finish within {PROFILE_TIMEOUT_S:g} s (is the cluster busy? "
                "`ray status` shows what is pending)"
            ) from None

    def __exit__(self, *exc: object) -> None:
        self._stack.close()

    def _task(self, fn):
        return ray.remote(num_cpus=self.spec.cpus_per_worker, num_gpus=1 if self._gpu else 0, max_retries=0)(fn)

    @property
    def where(self) -> str:
        return "on the cluster" if self.remote else "here"

    def device(self) -> Device:
        if not self.remote:
            return device_here(self._gpu)
        return self._get(self._task(device_here).remote(self._gpu))

    def run(self, step: StepConfig) -> dict:
        if not self.remote:
            return profile_here(asdict(step), self._gpu, self.spec.cpus_per_worker)
        return self._get(self._task(profile_here).remote(asdict(step), self._gpu, self.spec.cpus_per_worker))
