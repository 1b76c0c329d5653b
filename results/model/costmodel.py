"""The α–β cost model of an all-reduce, fitted to a sweep's own calibration, and what it predicts for the
measured DDP cells.

    t(m) = α + m / β        α: latency per all-reduce (ms), β: algorithm bandwidth (bytes/s), m in bytes

Fitted per (cluster, sweep, world size, nodes, backend) by least squares on the all-reduce rows; the fit's
largest relative residual is reported, and where it exceeds POOR_FIT the measured curve itself is used
(log-log interpolation, linear extrapolation in m beyond it) instead of the line.

Beside t(m), the overlap model's terms (results.model.overlap.Terms) from the calibration's term rows
(trainers.terms measures them on the same ranks), each the median of its repeats' paired values with a
bootstrap 95% interval:

    g = compute_alone / compute_solo                                                          compute sharing
    c = (ddp_backward[most buckets] − ddp_backward[one bucket]) / (the bucket counts' gap)     ms per bucket
    κ = compute_contended / compute_alone − 1
    λ = C / (C + W − T) − 1, or T / W − 1 where T ≤ C         W, T: comm_alone, comm_contended; C: compute_contended
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from results.analysis.uncertainty import interval

FIT_KEYS = ["cluster", "sweep_id", "world_size", "num_nodes", "backend"]
POOR_FIT = 0.25  # relative residual above which the measured curve is used instead of the fit


def fit_alpha_beta(sizes_bytes: np.ndarray, times_ms: np.ndarray) -> tuple[float, float, float]:
    """(alpha_ms, beta_bytes_per_s, max relative residual) of t = α + m/β, least squares weighted by 1/t
    so small and large messages count alike."""
    m, t = np.asarray(sizes_bytes, dtype=float), np.asarray(times_ms, dtype=float)
    w = 1 / t
    a = np.stack([np.ones_like(m), m], axis=1) * w[:, None]
    (alpha, slope), *_ = np.linalg.lstsq(a, t * w, rcond=None)  # slope: ms per byte
    alpha, slope = max(float(alpha), 0.0), max(float(slope), 1e-30)
    residual = float(np.max(np.abs(alpha + m * slope - t) / t))
    return alpha, 1e3 / slope, residual


def fits(calibration: pd.DataFrame) -> pd.DataFrame:
    """One α–β fit per (cluster, sweep, world size, nodes, backend), with the curve kept for interpolation."""
    ar = calibration[calibration["kind"] == "all_reduce"]
    lines = []
    for key, grp in ar.groupby(FIT_KEYS, dropna=False):
        grp = grp.groupby("size_bytes", as_index=False)["time_ms"].median().sort_values("size_bytes")
        alpha, beta, residual = fit_alpha_beta(grp["size_bytes"].to_numpy(), grp["time_ms"].to_numpy())
        lines.append(
            dict(zip(FIT_KEYS, key, strict=True))
            | {
                "alpha_ms": alpha,
                "beta_gbps": beta / 1e9,
                "max_rel_residual": residual,
                "n_sizes": len(grp),
                "uses": "fit" if residual <= POOR_FIT else "measured curve",
                "curve_bytes": grp["size_bytes"].to_numpy(),
                "curve_ms": grp["time_ms"].to_numpy(),
            }
        )
    columns = [*FIT_KEYS, "alpha_ms", "beta_gbps", "max_rel_residual", "n_sizes", "uses", "curve_bytes", "curve_ms"]
    return pd.DataFrame(lines, columns=columns)


def predict_ms(fit: pd.Series, sizes_bytes: list[int] | np.ndarray) -> np.ndarray:
    """All-reduce time of each message size from a fit line (or its measured curve when the fit is poor)."""
    m = np.asarray(sizes_bytes, dtype=float)
    if fit["uses"] == "fit":
        return fit["alpha_ms"] + m / (fit["beta_gbps"] * 1e9) * 1e3
    xs, ys = np.log(fit["curve_bytes"].astype(float)), np.log(fit["curve_ms"])
    inside = np.exp(np.interp(np.log(np.clip(m, 1, None)), xs, ys))
    last_rate = fit["curve_ms"][-1] / fit["curve_bytes"][-1]  # ms per byte at the largest size
    beyond = m > fit["curve_bytes"][-1]
    return np.where(beyond, fit["curve_ms"][-1] + (m - fit["curve_bytes"][-1]) * last_rate, inside)


TERMS = ("compute", "bucket_ms", "contention", "comm_contention")  # g, c, κ, λ
TERM_COLUMNS = [f"{t}{s}" for t in TERMS for s in ("", "_ci_lo", "_ci_hi")] + ["contention_bytes"]
TERM_KINDS = ("compute_solo", "compute_alone", "compute_contended", "comm_alone", "comm_contended", "ddp_backward")
NO_PROGRESS = 100.0  # λ where the collectives made no progress beside the compute (T ≥ C + W)


def terms(calibration: pd.DataFrame) -> pd.DataFrame:
    """Per (cluster, sweep, world size, nodes, backend) whose calibration measured them: g, c, κ and λ, each with
    its interval (null where its rows are missing), and the contending all-reduce's bytes."""
    rows = calibration[calibration["kind"].isin(TERM_KINDS)] if len(calibration) else calibration
    groups = rows.groupby(FIT_KEYS, dropna=False) if len(rows) else []
    lines = [dict(zip(FIT_KEYS, key, strict=True)) | _terms_of(grp) for key, grp in groups]
    return pd.DataFrame(lines, columns=[*FIT_KEYS, *TERM_COLUMNS])


def _terms_of(grp: pd.DataFrame) -> dict:
    """g, c, κ and λ from one placement's term rows, pairing repeats within each worker group."""
    pairs: dict[str, list[np.ndarray]] = {t: [] for t in TERMS}
    size = None
    for _, g in grp.groupby("group_id", dropna=False):
        kind = {k: g[g["kind"] == k] for k in TERM_KINDS}
        last = {k: v.iloc[-1] for k, v in kind.items() if len(v) and k != "ddp_backward"}
        if {"compute_solo", "compute_alone"} <= set(last):
            pairs["compute"].append(_paired(last["compute_alone"]["times_ms"], last["compute_solo"]["times_ms"]))
        if {"compute_alone", "compute_contended"} <= set(last):
            contended = last["compute_contended"]
            pairs["contention"].append(_paired(contended["times_ms"], last["compute_alone"]["times_ms"]) - 1)
            size = int(contended["size_bytes"])
        if {"compute_contended", "comm_alone", "comm_contended"} <= set(last):
            times = (last[k]["times_ms"] for k in ("compute_contended", "comm_alone", "comm_contended"))
            pairs["comm_contention"].append(_comm_slowed(*times))
        ddp = kind["ddp_backward"].dropna(subset=["buckets"]).sort_values("buckets")
        if len(ddp) >= 2 and ddp["buckets"].iloc[-1] > ddp["buckets"].iloc[0]:
            one, many = ddp.iloc[0], ddp.iloc[-1]
            gap = float(many["buckets"] - one["buckets"])
            pairs["bucket_ms"].append((np.asarray(many["times_ms"], float) - np.asarray(one["times_ms"], float)) / gap)
    out: dict = {"contention_bytes": size}
    for name, values in pairs.items():
        got = _median_interval(np.concatenate(values)) if values else (None, None, None)
        out[name], out[f"{name}_ci_lo"], out[f"{name}_ci_hi"] = got
    return out


def _paired(a: object, b: object) -> np.ndarray:
    """Repeat-by-repeat ratio a / b of two arms measured in turn (the shorter list bounds the pairs)."""
    x, y = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    n = min(len(x), len(y))
    return x[:n] / y[:n]


def _comm_slowed(compute: object, alone: object, contended: object) -> np.ndarray:
    """λ per repeat: the collectives ran at 1 / (1 + λ) while the compute (C ms) ran beside them, at full rate
    after it: T = C + W − C / (1 + λ) where they outlast it, T = W (1 + λ) where they end inside it."""
    c, w, t = (np.asarray(x, dtype=float) for x in (compute, alone, contended))
    n = min(len(c), len(w), len(t))
    c, w, t = c[:n], w[:n], t[:n]
    with np.errstate(divide="ignore"):
        outlast = np.where(c + w - t > 0, c / (c + w - t) - 1, NO_PROGRESS)
    return np.minimum(np.where(t <= c, t / w - 1, outlast), NO_PROGRESS)


def _median_interval(values: np.ndarray, n_boot: int = 1000) -> tuple[float, float, float]:
    """The median and its 95% bootstrap interval (a fixed seed: the same rows give the same figures)."""
    rng = np.random.default_rng(0)
    lo, hi = interval(np.median(rng.choice(values, size=(n_boot, len(values))), axis=1))
    return float(np.median(values)), lo, hi


def summary(calibration: pd.DataFrame) -> pd.DataFrame:
    """The `alpha_beta` view: each fit (without its curve) and, where measured, the terms beside it."""
    fitted = fits(calibration).drop(columns=["curve_bytes", "curve_ms"])
    return fitted.merge(terms(calibration), on=FIT_KEYS, how="left")


def describe_terms(line: object) -> str:
    """A summary() line's terms in words, or why there are none."""
    got = {t: getattr(line, t, None) for t in TERMS}
    if all(v is None or v != v for v in got.values()):
        return "no overlap terms (measured by `ddpsweep calibrate` since they exist)"

    def figure(name: str, scale: float, fmt: str) -> str:
        v, lo, hi = (getattr(line, f"{name}{s}") for s in ("", "_ci_lo", "_ci_hi"))
        return "not measured" if v is None or v != v else f"{v * scale:{fmt}} [{lo * scale:{fmt}}, {hi * scale:{fmt}}]"

    return (
        f"compute x{figure('compute', 1, '.2f')} beside the group's other ranks, per bucket "
        f"{figure('bucket_ms', 1e3, '.0f')} us on the compute stream, compute {figure('contention', 1, '+.0%')} "
        f"while an all-reduce runs, an all-reduce {figure('comm_contention', 1, '+.0%')} while compute runs"
    )
