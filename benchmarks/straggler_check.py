"""Stragglers named (results.analysis.stragglers), measured on this machine with real sweeps on the embedded Ray
(the smoke spec: gloo, 2 workers, one thread each), interleaved: planted, A/A, planted, A/A, ...

- planted: DDPSWEEP_SLOWDOWN=*@1=<fraction> (rank 1's forward + backward slowed by that fraction in every cell):
  is rank 1 named, and only it, with its ratio, interval and cost?
- A/A: the same spec twice with no plant, the two sweeps into one store: is any rank named in either?

Per run: the sweep's devices, each with its compute ratio against its peers, the interval, the cost per step and
whether it was named; then the tallies (named in n of N planted runs; flagged in n of M A/A sweeps).

    python benchmarks/straggler_check.py [--runs 3] [--fraction 0.3] [--out DIR]
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

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from results import stragglers  # noqa: E402
from results.storage.store import load  # noqa: E402


def sweep(out: Path, sweep_id: str, env: dict[str, str]) -> tuple[pd.DataFrame, float]:
    """The smoke spec with `ddpsweep run` into `out`; (its rows, the command's wall time in s)."""
    cmd = [sys.executable, "-m", "service.cli", "run", "smoke", "--results", str(out), "--sweep", sweep_id]
    clean = {k: v for k, v in os.environ.items() if k != "DDPSWEEP_SLOWDOWN"}
    t0 = time.perf_counter()
    subprocess.run(cmd, cwd=ROOT, env=clean | env, check=True, capture_output=True)
    rows = load(str(out))
    return rows[rows["sweep_id"] == sweep_id], time.perf_counter() - t0


def shown(table: pd.DataFrame) -> str:
    cols = ["sweep_id", "local_rank", "device", "rows", "ratio", "ratio_lo", "ratio_hi", "cost_ms", "straggler"]
    return table[cols].round(3).to_string(index=False)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3, help="planted runs, and as many A/A pairs")
    ap.add_argument("--fraction", type=float, default=0.3, help="rank 1's planted slowdown")
    ap.add_argument("--out", default=None, help="results folder (default: a temporary one)")
    args = ap.parse_args()
    out = Path(args.out or tempfile.mkdtemp(prefix="stragglers-"))
    named, aa_flagged = 0, 0
    for run in range(args.runs):
        rows, wall = sweep(out / f"planted{run}", f"planted{run}", {"DDPSWEEP_SLOWDOWN": f"*@1={args.fraction}"})
        table = stragglers.stragglers(rows)
        found = table[table["straggler"]]
        ok = list(found["local_rank"]) == [1]
        named += ok
        print(f"planted run {run + 1}: rank 1 +{args.fraction:.0%}, {len(rows)} rows, {wall:.0f} s; named: {ok}")
        print(shown(table))
        aa = [sweep(out / f"aa{run}", f"aa{run}-{side}", {}) for side in "ab"]
        table = stragglers.stragglers(pd.concat([r for r, _ in aa], ignore_index=True))
        flagged = int(table["straggler"].sum())
        aa_flagged += flagged > 0
        print(f"A/A pair {run + 1}: the smoke spec twice, no plant, {sum(w for _, w in aa):.0f} s; flagged: {flagged}")
        print(shown(table))
    print(f"\nnamed in {named} of {args.runs} planted runs; a rank flagged in {aa_flagged} of {args.runs} A/A pairs")
    print(f"(a straggler: its compute ratio's 95% interval wholly above {1 + stragglers.MIN_REL:.2f})")


if __name__ == "__main__":
    main()
