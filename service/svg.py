"""Server-rendered SVG line charts with interval bars, for the dashboard (no JavaScript library, no CDN).

Every point carries an SVG <title>: hovering it shows the series, x, the value and its 95% interval.
"""

from __future__ import annotations

import html
import math
from dataclasses import dataclass

W, H, PAD_L, PAD_R, PAD_T, PAD_B = 560, 300, 64, 150, 24, 44  # px
COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#17becf", "#7f7f7f"]


@dataclass(frozen=True)
class Point:
    x: float
    y: float
    lo: float | None = None  # interval, same unit as y
    hi: float | None = None


@dataclass(frozen=True)
class Series:
    name: str
    points: list[Point]
    dashed: bool = False  # drawn dashed in the colour of the solid series before it (a prediction beside it)


def _ticks(lo: float, hi: float, log: bool) -> list[float]:
    """About five round ticks over [lo, hi] (1-2-5 steps); decades on a log axis."""
    if log:
        return [10.0**e for e in range(math.floor(math.log10(lo)), math.ceil(math.log10(hi)) + 1)]
    raw = max(hi - lo, 1e-12) / 5
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw)
    start = math.floor(lo / step) * step
    return [round(start + i * step, 12) for i in range(int((hi - start) / step) + 2)]


def _fmt(v: float) -> str:
    return f"{v:g}" if abs(v) < 1e5 else f"{v:.3g}"


def line_chart(
    series: list[Series], *, title: str, x_label: str, y_label: str, log_x: bool = False, chart_id: str = "chart"
) -> str:
    """An SVG chart of `series` (one line each, interval bars where known)."""
    pts = [p for s in series for p in s.points if math.isfinite(p.y)]
    if not pts:
        return f"<p class='empty'>{html.escape(title)}: no data</p>"
    xs = [p.x for p in pts]
    ys = [v for p in pts for v in (p.y, p.lo, p.hi) if v is not None and math.isfinite(v)]
    x0, x1 = min(xs), max(xs)
    y0, y1 = min(ys), max(ys)
    y0, y1 = (y0 - 0.05 * (y1 - y0 or abs(y0) or 1), y1 + 0.05 * (y1 - y0 or abs(y1) or 1))
    fx = (lambda v: math.log10(v)) if log_x else (lambda v: v)
    span_x = (fx(x1) - fx(x0)) or 1.0

    def px(v: float) -> float:
        return PAD_L + (fx(v) - fx(x0)) / span_x * (W - PAD_L - PAD_R)

    def py(v: float) -> float:
        return H - PAD_B - (v - y0) / (y1 - y0) * (H - PAD_T - PAD_B)

    out = [
        f"<svg id='{html.escape(chart_id)}' class='chart' viewBox='0 0 {W} {H}' width='{W}' height='{H}' "
        f"role='img' aria-label='{html.escape(title)}' xmlns='http://www.w3.org/2000/svg'>",
        f"<text x='{PAD_L}' y='16' class='title'>{html.escape(title)}</text>",
    ]
    out += _axes(x0, x1, y0, y1, log_x, px, py, x_label, y_label)
    solid = -1
    for i, s in enumerate(series):
        solid += 0 if s.dashed and solid >= 0 else 1
        out += _series(s, COLORS[solid % len(COLORS)], i, px, py, x_label, y_label)
    out.append("</svg>")
    return "".join(out)


def _axes(x0, x1, y0, y1, log_x, px, py, x_label, y_label) -> list[str]:
    out = [
        f"<line x1='{PAD_L}' y1='{H - PAD_B}' x2='{W - PAD_R}' y2='{H - PAD_B}' class='axis'/>",
        f"<line x1='{PAD_L}' y1='{PAD_T}' x2='{PAD_L}' y2='{H - PAD_B}' class='axis'/>",
    ]
    for t in _ticks(x0, x1, log_x):
        if x0 <= t <= x1 or len(_ticks(x0, x1, log_x)) <= 2:
            out.append(f"<text x='{px(t):.1f}' y='{H - PAD_B + 16}' class='tick' text-anchor='middle'>{_fmt(t)}</text>")
    for t in _ticks(y0, y1, False):
        if y0 <= t <= y1:
            y = py(t)
            out.append(
                f"<text x='{PAD_L - 6}' y='{y + 4:.1f}' class='tick' text-anchor='end'>{_fmt(t)}</text>"
                f"<line x1='{PAD_L}' y1='{y:.1f}' x2='{W - PAD_R}' y2='{y:.1f}' class='grid'/>"
            )
    out.append(
        f"<text x='{(PAD_L + W - PAD_R) / 2}' y='{H - 8}' class='label' text-anchor='middle'>"
        f"{html.escape(x_label)}</text>"
    )
    out.append(
        f"<text x='14' y='{(PAD_T + H - PAD_B) / 2}' class='label' text-anchor='middle' "
        f"transform='rotate(-90 14 {(PAD_T + H - PAD_B) / 2})'>{html.escape(y_label)}</text>"
    )
    return out


def _series(s: Series, color: str, i: int, px, py, x_label: str, y_label: str) -> list[str]:
    pts = sorted((p for p in s.points if math.isfinite(p.y)), key=lambda p: p.x)
    path = " ".join(f"{px(p.x):.1f},{py(p.y):.1f}" for p in pts)
    dash = " stroke-dasharray='6 4'" if s.dashed else ""
    out = [
        f"<g class='series' data-series='{html.escape(s.name)}'>",
        f"<polyline points='{path}' fill='none' stroke='{color}' stroke-width='2'{dash}/>",
    ]
    for p in pts:
        interval = ""
        if p.lo is not None and p.hi is not None and math.isfinite(p.lo) and math.isfinite(p.hi):
            out.append(
                f"<line x1='{px(p.x):.1f}' y1='{py(p.lo):.1f}' x2='{px(p.x):.1f}' y2='{py(p.hi):.1f}' "
                f"stroke='{color}' stroke-width='1.5'/>"
            )
            interval = f" [{p.lo:.4g}, {p.hi:.4g}]"
        tip = f"{s.name}: {x_label} {p.x:g} → {y_label} {p.y:.4g}{interval}"
        out.append(
            f"<circle class='point' cx='{px(p.x):.1f}' cy='{py(p.y):.1f}' r='4' fill='{color}' "
            f"data-x='{p.x:g}' data-y='{p.y:.6g}'><title>{html.escape(tip)}</title></circle>"
        )
    y_legend = PAD_T + 14 + 16 * i
    name = html.escape(s.name)
    out.append(
        f"<rect x='{W - PAD_R + 10}' y='{y_legend - 9}' width='10' height='10' fill='{color}'/>"
        f"<text x='{W - PAD_R + 24}' y='{y_legend}' class='legend'>{name}</text></g>"
    )
    return out
