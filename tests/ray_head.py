"""Start a real `ray start --head` on loopback in its own temp dir; stop only its own processes, then remove the
dir (its session logs: about 7 MB a head)."""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager, suppress
from pathlib import Path

import psutil


def free_port() -> int:
    return free_ports(1)[0]


def free_ports(n: int) -> list[int]:
    """`n` distinct free loopback ports: every socket stays bound until all are chosen, so the kernel
    never hands the same port out twice (one closed socket's port can be the next bind's answer)."""
    with ExitStack() as stack:
        socks = [stack.enter_context(socket.socket()) for _ in range(n)]
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]


@contextmanager
def ray_head(auth_mode: str, num_cpus: int = 2, info: dict | None = None) -> Iterator[str]:
    """Yields the job server address (http://127.0.0.1:PORT). `auth_mode`: disabled | token.
    `info`, if given, receives the head's GCS address under "gcs" and, with token auth, the path of the
    head's own token file under "token_path" (never ~/.ray/auth_token: a fresh machine has none)."""
    temp = tempfile.mkdtemp(prefix="ddps-", dir="/tmp")  # short: Ray's socket paths must stay < 108 bytes
    token_path = Path(temp) / "auth_token"
    token_path.write_text(secrets.token_hex(32))  # the format `ray get-auth-token --generate` writes
    env = {**os.environ, "RAY_AUTH_MODE": auth_mode, "RAY_AUTH_TOKEN_PATH": str(token_path)}
    env["RAY_USAGE_STATS_ENABLED"] = "0"
    ports: dict[str, int] = {}
    try:
        ports = _start_head(temp, env, num_cpus)
        address = f"http://127.0.0.1:{ports['--dashboard-port']}"
        _wait_for_dashboard(address)
        if info is not None:
            info.update(gcs=f"127.0.0.1:{ports['--port']}", token_path=str(token_path))
        yield address
    finally:
        stop_head(temp, ports.get("--port"))
        shutil.rmtree(temp, ignore_errors=True)


def _start_head(temp: str, env: dict[str, str], num_cpus: int, tries: int = 3) -> dict[str, int]:
    """`ray start --head` on fresh ports; another process can take a chosen port before Ray binds it,
    so a failed start is retried on new ports. Returns the ports it started on."""
    flags = ["--port", "--dashboard-port", "--ray-client-server-port"]
    flags += ["--dashboard-agent-listen-port", "--metrics-export-port"]
    for attempt in range(tries):
        ports = dict(zip(flags, free_ports(len(flags)), strict=True))
        cmd = [sys.executable, "-m", "ray.scripts.scripts", "start", "--head", f"--num-cpus={num_cpus}"]
        cmd += ["--include-dashboard=true", "--dashboard-host=127.0.0.1", "--node-ip-address=127.0.0.1"]
        cmd += [f"--temp-dir={temp}", *[f"{k}={v}" for k, v in ports.items()]]
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120, check=False)
        if done.returncode == 0:
            return ports
        stop_head(temp, ports["--port"])
        if attempt == tries - 1:
            raise RuntimeError(f"ray start --head failed {tries} times; last stderr:\n{done.stderr[-3000:]}")
    raise AssertionError("unreachable")


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


def stop_head(temp: str, gcs_port: int | None) -> None:
    """Kill this head's processes (found by its temp dir or GCS port) and their children; nothing else."""
    ours = []
    for proc in psutil.process_iter(["cmdline"]):
        with suppress(psutil.NoSuchProcess):
            cmdline = " ".join(proc.info["cmdline"] or [])
            if temp in cmdline or (gcs_port is not None and f":{gcs_port}" in cmdline):
                ours += [proc, *proc.children(recursive=True)]
    for proc in ours:
        with suppress(psutil.NoSuchProcess):
            proc.send_signal(signal.SIGKILL)
    psutil.wait_procs(ours, timeout=10)
