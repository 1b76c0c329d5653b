"""The overlap model's terms measured on a real gloo world (trainers.terms): the arms' rows and bucket counts."""

from __future__ import annotations

import math

from tests.dist_helpers import run_world
from trainers import terms, workload
from trainers.config import StepConfig
from trainers.model import grad_bytes

CFG = StepConfig(model="tiny", micro_batch=4, seq_len=32, warmup_steps=1, timed_steps=3)


def _measure(rank: int) -> tuple[list[dict] | None, int]:
    import torch

    device = torch.device("cpu")
    built = workload.build(CFG, device)
    batch = built.workload.make_batch(CFG.micro_batch, workload.generator(CFG.seed, rank, 0))
    params = sum(1 for p in built.model.parameters() if p.requires_grad)
    rows = terms.measure_terms(built.model, lambda m: built.workload.loss(m, batch), device, grad_bytes(built.model))
    return rows, params


def test_the_six_arms_are_measured_on_every_rank_and_rank_0_reports_them(tmp_path):
    (rows, params), (other, _) = run_world(_measure, 2, tmp_path)
    assert other is None
    kinds = [r["kind"] for r in rows]
    compute, comm = ["compute_solo", "compute_alone", "compute_contended"], ["comm_alone", "comm_contended"]
    assert kinds == [*compute, *comm, "ddp_backward", "ddp_backward"]
    many, one = rows[5], rows[6]
    assert (many["buckets"], one["buckets"]) == (params, 1)  # a bucket per parameter; every parameter in one
    assert rows[2]["size_bytes"] == rows[3]["size_bytes"] == many["size_bytes"] // 4 * 4 > 0  # the whole gradient
    # the contended arm's all-reduces are waited for after its compute: launch to done outlasts the compute
    assert all(t >= c for t, c in zip(rows[4]["times_ms"], rows[2]["times_ms"], strict=True))
    for r in rows:
        assert len(r["times_ms"]) == r["iters"] == terms.REPEATS
        assert all(math.isfinite(t) and t > 0 for t in r["times_ms"])
        assert r["time_ms"] == sorted(r["times_ms"])[terms.REPEATS // 2]
