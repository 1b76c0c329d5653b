"""Human-readable progress lines and the end-of-sweep summary."""

from __future__ import annotations

import pandas as pd

from results import analysis


def progress_line(row: dict, done: int, total: int) -> str:
    bucket = "-" if row.get("bucket_cap_mb") is None else f"{row['bucket_cap_mb']:g}"
    what = (f"{row['mode']:<6} w={row['world_size']} bucket={bucket:<5} gas={row['gas']} "
            f"no_sync={str(row['no_sync']).lower():<5}")  # fmt: skip
    if row["status"] == "ok":
        result = f"{row['step_ms']:8.2f} ms  {row['tokens_per_s'] / 1e3:8.1f} ktok/s  ok"
    else:
        result = f"ERROR {row['error'].splitlines()[0][:160] if row['error'] else ''}"
    return f"[{done}/{total}] {row['cell_id']} {what} {result}"


def summary_text(rows: pd.DataFrame) -> str:
    """Per (workers, gas, no_sync): step_ms by bucket, the best bucket, efficiency vs the baseline."""
    table = analysis.with_baseline(rows)
    if table.empty:
        return "no distributed cell measured ok"
    lines = []
    for (w, g, ns, mode), grp in table.groupby(["world_size", "gas", "no_sync", "mode"]):
        grp = grp.sort_values("bucket_cap_mb")
        best = grp.loc[grp["step_ms"].idxmin()]
        curve = "  ".join(
            f"{b:g}MB:{s:.1f}" if pd.notna(b) else f"{s:.1f}"
            for b, s in zip(grp["bucket_cap_mb"], grp["step_ms"], strict=True)
        )
        eff = f"{best['efficiency']:.1%}" if pd.notna(best["efficiency"]) else "n/a (no baseline)"
        bucket = f"best bucket {best['bucket_cap_mb']:g} MB" if pd.notna(best["bucket_cap_mb"]) else "no buckets"
        lines.append(f"{mode} workers={w} gas={g} no_sync={str(bool(ns)).lower()}: step ms {curve} | "
                     f"{bucket}, efficiency {eff} (baseline {best['baseline_step_ms']:.1f} ms)")  # fmt: skip
    return "\n".join(lines)
