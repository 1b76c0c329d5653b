"""Where does a sweep's time go? The smoke spec end to end through `ddpsweep run` with `isolation: group`
(warm worker groups) and `isolation: cell` (one TorchTrainer per measurement), beside the seed's way
(one torchrun launch of trainers.bench per measurement), all in one run.

    python benchmarks/orchestration_overhead.py [--spec sweeps/specs/smoke.yaml] [--repeats 3]

Prints: whole-sweep wall time of each path; sweep start (command start -> first worker group launched)
and group start (launch -> workers ready for the first cell) separately; the marginal overhead per
measurement inside a group, (group wall - group start - sum of warm-up and timed step time) / measurements;
and per cell, step_ms measured in a warm group / in its own TorchTrainer (median over repeats).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd
import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from results.store import load  # noqa: E402
from sweeps.grid import Cell, expand  # noqa: E402
from sweeps.spec import SweepSpec, load_spec  # noqa: E402


def run_sweep(spec: SweepSpec, isolation: str, results: str) -> tuple[float, float, pd.DataFrame]:
    """(wall s, command start -> first group launch s, rows) of `ddpsweep run` as a user runs it."""
    path = Path(results) / f"{isolation}.yaml"
    path.write_text(yaml.safe_dump(dataclasses.asdict(dataclasses.replace(spec, isolation=isolation))))
    start = pd.Timestamp.now(tz="UTC")
    t0 = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "service.cli", "run", str(path), "--results", results, "--cluster", isolation],
        cwd=ROOT,
        check=True,
        capture_output=True,
    )
    wall = time.perf_counter() - t0
    rows = load(results, cluster=isolation)
    return wall, (rows["group_started_at"].min() - start).total_seconds(), rows


def group_figures(rows: pd.DataFrame) -> pd.DataFrame:
    """Per group: wall, group start, measuring time and the marginal overhead per measurement (s)."""
    out = []
    for gid, g in rows.groupby("group_id"):
        wall = (g["finished_at"].max() - g["group_started_at"].min()).total_seconds()
        work = (g["warmup_ms"].sum() + g["step_times_ms"].map(sum).sum()) / 1e3
        start = g["group_setup_s"].iloc[0]
        out.append(
            {
                "group_id": gid,
                "n": len(g),
                "wall_s": wall,
                "group_start_s": start,
                "work_s": work,
                "marginal_s": (wall - start - work) / len(g),
            }
        )
    return pd.DataFrame(out)


def torchrun_loop(cells: list[Cell], repeats: int, threads: int, device: str) -> tuple[float, dict[str, list[float]]]:
    """Wall time of one trainers.bench launch per (cell, repeat), rounds interleaved; step_ms per cell."""
    step_ms: dict[str, list[float]] = {}
    t0 = time.perf_counter()
    for _ in range(repeats):
        for cell in cells:
            s = cell.step
            launcher = (
                [sys.executable, "-m", "trainers.bench"]
                if s.mode == "single"
                else [
                    sys.executable,
                    "-m",
                    "torch.distributed.run",
                    "--standalone",
                    f"--nproc_per_node={cell.world_size}",
                    "-m",
                    "trainers.bench",
                ]
            )
            args = [
                "--model",
                s.model,
                "--mode",
                s.mode,
                "--micro-batch",
                str(s.micro_batch),
                "--seq-len",
                str(s.seq_len),
                "--gas",
                str(s.gas),
                "--warmup",
                str(s.warmup_steps),
                "--steps",
                str(s.timed_steps),
                "--threads",
                str(threads),
                "--device",
                device,
                "--bucket-cap-mb",
                str(s.bucket_cap_mb or 25),
            ] + (["--no-sync"] if s.no_sync else [])
            out = subprocess.run([*launcher, *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout
            row = json.loads(next(x for x in out.splitlines() if x.startswith("{")))
            step_ms.setdefault(cell.cell_id, []).append(row["step_ms"])
    return time.perf_counter() - t0, step_ms


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--spec", default=str(ROOT / "sweeps/specs/smoke.yaml"))
    ap.add_argument("--repeats", type=int, default=None, help="override the spec's repeats (rounds)")
    args = ap.parse_args()
    spec = load_spec(args.spec)
    spec = dataclasses.replace(spec, repeats=args.repeats or spec.repeats)
    n = len(expand(spec)) * spec.repeats
    with tempfile.TemporaryDirectory() as tmp:
        g_wall, g_sweep_start, g_rows = run_sweep(spec, "group", tmp)
        c_wall, _, c_rows = run_sweep(spec, "cell", tmp)
    device = "cuda" if spec.use_gpu is True else "cpu"
    t_wall, t_ms = torchrun_loop(expand(spec), spec.repeats, max(1, int(spec.cpus_per_worker)), device)
    figs = group_figures(g_rows)
    print(f"{spec.name}: {n} measurements ({len(expand(spec))} cells x {spec.repeats} rounds) on {device}\n")
    print(
        f"whole sweep   isolation=group {g_wall:6.1f} s | isolation=cell {c_wall:6.1f} s | "
        f"torchrun relaunch loop {t_wall:6.1f} s"
    )
    print(f"speed-up      group vs cell {c_wall / g_wall:.1f}x, group vs torchrun loop {t_wall / g_wall:.1f}x")
    print(f"sweep start   {g_sweep_start:.1f} s (command start -> first worker group launched)")
    for f in figs.itertuples():
        print(
            f"group {f.group_id:<10} {f.n:3d} measurements: wall {f.wall_s:5.1f} s, group start "
            f"{f.group_start_s:4.1f} s, measuring {f.work_s:5.1f} s, marginal {f.marginal_s:.3f} s/measurement"
        )
    marginal = (figs["wall_s"] - figs["group_start_s"] - figs["work_s"]).sum() / figs["n"].sum()
    print(f"marginal overhead per measurement inside a group: {marginal:.3f} s (target <= 0.3 s)")
    g_med, c_med = (r.groupby("cell_id")["step_ms"].median() for r in (g_rows, c_rows))
    ratio = (g_med / c_med).dropna()
    t_ratio = g_med / pd.Series({k: statistics.median(v) for k, v in t_ms.items()})
    print(
        f"\nstep_ms group / cell isolation, per cell: median {ratio.median():.3f}, "
        f"range {ratio.min():.3f}..{ratio.max():.3f} over {len(ratio)} cells (target 1.00 +- 0.03)"
    )
    print(
        f"step_ms group / torchrun, per cell:       median {t_ratio.median():.3f}, "
        f"range {t_ratio.min():.3f}..{t_ratio.max():.3f}"
    )
    cv = pd.concat([g_rows, c_rows]).groupby(["cluster", "cell_id"])["step_ms"].agg(lambda s: s.std() / s.mean())
    print(f"between-repeat CV of step_ms (same cell, same mode): median {cv.median():.3f}, max {cv.max():.3f}")


if __name__ == "__main__":
    main()
