"""Tier 3: sweeps on a real local Ray (2 CPUs, gloo, tiny model): error rows, timeouts, resume."""

from __future__ import annotations

import json
import os

import pytest
import ray

from results.store import Store
from sweeps.grid import expand
from sweeps.runner import execute, plan_sweep
from sweeps.spec import parse_spec
from sweeps.worker import FAULT_FILE_ENV

pytestmark = pytest.mark.ray

SPEC = """
name: faults
cluster: test
model: tiny
micro_batch: 4
seq_len: 32
warmup_steps: 1
timed_steps: 3
workers: [2]
bucket_cap_mb: [0.25, 25]
backend: gloo
use_gpu: false
collective_timeout_s: 60
cell_timeout_s: {timeout}
env: {{NCCL_DEBUG: WARN}}
"""


@pytest.fixture(scope="module")
def fault_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("faults") / "faults.txt"
    os.environ[FAULT_FILE_ENV] = str(path)  # inherited by the raylet and every worker
    ray.init(num_cpus=2, include_dashboard=True, dashboard_host="127.0.0.1", log_to_driver=False)
    yield path
    ray.shutdown()
    os.environ.pop(FAULT_FILE_ENV)


def test_failing_cell_is_an_error_row_and_resume_measures_only_it(fault_file, tmp_path):
    spec = parse_spec(SPEC.format(timeout=300))
    baseline, good, bad = expand(spec)
    assert (bad.mode, bad.bucket_cap_mb) == ("ddp", 25.0)
    fault_file.write_text(f"{bad.cell_id} raise\n")
    plan = plan_sweep(spec, results=str(tmp_path))
    first = execute(plan)
    by_cell = {r["cell_id"]: r for r in first.rows}
    assert len(first.rows) == 3
    assert by_cell[bad.cell_id]["status"] == "error" and "fault injected" in by_cell[bad.cell_id]["error"]
    assert by_cell[good.cell_id]["status"] == "ok" and by_cell[good.cell_id]["replicas_in_sync"]
    assert json.loads(by_cell[good.cell_id]["env"])["NCCL_DEBUG"] == "WARN"  # the spec's env reached the workers
    assert by_cell[baseline.cell_id]["status"] == "ok"

    store = Store.open(str(tmp_path))
    ok_files = {p: os.stat(p).st_mtime_ns for p in store.files() if bad.cell_id not in p}
    fault_file.write_text("")
    resumed = plan_sweep(spec, results=str(tmp_path), resume=plan.sweep_id)
    assert [(c.cell_id, r) for c, r in resumed.todo] == [(bad.cell_id, 0)]
    second = execute(resumed)
    assert [r["cell_id"] for r in second.rows] == [bad.cell_id]
    rows = store.read_table().to_pylist()
    assert sorted((r["cell_id"], r["repeat"]) for r in rows) == sorted((c.cell_id, 0) for c in (baseline, good, bad))
    assert all(r["status"] == "ok" for r in rows)
    assert {p: os.stat(p).st_mtime_ns for p in ok_files} == ok_files  # finished rows untouched
    assert plan_sweep(spec, results=str(tmp_path), resume=plan.sweep_id).todo == []


def test_hung_cell_times_out_and_the_next_cell_still_runs(fault_file, tmp_path):
    spec = parse_spec(SPEC.format(timeout=25))
    baseline, hung, after = expand(spec)
    fault_file.write_text(f"{hung.cell_id} hang\n")
    outcome = execute(plan_sweep(spec, results=str(tmp_path)))
    by_cell = {r["cell_id"]: r for r in outcome.rows}
    assert by_cell[hung.cell_id]["status"] == "error"
    assert "cell_timeout_s=25" in by_cell[hung.cell_id]["error"]
    assert 25 <= by_cell[hung.cell_id]["trial_wall_s"] < 60
    assert by_cell[after.cell_id]["status"] == "ok" and by_cell[after.cell_id]["step_ms"] > 0
    assert by_cell[baseline.cell_id]["status"] == "ok"
