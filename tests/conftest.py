from __future__ import annotations

import pytest
import torch


@pytest.fixture
def seed_store(tmp_path) -> str:
    """A store written by the project's writer, holding the seed post's measurements."""
    from results.storage.store import Store
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


@pytest.fixture(scope="session")
def shared_head():
    """`--address` of one `ray start --head` (2 CPUs, auth off) shared by the CLI tests whose subject is not the
    embedded start: a run connects in about 8 s less than it starts its own Ray. The embedded start keeps its
    own tests (the smoke run, interrupts, a user's workload folder, a `ray start` cluster beside it)."""
    from tests.ray_head import ray_head

    info: dict = {}
    with ray_head("disabled", info=info):
        yield ["--address", info["gcs"]]


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def live_server():
    """Start a real uvicorn server for an app on a free loopback port; yields a function app -> base URL."""
    import threading
    import time

    import uvicorn

    from service.httpserver import config
    from tests.ray_head import free_port

    servers = []

    def start(app, **limits) -> str:
        port = free_port()
        server = uvicorn.Server(config(app, "127.0.0.1", port, **limits))
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
