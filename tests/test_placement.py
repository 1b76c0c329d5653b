"""Every row records where its ranks ran; a placement that is not the cell's topology is an
error row, never a mis-filed measurement; each node's network fingerprint is recorded."""

from __future__ import annotations

import json
import os

from sweeps.plan.grid import expand
from sweeps.spec.files import parse_spec
from sweeps.trial.rows import misplaced
from sweeps.worker.fingerprint import network
from sweeps.worker.group import placement_info


def ddp_cell(topology: str):
    return next(c for c in expand(parse_spec(f"name: p\ntopology: [{topology}]")) if c.step.mode == "ddp")


def ranks(*nodes: str) -> list[dict]:
    """A placement as the workers gather it: one entry per rank, on the named nodes (local ranks counted per
    node, one GPU each)."""
    out, seen = [], {}
    for n in nodes:
        local = seen[n] = seen.get(n, -1) + 1
        ip = f"10.0.0.{ord(n[-1]) % 250}"
        out.append({"host": f"host-{n}", "node": n, "ip": ip, "network": {"node_ip": n}})
        out[-1] |= {"local_rank": local, "device": f"0000:{0x1B + local:02x}:00.0"}
    return out


def test_placement_info_counts_ranks_per_node_and_keeps_one_network_per_node():
    info = placement_info(ranks("a", "b", "a", "b"))
    assert (info["nodes"], info["ranks_per_node"]) == (2, [2, 2])
    assert info["rank_nodes"] == ["10.0.0.97", "10.0.0.98", "10.0.0.97", "10.0.0.98"]  # in rank order
    assert json.loads(info["network"]) == [{"node_ip": "a"}, {"node_ip": "b"}]
    assert info["rank_hosts"] == ["host-a", "host-b"] * 2 and info["rank_local_ranks"] == [0, 0, 1, 1]
    assert info["rank_devices"] == ["0000:1b:00.0", "0000:1b:00.0", "0000:1c:00.0", "0000:1c:00.0"]


def test_a_placement_that_is_not_the_topology_is_an_error():
    assert misplaced(ddp_cell("2x2"), 2, [2, 2]) is None
    uneven = misplaced(ddp_cell("2x2"), 2, [3, 1])
    assert uneven == "placement put the ranks 3+1 on 2 node(s); the cell asks for topology 2x2 (2 on each of 2)"
    packed = misplaced(ddp_cell("2x1"), 1, [2])
    assert packed is not None and "on 1 node(s)" in packed and "topology 2x1" in packed
    assert misplaced(ddp_cell("1x2"), 2, [1, 1]) is not None  # spread where one node was asked for


def test_the_network_fingerprint_describes_this_node(monkeypatch):
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "ddp0")
    monkeypatch.setenv("NCCL_IB_HCA", "mlx5_0")
    fp = network("127.0.0.1")
    assert fp["env"] == {"GLOO_SOCKET_IFNAME": "ddp0", "NCCL_IB_HCA": "mlx5_0"}
    assert fp["gpus"] == 0 and fp["gpu_topology"] == ""  # this CPU machine
    assert all(
        i["name"] != "lo" and set(i) == {"name", "speed_mbps", "mtu", "ipv4", "node_ip"} for i in fp["interfaces"]
    )
    json.dumps(fp)  # stored as JSON


def test_command_output_is_stored_without_terminal_escapes(tmp_path, monkeypatch):
    from sweeps.worker import fingerprint

    fake = tmp_path / "nvidia-smi"
    fake.write_text("#!/bin/sh\nprintf '\\033[4mGPU0\\tCPU Affinity\\033[0m\\nGPU0\\t X \\t0-15\\n'\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    assert fingerprint._run(["nvidia-smi", "topo", "-m"]) == "GPU0\tCPU Affinity\nGPU0\t X \t0-15"


def test_variables_the_harness_sets_are_not_the_configuration_a_row_records(monkeypatch):
    """The rank binds gloo to its node's interface and sets NCCL's fault handling itself: the row's `env` (what a
    recommendation pastes) keeps the cluster's and the spec's variables and never these; the node's network
    fingerprint still says which interface gloo used."""
    import torch

    from sweeps.worker import bind, fingerprint

    monkeypatch.setattr(bind, "SET_BY_HARNESS", set())
    for name in ("GLOO_SOCKET_IFNAME", "TORCH_NCCL_ASYNC_ERROR_HANDLING", "NCCL_DEBUG"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NCCL_IB_HCA", "mlx5_0")  # the cluster's
    assert bind.bind_gloo("127.0.0.1") == "lo" and os.environ["GLOO_SOCKET_IFNAME"] == "lo"
    assert bind.harness_default("TORCH_NCCL_ASYNC_ERROR_HANDLING", "2") == "2"
    assert bind.harness_default("NCCL_IB_HCA", "other") == "mlx5_0"  # never replaces what is in force
    row = fingerprint.collect(torch.device("cpu"), given={"NCCL_DEBUG": "WARN"})
    assert json.loads(row["env"]) == {"NCCL_DEBUG": "WARN", "NCCL_IB_HCA": "mlx5_0"}
    assert network("127.0.0.1")["env"]["GLOO_SOCKET_IFNAME"] == "lo"

    monkeypatch.setattr(bind, "SET_BY_HARNESS", set())
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "")  # empty is unset, to gloo and to the bind
    assert bind.bind_gloo("127.0.0.1") == "lo" and "GLOO_SOCKET_IFNAME" in bind.SET_BY_HARNESS
    monkeypatch.setattr(bind, "SET_BY_HARNESS", set())
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "ib0")  # a spec that names the interface: the configuration's
    assert bind.bind_gloo("127.0.0.1") == "ib0"
    assert json.loads(fingerprint.collect(torch.device("cpu"))["env"])["GLOO_SOCKET_IFNAME"] == "ib0"
