"""Ray's token authentication: ddpsweep's Ray Jobs commands work against a head that has it on.

Subprocesses, because Ray reads RAY_AUTH_MODE once per process.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.ray_head import ray_head

pytestmark = pytest.mark.ray
ROOT = Path(__file__).resolve().parent.parent
JOBS = {"submit", "status", "logs", "stop"}  # commands of the job server (--dashboard); others join the cluster


def ddpsweep(address: str, *args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "service.cli", *args, "--dashboard" if args[0] in JOBS else "--address", address],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **env},
    )


def test_jobs_commands_authenticate_with_the_cluster_token(tmp_path):
    info: dict = {}
    with ray_head("token", info=info) as address:
        with_token = ddpsweep(address, "status", RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=info["token_path"])
        assert with_token.returncode == 0, with_token.stderr[-2000:]
        assert "no sweeps on this cluster" in with_token.stdout
        no_token = ddpsweep(address, "status", RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=str(tmp_path / "none"))
        assert no_token.returncode == 2  # the head really requires the token
        assert "token" in no_token.stderr.lower() and "Traceback" not in no_token.stderr
        spec = tmp_path / "p.yaml"
        spec.write_text("name: p\ncluster: lab\nworkers: [1]\nmicro_batch: 2\nseq_len: 16\n")
        refused = ddpsweep(
            info["gcs"],
            "predict",
            str(spec),
            "--results",
            str(tmp_path / "r"),
            RAY_AUTH_MODE="token",
            RAY_AUTH_TOKEN_PATH=str(tmp_path / "none"),
        )  # joining the cluster itself (not its job server) without the token: one line
        assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr[-2000:]
        assert refused.stderr.strip().splitlines()[-1].startswith("error: "), refused.stderr[-2000:]
