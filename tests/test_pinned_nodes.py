"""`n×k` placement: k ranks on each of n nodes, where the nodes have more slots than k (virtual nodes of
ray.cluster_utils.Cluster on one machine: one IP, distinct node ids)."""

from __future__ import annotations

import pytest
import ray
from ray.cluster_utils import Cluster

from sweeps.driver.runner import execute
from sweeps.plan.planner import plan_sweep
from sweeps.spec.files import parse_spec

TOPOLOGY_SPEC = """
name: pinned
model: tiny
micro_batch: 4
seq_len: 32
warmup_steps: 1
timed_steps: 2
topology: [2x2]
bucket_cap_mb: [25]
backend: gloo
use_gpu: false
"""


@pytest.mark.ray
def test_k_ranks_land_on_each_of_n_nodes_that_have_more_slots_than_k(tmp_path):
    """Two nodes of 4 CPUs: PACK alone would put all four ranks of a 2x2 cell on one node (a misplaced row);
    each rank's bundle pinned to its node gives two on each."""
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
    nodes = {cluster.add_node(num_cpus=4).node_id for _ in range(2)}
    ray.init(address=cluster.address, log_to_driver=False)
    try:
        outcome = execute(plan_sweep(parse_spec(TOPOLOGY_SPEC), results=str(tmp_path)))
    finally:
        ray.shutdown()
        cluster.shutdown()
    ddp = next(r for r in outcome.rows if r["mode"] == "ddp")
    assert ddp["status"] == "ok", ddp["error"]
    assert (ddp["num_nodes"], ddp["workers_per_node"], ddp["placement"]) == (2, 2, "PACK")
    assert ddp["workers_per_node_observed"] == 2 and ddp["replicas_in_sync"] and ddp["grad_check"] == "exact"
    assert len(nodes) == 2


def test_node_selectors_pin_k_ranks_to_each_of_the_first_n_nodes_that_fit():
    from sweeps.plan.grid import expand
    from sweeps.trial.options import NODE_ID_LABEL, node_selectors, pinned

    (cell,) = [c for c in expand(parse_spec(TOPOLOGY_SPEC)) if c.step.mode == "ddp"]
    assert pinned(cell, "auto") and not pinned(cell, "STRICT_SPREAD")
    got = node_selectors(cell, [("a", 8), ("b", 1), ("c", 2)])
    assert got == [{NODE_ID_LABEL: n} for n in ("a", "a", "c", "c")]
    with pytest.raises(ValueError, match="topology 2x2 needs 2 rank"):
        node_selectors(cell, [("a", 8), ("b", 1)])
