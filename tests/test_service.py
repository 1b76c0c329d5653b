"""Tier 5: the HTTP API in-process and `ddpsweep submit|status|logs|stop` against a real `ray start --head`."""

from __future__ import annotations

import csv
import functools
import io
import json
import os
import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from results.storage.store import load
from service.api import ServiceSettings, create_app
from service.cli import app as cli_app
from tests.ray_head import ray_head

pytestmark = pytest.mark.ray
ROOT = Path(__file__).resolve().parent.parent
TOKEN = "test-token-1234"
MINI = (
    (ROOT / "sweeps/specs/smoke.yaml")
    .read_text()
    .replace("bucket_cap_mb: [0.05, 0.25, 25]", "bucket_cap_mb: [25]")
    .replace("repeats: 3", "repeats: 1")
)


@pytest.fixture(scope="module")
def head_info():
    """A real Ray head with its job server on loopback (auth off here; see test_service_auth.py): (job server
    address, GCS address)."""
    os.environ["RAY_AUTH_MODE"] = "disabled"
    info: dict = {}
    with ray_head("disabled", info=info) as address:
        yield address, info["gcs"]


@pytest.fixture(scope="module")
def head(head_info):
    return head_info[0]


@pytest.fixture
def api(head, tmp_path):
    settings = ServiceSettings(address=head, results=str(tmp_path / "store"), token=TOKEN)
    return TestClient(create_app(settings)), settings


AUTH = {"Authorization": f"Bearer {TOKEN}"}


def wait_state(client: TestClient, sweep_id: str, states: set[str], timeout: float = 400) -> dict:
    deadline = time.time() + timeout
    while time.time() < deadline:
        info = client.get(f"/sweeps/{sweep_id}").json()
        if info["state"] in states:
            return info
        time.sleep(2)
    raise AssertionError(f"sweep {sweep_id} never reached {states}: {info}")


def dashboard_row(client: TestClient, sweep_id: str, state: str, timeout: float = 30) -> dict:
    """The dashboard table's line of a sweep, once its state reads `state` (or the last one seen)."""
    deadline = time.time() + timeout
    while True:
        row = {s["sweep_id"]: s for s in client.get("/ui/sweeps.json").json()}.get(sweep_id, {})
        if row.get("state") == state or time.time() > deadline:
            return row
        time.sleep(0.5)


def test_post_sweeps_runs_on_the_cluster_and_rows_come_back_over_http(api):
    client, settings = api
    submitted = client.post("/sweeps", content=MINI, headers=AUTH)
    assert submitted.status_code == 201, submitted.text
    sweep_id = submitted.json()["sweep_id"]
    info = wait_state(client, sweep_id, {"SUCCEEDED", "FAILED", "STOPPED"})
    logs = client.get(f"/sweeps/{sweep_id}/logs").text
    assert info["state"] == "SUCCEEDED", logs[-3000:]
    assert (info["written"], info["planned"], info["errors"]) == (5, 5, 0)  # 2 baselines + gas1 + gas2 x no_sync
    assert f"sweep {sweep_id}" in logs and "best bucket" in logs
    cells = client.get("/cells", params={"sweep": sweep_id, "status": "ok"}).json()
    assert len(cells) == 5 and all(c["replicas_in_sync"] for c in cells)
    ddp = client.get("/cells", params={"sweep": sweep_id, "world_size": 2, "format": "csv"}).text
    records = list(csv.DictReader(io.StringIO(ddp)))
    assert len(ddp.strip().splitlines()) == 1 + 3 and len(records) == 3
    assert all(len(json.loads(r["step_times_ms"])) == 10 for r in records)
    counted = client.post("/query", json={"sql": "select count(*) n from cells"}, headers=AUTH).json()
    assert counted == [{"n": 5}]
    listed = dashboard_row(client, sweep_id, "SUCCEEDED")  # the job states come from a background poller
    assert listed["state"] == "SUCCEEDED" and listed["written"] == 5
    assert client.get("/report", params={"sweep": sweep_id}).text.count("data:image/png") >= 2
    assert [s["sweep_id"] for s in client.get("/sweeps").json()].count(sweep_id) == 1


def test_cli_submit_ships_the_workload_folder_and_status_logs_stop_follow_it(head, tmp_path):
    """One job for the CLI's job commands: a workload module that exists only in the submitted folder (not on the
    head's path) runs there; the sweep is stopped mid-way and keeps the rows written before the stop."""
    from tests.test_workloads import their_folder

    folder = their_folder(tmp_path, "remote")
    spec = folder / "spec.yaml"
    longer = {
        "timed_steps: 3": "timed_steps: 3000",
        "bucket_cap_mb: [0.001, 25]": "bucket_cap_mb: [0.001, 0.01, 25, 50]",
    }
    spec.write_text(functools.reduce(lambda text, kv: text.replace(*kv), longer.items(), spec.read_text()))
    runner, base, store = CliRunner(), ["--dashboard", head], str(tmp_path / "store")
    out = runner.invoke(cli_app, ["submit", str(spec), *base, "--results", store, "--workdir", str(folder)])
    assert out.exit_code == 0, out.output
    sweep_id = out.output.split()[1]
    deadline = time.time() + 300
    while "cells 1/" not in (st := runner.invoke(cli_app, ["status", sweep_id, *base]).output):
        logs = "" if "FAILED" not in st else runner.invoke(cli_app, ["logs", sweep_id, *base]).output
        assert time.time() < deadline and "FAILED" not in st, st + logs[-3000:]  # the baseline row lands first
        time.sleep(1)
    assert "RUNNING" in st
    stopped = runner.invoke(cli_app, ["stop", sweep_id, *base])
    assert stopped.exit_code == 0 and "stop requested" in stopped.output
    deadline = time.time() + 60
    while "STOPPED" not in (st := runner.invoke(cli_app, ["status", sweep_id, *base]).output):
        assert time.time() < deadline, st
        time.sleep(1)
    written = int(st.split("cells ")[1].split("/")[0])
    assert 1 <= written < 5  # stopped mid-sweep; the rows written before the stop are kept
    rows = load(store, sweep=sweep_id)
    assert len(rows) == written and set(rows["workload"]) == {"theirs_remote:make"}  # the shipped module ran
    assert f"sweep {sweep_id}" in runner.invoke(cli_app, ["logs", sweep_id, *base]).output
    assert sweep_id in runner.invoke(cli_app, ["status", *base]).output
    unknown = runner.invoke(cli_app, ["status", "no-such-sweep", *base])
    assert unknown.exit_code == 2 and "no sweep 'no-such-sweep'" in unknown.output


def test_auth_validation_and_sandbox_over_http(api, head):
    from ray.job_submission import JobSubmissionClient

    client, _ = api
    jobs_before = len(JobSubmissionClient(head).list_jobs())
    assert client.post("/sweeps", content=MINI).status_code == 401
    wrong = client.post("/sweeps", content=MINI, headers={"Authorization": "Bearer nope"})
    assert wrong.status_code == 401 and wrong.json()["error"]["type"] == "Unauthorized"
    assert client.delete("/sweeps/x").status_code == 401
    assert client.post("/query", json={"sql": "select 1"}).status_code == 401
    bad = client.post("/sweeps", content="name: bad\nbucket_cap_mb: [-1]\n", headers=AUTH)
    assert bad.status_code == 422 and bad.json()["error"]["field"] == "bucket_cap_mb[0]"
    unknown = client.post("/sweeps", content='{"name": "j", "bucket_caps": [1]}', headers=AUTH)
    assert unknown.status_code == 422 and unknown.json()["error"]["field"] == "bucket_caps"
    assert len(JobSubmissionClient(head).list_jobs()) == jobs_before  # nothing submitted
    huge = client.post("/sweeps", content="#" * 300_000, headers=AUTH)
    assert huge.status_code == 413
    for path in ("/sweeps/..%2F..%2Fetc", "/cells?cluster=../../etc", "/report?sweep=..%2Fx"):
        r = client.get(path)
        assert r.status_code in (404, 422) and "error" in r.json(), path
    assert client.get("/sweeps/no-such-sweep").status_code == 404


def test_sql_sandbox_and_errors_have_one_shape(api, tmp_path):
    from results.storage.store import Store
    from tests.seed_rows import seed_rows

    client, settings = api
    store = Store.open(settings.results)
    for r in seed_rows():
        store.write_row(r)
    passwd = client.post("/query", json={"sql": "select * from read_csv('/etc/passwd')"}, headers=AUTH)
    assert passwd.status_code == 400 and "root:" not in passwd.text
    assert passwd.json()["error"]["type"] == "QueryError"
    copy = client.post("/query", json={"sql": "copy cells to '/tmp/leak.csv'"}, headers=AUTH)
    assert copy.status_code == 400 and "not allowed" in copy.json()["error"]["message"]
    assert client.post("/query", content=b"not json", headers=AUTH).status_code == 422
    assert client.get("/compare", params={"cluster": "pcie-8x"}).status_code == 422
    pq = client.get("/cells", params={"format": "parquet"})
    assert pq.status_code == 200 and pq.content[:4] == b"PAR1"
    missing = client.get("/cells", params={"cluster": "nvlink"})
    assert missing.status_code == 404 and "clusters: pcie-8x" in missing.json()["error"]["message"]
    assert "/sweeps" in client.get("/openapi.json").json()["paths"]
    assert client.get("/docs").status_code == 200


def test_remote_submission_with_a_local_results_path_is_refused():
    from service import jobs
    from sweeps.spec.files import parse_spec
    from sweeps.spec.sweep import SpecError

    with pytest.raises(SpecError) as err:
        jobs.submit(MINI, parse_spec(MINI), address="http://10.1.2.3:8265", results="./local-results")
    assert err.value.field == "results" and "every node" in str(err.value)


def test_serve_refuses_a_public_host_without_a_token(monkeypatch):
    monkeypatch.delenv("DDPSWEEP_TOKEN", raising=False)
    out = CliRunner().invoke(cli_app, ["serve", "--host", "0.0.0.0"])
    assert out.exit_code == 2 and "not loopback" in out.output


def test_the_address_comes_from_ray_s_own_variables(monkeypatch):
    from service.jobs import resolve_address
    from sweeps.spec.sweep import SpecError

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.delenv("RAY_API_SERVER_ADDRESS", raising=False)
    with pytest.raises(SpecError, match="--dashboard"):
        resolve_address(None)
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:8265")
    assert resolve_address(None) == "http://10.0.0.1:8265"
    monkeypatch.setenv("RAY_API_SERVER_ADDRESS", "http://api:8265")
    assert resolve_address(None) == "http://api:8265"
    assert resolve_address("https://given:443") == "https://given:443"


def test_predict_on_a_cluster_that_cannot_place_its_profile_says_so_at_once(head_info, tmp_path):
    """The head has 2 CPUs; a profile task of 4 would wait forever: refused before it is submitted."""
    import subprocess
    import sys

    from tests.test_predict import SPEC, calibrate

    root = str(tmp_path / "r")
    calibrate(root)
    spec = tmp_path / "p.yaml"
    spec.write_text(SPEC + "cpus_per_worker: 4\n")
    exe = Path(sys.executable).parent / "ddpsweep"
    began = time.monotonic()
    run = [str(exe), "predict", str(spec), "--results", root, "--address", head_info[1]]
    done = subprocess.run(run, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and time.monotonic() - began < 60
    assert done.stderr.strip().splitlines()[-1].startswith("error: cpus_per_worker: got 4;"), done.stderr[-2000:]
    assert "1 node(s): 2 CPU/0 GPU" in done.stderr and "Traceback" not in done.stderr
    garbage = subprocess.run(
        run[:-2], capture_output=True, text=True, timeout=120, env=os.environ | {"RAY_ADDRESS": "garbage"}
    )
    assert garbage.returncode == 2 and garbage.stderr.strip().splitlines()[-1].startswith(
        "error: RAY_ADDRESS: got 'garbage'"
    )
    assert "Traceback" not in garbage.stderr
