"""What rank 0 posts to the trial is plain Python: unpickling it in the trial's process imports no torch.

The trial actor never imports torch (it only turns messages into rows); a torch type in a message (torch's
TorchVersion in the fingerprint did) made the trial import torch when the first measurement arrived: 3-4 s of
one core on this machine, while the group measured its next cell.
"""

from __future__ import annotations

import pickle
import subprocess
import sys

import torch

from sweeps import fingerprint
from trainers.config import StepConfig
from trainers.step import build_model, run_cell


def test_a_done_message_unpickles_without_torch():
    cpu = torch.device("cpu")
    step = StepConfig(mode="single", micro_batch=2, seq_len=16, warmup_steps=1, timed_steps=2)
    measurement = run_cell(step, cpu, 1, build_model(step, cpu))
    message = {"kind": "done", "measurement": measurement.to_dict(), **fingerprint.collect(cpu)}
    check = "import pickle, sys; pickle.loads(sys.stdin.buffer.read()); print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", check], input=pickle.dumps(message), capture_output=True, check=True)
    assert out.stdout.decode().strip() == "False", out.stderr.decode()[-2000:]
    assert message["torch_version"] == torch.__version__ and message["measurement"]["step_ms"] > 0
