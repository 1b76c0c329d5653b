"""Tier 4: multi-node placement on one machine with ray.cluster_utils.Cluster (virtual nodes). Where network
namespaces can be made (root), tests/test_two_nodes.py runs the spread on two real nodes and asserts what the
virtual-node run here would: the spread test is skipped there (a cluster and two worker groups, ~1 min)."""

from __future__ import annotations

import json

import pytest
import ray
from ray.cluster_utils import Cluster

from sweeps.driver.runner import execute
from sweeps.driver.session import environment_kept
from sweeps.plan.planner import plan_sweep
from sweeps.spec.files import parse_spec
from sweeps.spec.sweep import SpecError
from tests.test_two_nodes import why_no_namespaces

pytestmark = pytest.mark.ray

SPEC = """
name: nodes
model: tiny
micro_batch: 4
seq_len: 32
warmup_steps: 1
timed_steps: 3
workers: [2]
nodes: {nodes}
bucket_cap_mb: [25]
backend: gloo
use_gpu: false
"""


@pytest.fixture(scope="module")
def two_nodes():
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
    for _ in range(2):
        cluster.add_node(num_cpus=1)
    with environment_kept():  # nothing of this Ray's environment (RAY_AUTH_MODE=token) reaches later tests
        ray.init(address=cluster.address, log_to_driver=False)
        yield cluster
        ray.shutdown()
    cluster.shutdown()


@pytest.mark.skipif(
    why_no_namespaces() is None, reason="tests/test_two_nodes.py runs the same spread on two real nodes here"
)
def test_two_workers_spread_over_two_nodes(two_nodes, tmp_path):
    outcome = execute(plan_sweep(parse_spec(SPEC.format(nodes="[2]")), results=str(tmp_path)))
    ddp = next(r for r in outcome.rows if r["mode"] == "ddp")
    assert ddp["status"] == "ok", ddp["error"]
    assert (ddp["num_nodes"], ddp["workers_per_node"], ddp["placement"]) == (2, 1, "STRICT_SPREAD")
    assert ddp["workers_per_node_observed"] == 1 and len(ddp["rank_nodes"]) == 2
    assert len(json.loads(ddp["network"])) == 2  # one fingerprint per node
    assert ddp["replicas_in_sync"]


def test_a_cell_that_needs_a_bigger_node_is_refused_up_front(two_nodes, tmp_path):
    with pytest.raises(SpecError) as err:
        execute(plan_sweep(parse_spec(SPEC.format(nodes="[1, 2]")), results=str(tmp_path)))
    assert err.value.field == "workers"
    assert "needs 2 worker(s) of 1 CPU on each of 1 node(s)" in str(err.value)
    assert not (tmp_path / "cluster=local").exists()  # nothing ran, nothing written
