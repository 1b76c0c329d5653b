"""`timing: sync | events | loop`: how timed steps are timed, on CPU (events falls back to sync and says so)."""

from __future__ import annotations

import dataclasses
import re
import threading
import time

import pandas as pd
import pytest
import torch

from results.analysis import cells as analysis
from sweeps.plan.grid import expand
from sweeps.spec.sweep import SpecError, SweepSpec
from tests.dist_helpers import run_world
from tests.seed_rows import row
from trainers.config import StepConfig
from trainers.errors import ConfigError
from trainers.step import run_cell
from trainers.timing import slowed, time_loop, time_steps

CPU = torch.device("cpu")
BASE = StepConfig(model="tiny", micro_batch=4, seq_len=32, warmup_steps=1, timed_steps=4)


def sleeper(ms: float, calls: list[int]):
    def step() -> None:
        calls.append(1)
        time.sleep(ms / 1e3)

    return step


def test_a_planted_slowdown_stays_its_fraction_when_ranks_wait_for_each_other():
    """Two threads meet at a barrier in every step, as DDP ranks meet at the all-reduce; one starts 20 ms late.
    A sleep of a fraction of a step's own time compounds (the waiting rank sleeps for its peer's sleep: the
    skew grows by the fraction each step, 20 -> 60 -> 180 -> 540 ms at +300%); of the fastest step, it holds."""
    fraction, work, steps = 3.0, 0.02, 5  # s
    barrier = threading.Barrier(2)
    totals: dict[int, list[float]] = {0: [], 1: []}

    def rank(r: int) -> None:
        step = slowed(lambda: (time.sleep(work), barrier.wait()), fraction, lambda: None)
        time.sleep(0.02 * r)
        for _ in range(steps):
            t0 = time.perf_counter()
            step()
            totals[r].append(time.perf_counter() - t0)

    threads = [threading.Thread(target=rank, args=(r,)) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for r in (0, 1):
        assert max(totals[r][-2:]) < 2 * (1 + fraction) * work, totals  # (1 + fraction) x work, not 10x that


def test_loop_is_one_mean_over_every_call_and_sync_one_time_per_call():
    calls: list[int] = []
    syncs: list[int] = []
    (mean,) = time_loop(sleeper(10, calls), 6, lambda: syncs.append(1))
    assert len(calls) == 6 and len(syncs) == 2  # synchronized once before and once after the whole loop
    assert 10 <= mean < 1000  # ms: a sleep of 10 ms never returns early
    calls.clear()
    syncs.clear()
    times = time_steps(sleeper(10, calls), 6, lambda: syncs.append(1))
    assert len(times) == 6 == len(calls) and len(syncs) == 12 and min(times) >= 10


def two_timings(rank: int, cfgs: list[StepConfig]):
    return [run_cell(c, CPU, num_threads=1) for c in cfgs]


def test_events_fall_back_to_sync_on_cpu_and_loop_reports_one_mean(tmp_path):
    events, loop = dataclasses.replace(BASE, timing="events"), dataclasses.replace(BASE, timing="loop")
    (m_events, m_loop), rank1 = run_world(two_timings, 2, tmp_path, [events, loop])
    assert rank1 == [None, None]
    assert m_events.timing_used == "sync" and "events need CUDA" in m_events.timing_note
    assert len(m_events.step_times_ms) == 4 == m_events.timed_steps_run and m_events.step_ms_cv is not None
    assert m_loop.timing_used == "loop" and "no per-step times" in m_loop.timing_note
    assert m_loop.step_times_ms == [m_loop.step_ms] and m_loop.timed_steps_run == 4 and m_loop.step_ms_cv is None
    assert m_loop.replicas_in_sync and m_loop.step_ms > 0


@pytest.mark.parametrize(
    ("changes", "fix"),
    [
        ({"timing": "cuda"}, "one of sync, events, loop"),
        ({"timing": "loop", "target_rel_ci": 0.05}, "needs per-step times"),
    ],
)
def test_timing_that_cannot_work_is_refused_naming_the_field(changes, fix):
    with pytest.raises(ConfigError) as e:
        dataclasses.replace(BASE, **changes)
    assert e.value.field == "timing" and fix in str(e.value)


def spec(**kw) -> SweepSpec:
    return SweepSpec(name="t", model="tiny", workers=[2], bucket_cap_mb=[1, 25], gas=[1], **kw)


def test_timing_crosses_every_cell_and_the_default_keeps_the_old_ids():
    plain = expand(spec())
    both = expand(spec(timing=["sync", "loop"]))
    assert len(both) == 2 * len(plain) == 6
    assert {(c.step.mode, c.step.timing) for c in both} >= {("single", "sync"), ("single", "loop")}
    sync_ids = {c.cell_id for c in both if c.step.timing == "sync"}
    assert sync_ids == {c.cell_id for c in plain}  # the default stays out of the cell id
    assert not sync_ids & {c.cell_id for c in both if c.step.timing == "loop"}
    with pytest.raises(SpecError) as e:
        spec(timing=["wall"])
    assert e.value.field.startswith("timing")


def test_each_timing_is_compared_with_its_own_baseline():
    def at(mode, world, ms, timing, bucket=None):
        r = row(mode, world, ms, bucket=bucket, cluster="c", timing=timing)
        return r | {"cell_id": f"{r['cell_id']}-{timing}"}

    rows = pd.DataFrame(
        [at("single", 1, 100.0, "sync"), at("single", 1, 90.0, "loop")]
        + [at("ddp", 2, 125.0, "sync", 25.0), at("ddp", 2, 100.0, "loop", 25.0)]
    )
    table = analysis.with_baseline(rows).set_index("timing")
    assert table.loc["sync", "baseline_step_ms"] == 100.0 and table.loc["loop", "baseline_step_ms"] == 90.0
    assert table.loc["sync", "efficiency"] == pytest.approx(0.8) and table.loc["loop", "efficiency"] == pytest.approx(
        0.9
    )


def curve_row(mode: str, ms: float, timing: str = "sync", hook: str = "none", bucket: float | None = None) -> dict:
    r = row(mode, 1 if mode == "single" else 2, ms, bucket=bucket, timing=timing, comm_hook=hook, round=0)
    return r | {"cell_id": f"{r['cell_id']}-{timing}-{hook}", "group_id": "g0", "step_times_ms": [ms, ms]}


MIXED = [curve_row("single", 100.0), curve_row("single", 90.0, "loop"), curve_row("ddp", 125.0, bucket=25.0)]
MIXED += [curve_row("ddp", 110.0, hook="fp16", bucket=25.0), curve_row("ddp", 100.0, "loop", bucket=25.0)]


def test_the_summary_gives_each_timing_and_hook_its_own_curve():
    from sweeps.driver.summary import summary_text

    lines = [x for x in summary_text(pd.DataFrame(MIXED)).splitlines() if x.startswith("ddp ")]
    named = {x.split(":")[0]: x for x in lines}
    assert sorted(named) == [
        "ddp workers=2 timing=loop gas=1 no_sync=false comm_hook=none",
        "ddp workers=2 timing=sync gas=1 no_sync=false comm_hook=fp16",
        "ddp workers=2 timing=sync gas=1 no_sync=false comm_hook=none",
    ]
    assert "25MB:125.0" in named["ddp workers=2 timing=sync gas=1 no_sync=false comm_hook=none"]
    assert "25MB:110.0" in named["ddp workers=2 timing=sync gas=1 no_sync=false comm_hook=fp16"]
    assert "(baseline 90.0 ms)" in named["ddp workers=2 timing=loop gas=1 no_sync=false comm_hook=none"]


def test_the_u_curve_figure_draws_and_labels_each_curve_apart():
    from results.render import plots

    (ax,) = plots.u_curve_figure(pd.DataFrame(MIXED)).axes
    labels = [t.get_text() for t in ax.get_legend().get_texts() if "ranks" in t.get_text()]
    assert sorted(labels) == [
        "2 ranks, no_sync=False, comm_hook=fp16, timing=sync",
        "2 ranks, no_sync=False, comm_hook=none, timing=loop",
        "2 ranks, no_sync=False, comm_hook=none, timing=sync",
    ]
    assert sorted(len(line.get_xdata()) for line in ax.get_lines() if line.get_marker() == "o") == [1, 1, 1]


KNOB_SETS = ("comm_hook=fp16 timing=loop", "comm_hook=fp16", "timing=loop")


def test_the_dry_run_table_names_the_knobs_a_cell_sets():
    from sweeps.driver.summary import cells_table

    plain = cells_table(expand(spec())).splitlines()
    timed = cells_table(expand(spec(timing=["sync", "loop"], comm_hook=["none", "fp16"]))).splitlines()
    assert not plain[0].endswith("knobs") and timed[0].endswith("knobs")
    ends = [next((k for k in KNOB_SETS if line.endswith(k)), "") for line in timed[1:-1]]
    assert (
        sorted(ends)
        == ["", "", "", "comm_hook=fp16", "comm_hook=fp16", *["comm_hook=fp16 timing=loop"] * 2] + ["timing=loop"] * 3
    )
    assert timed[-1].startswith("10 cells x 1 repeat(s) = 10 measurements")


def test_the_u_curve_figure_has_a_series_per_curve_named_apart():
    from results.render import plots

    svg = plots.svg(plots.u_curve_figure(pd.DataFrame(MIXED)), "u_curve")
    names = re.findall(r'class="series" data-series="([^"]*)"', svg)
    assert sorted(names) == [
        "2 ranks, no_sync=False, comm_hook=fp16, timing=sync",
        "2 ranks, no_sync=False, comm_hook=none, timing=loop",
        "2 ranks, no_sync=False, comm_hook=none, timing=sync",
    ]
    assert svg.count('class="point"') == 3
