"""Where does a sweep's time go? The smoke spec end to end through `ddpsweep run` with `isolation: sweep`
(one worker group for every placement) and `isolation: group` (one per worker-group shape), twice each in
alternating order (sweep, group, group, sweep), in one run; optionally `isolation: cell` (one TorchTrainer
per measurement) and the seed's way (one torchrun launch of trainers.bench per measurement).

    python benchmarks/orchestration_overhead.py [--spec sweeps/specs/smoke.yaml] [--repeats 3] [--controls]

Prints: whole-sweep wall time of each path and sweep / group; per group its start (launch -> workers
ready for the first cell) with its parts, its measuring time and the marginal overhead per measurement;
per cell, step_ms under sweep / group isolation with the 95% interval of the ratio (results.analysis.compare: the
two sweeps are resampled independently), for each pair of runs; and the same count for sweep-1 / sweep-2 and
group-1 / group-2, the A/A pairs of the run, which say how often the per-cell rule flags a cell when nothing
differs but the time between two sweeps.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd
import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from results.analysis.compare import compare  # noqa: E402
from results.storage.store import load  # noqa: E402
from sweeps.plan.grid import Cell, expand  # noqa: E402
from sweeps.spec.files import load_spec  # noqa: E402
from sweeps.spec.sweep import SweepSpec  # noqa: E402


def run_sweep(spec: SweepSpec, isolation: str, results: str) -> tuple[float, float, pd.DataFrame]:
    """(wall s, command start -> first group launch s, rows) of `ddpsweep run` as a user runs it."""
    path = Path(results) / f"{isolation}.yaml"
    fields = dataclasses.asdict(dataclasses.replace(spec, isolation=isolation.split("-")[0]))
    path.write_text(yaml.safe_dump({k: v for k, v in fields.items() if v is not None}))
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


def excluding_one(rows: pd.DataFrame, a: str, b: str) -> pd.DataFrame:
    """Print step_ms b / a per cell: the ratios' range and how many 95% intervals exclude 1."""
    out = compare(rows, a, b)
    print(
        f"step_ms {b} / {a} per cell: ratios {out['ratio'].min():.3f}..{out['ratio'].max():.3f}, "
        f"intervals excluding 1: {int(out['significant'].sum())} of {len(out)}"
    )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--spec", default=str(ROOT / "sweeps/specs/smoke.yaml"))
    ap.add_argument("--repeats", type=int, default=None, help="override the spec's repeats (rounds)")
    ap.add_argument("--controls", action="store_true", help="also isolation: cell and a torchrun loop (slow)")
    args = ap.parse_args()
    spec = load_spec(args.spec)
    spec = dataclasses.replace(spec, repeats=args.repeats or spec.repeats)
    n = len(expand(spec)) * spec.repeats
    print(f"{spec.name}: {n} measurements ({len(expand(spec))} cells x {spec.repeats} rounds)\n")
    walls, frames = {}, []
    with tempfile.TemporaryDirectory() as tmp:
        for label in ("sweep-1", "group-1", "group-2", "sweep-2", *(["cell-1"] if args.controls else [])):
            walls[label], _, rows = run_sweep(spec, label, tmp)
            frames.append(rows)
            print(f"{label:8} {walls[label]:6.1f} s, {rows['group_id'].nunique()} worker group(s)")
            for f in group_figures(rows).itertuples():
                print(
                    f"  group {f.group_id:<10} {f.n:3d} measurements: wall {f.wall_s:5.1f} s, start "
                    f"{f.group_start_s:4.1f} s, measuring {f.work_s:5.1f} s, marginal {f.marginal_s:.3f} s each"
                    f"\n    start's parts (s): {f.parts}"
                )
    for k in (1, 2):
        print(f"wall, sweep-{k} / group-{k}: {walls[f'sweep-{k}'] / walls[f'group-{k}']:.2f}")
    rows = pd.concat(frames, ignore_index=True)
    for k in (1, 2):
        out = excluding_one(rows, f"group-{k}", f"sweep-{k}")
        for b in out[out["mode"] == "single"].itertuples():  # rank 0 of the 2-rank group vs a 1-rank group
            print(f"  baseline gas={b.gas}: {b.ratio:.3f} [{b.ratio_ci_lo:.3f}, {b.ratio_ci_hi:.3f}] (idle rank 1)")
    print("the same isolation twice (A/A: what the per-cell rule flags when nothing differs):")
    for a, b in (("sweep-1", "sweep-2"), ("group-1", "group-2")):
        excluding_one(rows, a, b)
    if args.controls:
        device = "cuda" if spec.use_gpu is True else "cpu"
        t_wall, _ = torchrun_loop(expand(spec), spec.repeats, max(1, int(spec.cpus_per_worker)), device)
        print(f"controls: isolation=cell {walls['cell-1']:.1f} s, torchrun relaunch loop {t_wall:.1f} s")


if __name__ == "__main__":
    main()
