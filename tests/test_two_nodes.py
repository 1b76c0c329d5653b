"""A real two-node Ray cluster on this machine whose inter-node link has a known rate.

benchmarks/two_node_cluster.sh builds two network namespaces joined by a veth pair shaped with tc tbf
(link-local addresses, no default route: nothing leaves the pair), with a Ray head in one and a worker
node in the other. On it a scaling sweep of the tiny model at 1x1, 1x2 and 2x1 must show the cross-node
cell slower than the same-node one because of the link: the calibration across the link recovers the
configured rate, and the scaling report flags the knee at 2x1. Skipped where namespaces can't be made.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from results.analysis.scaling import scaling
from results.storage.store import load, load_calibration

pytestmark = [pytest.mark.netns, pytest.mark.ray, pytest.mark.slow]
ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "two_node_cluster.sh"
RATE_MBIT = 100
HEAD = "169.254.77.1:6379"
SPEC = ROOT / "benchmarks" / "two_node.yaml"


def why_no_namespaces() -> str | None:
    if os.geteuid() != 0:
        return "network namespaces need root"
    if not (shutil.which("ip") and shutil.which("tc")):
        return "iproute2 (ip, tc) is not installed"
    probe = subprocess.run(["ip", "netns", "add", "ddps-probe"], capture_output=True, text=True)
    if probe.returncode != 0:
        return f"cannot create a network namespace here: {probe.stderr.strip()}"
    subprocess.run(["ip", "netns", "delete", "ddps-probe"], check=False)
    return None


NODE_CPUS = 4  # more slots per node than any cell's ranks per node: placement alone must put them right


def script(*args: str, timeout: int = 900) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(SCRIPT), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        env={**os.environ, "PYTHON": sys.executable, "DDPSWEEP_NODE_CPUS": str(NODE_CPUS)},
    )


@pytest.fixture(scope="module")
def two_nodes():
    reason = why_no_namespaces()
    if reason:
        pytest.skip(reason)
    up = script("up", f"{RATE_MBIT}mbit", timeout=300)
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        yield
    finally:
        down = script("down", timeout=120)
        assert down.returncode == 0, down.stderr
        assert "ddps-a" not in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout


def test_the_cross_node_cell_is_slower_because_of_the_link(two_nodes, tmp_path):
    results = str(tmp_path / "results")
    spec = tmp_path / "two_node.yaml"
    spec.write_text(SPEC.read_text().replace("repeats: 5", "repeats: 3"))  # the benchmark's spec, in 3 rounds
    run = script("exec", sys.executable, "-m", "service.cli", "run", str(spec), "--address", HEAD, "--results", results)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    rows = load(results)
    ok = rows[rows["status"] == "ok"]
    assert len(ok) == len(rows) == 12, rows[["cell_id", "status", "error"]]  # 3 x (baseline + 1x1 + 1x2 + 2x1)
    groups = rows.groupby("num_nodes")["group_id"].nunique()
    assert groups.to_dict() == {1: 1, 2: 1}  # isolation: sweep — one worker group per node count
    assert set(rows.loc[rows["num_nodes"] == 1, "host_world_size"]) == {2}  # baseline, 1x1, 1x2 on one 2-rank group
    ddp = ok[ok["mode"] == "ddp"]
    cross, packed = ddp[ddp["num_nodes"] == 2], ddp[(ddp["num_nodes"] == 1) & (ddp["world_size"] == 2)]
    assert cross["step_ms"].min() > packed["step_ms"].max()  # every run across the link slower than every run within
    assert set(cross["workers_per_node_observed"]) == {1} and set(cross["placement"]) == {"STRICT_SPREAD"}
    assert all(len(json.loads(n)) == 2 for n in cross["network"])  # one fingerprint per node
    assert cross["replicas_in_sync"].all()
    assert all(sorted(r) == ["169.254.77.1", "169.254.77.2"] for r in cross["rank_nodes"])  # one rank per node

    table = scaling(rows, load_calibration(results)).set_index("topology")
    same, across = table.loc["1x2"], table.loc["2x1"]
    assert across["step_ms_ci_lo"] > same["step_ms_ci_hi"]  # slower, beyond both intervals
    assert across["knee"] and "crosses from 1 to 2 node(s)" in across["knee_why"]

    rate_gbps = RATE_MBIT * 1e6 / 8 / 1e9
    median, best = link_rate(load_calibration(results))
    print(
        f"\ntwo-node cluster, link {RATE_MBIT} Mbit/s: step 1x2 {same['step_ms']:.1f} ms "
        f"[{same['step_ms_ci_lo']:.1f}, {same['step_ms_ci_hi']:.1f}], 2x1 {across['step_ms']:.1f} ms "
        f"[{across['step_ms_ci_lo']:.1f}, {across['step_ms_ci_hi']:.1f}]; busbw across the link at "
        f"{across['busbw_at_bytes'] / 2**20:.1f} MiB: median {median * 8e3:.1f} Mbit/s "
        f"({median / rate_gbps:.0%} of the tc rate), fastest {best * 8e3:.1f} Mbit/s ({best / rate_gbps:.0%}); "
        f"same node {same['busbw_gbps'] * 8e3:.0f} Mbit/s"
    )
    assert across["busbw_gbps"] == pytest.approx(median)  # the scaling table shows the calibration's median
    # The link's rate is what its fastest all-reduces carry: on this 2-core machine the CPU contention of two Ray
    # nodes adds time to some (here 355-439 ms for 4 MiB, 355 ms = 94.5% of the rate; CI once had a median of 84%
    # while its same-node interval was [41.4, 71.7] ms), and never removes any.
    assert 0.85 <= best / rate_gbps <= 1.15  # the calibration recovers the configured link rate
    assert median / rate_gbps >= 0.6  # the typical all-reduce is still bound by the link, not by something else
    assert same["busbw_gbps"] > 2 * across["busbw_gbps"]  # and the same-node ranks never cross it


def link_rate(calibration) -> tuple[float, float]:
    """busbw (GB/s) of the all-reduce across the two nodes at the largest size: the median and the fastest."""
    ar = calibration[(calibration["kind"] == "all_reduce") & (calibration["num_nodes"] == 2)]
    (row,) = ar[ar["size_bytes"] == ar["size_bytes"].max()].itertuples()
    return row.busbw_gbps, row.busbw_gbps * row.time_ms / min(row.times_ms)


OFF_LINK = {"ddps-a": "10.77.0.1", "ddps-b": "10.77.0.2"}  # one address per node that the other cannot reach
NODE_IPS = {"ddps-a": "169.254.77.1", "ddps-b": "169.254.77.2"}


def gloo_pair(how: str) -> list[str]:
    """Both ranks of tests/gloo_pair.py, one per node, without GLOO_SOCKET_IFNAME; their last lines. `nobind`: once
    one rank has failed, its peer is stopped ("stopped"): it would only wait out gloo's connect timeout (20 s)."""
    procs = []
    for rank, ns in enumerate(NODE_IPS):
        cmd = ["ip", "netns", "exec", ns, "env", "-u", "GLOO_SOCKET_IFNAME", sys.executable]
        cmd += [str(ROOT / "tests/gloo_pair.py"), str(rank), NODE_IPS[ns], "169.254.77.1:29611", how]
        procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True))
    deadline = time.monotonic() + 120
    while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
        if how == "nobind" and any(p.poll() not in (None, 0) for p in procs):
            break
        time.sleep(0.1)
    lines = []
    for p in procs:
        stop = p.poll() is None
        if stop:
            p.kill()
        out = p.communicate()[0].strip().splitlines()
        lines.append("stopped" if stop else out[-1])  # a crash on exit after its line still says that line
    return lines


def test_gloo_groups_bind_to_the_interface_of_the_nodes_ip(two_nodes):
    """The hostname resolves to an address off the link between the nodes (as on clusters whose hostname is
    loopback or another network): gloo's own choice cannot connect the two nodes, the bound one can."""
    hosts = {ns: Path(f"/etc/netns/{ns}/hosts") for ns in NODE_IPS}
    saved = {ns: h.read_text() for ns, h in hosts.items()}
    try:
        for ns, ip in OFF_LINK.items():
            subprocess.run(["ip", "-n", ns, "addr", "add", f"{ip}/32", "dev", "lo"], check=True)
            hosts[ns].write_text(f"127.0.0.1 localhost\n{ip} {os.uname().nodename}\n")
        unbound = gloo_pair("nobind")
        assert any(line.startswith("error") for line in unbound) and not any("sum" in line for line in unbound), unbound
        assert gloo_pair("bind") == ["sum 3.0", "sum 3.0"]
    finally:
        for ns, text in saved.items():
            hosts[ns].write_text(text)
            subprocess.run(["ip", "-n", ns, "addr", "delete", f"{OFF_LINK[ns]}/32", "dev", "lo"], check=False)


PINNED = """
name: pinned
cluster: netns
model: tiny
micro_batch: 4
seq_len: 32
warmup_steps: 1
timed_steps: 3
topology: [2x2, 2x1]
bucket_cap_mb: [25]
backend: gloo
use_gpu: false
"""


def test_k_ranks_land_on_each_node_though_each_has_more_slots(two_nodes, tmp_path):
    """Nodes of 4 CPUs: PACK alone would put the 2x2 host group's four ranks on one node (every cell then 'not
    measured'); pinned, two land on each node, and the 2x1 cell runs one rank on each."""
    spec = tmp_path / "pinned.yaml"
    spec.write_text(PINNED)
    results = str(tmp_path / "results")
    run = script("exec", sys.executable, "-m", "service.cli", "run", str(spec), "--address", HEAD, "--results", results)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    rows = load(results)
    ddp = {(r["num_nodes"], r["workers_per_node"]): r for r in rows[rows["mode"] == "ddp"].to_dict("records")}
    assert sorted(ddp) == [(2, 1), (2, 2)] and all(r["status"] == "ok" for r in ddp.values()), ddp
    assert sorted(ddp[(2, 2)]["rank_nodes"]) == ["169.254.77.1"] * 2 + ["169.254.77.2"] * 2
    assert sorted(ddp[(2, 1)]["rank_nodes"]) == ["169.254.77.1", "169.254.77.2"]
    assert ddp[(2, 2)]["workers_per_node_observed"] == 2 and ddp[(2, 2)]["grad_check"] == "exact"
