"""Tier 1: the analysis reproduces the seed post's figures from its own measurements, read back from a store."""

from __future__ import annotations

import pandas as pd
import pytest

from results.analysis import cells as analysis
from results.storage.store import Store, load


def test_scaling_efficiency_and_exposed_communication(seed_store):
    table = analysis.with_baseline(load(seed_store))
    best = table[(table["gas"] == 1) & (table["bucket_cap_mb"] == 25.0)].iloc[0]
    assert best["baseline_source"] == "measured"
    assert best["tokens_per_s"] / 1e3 == pytest.approx(668.2, abs=0.1)
    assert best["baseline_tokens_per_s"] / 1e3 == pytest.approx(100.6, abs=0.1)
    assert best["efficiency"] == pytest.approx(0.830, abs=0.001)
    assert best["exposed_comm_ms"] == pytest.approx(24.9, abs=0.01)
    single = table[(table["gas"] == 1) & (table["bucket_cap_mb"] == 500.0)].iloc[0]
    assert single["exposed_comm_ms"] == pytest.approx(49.8, abs=0.01)
    assert single["exposed_comm_frac"] == pytest.approx(0.41, abs=0.005)


def test_u_curve_best_bucket_and_overlap_saved(seed_store):
    curve = analysis.u_curve(load(seed_store))
    gas1 = curve[curve["gas"] == 1].iloc[0]
    assert gas1["best_bucket_cap_mb"] == 25.0 and gas1["best_step_ms"] == 147.1
    assert gas1["largest_bucket_cap_mb"] == 500.0
    assert gas1["overlap_saved_ms"] == pytest.approx(24.9, abs=0.01)
    assert gas1["buckets"] == 5


def test_no_sync_gain_at_gas_4_with_the_gas1_baseline_fallback(seed_store):
    table = analysis.with_baseline(load(seed_store))
    g4 = table[(table["gas"] == 4) & table["no_sync"]].iloc[0]
    assert g4["baseline_source"] == "gas1_scaled"  # the seed measured its baseline at gas 1 only
    assert g4["baseline_step_ms"] == pytest.approx(4 * 122.2)
    assert g4["tokens_per_s"] / 1e3 == pytest.approx(754.1, abs=0.1)
    assert g4["efficiency"] == pytest.approx(0.94, abs=0.005)
    gain = analysis.no_sync_gain(load(seed_store)).iloc[0]
    assert gain["saved_ms"] == pytest.approx(61.3, abs=0.15)
    assert gain["tokens_per_s_sync"] / 1e3 == pytest.approx(674.8, abs=0.05)
    assert gain["tokens_per_s_gain"] / 1e3 == pytest.approx(754.1 - 674.8, abs=0.15)


def test_repeats_are_aggregated_by_median_and_errors_ignored(tmp_path):
    from tests.seed_rows import row

    store = Store.open(str(tmp_path))
    for i, ms in enumerate([120.0, 122.2, 130.0]):
        store.write_row(row("single", 1, ms, repeat=i))
    store.write_row(row("ddp", 8, 147.1, bucket=25.0))
    store.write_row(row("ddp", 8, 1.0, bucket=50.0, status="error", error="boom"))
    table = analysis.with_baseline(load(str(tmp_path)))
    assert list(table["bucket_cap_mb"]) == [25.0]
    assert table.iloc[0]["baseline_step_ms"] == 122.2


def test_a_report_bootstraps_each_configuration_once(monkeypatch):
    """Every section of a report reads one computation of the cells: one bootstrap per configuration."""
    from results.analysis import cells
    from results.render.report import render_html
    from tests.seed_rows import seed_rows

    bootstrapped: list[int] = []
    real = cells.cell_replicates

    def counted(rows, keys, *args, **kwargs):
        out = real(rows, keys, *args, **kwargs)
        bootstrapped.append(len(out))
        return out

    monkeypatch.setattr(cells, "cell_replicates", counted)
    rows = pd.DataFrame(seed_rows())
    html = render_html(rows, "seed")
    assert "best bucket" in html.lower()
    assert bootstrapped == [rows["cell_id"].nunique()]  # 8 configurations, each once


def test_values_are_plain_finite_and_json_safe():
    import json
    import math

    import numpy as np

    from results.values import json_safe, number, plain

    assert plain(np.float64(1.5)) == 1.5 and type(plain(np.int32(3))) is int and plain(float("nan")) is None
    assert plain(pd.NA) is None and plain(np.array([1, 2])) == [1, 2]
    assert number("2.5") == 2.5 and number(math.inf) is None and number(None) is None and number(pd.NA) is None
    nested = {"a": [np.float64("nan"), np.array([1.0, np.inf])], 1: (np.int64(2), None)}
    assert json.loads(json.dumps(json_safe(nested), allow_nan=False)) == {"a": [None, [1.0, None]], "1": [2, None]}
