"""The overlap model (results.model.overlap) on hand-made profiles whose answers are worked out by hand in the comments:
no torch, no Ray."""

from __future__ import annotations

import pytest

from results.model import overlap
from results.model.overlap import Profile

# gradients 0..3 of 100, 200, 300, 400 bytes, ready in reverse order at 6, 4, 2 and 1 ms into an 8 ms backward
PROFILE = Profile(
    forward_ms=5.0,
    backward_ms=8.0,
    optimizer_ms=1.0,
    ready_ms=(6.0, 4.0, 2.0, 1.0),
    nbytes=(100, 200, 300, 400),
    order=(3, 2, 1, 0),
)


def t(nbytes: int) -> float:
    return 1.0 + nbytes / 100  # ms: alpha 1 ms, 100 bytes per ms


def test_buckets_fill_in_ready_order_and_close_once_they_reach_their_limit():
    assert overlap.bucket_layout(PROFILE.order, PROFILE.nbytes, 450) == [[3, 2], [1, 0]]  # 700 >= 450, then 300
    assert overlap.bucket_layout(PROFILE.order, PROFILE.nbytes, 1) == [[3], [2], [1], [0]]
    assert overlap.bucket_layout(PROFILE.order, PROFILE.nbytes, 10_000) == [[3, 2, 1, 0]]
    assert overlap.bucket_layout(PROFILE.order, PROFILE.nbytes, 450, first_bytes=100) == [[3], [2, 1], [0]]


def test_two_buckets_overlap_the_backward_one_collective_at_a_time():
    # bucket [3, 2]: 700 B, ready at 2, runs 2..10; bucket [1, 0]: 300 B, ready at 6, waits for the first: 10..14
    step = overlap.predict_step(PROFILE, [[3, 2], [1, 0]], t)
    assert step.timeline == ((2.0, 2.0, 10.0), (6.0, 10.0, 14.0))
    assert step.step_ms == 5 + max(8, 14) + 1 == 20  # forward + max(backward, last end) + optimizer
    assert (step.comm_ms, step.exposed_ms) == (12.0, 6.0)


def test_gradient_accumulation_syncs_every_micro_step_unless_no_sync():
    buckets = [[3, 2], [1, 0]]
    assert overlap.predict_step(PROFILE, buckets, t, gas=3).step_ms == 3 * 19 + 1  # 58: every micro-step synced
    assert overlap.predict_step(PROFILE, buckets, t, gas=3, no_sync=True).step_ms == 19 + 2 * 13 + 1  # 46


def test_the_u_curve_has_its_minimum_between_many_small_buckets_and_one_large_one():
    # cap 1: four buckets, 1..6, 6..9, 9..13, 13..15 -> 5 + 15 + 1; one bucket: ready 6, 6..17 -> 5 + 17 + 1
    steps = {
        cap: overlap.predict_step(PROFILE, overlap.bucket_layout(PROFILE.order, PROFILE.nbytes, cap), t).step_ms
        for cap in (1, 450, 10_000)
    }
    assert steps == {1: 21.0, 450: 20.0, 10_000: 23.0}


def test_a_half_precision_hook_sends_half_the_bytes():
    # 350 B and 150 B: 2..6.5 and 6.5..9 -> 5 + max(8, 9) + 1
    assert overlap.predict_step(PROFILE, [[3, 2], [1, 0]], t, hook="fp16").step_ms == 15.0


def test_the_slowdown_scales_compute_and_is_recovered_from_measurements():
    # compute x2: ready at 4 and 12; 4..12, 12..16 -> 10 + max(16, 16) + 2
    assert overlap.predict_step(PROFILE, [[3, 2], [1, 0]], t, slowdown=2.0).step_ms == 28.0
    layouts = [overlap.bucket_layout(PROFILE.order, PROFILE.nbytes, cap) for cap in (1, 450, 10_000)]

    def predict(s: float):
        import numpy as np

        return np.array([overlap.predict_step(PROFILE, b, t, slowdown=s).step_ms for b in layouts])

    assert overlap.fit_slowdown(predict, predict(2.0)) == pytest.approx(2.0, rel=1e-9)


def curve(tt, terms=overlap.NO_TERMS) -> dict[int, float]:
    """Step ms at caps 1 (four buckets), 450 (two) and 10 000 (one)."""
    layout = {cap: overlap.bucket_layout(PROFILE.order, PROFILE.nbytes, cap) for cap in (1, 450, 10_000)}
    return {cap: overlap.predict_step(PROFILE, b, tt, terms=terms).step_ms for cap, b in layout.items()}


def test_the_left_arm_comes_from_the_per_bucket_cost_alone():
    def slow(nbytes: int) -> float:
        return 0.1 + nbytes / 200  # ms: one bucket's 1000 B take 5.1 ms, exposed after the backward

    # c = 0: four buckets 1..3.1, 3.1..4.7, 4.7..5.8, 6..6.6 and two 2..5.6, 6..7.6 all hide in the 8 ms backward
    assert curve(slow) == pytest.approx({1: 14.0, 450: 14.0, 10_000: 17.1})  # no left arm
    # c = 0.5 ms per bucket: four buckets launched at 1.5, 3, 5.5, 8 and the backward ends at 8 + 4c = 10 (the
    # last ends 8.6); two at 2.5 (..6.1) and 7 (..8.6), backward 9; one at 6.5, 6.5..11.6 against a backward of 8.5
    terms = overlap.Terms(bucket_ms=0.5)
    assert curve(slow, terms) == pytest.approx({1: 16.0, 450: 15.0, 10_000: 17.6})  # a U: 16 > 15 < 17.6


def test_compute_slows_while_a_collective_is_in_flight():
    def fast(nbytes: int) -> float:
        return 0.1 + nbytes / 1000  # ms: every layout hides behind the backward

    # κ = 1: compute runs at half rate inside the collectives' intervals, so the backward is longer by half the
    # communication it overlaps. Four buckets: 1..1.5, 2.25..2.65, 4.45..4.75, 6.6..6.8 (1.4 ms of collectives),
    # backward 8 + 0.7 = 8.7; one bucket: 6..7.1 (1.1 ms), backward 8 + 0.55 = 8.55
    assert curve(fast) == pytest.approx({1: 14.0, 450: 14.0, 10_000: 14.0})
    step = overlap.predict_step(PROFILE, [[3], [2], [1], [0]], fast, terms=overlap.Terms(contention=1.0))
    assert [round(x, 9) for x in step.timeline[1]] == [2.25, 2.25, 2.65]
    assert step.step_ms == pytest.approx(5 + 8.7 + 1) and step.exposed_ms == 0.0
    assert curve(fast, overlap.Terms(contention=1.0))[10_000] == pytest.approx(5 + 8.55 + 1)


def test_a_collective_slows_while_the_backward_computes():
    # λ = 1: bucket [3, 2] (8 ms alone) starts at 2 beside 6 ms of compute: 6 ms at half rate (3 ms of it done),
    # then 5 ms at full rate: 2..13; bucket [1, 0] (4 ms) starts after it, the backward over: 13..17
    step = overlap.predict_step(PROFILE, [[3, 2], [1, 0]], t, terms=overlap.Terms(comm_contention=1.0))
    assert step.timeline == ((2.0, 2.0, 13.0), (6.0, 13.0, 17.0)) and step.step_ms == 5 + 17 + 1
    # κ = λ = 1, both sides share: over [2, 14) both run at half rate (6 ms of compute, 6 of the collective), its
    # last 2 ms alone: 2..16; bucket [1, 0] is ready at 10 (compute at half rate from 2): 16..20; backward to 14
    both = overlap.Terms(contention=1.0, comm_contention=1.0)
    step = overlap.predict_step(PROFILE, [[3, 2], [1, 0]], t, terms=both)
    assert [tuple(round(x, 9) for x in b) for b in step.timeline] == [(2.0, 2.0, 16.0), (10.0, 16.0, 20.0)]
    assert step.step_ms == pytest.approx(5 + 20 + 1)
    # one bucket (11 ms alone), ready at 6 beside 2 ms of compute (4 wall ms at half rate): 6..19, backward to 10;
    # overlapping two buckets with the backward bought nothing (26 against 25): both sides shared the cores
    assert overlap.predict_step(PROFILE, [[3, 2, 1, 0]], t, terms=both).step_ms == pytest.approx(5 + 19 + 1)


def test_the_group_scales_compute_as_a_measured_slowdown_would():
    # g = 2: the same step as the slowdown test's compute x2 (10 + max(16, 16) + 2), and the two multiply
    assert overlap.predict_step(PROFILE, [[3, 2], [1, 0]], t, terms=overlap.Terms(compute=2.0)).step_ms == 28.0
    both = overlap.predict_step(PROFILE, [[3, 2], [1, 0]], t, slowdown=0.5, terms=overlap.Terms(compute=2.0))
    assert both.step_ms == overlap.predict_step(PROFILE, [[3, 2], [1, 0]], t).step_ms == 20.0


def test_terms_are_finite_and_not_negative():
    with pytest.raises(ValueError, match="bucket_ms"):
        overlap.Terms(bucket_ms=-1.0)
    with pytest.raises(ValueError, match="contention"):
        overlap.Terms(contention=float("nan"))
    with pytest.raises(ValueError, match="comm_contention"):
        overlap.Terms(comm_contention=-0.5)
    with pytest.raises(ValueError, match="compute"):
        overlap.Terms(compute=0.0)


def test_accuracy_of_a_curve():
    acc = overlap.accuracy([21, 20, 23], [22, 21, 25], best_set={1})
    assert acc["median_abs_error"] == pytest.approx(1 / 21)  # |20/21 - 1|, the middle of 1/22, 1/21, 2/25
    assert acc["spearman"] == 1.0 and acc["predicted_best"] == 1 and acc["predicted_best_in_set"] is True
    assert overlap.spearman([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)
    assert overlap.spearman([1, 1], [2, 3]) is None


def test_a_profile_must_cover_its_parameters_once():
    with pytest.raises(ValueError, match="same parameters"):
        Profile(forward_ms=1, backward_ms=1, optimizer_ms=1, ready_ms=(1.0,), nbytes=(4, 4), order=(0, 1))
