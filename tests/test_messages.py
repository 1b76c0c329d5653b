"""What rank 0 posts to the trial is plain Python: unpickling it in the trial's process imports no torch.

The trial actor never imports torch (it only turns messages into rows); a torch type in a message (torch's
TorchVersion in the fingerprint did) made the trial import torch when the first measurement arrived: 3-4 s of
one core on this machine, while the group measured its next cell.
"""

from __future__ import annotations

import pickle
import subprocess
import sys

import pytest
import torch

from sweeps.worker import fingerprint
from trainers.config import StepConfig
from trainers.replica import build_model
from trainers.step import run_cell


def test_a_done_message_unpickles_without_torch():
    cpu = torch.device("cpu")
    step = StepConfig(mode="single", micro_batch=2, seq_len=16, warmup_steps=1, timed_steps=2)
    measurement = run_cell(step, cpu, 1, build_model(step, cpu))
    message = {"kind": "done", "measurement": measurement.to_dict(), **fingerprint.collect(cpu)}
    check = "import pickle, sys; pickle.loads(sys.stdin.buffer.read()); print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", check], input=pickle.dumps(message), capture_output=True, check=True)
    assert out.stdout.decode().strip() == "False", out.stderr.decode()[-2000:]
    assert message["torch_version"] == torch.__version__ and message["measurement"]["step_ms"] > 0


def test_the_fit_task_and_the_controller_load_no_torch():
    """What the fit task imports and what Ray Train's controller unpickles (the trainer's backend config, its
    callbacks, the per-worker function) name no torch: only the ranks import it (`sweeps.fit.backend`). Both
    processes loaded it with `ray.train.torch.TorchConfig` (2-4 s of a core each, one after the other, on
    every group's start); the ranks still get Ray's torch process group, which the Ray tiers measure on."""
    from ray import cloudpickle

    from sweeps.fit.backend import TorchBackendConfig
    from sweeps.fit.task import train_fn_per_worker

    config = TorchBackendConfig(backend="gloo", timeout_s=60)
    parts = [config, config.backend_cls, config.train_func_context, train_fn_per_worker]
    shipped = cloudpickle.dumps(parts)
    check = (
        "import pickle, sys; import sweeps.fit.task; parts = pickle.loads(sys.stdin.buffer.read()); "
        "backend = parts[1](); "
        "print('torch' in sys.modules, parts[0].to_dict()['timeout_s'], backend.share_cuda_visible_devices)"
    )
    out = subprocess.run([sys.executable, "-c", check], input=shipped, capture_output=True, check=True)
    assert out.stdout.decode().split() == ["False", "60", "True"], out.stderr.decode()[-2000:]


@pytest.mark.parametrize(("sole_trial", "cleaner"), [(True, False), (False, True)])
def test_the_fit_starts_no_helper_actor_it_does_not_use(sole_trial, cleaner):
    """No datasets manager (a sweep passes no datasets); the placement-group cleaner only when trials run side
    by side, since with one trial at a time sweeps.trial.leftover removes what a killed fit left."""
    from ray.train import ScalingConfig

    from sweeps.fit.task import SweepTrainer

    trainer = SweepTrainer(
        lambda config: None, keep_cleaner=not sole_trial, scaling_config=ScalingConfig(num_workers=2)
    )
    names = {type(cb).__name__ for cb in trainer._create_default_callbacks()}
    assert {"BackendSetupCallback", "AcceleratorSetupCallback"} <= names and "DatasetsCallback" not in names
    assert ("PlacementGroupCleanerCallback" in names) is cleaner
