"""A sweep id is claimed atomically before Ray starts: a second run of the same id at once is refused with
the first's pid and host, and the first's rows are never overwritten."""

from __future__ import annotations

import json
import os
import signal
import socket
import time
from pathlib import Path

import pytest

from results.storage.lease import lease
from results.storage.store import Store
from sweeps.plan.planner import CLAIM, claimed, plan_sweep
from sweeps.spec.files import parse_spec
from sweeps.spec.sweep import SpecError
from tests.test_cli_sweep import ddpsweep

SPEC = """name: claim
cluster: local
model: tiny
micro_batch: 2
seq_len: 16
warmup_steps: 1
timed_steps: 2
workers: [2]
bucket_cap_mb: [25]
backend: gloo
use_gpu: false
cpus_per_worker: 1
repeats: 1
"""


def _claim(plan) -> None:
    with claimed(plan):
        pass


def test_a_held_claim_refuses_a_second_run_and_a_resume(tmp_path):
    spec = parse_spec(SPEC)
    first = plan_sweep(spec, results=str(tmp_path), sweep_id="x-1")
    with claimed(first):
        assert len(first.todo) == 2
        with pytest.raises(SpecError, match=f"pid {os.getpid()} on {socket.gethostname()}") as err:
            _claim(plan_sweep(spec, results=str(tmp_path), sweep_id="x-1"))
        assert err.value.field == "--sweep"
        Store.open(str(tmp_path)).write_manifest("local", "x-1", {"cells": [c.cell_id for c in first.cells]})
        with pytest.raises(SpecError, match="no other run is measuring") as err:
            _claim(plan_sweep(spec, results=str(tmp_path), resume="x-1"))
        assert err.value.field == "--resume"
    with pytest.raises(SpecError, match="--resume x-1"):  # finished meanwhile: the id is taken, not free
        _claim(plan_sweep(spec, results=str(tmp_path), sweep_id="x-1"))


@pytest.mark.ray
@pytest.mark.slow
def test_two_runs_with_one_sweep_id_at_once(tmp_path):
    spec = tmp_path / "claim.yaml"
    spec.write_text(SPEC)
    results = tmp_path / "r"
    args = ("run", str(spec), "--sweep", "same", "--results", str(results))
    first = ddpsweep(*args)
    claim = results / "cluster=local" / "sweep=same" / CLAIM
    deadline = time.monotonic() + 120
    while not (claim.exists() and claim.read_text()) and time.monotonic() < deadline:
        time.sleep(0.2)
    held = json.loads(claim.read_text())
    second = ddpsweep(*args)
    _, err2 = second.communicate(timeout=120)
    assert second.returncode == 2 and f"pid {held['pid']}" in err2 and "same" in err2, err2
    manifest = claim.parent / "_sweep.json"
    while not manifest.exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    first.send_signal(signal.SIGINT)  # the first run is not disturbed by the second: stop it ourselves
    _, err1 = first.communicate(timeout=300)
    assert first.returncode == 130 and "--resume same" in err1, err1[-2000:]
    assert manifest.exists() and json.loads(manifest.read_text())["sweep_id"] == "same"
    with lease(Store.open(str(results)).fs, str(claim.parent), CLAIM, purpose="t", what="t"):
        pass  # released by the first run at its end
    assert Path(claim).read_text() == ""
