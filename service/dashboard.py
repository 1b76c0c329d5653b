"""The dashboard: HTML pages over the same cached store as the API (the report's figures as inline SVG, no
external assets).

/                          every sweep in the store (local runs included), merged with Ray Jobs where a
                           cluster is attached; the table refreshes itself every 2 s from /ui/sweeps.json
/ui/sweep/{cluster}/{id}   U-curves, efficiency, scaling and no_sync with intervals, best buckets, errors, downloads
/ui/compare?a=C1&b=C2      two clusters' U-curves overlaid, and the comparison table with its flags
"""

from __future__ import annotations

import json

import jinja2
import markupsafe
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from results.analysis import cells as analysis
from results.analysis import compare as compare_mod
from results.analysis import history as history_mod
from results.analysis import recommend, scaling, stragglers
from results.model import predicted
from results.render import plots, report
from results.storage.cache import ANALYSIS_MAX_ROWS, CachedStore
from results.values import with_intervals
from service.clusterstate import ClusterState
from sweeps.driver import machine

STYLE = """body{font-family:system-ui,sans-serif;margin:1.5em 2em;color:#222;max-width:1280px}
table{border-collapse:collapse;font-size:13px;margin:.6em 0}
td,th{border:1px solid #ddd;padding:3px 8px;text-align:right}
th{background:#f4f4f4}td.l,th.l{text-align:left}nav a{margin-right:1em}.charts{display:flex;flex-wrap:wrap;gap:12px}
.chart{border:1px solid #eee;background:#fff;max-width:100%;height:auto}.err{color:#b00}.empty{color:#777}"""


TEMPLATES = jinja2.Environment(
    loader=jinja2.PackageLoader("service", "templates"),
    autoescape=True,  # every value is text unless marked safe (the SVG charts, whose text ElementTree escaped)
    undefined=jinja2.StrictUndefined,
)


def sweeps(cache: CachedStore, cluster: ClusterState | None) -> list[dict]:
    """One dict per sweep: cluster, sweep_id, spec_name, started, state, written, planned, errors. The cluster's
    job states are its last answer (service.clusterstate), `(stale)` where that answer is old or missing."""
    running_here = machine.sweeps_measuring()
    remote, stale = cluster.latest() if cluster is not None else ({}, False)
    mark = " (stale)" if stale else ""
    out = []
    for g in sweep_counts(cache.table()):
        cluster_label, sweep = g["cluster"], g["sweep_id"]
        manifest = cache.manifest(cluster_label, sweep)
        job = remote.get(sweep)
        state = job.state + mark if job else ("RUNNING (this machine)" if sweep in running_here else "")
        written, planned = g["status_count"], int(manifest.get("planned", 0)) if manifest else 0
        out.append(
            {
                "cluster": cluster_label,
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
            "state": j.state + mark,
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


SCALING_COLUMNS = [*(c for c in scaling.COLUMNS if c != "cluster"), "knee_why"]  # one sweep: one cluster
BEST_COLUMNS = ["world_size", "gas", "no_sync", "best_bucket_cap_mb", "indistinguishable_buckets_mb"]
BEST_COLUMNS += ["best_step_ms", "best_efficiency", "min_resolvable_rel", "rounds_for_target"]
NO_SYNC_COLUMNS = ["world_size", "gas", "bucket_cap_mb", "step_ms_sync", "step_ms_no_sync", "saved_ms"]
ERROR_COLUMNS = ["cell_id", "repeat", "mode", "bucket_cap_mb", "error"]
CHECK_COLUMNS = ["world_size", "gas", "no_sync", "bucket_cap_mb", "comm_hook", "grad_check", "grad_rel_error"]
CHECK_COLUMNS += ["grad_rel_error_min", "grad_rel_error_max", "grad_tol", "grad_checks", "grad_checks_failed"]


def scaling_context(rows: pd.DataFrame, calibration: pd.DataFrame) -> dict:
    """The knee table of scaling by topology (its figure is among the charts)."""
    table = with_intervals(scaling.scaling(rows, calibration), scaling.INTERVALS)
    return {"table": table_context(table, SCALING_COLUMNS, "scaling_table")}


def table_context(df: pd.DataFrame, columns: list[str], table_id: str) -> dict:
    """A table for the `table` macro: the named columns, and every knob that varies in `df` (two lines never
    look alike), each value as text."""
    cols, rows = report.text_table(df, columns)
    return {"id": table_id, "columns": cols, "rows": rows}


def sweep_page(cache: CachedStore, cluster: str, sweep: str) -> str:
    rows = cache.rows(cluster, sweep, limit=ANALYSIS_MAX_ROWS)
    with analysis.computed_once():  # every section reads one computation of the cells
        context = sweep_context(cache, rows, cluster, sweep)
    return TEMPLATES.get_template("sweep.html").render(
        title=f"sweep {sweep} on {cluster}", style=markupsafe.Markup(STYLE), script="", **context
    )


def sweep_context(cache: CachedStore, rows: pd.DataFrame, cluster: str, sweep: str) -> dict:
    """What the sweep page shows: counts and links, the report's figures, the best bucket per curve, the
    recommendation, scaling by topology, the no_sync gain, the gradient checks, the ranks and the errors."""
    errors = rows[rows["status"] == "error"]
    checks = analysis.gradient_checks(rows)
    cal = cache.calibration(cluster, sweep)
    gain = with_intervals(analysis.no_sync_gain(rows), ["saved_ms"])
    model = prediction(cache, rows, cluster)
    return {
        "cluster": cluster,
        "sweep": sweep,
        "n_rows": len(rows),
        "n_errors": len(errors),
        "n_planted": int(analysis.planted(rows).sum()),
        "charts": charts(rows, cal, model),
        "best": table_context(with_intervals(analysis.u_curve(rows), ["best_step_ms"]), BEST_COLUMNS, "best"),
        "prediction": None if model is None else accuracy_context(model),
        "recs": recommend.recommend(rows),
        "scaling": scaling_context(rows, cal) if scaling.topologies(rows) > 1 else None,
        "no_sync": None if gain.empty else table_context(gain, NO_SYNC_COLUMNS, "no_sync"),
        "errors": None if errors.empty else table_context(errors, ERROR_COLUMNS, "errors"),
        "checks": None if checks.empty else table_context(checks, CHECK_COLUMNS, "grad_check"),
        "n_failed_checks": int((checks["grad_check"] == "failed").sum()),
        "ranks": ranks_context(rows),
    }


RANK_COLUMNS = ["host", "local_rank", "device", "rows", "compute_ms", "others_ms", "ratio", "ratio_lo", "ratio_hi"]
RANK_COLUMNS += ["cost_ms", "cost_rel", "planted", "straggler"]


def ranks_context(rows: pd.DataFrame) -> dict | None:
    """Each device's compute against its peers (results.analysis.stragglers) and the stragglers in words; None where the
    rows carry no per-rank figures."""
    table = stragglers.stragglers(rows)
    if table.empty:
        return None
    named = [stragglers.named(line) for _, line in table[table["straggler"]].iterrows()]
    return {
        "named": named,
        "table": table_context(table, RANK_COLUMNS, "ranks"),
        "min_rel": stragglers.MIN_REL,
        "min_rows": stragglers.MIN_ROWS,
    }


def prediction(cache: CachedStore, rows: pd.DataFrame, cluster: str) -> dict[str, pd.DataFrame] | None:
    """The overlap model beside the sweep's cells (results.model.predicted), from the cluster's newest calibration."""
    return predicted.for_rows(rows, cache.profiles().to_pandas(), cache.calibration(cluster))


def accuracy_context(model: dict[str, pd.DataFrame]) -> dict:
    return table_context(predicted.accuracy_table(model), predicted.ACCURACY_COLUMNS, "prediction")


def charts(rows: pd.DataFrame, calibration: pd.DataFrame, model: dict | None) -> list[markupsafe.Markup]:
    """The report's figures (results.render.report.figures) as inline SVG, one per figure, ids by figure."""
    with report.RENDER_LOCK:
        drawn = report.figures(rows, calibration, model)
        return [markupsafe.Markup(plots.svg(fig, stem)) for stem, fig in drawn.items()]  # ElementTree escapes text


def _compared(cache: CachedStore, by: str, label: str) -> pd.DataFrame:
    """One side of a comparison: a cluster's rows, or a sweep's with the sweep id as its `cluster`."""
    if by == "cluster":
        return cache.rows(label, limit=ANALYSIS_MAX_ROWS)
    return cache.rows(sweep=label, limit=ANALYSIS_MAX_ROWS).assign(cluster=label)


def compare_page(cache: CachedStore, a: str | None, b: str | None, by: str = "cluster") -> str:
    """Two clusters (by=cluster) or two sweeps (by=sweep) side by side: curves overlaid, then the table."""
    column = "cluster" if by == "cluster" else "sweep_id"
    labels = sorted(pc.unique(cache.table()[column]).to_pylist())
    context = {"by": by, "other": "sweep" if by == "cluster" else "cluster", "labels": labels, "a": a, "b": b}
    context |= {"title": f"compare {a} vs {b}" if a and b else f"compare two {by}s", "chart": None, "table": None}
    if a and b:
        rows = pd.concat([_compared(cache, by, a), _compared(cache, by, b)], ignore_index=True)
        with report.RENDER_LOCK:
            chart = plots.svg(plots.u_curve_figure(rows, overlay=True), "compare_curves")
        compared = compare_mod.compare(rows, a, b)
        context |= {
            "chart": markupsafe.Markup(chart),
            "table": table_context(compared, list(compared.columns), "comparison"),
        }
    return TEMPLATES.get_template("compare.html").render(style=markupsafe.Markup(STYLE), script="", **context)


def history_page(cache: CachedStore, cluster: str | None) -> str:
    """One cluster over time (results.analysis.history): each configuration before and after a version change."""
    labels = sorted(pc.unique(cache.table()["cluster"]).to_pylist())
    context = {"title": f"history of {cluster}" if cluster else "a cluster's history", "labels": labels}
    context |= {"cluster": cluster, "table": None, "n_flagged": 0}
    if cluster:
        changes = history_mod.history(cache.rows(cluster, limit=ANALYSIS_MAX_ROWS), cluster)
        if not changes.empty:
            context |= {"table": table_context(changes, list(changes.columns), "history")}
            context |= {"n_flagged": int(changes["flagged"].sum())}
    return TEMPLATES.get_template("history.html").render(style=markupsafe.Markup(STYLE), script="", **context)


def sweeps_json(cache: CachedStore, cluster: ClusterState | None) -> str:
    return json.dumps(sweeps(cache, cluster))
