"""Tier 1: the statistics behind every interval, on synthetic data with known answers."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from results.analysis import cells as analysis
from results.analysis import identity
from results.analysis.compare import compare
from results.analysis.uncertainty import bootstrap_median, interval, t_factor
from tests.seed_rows import row


def simulated_cell(rng, true_ms: float, repeats: int, between: float, within: float, steps: int = 30):
    """Repeats whose level varies run to run (`between`), steps that vary within a run (`within`)."""
    return [true_ms * (1 + rng.normal(0, between)) * (1 + rng.normal(0, within, steps)) for _ in range(repeats)]


@pytest.mark.parametrize(
    ("repeats", "between", "low", "high"), [(5, 0.05, 0.90, 0.99), (3, 0.05, 0.89, 0.99), (3, 0.0, 0.93, 1.0)]
)
def test_interval_of_the_median_covers_the_truth_about_95_percent_of_the_time(repeats, between, low, high):
    rng = np.random.default_rng(42)
    hits = 0
    for _ in range(200):
        lo, hi = interval(bootstrap_median(simulated_cell(rng, 100.0, repeats, between, 0.02), rng, 800))
        hits += lo <= 100.0 <= hi
    assert low <= hits / 200 <= high


def test_small_samples_widen_and_single_numbers_have_no_interval():
    assert t_factor(3) == pytest.approx(4.303 / 1.96, rel=1e-3) and t_factor(1000) == pytest.approx(1.0, abs=0.01)
    rng = np.random.default_rng(0)
    assert np.isnan(interval(bootstrap_median([np.array([5.0])], rng))).all()


def u_curve_rows(rng, means: dict[float, float], noise: float = 0.005) -> list[dict]:
    rows = []
    for bucket, ms in [(None, 100.0), *means.items()]:
        mode, world = ("single", 1) if bucket is None else ("ddp", 8)
        for k, times in enumerate(simulated_cell(rng, ms, 5, noise, noise)):
            rows.append(row(mode, world, float(np.median(times)), bucket=bucket, repeat=k, step_times_ms=list(times)))
    return rows


def test_u_curve_names_exactly_the_buckets_indistinguishable_from_the_best():
    means = {1.0: 152.7, 5.0: 150.0, 10.0: 147.2, 25.0: 147.0, 50.0: 147.1, 100.0: 155.3, 500.0: 172.0}
    curve = analysis.u_curve(pd.DataFrame(u_curve_rows(np.random.default_rng(3), means))).iloc[0]
    assert curve["best_bucket_cap_mb"] in (10.0, 25.0, 50.0)
    assert curve["indistinguishable_buckets_mb"] == [10.0, 25.0, 50.0]
    assert curve["best_step_ms_ci_lo"] < curve["best_step_ms"] < curve["best_step_ms_ci_hi"]
    assert curve["overlap_saved_ms_ci_lo"] < curve["overlap_saved_ms"] < curve["overlap_saved_ms_ci_hi"]
    assert curve["overlap_saved_ms_ci_lo"] > 20 and curve["overlap_saved_ms_ci_hi"] < 30  # 172 - 147 = 25
    assert curve["best_efficiency_ci_lo"] < curve["best_efficiency"] < curve["best_efficiency_ci_hi"]


def test_same_spec_twice_is_rarely_significant_and_a_real_difference_always_is():
    rng = np.random.default_rng(11)
    buckets = {float(b): 150.0 + b / 10 for b in range(1, 41)}  # 40 grid positions
    a = pd.DataFrame(u_curve_rows(rng, buckets, noise=0.03)).assign(cluster="a")
    b = pd.DataFrame(u_curve_rows(rng, buckets, noise=0.03)).assign(cluster="b")
    aa = compare(pd.concat([a, b]), "a", "b")
    assert aa["significant"].mean() <= 0.05  # the nominal false-positive rate at 95%
    slow = pd.DataFrame(u_curve_rows(rng, {k: v * 1.10 for k, v in buckets.items()}, noise=0.03)).assign(cluster="c")
    ab = compare(pd.concat([a, slow]), "a", "c")
    assert (ab["verdict"] == "slower").mean() >= 0.9 and (ab["ratio"] > 1).all()


def rounds_with_control(controls: list[float], rel_ci: float = 0.01) -> pd.DataFrame:
    rows = []
    for rnd, control in enumerate(controls):
        for bucket in (1.0, 25.0):
            extra = {"round": rnd, "group_id": "g1", "control_step_ms": control, "control_rel_ci": rel_ci}
            rows.append(row("ddp", 8, 150.0 + bucket, bucket=bucket, repeat=rnd, step_times_ms=[150.0] * 5, **extra))
    return pd.DataFrame(rows)


def test_a_round_whose_control_moved_is_flagged_and_kept():
    quiet = rounds_with_control([100.0, 101.0, 99.5, 100.5])
    assert not analysis.drifted_rounds(quiet).any()
    disturbed = rounds_with_control([100.0, 131.0, 99.5, 100.5])  # round 1 measured during interference
    flags = analysis.drifted_rounds(disturbed)
    assert list(disturbed.loc[flags, "round"].unique()) == [1]
    assert (analysis.ok_cells(disturbed)["n_repeats"] == 4).all()  # a diagnostic: round 1 stays
    noisy_control = rounds_with_control([100.0, 131.0, 99.5, 100.5], rel_ci=0.2)  # moved within its own noise
    assert not analysis.drifted_rounds(noisy_control).any()
    assert not analysis.drifted_rounds(rounds_with_control([100.0, 131.0])).any()  # 2 rounds: cannot tell


def test_a_row_far_noisier_than_its_group_is_flagged():
    rows = pd.DataFrame([row("ddp", 8, 150.0, bucket=float(b), group_id="g", cv=0.01) for b in range(1, 8)])
    rows.loc[3, "step_ms_cv"] = 0.2
    assert list(analysis.noisy_rows(rows)) == [i == 3 for i in range(7)]


def test_error_rows_are_never_noisy_and_do_not_upset_the_flags():
    rows = pd.DataFrame([row("ddp", 8, 150.0, bucket=float(b), group_id="g", cv=0.01) for b in range(1, 5)])
    rows.loc[1, ["status", "step_ms_cv"]] = ["error", None]
    assert not analysis.noisy_rows(rows).any()


def test_error_bars_survive_an_interval_that_misses_its_point_estimate():
    import matplotlib.pyplot as plt

    from results.render.plots import errorbar

    fig, ax = plt.subplots()
    errorbar(ax, [1, 2, 3], [1.0, 2.0, 3.0], [1.1, np.nan, 2.5], [1.5, np.nan, 3.5])  # lo above the point; NaN
    assert ax.containers[0].lines[0].get_ydata().tolist() == [1.0, 2.0, 3.0]
    plt.close(fig)


def group_rounds(rng, slowdown: float, rounds: int, round_cv: float, group_ids: bool = True) -> pd.DataFrame:
    """Two cells of one group measured in the same rounds; each round moves both by a common factor
    (interference) and each measurement by a little of its own; bucket 5 is `slowdown` slower."""
    rows = []
    for rnd in range(rounds):
        common = np.exp(rng.normal(0, round_cv))
        for bucket, factor in ((1.0, 1.0), (5.0, 1.0 + slowdown)):
            times = 100.0 * factor * common * np.exp(rng.normal(0, 0.003)) * (1 + rng.normal(0, 0.01, 20))
            group = "g" if group_ids else f"g{rnd}{bucket}"
            extra = {"round": rnd, "group_id": group, "sweep_id": "s"}
            rows.append(
                row("ddp", 8, float(np.median(times)), bucket=bucket, repeat=rnd, step_times_ms=list(times), **extra)
            )
    return pd.DataFrame(rows)


def ratio_interval(rows: pd.DataFrame) -> tuple[float, float]:
    cells = analysis.ok_cells(rows).set_index("bucket_cap_mb")
    return interval(cells.loc[5.0, "step_ms_reps"] / cells.loc[1.0, "step_ms_reps"])


def test_cells_of_one_group_are_compared_round_by_round_and_across_groups_unpaired():
    rng = np.random.default_rng(5)
    rows = group_rounds(rng, 0.04, rounds=5, round_cv=0.10)  # 10% round-to-round swings, a 4% difference
    paired = ratio_interval(rows)
    assert paired[0] > 1.0 and paired[1] < 1.08  # resolved: the swings cancel in the ratio
    unpaired = ratio_interval(rows.assign(group_id=[f"g{i}" for i in range(len(rows))]))
    assert unpaired[0] < 1.0 < unpaired[1]  # the same numbers, as if measured in different groups: not resolved
    assert unpaired[1] - unpaired[0] > 3 * (paired[1] - paired[0])


def test_same_cells_in_the_same_rounds_are_rarely_told_apart():
    rng = np.random.default_rng(8)
    resolved = 0
    for _ in range(60):
        lo, hi = ratio_interval(group_rounds(rng, 0.0, rounds=4, round_cv=0.10))
        resolved += not (lo <= 1.0 <= hi)
    assert resolved <= 60 * 0.08  # about the nominal 5%


def test_the_smallest_resolvable_difference_shrinks_with_rounds_and_says_what_2_percent_needs():
    rng = np.random.default_rng(2)
    few = analysis.u_curve(group_rounds(rng, 0.0, rounds=3, round_cv=0.05, group_ids=False)).iloc[0]
    many = analysis.u_curve(group_rounds(rng, 0.0, rounds=12, round_cv=0.05, group_ids=False)).iloc[0]
    assert few["min_resolvable_rel"] > 2 * many["min_resolvable_rel"] > 0.02  # unpaired: 5% swings stay
    assert many["rounds_for_target"] > 12 and few["rounds_for_target"] > 3
    assert 0.8 < many["round_var_share"] <= 1.0  # the swings are between rounds: more steps would not help
    blocked = analysis.u_curve(group_rounds(rng, 0.0, rounds=3, round_cv=0.05)).iloc[0]
    assert blocked["min_resolvable_rel"] < few["min_resolvable_rel"] / 3


def test_the_summary_names_what_each_curve_can_resolve_and_keeps_a_drifted_round():
    from sweeps.driver.summary import summary_text

    rows = rounds_with_control([100.0, 131.0, 99.5, 100.5])
    rows["step_times_ms"] = [list(150.0 + b + np.arange(5.0)) for b in rows["bucket_cap_mb"]]
    baseline = row("single", 1, 100.0, step_times_ms=[100.0, 101.0, 99.0], group_id="g0", round=0)
    text = summary_text(pd.concat([rows, pd.DataFrame([baseline])], ignore_index=True).pipe(identity.with_knobs))
    assert "min_resolvable_rel" in text and "2% would take" in text
    assert "drift: 2 measurement(s) in 1 round(s)" in text and "(kept:" in text
