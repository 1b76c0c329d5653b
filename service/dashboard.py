"""The dashboard: HTML pages over the same cached store as the API (server-rendered SVG, no external assets).

/                          every sweep in the store (local runs included), merged with Ray Jobs where a
                           cluster is attached; the table refreshes itself every 2 s from /ui/sweeps.json
/ui/sweep/{cluster}/{id}   U-curves, efficiency, scaling and no_sync with intervals, best buckets, errors, downloads
/ui/compare?a=C1&b=C2      two clusters' U-curves overlaid, and the comparison table with its flags
"""

from __future__ import annotations

import html
import json
import math

import jinja2
import markupsafe
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from results import analysis, identity, recommend, scaling
from results import compare as compare_mod
from results.cache import ANALYSIS_MAX_ROWS, CachedStore
from service import jobs
from service.svg import Point, Series, line_chart
from sweeps import machine

STYLE = """body{font-family:system-ui,sans-serif;margin:1.5em 2em;color:#222;max-width:1280px}
table{border-collapse:collapse;font-size:13px;margin:.6em 0}
td,th{border:1px solid #ddd;padding:3px 8px;text-align:right}
th{background:#f4f4f4}td.l,th.l{text-align:left}nav a{margin-right:1em}.charts{display:flex;flex-wrap:wrap;gap:12px}
.chart{border:1px solid #eee;background:#fff}.chart .axis{stroke:#444}.chart .grid{stroke:#eee}
.chart .tick,.chart .legend{font-size:11px;fill:#333}.chart .label{font-size:12px;fill:#333}
.chart .title{font-size:13px;font-weight:600}.point:hover{r:6}.err{color:#b00}.empty{color:#777}"""


TEMPLATES = jinja2.Environment(
    loader=jinja2.PackageLoader("service", "templates"),
    autoescape=True,  # every value is text unless marked safe (the SVG charts, already escaped by service.svg)
    undefined=jinja2.StrictUndefined,
)


def page(title: str, body: str, script: str = "") -> str:
    """A page: `body` is HTML built from escaped parts (templates, service.svg); `title` is text."""
    return TEMPLATES.get_template("base.html").render(
        title=title, style=markupsafe.Markup(STYLE), body=markupsafe.Markup(body), script=markupsafe.Markup(script)
    )


def sweeps(cache: CachedStore, address: str | None) -> list[dict]:
    """One dict per sweep: cluster, sweep_id, spec_name, started, state, written, planned, errors."""
    running_here = machine.sweeps_measuring()
    remote = _jobs_by_sweep(address)
    out = []
    for g in sweep_counts(cache.table()):
        cluster, sweep = g["cluster"], g["sweep_id"]
        manifest = cache.manifest(cluster, sweep)
        job = remote.get(sweep)
        state = job.state if job else ("RUNNING (this machine)" if sweep in running_here else "")
        written, planned = g["status_count"], int(manifest.get("planned", 0)) if manifest else 0
        out.append(
            {
                "cluster": cluster,
                "sweep_id": sweep,
                "spec_name": str(g["spec_name_first"]),
                "started": str(g["started_at_min"])[:19],
                "state": state or ("done" if written >= planned else "partial"),
                "written": written,
                "planned": planned,
                "errors": g["is_error_sum"],
            }
        )
    known = {s["sweep_id"] for s in out}
    out += [
        {
            "cluster": j.cluster,
            "sweep_id": j.sweep_id,
            "spec_name": "",
            "started": "",
            "state": j.state,
            "written": 0,
            "planned": j.planned,
            "errors": 0,
        }
        for j in remote.values()
        if j.sweep_id not in known
    ]
    return sorted(out, key=lambda s: s["started"], reverse=True)


def sweep_counts(table: pa.Table) -> list[dict]:
    """Per (cluster, sweep_id): the first spec_name, the earliest start, the rows and the error rows,
    aggregated in Arrow (a store of millions of rows never becomes a DataFrame here)."""
    t = table.select(["cluster", "sweep_id", "spec_name", "status", "started_at"])
    t = t.append_column("is_error", pc.cast(pc.equal(t["status"], "error"), pa.int64()))
    aggregates = [("spec_name", "first"), ("started_at", "min"), ("status", "count"), ("is_error", "sum")]
    return t.group_by(["cluster", "sweep_id"], use_threads=False).aggregate(aggregates).to_pylist()


def _jobs_by_sweep(address: str | None) -> dict:
    if not address:
        return {}
    try:
        return {s.sweep_id: s for s in jobs.status(address)}
    except Exception:  # noqa: BLE001 — the store's sweeps are shown without Ray Jobs state
        return {}


SWEEPS_SCRIPT = """
const COLUMNS = ['cluster', 'sweep_id', 'spec_name', 'started', 'state'];
function cell(text, cls) {  // text only: a stored value never becomes markup
  const td = document.createElement('td'); td.className = cls; td.textContent = text; return td;
}
function sweepRow(s) {
  const tr = document.createElement('tr'); tr.dataset.sweep = s.sweep_id;
  for (const key of COLUMNS) {
    const td = cell(key === 'sweep_id' ? '' : s[key], 'l');
    if (key === 'sweep_id') {
      const a = document.createElement('a');
      a.href = '/ui/sweep/' + encodeURIComponent(s.cluster) + '/' + encodeURIComponent(s.sweep_id);
      a.textContent = s.sweep_id; td.appendChild(a);
    }
    tr.appendChild(td);
  }
  tr.appendChild(cell(s.written + '/' + (s.planned || '?'), 'written'));
  tr.appendChild(cell(String(s.errors), ''));
  return tr;
}
async function refresh(){
  const r = await fetch('/ui/sweeps.json'); if(!r.ok) return;
  const rows = await r.json();
  document.getElementById('sweeps').replaceChildren(...rows.map(sweepRow));
  document.getElementById('updated').textContent = new Date().toLocaleTimeString();
}
refresh(); setInterval(refresh, 2000);
"""


def sweeps_page() -> str:
    return TEMPLATES.get_template("sweeps.html").render(
        title="ddpsweep sweeps", style=markupsafe.Markup(STYLE), script=markupsafe.Markup(SWEEPS_SCRIPT)
    )


def _finite(v) -> float | None:
    return float(v) if v is not None and not pd.isna(v) and math.isfinite(float(v)) else None


def curve_series(cells: pd.DataFrame, y: str, label: str = "") -> list[Series]:
    """One series per curve (analysis.CURVE_KEYS) over bucket_cap_mb, with the y interval where known; the name
    says what differs from the other series (hook, timing, sweep, …) beside world, nodes, gas and no_sync."""
    ddp = cells[(cells["mode"] == "ddp") & cells["bucket_cap_mb"].notna()]
    several = ddp["num_nodes"].nunique() > 1
    keys = [k for k in analysis.CURVE_KEYS if k != "cluster"]
    out = []
    for key, g in ddp.groupby(keys, dropna=False):
        curve = dict(zip(keys, key, strict=True))
        world, nodes, gas = curve["world_size"], curve["num_nodes"], curve["gas"]
        where = f"{nodes}x{world // nodes}" if several else f"w={world}"
        name = f"{label}{where} gas={gas}{' no_sync' if curve['no_sync'] else ''}"
        extra = analysis.varying(curve, ddp, shown=("world_size", "num_nodes", "gas", "no_sync"))
        out.append(Series(" ".join([name, *extra]), _points(g, "bucket_cap_mb", y)))
    return out


def _points(frame: pd.DataFrame, x: str, y: str) -> list[Point]:
    return [
        Point(float(r[x]), float(r[y]), _finite(r.get(f"{y}_ci_lo")), _finite(r.get(f"{y}_ci_hi")))
        for _, r in frame.iterrows()
        if _finite(r[y]) is not None
    ]


def scaling_section(rows: pd.DataFrame, calibration: pd.DataFrame) -> list[str]:
    """Efficiency vs world size, a line per placement line (one node / W per node), and the knee table."""
    table = scaling.scaling(rows, calibration)
    shown = ["gas", "no_sync", "bucket_cap_mb"]
    named = [*shown, *(k for k in identity.varying(table, scaling.SERIES) if k not in shown)]
    series = [
        Series(
            f"{identity.labels(dict(zip(scaling.SERIES, k, strict=True)), named)} {label}",
            _points(line, "world_size", "efficiency"),
        )
        for k, grp in table.groupby(scaling.SERIES, dropna=False)
        for label, line in scaling.lines(grp).items()
    ]
    chart = line_chart(
        series,
        title="strong-scaling efficiency by topology",
        log_x=True,
        x_label="world size",
        y_label="efficiency",
        chart_id="scaling",
    )
    return [
        "<h2>Scaling by topology</h2>",
        chart,
        _table(
            table,
            [
                "gas",
                "no_sync",
                "bucket_cap_mb",
                "topology",
                "step_ms",
                "tokens_per_s",
                "efficiency",
                "vs_previous",
                "vs_previous_ci_lo",
                "vs_previous_ci_hi",
                "busbw_gbps",
                "knee",
                "knee_why",
            ],
            "scaling_table",
        ),
    ]


def recommendation_section(rows: pd.DataFrame) -> str:
    """`ddpsweep recommend` as HTML: the verdict, the best with its interval, the snippet to paste."""
    return TEMPLATES.get_template("recommend.html").render(recs=recommend.recommend(rows))


def _table(df: pd.DataFrame, columns: list[str], table_id: str) -> str:
    """The named columns, and every knob that varies in `df` (two lines never look alike)."""
    cols = [c for c in identity.with_varying(columns, df) if c in df.columns]
    rows = [[_cell(r[c]) for c in cols] for _, r in df.iterrows()]
    return TEMPLATES.get_template("table.html").render(table_id=table_id, columns=cols, rows=rows)


def _cell(v) -> str:
    if isinstance(v, float):
        return "" if math.isnan(v) else f"{v:.4g}"
    if isinstance(v, list | tuple):
        return ", ".join(f"{x:g}" if isinstance(x, float) else str(x) for x in v)
    return str(v)


def sweep_page(cache: CachedStore, cluster: str, sweep: str) -> str:
    rows = cache.rows(cluster, sweep, limit=ANALYSIS_MAX_ROWS)
    cells = analysis.with_baseline(rows)
    charts = [
        line_chart(
            curve_series(cells, "step_ms"),
            title="U-curve: step time vs bucket",
            log_x=True,
            x_label="bucket_cap_mb",
            y_label="step ms (median, 95% interval)",
            chart_id="u_curve",
        ),
        line_chart(
            curve_series(cells, "efficiency"),
            title="scaling efficiency vs bucket",
            log_x=True,
            x_label="bucket_cap_mb",
            y_label="efficiency",
            chart_id="efficiency",
        ),
    ]
    gain = analysis.no_sync_gain(rows)
    curve = analysis.u_curve(rows)
    errors = rows[rows["status"] == "error"]
    q = f"cluster={html.escape(cluster)}&amp;sweep={html.escape(sweep)}"
    logs = f"/sweeps/{html.escape(sweep)}/logs"
    parts = [
        f"<p>{len(rows)} rows, {len(errors)} errors. Download: <a href='/cells?{q}&amp;format=csv'>CSV</a> · "
        f"<a href='/cells?{q}&amp;format=parquet'>Parquet</a> · <a href='{logs}'>logs</a>"
        f" · <a href='/report?{q}'>full report</a></p>",
        f"<div class='charts'>{''.join(charts)}</div>",
        "<h2>Best bucket per curve</h2>",
        _table(
            curve,
            [
                "world_size",
                "gas",
                "no_sync",
                "best_bucket_cap_mb",
                "indistinguishable_buckets_mb",
                "best_step_ms",
                "best_step_ms_ci_lo",
                "best_step_ms_ci_hi",
                "best_efficiency",
                "min_resolvable_rel",
                "rounds_for_target",
            ],
            "best",
        ),
    ]
    parts.append(recommendation_section(rows))
    cal = cache.calibration(cluster, sweep)
    if scaling.topologies(rows) > 1:
        parts += scaling_section(rows, cal)
    if not gain.empty:
        parts += [
            "<h2>no_sync gain</h2>",
            _table(
                gain,
                [
                    "world_size",
                    "gas",
                    "bucket_cap_mb",
                    "step_ms_sync",
                    "step_ms_no_sync",
                    "saved_ms",
                    "saved_ms_ci_lo",
                    "saved_ms_ci_hi",
                ],
                "no_sync",
            ),
        ]
    if not cal.empty:
        ar = cal[cal["kind"] == "all_reduce"]
        pts = [
            Series(f"{n}x{w // n}", [Point(r["size_bytes"] / 2**20, r["busbw_gbps"]) for _, r in g.iterrows()])
            for (w, n), g in ar.groupby(["world_size", "num_nodes"])
        ]
        parts.append(
            line_chart(
                pts,
                title="calibration: all-reduce bus bandwidth",
                log_x=True,
                x_label="message MiB",
                y_label="busbw GB/s",
                chart_id="calibration",
            )
        )
    if not errors.empty:
        parts += ["<h2>Errors</h2>", _table(errors, ["cell_id", "repeat", "mode", "bucket_cap_mb", "error"], "errors")]
    return page(f"sweep {sweep} on {cluster}", "".join(parts))


def _compared(cache: CachedStore, by: str, label: str) -> pd.DataFrame:
    """One side of a comparison: a cluster's rows, or a sweep's with the sweep id as its `cluster`."""
    if by == "cluster":
        return cache.rows(label, limit=ANALYSIS_MAX_ROWS)
    return cache.rows(sweep=label, limit=ANALYSIS_MAX_ROWS).assign(cluster=label)


def compare_page(cache: CachedStore, a: str | None, b: str | None, by: str = "cluster") -> str:
    """Two clusters (by=cluster) or two sweeps (by=sweep) side by side: curves overlaid, then the table."""
    column = "cluster" if by == "cluster" else "sweep_id"
    labels = sorted(pc.unique(cache.table()[column]).to_pylist())

    def options(chosen: str | None) -> str:
        return "".join(f"<option{' selected' if c == chosen else ''}>{html.escape(c)}</option>" for c in labels)

    other = "sweep" if by == "cluster" else "cluster"
    form = (
        f"<form method='get'><input type='hidden' name='by' value='{by}'>{by} A <select name='a'>{options(a)}"
        f"</select> {by} B <select name='b'>{options(b)}</select> <button>compare</button> "
        f"<a href='/ui/compare?by={other}'>compare two {other}s instead</a></form>"
    )
    if not a or not b:
        return page(f"compare two {by}s", form)
    rows = pd.concat([_compared(cache, by, a), _compared(cache, by, b)], ignore_index=True)
    cells = analysis.with_baseline(rows)
    series = [s for c in (a, b) for s in curve_series(cells[cells["cluster"] == c], "step_ms", f"{c}: ")]
    chart = line_chart(
        series,
        title=f"U-curves: {a} vs {b}",
        log_x=True,
        x_label="bucket_cap_mb",
        y_label="step ms (median, 95% interval)",
        chart_id="compare_curves",
    )
    compared = compare_mod.compare(rows, a, b)
    table = _table(compared, list(compared.columns), "comparison")
    return page(f"compare {a} vs {b}", form + chart + "<h2>Cell by cell (b / a)</h2>" + table)


def sweeps_json(cache: CachedStore, address: str | None) -> str:
    return json.dumps(sweeps(cache, address))
