"""Object storage for real — a local S3-compatible server (moto's, on loopback) behind pyarrow's
own S3 filesystem. A sweep writes its rows to s3://, --resume reads them back, query / report / compare
/ scaling and the HTTP API read them, and a truncated object is skipped with a warning."""

from __future__ import annotations

import io
import logging
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from results.storage.store import Store
from tests.ray_head import free_port
from tests.seed_rows import seed_rows

pytestmark = pytest.mark.s3
ROOT = Path(__file__).resolve().parent.parent
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}
SPEC = """
name: s3
model: tiny
micro_batch: 4
seq_len: 32
warmup_steps: 1
timed_steps: 3
workers: [2]
bucket_cap_mb: [1, 25]
backend: gloo
use_gpu: false
"""


@pytest.fixture(scope="module")
def s3_server():
    """moto's standalone S3 server on a free loopback port, with one bucket; yields the endpoint."""
    moto_server = pytest.importorskip("moto.server", reason="moto[server] is not installed (pip install -e '.[test]')")
    saved = {k: os.environ.get(k) for k in CREDENTIALS}
    os.environ.update(CREDENTIALS)
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=free_port(), verbose=False)
    server.start()
    endpoint = f"127.0.0.1:{server._port}"
    import pyarrow.fs as pafs

    pafs.S3FileSystem(endpoint_override=endpoint, scheme="http", allow_bucket_creation=True).create_dir("results")
    yield endpoint
    server.stop()
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


def uri(endpoint: str, prefix: str) -> str:
    return f"s3://results/{prefix}?endpoint_override={endpoint}&scheme=http"


def ddpsweep(*args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "service.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        env={**os.environ, **CREDENTIALS},
    )


@pytest.mark.ray
@pytest.mark.slow
def test_a_sweep_writes_to_s3_and_resumes_from_it(s3_server, tmp_path, shared_head):
    spec = tmp_path / "s3.yaml"
    spec.write_text(SPEC)
    root = uri(s3_server, "sweep")
    first = ddpsweep("run", str(spec), "--results", root, "--sweep", "s3-1", *shared_head)
    assert first.returncode == 0, first.stderr[-3000:]
    store = Store.open(root)
    rows = store.read_table(cluster="local", sweep="s3-1").to_pylist()
    assert len(rows) == 3 and {r["status"] for r in rows} == {"ok"}  # baseline + 2 buckets
    assert [Path(f).name for f in store.files()] == ["compacted.parquet"]  # compacted in the bucket
    again = ddpsweep("run", str(spec), "--results", root, "--resume", "s3-1")
    assert again.returncode == 0, again.stderr[-3000:]
    assert "0 of 3 measurements to run" in again.stdout  # every row read back from the bucket
    assert len(store.read_table(sweep="s3-1")) == 3


def test_every_reader_reads_an_s3_store(s3_server, tmp_path):
    root = uri(s3_server, "readers")
    store = Store.open(root)
    for cluster, scale in (("pcie-8x", 1.0), ("faster", 0.8)):
        for r in seed_rows():
            store.write_row(r | {"cluster": cluster, "step_ms": r["step_ms"] * scale})
    count = ddpsweep("query", "select count(*) n from cells", "--results", root, "--format", "csv")
    assert count.returncode == 0 and count.stdout.split() == ["n", "16"], count.stderr
    report = ddpsweep("report", "--results", root, "--out", str(tmp_path / "r.html"))
    assert report.returncode == 0 and "Best bucket per curve" in (tmp_path / "r.html").read_text()
    compare = ddpsweep("compare", "--results", root, "--cluster", "pcie-8x", "--cluster", "faster", "--format", "csv")
    assert compare.returncode == 0, compare.stderr
    ratios = pd.read_csv(io.StringIO(compare.stdout))["ratio"]
    assert len(ratios) == 8 and (ratios - 0.8).abs().max() < 1e-9  # every position 20% faster, as written

    from fastapi.testclient import TestClient

    from service.api import ServiceSettings, create_app

    client = TestClient(create_app(ServiceSettings(address=None, results=root, token="t")))
    cells = client.get("/cells", params={"cluster": "faster"})
    assert cells.status_code == 200 and len(cells.json()) == 8


def test_a_truncated_object_is_skipped_with_a_warning(s3_server, caplog):
    root = uri(s3_server, "truncated")
    store = Store.open(root)
    for r in seed_rows():
        store.write_row(r)
    victim = store.files()[0]
    with store.fs.open_input_stream(victim) as f:
        data = f.read()
    with store.fs.open_output_stream(victim) as f:
        f.write(data[: len(data) // 2])  # an upload cut short
    with caplog.at_level(logging.WARNING):
        table = Store.open(root).read_table()
    assert table.num_rows == 7 and Path(victim).name in caplog.text
