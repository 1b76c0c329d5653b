"""Your own model: a workload file written against the README's contract alone (not one of ours) through
`ddpsweep run` on the embedded Ray and `ddpsweep recommend`; through `ddpsweep submit` to a real
`ray start --head` with the module only in the submitted folder; and the HTTP gate on import paths."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from results.storage.store import load
from service.api import ServiceSettings, create_app

ROOT = Path(__file__).resolve().parent.parent

# Written from the README's "Your own model" section: a small conv net on random 16x16 images.
THEIRS = """
import torch
import torch.nn.functional as F
from torch import nn


class Job:
    def __init__(self, channels):
        self.model = nn.Sequential(
            nn.Conv2d(3, channels, 3, padding=1), nn.ReLU(),
            nn.Conv2d(channels, channels, 3, padding=1), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(channels, 10),
        )
        self.tokens_per_sample = 256  # 16 x 16 pixels

    def make_batch(self, micro_batch, generator):
        images = torch.randn(micro_batch, 3, 16, 16, generator=generator)
        labels = torch.randint(0, 10, (micro_batch,), generator=generator)
        return images, labels

    def loss(self, model, batch):
        images, labels = batch
        return F.cross_entropy(model(images), labels)


def make(channels=8):
    return Job(channels)
"""
SPEC = """name: theirs
cluster: local
workload: "theirs_{tag}:make"
workload_args: {{channels: 8}}
micro_batch: 8
warmup_steps: 1
timed_steps: 3
workers: [2]
bucket_cap_mb: [0.001, 25]
gas: [1]
backend: gloo
use_gpu: false
cpus_per_worker: 1
repeats: 1
"""


def their_folder(tmp_path: Path, tag: str) -> Path:
    folder = tmp_path / "their_project"
    folder.mkdir()
    (folder / f"theirs_{tag}.py").write_text(THEIRS)
    (folder / "spec.yaml").write_text(SPEC.format(tag=tag))
    return folder


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "service.cli", *args], capture_output=True, text=True, timeout=600, cwd=cwd
    )


@pytest.mark.ray
@pytest.mark.slow
def test_their_workload_runs_on_the_embedded_ray_and_gets_a_recommendation(tmp_path):
    folder = their_folder(tmp_path, "local")
    run = cli("run", "spec.yaml", "--results", str(tmp_path / "r"), cwd=folder)
    assert run.returncode == 0, run.stderr[-3000:]
    rows = load(str(tmp_path / "r"))
    assert len(rows) == 3 and set(rows["status"]) == {"ok"}, rows["error"].tolist()
    assert set(rows["workload"]) == {"theirs_local:make"} and set(rows["workload_args"]) == {'{"channels":8}'}
    assert rows["workload_fingerprint"].nunique() == 1 and re.fullmatch(
        r"[0-9a-f]{12}", rows["workload_fingerprint"][0]
    )
    assert rows["replicas_in_sync"].all() and (rows["samples_per_s"] > 0).all()
    expected = rows["samples_per_s"] * 256
    assert ((rows["tokens_per_s"] - expected).abs() / expected < 1e-9).all()  # tokens_per_sample given
    rec = cli("recommend", "--results", str(tmp_path / "r"), "--format", "json", cwd=folder)
    assert rec.returncode == 0, rec.stderr[-2000:]
    (answer,) = json.loads(rec.stdout)
    assert answer["model"] == "theirs_local:make" and answer["best"]["bucket_cap_mb"] in (0.001, 25.0)
    assert "DistributedDataParallel(model" in answer["snippet"]


def test_post_sweeps_refuses_an_import_path_without_an_allowlist(seed_store):
    spec = SPEC.format(tag="x")
    closed = TestClient(create_app(ServiceSettings(address=None, results=seed_store, token="t")))
    refused = closed.post("/sweeps", content=spec, headers={"Authorization": "Bearer t"})
    assert refused.status_code == 403, refused.text
    err = refused.json()["error"]
    assert err["field"] == "workload" and "--allow-workload" in err["message"]
    settings = ServiceSettings(address=None, results=seed_store, token="t", allow_workload=("theirs_x",))
    opened = TestClient(create_app(settings)).post("/sweeps", content=spec, headers={"Authorization": "Bearer t"})
    assert opened.status_code != 403 and opened.json()["error"]["type"] != "Forbidden"  # on to Ray Jobs (none here)
    other = ServiceSettings(address=None, results=seed_store, token="t", allow_workload=("theirs",))
    prefix_only = TestClient(create_app(other)).post("/sweeps", content=spec, headers={"Authorization": "Bearer t"})
    assert prefix_only.status_code == 403  # "theirs" is a module prefix, not a string prefix of "theirs_x"
