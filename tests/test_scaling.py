"""The scaling report — tokens/s and efficiency by topology with intervals, busbw where the sweep
calibrated, the knee flagged only where efficiency falls significantly; in the CLI, report and compare."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from results.analysis.scaling import scaling, topologies
from results.render.report import render_html
from results.storage.store import Store
from tests.seed_rows import row

ROOT = Path(__file__).resolve().parent.parent


def topology_rows(
    cross_node_ms: float, cluster: str = "netns", same_node_ms: float = 105.0, repeats: int = 3
) -> list[dict]:
    """`repeats` repeats (3) of a single baseline (100 ms) and DDP at 1x1 (101 ms), 1x2 (`same_node_ms`), 2x1
    (`cross_node_ms`)."""
    rng = np.random.default_rng(0)
    shapes = [("single", 1, 1, 100.0), ("ddp", 1, 1, 101.0), ("ddp", 2, 1, same_node_ms), ("ddp", 2, 2, cross_node_ms)]
    out = []
    for mode, world, nodes, ms in shapes:
        for rep in range(repeats):
            times = list(ms * (1 + 0.01 * rng.standard_normal(10)))
            out.append(
                row(
                    mode,
                    world,
                    float(np.median(times)),
                    bucket=None if mode == "single" else 25.0,
                    cluster=cluster,
                    sweep="topo",
                    repeat=rep,
                    num_nodes=nodes,
                    workers_per_node=world // nodes,
                    cell_id=f"{mode}-{world}x{nodes}",
                    step_times_ms=times,
                    backend="gloo",
                )
            )
    return out


def test_the_cross_node_knee_is_flagged_with_its_cause():
    rows = pd.DataFrame(topology_rows(cross_node_ms=200.0))
    assert topologies(rows) == 3
    table = scaling(rows).set_index("topology")
    assert list(table.index) == ["1x1", "1x2", "2x1"]  # by world size, then nodes
    assert abs(table.loc["1x2", "efficiency"] - 100 / 105) < 0.01 and abs(table.loc["2x1", "efficiency"] - 0.5) < 0.01
    for t in table.index:
        assert table.loc[t, "efficiency_ci_lo"] <= table.loc[t, "efficiency"] <= table.loc[t, "efficiency_ci_hi"]
        assert table.loc[t, "tokens_per_s_ci_lo"] < table.loc[t, "tokens_per_s"] < table.loc[t, "tokens_per_s_ci_hi"]
    assert list(table["knee"]) == [False, False, True]
    assert "crosses from 1 to 2 node(s)" in table.loc["2x1", "knee_why"]
    assert abs(table.loc["2x1", "comm_share"] - 0.5) < 0.01  # half the step is exposed communication


def test_the_knee_is_the_steepest_of_several_significant_drops():
    table = scaling(pd.DataFrame(topology_rows(cross_node_ms=400.0, same_node_ms=160.0))).set_index("topology")
    assert list(table["knee"]) == [False, False, True]  # x0.63 within the node, then x0.40 across nodes
    assert "same nodes" in table.loc["1x2", "knee_why"] and "crosses" in table.loc["2x1", "knee_why"]


def test_one_round_calls_no_knee_and_says_so():
    """2x1 22% slower per rank than 1x2, in one round each: an A/A of one configuration in two worker groups read
    that far apart, so one run's tight steps are no evidence of a knee; two rounds of the same are."""
    one = scaling(pd.DataFrame(topology_rows(cross_node_ms=105 * 1.22, repeats=1))).set_index("topology")
    assert one.loc["2x1", "vs_previous_ci_hi"] < 0.9  # the steps alone would call it
    assert not one["knee"].any()
    assert one.loc["2x1", "knee_why"].endswith(
        "one round: not called a knee (runs differ by more), measure repeats: 2 or more"
    )
    two = scaling(pd.DataFrame(topology_rows(cross_node_ms=105 * 1.22, repeats=2))).set_index("topology")
    assert list(two["knee"]) == [False, False, True] and "one round" not in two.loc["2x1", "knee_why"]


def test_no_knee_where_efficiency_holds():
    table = scaling(pd.DataFrame(topology_rows(cross_node_ms=106.0)))
    assert not table["knee"].any()


def test_busbw_comes_from_the_largest_calibrated_message_of_each_topology():
    cal = pd.DataFrame(
        [
            {
                "cluster": "netns",
                "sweep_id": "topo",
                "world_size": 2,
                "num_nodes": n,
                "kind": "all_reduce",
                "size_bytes": size,
                "busbw_gbps": bw,
            }
            for n, size, bw in [(1, 1 << 10, 0.1), (1, 1 << 20, 2.0), (2, 1 << 10, 0.001), (2, 1 << 20, 0.012)]
        ]
    )
    table = scaling(pd.DataFrame(topology_rows(200.0)), cal).set_index("topology")
    assert table.loc["1x2", "busbw_gbps"] == 2.0 and table.loc["2x1", "busbw_gbps"] == 0.012
    assert np.isnan(table.loc["1x1", "busbw_gbps"])  # one rank: nothing calibrated


def test_the_report_and_the_cli_show_the_scaling_section(tmp_path):
    store = Store.open(str(tmp_path / "store"))
    for r in topology_rows(200.0) + topology_rows(130.0, cluster="faster-link"):
        store.write_row(r)
    html = render_html(pd.DataFrame(topology_rows(200.0)), "t")
    assert "Scaling by topology" in html and "<b>Knee</b> at 2x1" in html and "alt='scaling'" in html
    cli = [sys.executable, "-m", "service.cli"]
    out = subprocess.run(
        [*cli, "scaling", "--results", store.uri, "--cluster", "netns"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert out.returncode == 0, out.stderr
    assert "knee: cluster=netns gas=1 no_sync=false bucket_cap_mb=25 at 2x1" in out.stdout and "1x2" in out.stdout
    figure = tmp_path / "curves.png"
    args = ["compare", "--results", store.uri, "--cluster", "netns", "--cluster", "faster-link"]
    cmp = subprocess.run(
        [*cli, *args, "--scaling-figure", str(figure)], capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert cmp.returncode == 0, cmp.stderr
    assert figure.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and figure.stat().st_size > 10_000
