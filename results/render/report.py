"""One self-contained HTML report (figures embedded as PNG data URIs, no remote assets), or the PNGs alone."""

from __future__ import annotations

import base64
import io
import threading
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import jinja2
import pandas as pd
from markupsafe import Markup
from matplotlib.figure import Figure

from results.analysis import cells as analysis
from results.analysis import identity, recommend, scaling
from results.render import plots
from results.values import text, with_intervals

STYLE = """body{font-family:system-ui,sans-serif;margin:2em;max-width:1200px;color:#222}
table{border-collapse:collapse;font-size:13px;margin:1em 0}td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}
th{background:#f3f3f3}img{max-width:100%;border:1px solid #eee;margin:0.5em 0}h2{margin-top:1.5em}"""


# matplotlib's text layout (its mathtext parser and font caches) is shared by every figure and not thread-safe,
# even without pyplot: one report renders at a time in a process (the HTTP server renders on a thread pool).
RENDER_LOCK = threading.Lock()

PAGES = jinja2.Environment(
    loader=jinja2.PackageLoader("results.render", "templates"),
    autoescape=True,  # every stored value (labels, errors, a workload's path) is text on the page, never markup
    undefined=jinja2.StrictUndefined,
)


@dataclass
class Table:
    """A table as the page shows it: column names and each row's cells as text."""

    columns: list[str]
    rows: list[list[str]]


@dataclass
class Section:
    """One titled part of the report: knees and notes (paragraphs), then a table (None: "(none)")."""

    title: str
    table: Table | None
    notes: list[str] = field(default_factory=list)
    knees: list[dict] = field(default_factory=list)  # scaling rows where the knee is


def figures(
    rows: pd.DataFrame,
    calibration: pd.DataFrame | None = None,
    prediction: dict | None = None,
) -> dict[str, Figure]:
    """The report's figures by file stem (only those the rows can support); `prediction` (results.model.predicted's
    comparison) adds each curve's predicted steps to the U-curve, dashed."""
    out = {}
    if calibration is not None and not calibration.empty:
        out["calibration"] = plots.calibration_figure(calibration)
    ddp = rows[(rows["status"] == "ok") & (rows["mode"] == "ddp")]
    if scaling.topologies(rows) > 1:
        out["scaling"] = plots.scaling_figure(scaling.scaling(rows, calibration))
    if not ddp.empty:
        out["u_curve"] = plots.u_curve_figure(rows, None if prediction is None else prediction["cells"])
        out["efficiency"] = plots.efficiency_figure(rows)
        if (ddp["gas"] > 1).any():
            out["no_sync"] = plots.no_sync_figure(rows)
        if "comm_ms" in ddp and ddp["comm_ms"].notna().any():
            out["overlap"] = plots.overlap_figure(rows)
    return out


def _png(fig: Figure) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    return buf.getvalue()


def write_pngs(
    rows: pd.DataFrame,
    out_dir: str | Path,
    calibration: pd.DataFrame | None = None,
    prediction: dict | None = None,
) -> list[Path]:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    with RENDER_LOCK, analysis.computed_once():
        drawn = {stem: _png(fig) for stem, fig in figures(rows, calibration, prediction).items()}
    for stem, png in drawn.items():
        path = out / f"{stem}.png"
        path.write_bytes(png)
        paths.append(path)
    return paths


def _table(df: pd.DataFrame, columns: list[str]) -> Table | None:
    """`text_table` as the report's Table; None where there are no rows."""
    return None if df.empty else Table(*text_table(df, columns))


def text_table(df: pd.DataFrame, columns: list[str]) -> tuple[list[str], list[list[str]]]:
    """The named columns `df` has and every knob that varies in it (two lines never look alike), and each row's
    values as text (results.values.text): what the report's and the dashboard's tables show."""
    cols = [c for c in identity.with_varying(columns, df) if c in df.columns]
    return cols, [[text(v) for v in row] for row in df[cols].itertuples(index=False)]


FIT_COLUMNS = ["cluster", "world_size", "num_nodes", "backend", "alpha_us", "beta_gbps", "max_rel_residual"]
CURVE_COLUMNS = ["cluster", "world_size", "gas", "no_sync", "best_bucket_cap_mb", "indistinguishable_buckets_mb"]
CURVE_COLUMNS += ["best_step_ms", "best_efficiency", "largest_bucket_step_ms", "overlap_saved_ms", "baseline_step_ms"]
CURVE_COLUMNS += ["n_repeats", "min_resolvable_rel", "rounds_for_target"]
NO_SYNC_COLUMNS = ["cluster", "world_size", "gas", "bucket_cap_mb", "step_ms_sync", "step_ms_no_sync", "saved_ms"]
NO_SYNC_COLUMNS += ["tokens_per_s_gain"]
CELL_COLUMNS = ["cluster", "sweep_id", "mode", "world_size", "num_nodes", "bucket_cap_mb", "gas", "no_sync"]
CELL_COLUMNS += ["step_ms", "tokens_per_s", "efficiency", "exposed_comm_ms", "baseline_source", "n_repeats", "n_steps"]
ERROR_COLUMNS = ["cluster", "sweep_id", "cell_id", "mode", "world_size", "error"]
CHECK_COLUMNS = ["cluster", "world_size", "gas", "no_sync", "bucket_cap_mb", "comm_hook", "grad_check"]
CHECK_COLUMNS += ["grad_rel_error", "grad_rel_error_min", "grad_rel_error_max", "grad_tol", "grad_checks"]
NO_KNEE = "No knee: per-rank throughput never fell by 10% or more (its whole interval) from one topology to the next."


def calibration_tables(rows: pd.DataFrame, calibration: pd.DataFrame) -> list[Section]:
    """The α–β fits of the sweep's own calibration and the overlap terms measured beside them (each cell's
    predicted step: the overlap model's section)."""
    from results.model import costmodel

    fits = costmodel.summary(calibration)
    us = {f"bucket_us{s}": fits[f"bucket_ms{s}"] * 1e3 for s in ("", "_ci_lo", "_ci_hi")}
    fits = with_intervals(
        fits.assign(alpha_us=fits["alpha_ms"] * 1e3, **us), ["compute", "bucket_us", "contention", "comm_contention"]
    )
    terms = ["compute", "bucket_us", "contention", "comm_contention"]
    fit_table = _table(fits, [*FIT_COLUMNS, "n_sizes", "uses", *terms])
    return [Section("Calibration: the α–β model and the overlap terms per group of ranks", fit_table)]


def scaling_tables(rows: pd.DataFrame, calibration: pd.DataFrame | None) -> list[Section]:
    """The scaling section: every (series, topology) with its intervals, busbw and the knee."""
    table = scaling.scaling(rows, calibration)
    knees = table[table["knee"]].to_dict("records")  # topology, cluster, gas, bucket_cap_mb, knee_why
    shown = with_intervals(table, scaling.INTERVALS)
    title = "Scaling by topology (nodes x workers per node)"
    return [Section(title, _table(shown, scaling.COLUMNS), notes=[] if knees else [NO_KNEE], knees=knees)]


def _recommendations(rows: pd.DataFrame) -> list[dict]:
    """`ddpsweep recommend`'s verdicts and snippets, per curve."""
    return [
        {
            "head": f"{r['model']} · {r['topology']} · gas {r['gas']}",
            "verdict": r["verdict"],
            "default_note": r["default_note"],
            "snippet": r["snippet"],
            "check": r["gradient_check"],
            "excluded": [f"{recommend.describe(c)}: {c['reason']}" for c in r["excluded"]],
            "stragglers": [s["text"] for s in r["stragglers"]],
        }
        for r in recommend.recommend(rows)
    ]


PREDICTION_NOTE = (
    "The overlap model (`ddpsweep predict`) from the cluster's profile of the workload and its newest calibration: "
    "per curve, median |predicted / measured - 1|, Spearman rank correlation and whether the predicted best lies "
    "in the measured indistinguishable set, at the profile's compute (slowdown 1) and at one compute factor fitted "
    "to the sweep's cells (_fitted)."
)
PREDICTED_CELL_COLUMNS = ["cluster", "world_size", "gas", "no_sync", "bucket_cap_mb", "step_ms", "predicted_ms"]
PREDICTED_CELL_COLUMNS += ["prediction_error", "predicted_ms_fitted", "prediction_error_fitted", "prediction_note"]


def prediction_tables(prediction: dict) -> list[Section]:
    """Each curve's accuracy, then each cell's predicted step beside its measured one."""
    from results.model import predicted

    curves = predicted.accuracy_table(prediction)
    cells = with_intervals(predicted.cell_view(prediction), ["step_ms"])
    return [
        Section("Predicted beside measured: each curve", _table(curves, predicted.ACCURACY_COLUMNS), [PREDICTION_NOTE]),
        Section("Predicted beside measured: each cell", _table(cells, PREDICTED_CELL_COLUMNS)),
    ]


def _sections(rows: pd.DataFrame, calibration: pd.DataFrame | None, prediction: dict | None = None) -> list[Section]:
    curve = analysis.u_curve(rows)
    curve = with_intervals(curve, ["best_step_ms", "best_efficiency", "overlap_saved_ms"])
    gain = with_intervals(analysis.no_sync_gain(rows), ["saved_ms"])
    cells = with_intervals(analysis.with_baseline(rows), ["step_ms", "efficiency", "exposed_comm_ms"])
    sections = [
        Section("Best bucket per curve", _table(curve, CURVE_COLUMNS)),
        Section("no_sync gain", _table(gain, NO_SYNC_COLUMNS)),
        Section("All cells", _table(cells, CELL_COLUMNS)),
    ]
    if prediction is not None:
        sections += prediction_tables(prediction)
    if scaling.topologies(rows) > 1:
        sections += scaling_tables(rows, calibration)
    if calibration is not None and not calibration.empty:
        sections += calibration_tables(rows, calibration)
    checks = analysis.gradient_checks(rows)
    if not checks.empty:
        sections.append(Section("Gradient check", _table(checks, CHECK_COLUMNS)))
    errors = rows[rows["status"] == "error"]
    if not errors.empty:
        sections.append(Section("Errors", _table(errors, ERROR_COLUMNS)))
    return sections


def render_html(
    rows: pd.DataFrame,
    title: str,
    calibration: pd.DataFrame | None = None,
    prediction: dict | None = None,
) -> str:
    """The whole report as one HTML string (the sweep's own calibration used where there is one; `prediction`:
    results.model.predicted's comparison), rendered from `results/render/templates/report.html` with every value
    escaped. Every section reads one computation of the cells (analysis.computed_once)."""
    with analysis.computed_once():
        return _render_html(rows, title, calibration, prediction)


def _render_html(rows: pd.DataFrame, title: str, calibration: pd.DataFrame | None, prediction: dict | None) -> str:
    with RENDER_LOCK:
        images = [
            (stem, base64.b64encode(_png(fig)).decode()) for stem, fig in figures(rows, calibration, prediction).items()
        ]
    return PAGES.get_template("report.html").render(
        title=title,
        style=Markup(STYLE),  # a constant of this module, not data
        n_rows=len(rows),
        n_errors=int((rows["status"] != "ok").sum()),
        clusters=", ".join(sorted(rows["cluster"].unique())),
        generated=f"{datetime.now(UTC):%Y-%m-%d %H:%M UTC}",
        images=images,
        recommendations=_recommendations(rows),
        target_rel=f"{analysis.TARGET_REL:.0%}",
        sections=_sections(rows, calibration, prediction),
    )
