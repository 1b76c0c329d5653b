"""The HTTP server under load, odd requests and slow or missing backends: bounded, and one error shape."""

from __future__ import annotations

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
from results.storage.store import Store
from service import jobs
from service.api import ServiceSettings, create_app
from sweeps.spec.sweep import SpecError
from tests.seed_rows import seed_rows
from trainers.errors import ConfigError, DDPSweepError


def big_sweep(root, rows: int) -> str:
    """One compacted sweep of `rows` rows (the seed rows, repeated) written straight as Parquet."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from results.storage.schema import row_table

    base = pa.concat_tables([row_table(r) for r in seed_rows()])
    table = pa.concat_tables([base] * (rows // base.num_rows + 1)).slice(0, rows).combine_chunks()
    for name, value in (("cluster", "big"), ("sweep_id", "huge")):
        table = table.set_column(table.schema.get_field_index(name), name, pa.array([value] * rows))
    table = table.set_column(table.schema.get_field_index("repeat"), "repeat", pa.array(range(rows), pa.int64()))
    status = pa.array(["error" if i % 4 == 0 else "ok" for i in range(rows)])
    table = table.set_column(table.schema.get_field_index("status"), "status", status)
    folder = root / "cluster=big" / "sweep=huge"
    folder.mkdir(parents=True)
    pq.write_table(table, folder / "compacted.parquet")
    return str(root)


def test_a_sweep_too_big_for_a_page_is_a_413_and_the_index_counts_it(tmp_path):
    from fastapi.testclient import TestClient

    from service.api import ServiceSettings, create_app

    client = TestClient(create_app(ServiceSettings(address=None, results=big_sweep(tmp_path, 30_000), token="t")))
    index = client.get("/ui/sweeps.json")
    assert index.status_code == 200
    assert [(s["sweep_id"], s["written"], s["errors"]) for s in index.json()] == [("huge", 30_000, 7_500)]
    for path in ("/ui/sweep/big/huge", "/report?sweep=huge", "/recommend?cluster=big"):
        page = client.get(path)
        assert page.status_code == 413, (path, page.text[:300])
        message = page.json()["error"]["message"]
        assert "holds 30000 rows, more than a page analyses (20000" in message and "ddpsweep query" in message
    counted = client.post("/query", json={"sql": "select count(*) n from cells"}, headers={"Authorization": "Bearer t"})
    assert counted.json() == [{"n": 30_000}]  # SQL aggregates it


def test_a_store_over_the_servers_row_budget_is_refused_before_it_is_read(tmp_path):
    from fastapi.testclient import TestClient

    from results.errors import TooLarge
    from results.storage.cache import CachedStore
    from service.api import ServiceSettings, create_app

    root = big_sweep(tmp_path, 3_000)
    cache = CachedStore(root, max_rows=2_000)
    with pytest.raises(TooLarge, match="about 3000 rows, more than this server keeps in memory"):
        cache.table()
    assert cache._rows.snapshot.num_rows == 0  # nothing was read
    client = TestClient(create_app(ServiceSettings(address=None, results=root, token="t", max_rows=2_000)))
    refused = client.get("/cells")
    assert refused.status_code == 413 and "--max-rows 2000" in refused.json()["error"]["message"]


def client(**settings) -> TestClient:
    defaults = {"address": "http://127.0.0.1:9", "results": "/nonexistent/r", "token": "t"}
    return TestClient(create_app(ServiceSettings(**(defaults | settings))))


def test_a_hung_cluster_stalls_no_request(tmp_path, live_server, monkeypatch):
    """A job server that accepts and never answers: 45 token-free dashboard polls and a POST in flight, and
    /cells and /openapi.json still answer at once (before: 14.4 s and 15.3 s)."""
    import socket

    from service import jobs

    monkeypatch.setattr(jobs, "READ_TIMEOUT_S", 6.0)  # sooner, still twice the 3 s bound asserted below
    import time
    from concurrent.futures import ThreadPoolExecutor

    import httpx

    hung = socket.socket()
    hung.bind(("127.0.0.1", 0))
    hung.listen(128)  # connections complete in the kernel's backlog; nothing ever answers
    store = Store.open(str(tmp_path))
    for r in seed_rows():
        store.write_row(r)
    address = f"http://127.0.0.1:{hung.getsockname()[1]}"
    base = live_server(create_app(ServiceSettings(address=address, results=str(tmp_path), token="t")))
    try:
        with ThreadPoolExecutor(50) as pool:
            polls = [pool.submit(httpx.get, f"{base}/ui/sweeps.json", timeout=60) for _ in range(45)]
            submit = pool.submit(
                httpx.post, f"{base}/sweeps", content="name: x\n", headers={"Authorization": "Bearer t"}, timeout=60
            )
            time.sleep(1.0)
            took = {}
            for path in ("/cells?format=json", "/openapi.json"):
                t0 = time.perf_counter()
                assert httpx.get(base + path, timeout=60).status_code == 200
                took[path] = time.perf_counter() - t0
            answers = [p.result() for p in polls]
        print(f"\nhung cluster, 45 polls + a POST in flight: {took}")
        assert max(took.values()) < 3.0, took
        assert {a.status_code for a in answers} == {200}
        assert submit.result().status_code == 503  # the cluster's timeout, answered in its own thread
    finally:
        hung.close()


def test_cheap_pages_never_evict_an_expensive_report(tmp_path):
    import time

    from results.storage.cache import MEMO_ENTRIES, CachedStore

    store = Store.open(str(tmp_path))
    for r in seed_rows():
        store.write_row(r)
    cache = CachedStore(str(tmp_path))
    renders = []

    def report() -> str:
        renders.append(1)
        time.sleep(0.05)
        return "report"

    cache.memo(("report",), report)
    for i in range(3 * MEMO_ENTRIES):
        cache.memo(("recommend", i), lambda: "cheap")
    assert cache.memo(("report",), report) == "report" and len(renders) == 1


def test_cells_streams_batches_and_bounds_concurrent_downloads(tmp_path, monkeypatch):
    import csv
    import io

    from service import downloads

    store = Store.open(str(tmp_path))
    for rep in range(3):
        for r in seed_rows():
            store.write_row(r | {"repeat": rep})
    monkeypatch.setattr(downloads, "DOWNLOAD_BATCH", 5)  # 24 rows: five batches
    c = client(results=str(tmp_path))
    records = c.get("/cells").json()
    assert len(records) == 24 and {r["repeat"] for r in records} == {0, 1, 2}
    rows = list(csv.DictReader(io.StringIO(c.get("/cells", params={"format": "csv"}).text)))
    assert len(rows) == 24 and rows[0]["cluster"] == "pcie-8x"
    assert c.get("/cells", params={"status": "error"}).json() == []
    monkeypatch.setattr(downloads, "DOWNLOAD_WAIT_S", 0.1)
    assert downloads.DOWNLOADS.acquire(timeout=1) and downloads.DOWNLOADS.acquire(timeout=1)  # two in progress
    try:
        busy = c.get("/cells")
        assert busy.status_code == 503 and busy.json()["error"]["type"] == "Busy"
    finally:
        downloads.DOWNLOADS.release()
        downloads.DOWNLOADS.release()
    assert c.get("/cells").status_code == 200


ROOT = Path(__file__).resolve().parent.parent


SMOKE = (ROOT / "sweeps/specs/smoke.yaml").read_text()


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


def test_a_server_without_a_cluster_answers_every_job_route_with_a_503_naming_the_fix(seed_store):
    client = TestClient(create_app(ServiceSettings(address=None, results=seed_store, token="t")))
    auth = {"Authorization": "Bearer t"}
    calls = [
        ("POST", "/sweeps", "submit sweeps"),
        ("GET", "/sweeps", "list sweeps"),
        ("GET", "/sweeps/s1", "follow sweeps"),
        ("GET", "/sweeps/s1/logs", "follow sweeps"),
        ("DELETE", "/sweeps/s1", "stop sweeps"),
    ]
    for method, path, what in calls:
        r = client.request(method, path, headers=auth, content=SMOKE if method == "POST" else None)
        error = r.json()["error"]
        assert r.status_code == 503 and error["type"] == "Unavailable", (path, r.text)
        assert f"cannot {what}" in error["message"] and "ddpsweep serve --dashboard" in error["message"]
    assert client.get("/cells").status_code == 200  # its results are still served


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
    for path, status in (("/cells?cluster=nope", 404), ("/sweeps", 503), ("/report?sweep=nope", 404)):
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
