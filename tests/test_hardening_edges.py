"""Issue 14, second half: the server under concurrency, the store against links and mis-filed rows, the API's
one root and its read rule, the error tree, and the inputs that used to end in tracebacks or hangs."""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import urlparse

import httpx
import pytest
from fastapi.testclient import TestClient

from results.errors import LabelError, ResultsError, StoreNotFound, UnknownSelection
from results.storage.store import Store, load
from service import jobs
from service.api import ServiceSettings, create_app
from sweeps.driver import machine, runner
from sweeps.plan.planner import plan_sweep
from sweeps.spec.files import load_spec, load_spec_text, parse_spec
from sweeps.spec.sweep import SpecError
from trainers.errors import ConfigError, DDPSweepError

ROOT = Path(__file__).resolve().parent.parent
SMOKE = (ROOT / "sweeps/specs/smoke.yaml").read_text()


def smoke_with(field: str, line: str) -> str:
    """The smoke spec with `field` replaced by `line`."""
    kept = [x for x in SMOKE.splitlines() if not x.startswith(f"{field}:")]
    return "\n".join(kept + [line]) + "\n"


# --- the server stays responsive ------------------------------------------------------------------------------


def test_concurrent_reports_all_render(seed_store, live_server):
    base = live_server(create_app(ServiceSettings(address=None, results=seed_store, token="t")))
    paths = ["/report", "/report?cluster=pcie-8x", "/report?sweep=seed", "/report?cluster=pcie-8x&sweep=seed"]
    with httpx.Client(base_url=base, timeout=120) as client, ThreadPoolExecutor(8) as pool:
        pages = list(pool.map(lambda i: client.get(paths[i % 4]), range(16)))  # four renders at once
    assert [p.status_code for p in pages] == [200] * 16  # pyplot's global state gave 500s here
    for i in range(4):  # one render per report and version of the store, the same page to every request
        assert len({p.text for p in pages[i::4]}) == 1


def test_a_report_renders_once_per_version_of_the_store(seed_store):
    from tests.seed_rows import seed_rows

    client = TestClient(create_app(ServiceSettings(address=None, results=seed_store, token="t")))
    first = client.get("/report")
    started = time.perf_counter()
    again = client.get("/report")
    assert again.text == first.text and time.perf_counter() - started < 0.5  # from the memo
    row = seed_rows()[0] | {"sweep_id": "later", "cell_id": "c-later"}
    Store.open(seed_store).write_row(row)  # new rows: a new version
    time.sleep(1.1)  # the cache lists the store at most once a second
    after = client.get("/report")
    assert "8 rows (0 errors)" in first.text and "9 rows (0 errors)" in after.text


def _raw_get(sock: socket.socket, path: str) -> tuple[int, bytes]:
    sock.sendall(f"GET {path} HTTP/1.1\r\nHost: t\r\n\r\n".encode())
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(65536)
    head, body = data.split(b"\r\n\r\n", 1)
    length = int(next(x for x in head.split(b"\r\n") if x.lower().startswith(b"content-length")).split(b":")[1])
    while len(body) < length:
        body += sock.recv(65536)
    return int(head.split(b" ")[1]), head


def test_a_500_leaves_its_keep_alive_connection_usable(seed_store, live_server, monkeypatch):
    def broken(*a, **k):
        raise RuntimeError("a bug")

    monkeypatch.setattr("service.api.render_html", broken)
    base = urlparse(live_server(create_app(ServiceSettings(address=None, results=seed_store, token="t"))))
    with socket.create_connection((base.hostname, base.port), timeout=30) as sock:
        status, head = _raw_get(sock, "/report")
        assert status == 500 and b"connection: close" not in head.lower()
        assert _raw_get(sock, "/openapi.json")[0] == 200  # the same connection answers the next request


# --- the store: links, mis-filed rows ---------------------------------------------------------------------------


def test_symbolic_links_in_the_store_are_never_followed(seed_store, tmp_path_factory, caplog):
    store = Store.open(seed_store)
    before = store.read_table().num_rows
    other = tmp_path_factory.mktemp("other-store")
    Store.open(str(other)).write_row(store.read_table().to_pylist()[0] | {"sweep_id": "elsewhere"})
    sweep_dir = Path(store.files()[0]).parent
    (sweep_dir / "loop").symlink_to("..")  # a loop: followed, it multiplied the rows
    (Path(seed_store) / "cluster=linked").symlink_to(other / "cluster=pcie-8x")  # another store's folder
    (sweep_dir / "linked-r0.parquet").symlink_to(Store.open(str(other)).files()[0])  # a file link
    with caplog.at_level(logging.WARNING):
        assert store.read_table().num_rows == before
        assert set(store.labels()) == {"pcie-8x"}
    assert "symbolic link" in caplog.text


def test_a_row_whose_cluster_disagrees_with_its_folder_is_skipped(seed_store, caplog):
    store = Store.open(seed_store)
    row = store.read_table().to_pylist()[0]
    store.write_row(row | {"cell_id": "misfiled", "cluster": "other"})
    path = Path(store.files("other")[0])
    moved = Path(seed_store) / "cluster=pcie-8x" / f"sweep={row['sweep_id']}" / path.name
    path.rename(moved)
    with caplog.at_level(logging.WARNING):
        rows = load(seed_store, cluster="pcie-8x")
    assert "misfiled" not in set(rows["cell_id"]) and "disagree with its folders" in caplog.text


# --- the API: one root, the read rule, no server paths, one error tree ------------------------------------------


def test_post_sweeps_never_writes_outside_the_server_root(seed_store):
    client = TestClient(create_app(ServiceSettings(address=None, results=seed_store, token="t")))
    r = client.post("/sweeps?results=/elsewhere", content=SMOKE, headers={"Authorization": "Bearer t"})
    assert r.status_code == 422 and r.json()["error"]["field"] == "results"


def test_reads_need_the_token_when_bound_beyond_loopback(seed_store):
    settings = ServiceSettings(address=None, results=seed_store, token="t", public_reads=False)
    client = TestClient(create_app(settings))
    for path in ("/cells", "/report", "/sweeps", "/", "/compare?cluster=a&cluster=b"):
        assert client.get(path).status_code == 401, path
    assert client.get("/cells", headers={"Authorization": "Bearer t"}).status_code == 200
    assert client.get("/openapi.json").status_code == 200  # the API's description stays public
    assert TestClient(create_app(ServiceSettings(None, seed_store, "t"))).get("/cells").status_code == 200


def test_error_responses_never_show_a_server_path(seed_store):
    client = TestClient(create_app(ServiceSettings(address=None, results=seed_store, token="t")))
    for path, status in (("/cells?cluster=nope", 404), ("/sweeps", 422), ("/report?sweep=nope", 404)):
        r = client.get(path)
        assert r.status_code == status, (path, r.text)
        assert seed_store not in r.text and os.getcwd() not in r.text and os.path.expanduser("~") not in r.text
    empty = TestClient(create_app(ServiceSettings(address=None, results=seed_store + "/none", token="t")))
    assert empty.get("/cells").status_code == 404 and seed_store not in empty.get("/cells").text


def test_one_error_root_whose_classes_carry_their_http_status():
    """Every error raised on purpose derives from DDPSweepError (results' too) and carries its HTTP status."""
    expected = {
        ConfigError: 422,
        SpecError: 422,
        LabelError: 422,
        ResultsError: 400,
        StoreNotFound: 404,
        UnknownSelection: 404,
        jobs.JobsError: 503,
        jobs.SweepNotFound: 404,
    }
    for cls, status in expected.items():
        assert issubclass(cls, DDPSweepError) and cls.http_status == status, cls
    assert not issubclass(ConfigError, ResultsError)


# --- a clear error, exit 2, instead of a traceback or a hang ----------------------------------------------------


@pytest.mark.parametrize(
    ("field", "line", "named"),
    [
        ("micro_batch", "micro_batch: 100000000000000000000000000000", "micro_batch"),
        ("repeats", "repeats: 100000000", "repeats"),
        (
            "bucket_cap_mb",
            f"bucket_cap_mb: [{', '.join(str(b) for b in range(1, 1001))}]\ntiming: [sync, loop]",
            "repeats",
        ),
        ("bucket_cap_mb", "bucket_cap_mb: [1e-300]", "bucket_cap_mb[0]"),
        ("cell_timeout_s", "cell_timeout_s: 1.0e+308", "cell_timeout_s"),
        ("collective_timeout_s", "collective_timeout_s: 0.5", "collective_timeout_s"),
        ("group_start_timeout_s", "group_start_timeout_s: 0", "group_start_timeout_s"),
        ("env", 'env: {"NCCL_A=B": "1"}', "env.NCCL_A=B"),
    ],
)
def test_out_of_range_spec_values_name_their_field(field, line, named):
    with pytest.raises(SpecError) as e:
        parse_spec(smoke_with(field, line))
    assert e.value.field == named


def test_a_grid_over_the_cap_says_the_cap():
    with pytest.raises(SpecError, match="at most 10000 measurements"):
        # 2 baselines + 1000 buckets x (gas 1, gas 2 with and without no_sync) = 3002 cells x 4 rounds
        buckets = f"bucket_cap_mb: [{', '.join(str(b) for b in range(1, 1001))}]"
        parse_spec(smoke_with("bucket_cap_mb", buckets).replace("repeats: 3", "repeats: 4"))


def test_a_non_utf8_spec_file_is_a_clear_error(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_bytes(b"name: x\n\xff\xfe: 1\n")
    with pytest.raises(SpecError, match="UTF-8"):
        load_spec(bad)


def test_submit_reads_the_spec_text_from_the_environment(monkeypatch):
    monkeypatch.setenv("MYSPEC", SMOKE)
    spec, text = load_spec_text("env:MYSPEC")
    assert text == SMOKE and spec.name == "smoke"


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="checks a CPU-only machine")
def test_nccl_on_a_cpu_only_machine_is_refused_before_ray_starts(tmp_path):
    spec = parse_spec(smoke_with("backend", "backend: nccl").replace("use_gpu: false", "use_gpu: auto"))
    plan = plan_sweep(spec, results=str(tmp_path))
    with pytest.raises(SpecError) as e:
        runner.check_local(plan)
    assert e.value.field == "backend" and "NCCL needs GPUs" in str(e.value)


def test_resume_paths_and_corrupt_manifests_are_clear_errors(seed_store):
    spec = parse_spec(SMOKE)
    with pytest.raises(LabelError) as e:
        plan_sweep(spec, results=seed_store, resume="../../etc")
    assert e.value.field == "--resume"
    folder = Path(seed_store) / "cluster=local" / "sweep=broken"
    folder.mkdir(parents=True)
    (folder / "_sweep.json").write_text('{"cells": [')
    with pytest.raises(ResultsError, match="corrupt"):
        plan_sweep(spec, results=seed_store, resume="broken")


def test_an_unreachable_s3_root_is_one_error_in_seconds():
    start = time.monotonic()
    with pytest.raises(StoreNotFound, match="cannot list it"):
        Store.open("s3://ddpsweep-no-such-bucket?endpoint_override=127.0.0.1:9&scheme=http").files()
    assert time.monotonic() - start < 20  # pyarrow's default retries took minutes against a dead endpoint


def test_jobs_calls_time_out_against_a_server_that_never_answers(monkeypatch):
    monkeypatch.setattr(jobs, "READ_TIMEOUT_S", 1.0)
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    held = []
    threading.Thread(target=lambda: held.extend(listener.accept() for _ in range(8)), daemon=True).start()
    start = time.monotonic()
    with pytest.raises(jobs.JobsError, match="did not answer within"):
        jobs.status(f"http://127.0.0.1:{listener.getsockname()[1]}")
    assert time.monotonic() - start < 20
    listener.close()


def test_serve_refuses_a_port_out_of_range():
    proc = subprocess.run(
        [sys.executable, "-m", "service.cli", "serve", "--port", "99999"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert proc.returncode == 2 and "65535" in proc.stderr and "Traceback" not in proc.stderr


# --- this machine: other sweeps, a `ray start` cluster, stale folders -------------------------------------------


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


def test_resuming_a_finished_sweep_starts_no_ray_and_compacts_what_a_stop_left(tmp_path, monkeypatch):
    import ray

    from tests.seed_rows import row

    spec = parse_spec(smoke_with("gas", "gas: [1]"))
    plan = plan_sweep(spec, results=str(tmp_path), sweep_id="done")
    plan.store.write_manifest("local", "done", {"cells": [c.cell_id for c in plan.cells]})
    for cell, rnd in plan.todo:  # every pair measured; the driver stopped before it compacted
        plan.store.write_row(row("ddp", 2, 100.0, cluster="local", sweep="done", cell_id=cell.cell_id, repeat=rnd))
    assert len(plan.store.files()) == len(plan.todo) == 12
    resumed = plan_sweep(spec, results=str(tmp_path), resume="done")
    assert resumed.todo == [] and not ray.is_initialized()
    monkeypatch.setattr(ray, "init", lambda *a, **k: pytest.fail("a sweep with nothing to measure started Ray"))
    outcome = runner.execute(resumed)
    assert outcome.rows == [] and outcome.sweep_id == "done"
    assert [Path(p).name for p in plan.store.files()] == ["compacted.parquet"] and len(load(str(tmp_path))) == 12


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


def test_a_dry_run_of_the_scaling_spec_never_touches_its_store():
    # its results root is s3://my-bucket/…, unreachable here; --address skips this machine's pre-flight
    cmd = [
        sys.executable,
        "-m",
        "service.cli",
        "run",
        "sweeps/specs/scaling.yaml",
        "--dry-run",
        "--address",
        "http://127.0.0.1:9",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "measurements in" in proc.stdout and "error" not in proc.stderr.lower()


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
