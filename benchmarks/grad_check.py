"""The gradient check (trainers.gradcheck), measured on this machine in three parts, each a real sweep on the
embedded Ray (gloo, 2 workers, one thread each):

1. The smoke spec with `comm_hook: [none, fp16, powersgd]`: the verdict of every DDP measurement by hook, each
   hook's relative gradient error (median and range), and what the check cost: the sum of its time over the
   sweep's measurements, as a share of the sweep's wall time (the `ddpsweep run` command, Ray's start included)
   and of the measurements' own time (`trial_wall_s`).
2. The shipped recsys example (sweeps/specs/recsys.yaml, buckets 0.25 and 25 MB, one round) with the same hooks:
   the error by hook for a workload that is not GPT-shaped.
3. A planted corruption, `--runs` times: DDPSWEEP_CORRUPT scales the all-reduced buckets of one exact cell by
   1 + 1e-4 on every rank (the best bucket of part 1's gas-1 curve). Per run: its verdict, whether its replicas
   stayed in sync, and whether `recommend` left it out with the reason.

    python benchmarks/grad_check.py [--runs 3] [--out DIR]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd
import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from results.recommend import recommend  # noqa: E402
from results.store import load  # noqa: E402
from sweeps.grid import expand  # noqa: E402
from sweeps.spec import spec_from_dict  # noqa: E402

HOOKS = ["none", "fp16", "powersgd"]
CORRUPTION = 1e-4


def sweep(out: Path, spec: dict, sweep_id: str, env: dict | None = None) -> tuple[pd.DataFrame, float]:
    """Run `spec` with `ddpsweep run`; (its rows, the command's wall time in s)."""
    path = out / f"{sweep_id}.yaml"
    path.write_text(yaml.safe_dump(spec))
    cmd = [sys.executable, "-m", "service.cli", "run", str(path), "--results", str(out), "--sweep", sweep_id]
    t0 = time.perf_counter()
    subprocess.run(cmd, cwd=ROOT, env=os.environ | (env or {}), check=True, capture_output=True)
    wall = time.perf_counter() - t0
    rows = load(str(out))
    return rows[rows["sweep_id"] == sweep_id], wall


def by_hook(rows: pd.DataFrame) -> pd.DataFrame:
    ddp = rows[(rows["mode"] == "ddp") & (rows["status"] == "ok")]
    return ddp.groupby("comm_hook").agg(
        measurements=("grad_check", "size"),
        verdicts=("grad_check", lambda v: ", ".join(f"{k} {n}" for k, n in v.value_counts().items())),
        error_median=("grad_rel_error", "median"),
        error_min=("grad_rel_error", "min"),
        error_max=("grad_rel_error", "max"),
        tol_max=("grad_tol", "max"),
        in_sync=("replicas_in_sync", "all"),
    )


def part1(out: Path) -> pd.DataFrame:
    spec = yaml.safe_load((ROOT / "sweeps/specs/smoke.yaml").read_text()) | {"comm_hook": HOOKS, "cluster": "gc"}
    rows, wall = sweep(out, spec, "smoke-hooks")
    print(f"1. smoke spec x comm_hook {HOOKS}: {len(rows)} measurements, {wall:.0f} s")
    print(by_hook(rows).to_string(float_format=lambda x: f"{x:.2e}"))
    checked = rows["grad_check_ms"].dropna()
    spent = checked.sum() / 1e3
    measured = rows["trial_wall_s"].sum()
    print(
        f"   check cost: {spent:.1f} s over {len(checked)} checks (median {checked.median():.0f} ms): "
        f"{spent / wall:.1%} of the sweep's wall time, {spent / measured:.1%} of the measurements' own time"
    )
    return rows


def part2(out: Path) -> None:
    spec = yaml.safe_load((ROOT / "sweeps/specs/recsys.yaml").read_text())
    spec |= {"comm_hook": HOOKS, "bucket_cap_mb": [0.25, 25], "repeats": 1, "cluster": "gc"}
    rows, wall = sweep(out, spec, "recsys-hooks")
    print(f"\n2. recsys example x comm_hook {HOOKS}, buckets 0.25 and 25 MB, 1 round: {wall:.0f} s")
    print(by_hook(rows).to_string(float_format=lambda x: f"{x:.2e}"))


def best_gas1_bucket(rows: pd.DataFrame) -> float:
    ddp = rows[(rows["mode"] == "ddp") & (rows["comm_hook"] == "none") & (rows["gas"] == 1)]
    return float(ddp.groupby("bucket_cap_mb")["step_ms"].median().idxmin())


def part3(out: Path, runs: int, bucket: float) -> None:
    spec = yaml.safe_load((ROOT / "sweeps/specs/smoke.yaml").read_text()) | {"gas": [1], "cluster": "gc"}
    target = next(
        c for c in expand(spec_from_dict(spec, "gc")) if c.step.mode == "ddp" and c.step.bucket_cap_mb == bucket
    )
    print(f"\n3. planted corruption (x{1 + CORRUPTION:g} on every rank) on the {bucket:g} MB cell, {runs} runs:")
    caught = 0
    for i in range(runs):
        rows, _ = sweep(out, spec, f"corrupt-{i}", {"DDPSWEEP_CORRUPT": f"{target.cell_id}={CORRUPTION}"})
        mine = rows[rows["cell_id"] == target.cell_id]
        (rec,) = recommend(rows)
        left = [c for c in rec["excluded"] if c["bucket_cap_mb"] == bucket]
        ok = set(mine["grad_check"]) == {"failed"} and bool(mine["replicas_in_sync"].all()) and bool(left)
        ok &= rec["best"]["bucket_cap_mb"] != bucket and rec["recommended"]["bucket_cap_mb"] != bucket
        caught += ok
        print(
            f"   run {i + 1}: verdicts {sorted(set(mine['grad_check']))}, replicas in sync "
            f"{bool(mine['replicas_in_sync'].all())}, error {mine['grad_rel_error'].median():.2e} vs tolerance "
            f"{mine['grad_tol'].max():.2e}; recommend: best {rec['best']['bucket_cap_mb']:g} MB, "
            f"left out: {left[0]['reason'] if left else 'nothing'}"
        )
    print(f"   caught and left out in {caught} of {runs} runs")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=3, help="planted-corruption runs")
    ap.add_argument("--out", type=Path, default=None, help="keep the store here (default: a temporary folder)")
    args = ap.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="grad-check-"))
    out.mkdir(parents=True, exist_ok=True)
    rows = part1(out)
    part2(out)
    part3(out, args.runs, best_gas1_bucket(rows))


if __name__ == "__main__":
    main()
