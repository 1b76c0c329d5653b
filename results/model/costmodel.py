"""The α–β cost model of an all-reduce, fitted to a sweep's own calibration, and what it predicts for the
measured DDP cells.

    t(m) = α + m / β        α: latency per all-reduce (ms), β: algorithm bandwidth (bytes/s), m in bytes

Fitted per (cluster, sweep, world size, nodes, backend) by least squares on the all-reduce rows; the fit's
largest relative residual is reported, and where it exceeds POOR_FIT the measured curve itself is used
(log-log interpolation, linear extrapolation in m beyond it) instead of the line.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

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
