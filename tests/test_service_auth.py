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


def ddpsweep(address: str, *args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "service.cli", *args, "--address", address],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **env},
    )


def test_jobs_commands_authenticate_with_the_cluster_token(tmp_path):
    with ray_head("token") as address:
        with_token = ddpsweep(address, "status", RAY_AUTH_MODE="token")
        assert with_token.returncode == 0, with_token.stderr[-2000:]
        assert "no sweeps on this cluster" in with_token.stdout
        no_token = ddpsweep(address, "status", RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=str(tmp_path / "none"))
        assert no_token.returncode == 2  # the head really requires the token
        assert "token" in no_token.stderr.lower() and "Traceback" not in no_token.stderr
