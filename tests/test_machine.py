"""This machine under several sweeps: locks, a `ray start` cluster beside the embedded one, stale folders, leftover
and dead processes."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from results.storage.store import load
from sweeps.driver import machine

FAULT = """Fatal Python error: Segmentation fault

Thread 0x00007f (most recent call first):
  File "/x/torch/nn/parallel/distributed.py", line 1473 in _ddp_init_helper
  File "/x/trainers/step.py", line 106 in wrap_ddp

Extension modules: torch._C (total: 1)"""


def test_a_dead_workers_signal_and_frames_lead_the_message(monkeypatch):
    from sweeps.trial import deaths

    ray_says = "WorkerGroupError: Training failed\nmetadata=ActorMetadata(node_ip='10.0.0.2',\n pid=4242,\n)\n"
    ray_says += "The actor died unexpectedly"
    seen = {}
    monkeypatch.setattr(deaths, "stderr_tail", lambda ip, pid: seen.update(ip=ip, pid=pid) or FAULT.splitlines())
    text = deaths.explain(ray_says)
    assert seen == {"ip": "10.0.0.2", "pid": 4242}
    assert text.startswith("a worker process (pid 4242) died of SIGSEGV (Segmentation fault)")
    assert 'step.py", line 106 in wrap_ddp' in text and "(Ray: WorkerGroupError: Training failed)" in text
    monkeypatch.setattr(deaths, "stderr_tail", lambda ip, pid: [])
    assert deaths.explain(ray_says) == ray_says  # nothing readable: Ray's message as it was


@pytest.mark.ray
def test_a_worker_env_that_segfaults_every_worker_is_named_in_the_rows(tmp_path, shared_head):
    """TORCH_DISTRIBUTED_DEBUG=DETAIL segfaults DDP's constructor on gloo (torch 2.13): the rows said "worker health
    check failed" with env null."""
    import subprocess

    spec = tmp_path / "crash.yaml"
    spec.write_text(
        "name: crash\nworkers: [2]\nbackend: gloo\nuse_gpu: false\ngroup_start_timeout_s: 120\n"
        "env: {TORCH_DISTRIBUTED_DEBUG: DETAIL}\n"
    )
    results = str(tmp_path / "r")
    env = os.environ | {"PATH": f"{os.path.dirname(sys.executable)}:{os.environ['PATH']}"}
    cmd = [sys.executable, "-m", "service.cli", "run", str(spec), "--results", results, *shared_head]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=400, env=env)
    assert run.returncode == 1, run.stderr[-3000:]  # nothing measured: the command fails, the rows stay
    assert run.stderr.strip().splitlines()[-1].startswith("error: no measurement succeeded: 2 error rows")
    rows = load(results)
    assert len(rows) == 2 and set(rows["status"]) == {"error"}
    assert set(rows["env"]) == {'{"TORCH_DISTRIBUTED_DEBUG": "DETAIL"}'}
    assert all("died of SIGSEGV" in e and "wrap_ddp" in e for e in rows["error"]), rows["error"].iloc[0][:2000]

    # calibrate builds DDP too (the per-bucket term): its group fails, and no row is there to say so
    cmd[3] = "calibrate"
    cal = subprocess.run(cmd, capture_output=True, text=True, timeout=400, env=env)
    assert cal.returncode == 1, cal.stderr[-3000:]
    last = cal.stderr.strip().splitlines()[-1]
    assert last.startswith("error: 1 of 1 worker group(s) not calibrated: worker group failed: "), last


ROOT = Path(__file__).resolve().parent.parent


def test_a_second_sweep_on_the_machine_sees_the_first(tmp_path):
    script = (
        f"import sys, time; sys.path.insert(0, {str(ROOT)!r}); from pathlib import Path\n"
        f"from sweeps.driver import machine\nwith machine.measuring('first', Path({str(tmp_path)!r})):\n"
        "    print('in', flush=True); time.sleep(60)\n"
    )
    first = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert first.stdout.readline().strip() == "in"
        with machine.measuring("second", tmp_path) as others:
            assert others == [f"sweep first (pid {first.pid})"]
    finally:
        first.kill()
        first.wait()
    with machine.measuring("third", tmp_path) as others:  # the killed sweep's lock went with its process
        assert others == []
    assert [p.name for p in tmp_path.iterdir()] == []


def test_stale_bookkeeping_folders_of_dead_drivers_are_removed(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    stale = tmp_path / f"ddpsweep-s1-pid{dead.stdout.strip()}-abc"
    live = tmp_path / f"ddpsweep-s2-pid{os.getpid()}-def"
    stale.mkdir()
    live.mkdir()
    assert machine.remove_stale_storage(tmp_path) == [stale]
    assert live.exists() and not stale.exists()


@pytest.mark.ray
def test_the_embedded_ray_starts_its_own_beside_a_ray_start_cluster():
    from tests.ray_head import ray_head

    address_file = Path("/tmp/ray/ray_current_cluster")
    saved = address_file.read_text() if address_file.exists() else None
    info: dict = {}
    try:
        with ray_head("disabled", num_cpus=7, info=info):
            address_file.parent.mkdir(exist_ok=True)
            address_file.write_text(info["gcs"])  # what `ray start --head` leaves for plain ray.init()
            assert machine.local_ray_cluster_running()
            # in a child process: a Ray session started in the pytest process upset later in-process sessions
            script = (
                "import os, ray; from sweeps.driver.session import ray_session\n"
                "with ray_session(None, verbose=False): print(int(ray.cluster_resources()['CPU']))"
            )
            env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
            out = subprocess.run(
                [sys.executable, "-c", script], capture_output=True, text=True, timeout=180, cwd=ROOT, env=env
            )
            assert out.returncode == 0, out.stderr[-2000:]
            assert int(out.stdout.split()[-1]) == os.cpu_count() != 7  # its own Ray, not the 7-CPU head
    finally:
        if saved is None:
            address_file.unlink(missing_ok=True)
        else:
            address_file.write_text(saved)


def test_ending_leftover_processes_counts_zombies_as_gone_and_kills_what_ignores_sigterm():
    """After Ray's shutdown its dashboard processes exit on SIGTERM at once but stay zombies until their parent
    reaps them: end_processes must not wait its grace out for them (psutil.wait_procs did); one that ignores
    SIGTERM is killed after the grace."""
    import psutil

    code = "import subprocess, time; p = subprocess.Popen(['sleep', '60']); print(p.pid, flush=True); time.sleep(60)"
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)  # never reaps
    ignores = "import signal, time; signal.signal(15, signal.SIG_IGN); print(1, flush=True); time.sleep(60)"
    stays = subprocess.Popen([sys.executable, "-c", ignores], stdout=subprocess.PIPE, text=True)
    try:
        child = psutil.Process(int(parent.stdout.readline()))
        start = time.monotonic()
        assert machine.end_processes([child], grace_s=30) == [child.pid]
        assert time.monotonic() - start < 10  # not the 30 s grace
        assert child.status() == psutil.STATUS_ZOMBIE  # it did exit; only its parent can reap it
        stays.stdout.readline()  # its handler is installed
        assert machine.end_processes([psutil.Process(stays.pid)], grace_s=0.5) == [stays.pid]
        assert stays.wait(timeout=5) == -9  # SIGKILL after the grace
    finally:
        parent.kill()
        stays.kill()
