"""Tier 1: racing and automatic rounds — the rules on simulated rounds, and the trial's round planner."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from results.analysis.racing import Rule, eliminated, resolved
from sweeps.plan.grid import expand, plan_groups
from sweeps.spec.sweep import SpecError, SweepSpec
from sweeps.trial.rounds import RoundPlanner


def round_rows(rng, slow: dict[str, float], rounds: range, round_cv: float, step_cv: float = 0.02) -> list[dict]:
    """Rows of one group: every cell once per round, a common per-round factor, and a little of their own."""
    rows = []
    for r in rounds:
        common = np.exp(rng.normal(0, round_cv))
        for cell, factor in slow.items():
            own = np.exp(rng.normal(0, round_cv / 2))
            times = 100.0 * (1 + factor) * common * own * (1 + rng.normal(0, step_cv, 20))
            rows.append(
                {
                    "cell_id": cell,
                    "repeat": r,
                    "round": r,
                    "status": "ok",
                    "cluster": "c",
                    "sweep_id": "s",
                    "group_id": "g",
                    "gas": 1,
                    "step_times_ms": list(times),
                    "step_ms": float(np.median(times)),
                }
            )
    return rows


def race(rng, slow: dict[str, float], rule: Rule, round_cv: float) -> dict[str, int]:
    """One simulated race: {cell: the round after which it was dropped}."""
    alive, dropped, rows = set(slow), {}, []
    rivals = {c: len(slow) - 1 for c in slow}
    for r in range(rule.max_rounds):
        rows += round_rows(rng, {c: slow[c] for c in alive}, range(r, r + 1), round_cv)
        if r + 1 in rule.looks_at:
            for c in eliminated(pd.DataFrame([x for x in rows if x["cell_id"] in alive]), rule, rivals, seed=r):
                alive.discard(c)
                dropped[c] = r
    return dropped


def test_a_race_of_equal_cells_rarely_drops_one_and_drops_a_slower_one():
    rng = np.random.default_rng(4)
    rule = Rule(race=True, min_rounds=3, max_rounds=8, tolerance=0.02)
    equal = sum(bool(race(rng, dict.fromkeys("abcd", 0.0), rule, 0.02)) for _ in range(15))
    assert equal <= 1  # the Bonferroni schedule keeps it under 5% of races (benchmarks/race_check.py: 200)
    slower = [race(rng, {"a": 0.0, "b": 0.0, "c": 0.10, "d": 0.0}, rule, 0.02) for _ in range(10)]
    assert sum("c" in d for d in slower) >= 9
    assert all(set(d) <= {"c"} for d in slower)  # never an equal one
    assert np.median([d["c"] for d in slower if "c" in d]) <= 5


def test_resolved_means_every_cell_told_apart_from_the_leader_or_within_the_target():
    rng = np.random.default_rng(1)
    rule = Rule(auto=True, target_rel=0.05)
    apart = pd.DataFrame(round_rows(rng, {"a": 0.0, "b": 0.3}, range(4), 0.01))
    assert resolved(apart, rule)
    close = pd.DataFrame(round_rows(rng, {"a": 0.0, "b": 0.001}, range(6), 0.005, step_cv=0.005))
    assert resolved(close, rule)  # within ±5% of each other: equal for this target
    unclear = pd.DataFrame(round_rows(rng, {"a": 0.0, "b": 0.03}, range(3), 0.08))
    assert not resolved(unclear, rule)


def test_the_race_check_splits_its_noise_into_shared_own_and_step_levels():
    """benchmarks/race_check.py simulates from measured noise: a round's shared level (cancels when paired),
    each measurement's own level beyond its steps, and the steps; planted sizes come back from rows."""
    path = Path(__file__).resolve().parent.parent / "benchmarks" / "race_check.py"
    module_spec = importlib.util.spec_from_file_location("race_check", path)
    race_check = importlib.util.module_from_spec(module_spec)
    sys.modules["race_check"] = race_check  # its dataclass looks its module up there
    module_spec.loader.exec_module(race_check)
    rng, rows = np.random.default_rng(7), []
    for r in range(40):
        shared = rng.normal(0, 0.10)
        for cell in "abc":
            times = 50.0 * np.exp(shared + rng.normal(0, 0.05) + rng.normal(0, 0.02, 40))
            rows.append({"cell_id": cell, "group_id": "g", "round": r, "mode": "ddp", "status": "ok"})
            rows[-1] |= {"injected_slowdown": None, "step_times_ms": times, "step_ms": float(np.median(times))}
    noise = race_check.measured_noise(pd.DataFrame(rows))
    assert noise.steps_per == 40 and abs(noise.steps.std() - 0.02) < 0.003
    assert 0.07 < noise.round_sd < 0.13  # the unpaired spread would be ~0.11 in cell_sd
    assert 0.035 < noise.cell_sd < 0.065
    exact, bonferroni = race_check.joint_boundary(Rule(race=True, min_rounds=3, max_rounds=24), paths=20_000)
    assert abs(bonferroni - 3.197) < 0.001 and 2.9 < exact < bonferroni  # Bonferroni is safe, and close


def spec(**kw) -> SweepSpec:
    return SweepSpec(name="r", bucket_cap_mb=[0.05, 0.25, 25], use_gpu=False, backend="gloo", **kw)


def planner_for(s: SweepSpec) -> RoundPlanner:
    from sweeps.plan.planner import SweepPlan

    cells = [c for c in expand(s) if c.step.mode == "ddp"]
    plan = SweepPlan(s, "s", "c", None, cells, [(c, r) for c in cells for r in range(s.rounds)])
    (group,) = plan_groups(plan.todo, sweep_id="s")
    return RoundPlanner(group, plan.rule())


def test_the_planner_sends_min_rounds_then_one_round_per_look_and_stamps_the_dropped():
    p = planner_for(spec(repeats=5, search="race", min_rounds=2, tolerance=0.02))
    first = p.first_rounds()
    assert [len(keys) for keys in first] == [3, 3] and {k[1] for k in first[1]} == {1}
    slow = sorted(p.alive)[0]
    rng = np.random.default_rng(0)
    sent: list = []
    for r in range(5):
        keys = first[r] if r < 2 else sent[-1]
        for cell, repeat in keys:
            factor = 0.5 if cell == slow else 0.0
            (row,) = round_rows(rng, {cell: factor}, range(repeat, repeat + 1), 0.01)
            out, messages = p.on_row(row)
            sent += messages
        if sent and sent[-1] == []:
            break
    assert p.rule.looks_at == (2, 3, 5)
    assert p.eliminated_at[slow] in (1, 2, 4)  # dropped at a look: after round 2 (index 1) at the earliest
    assert all(slow not in {k[0] for k in keys} for keys in sent[p.eliminated_at[slow] - 1 :])
    assert sent[-1] == [] and p.finished and "max_rounds" in p.reason


def test_rows_of_a_looked_at_round_are_held_until_the_look():
    p = planner_for(spec(repeats=4, search="race", min_rounds=2))
    first, looked_at = p.first_rounds()
    rng = np.random.default_rng(0)
    before = [p.on_row(round_rows(rng, {c: 0.0}, range(r, r + 1), 0.01)[0]) for c, r in first]
    assert [len(rows) for rows, _ in before] == [1, 1, 1]  # no look follows round 1: each row at once
    out = [p.on_row(round_rows(rng, {c: 0.0}, range(r, r + 1), 0.01)[0]) for c, r in looked_at]
    assert [len(rows) for rows, _ in out] == [0, 0, 3]  # released together, after the round's look
    assert all("eliminated_at_round" in row for row in out[-1][0]) and out[-1][1][0]  # and the next round sent


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"repeats": "many"}, "repeats"),
        ({"search": "bandit"}, "search"),
        ({"tolerance": 0}, "tolerance"),
        ({"target_rel": 2}, "target_rel"),
        ({"search": "race", "repeats": 2, "min_rounds": 3}, "min_rounds"),
        ({"repeats": "auto", "isolation": "cell"}, "isolation"),
        ({"repeats": "auto", "max_sweep_s": -1}, "max_sweep_s"),
        ({"env": {"DDPSWEEP_SLOWDOWN": "abc=0.5"}}, "env"),
    ],
)
def test_decision_settings_are_checked_by_name(fields, field):
    with pytest.raises(SpecError) as e:
        spec(**fields)
    assert e.value.field.startswith(field)


def test_auto_plans_max_rounds_and_looks_on_a_geometric_schedule():
    s = spec(repeats="auto", max_rounds=6)
    assert s.rounds == 6 and s.decides and planner_for(s).rule.auto
    assert Rule(min_rounds=3, max_rounds=24).looks_at == (3, 5, 8, 12, 18, 24)  # 6 looks, not 22
    assert Rule(min_rounds=3, max_rounds=8).level(3) == pytest.approx(0.05 / 9)


def test_each_cell_gets_the_first_ranks_of_each_node_of_the_host_group():
    from sweeps.plan.grid import host_cell
    from sweeps.worker.ranks import Unplaceable, ranks_for

    s = SweepSpec(name="t", topology=["1x1", "1x2", "2x1", "2x2"], bucket_cap_mb=[25], use_gpu=False, backend="gloo")
    cells = {c.topology if c.step.mode == "ddp" else "single": c for c in expand(s)}
    assert host_cell([cells["1x1"], cells["1x2"], cells["single"]]).world_size == 2
    assert host_cell([cells["2x1"], cells["2x2"]]).world_size == 4
    two_nodes = [{"node": n} for n in ("a", "b", "a", "b")]  # ranks need not be packed node by node
    assert ranks_for(cells["2x1"], two_nodes) == (0, 1) and ranks_for(cells["2x2"], two_nodes) == (0, 1, 2, 3)
    assert ranks_for(cells["single"], two_nodes) == (0,)
    one_node = [{"node": "a"}, {"node": "a"}]
    assert ranks_for(cells["1x2"], one_node) == (0, 1) and ranks_for(cells["1x1"], one_node) == (0,)
    with pytest.raises(Unplaceable, match="needs 2"):  # cannot be formed: an error row says why
        ranks_for(cells["2x1"], one_node)
    uneven = [{"node": "a"}, {"node": "a"}, {"node": "b"}]
    with pytest.raises(Unplaceable, match=r"holds 1 rank\(s\); topology 2x2 needs 2"):
        ranks_for(cells["2x2"], uneven)
    groups = plan_groups([(c, 0) for c in cells.values()], sweep_id="t", isolation="sweep")
    assert sorted(g.first.world_size for g in groups) == [2, 4]  # one worker group per node count


def test_a_resumed_race_looks_at_every_round_it_has():
    """--resume of a race killed after 3 of 6 rounds: its group carries the stored rows, so the first look after
    the resume weighs all 4 rounds of each cell (it used the resumed round alone)."""
    from dataclasses import replace

    s = spec(repeats=6, search="race", min_rounds=3, tolerance=0.02)
    cells = [c for c in expand(s) if c.step.mode == "ddp"]
    slow = cells[0].cell_id
    rng = np.random.default_rng(3)
    prior = [
        row | {"group_id": "g"}
        for c in cells
        for row in round_rows(rng, {c.cell_id: 0.3 if c.cell_id == slow else 0.0}, range(3), 0.01)
    ]
    (group,) = plan_groups([(c, r) for c in cells for r in range(3, 6)], sweep_id="s")
    from sweeps.plan.planner import SweepPlan

    rule = SweepPlan(s, "s", "c", None, cells, []).rule()
    p = RoundPlanner(replace(group, prior=tuple(prior)), rule)
    assert p.offset == 3 and rule.looks_at[:2] == (3, 5)
    (first,) = p.first_rounds()  # three rounds already stored: one more, then the look at 5
    assert {k[1] for k in first} == {3}
    looked = []
    for keys in [first]:
        for cell, repeat in keys:
            (row,) = round_rows(rng, {cell: 0.3 if cell == slow else 0.0}, range(repeat, repeat + 1), 0.01)
            looked += p.on_row(row | {"group_id": "g"})[1]
    (second,) = [m for m in looked if m]
    for cell, repeat in second:
        (row,) = round_rows(rng, {cell: 0.3 if cell == slow else 0.0}, range(repeat, repeat + 1), 0.01)
        p.on_row(row | {"group_id": "g"})
    assert sum(r["cell_id"] == slow for r in p.ok_rows) == 5  # every stored round of the slow cell, and the new
    assert p.eliminated_at == {slow: 4}  # dropped at the look after its fifth round
