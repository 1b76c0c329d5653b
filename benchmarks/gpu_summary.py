"""The markdown summary of `make gpu-check` (benchmarks/gpu_check.sh), from the rows it stored.

    python benchmarks/gpu_summary.py RESULTS_ROOT [CALIBRATION_PATH_JSON] > summary.md

Device, driver, NCCL and torch; every cell's step time with its 95% interval, MFU (gpt2-124m presets),
peak memory; the timing methods side by side (ratios to `sync`, round-blocked); the isolated cell beside the
same cell inside a group; part 1's cells beside the overlap model's prediction; calibration bandwidth by size;
every error row.
"""

from __future__ import annotations

import json
import sys
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pandas as pd

from results.analysis import cells as analysis
from results.analysis.identity import config_text
from results.analysis.uncertainty import interval
from results.model import costmodel, predicted
from results.storage.store import Store, load, load_calibration

PEAK_TFLOPS = {"H200": 989.0, "H100": 989.0, "A100": 312.0}  # dense bf16 tensor-core peak, per GPU (TFLOP/s)
CELL = ["mode", "gas", "no_sync", "bucket_cap_mb", "comm_hook", "timing"]


def peak_tflops(accelerator: str) -> float | None:
    return next((v for k, v in PEAK_TFLOPS.items() if k in str(accelerator)), None)


def mfu(r: pd.Series, tflops: float | None) -> float | None:
    """Model FLOPs utilization: 6 x params x tokens per step (forward + backward, no attention term) / step."""
    if tflops is None or pd.isna(r.get("tokens_per_s")):
        return None
    return 6 * r["n_params"] * r["tokens_per_s"] / r["world_size"] / (tflops * 1e12)


def device_lines(rows: pd.DataFrame) -> list[str]:
    first = rows.iloc[0]
    keys = ("accelerator", "accelerators", "driver_version", "cuda_version", "nccl_version", "torch_version")
    return [f"- {k}: {first.get(k)}" for k in (*keys, "ray_version", "python_version")]


def cell_table(rows: pd.DataFrame) -> list[str]:
    ok = analysis.usable(rows)
    peaks = ok.groupby(config_text(ok))["peak_mem_bytes"].max()
    cells = analysis.ok_cells(rows)
    cells["peak"] = [peaks.get(k) for k in config_text(cells)]
    tflops = peak_tflops(rows["accelerator"].dropna().iloc[0] if rows["accelerator"].notna().any() else "")
    out = ["| sweep | cell | step ms [95%] | tokens/s | MFU | peak GiB | n |", "|---|---|---|---|---|---|---|"]
    for _, r in cells.sort_values(["sweep_id", "mode", "gas", "bucket_cap_mb"]).iterrows():
        what = " ".join(f"{k}={r[k]}" for k in CELL if k in r and pd.notna(r[k]))
        what += "".join(f" {k}={r[k]}" for k in ("compile", "optimize_ddp") if k in r and pd.notna(r[k]) and r[k])
        peak, u = r["peak"], mfu(r, tflops)
        tokens = "" if pd.isna(r["tokens_per_s"]) else f"{r['tokens_per_s']:,.0f}"
        out.append(
            f"| {r['sweep_id']} | {what} | {r['step_ms']:.2f} [{r['step_ms_ci_lo']:.2f}, {r['step_ms_ci_hi']:.2f}] "
            f"| {tokens} | {'' if u is None else f'{u:.1%}'} | {peak / 2**30:.2f} | {r['n_repeats']} |"
        )
    return out


def ratio_line(name: str, r: pd.Series, ref: pd.Series) -> str:
    reps = np.asarray(r["step_ms_reps"], dtype=float) / np.asarray(ref["step_ms_reps"], dtype=float)
    lo, hi = interval(reps)
    return f"- {name}: {r['step_ms'] / ref['step_ms']:.4f} [{lo:.4f}, {hi:.4f}] (step {r['step_ms']:.2f} ms)"


def timing_lines(rows: pd.DataFrame) -> list[str]:
    """Each DDP timing method's step ÷ sync's, paired by round (one worker group)."""
    cells = analysis.ok_cells(rows[rows["spec_name"] == "gpu-check-timing"])
    ddp = cells[cells["mode"] == "ddp"].set_index("timing")
    if "sync" not in ddp.index:
        return ["- no ok sync cell: no comparison"]
    used = rows[rows["spec_name"] == "gpu-check-timing"].groupby("timing")["timing_used"].first()
    lines = [f"- timing used: {used.to_dict()}"]
    return lines + [ratio_line(f"{t} / sync", ddp.loc[t], ddp.loc["sync"]) for t in ddp.index if t != "sync"]


def calibration_lines(root: str, path_json: str | None) -> list[str]:
    """The sweeps' stored calibration (groups of >= 2 ranks only), then part 0's 1-rank run of the same code."""
    cal = load_calibration(root)
    out = ["- stored by the sweeps: none (one GPU forms no group of 2 ranks to calibrate)"] if cal.empty else []
    if path_json and Path(path_json).exists():
        ran = json.loads(Path(path_json).read_text())
        out.append(f"- the calibration code on a 1-rank {ran['backend']} group (part 0), {ran['wall_s']:.1f} s:")
        part0 = {"cluster": "part 0", "sweep_id": "part 0", "group_id": "part 0", "num_nodes": 1, "world_size": 1}
        cal = pd.concat([cal, pd.DataFrame(ran["rows"]).assign(backend=ran["backend"], **part0)], ignore_index=True)
    if cal.empty:
        return out
    for t in costmodel.terms(cal).itertuples():
        line = costmodel.describe_terms(t)
        out.append(
            f"- overlap terms, {t.cluster}, {t.world_size} rank(s) on {t.num_nodes} node(s), {t.backend}: {line}"
        )
    out += ["", "| kind | world | bytes | time ms | algbw GB/s | busbw GB/s |", "|---|---|---|---|---|---|"]
    collectives = cal[cal["kind"].isin(["all_reduce", "broadcast_params"])]
    for _, c in collectives.sort_values(["kind", "size_bytes"]).iterrows():
        out.append(
            f"| {c['kind']} | {c['world_size']} | {c['size_bytes']:,} | {c['time_ms']:.4f} "
            f"| {c['algbw_gbps']:.1f} | {c['busbw_gbps']:.1f} |"
        )
    return out


def error_lines(rows: pd.DataFrame) -> list[str]:
    bad = rows[rows["status"] != "ok"]
    if bad.empty:
        return [f"- none: {len(rows)} of {len(rows)} measurements ok"]
    return [f"- {r['spec_name']} {r['cell_id']} r{r['repeat']}: {str(r['error'])[:300]}" for _, r in bad.iterrows()]


def workload_name(r: pd.Series) -> str:
    return str(r["workload"]) if pd.notna(r.get("workload")) and r.get("workload") else str(r.get("model"))


def grad_check_lines(rows: pd.DataFrame) -> list[str]:
    """The gradient check under NCCL (bf16 autocast), per workload and hook: verdicts and relative errors. At
    world size 1 an error can only be the kernels' nondeterminism, which the check shares with the cell's own
    backward: every hook-none configuration must read exact."""
    ddp = rows[(rows["status"] == "ok") & (rows["mode"] == "ddp") & rows["grad_check"].notna()]
    if ddp.empty:
        return ["- no DDP measurement was checked"]
    ddp = ddp.assign(workload_name=ddp.apply(workload_name, axis=1))
    out = []
    for (spec, hook), g in ddp.groupby(["workload_name", "comm_hook"]):
        verdicts = ", ".join(f"{k} {n}" for k, n in g["grad_check"].value_counts().items())
        err = g["grad_rel_error"]
        out.append(
            f"- {spec} hook={hook}: {verdicts}; error median {err.median():.2e} [{err.min():.2e}, {err.max():.2e}], "
            f"tolerance up to {g['grad_tol'].max():.2e}; check {g['grad_check_ms'].median():.0f} ms median"
        )
    return out


def compile_lines(rows: pd.DataFrame) -> list[str]:
    """Compiled cells: step against the eager cell at the same bucket, compiling's cost, graphs, collectives."""
    if "compile" not in rows or not rows["compile"].fillna(False).astype(bool).any():
        return ["- no compiled cell"]
    ok = rows[(rows["status"] == "ok") & (rows["mode"] == "ddp")]
    eager = ok[~ok["compile"].fillna(False).astype(bool)].groupby("bucket_cap_mb")["step_ms"].median()
    out = []
    for (mode, bucket), g in ok[ok["compile"].fillna(False).astype(bool)].groupby(["optimize_ddp", "bucket_cap_mb"]):
        ratio = g["step_ms"].median() / eager[bucket] if bucket in eager else float("nan")
        out.append(
            f"- {mode} @ {bucket:g} MB: {g['step_ms'].median():.1f} ms ({ratio:.2f}x eager), compile "
            f"{g['compile_s'].median():.1f} s, {int(g['compiled_graphs'].max())} graphs, recompiles in timed steps "
            f"{int(g['recompiles_timed'].max())}, {int(g['collectives_per_step'].median())} all-reduces/step, "
            f"gradient {g['grad_check'].iloc[0]} ({g['grad_rel_error'].median():.1e})"
        )
    return out


def prediction_lines(root: str, rows: pd.DataFrame) -> list[str]:
    """Part 1's cells beside the overlap model's step from the profile `ddpsweep predict` stored before it ran
    (world size 1: no communication, so the prediction is the profile's forward + backward per micro-step and
    the optimizer step)."""
    model = predicted.for_rows(rows, Store.open(root).read_profiles().to_pandas(), load_calibration(root))
    if model is None:
        return ["- no profile stored (the predict step did not run) or no DDP cell measured"]
    cells = model["cells"]
    out = [
        "| gas | no_sync | bucket MB | measured ms | predicted ms | predicted ÷ measured − 1 |",
        "|---|---|---|---|---|---|",
    ]
    for _, c in cells.sort_values(["gas", "no_sync", "bucket_cap_mb"]).iterrows():
        out.append(
            f"| {c['gas']} | {c['no_sync']} | {c['bucket_cap_mb']:g} | {c['step_ms']:.1f} | {c['predicted_ms']:.1f} "
            f"| {c['prediction_error']:+.1%} |"
        )
    for c in model["curves"].itertuples():
        out.append(f"- gas {c.gas}, no_sync {c.no_sync}: median |error| {c.median_abs_error:.1%} over {c.cells} cells")
    return out


def summary(root: str, calibration_path: str | None = None) -> str:
    rows = load(root)
    parts = [f"# make gpu-check, {datetime.now(UTC):%Y-%m-%d %H:%M} UTC", ""]
    if rows.empty:
        return "\n".join([*parts, "- no measurement stored yet"]) + "\n"
    parts += ["## Gradient check at world size 1, per workload (must read exact for hook none)"]
    parts += [*grad_check_lines(rows), "", "## Device", *device_lines(rows)]
    parts += ["", "## Cells (median step over rounds and steps, 95% interval)", *cell_table(rows)]
    parts += ["", "## Timing methods (DDP cell, step ÷ sync's, round-blocked 95% interval)", *timing_lines(rows)]
    parts += ["", "## Compiled steps (torch.compile, Inductor)", *compile_lines(rows)]
    parts += ["", "## Predicted beside measured (part 1, world size 1: the profile alone)"]
    parts += prediction_lines(root, rows[rows["sweep_id"] == "1_main"])
    parts += ["", "## Calibration", *calibration_lines(root, calibration_path), "", "## Errors", *error_lines(rows)]
    return "\n".join(parts) + "\n"


if __name__ == "__main__":
    sys.stdout.write(summary(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else None))
