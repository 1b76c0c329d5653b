"""One configuration identity: for every knob of the table (trainers.knobs), two configurations that differ only
in that knob are never pooled into one cell and never paired — by the analyses, compare, recommend, racing,
scaling, the views or the summary. The test walks the table, so a knob added later is covered without an edit."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from results.analysis import cells as analysis
from results.analysis import compare, identity, racing, recommend, scaling
from sweeps.driver.summary import summary_text
from tests.seed_rows import row
from trainers.knobs import GRID_AXES, KNOBS, SWEPT, UNSET, Knob


@pytest.fixture(autouse=True)
def few_replicates(monkeypatch):
    """The walk asserts which lines pool and pair, not intervals: a few hundred replicates say so as well."""
    from results.analysis import uncertainty

    monkeypatch.setattr(uncertainty, "N_BOOT", 300)


def other(knob: Knob, d):
    """A value of `knob` other than `d`."""
    if knob.kind == "choice":
        return next(c for c in reversed(knob.choices) if c != d)
    if knob.kind == "bool":
        return not d
    if knob.kind == "int":
        return (d if d is not None else knob.lo or 0) + 1
    if knob.kind == "float":
        return 2.0 * d if d else 0.5
    if knob.name == "env_grid":
        return '{"NCCL_ALGO":"Ring"}'
    return "pkg.other:factory" if d is None else f"{d}-other"


def base(cluster: str, repeat: int, step_ms: float) -> dict:
    """A 1x2 DDP row of one group and round, every knob at its default (the placement's at 1x2)."""
    defaults = {k.name: k.default for k in KNOBS if k.name not in ("world_size", "num_nodes", "backend")}
    r = row("ddp", 2, step_ms, bucket=25.0, cluster=cluster, repeat=repeat) | defaults
    rng = np.random.default_rng(repeat)
    times = (step_ms * (1 + 0.01 * rng.standard_normal(20))).tolist()
    return r | {"step_times_ms": times, "step_ms": float(np.median(times)), "group_id": "g", "round": repeat}


def pair(knob: Knob) -> pd.DataFrame:
    """Two configurations that differ only in `knob` (the second 30% slower), 4 rounds, on clusters a and b."""
    rows = []
    for cluster in ("a", "b"):
        for rep in range(4):
            rows.append(base(cluster, rep, 100.0) | {"cell_id": "one"})
            first = base(cluster, rep, 130.0)
            rows.append(first | {"cell_id": "two", knob.name: other(knob, first[knob.name])})
    return pd.DataFrame(rows)


@pytest.mark.parametrize("knob", KNOBS, ids=lambda k: k.name)
def test_two_configurations_that_differ_in_one_knob_never_pool(knob):
    rows = pair(knob)
    cells = analysis.ok_cells(rows)
    assert len(cells) == 4  # two configurations on each of two clusters
    assert len(analysis.with_baseline(rows)) == 4
    one = rows[rows["cluster"] == "a"]
    assert len(racing.curves(one)) == (1 if knob.name == SWEPT else 2)
    if knob.name not in ("mode",):  # the u_curve view is of ddp cells only
        curves = analysis.u_curve(rows)
        assert curves["buckets"].sum() == 4 and len(curves) == (2 if knob.name == SWEPT else 4)
    table = scaling.scaling(rows)
    if knob.name != "mode":
        assert len(table) == 4
        assert table.groupby(scaling.SERIES, dropna=False).ngroups == (
            2 if knob.name in ("world_size", "num_nodes") else 4
        )
    lines = [line for line in summary_text(one).splitlines() if "step ms" in line]
    assert len(lines) == (1 if knob.name == SWEPT else 2), lines


@pytest.mark.parametrize("knob", KNOBS, ids=lambda k: k.name)
def test_compare_pairs_each_configuration_with_itself_only(knob):
    out = compare.compare(pair(knob), "a", "b")
    both = out[out["measured_on"] == "both"]
    assert len(both) == 2  # one line per configuration, not 4 cross pairs
    assert both["ratio"].to_numpy() == pytest.approx([1.0, 1.0], rel=0.05)  # each with its own twin
    assert knob.name in out.columns  # the knob that varies is shown


@pytest.mark.parametrize("knob", [k for k in KNOBS if k.name != "mode"], ids=lambda k: k.name)
def test_recommend_never_pools_two_configurations(knob):
    recs = [r for r in recommend.recommend(pair(knob)) if r["cluster"] == "a"]
    assert sum(r["cells"] for r in recs) == 2
    chosen = knob.pytorch is not UNSET  # results.knobs.Knob.chosen
    assert len(recs) == (1 if chosen else 2)  # a knob a user chooses is an alternative within one curve


def test_compare_of_copied_rows_with_two_hooks_and_two_timings_is_one_line_per_configuration():
    """The issue's case: the same rows filed under two clusters, measured with two hooks and two timings each:
    4 configurations, 4 lines (not 16), each showing its hook and timing."""
    rows = []
    for cluster in ("a", "b"):
        for rep in range(3):
            for hook in ("none", "fp16"):
                for timing in ("sync", "loop"):
                    ms = 100.0 * (0.8 if hook == "fp16" else 1.0) * (1.1 if timing == "loop" else 1.0)
                    rows.append(base(cluster, rep, ms) | {"comm_hook": hook, "timing": timing})
    out = compare.compare(pd.DataFrame(rows), "a", "b")
    assert len(out) == 4 and set(out["measured_on"]) == {"both"}
    assert {"comm_hook", "timing"} <= set(out.columns)
    assert sorted(zip(out["comm_hook"], out["timing"], strict=True)) == [
        ("fp16", "loop"),
        ("fp16", "sync"),
        ("none", "loop"),
        ("none", "sync"),
    ]
    assert out["comparable"].all() and out["ratio"].to_numpy() == pytest.approx([1.0] * 4, rel=0.05)


def test_different_fingerprints_are_never_comparable():
    rows = [
        base(c, rep, 100.0) | {"workload": "pkg.m:f", "workload_fingerprint": f"fp-{c}"}
        for c in "ab"
        for rep in range(3)
    ]
    out = compare.compare(pd.DataFrame(rows), "a", "b")
    assert not out["comparable"].any() and set(out["measured_on"]) == {"a only", "b only"}


def test_every_knob_is_a_row_column_and_a_configuration_key():
    from results.storage.schema import COLUMNS

    assert set(identity.CONFIGURATION) <= set(COLUMNS)
    assert [k for k in identity.CONFIG_KEYS if k != SWEPT] == identity.CURVE_KEYS
    assert set(racing.CURVE_IN_GROUP) == set(identity.CURVE_KEYS) - {"cluster", "sweep_id"}


@pytest.mark.parametrize("knob", GRID_AXES, ids=lambda k: k.name)
def test_every_ddp_axis_of_the_table_is_a_spec_list_crossed_into_cells_of_their_own(knob):
    """From the table alone: the spec takes the knob as a list, the grid crosses it, the cell id tells the values
    apart (the default's id unchanged by the knob's existence), and the row carries it."""
    from sweeps.plan.grid import expand
    from sweeps.spec.sweep import spec_from_dict
    from sweeps.trial.rows import RowContext, build_row

    value = other(knob, knob.default)
    if knob.kind == "float" and knob.hi is not None:
        value = min(value, knob.hi)
    extra = {"comm_hook": ["powersgd"], "warmup_steps": 3} if knob.name.startswith("powersgd") else {}
    extra |= {"compile": [True]} if knob.name == "optimize_ddp" else {}  # a compiled cell's knob
    plain = spec_from_dict({"name": "k", "workers": [2], **extra})
    both = spec_from_dict({"name": "k", "workers": [2], **extra, knob.name: [knob.default, value]})
    ddp = [c for c in expand(both) if c.step.mode == "ddp"]
    assert len(ddp) == 2 and {getattr(c.step, knob.name) for c in ddp} == {knob.default, value}
    assert [c.cell_id for c in expand(plain) if c.step.mode == "ddp"] == [ddp[0].cell_id]
    assert ddp[0].cell_id != ddp[1].cell_id
    from datetime import UTC, datetime

    from sweeps.plan.grid import Slot

    ctx = RowContext(
        sweep_id="s",
        cluster="c",
        spec_name="k",
        cpus_per_worker=1.0,
        placement="PACK",
        backend="gloo",
        isolation="sweep",
        group_id="g",
        order_seed=0,
        group_started_at=datetime.now(UTC),
    )
    slot = Slot(cell=ddp[1], repeat=0, round=0, order_in_round=0)
    assert build_row(slot, ctx, started=datetime.now(UTC), wall_s=1.0, error="x")[knob.name] == value


def _predicted_pair(knob: Knob) -> pd.DataFrame:
    """Two predicted DDP cells of one plan that differ only in `knob`, with the same bucket layout."""
    first = {k.name: k.default for k in KNOBS} | {"mode": "ddp", "world_size": 2, "num_nodes": 1, "backend": "gloo"}
    second = first | {knob.name: other(knob, first[knob.name])}
    cells = [
        c | {"cell_id": i, "topology": "1x2", "bucket_bytes": [1024], "note": None}
        for i, c in enumerate((first, second))
    ]
    return pd.DataFrame([c | {"predicted_ms": ms} for c, ms in zip(cells, (100.0, 130.0), strict=True)])


@pytest.mark.parametrize("knob", [k for k in KNOBS if k.name not in (SWEPT, "mode")], ids=lambda k: k.name)
def test_predict_keeps_two_configurations_on_curves_of_their_own(knob):
    from sweeps.predict import steps as predict

    table = predict.mark_best(_predicted_pair(knob))
    assert table["predicted_best"].tolist() == [True, True]  # each is the best of its own curve
