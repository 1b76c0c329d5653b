"""A cluster's history: the same configuration across its sweeps, split where a version changed; a change beyond
the noise is flagged with the versions on each side, and a history that differs only by noise flags nothing."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import numpy as np
import pandas as pd
import pytest

from results.analysis.history import history, sweeps_in_order
from tests.seed_rows import seed_rows

SLOWER = {"mode": "ddp", "bucket_cap_mb": 1.0, "gas": 1}  # the configuration the upgrade slows down


def sweep_rows(sweep: str, day: int, torch: str, slow: float, rng: np.random.Generator) -> list[dict]:
    """The seed's 8 configurations, 3 rounds of 30 steps each at 1% noise, each configuration's level moved by
    1.5% (sd) from sweep to sweep (another day); SLOWER's steps x (1 + slow)."""
    out = []
    when = datetime(2026, 1, 1, tzinfo=UTC) + timedelta(days=day)
    for r in seed_rows(sweep=sweep):
        hit = all(r.get(k) == v for k, v in SLOWER.items())
        level = r["step_ms"] * (1 + slow * hit) * (1 + 0.015 * rng.standard_normal())
        for rep in range(3):
            times = (level * (1 + 0.01 * rng.standard_normal(30))).tolist()
            fields = {"repeat": rep, "round": rep, "group_id": f"{sweep}-g", "step_times_ms": times}
            fields |= {"step_ms": float(np.median(times)), "torch_version": torch, "started_at": when}
            out.append(r | fields | {"ray_version": "2.60.0"})
    return out


def crafted_rows(slow: float, seed: int = 0) -> list[dict]:
    """Four weekly sweeps: two on torch 2.12.0, then two on 2.13.0 with SLOWER x (1 + slow)."""
    rng = np.random.default_rng(seed)
    plan = [("s1", 0, "2.12.0", 0.0), ("s2", 7, "2.12.0", 0.0), ("s3", 14, "2.13.0", slow), ("s4", 21, "2.13.0", slow)]
    return [r for sweep, day, torch, s in plan for r in sweep_rows(sweep, day, torch, s, rng)]


def crafted(slow: float, seed: int = 0) -> pd.DataFrame:
    return pd.DataFrame(crafted_rows(slow, seed))


def test_sweeps_split_where_a_version_changed():
    order = sweeps_in_order(crafted(0.0))
    assert order["sweep_id"].tolist() == ["s1", "s2", "s3", "s4"] and order["segment"].tolist() == [0, 0, 1, 1]


def test_a_configuration_slower_after_an_upgrade_is_the_one_flagged_with_the_versions():
    out = history(crafted(0.12), "pcie-8x")
    assert len(out) == 8  # every configuration measured on both sides of the one change
    (flagged,) = out[out["flagged"]].to_dict("records")
    assert (flagged["mode"], flagged["bucket_cap_mb"], flagged["gas"]) == ("ddp", 1.0, 1)
    assert flagged["ratio"] == pytest.approx(1.12, abs=0.05) and flagged["ratio_ci_lo"] > 1  # 1.5% drift per sweep
    assert flagged["change"] == "torch_version 2.12.0 -> 2.13.0"
    assert (flagged["sweeps_before"], flagged["sweeps_after"]) == ("s1, s2", "s3, s4")


@pytest.mark.parametrize("seed", range(10))
def test_a_history_that_differs_only_by_noise_flags_nothing(seed):
    out = history(crafted(0.0, seed=seed), "pcie-8x")
    assert len(out) == 8 and not out["flagged"].any(), out[["bucket_cap_mb", "ratio_ci_lo", "ratio_ci_hi"]]


def test_one_version_throughout_is_no_change():
    same = crafted(0.12).assign(torch_version="2.13.0")
    assert history(same, "pcie-8x").empty


def test_the_cli_and_the_http_api_give_the_same_history(tmp_path):
    import json

    from fastapi.testclient import TestClient
    from typer.testing import CliRunner

    from results.storage.store import Store
    from service.api import ServiceSettings, create_app
    from service.cli import app

    store = Store.open(str(tmp_path))
    for r in crafted_rows(0.12):
        store.write_row(r)
    out = CliRunner().invoke(
        app, ["compare", "--history", "--cluster", "pcie-8x", "--results", str(tmp_path), "--format", "json"]
    )
    assert out.exit_code == 0, out.output
    cli = json.loads(out.output)
    c = TestClient(create_app(ServiceSettings(address=None, results=str(tmp_path), token="t")))
    http = c.get("/history", params={"cluster": "pcie-8x"}).json()
    assert len(cli) == 8 and cli == http and sum(r["flagged"] for r in http) == 1
    two = CliRunner().invoke(
        app, ["compare", "--history", "--cluster", "a", "--cluster", "b", "--results", str(tmp_path)]
    )
    assert two.exit_code == 2 and "exactly one label with --history" in two.output
    assert c.get("/history", params={"cluster": "nope"}).status_code == 404


def test_the_dashboard_shows_a_clusters_history_with_the_flagged_line(tmp_path):
    from fastapi.testclient import TestClient

    from results.storage.store import Store
    from service.api import ServiceSettings, create_app

    store = Store.open(str(tmp_path))
    for r in crafted_rows(0.12):
        store.write_row(r)
    c = TestClient(create_app(ServiceSettings(address=None, results=str(tmp_path), token="t")))
    page = c.get("/ui/history", params={"cluster": "pcie-8x"})
    assert page.status_code == 200 and "1 flagged" in page.text and "torch_version 2.12.0 -&gt; 2.13.0" in page.text
    assert "<option selected>pcie-8x</option>" in page.text and "history" in c.get("/").text
