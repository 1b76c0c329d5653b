"""The profile the overlap model starts from (trainers.profile): gradients ready in backward order, and the
model's bucket layout over them equal to DDP's own, for the presets and the recsys example at every cap."""

from __future__ import annotations

import dataclasses

from results.model import overlap
from tests.dist_helpers import run_world
from tests.test_trainer_dist import BASE, CPU, RECSYS
from trainers import replica
from trainers.profile import profile_micro_step

CAPS = [0.05, 0.25, 1.0, 5.0, 25.0]
WORKLOADS = {
    "tiny": BASE,
    "small": dataclasses.replace(BASE, model="small"),
    "recsys": RECSYS,
}


def layouts(rank: int) -> dict:
    """Per workload: its profile, and per cap the model's bucket bytes and DDP's rebuilt ones (1-rank gloo)."""
    out = {}
    for name, cfg in WORKLOADS.items():
        prof = profile_micro_step(cfg, CPU, repeats=2, warmup=1)
        per_cap = {}
        for cap in CAPS:
            rep = replica.setup_replica(dataclasses.replace(cfg, bucket_cap_mb=cap), CPU)
            for _ in range(11):  # DDP rebuilds its buckets in gradient-ready order after its first step; its
                replica.train_step(rep)  # logging data (what rows record) has the rebuilt layout by the 10th
            model = overlap.layout_for(overlap.Profile.from_dict(prof), cap)
            per_cap[cap] = ([sum(prof["nbytes"][i] for i in b) for b in model], replica.bucket_sizes(rep.module))
        out[name] = (prof, per_cap)
    return out


def test_the_model_buckets_the_gradients_as_ddp_does_and_they_are_ready_in_backward_order(tmp_path):
    got = run_world(layouts, 2, tmp_path)[0]  # DDP keeps one bucket in a world of one: two ranks
    for name, (prof, per_cap) in got.items():
        for cap, (model, ddp) in per_cap.items():
            assert model == ddp, (name, cap)
        ready = [prof["ready_ms"][i] for i in prof["order"]]
        assert ready == sorted(ready) and ready[0] > 0 and ready[-1] <= prof["backward_ms"], name
        assert prof["forward_ms"] > 0 and prof["optimizer_ms"] > 0
        assert all(lo <= hi for lo, hi in zip(prof["ready_p10_ms"], prof["ready_p90_ms"], strict=True))
    names = got["tiny"][0]["names"]
    first, last = names[got["tiny"][0]["order"][0]], names[got["tiny"][0]["order"][-1]]
    assert first.startswith("ln_f."), first  # the last layer's gradient first
    assert last.startswith(("wte.", "wpe.")), last  # the embeddings' last (wte: tied to the head, summed twice)
