"""Tier 1 and 2: the α–β cost model on known numbers, and the calibration collective on a gloo world."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd
import pytest

from results.analysis import cells as analysis
from results.model import costmodel
from tests.dist_helpers import run_world
from tests.seed_rows import GRAD_BYTES, seed_rows


def calibration_rows(alpha_ms: float, beta_bps: float, noise: float = 0.0, world: int = 8, seed: int = 0) -> list:
    rng = np.random.default_rng(seed)
    rows = []
    for size in [4096 * 4**k for k in range(11)]:  # 4 KB .. 4 GB
        t = (alpha_ms + size / beta_bps * 1e3) * (1 + rng.normal(0, noise))
        rows.append(
            {
                "cluster": "pcie-8x",
                "sweep_id": "seed",
                "world_size": world,
                "num_nodes": 1,
                "backend": "nccl",
                "kind": "all_reduce",
                "size_bytes": size,
                "time_ms": t,
            }
        )
    return rows


def test_the_seed_arithmetic_through_the_model():
    """The seed post: S = 498 MB at 10.1 GB/s algbw -> 49.3 ms; measured single-bucket overhead 49.8 ms (1%)."""
    calibration = pd.DataFrame(calibration_rows(0.0, 10.1e9))
    fit = costmodel.fits(calibration).iloc[0]
    assert fit["beta_gbps"] == pytest.approx(10.1, rel=1e-6) and fit["alpha_ms"] == pytest.approx(0, abs=1e-6)
    assert float(costmodel.predict_ms(fit, [GRAD_BYTES])[0]) == pytest.approx(49.3, abs=0.05)
    rows = pd.DataFrame(seed_rows()).assign(bucket_sizes_bytes=None)
    cells = analysis.with_baseline(rows)
    single = cells[cells["bucket_cap_mb"] == 500.0].iloc[0]
    assert single["exposed_comm_ms"] == pytest.approx(49.8, abs=0.01)
    predicted = float(costmodel.predict_ms(fit, [single["grad_bytes"]])[0])
    assert single["exposed_comm_ms"] / predicted == pytest.approx(1.01, abs=0.005)


def test_alpha_beta_fit_recovers_known_latency_and_bandwidth():
    fit = costmodel.fits(pd.DataFrame(calibration_rows(0.05, 2e9, noise=0.01, seed=3))).iloc[0]
    assert fit["alpha_ms"] == pytest.approx(0.05, rel=0.05) and fit["beta_gbps"] == pytest.approx(2.0, rel=0.03)
    assert fit["max_rel_residual"] < 0.05 and fit["uses"] == "fit"


def test_a_poor_fit_falls_back_to_the_measured_curve():
    rows = calibration_rows(0.05, 2e9)
    for r in rows[:4]:
        r["time_ms"] *= 3  # small messages far slower than any line explains (e.g. a protocol switch)
    fit = costmodel.fits(pd.DataFrame(rows)).iloc[0]
    assert fit["uses"] == "measured curve" and fit["max_rel_residual"] > costmodel.POOR_FIT
    sizes = [r["size_bytes"] for r in rows]
    assert costmodel.predict_ms(fit, sizes) == pytest.approx([r["time_ms"] for r in rows], rel=1e-9)
    beyond = float(costmodel.predict_ms(fit, [sizes[-1] * 2])[0])
    assert beyond == pytest.approx(2 * rows[-1]["time_ms"], rel=1e-9)  # linear in bytes past the last size


def calibrate_on_world(rank: int, corrupt: bool):
    import torch
    import torch.distributed as dist

    from trainers.collectives import CalibrationError, allreduce_sweep, sizes_up_to

    def faulty(t: torch.Tensor) -> None:
        dist.all_reduce(t)
        if rank == 1 and t.numel() > 1:
            t[-1] += 1.0  # one wrong element on one rank

    try:
        return allreduce_sweep(
            sizes_up_to(1 << 22), torch.device("cpu"), all_reduce=faulty if corrupt else dist.all_reduce
        )
    except CalibrationError as e:
        return f"CalibrationError: {e}"


def test_calibration_sweep_on_two_ranks_rises_with_size(tmp_path):
    from trainers.collectives import MAX_ITERS

    rows, other = run_world(calibrate_on_world, 2, tmp_path, False)
    assert other is None and [r["size_bytes"] for r in rows] == [4096 * 4**k for k in range(6)]
    assert all(r["time_ms"] > 0 and 10 <= len(r["times_ms"]) == r["iters"] <= MAX_ITERS for r in rows)
    assert rows[0]["iters"] > 10  # 4 KB takes well under 20 ms: more all-reduces fill the size's time budget
    assert rows[-1]["busbw_gbps"] > 4 * rows[0]["busbw_gbps"]  # latency-bound small, bandwidth-bound large
    assert rows[0]["busbw_gbps"] == pytest.approx(rows[0]["algbw_gbps"])  # 2(N-1)/N = 1 at N = 2


def test_a_wrong_reduced_value_fails_loudly_on_every_rank(tmp_path):
    r0, r1 = run_world(calibrate_on_world, 2, tmp_path, True)
    assert r0.startswith("CalibrationError") and "another rank" in r0  # rank 0's values were right
    assert r1.startswith("CalibrationError") and "expected 3" in r1  # rank 1 names the element


def test_report_uses_the_sweeps_own_calibration():
    from results.render.report import render_html

    rows = pd.DataFrame(seed_rows()).assign(bucket_sizes_bytes=[[]] + [[GRAD_BYTES // 4] * 4] * 7)
    place = calibration_rows(0.0, 10.1e9)[0] | {"group_id": "g", "size_bytes": GRAD_BYTES}
    terms = [  # g = 40 / 32 = 1.25; c = (40.5 − 40) / (6 − 1) = 0.1 ms per bucket; κ = 48 / 40 − 1 = 0.2;
        # λ = 48 / (48 + 40 − 72) − 1 = 2 (the all-reduces outlast the compute)
        place | {"kind": k, "time_ms": ms, "times_ms": [ms] * 10, "buckets": b}
        for k, ms, b in [("compute_solo", 32, None), ("compute_alone", 40, None), ("compute_contended", 48, None)]
        + [("comm_alone", 40, None), ("comm_contended", 72, None)]
        + [("ddp_backward", 40.5, 6), ("ddp_backward", 40, 1)]
    ]
    calibration = pd.DataFrame(calibration_rows(0.0, 10.1e9) + terms).assign(busbw_gbps=1.0, algbw_gbps=1.0)
    page = render_html(rows, "seed", calibration=calibration)
    assert "Calibration: the α–β model and the overlap terms" in page and "alt='calibration'" in page
    figures = r"<td>1\.2 \[1\.2, 1\.2\]</td><td>100(\.0)? \[100(\.0)?, 100(\.0)?\]</td><td>0\.2 \[0\.2, 0\.2\]</td>"
    assert re.search(figures + r"<td>2(\.0)? \[2(\.0)?, 2(\.0)?\]</td>", page)  # g, c (us), κ, λ
