"""One self-contained HTML report (figures embedded as PNG data URIs, no remote assets), or the PNGs alone."""

from __future__ import annotations

import base64
import html
import io
import threading
from datetime import UTC, datetime
from pathlib import Path

import pandas as pd
from matplotlib.figure import Figure

from results import analysis, plots, recommend, scaling

STYLE = """body{font-family:system-ui,sans-serif;margin:2em;max-width:1200px;color:#222}
table{border-collapse:collapse;font-size:13px;margin:1em 0}td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}
th{background:#f3f3f3}img{max-width:100%;border:1px solid #eee;margin:0.5em 0}h2{margin-top:1.5em}"""


# matplotlib's text layout (its mathtext parser and font caches) is shared by every figure and not thread-safe,
# even without pyplot: one report renders at a time in a process (the HTTP server renders on a thread pool).
RENDER_LOCK = threading.Lock()


def figures(
    rows: pd.DataFrame, algbw_bytes_per_s: float | None = None, calibration: pd.DataFrame | None = None
) -> dict[str, Figure]:
    """The report's figures by file stem (only those the rows can support)."""
    out = {}
    if calibration is not None and not calibration.empty:
        out["calibration"] = plots.calibration_figure(calibration)
    ddp = rows[(rows["status"] == "ok") & (rows["mode"] == "ddp")]
    if scaling.topologies(rows) > 1:
        out["scaling"] = plots.scaling_figure(scaling.scaling(rows, calibration))
    if not ddp.empty:
        out["u_curve"] = plots.u_curve_figure(rows)
        out["efficiency"] = plots.efficiency_figure(rows)
        if (ddp["gas"] > 1).any():
            out["no_sync"] = plots.no_sync_figure(rows)
        if "comm_ms" in ddp and ddp["comm_ms"].notna().any():
            out["overlap"] = plots.overlap_figure(rows)
        if algbw_bytes_per_s:
            out["measured_vs_predicted"] = plots.measured_vs_predicted_figure(rows, algbw_bytes_per_s)
    return out


def _png(fig: Figure) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    return buf.getvalue()


def write_pngs(
    rows: pd.DataFrame,
    out_dir: str | Path,
    algbw_bytes_per_s: float | None = None,
    calibration: pd.DataFrame | None = None,
) -> list[Path]:
    with RENDER_LOCK:
        return _write_pngs(rows, out_dir, algbw_bytes_per_s, calibration)


def _write_pngs(
    rows: pd.DataFrame, out_dir: str | Path, algbw_bytes_per_s: float | None, calibration: pd.DataFrame | None
) -> list[Path]:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for stem, fig in figures(rows, algbw_bytes_per_s, calibration).items():
        path = out / f"{stem}.png"
        path.write_bytes(_png(fig))
        paths.append(path)
    return paths


def _table(df: pd.DataFrame, columns: list[str]) -> str:
    cols = [c for c in columns if c in df.columns]
    if df.empty:
        return "<p>(none)</p>"
    return df[cols].to_html(index=False, float_format=lambda v: f"{v:.3g}" if abs(v) < 1 else f"{v:.1f}", na_rep="–")


def _fmt(v: float) -> str:
    return f"{v:.3g}" if abs(v) < 1 else f"{v:.1f}"


def _with_intervals(df: pd.DataFrame, names: list[str]) -> pd.DataFrame:
    """Each named figure as text 'median [lo, hi]' where its interval is known."""
    if df.empty:
        return df
    out = df.copy()
    for name in names:
        lo, hi = out.get(f"{name}_ci_lo"), out.get(f"{name}_ci_hi")
        if lo is None:
            continue
        out[name] = [
            _fmt(v) if pd.isna(a) else f"{_fmt(v)} [{_fmt(a)}, {_fmt(b)}]"
            for v, a, b in zip(out[name], lo, hi, strict=True)
        ]
    return out


def calibration_tables(rows: pd.DataFrame, calibration: pd.DataFrame) -> list[str]:
    """The α–β fits, and each DDP cell's measured step beside what its own cluster's calibration predicts."""
    from results import costmodel

    fits = costmodel.fits(calibration)
    pred = costmodel.predictions(analysis.with_baseline(rows, keep_reps=True), calibration)
    parts = [
        "<h2>Calibration: the α–β model per group of ranks</h2>",
        _table(
            fits.assign(alpha_us=fits["alpha_ms"] * 1e3),
            [
                "cluster",
                "world_size",
                "num_nodes",
                "backend",
                "alpha_us",
                "beta_gbps",
                "max_rel_residual",
                "n_sizes",
                "uses",
            ],
        ),
    ]
    if pred.empty:
        return parts
    shown = ["step_ms", "exposed_comm_ms", "measured_over_predicted"]
    columns = [
        "cluster",
        "world_size",
        "gas",
        "no_sync",
        "bucket_cap_mb",
        "step_ms",
        "baseline_step_ms",
        "predicted_allreduce_ms",
        "no_overlap_bound_ms",
        "exposed_comm_ms",
        "measured_over_predicted",
        "predicted_single_bucket_ms",
    ]
    title = "<h2>Measured vs predicted (the sweep's own calibration)</h2>"
    return [*parts, title, _table(_with_intervals(pred, shown), columns)]


def scaling_tables(rows: pd.DataFrame, calibration: pd.DataFrame | None) -> list[str]:
    """The scaling section: every (series, topology) with its intervals, busbw and the knee."""
    table = scaling.scaling(rows, calibration)
    knees = table[table["knee"]]
    note = "".join(
        f"<p><b>Knee</b> at {html.escape(k.topology)} ({html.escape(k.cluster)}, gas {k.gas}, bucket "
        f"{k.bucket_cap_mb:g} MB): {html.escape(k.knee_why)}</p>"
        for k in knees.itertuples()
    )
    shown = _with_intervals(table, ["step_ms", "tokens_per_s", "efficiency", "vs_previous"])
    return [
        "<h2>Scaling by topology (nodes x workers per node)</h2>",
        note
        or "<p>No knee: per-rank throughput "
        "never fell by 10% or more (its whole interval) from one topology to the next.</p>",
        _table(
            shown,
            [
                "cluster",
                "gas",
                "no_sync",
                "bucket_cap_mb",
                "topology",
                "world_size",
                "step_ms",
                "tokens_per_s",
                "efficiency",
                "vs_previous",
                "comm_share",
                "busbw_gbps",
                "knee",
                "n_repeats",
            ],
        ),
    ]


def _recommendation(rows: pd.DataFrame) -> str:
    """`ddpsweep recommend`'s verdicts and snippets (escaped)."""
    out = ["<h2>Recommendation</h2>"]
    for r in recommend.recommend(rows):
        head = f"{r['model']} · {r['topology']} · gas {r['gas']}"
        out.append(
            f"<h3>{html.escape(head)}</h3><p><b>{html.escape(r['verdict'])}</b> "
            f"(compared with: {html.escape(r['default_note'])})</p><pre>{html.escape(r['snippet'])}</pre>"
        )
    return "".join(out)


def render_html(
    rows: pd.DataFrame, title: str, algbw_bytes_per_s: float | None = None, calibration: pd.DataFrame | None = None
) -> str:
    """The whole report as one HTML string (the sweep's own calibration used where there is one)."""
    ok = rows[rows["status"] == "ok"]
    parts = [
        f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>",
        f"<style>{STYLE}</style></head><body><h1>{html.escape(title)}</h1>",
        f"<p>{len(rows)} rows ({len(rows) - len(ok)} errors) from clusters "
        f"{html.escape(', '.join(sorted(rows['cluster'].unique())))}; generated "
        f"{datetime.now(UTC):%Y-%m-%d %H:%M UTC}.</p>",
    ]
    with RENDER_LOCK:
        images = {
            stem: base64.b64encode(_png(fig)).decode()
            for stem, fig in figures(rows, algbw_bytes_per_s, calibration).items()
        }
    for stem, data in images.items():
        parts.append(f"<h2>{stem.replace('_', ' ')}</h2><img alt='{stem}' src='data:image/png;base64,{data}'>")
    parts.append(_recommendation(rows))
    curve = analysis.u_curve(rows)
    parts.append(
        "<p>Every figure is a median with its 95% interval [lo, hi]: a hierarchical bootstrap over "
        "repeats and steps; derived figures computed on each bootstrap replicate, paired by round between the "
        "cells of one worker group. min_resolvable_rel: differences under it cannot be told apart by this "
        f"sweep; rounds_for_target: the rounds that would resolve {analysis.TARGET_REL:.0%}.</p>"
    )
    if not curve.empty:
        curve = curve.assign(
            indistinguishable_buckets_mb=curve["indistinguishable_buckets_mb"].map(
                lambda bs: ", ".join(f"{b:g}" for b in bs)
            )
        )
    parts += [
        "<h2>Best bucket per curve</h2>",
        _table(
            _with_intervals(curve, ["best_step_ms", "best_efficiency", "overlap_saved_ms"]),
            [
                "cluster",
                "world_size",
                "gas",
                "no_sync",
                "best_bucket_cap_mb",
                "indistinguishable_buckets_mb",
                "best_step_ms",
                "best_efficiency",
                "largest_bucket_step_ms",
                "overlap_saved_ms",
                "baseline_step_ms",
                "n_repeats",
                "min_resolvable_rel",
                "rounds_for_target",
            ],
        ),
    ]
    parts += [
        "<h2>no_sync gain</h2>",
        _table(
            _with_intervals(analysis.no_sync_gain(rows), ["saved_ms"]),
            [
                "cluster",
                "world_size",
                "gas",
                "bucket_cap_mb",
                "step_ms_sync",
                "step_ms_no_sync",
                "saved_ms",
                "tokens_per_s_gain",
            ],
        ),
    ]
    cells = _with_intervals(analysis.with_baseline(rows), ["step_ms", "efficiency", "exposed_comm_ms"])
    parts += [
        "<h2>All cells</h2>",
        _table(
            cells,
            [
                "cluster",
                "sweep_id",
                "mode",
                "world_size",
                "num_nodes",
                "bucket_cap_mb",
                "gas",
                "no_sync",
                "step_ms",
                "tokens_per_s",
                "efficiency",
                "exposed_comm_ms",
                "baseline_source",
                "n_repeats",
                "n_steps",
            ],
        ),
    ]
    if scaling.topologies(rows) > 1:
        parts += scaling_tables(rows, calibration)
    if calibration is not None and not calibration.empty:
        parts += calibration_tables(rows, calibration)
    errors = rows[rows["status"] == "error"]
    if not errors.empty:
        parts += ["<h2>Errors</h2>", _table(errors, ["cluster", "sweep_id", "cell_id", "mode", "world_size", "error"])]
    parts.append("</body></html>")
    return "\n".join(parts)
