"""`n×k` placement: k ranks on each of n nodes, where the nodes have more slots than k. The rule here; on a real
two-node cluster in tests/test_two_nodes.py (test_k_ranks_land_on_each_node_though_each_has_more_slots)."""

from __future__ import annotations

import pytest

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


def test_node_selectors_pin_k_ranks_to_each_of_the_first_n_nodes_that_fit():
    from sweeps.plan.grid import expand
    from sweeps.trial.options import NODE_ID_LABEL, node_selectors, pinned

    (cell,) = [c for c in expand(parse_spec(TOPOLOGY_SPEC)) if c.step.mode == "ddp"]
    assert pinned(cell, "auto") and not pinned(cell, "STRICT_SPREAD")
    got = node_selectors(cell, [("a", 8), ("b", 1), ("c", 2)])
    assert got == [{NODE_ID_LABEL: n} for n in ("a", "a", "c", "c")]
    with pytest.raises(ValueError, match="topology 2x2 needs 2 rank"):
        node_selectors(cell, [("a", 8), ("b", 1)])
