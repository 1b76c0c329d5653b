"""The dashboard's pages in-process (the browser tier drives them in Chromium): what they show is the store."""

from __future__ import annotations

import re

import pytest
from fastapi.testclient import TestClient

from results.storage.store import Store
from service.api import ServiceSettings, create_app
from tests.seed_rows import seed_rows


def drawn(page: str, chart_id: str) -> list[tuple[str, list[float]]]:
    """The series drawn in the page's chart `chart_id`: each one's label and the y of its points."""
    chart = re.findall(rf'<svg[^>]* id="{chart_id}".*?</svg>', page, re.S)[0]
    series = re.findall(r'class="series" data-series="([^"]*)">(.*?)</g>\s*</g>', chart, re.S)
    return [(name, [float(y) for y in re.findall(r'data-y="([^"]+)"', body)]) for name, body in series]


def test_two_sweeps_compare_and_the_sweeps_table_counts(tmp_path):
    store = Store.open(str(tmp_path))
    for r in seed_rows(sweep="s1"):
        store.write_row(r)
    for r in seed_rows(sweep="s2"):
        store.write_row(r | {"step_ms": r["step_ms"] * 0.8, "step_times_ms": None})
    client = TestClient(create_app(ServiceSettings(address=None, results=str(tmp_path), token="t")))
    listed = {s["sweep_id"]: s for s in client.get("/ui/sweeps.json").json()}
    assert {k: (v["written"], v["errors"]) for k, v in listed.items()} == {"s1": (8, 0), "s2": (8, 0)}
    page = client.get("/ui/compare", params={"by": "sweep", "a": "s1", "b": "s2"})
    assert page.status_code == 200 and {n.split(":")[0] for n, _ in drawn(page.text, "compare_curves")} == {"s1", "s2"}
    table = page.text[page.text.index("id='comparison'") :]
    head, *rows = re.findall(r"<tr>(.*?)</tr>", table, re.S)
    at = re.findall(r"<th>(.*?)</th>", head).index("ratio")  # b / a
    ratios = [float(re.findall(r"<td>(.*?)</td>", row)[at]) for row in rows]
    assert ratios and all(abs(r - 0.8) < 1e-6 for r in ratios)  # every cell 20% faster, as written
    assert client.get("/ui/compare", params={"by": "sweep", "a": "s1", "b": "nope"}).status_code == 404
    sweep = client.get("/ui/sweep/pcie-8x/s1").text
    medians = sorted(y for _, ys in drawn(sweep, "u_curve") for y in ys)
    assert "mathdefault" not in sweep and ">10</text>" in sweep  # log ticks as plain text, never raw mathtext
    stored = sorted(r["step_ms"] for r in seed_rows(sweep="s1") if r["mode"] == "ddp")
    assert medians == pytest.approx(stored, rel=1e-5)  # drawn to 6 significant digits


def test_the_sweep_page_shows_scaling_by_topology(tmp_path):
    from tests.test_scaling import topology_rows

    store = Store.open(str(tmp_path))
    for r in topology_rows(cross_node_ms=200.0):
        store.write_row(r)
    client = TestClient(create_app(ServiceSettings(address=None, results=str(tmp_path), token="t")))
    page = client.get("/ui/sweep/netns/topo").text
    assert 'id="scaling"' in page and "Scaling by topology" in page
    table = page[page.index("id='scaling_table'") :]
    head, *rows = re.findall(r"<tr>(.*?)</tr>", table, re.S)
    names = re.findall(r"<th>(.*?)</th>", head)
    at, knee = names.index("topology"), names.index("knee")
    knees = {re.findall(r"<td>(.*?)</td>", r)[at]: re.findall(r"<td>(.*?)</td>", r)[knee] for r in rows}
    assert knees == {"1x1": "False", "1x2": "False", "2x1": "True"}  # the knee, at the cross-node topology
    step = [re.findall(r"<td>(.*?)</td>", r)[names.index("step_ms")] for r in rows]
    assert all(re.fullmatch(r"\d+\.\d \[\d+\.\d, \d+\.\d\]", s) for s in step), step  # as the report and CLI
    assert "_ci_" not in head and "nan" not in table[: table.index("</table>")].lower()
    curves = drawn(page, "u_curve")
    assert len({name for name, _ in curves}) == len({tuple(ys) for _, ys in curves}) == 3  # 1x1, 1x2, 2x1 apart
