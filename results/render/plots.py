"""matplotlib figures over result rows: the report's PNGs and the dashboard's inline SVG are the same figures.

Figures are plain `matplotlib.figure.Figure` objects, never pyplot: pyplot's global figure manager is not
thread-safe, and the HTTP server renders reports for concurrent requests on a thread pool.
"""

from __future__ import annotations

import io
import math
import xml.etree.ElementTree as ET

import matplotlib
import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, NullFormatter

from results.analysis import cells as analysis
from results.analysis import identity

# Labels come from stored values (cluster folders, spec names): drawn as plain text, never as mathtext
# (a folder named `m$\\frac{x$` made every report a 500).
matplotlib.rcParams["text.parse_math"] = False
matplotlib.rcParams["svg.fonttype"] = "none"  # text stays text in the SVG (small, searchable)
SVG_NS, XLINK_NS = "http://www.w3.org/2000/svg", "http://www.w3.org/1999/xlink"
ET.register_namespace("", SVG_NS)
ET.register_namespace("xlink", XLINK_NS)


def _subplots(nrows: int = 1, ncols: int = 1, *, figsize: tuple[float, float], squeeze: bool = True):
    """pyplot.subplots without pyplot's global state (each call owns its figure; nothing to close)."""
    fig = Figure(figsize=figsize)
    return fig, fig.subplots(nrows, ncols, squeeze=squeeze)


def _log_x(*axes) -> None:
    """Log x axes labelled 0.1, 1, 10 as plain text: their default labels are mathtext, which is off here."""
    for ax in axes:
        ax.set_xscale("log")
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.xaxis.set_minor_formatter(NullFormatter())


def _ddp_cells(rows: pd.DataFrame) -> pd.DataFrame:
    t = analysis.with_baseline(rows, keep_reps=True)  # indistinguishable() compares replicates
    return t[t["mode"] == "ddp"]


def _finish(fig: Figure, ax, **legend) -> Figure:
    ax.legend(fontsize=8, **legend)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def errorbar(ax, x, y, lo, hi, fmt: str = "-o", **kw) -> str:
    """Medians with their 95% intervals as error bars (none where an interval is unknown); the line's colour."""
    y, lo, hi = (pd.Series(v, dtype=float).to_numpy() for v in (y, lo, hi))
    # a percentile interval need not contain the point estimate (skewed replicates): never a negative bar
    yerr = np.nan_to_num(np.clip([y - lo, hi - y], 0, None))
    bars = ax.errorbar(list(x), y, yerr=yerr, fmt=fmt, capsize=3, **kw)
    _points(bars.lines[0], kw.get("label", ""), list(x), y, lo, hi)
    return bars.lines[0].get_color()


def _points(line, label: str, x, y, lo=None, hi=None) -> None:
    """Remember the drawn points of `line` (series `label`) on its figure, for `svg`'s data attributes and hover
    titles."""
    n = len(y)
    lo, hi = (np.full(n, np.nan) if v is None else pd.Series(v, dtype=float).to_numpy() for v in (lo, hi))
    pts = [(float(a), float(b), c, d) for a, b, c, d in zip(x, y, lo, hi, strict=True)]
    line.figure.__dict__.setdefault("drawn_points", []).append((line, label, pts))


def svg(fig: Figure, chart_id: str) -> str:
    """The figure as inline SVG with id `chart_id`. Each line drawn by `errorbar` (or a prediction) is a
    `g.series` with its label in data-series; each of its points carries data-x, data-y and a <title> that
    hover shows: the series, x, the value and its 95% interval."""
    drawn = fig.__dict__.get("drawn_points", [])
    for i, (line, _, _) in enumerate(drawn):
        line.set_gid(f"{chart_id}-{i}")
    buf = io.BytesIO()
    fig.savefig(buf, format="svg", metadata={"Date": None})
    root = ET.fromstring(buf.getvalue())
    groups = {g.get("id"): g for g in root.iter(f"{{{SVG_NS}}}g")}
    for line, label, pts in drawn:
        group = groups.get(line.get_gid())
        if group is not None:
            _annotate(group, line, label, [p for p in pts if math.isfinite(p[0]) and math.isfinite(p[1])])
    root.set("id", chart_id)
    root.set("class", "chart")
    return ET.tostring(root, encoding="unicode")


def _annotate(group: ET.Element, line, label: str, pts: list[tuple[float, float, float, float]]) -> None:
    x_label, y_label = line.axes.get_xlabel(), line.axes.get_ylabel()
    group.set("class", "series")
    group.set("data-series", label)
    for use, (x, y, lo, hi) in zip(group.iter(f"{{{SVG_NS}}}use"), pts, strict=False):
        interval = f" [{lo:.4g}, {hi:.4g}]" if math.isfinite(lo) and math.isfinite(hi) else ""
        use.set("class", "point")
        use.set("data-x", f"{x:g}")
        use.set("data-y", f"{y:.6g}")
        ET.SubElement(use, f"{{{SVG_NS}}}title").text = f"{label}: {x_label} {x:g} → {y_label} {y:.4g}{interval}"


def _mark_indistinguishable(ax, line: pd.DataFrame, color: str) -> None:
    """Shade the buckets whose interval overlaps the best one's: the honest answer to 'which bucket?'."""
    best = line.loc[line["step_ms"].idxmin()]
    same = analysis.indistinguishable(line, best)
    ax.axvspan(min(same) / 1.15, max(same) * 1.15, color=color, alpha=0.1)
    ax.plot([best["bucket_cap_mb"]], [best["step_ms"]], "*", color=color, markersize=14)


def curve_label(curve: dict, panel: pd.DataFrame) -> str:
    """`2 ranks, no_sync=False`, then every other curve key whose value differs between the panel's lines
    (topology, hook, timing, sweep, …), so two lines never share a label."""
    extra = analysis.varying(curve, panel, shown=("world_size", "no_sync"))
    return ", ".join([f"{curve['world_size']} ranks", f"no_sync={bool(curve['no_sync'])}", *extra])


def u_curve_figure(rows: pd.DataFrame, predicted: pd.DataFrame | None = None, *, overlay: bool = False) -> Figure:
    """step_ms against bucket_cap_mb (log x): a panel per (cluster, gas), a line per curve (analysis.CURVE_KEYS:
    everything but the bucket), labelled by what differs between the panel's lines; with `predicted`
    (results.model.predicted's cells), each curve's predicted steps dashed in its colour. `overlay`: a panel per
    gas, the clusters' curves in it, each label led by its cluster (two clusters compared)."""
    t = _ddp_cells(rows)
    t = t[t["bucket_cap_mb"].notna()]
    clusters = ["all"] if overlay else sorted(t["cluster"].unique()) or ["-"]
    gases = sorted(t["gas"].unique()) or [1]
    fig, axes = _subplots(len(clusters), len(gases), figsize=(5.5 * len(gases), 3.8 * len(clusters)), squeeze=False)
    for (i, cluster), (j, gas) in ((ci, gj) for ci in enumerate(clusters) for gj in enumerate(gases)):
        in_panel = (t["gas"] == gas) & ((t["cluster"] == cluster) | overlay)  # overlay: every cluster's
        ax, sub = axes[i][j], t[in_panel]
        keys = [k for k in analysis.CURVE_KEYS if k not in ("cluster", "gas")]
        for key, line in sub.groupby(["cluster", *keys], dropna=False):
            line, curve = line.sort_values("bucket_cap_mb"), dict(zip(keys, key[1:], strict=True))
            label = curve_label(curve, sub)
            color = errorbar(
                ax,
                line["bucket_cap_mb"],
                line["step_ms"],
                line["step_ms_ci_lo"],
                line["step_ms_ci_hi"],
                label=f"{key[0]}: {label}" if overlay else label,
            )
            _mark_indistinguishable(ax, line, color)
            _predicted_line(ax, predicted, line, color, label)
        _baseline(ax, sub)
        title = f"gas={gas}" if overlay else f"{cluster}: gas={gas}"
        _log_x(ax)
        ax.set(
            xlabel="bucket_cap_mb (MB, log)",
            ylabel="step time (ms, median, 95% interval)",
            title=f"{title} (★ best; band: indistinguishable from it)",
        )
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def _baseline(ax, sub: pd.DataFrame) -> None:
    base = sub.dropna(subset=["baseline_step_ms"])
    if not base.empty:
        scaled = " (gas x gas-1 run)" if base["baseline_source"].iloc[0] == "gas1_scaled" else ""
        label = f"single-worker baseline{scaled}"
        ax.axhline(base["baseline_step_ms"].iloc[0], color="grey", linestyle="--", label=label)


def _predicted_line(ax, predicted: pd.DataFrame | None, line: pd.DataFrame, color: str, label: str) -> None:
    """The overlap model's steps for the cells of `line` (curve `label`, matched by configuration), dashed."""
    if predicted is None or predicted.empty:
        return
    mine = predicted[predicted["predicted_ms"].notna()]
    mine = mine[pd.Series(identity.config_text(mine), index=mine.index).isin(identity.config_text(line))]
    if not mine.empty:
        mine = mine.sort_values("bucket_cap_mb")
        drawn = ax.plot(mine["bucket_cap_mb"], mine["predicted_ms"], "--x", color=color, alpha=0.8, label="predicted")
        _points(drawn[0], f"{label} predicted", list(mine["bucket_cap_mb"]), mine["predicted_ms"].to_numpy(float))


def efficiency_figure(rows: pd.DataFrame) -> Figure:
    """Best scaling efficiency (over buckets) against world size, a line per configuration but its placement and
    bucket (results.analysis.identity), labelled by what differs."""
    t = _ddp_cells(rows)
    fig, ax = _subplots(figsize=(6, 4))
    sizes = sorted({1, *t["world_size"].dropna().astype(int)})
    keys = identity.keys_but("world_size", "num_nodes", "bucket_cap_mb")
    for key, grp in t.groupby(keys, dropna=False):
        label = identity.line_label(dict(zip(keys, key, strict=True)), t, ["cluster", "gas", "no_sync"])
        grp = grp[grp["efficiency"].notna()]  # no ok baseline: no efficiency to draw
        if grp.empty:
            continue
        best = grp.loc[grp.groupby("world_size")["efficiency"].idxmax()].sort_values("world_size")
        xs = [1, *best["world_size"]]  # one rank is the baseline: 100% by definition
        pct = {k: [100.0, *(best[k] * 100)] for k in ("efficiency", "efficiency_ci_lo", "efficiency_ci_hi")}
        errorbar(ax, xs, pct["efficiency"], pct["efficiency_ci_lo"], pct["efficiency_ci_hi"], label=label)
    ax.axhline(100, color="grey", linestyle="--", label="ideal")
    ax.set_xscale("log", base=2)
    ax.set_xticks(sizes, [str(s) for s in sizes])
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set(xlabel="world size (ranks, log2)", ylabel="scaling efficiency (%)", title="Scaling efficiency (best bucket)")
    ax.set_ylim(0, max(110, ax.get_ylim()[1]))
    return _finish(fig, ax, loc="lower left")


def no_sync_figure(rows: pd.DataFrame) -> Figure:
    """Throughput against gas with and without no_sync (best bucket), per cluster and world size."""
    t = _ddp_cells(rows)
    fig, ax = _subplots(figsize=(6, 4))
    keys = identity.keys_but("gas", "bucket_cap_mb")
    for key, grp in t.groupby(keys, dropna=False):
        label = identity.line_label(dict(zip(keys, key, strict=True)), t, ["cluster", "world_size", "no_sync"])
        best = grp.loc[grp.groupby("gas")["tokens_per_s"].idxmax()].sort_values("gas")
        tokens = best["tokens_per_step"] / 1e3  # ktokens per step; tokens/s = tokens / step time
        errorbar(
            ax,
            best["gas"],
            best["tokens_per_s"] / 1e3,
            tokens / (best["step_ms_ci_hi"] / 1e3),
            tokens / (best["step_ms_ci_lo"] / 1e3),
            fmt="-o" if grp["no_sync"].astype(bool).any() else ":o",
            label=label,
        )
    ax.set(
        xlabel="gradient accumulation steps (gas)", ylabel="throughput (ktokens/s)", title="no_sync under accumulation"
    )
    return _finish(fig, ax)


def calibration_figure(calibration: pd.DataFrame) -> Figure:
    """busbw against message size (log x), a line per fit, with the α–β model's prediction dashed."""
    from results.model import costmodel

    fig, ax = _subplots(figsize=(6.5, 4))
    for _, fit in costmodel.fits(calibration).iterrows():
        n = fit["world_size"]
        sizes, ms = fit["curve_bytes"], fit["curve_ms"]
        busbw = analysis.busbw_from_algbw(sizes / (ms / 1e3), n) / 1e9
        label = f"{fit['cluster']} {n} ranks/{fit['num_nodes']} node(s) {fit['backend']}"
        line = ax.plot(sizes, busbw, "o-", label=label)[0]
        line_fit = fit.copy()
        line_fit["uses"] = "fit"  # draw the α–β line itself, even where the report uses the measured curve
        model = analysis.busbw_from_algbw(sizes / (costmodel.predict_ms(line_fit, sizes) / 1e3), n) / 1e9
        ax.plot(
            sizes,
            model,
            "--",
            color=line.get_color(),
            label=f"α={fit['alpha_ms'] * 1e3:.0f} µs, β={fit['beta_gbps']:.2f} GB/s algbw",
        )
    _log_x(ax)
    ax.set(
        xlabel="message size (bytes, log)",
        ylabel="busbw (GB/s)",
        title="All-reduce bandwidth by size (measured, and the α–β fit dashed)",
    )
    return _finish(fig, ax)


def overlap_figure(rows: pd.DataFrame) -> Figure:
    """Measured communication per step by bucket size, stacked: hidden behind backward vs exposed after it
    (from trace_comm rows; medians over repeats)."""
    traced = rows[(rows["status"] == "ok") & rows["comm_ms"].notna()]
    keys = identity.keys_but("bucket_cap_mb")
    traced_all = identity.with_knobs(traced)
    panels = list(traced_all.groupby(keys, dropna=False))
    fig, axes = _subplots(1, max(1, len(panels)), figsize=(5.5 * max(1, len(panels)), 3.8), squeeze=False)
    for ax, (key, grp) in zip(axes[0], panels, strict=False):
        by = grp.groupby("bucket_cap_mb")[["comm_ms", "comm_exposed_ms"]].median().sort_index()
        labels = [f"{b:g}" for b in by.index]
        ax.bar(labels, by["comm_ms"] - by["comm_exposed_ms"], label="hidden behind backward")
        ax.bar(labels, by["comm_exposed_ms"], bottom=by["comm_ms"] - by["comm_exposed_ms"], label="exposed")
        ax.set(
            xlabel="bucket_cap_mb",
            ylabel="communication per step (ms)",
            title=identity.line_label(dict(zip(keys, key, strict=True)), traced_all, ["cluster", "world_size", "gas"]),
        )
        ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def scaling_figure(table: pd.DataFrame) -> Figure:
    """tokens/s and scaling efficiency against world size (log2 x), with intervals; a line per series and
    placement line (one node / W per node, see results.analysis.scaling.lines), knees circled in red."""
    from results.analysis import scaling

    fig, (tput, eff) = _subplots(1, 2, figsize=(11, 4.2))
    shown = ["cluster", "gas", "no_sync", "bucket_cap_mb"]
    named = [*shown, *(k for k in identity.varying(table, scaling.SERIES) if k not in shown)]
    for key, series in table.groupby(scaling.SERIES, dropna=False):
        name = identity.labels(dict(zip(scaling.SERIES, key, strict=True)), named)
        for label, line in scaling.lines(series).items():
            line = line.sort_values("world_size")
            color = errorbar(
                tput,
                line["world_size"],
                line["tokens_per_s"],
                line["tokens_per_s_ci_lo"],
                line["tokens_per_s_ci_hi"],
                label=f"{name}: {label}",
            )
            errorbar(
                eff,
                line["world_size"],
                line["efficiency"],
                line["efficiency_ci_lo"],
                line["efficiency_ci_hi"],
                color=color,
                label=f"{name}: {label}",
            )
        knees = series[series["knee"]]
        eff.plot(knees["world_size"], knees["efficiency"], "o", mfc="none", mec="red", ms=14, label="_knee")
    _log_x(tput, eff)
    tput.set(xlabel="world size (ranks, log)", ylabel="tokens/s", title="Throughput by topology")
    eff.set(
        xlabel="world size (ranks, log)",
        ylabel="scaling efficiency",
        title="Strong-scaling efficiency (red circle: the knee)",
    )
    eff.axhline(1.0, color="grey", lw=0.8)
    tput.grid(alpha=0.3)
    return _finish(fig, eff)
