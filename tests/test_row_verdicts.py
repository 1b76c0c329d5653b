"""A row's gradient-check label and its plants are data from a shared store: a label the check never writes, an
`exact` beyond its own tolerance, or a measurement under a planted corruption never makes a recommendation."""

from __future__ import annotations

import pytest

from results.analysis.recommend import recommend
from results.storage.store import Store, load
from tests.seed_rows import seed_rows
from tests.test_recommend import noisy

BEST = {"bucket_cap_mb": 25.0, "gas": 1}  # the seed's best cell of its gas-1 curve


def _store(tmp_path, change: dict) -> str:
    store = Store.open(str(tmp_path))
    for r in noisy(seed_rows(), cv=0.01, repeats=3):
        ok = {"grad_check": "exact", "grad_rel_error": 1e-7, "grad_tol": 1e-5} if r["mode"] == "ddp" else {}
        best = r["mode"] == "ddp" and all(r[k] == v for k, v in BEST.items())
        store.write_row(r | ok | (change if best else {}))
    return str(tmp_path)


@pytest.mark.parametrize(
    "change",
    [
        {"grad_check": "FAILED", "grad_rel_error": 0.4},  # not a label the check writes
        {"grad_check": "ok", "grad_rel_error": 0.0},
        {"grad_check": "exact", "grad_rel_error": 0.1},  # beyond its own tolerance
        {"injected_corruption": 0.5, "grad_check": "approximate", "grad_rel_error": 0.33},
        {"injected_jitter": 1e-3},
    ],
    ids=["FAILED", "unknown", "exact-beyond-tol", "planted-corruption", "planted-jitter"],
)
def test_a_doubtful_row_is_never_the_recommended_configuration(tmp_path, change):
    rows = load(_store(tmp_path, change))
    (one,) = [r for r in recommend(rows) if r["gas"] == 1]
    assert one["best"]["bucket_cap_mb"] != 25.0 and one["recommended"]["bucket_cap_mb"] != 25.0
    if "injected_corruption" not in change and "injected_jitter" not in change:
        assert [e["bucket_cap_mb"] for e in one["excluded"]] == [25.0]  # shown as failed, with its error


def test_the_same_rows_without_the_doubt_recommend_25_mb(tmp_path):
    (one,) = [r for r in recommend(load(_store(tmp_path, {}))) if r["gas"] == 1]
    assert one["best"]["bucket_cap_mb"] == 25.0


def test_a_measurement_that_was_not_checked_stays_unchecked(tmp_path):
    rows = load(_store(tmp_path, {"grad_check": None, "grad_rel_error": None}))
    assert not (rows["grad_check"] == "failed").any()
    assert rows.loc[rows["grad_check"].isna(), "mode"].value_counts().to_dict() == {"single": 3, "ddp": 3}
    (one,) = [r for r in recommend(rows) if r["gas"] == 1]
    assert one["best"]["bucket_cap_mb"] == 25.0
