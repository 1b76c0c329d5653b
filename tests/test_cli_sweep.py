"""The `ddpsweep run` command as users run it: a subprocess with the embedded local Ray, or on a running cluster."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import ray
from typer.testing import CliRunner

from results.storage.store import Store, load
from service.cli import app

ROOT = Path(__file__).resolve().parent.parent
SMOKE = ROOT / "sweeps" / "specs" / "smoke.yaml"


def ddpsweep(*args: str, **kw) -> subprocess.Popen:
    """`ddpsweep ARGS` as a user starts it at a terminal: in its own session, with Ctrl-C's default action (a
    suite started in the background by a non-interactive shell ignores SIGINT, and the CLI would inherit it)."""
    return subprocess.Popen(
        [sys.executable, "-m", "service.cli", *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        preexec_fn=_default_sigint,
        **kw,
    )


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.ray
@pytest.mark.slow
def test_smoke_spec_end_to_end(smoke_run, tmp_path):
    out, err, store = smoke_run.out, smoke_run.err, smoke_run.root
    assert smoke_run.returncode == 0, err[-3000:]
    rows = load(str(store), cluster="ci")
    assert len(rows) == 33  # 3 rounds x (2 baselines + 3 buckets x (gas 1 + gas 2 x no_sync both))
    assert set(rows["status"]) == {"ok"}
    assert sorted(rows.groupby("cell_id").size().unique()) == [3]
    assert rows["group_id"].nunique() == 1 and set(rows["isolation"]) == {"sweep"}  # baselines and DDP cells
    assert (rows["step_ms"] > 0).all() and rows["replicas_in_sync"].all()
    expected_tps = rows["tokens_per_step"] / (rows["step_ms"] / 1e3)
    assert ((rows["tokens_per_s"] - expected_tps).abs() / expected_tps < 1e-9).all()
    single = rows[rows["mode"] == "single"]
    assert sorted(single["gas"]) == [1, 1, 1, 2, 2, 2] and (single["world_size"] == 1).all()
    ddp = rows[rows["mode"] == "ddp"]
    assert (ddp["world_size"] == 2).all() and (ddp["backend"] == "gloo").all() and (ddp["num_threads"] == 1).all()
    # every DDP configuration checked its gradient once (its first round), exact within the fp32 bound, across
    # buckets and no_sync patterns; the later rounds carry no verdict of their own
    checked = ddp[ddp["grad_check"].notna()]
    assert sorted(checked["round"]) == [0] * 9 and set(ddp["grad_check_when"]) == {"first"}
    assert set(checked["grad_check"]) == {"exact"} and (checked["grad_rel_error"] <= checked["grad_tol"]).all()
    assert (checked["grad_tol"] < 1e-5).all() and (checked["grad_check_ms"] > 0).all()
    assert single["grad_check"].isna().all()
    assert (
        ddp[ddp["bucket_cap_mb"] == 0.05]["num_buckets"] > ddp[ddp["bucket_cap_mb"] == 25]["num_buckets"].max()
    ).all()
    for col in ("accelerator", "torch_version", "ray_version", "python_version", "ddpsweep_version"):
        assert rows[col].str.len().gt(0).all(), col
    assert all(len(h) == 1 for h in rows["hosts"])
    assert "OMP_NUM_THREADS" in json.loads(rows["env"].iloc[0])
    assert out.count(" ok\n") == 33 and "best bucket" in out and "efficiency" in out
    assert "33 of 33 measurements to run in 1 worker group(s)" in out
    assert set(rows["host_world_size"]) == {2} and sorted(map(list, single["ranks"])) == [[0]] * 6
    assert "Configuration for experiment" not in out  # Ray's console noise stays out of the way
    # each DDP measurement has both ranks' compute and wait, where they ran; no plant: no rank named (A/A)
    assert all(len(c) == 2 and all(len(p) == 5 for p in c) for c in ddp["rank_compute_ms"])
    assert all(list(lr) == [0, 1] for lr in ddp["rank_local_ranks"]) and single["rank_compute_ms"].isna().all()
    assert "\nstragglers: none beyond the noise (2 device(s), 54 rank measurements;" in out

    # the store a real Ray sweep wrote answers queries and renders a report
    runner = CliRunner()
    best = runner.invoke(app, ["query", "select count(*) n from u_curve", "--results", str(store), "--format", "csv"])
    assert best.exit_code == 0 and best.output.split() == ["n", "3"]  # gas 1, gas 2 x no_sync both
    report = runner.invoke(app, ["report", "--results", str(store), "--out", str(tmp_path / "r.html")])
    assert report.exit_code == 0 and (tmp_path / "r.html").read_text().count("data:image/png") == 3


@pytest.mark.ray
def test_driver_killed_mid_group_then_resume_measures_only_the_missing_pairs(tmp_path, shared_head):
    spec = tmp_path / "mini.yaml"
    mini = SMOKE.read_text().replace("gas: [1, 2]", "gas: [1]").replace("repeats: 3", "repeats: 2")
    spec.write_text(mini)  # 2 rounds of a baseline and 3 buckets
    results = tmp_path / "store"
    proc = ddpsweep("run", str(spec), "--results", str(results), "--sweep", "interrupted", *shared_head)
    store = Store.open(str(results))
    deadline = time.time() + 300
    while len(store.files()) < 4 and time.time() < deadline:  # the first round's rows
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)  # the driver dies in the middle of the DDP group
    proc.communicate()
    before = {(r["cell_id"], r["repeat"], r["finished_at"], r["step_ms"]) for r in store.read_table().to_pylist()}
    assert 4 <= len(before) < 8
    resumed = ddpsweep("run", str(spec), "--results", str(results), "--resume", "interrupted", *shared_head)
    out, err = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, err[-3000:]
    assert f"{8 - len(before)} of 8 measurements to run in 1 worker group(s)" in out
    rows = load(str(results))
    assert len(rows) == 8 and set(rows["status"]) == {"ok"}
    assert not rows.duplicated(["cell_id", "repeat"]).any()
    after = {(r["cell_id"], r["repeat"], r["finished_at"], r["step_ms"]) for r in store.read_table().to_pylist()}
    assert before <= after  # rows written before the kill kept, unchanged
    assert [Path(p).name for p in store.files()] == ["compacted.parquet"]  # compacted once it finished


@pytest.mark.ray
@pytest.mark.parametrize(("sig", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_ctrl_c_and_sigterm_say_interrupted_print_the_resume_command_and_exit(tmp_path, sig, code):
    spec = tmp_path / "mini.yaml"
    spec.write_text(SMOKE.read_text().replace("gas: [1, 2]", "gas: [1]"))
    results = tmp_path / "store"
    proc = ddpsweep("run", str(spec), "--results", str(results), "--sweep", "ctrlc")
    store = Store.open(str(results))
    deadline = time.time() + 300
    rows = 1 if sig == signal.SIGINT else 0  # SIGINT: once a row is written; SIGTERM: once Ray is up, the plan written
    manifest = results / "cluster=local" / "sweep=ctrlc" / "_sweep.json"
    while (len(store.files()) < rows or not manifest.exists()) and time.time() < deadline:
        time.sleep(0.2)
    proc.send_signal(sig)  # Ctrl-C (or kill, systemd, Kubernetes) in the middle of the sweep
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == code, err[-2000:]
    assert "SIGTERM received" not in err and "Traceback" not in err
    assert "interrupted: sweep ctrlc stopped" in err and "--resume ctrlc" in err
    assert f"--results {results}" in err
    assert rows <= len(store.files()) < 12 and not list(Path("/tmp").glob("ddpsweep-ctrlc-*"))


@pytest.mark.ray
def test_calibrate_measures_the_specs_worker_groups_and_the_report_shows_the_fit(tmp_path, shared_head):
    proc = ddpsweep("calibrate", str(SMOKE), "--results", str(tmp_path), "--cluster", "cal", *shared_head)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    assert "2 ranks on 1 node(s), gloo: alpha" in out and "GB/s algbw" in out
    assert "per bucket " in out and " while an all-reduce runs" in out  # the overlap terms, measured beside it
    terms = CliRunner().invoke(
        app,
        ["query", "select bucket_ms, contention from alpha_beta", "--results", str(tmp_path), "--format", "json"],
    )
    assert terms.exit_code == 0, terms.output
    lines = json.loads(terms.output)
    assert lines and all(x["bucket_ms"] is not None and x["contention"] is not None for x in lines)  # measured
    n = CliRunner().invoke(
        app,
        [
            "query",
            "select count(*) n from calibration where kind = 'all_reduce'",
            "--results",
            str(tmp_path),
            "--format",
            "csv",
        ],
    )
    assert n.exit_code == 0 and int(n.output.split()[1]) >= 4  # 4 KB .. >= the tiny model's 1.5 MB, x4
    assert not Store.open(str(tmp_path)).files()  # calibration only: no cell rows


@pytest.mark.ray
def test_a_calibration_whose_trial_never_starts_exits_1_and_says_why(tmp_path, shared_head):
    """A driver whose environment asks for token auth of a cluster without it (as `ray.init` leaves
    RAY_AUTH_MODE behind) and holds a token (here in RAY_AUTH_TOKEN; a machine that ever ran
    `ray get-auth-token --generate` has one in ~/.ray/auth_token): Ray joins, but the trial is cancelled before
    it starts. calibrate said nothing of it and exited 0."""
    env = os.environ | {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": "a" * 32}
    proc = ddpsweep("calibrate", str(SMOKE), "--results", str(tmp_path), *shared_head, env=env)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 1, err[-3000:]
    last = err.strip().splitlines()[-1]
    assert last.startswith("error: 1 of 1 worker group(s) not calibrated: trial died: "), err[-2000:]
    assert "Failure # 1" not in last and "rows:" not in out  # Tune's header is not the reason; no rows to query
    assert "(RAY_AUTH_MODE=token in its environment)" in last and last.endswith("unset RAY_AUTH_MODE for this cluster.")


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("name: bad\nbucket_caps: [25]\n", "bucket_caps"),
        ("name: bad\nbucket_cap_mb: [-1]\n", "bucket_cap_mb[0]"),
        ("name: bad\ngas: []\n", "gas"),
        ("name: bad\nworkers: [3]\nnodes: [2]\n", "nodes"),
        ("name: bad\nworkers: [64]\nuse_gpu: false\n", "workers"),
    ],
)
def test_bad_spec_exits_2_before_ray_starts(tmp_path, text, field):
    spec = tmp_path / "bad.yaml"
    spec.write_text(text)
    assert not ray.is_initialized()
    result = CliRunner().invoke(app, ["run", str(spec), "--results", str(tmp_path / "store")])
    assert result.exit_code == 2
    assert f"error: {field}:" in result.output
    assert not ray.is_initialized()
    assert not (tmp_path / "store").exists()


def test_dry_run_prints_the_grid_and_writes_nothing(tmp_path):
    result = CliRunner().invoke(app, ["run", str(SMOKE), "--dry-run", "--results", str(tmp_path / "s")])
    assert result.exit_code == 0
    assert result.output.strip().splitlines()[-1] == "11 cells x 3 repeat(s) = 33 measurements in 1 worker group(s)"
    assert not ray.is_initialized() and not (tmp_path / "s").exists()
