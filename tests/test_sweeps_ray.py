"""Tier 3: sweeps on a real local Ray (2 CPUs, gloo, tiny model): warm groups, rounds, faults, resume."""

from __future__ import annotations

import json
import os
import time

import pytest
import ray
from ray.util.placement_group import placement_group, placement_group_table, remove_placement_group

from results.model import costmodel
from results.sql.query import query
from results.storage.store import Store, load
from sweeps.driver.runner import execute
from sweeps.driver.session import environment_kept
from sweeps.plan.grid import expand
from sweeps.plan.planner import plan_sweep
from sweeps.spec.files import parse_spec
from sweeps.trial import leftover
from sweeps.worker.group import FAULT_FILE_ENV

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
bucket_cap_mb: {buckets}
repeats: {repeats}
isolation: {isolation}
calibrate: {calibrate}
backend: gloo
use_gpu: false
collective_timeout_s: 60
cell_timeout_s: {timeout}
env: {{NCCL_DEBUG: WARN}}
"""


def spec_text(buckets="[0.25, 25]", repeats=1, isolation="sweep", timeout=300, calibrate="false") -> str:
    return SPEC.format(buckets=buckets, repeats=repeats, isolation=isolation, timeout=timeout, calibrate=calibrate)


@pytest.fixture(scope="module")
def fault_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("faults") / "faults.txt"
    with environment_kept():  # nothing of this Ray's environment (RAY_AUTH_MODE=token) reaches later tests
        os.environ[FAULT_FILE_ENV] = str(path)  # inherited by the raylet and every worker
        ray.init(num_cpus=2, include_dashboard=True, dashboard_host="127.0.0.1", log_to_driver=False)
        yield path
        ray.shutdown()


def assert_round_order(rows: list[dict]) -> None:
    """Within a group, measurements ran round by round, in each round's recorded order."""
    by_group: dict[str, list[dict]] = {}
    for r in rows:
        by_group.setdefault(r["group_id"], []).append(r)
    for members in by_group.values():
        ran = [(r["round"], r["order_in_round"]) for r in sorted(members, key=lambda r: r["started_at"])]
        assert ran == sorted(ran)
        for rnd in {r["round"] for r in members}:
            orders = sorted(r["order_in_round"] for r in members if r["round"] == rnd)
            assert orders == list(range(len(orders)))


def test_group_measures_every_pair_in_rounds_and_one_rank_failing_mid_backward_is_one_error_row(fault_file, tmp_path):
    """Rank 1 raises in the middle of its backward while rank 0 is inside DDP's all-reduce: the ranks agree through
    the store, rank 1's error is the row's, the cell's groups are made anew and the next cells are measured, in
    seconds (the collective timeout is 60 s)."""
    spec = parse_spec(spec_text(repeats=2, calibrate="true"))
    baseline, good, bad = expand(spec)
    assert (bad.step.mode, bad.step.bucket_cap_mb) == ("ddp", 25.0)
    fault_file.write_text(f"{bad.cell_id} raise-backward@1\n")
    plan = plan_sweep(spec, results=str(tmp_path))
    assert [len(g.slots) for g in plan.groups()] == [6]  # the baseline and the DDP cells x 2 rounds, one group
    first = execute(plan)
    from ray.util.state import list_actors

    started = {a.class_name for a in list_actors(address=ray.get_runtime_context().gcs_address, limit=10_000)}
    assert "TrainController" in started and "PreemptionWatcher" not in started  # sweeps.fit.task.TRAIN_ENV turns it off
    assert not started & {"DatasetManager", "PlacementGroupCleaner"}  # sweeps.fit.task.SweepTrainer
    assert sorted((r["cell_id"], r["repeat"]) for r in first.rows) == sorted(
        (c.cell_id, r) for c in (baseline, good, bad) for r in (0, 1)
    )
    for r in first.rows:
        ok = r["cell_id"] != bad.cell_id
        assert r["status"] == ("ok" if ok else "error"), r["error"]
        assert ok or r["error"].startswith("rank 1: PlantedFault: fault planted in the middle of the backward")
        assert ok or r["trial_wall_s"] < 20
        assert not ok or (r["replicas_in_sync"] and r["step_ms"] > 0 and r["setup_ms"] > 0)
        assert r["control_step_ms"] > 0 and r["control_rel_ci"] >= 0  # every round's control probe
        assert r["isolation"] == "sweep" and r["round"] == r["repeat"] and r["group_setup_s"] > 0
        assert not ok or (r["timed_steps_run"] == 3 and r["converged"] is None)  # fixed timing
    ddp = [r for r in first.rows if r["world_size"] == 2]
    assert len({r["group_id"] for r in ddp}) == 1  # one warm worker group for all four DDP measurements
    assert_round_order(first.rows)
    assert json.loads(ddp[0]["env"])["NCCL_DEBUG"] == "WARN"  # the spec's env reached the workers
    cal = Store.open(str(tmp_path)).read_calibration("test").to_pandas()  # only the 2-rank group calibrates
    kinds = {"all_reduce", "broadcast_params", *costmodel.TERM_KINDS}  # the collectives and the overlap terms' arms
    assert set(cal["world_size"]) == {2} and set(cal["kind"]) == kinds
    ar = cal[cal["kind"] == "all_reduce"].sort_values("size_bytes")
    grad_bytes = next(r["grad_bytes"] for r in ddp if r["status"] == "ok")
    assert ar["size_bytes"].iloc[-1] >= grad_bytes and (ar["time_ms"] > 0).all()
    assert ar["busbw_gbps"].iloc[-1] > ar["busbw_gbps"].iloc[0]  # rises with size
    fit = query(str(tmp_path), "select alpha_ms, beta_gbps, world_size from alpha_beta")
    assert len(fit) == 1 and fit["beta_gbps"][0] > 0 and fit["world_size"][0] == 2

    store = Store.open(str(tmp_path))
    assert [os.path.basename(p) for p in store.files()] == ["compacted.parquet"]  # compacted when it finished
    kept = {
        (r["cell_id"], r["repeat"], r["finished_at"], r["step_ms"])
        for r in store.read_table().to_pylist()
        if r["cell_id"] != bad.cell_id
    }
    fault_file.write_text("")
    resumed = plan_sweep(spec, results=str(tmp_path), resume=plan.sweep_id)
    assert sorted((c.cell_id, r) for c, r in resumed.todo) == [(bad.cell_id, 0), (bad.cell_id, 1)]
    assert [len(g.slots) for g in resumed.groups()] == [2]  # re-formed from what is missing
    second = execute(resumed)
    assert sorted(r["repeat"] for r in second.rows) == [0, 1] and {r["status"] for r in second.rows} == {"ok"}
    rows = store.read_table().to_pylist()
    assert len(rows) == 6 and len({(r["cell_id"], r["repeat"]) for r in rows}) == 6
    assert kept <= {(r["cell_id"], r["repeat"], r["finished_at"], r["step_ms"]) for r in rows}  # finished rows kept
    assert plan_sweep(spec, results=str(tmp_path), resume=plan.sweep_id).todo == []


def test_hung_cell_times_out_and_the_rest_of_its_group_runs_in_a_fresh_group(fault_file, tmp_path):
    # cell_timeout_s under a group's start here (15-40 s): the timeout counts from the cell's own start, so
    # neither group's start is mistaken for a hung cell (CI: the re-planned group's start was); a cell takes < 2 s
    spec = parse_spec(spec_text(buckets="[0.25, 1, 25]", timeout=10))
    plan = plan_sweep(spec, results=str(tmp_path), sweep_id="hang-1")
    (ddp_group,) = plan.groups()  # the baseline and the three buckets on one worker group
    hung = ddp_group.slots[0].cell  # the first of its round: everything else is still to measure
    fault_file.write_text(f"{hung.cell_id} hang\n")
    outcome = execute(plan)
    by_cell = {r["cell_id"]: r for r in outcome.rows}
    assert len(outcome.rows) == 4 == len(by_cell)
    assert by_cell[hung.cell_id]["status"] == "error"
    assert "cell_timeout_s=10" in by_cell[hung.cell_id]["error"]
    assert 10 <= by_cell[hung.cell_id]["trial_wall_s"] < 45
    rest = [by_cell[s.cell.cell_id] for s in ddp_group.slots[1:]]
    assert all(r["status"] == "ok" and r["step_ms"] > 0 and r["replicas_in_sync"] for r in rest)
    assert all(r["group_id"] == f"{ddp_group.group_id}-replan" for r in rest)
    assert by_cell[hung.cell_id]["group_id"] == ddp_group.group_id


def test_a_group_that_is_not_ready_in_time_fails_twice_and_every_pair_says_why(fault_file, tmp_path):
    fault_file.write_text("")
    spec = parse_spec(spec_text(buckets="[25]") + "group_start_timeout_s: 2\n")
    outcome = execute(plan_sweep(spec, results=str(tmp_path)))
    assert len(outcome.rows) == 2 and {r["status"] for r in outcome.rows} == {"error"}
    why = "not measured: group failed twice (worker group not ready after group_start_timeout_s=2 s)"
    assert {r["error"] for r in outcome.rows} == {why}
    assert_every_cpu_free()  # a fit killed while it started leaves no worker group reserving the CPUs


def assert_every_cpu_free(wait_s: float = 10.0) -> None:
    """Nothing a sweep made still holds a CPU: the next sweep's groups would wait for them and time out (seen: a
    group killed at group_start_timeout_s left its placement group, and four sweeps after it failed)."""
    deadline = time.monotonic() + wait_s
    while ray.available_resources().get("CPU", 0) < 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    held = {k: v["state"] for k, v in placement_group_table().items() if v["state"] != "REMOVED"}
    assert ray.available_resources().get("CPU", 0) == 2, held


def test_a_worker_group_left_by_a_killed_fit_is_removed_and_nothing_else(fault_file):
    @ray.remote(num_cpus=0)
    class Controller:  # stands for Ray Train's controller: it makes the group, then dies before registering it
        def make(self, bundles, strategy):
            self.pg = placement_group(bundles, strategy=strategy)
            return self.pg.id.hex()

    older = placement_group([{"CPU": 1}], strategy="PACK")  # made before the fit: never the fit's
    before = leftover.live_placement_groups()
    controller = Controller.remote()
    ours = ray.get(controller.make.remote([{"CPU": 1}], "STRICT_PACK"))
    other_shape = ray.get(controller.make.remote([{"CPU": 1}], "SPREAD"))
    ray.kill(controller)
    assert leftover.remove_left_behind(before, [{"CPU": 1.0}], "STRICT_PACK", settle_s=0.5) == [ours]
    states = {k: v["state"] for k, v in placement_group_table().items()}
    assert states[ours] == "REMOVED" and states[older.id.hex()] != "REMOVED" and states[other_shape] != "REMOVED"
    for pg_id in (older.id.hex(), other_shape):
        remove_placement_group(leftover.handle(pg_id))
    assert_every_cpu_free()


def test_hooks_and_an_env_grid_run_on_ray_one_group_per_environment(fault_file, tmp_path, monkeypatch):
    """With a planted corruption (DDPSWEEP_CORRUPT) on one exact cell: its replicas stay in sync, its gradient
    check fails, and recommend leaves it out and says why."""
    from results.analysis.recommend import recommend
    from sweeps.trial.options import CORRUPT_ENV

    fault_file.write_text("")
    text = spec_text(buckets="[0.25]").replace("warmup_steps: 1", "warmup_steps: 2")
    text += "comm_hook: [none, powersgd]\ntrace_comm: true\nenv_grid: {TORCH_DISTRIBUTED_DEBUG: ['OFF', INFO]}\n"
    spec = parse_spec(text)
    bad = next(c for c in expand(spec) if c.step.comm_hook == "none" and "INFO" in c.env_grid and c.step.mode == "ddp")
    monkeypatch.setenv(CORRUPT_ENV, f"{bad.cell_id}=1e-4")
    outcome = execute(plan_sweep(spec, results=str(tmp_path)))
    ddp = [r for r in outcome.rows if r["mode"] == "ddp"]
    assert len(ddp) == 4 and all(r["status"] == "ok" and r["replicas_in_sync"] for r in ddp), ddp
    verdicts = {(r["comm_hook"], r["cell_id"] == bad.cell_id): r["grad_check"] for r in ddp}
    assert verdicts == {("none", False): "exact", ("none", True): "failed", ("powersgd", False): "approximate"}
    corrupt = next(r for r in ddp if r["cell_id"] == bad.cell_id)
    assert corrupt["injected_corruption"] == 1e-4 and corrupt["grad_rel_error"] > 100 * corrupt["grad_tol"]
    (rec,) = recommend(load(str(tmp_path)))
    assert [json.loads(c["env_grid"]) for c in rec["excluded"]] == [{"TORCH_DISTRIBUTED_DEBUG": "INFO"}]
    assert "failed the gradient check in 1 of 1" in rec["excluded"][0]["reason"]
    assert all(c["env_grid"] != bad.env_grid or c["comm_hook"] != "none" for c in rec["indistinguishable"])
    assert len({r["group_id"] for r in ddp}) == 2  # one worker group per environment, hooks share it
    for r in ddp:
        grid = json.loads(r["env_grid"])
        assert json.loads(r["env"])["TORCH_DISTRIBUTED_DEBUG"] == grid["TORCH_DISTRIBUTED_DEBUG"]  # in force
        assert json.loads(r["env"])["NCCL_DEBUG"] == "WARN"  # the spec's env beside it
    by_hook = {r["grad_compression"]: r["comm_bytes_per_step"] for r in ddp if "INFO" in r["env_grid"]}
    assert by_hook["powersgd-rank-1"] <= 0.1 * by_hook["none"]  # measured by the trace, on the workers


def test_a_race_drops_planted_slow_cells_and_auto_rounds_stop_once_resolved(fault_file, tmp_path, monkeypatch):
    from sweeps.driver.summary import summary_text
    from sweeps.trial.options import SLOWDOWN_ENV

    fault_file.write_text("")
    decide = "search: race\nmin_rounds: 3\nmax_rounds: 6\n"
    spec = parse_spec(spec_text(buckets="[0.25, 1, 25]", repeats="auto") + decide)
    fast, *slow = [c for c in expand(spec) if c.step.mode == "ddp"]
    # timed steps 10x as long: a difference the race resolves within max_rounds on this noisy machine
    monkeypatch.setenv(SLOWDOWN_ENV, ",".join(f"{c.cell_id}=9" for c in slow))
    rows = execute(plan_sweep(spec, results=str(tmp_path))).rows
    assert {(r["search"], r["target_rel"], r["status"]) for r in rows} == {("race", 0.02, "ok")}
    ddp = [r for r in rows if r["mode"] == "ddp"]
    assert len({r["group_id"] for r in ddp}) == 1  # the rounds went to one warm worker group
    for cell in slow:
        mine = sorted((r for r in ddp if r["cell_id"] == cell.cell_id), key=lambda r: r["round"])
        assert {r["injected_slowdown"] for r in mine} == {9.0}
        dropped = [r["eliminated_at_round"] for r in mine if r.get("eliminated_at_round") is not None]
        assert dropped in ([], [mine[-1]["round"]])  # only the rows of its last round say so
    survivor = [r for r in ddp if r["cell_id"] == fast.cell_id]
    assert 3 <= len(survivor) < 6 and all(r.get("injected_slowdown") is None for r in survivor)
    assert any(r.get("eliminated_at_round") is not None for r in ddp)
    summary = summary_text(load(str(tmp_path)))
    assert "rounds auto, workers=2 gas=1 no_sync=false: resolved after" in summary and "race: " in summary
    ran = [(r["round"], r["order_in_round"]) for r in sorted(ddp, key=lambda r: r["started_at"])]
    assert ran == sorted(ran)  # round by round, each in its planned order (less the dropped cells)


def test_one_worker_group_measures_every_placement_on_its_own_ranks(fault_file, tmp_path, monkeypatch):
    """Each cell on its own ranks of one group; with a straggler planted on rank 1 (DDPSWEEP_SLOWDOWN=*@1=3), the
    2-rank cell's rows name that rank's host, local rank and device, and the summary names it (3 rounds: fewer
    measurements of a device name none)."""
    from results.analysis.stragglers import summary_lines
    from sweeps.trial.options import SLOWDOWN_ENV

    fault_file.write_text("")
    monkeypatch.setenv(SLOWDOWN_ENV, "*@1=3")  # 4x: a planted 2x once read 1.48x [1.07, 2.04] under CI's load
    text = spec_text(buckets="[25]", repeats=3).replace("workers: [2]", "workers: [1, 2]")
    text = text.replace("timed_steps: 3", "timed_steps: 10")  # 3 steps once left a planted 2x inside the noise
    plan = plan_sweep(parse_spec(text), results=str(tmp_path))
    (group,) = plan.groups()  # baselines, 1x1 and 1x2 DDP: one worker group of two ranks
    assert group.first.world_size == 2 and len(group.slots) == 9  # 3 rounds
    every = execute(plan).rows
    assert len(every) == 9 and all(r["status"] == "ok" and r["replicas_in_sync"] for r in every), every
    assert {r["host_world_size"] for r in every} == {2} and len({r["group_id"] for r in every}) == 1
    rows = [r for r in every if r["round"] == 0]
    by_mode = {(r["mode"], r["world_size"]): r for r in rows}
    assert by_mode[("single", 1)]["ranks"] == [0] and by_mode[("single", 1)]["backend"] == "none"
    assert by_mode[("ddp", 1)]["ranks"] == [0] and by_mode[("ddp", 2)]["ranks"] == [0, 1]
    assert [len(r["rank_nodes"]) for r in rows] == [len(r["ranks"]) for r in rows]
    two = by_mode[("ddp", 2)]
    assert two["rank_local_ranks"] == [0, 1] and len(set(two["rank_hosts"])) == 1
    assert all(d.startswith("cpu:") for d in two["rank_devices"]) and len(two["rank_compute_ms"]) == 2
    assert (two["injected_slowdown"], two["injected_slowdown_rank"]) == (3.0, 1)
    assert all(r.get("injected_slowdown_rank") is None for r in every if r["world_size"] == 1)
    (said,) = summary_lines(load(str(tmp_path)))
    assert said.startswith(f"straggler: {two['rank_hosts'][1]} local rank 1 (cpu:") and "[planted" in said
    assert (
        by_mode[("ddp", 2)]["workers_per_node_observed"] == 2 and by_mode[("ddp", 1)]["workers_per_node_observed"] == 1
    )
    assert 0 < rows[0]["group_setup_s"] < 120  # the group's start, launch to ready


def test_compiled_cells_run_on_ray_and_the_known_failure_is_an_error_row_the_group_survives(fault_file, tmp_path):
    """compile: [true] with aot_eager: the first-bucket refusal of ddp_optimizer at 0.25 MB is an error row with
    PyTorch's message; the compiled baseline and the 25 MB cell after it measure, each with its compile figures."""
    fault_file.write_text("")
    text = spec_text().replace("warmup_steps: 1", "warmup_steps: 2")
    spec = parse_spec(text + "compile: [true]\ncompile_backend: aot_eager\n")
    assert spec.known_failures()[0].startswith("optimize_ddp ddp_optimizer with bucket_cap_mb 0.25: known to fail")
    outcome = execute(plan_sweep(spec, results=str(tmp_path)))
    by = {(r["mode"], r["bucket_cap_mb"]): r for r in outcome.rows}
    refused = by[("ddp", 0.25)]
    assert refused["status"] == "error" and "First bucket should be smaller/equal" in refused["error"]
    assert refused["compile"] and refused["optimize_ddp"] == "ddp_optimizer"
    for key in (("ddp", 25.0), ("single", None)):
        r = by[key]
        assert r["status"] == "ok" and r["compile"] and r["compile_backend"] == "aot_eager", r
        assert r["compile_s"] > 0 and r["compiled_graphs"] >= 1 and r["recompiles_timed"] == 0
    ddp = by[("ddp", 25.0)]
    assert (
        ddp["grad_check"] == "exact" and ddp["replicas_in_sync"] and ddp["collectives_per_step"] == ddp["num_buckets"]
    )
    assert by[("single", None)]["collectives_per_step"] is None
    assert len({r["group_id"] for r in outcome.rows if r["mode"] == "ddp"}) == 1  # one group went on


def test_with_a_cluster_the_profile_runs_there_as_a_task(fault_file, tmp_path, monkeypatch):
    """`predict --address`: the profile is a Ray task (a worker's resources, the cluster's device and torch): this
    process's profiler is broken on purpose and the profile is still made and stored."""
    from typer.testing import CliRunner

    import trainers.profile
    from service.cli import app
    from tests.test_predict import calibrate

    def broken(*args, **kwargs):
        raise AssertionError("profiled in the driver's process")

    monkeypatch.setattr(trainers.profile, "profile_micro_step", broken)
    spec = tmp_path / "p.yaml"
    spec.write_text(spec_text())
    root = str(tmp_path / "r")
    calibrate(root, cluster="test")
    out = CliRunner().invoke(app, ["predict", str(spec), "--results", root, "--address", "the-test-cluster"])
    assert out.exit_code == 0, out.output
    assert out.output.startswith("profiles run on the cluster (cpu): 1")
    assert out.output.count("<- predicted best of its curve") == 1
    assert len(Store.open(root).read_profiles()) == 1


def test_a_workers_stderr_is_asked_of_this_sessions_cluster(fault_file, monkeypatch):
    """deaths.stderr_tail names its session's cluster: without an address Ray looks for "the" cluster on this
    machine and refuses when a second one runs here (a `ray start` head beside the embedded one), and a dead
    worker's explanation was lost."""
    import ray.util.state

    from sweeps.trial import deaths

    asked = []
    monkeypatch.setattr(ray.util.state, "get_log", lambda **kw: asked.append(kw) or iter(["a line\n"]))
    assert deaths.stderr_tail("10.0.0.1", 42) == ["a line"]
    assert [(a["address"], a["node_ip"], a["pid"]) for a in asked] == [
        (ray.get_runtime_context().gcs_address, "10.0.0.1", 42)
    ]
