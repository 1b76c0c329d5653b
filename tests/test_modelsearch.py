"""`search: model`: the cells the overlap model cannot rule out, the baseline and PyTorch's default bucket, the
band drawn from the model's own within-curve error on the cluster (a default where it has none)."""

from __future__ import annotations

import pandas as pd
import pytest
from typer.testing import CliRunner

from results.storage.store import Store
from service.cli import app
from sweeps.plan.grid import expand
from sweeps.predict import modelsearch
from sweeps.spec.files import parse_spec
from sweeps.spec.sweep import SpecError
from tests.test_predict import SPEC, calibrate, measured

MODEL_SPEC = SPEC.replace("bucket_cap_mb: [0.05, 0.25, 25]", "bucket_cap_mb: [0.01, 0.05, 0.25, 25]")
MODEL_SPEC += "search: model\nrepeats: 3\n"


def curve(steps: list[float], buckets: list[float] | None = None) -> pd.DataFrame:
    """A predictions table of one DDP curve (what sweeps.predict.steps.predictions gives)."""
    buckets = buckets or [0.25, 1.0, 25.0, 100.0][: len(steps)]
    return pd.DataFrame(
        {"cell_id": [f"c{i}" for i in range(len(steps))], "mode": "ddp", "topology": "1x2", "gas": 1}
        | {"no_sync": False, "comm_hook": "none", "bucket_cap_mb": buckets, "predicted_ms": steps, "note": None}
    )


def test_the_band_is_twice_the_error_and_keeps_at_least_two():
    steps = [10.0, 10.5, 13.0, 20.0]  # 1, 1.05, 1.3, 2 x the predicted best
    narrow = modelsearch._whys(curve(steps), None, 0.02)  # band 1.04: only the best, then the minimum of 2
    assert [w is not None for w in narrow] == [True, True, True, False]  # 25 MB is PyTorch's default
    assert narrow[0].startswith("predicted #1 of 4, 1.000x the best (within 2 x 2.0% of the best)")
    assert narrow[2] == "PyTorch's default bucket (25 MB)"
    wide = modelsearch._whys(curve(steps), None, 0.2)  # band 1.4: three cells
    assert wide[2].startswith("predicted #3 of 4, 1.300x") and wide[2].endswith("; PyTorch's default bucket (25 MB)")
    assert wide[3] is None
    fixed = modelsearch._whys(curve(steps), 3, 0.0)
    assert [w is not None for w in fixed] == [True, True, True, False] and "(model_k 3)" in fixed[1]


def test_caps_that_give_the_same_buckets_are_measured_once_the_default_first():
    table = curve([10.0, 11.0, 11.0, 11.0], [0.25, 1.0, 25.0, 100.0])
    table["bucket_bytes"] = [(60, 40), (100,), (100,), (100,)]  # 1, 25 and 100 MB: one bucket, the same step
    whys = modelsearch._whys(table, None, 0.2)
    assert whys[0].startswith("predicted #1 of 2") and whys[2].startswith("predicted #2 of 2")
    assert whys[1] is None and whys[3] is None  # 25 MB (PyTorch's default) runs their layout
    skipped = modelsearch.same_layout(table)
    assert skipped == {
        "c1": "same 1 bucket(s) as 25 MB: the same step",
        "c3": "same 1 bucket(s) as 25 MB: the same step",
    }


def test_baselines_and_unmodeled_cells_are_always_measured():
    table = pd.concat([curve([10.0, 12.0, 30.0]), curve([5.0], [None]).assign(mode="single", cell_id="s")])
    table = pd.concat([table, curve([None], [1.0]).assign(comm_hook="powersgd", cell_id="p", note="PowerSGD …")])
    whys = modelsearch._whys(table.reset_index(drop=True), None, 0.1)
    assert whys[3] == "baseline (single worker)" and whys[4] == "not modeled (PowerSGD …)"


def test_choose_uses_the_default_error_without_history_and_the_measured_one_after(tmp_path):
    root = str(tmp_path / "r")
    calibrate(root, alpha_ms=2.0, gbps=1.0)  # latency-bound: a curve falling steeply towards large buckets
    spec = parse_spec(MODEL_SPEC)
    cells = expand(spec)
    first = modelsearch.choose(spec, cells, Store.open(root), "lab")
    assert first.error == modelsearch.DEFAULT_ERROR and first.error_from == "no earlier sweep"
    assert first.grid_cells == len(cells) and len(first.chosen) < len(cells)
    assert set(first.skipped) == {c.cell_id for c in cells} - set(first.chosen)
    assert all("outside the band" in why or why.startswith("same ") for why in first.skipped.values())
    by_id = {c.cell_id: c for c in cells}
    for cell in cells:
        why = first.chosen.get(cell.cell_id, {}).get("why")
        if cell.step.mode == "single":
            assert why == "baseline (single worker)"
        elif cell.step.comm_hook == "powersgd":
            assert why.startswith("not modeled (PowerSGD")
        elif cell.step.bucket_cap_mb == 25.0:
            assert "PyTorch's default bucket (25 MB)" in why
    for key in {(c.step.gas, c.step.no_sync) for c in cells if c.step.mode == "ddp"}:
        mine = [k for k in first.chosen if by_id[k].step.mode == "ddp" and by_id[k].step.comm_hook == "none"]
        mine = [k for k in mine if (by_id[k].step.gas, by_id[k].step.no_sync) == key]
        assert {by_id[k].step.bucket_cap_mb for k in mine} == {0.25, 25.0}  # the best two of 0.01 … 25
        assert all(first.chosen[k]["why"].startswith("predicted #") for k in mine)
        assert all(first.chosen[k]["predicted_ms"] > 0 for k in mine)
    # an earlier sweep measured as the model's own steps at compute x1.5: nearly one factor off (the overlap's
    # max(backward, communication) moves a little with compute), so the error that reorders a curve is small
    measured(str(tmp_path / "h"))
    again = modelsearch.choose(spec, cells, Store.open(str(tmp_path / "h")), "lab")
    assert 0 < again.error < 0.03 and again.error_from == "measured on 9 cells of earlier sweeps on lab"


def test_model_k_is_validated_and_warned_about_without_search_model():
    with pytest.raises(SpecError, match="model_k: .*at least 2"):
        parse_spec(MODEL_SPEC + "model_k: 1\n")
    assert "model_k: no effect without search: model" in parse_spec(SPEC + "model_k: 3\n").warnings()


def test_the_dry_run_prints_the_choice_and_why_and_a_missing_calibration_names_the_fix(tmp_path):
    spec = tmp_path / "m.yaml"
    spec.write_text(MODEL_SPEC)
    out = CliRunner().invoke(app, ["run", str(spec), "--dry-run", "--results", str(tmp_path / "none")])
    assert out.exit_code == 2 and "ddpsweep calibrate SPEC" in out.output
    root = str(tmp_path / "r")
    calibrate(root)
    out = CliRunner().invoke(app, ["run", str(spec), "--dry-run", "--results", root])
    assert out.exit_code == 0, out.output
    assert "search: model measures" in out.output and "(error 10.0%, no earlier sweep), then races them" in out.output
    assert "predicted_ms" in out.output and "baseline (single worker)" in out.output
