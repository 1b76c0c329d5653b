"""The gradient check (trainers.gradcheck), tier by tier: its fp32 bound holds for every order of the sum; on real
gloo worlds DDP is exact within it across bucket layouts, compressing hooks are approximate with their error, a
planted corruption fails while replicas stay in sync, and the reference does not depend on the hook; a failed
configuration is left out of every view that picks a best."""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pytest
import torch

from results.analysis import cells as analysis
from results.analysis import racing, recommend
from sweeps.driver.summary import summary_text
from tests.dist_helpers import run_world
from tests.test_identity import base
from tests.test_racing import planner_for, round_rows, spec
from tests.test_trainer_dist import BASE, CPU, RECSYS
from trainers import gradcheck
from trainers.config import StepConfig
from trainers.replica import forward_backward, setup_replica
from trainers.step import Extras, check_batches, run_cell


def fp32_ddp_sum(terms: np.ndarray, rng: np.random.Generator, no_sync: bool) -> np.ndarray:
    """What DDP computes from terms[r, m] (W ranks, G micro-steps) in fp32, in a random order at every level:
    no_sync accumulates each rank's micro-steps, then divides by W and sums over the ranks; syncing every
    micro-step adds each micro-step to the running average, then divides and sums again."""
    w, g = terms.shape[:2]
    f32 = np.float32

    def ranks_sum(parts: list[np.ndarray]) -> np.ndarray:  # the all-reduce: W-1 additions in any order
        total = np.zeros_like(parts[0])
        for r in rng.permutation(len(parts)):
            total = (total + parts[r]).astype(f32)
        return total

    if no_sync:
        local = []
        for r in range(w):
            acc = np.zeros_like(terms[0, 0])
            for m in rng.permutation(g):
                acc = (acc + terms[r, m]).astype(f32)
            local.append((acc / f32(w)).astype(f32))
        return ranks_sum(local)
    avg = np.zeros_like(terms[0, 0])
    for m in range(g):
        avg = ranks_sum([((avg + terms[r, m]).astype(f32) / f32(w)).astype(f32) for r in range(w)])
    return avg


@pytest.mark.parametrize("world", [2, 3, 5, 8])
@pytest.mark.parametrize("gas", [1, 4])
@pytest.mark.parametrize("no_sync", [False, True])
def test_the_tolerance_holds_for_every_order_of_the_fp32_sum(world, gas, no_sync):
    """Terms of mixed sign and magnitudes over 6 decades (cancellation is where fp32 loses most), summed in 20
    random orders: the relative L2 error never exceeds the bound, and a perturbation of 1e-4 always does."""
    rng = np.random.default_rng(world * 10 + gas)
    worst = 0.0
    for _ in range(20):
        scale = 10.0 ** rng.uniform(-3, 3, size=(1, 1, 4096))
        terms = (rng.standard_normal((world, gas, 4096)) * scale).astype(np.float32)
        exact = terms.astype(np.float64).sum(axis=(0, 1)) / world
        got = fp32_ddp_sum(terms, rng, no_sync).astype(np.float64)
        magnitude = sum(np.linalg.norm(np.abs(terms[r].astype(np.float64)).sum(axis=0)) for r in range(world)) / world
        tol = gradcheck.tolerance(world, gas, magnitude, float(np.linalg.norm(exact)))
        err = float(np.linalg.norm(got - exact) / np.linalg.norm(exact))
        assert 0 < err <= tol, (err, tol)
        assert float(np.linalg.norm(got * (1 + 1e-4) - exact) / np.linalg.norm(exact)) > tol
        worst = max(worst, err / tol)
    assert worst > 1e-3  # the bound is not vacuous: within three decades of what fp32 really does


def fp16_ddp_sum(terms: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """What DDP's fp16 hook computes from terms[r, m] under no_sync: each rank's fp32 sum over micro-steps, cast to
    fp16, divided by W in fp16, summed over the ranks in fp16 in a random order, back to fp32."""
    w = terms.shape[0]
    parts = [
        (terms[r].sum(axis=0, dtype=np.float32).astype(np.float16) / np.float16(w)).astype(np.float16) for r in range(w)
    ]
    total = np.zeros_like(parts[0])
    for r in rng.permutation(w):
        total = (total + parts[r]).astype(np.float16)
    return total.astype(np.float32)


@pytest.mark.parametrize(("world", "gas"), [(2, 1), (2, 4), (3, 4), (8, 1)])
def test_the_fp16_bound_holds_for_its_rounding_and_underflow_and_catches_a_wrong_sum(world, gas):
    """Magnitudes from 1e-9 (fp16 subnormals and zeros) to 1e2: fp16's own rounding stays within its bound in 20
    random orders; a sum 10% off is outside it (the worst-case bound is loose: tens of times what fp16 does)."""
    rng, worst = np.random.default_rng(world * 10 + gas), 0.0
    for _ in range(20):
        scale = 10.0 ** rng.uniform(-9, 2, size=(1, 1, 4096))
        terms = (rng.standard_normal((world, gas, 4096)) * scale).astype(np.float32)
        exact = terms.astype(np.float64).sum(axis=(0, 1)) / world
        got = fp16_ddp_sum(terms, rng).astype(np.float64)
        magnitude = sum(np.linalg.norm(np.abs(terms[r].astype(np.float64)).sum(axis=0)) for r in range(world)) / world
        tol = gradcheck.tolerance(world, gas, magnitude, float(np.linalg.norm(exact)), "fp16", exact.size)
        err = float(np.linalg.norm(got - exact) / np.linalg.norm(exact))
        assert 0 < err <= tol < 0.05, (err, tol)
        worst = max(worst, err / tol)
        assert gradcheck.verdict("fp16", err, tol) == "approximate"
        assert (
            gradcheck.verdict("fp16", float(np.linalg.norm(got * 1.1 - exact) / np.linalg.norm(exact)), tol) == "failed"
        )


def test_verdicts_compressing_hooks_within_their_own_bound_powersgd_recorded_exact_only_within_fp32s():
    assert gradcheck.verdict("fp16", 1e-4, 1e-3) == "approximate" and gradcheck.verdict("fp16", 2e-3, 1e-3) == "failed"
    assert gradcheck.verdict("bf16", 1e-3, 1e-2) == "approximate" and gradcheck.verdict("bf16", 0.1, 1e-2) == "failed"
    assert gradcheck.verdict("powersgd", 0.8, 1e-6) == "approximate"
    assert gradcheck.verdict("none", 1e-6, 1e-6) == "exact"
    assert gradcheck.verdict("none", 1.01e-6, 1e-6) == "failed"
    assert gradcheck.roundings(2, 1) == 3 and gradcheck.roundings(2, 3, "fp16") == 12
    assert gradcheck.tolerance(2, 1, 1.0, 0.0) == 0.0
    fp32, bf16 = gradcheck.tolerance(2, 1, 1.0, 1.0), gradcheck.tolerance(2, 1, 1.0, 1.0, "bf16")
    assert bf16 / fp32 == pytest.approx(2.0**16 * 4 / 3 / (1 - 4 * 2.0**-8))  # 2^-8 / 2^-24, four roundings to three


def checked(rank: int, cfgs: list, corruption: float = 0.0, grad_check: bool = True, jitter: float = 0.0):
    extras = Extras(grad_check=grad_check, corruption=corruption, jitter=jitter)
    return [run_cell(c, CPU, 1, extras=extras) for c in cfgs]


LAYOUTS = {
    "many-buckets": dict(bucket_cap_mb=0.001),
    "one-bucket": dict(bucket_cap_mb=25.0),
    "first-bucket": dict(first_bucket_mb=0.01, bucket_cap_mb=0.25),
    "copy-not-view": dict(bucket_cap_mb=0.05, gradient_as_bucket_view=False),
    "sync-every-micro-step": dict(bucket_cap_mb=0.05, gas=3),
    "no_sync": dict(bucket_cap_mb=0.05, gas=3, no_sync=True),
    "static-graph": dict(bucket_cap_mb=0.05, static_graph=True),
    "naive": dict(mode="naive", gas=2),
}


@pytest.mark.parametrize("world", [2, 3])
def test_ddp_is_exact_within_the_tolerance_across_bucket_layouts_and_sync_patterns(tmp_path, world):
    """Bucket layouts, the first bucket, bucket views, gas and no_sync reorder the fp32 sum; 3 ranks make DDP's
    division by W inexact. Every one stays within the bound, which is also tight enough to matter (< 1e-5)."""
    names = [*LAYOUTS] if world == 2 else ["many-buckets", "sync-every-micro-step", "no_sync"]  # W=3: the division
    cfgs = [dataclasses.replace(BASE, timed_steps=2, **LAYOUTS[n]) for n in names]
    cfgs.append(dataclasses.replace(RECSYS, bucket_cap_mb=0.001, timed_steps=2))
    out = run_world(checked, world, tmp_path, cfgs)
    for name, m in zip([*names, "recsys"], out[0], strict=True):
        assert m.grad_check == "exact", (name, m.grad_rel_error, m.grad_tol)
        assert 0 < m.grad_rel_error <= m.grad_tol < 1e-5, name
        assert m.grad_check_ms > 0 and m.replicas_in_sync
    assert out[1] == [None] * len(cfgs)  # rank 0 reports; every rank took part in the check


def test_hooks_are_approximate_within_their_bound_and_a_planted_corruption_fails_with_replicas_in_sync(tmp_path):
    hooks = [
        dataclasses.replace(BASE, comm_hook="fp16", bucket_cap_mb=0.25),
        dataclasses.replace(BASE, comm_hook="powersgd", powersgd_rank=1, bucket_cap_mb=0.25, warmup_steps=2),
    ]
    fp16, psgd = run_world(checked, 2, tmp_path / "hooks", hooks)[0]
    assert (fp16.grad_check, psgd.grad_check) == ("approximate", "approximate")
    assert 1e-5 < fp16.grad_rel_error <= fp16.grad_tol < 1e-2 and psgd.grad_rel_error > 10 * fp16.grad_rel_error
    exact = [dataclasses.replace(BASE, bucket_cap_mb=0.25), dataclasses.replace(BASE, gas=2, no_sync=True)]
    for m in run_world(checked, 2, tmp_path / "corrupt", [*exact, hooks[0]], 0.1)[0]:
        assert m.replicas_in_sync  # every rank got the same wrong sum
        assert m.grad_check == "failed" and m.grad_rel_error > 5 * m.grad_tol  # fp16 too: beyond its rounding
    (off,) = run_world(checked, 2, tmp_path / "off", exact[:1], 0.0, False)[0]
    assert (off.grad_check, off.grad_rel_error, off.grad_check_ms) == ("off", None, None)


JITTERED = [
    dataclasses.replace(BASE, bucket_cap_mb=0.05),
    dataclasses.replace(BASE, bucket_cap_mb=0.05, gas=2, no_sync=True),
    dataclasses.replace(BASE, bucket_cap_mb=0.05, gas=2),
    dataclasses.replace(BASE, comm_hook="fp16", bucket_cap_mb=0.25),
]


def test_a_backward_that_differs_on_every_call_keeps_exact_cells_exact_and_a_corruption_still_fails(tmp_path):
    """The GPU's nondeterministic backward, emulated (trainers.plants, 1e-3): the check shares the cell's own
    backward, so only communication can differ; a planted corruption of 1e-4 beside it still fails."""
    out = run_world(checked, 2, tmp_path / "jitter", JITTERED, 0.0, True, 1e-3)[0]
    assert [m.grad_check for m in out] == ["exact", "exact", "exact", "approximate"]
    assert all(m.grad_rel_error <= m.grad_tol for m in out)
    bad = run_world(checked, 2, tmp_path / "both", JITTERED[:3], 1e-4, True, 1e-3)[0]
    assert all(m.grad_check == "failed" and m.grad_rel_error > 10 * m.grad_tol for m in bad)


DROPOUT = StepConfig(
    workload="tests.dropout_workload:build", workload_args="{}", micro_batch=8, warmup_steps=1, timed_steps=2
)


def test_dropout_and_a_multi_layer_gpt_are_exact(tmp_path):
    """Dropout draws a new mask on every forward: a check by a second backward failed it (error 0.37)."""
    cfgs = [DROPOUT, dataclasses.replace(DROPOUT, gas=3, no_sync=True), dataclasses.replace(BASE, gas=2)]
    out = run_world(checked, 3, tmp_path, cfgs)[0]
    assert [m.grad_check for m in out] == ["exact"] * 3, [(m.grad_rel_error, m.grad_tol) for m in out]


def capture_one(rank: int, cfg: StepConfig) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """The captured local gradients of one step, and the same step's local gradients computed apart."""
    rep = setup_replica(cfg, CPU)
    batches = check_batches(rep)
    capture = gradcheck.Capture(list(rep.model.parameters()), cfg.gas)
    forward_backward(dataclasses.replace(rep, batches=batches))
    capture.remove()
    alone = setup_replica(dataclasses.replace(cfg, mode="single"), CPU)
    forward_backward(dataclasses.replace(alone, batches=batches))
    return capture.sums, [p.grad.reshape(-1).double() for p in alone.model.parameters()]


def test_the_capture_holds_each_ranks_local_gradient_before_ddp_averages_it(tmp_path):
    """Summed over the micro-steps, the captured gradients are this rank's own (computed apart, without DDP),
    not DDP's averaged ones: the ranks' data differ, so an averaged capture would differ from both."""
    for rank, (captured, alone) in enumerate(run_world(capture_one, 2, tmp_path, dataclasses.replace(BASE, gas=2))):
        assert all(torch.allclose(c, a, rtol=1e-5, atol=1e-7) for c, a in zip(captured, alone, strict=True)), rank


def curve_with_a_failed_bucket() -> pd.DataFrame:
    """Three buckets of one curve, 4 rounds; the fastest (0.25 MB) failed its gradient check in one round."""
    rows = []
    for rep in range(4):
        for bucket, ms in ((0.25, 80.0), (1.0, 100.0), (25.0, 120.0)):
            r = base("a", rep, ms) | {"cell_id": f"b{bucket}", "bucket_cap_mb": bucket}
            rows.append(r | {"grad_check": "exact", "grad_rel_error": 3e-8, "grad_tol": 2.5e-7})
    frame = pd.DataFrame(rows)
    bad = (frame["bucket_cap_mb"] == 0.25) & (frame["round"] == 2)
    frame.loc[bad, ["grad_check", "grad_rel_error"]] = ["failed", 1e-4]
    return frame


def test_a_failed_configuration_is_left_out_of_every_view_that_picks_a_best():
    rows = curve_with_a_failed_bucket()
    assert 0.25 not in set(analysis.ok_cells(rows)["bucket_cap_mb"])  # all 4 rounds, not only the failed one
    (curve,) = analysis.u_curve(rows).to_dict("records")
    assert curve["best_bucket_cap_mb"] == 1.0 and 0.25 not in curve["indistinguishable_buckets_mb"]
    (rec,) = recommend.recommend(rows)
    assert rec["best"]["bucket_cap_mb"] == 1.0
    assert all(c["bucket_cap_mb"] != 0.25 for c in rec["indistinguishable"])
    (left,) = rec["excluded"]
    assert left["bucket_cap_mb"] == 0.25 and "1 of 4 measurement(s): error 1.00e-04" in left["reason"]
    assert "left out: bucket_cap_mb=0.25" in recommend.to_text([rec])
    checks = analysis.gradient_checks(rows)
    assert list(checks["grad_check"]) == ["failed", "exact", "exact"]
    summary = summary_text(rows)
    assert "gradient check FAILED" in summary and "0.25MB:" not in summary


def test_a_race_never_leads_with_a_failed_cell_and_measures_it_no_more():
    p = planner_for(spec(repeats=5, search="race", min_rounds=2, tolerance=0.02))
    fastest, *others = sorted(p.alive)
    rng = np.random.default_rng(0)
    factors = {fastest: -0.3} | dict.fromkeys(others, 0.0)
    for r in range(len(p.first_rounds())):
        for row in round_rows(rng, factors, range(r, r + 1), 0.01):
            failed = row["cell_id"] == fastest and r == 0
            p.on_row(row | {"grad_check": "failed" if failed else "exact"})
    assert fastest not in p.alive and p.eliminated_at[fastest] == 0
    assert all(x["cell_id"] != fastest for x in p.ok_rows)
    leaders = {cell for cell, _, _ in racing.versus_leader(pd.DataFrame(p.ok_rows), 200, 0)}
    assert fastest not in leaders and len(leaders) == len(others) - 1  # a leader among the others, rivals beside it


def test_compressing_configurations_carry_their_error_into_recommend():
    rows = []
    for rep in range(4):
        for hook, ms, err in (("none", 100.0, 3e-8), ("fp16", 70.0, 3.0e-4 + rep * 1e-6)):
            r = base("a", rep, ms) | {"cell_id": hook, "comm_hook": hook, "bucket_cap_mb": 25.0}
            rows.append(r | {"grad_check": "exact" if hook == "none" else "approximate", "grad_rel_error": err})
    (rec,) = recommend.recommend(pd.DataFrame(rows))
    assert rec["recommended"]["comm_hook"] == "fp16" and rec["changes_numerics"]
    n = rec["recommended_numerics"]
    assert n["grad_check"] == "approximate" and n["grad_checks"] == 4
    assert n["grad_rel_error"] == pytest.approx(3.015e-4) and n["grad_rel_error_range"] == [3.0e-4, 3.03e-4]
    assert "gradient error 3.0e-04 [3.0e-04, 3.0e-04] over 4 checks" in rec["verdict"]
    assert "approximate (a compressing hook)" in recommend.to_text([rec])
    first_only = [r if r["repeat"] == 0 else r | {"grad_check": None, "grad_rel_error": None} for r in rows]
    (one,) = recommend.recommend(pd.DataFrame(first_only))  # grad_check: first, the default
    assert "gradient error 3.0e-04, one check" in one["verdict"]  # one check has no range to show
    (once,) = recommend.recommend(pd.DataFrame([r for r in rows if r["repeat"] == 0]))
    assert once["verdict"].startswith("1 round is too few to tell configurations apart")
    assert once["recommended"]["comm_hook"] == "none"  # the defaults stay


def test_the_sweep_page_and_the_report_show_a_failed_configuration_with_its_error(tmp_path):
    from fastapi.testclient import TestClient

    from results.render.report import render_html
    from results.storage.store import Store
    from service.api import ServiceSettings, create_app

    rows = curve_with_a_failed_bucket()
    store = Store.open(str(tmp_path))
    for r in rows.to_dict("records"):
        store.write_row(r | {"sweep_id": "s", "cell_id": f"{r['cell_id']}".replace(".", "p")})
    client = TestClient(create_app(ServiceSettings(address=None, results=str(tmp_path), token="t")))
    page = client.get("/ui/sweep/a/s").text
    assert "1 configuration(s) failed the gradient check" in page and "Gradient check" in page
    assert "left out: bucket_cap_mb=0.25" in page and "0.0001" in page  # the error, in the table
    report = render_html(rows, "r")
    assert "Gradient check" in report and "left out: bucket_cap_mb=0.25" in report
