from __future__ import annotations

import contextlib
import os
from pathlib import Path

import pytest
import torch


@pytest.fixture
def seed_store(tmp_path) -> str:
    """A store written by the project's writer, holding the seed post's measurements."""
    from results.store import Store
    from tests.seed_rows import seed_rows

    store = Store.open(str(tmp_path))
    for r in seed_rows():
        store.write_row(r)
    return str(tmp_path)


@pytest.fixture(scope="session")
def smoke_run(tmp_path_factory):
    """`ddpsweep run sweeps/specs/smoke.yaml --cluster ci` on the embedded local Ray, once per session: its end
    to end test asserts on it, and the browser tier reads a copy of the store it wrote (one sweep, not two)."""
    from types import SimpleNamespace

    from tests.test_cli_sweep import SMOKE, ddpsweep

    root = tmp_path_factory.mktemp("smoke") / "store"
    proc = ddpsweep("run", str(SMOKE), "--results", str(root), "--cluster", "ci")
    out, err = proc.communicate(timeout=900)
    return SimpleNamespace(root=root, out=out, err=err, returncode=proc.returncode)


# `make test` runs the suite in two lanes (pytest-xdist, `-n 2 --dist loadgroup`): the tests with these marks
# run one after another in one lane, at normal priority (they start Ray, a cluster or a browser, take long, or
# assert on latency); the rest share the CPU those leave idle, at a lower priority (nice LIGHT_NICE), so they
# never slow a Ray test's start or a measurement.
CPU_LANE_MARKS = ("ray", "netns", "browser", "slow", "timing")
LIGHT_NICE = 10


def in_cpu_lane(item: pytest.Item) -> bool:
    return any(item.get_closest_marker(m) is not None for m in CPU_LANE_MARKS)


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the group marks
def pytest_collection_modifyitems(config, items):
    for item in items:
        if in_cpu_lane(item):
            item.add_marker(pytest.mark.xdist_group("cpu"))
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def in_two_lanes() -> bool:
    """An xdist worker run as root (only root may raise a priority again); elsewhere every test keeps its own."""
    return bool(os.environ.get("PYTEST_XDIST_WORKER")) and os.geteuid() == 0


def pytest_configure(config):
    if in_two_lanes():
        with contextlib.suppress(OSError):  # already a session leader: keep it
            os.setsid()  # its own session: where Linux groups by session (autogroup), it weighs sessions


@pytest.hookimpl(tryfirst=True)  # before the item's fixtures start anything: what they start inherits it
def pytest_runtest_setup(item):
    if in_two_lanes():
        nice = 0 if in_cpu_lane(item) else LIGHT_NICE
        os.setpriority(os.PRIO_PROCESS, 0, nice)
        with contextlib.suppress(OSError):  # no autogroup in this kernel: the process's nice is what counts
            Path("/proc/self/autogroup").write_text(str(nice))


@pytest.fixture
def live_server():
    """Start a real uvicorn server for an app on a free loopback port; yields a function app -> base URL."""
    import threading
    import time

    import uvicorn

    from tests.ray_head import free_port

    servers = []

    def start(app) -> str:
        port = free_port()
        server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        servers.append((server, thread))
        deadline = time.time() + 20
        while not server.started:
            assert time.time() < deadline, "uvicorn did not start"
            time.sleep(0.05)
        return f"http://127.0.0.1:{port}"

    yield start
    for server, thread in servers:
        server.should_exit = True
        thread.join(timeout=10)
