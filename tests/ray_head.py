"""Start a real `ray start --head` on loopback in its own temp dir; stop only its own processes."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress

import psutil


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def ray_head(auth_mode: str, num_cpus: int = 2, info: dict | None = None) -> Iterator[str]:
    """Yields the job server address (http://127.0.0.1:PORT). `auth_mode`: disabled | token.
    `info`, if given, receives the head's GCS address under "gcs"."""
    temp = tempfile.mkdtemp(prefix="ddps-", dir="/tmp")  # short: Ray's socket paths must stay < 108 bytes
    dash = free_port()
    ports = {
        "--port": free_port(),
        "--dashboard-port": dash,
        "--ray-client-server-port": free_port(),
        "--dashboard-agent-listen-port": free_port(),
        "--metrics-export-port": free_port(),
    }
    env = {**os.environ, "RAY_AUTH_MODE": auth_mode, "RAY_USAGE_STATS_ENABLED": "0"}
    cmd = [
        sys.executable,
        "-m",
        "ray.scripts.scripts",
        "start",
        "--head",
        f"--num-cpus={num_cpus}",
        "--include-dashboard=true",
        "--dashboard-host=127.0.0.1",
        "--node-ip-address=127.0.0.1",
        f"--temp-dir={temp}",
        *[f"{k}={v}" for k, v in ports.items()],
    ]
    try:
        subprocess.run(cmd, check=True, env=env, capture_output=True, timeout=120)
        address = f"http://127.0.0.1:{dash}"
        _wait_for_dashboard(address)
        if info is not None:
            info["gcs"] = f"127.0.0.1:{ports['--port']}"
        yield address
    finally:
        stop_head(temp, ports["--port"])


def _wait_for_dashboard(address: str) -> None:
    import urllib.error
    import urllib.request

    deadline = time.time() + 60
    while True:
        try:
            urllib.request.urlopen(f"{address}/api/version", timeout=5)  # noqa: S310 — loopback
            return
        except urllib.error.HTTPError:
            return  # it answered (401 with token auth on): the server is up
        except OSError:
            if time.time() > deadline:
                raise
            time.sleep(1)


def stop_head(temp: str, gcs_port: int) -> None:
    """Kill this head's processes (found by its temp dir or GCS port) and their children; nothing else."""
    ours = []
    for proc in psutil.process_iter(["cmdline"]):
        with suppress(psutil.NoSuchProcess):
            cmdline = " ".join(proc.info["cmdline"] or [])
            if temp in cmdline or f":{gcs_port}" in cmdline:
                ours += [proc, *proc.children(recursive=True)]
    for proc in ours:
        with suppress(psutil.NoSuchProcess):
            proc.send_signal(signal.SIGKILL)
