"""The DDP knobs that matter on slow links (communication hooks, first bucket, static_graph,
broadcast_buffers) on real gloo worlds: what stays exact, what does not and by how much, what the trace
measures of the bytes each hook sends."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from tests.dist_helpers import run_world
from tests.test_trainer_dist import BASE, CPU, RECSYS, assert_same, full_batch_grads, grads_after_backward
from trainers.config import StepConfig
from trainers.errors import ConfigError
from trainers.replica import ddp_kwargs, forward_backward, setup_replica
from trainers.step import run_cell


def grads_at_step(rank: int, cfg: StepConfig, backwards: int) -> dict[str, torch.Tensor]:
    """The averaged gradient of the `backwards`-th backward at the initial weights (no optimizer step): a
    PowerSGD hook compresses from its start_iter-th synchronized backward on."""
    rep = setup_replica(cfg, CPU)
    for _ in range(backwards):
        rep.opt.zero_grad(set_to_none=True)
        forward_backward(rep)
    return {n: p.grad.detach().clone() for n, p in rep.model.named_parameters()}


def relative_error(got: dict, want: dict) -> float:
    num = sum(float((got[n] - want[n]).norm() ** 2) for n in want)
    return (num / sum(float(want[n].norm() ** 2) for n in want)) ** 0.5


@pytest.mark.parametrize(
    "knobs",
    [
        {"static_graph": True},
        {"broadcast_buffers": False},
        {"first_bucket_mb": 0.05, "bucket_cap_mb": 0.25},
        {"find_unused_parameters": True},
    ],
    ids=["static_graph", "no_broadcast_buffers", "first_bucket", "find_unused_parameters"],
)
def test_the_exact_knobs_still_give_the_full_batch_gradient(tmp_path, knobs):
    cfg = dataclasses.replace(BASE, **knobs)
    per_rank = run_world(grads_after_backward, 2, tmp_path, cfg)
    assert_same(per_rank[0], full_batch_grads(cfg, 2), atol=1e-6)
    assert_same(per_rank[1], per_rank[0], atol=0.0)


def wrapped_broadcast_buffers(rank: int, cfgs: list[StepConfig]) -> list[tuple[bool, list[str]]]:
    """Each cell's DDP wrapper: whether it syncs buffers at every forward, and what torch warned."""
    import warnings

    out = []
    for cfg in cfgs:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            rep = setup_replica(cfg, CPU)
        out.append((rep.module.broadcast_buffers, [str(w.message)[:60] for w in caught]))
    return out


def test_broadcast_buffers_reaches_ddp_and_the_default_names_no_deprecated_argument(tmp_path):
    cfgs = [BASE, dataclasses.replace(BASE, broadcast_buffers=False)]
    (default, off), _ = run_world(wrapped_broadcast_buffers, 2, tmp_path, cfgs)
    assert default == (True, [])  # torch's default is the knob's default: nothing to name, nothing warned
    assert off[0] is False  # the knob set: named (torch >= 2.13 warns that it is deprecated)


ERRORS = {}  # (workload, hook) -> relative gradient error, printed for the README


@pytest.mark.parametrize("base", [BASE, RECSYS], ids=["gpt-tiny", "recsys"])
def test_compressing_hooks_change_the_gradient_by_a_measured_amount_and_replicas_agree(tmp_path, base):
    exact = full_batch_grads(base, 2)
    errors = {}
    for hook, rank in (("none", 1), ("fp16", 1), ("powersgd", 1), ("powersgd", 4)):
        cfg = dataclasses.replace(base, comm_hook=hook, powersgd_rank=rank, bucket_cap_mb=0.25, warmup_steps=2)
        r0, r1 = run_world(grads_at_step, 2, tmp_path / f"{hook}{rank}", cfg, 3)
        assert_same(r1, r0, atol=0.0)  # every replica gets the same (compressed) average
        errors[f"{hook}-{rank}"] = relative_error(r0, exact)
    print(f"\nrelative gradient error vs the full batch, {base.model}: {errors}")
    assert errors["none-1"] < 1e-6  # exact
    assert 0 < errors["fp16-1"] < 1e-2  # rounded to half precision: small, never zero
    assert errors["powersgd-1"] > errors["fp16-1"] and errors["powersgd-1"] < 2  # a rank-1 approximation
    assert errors["powersgd-4"] <= errors["powersgd-1"] * 1.05  # more rank, no worse


def traced(rank: int, cfgs: list[StepConfig]):
    return [run_cell(c, CPU, num_threads=1) for c in cfgs]


def test_the_trace_measures_the_bytes_each_hook_sends_and_every_hook_keeps_replicas_identical(tmp_path):
    """Timed steps through run_cell, several buckets (PowerSGD on gloo runs bucket by bucket: trainers.hooks)."""
    cfgs = [
        dataclasses.replace(BASE, comm_hook=h, powersgd_rank=r, bucket_cap_mb=b, trace_comm=True, warmup_steps=2)
        for h, r, b in (("none", 1, 0.25), ("fp16", 1, 0.25), ("powersgd", 1, 0.25), ("powersgd", 1, 25.0))
    ]
    none, fp16, psgd, psgd_one_bucket = run_world(traced, 2, tmp_path, cfgs)[0]
    assert all(m.replicas_in_sync for m in (none, fp16, psgd, psgd_one_bucket))
    assert none.num_buckets > 1 and none.comm_bytes_per_step == none.grad_bytes  # fp32 gradients, once
    assert fp16.comm_bytes_per_step * 2 == none.comm_bytes_per_step  # half the bytes, exactly
    assert psgd.comm_bytes_per_step <= 0.1 * none.comm_bytes_per_step  # low-rank factors (and small vectors)
    assert psgd.comm_collectives_per_step > none.comm_collectives_per_step  # P and Q per bucket, and the rest
    assert len(psgd.comm_timeline_ms) == psgd.num_buckets


def test_hook_settings_are_checked_and_normalized():
    with pytest.raises(ConfigError, match="comm_hook"):
        StepConfig(comm_hook="int8")
    with pytest.raises(ConfigError, match="powersgd_start_iter"):
        StepConfig(comm_hook="powersgd", powersgd_start_iter=5, warmup_steps=3)
    assert StepConfig(comm_hook="fp16", powersgd_rank=4).powersgd_rank == 1  # only PowerSGD has a rank
    single = StepConfig(mode="single", comm_hook="powersgd", static_graph=True, first_bucket_mb=1.0)
    assert (single.comm_hook, single.static_graph, single.first_bucket_mb) == ("none", False, None)
    assert StepConfig(comm_hook="powersgd", powersgd_rank=2).grad_compression == "powersgd-rank-2"


UNUSED = StepConfig(workload="tests.unused_workload:build", micro_batch=4, warmup_steps=1, timed_steps=2)


def measured_or_error(rank: int, cfg: StepConfig) -> str:
    """`ok` when the cell measures, else DDP's error's first line."""
    try:
        run_cell(cfg, CPU, 1)
    except RuntimeError as e:
        return str(e).splitlines()[0]
    return "ok"


def test_find_unused_parameters_is_a_knob_ddp_receives(tmp_path):
    """The knob added through the table alone (trainers/knobs.py): a model that skips a layer fails its second
    step without it (DDP's own error, which names the knob) and measures with it."""
    without = run_world(measured_or_error, 2, tmp_path, UNUSED)
    assert "find_unused_parameters" in without[0] or "Expected to have finished reduction" in without[0], without
    cfg = dataclasses.replace(UNUSED, find_unused_parameters=True)
    assert run_world(measured_or_error, 2, tmp_path, cfg) == ["ok", "ok"]
    assert ddp_kwargs(cfg)["find_unused_parameters"] is True and "find_unused_parameters" not in ddp_kwargs(UNUSED)
