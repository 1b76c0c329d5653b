"""The overlap model against measurement on this machine: per workload (the tiny preset; the shipped recsys
example), through the real CLI on the embedded Ray (gloo, 2 workers, one thread each):

1. `ddpsweep calibrate` (t(bytes) on the 1x2 group), then `ddpsweep predict` before anything is measured
   (the profile runs here, one thread);
2. `ddpsweep run`: `bucket_cap_mb` {0.05, 0.25, 1, 5, 25, 100} x `gas` {1, 4} x `no_sync` {false, true}, 5 rounds;
3. `ddpsweep predict --sweep`: per curve, median |predicted / measured - 1|, Spearman's rank correlation and
   whether the predicted best lies in the measured indistinguishable set, with the profile's compute as measured
   alone and with one slowdown per placement fitted to the sweep's cells.

    python benchmarks/predict_check.py [--rounds 5] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd
import yaml

ROOT = Path(__file__).resolve().parent.parent
GRID = {"bucket_cap_mb": [0.05, 0.25, 1, 5, 25, 100], "gas": [1, 4], "no_sync": [False, True]}
COMMON = {"workers": [2], "backend": "gloo", "use_gpu": False, "cpus_per_worker": 1, "warmup_steps": 3}
WORKLOADS = {
    "tiny": {"model": "tiny", "micro_batch": 8, "seq_len": 64, "timed_steps": 20},
    "recsys": yaml.safe_load((ROOT / "sweeps/specs/recsys.yaml").read_text())
    | {"timed_steps": 10, "cell_timeout_s": 600},
}


def cli(*args: str) -> str:
    done = subprocess.run([sys.executable, "-m", "service.cli", *args], cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"ddpsweep {' '.join(args)} failed:\n{done.stderr[-3000:]}")
    return done.stdout


def check(name: str, base: dict, out: Path, rounds: int) -> dict:
    spec = base | COMMON | GRID | {"name": f"predict-{name}", "cluster": "predict", "repeats": rounds}
    path = out / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec))
    results = ["--results", str(out / "store")]
    t0 = time.perf_counter()
    cli("calibrate", str(path), *results)
    before = json.loads(cli("predict", str(path), *results, "--format", "json"))
    predicted_s = time.perf_counter() - t0
    cli("run", str(path), *results, "--sweep", f"m-{name}")
    after = json.loads(cli("predict", str(path), *results, "--sweep", f"m-{name}", "--format", "json"))
    return {
        "before": before,
        "after": after,
        "calibrate_and_predict_s": predicted_s,
        "wall_s": time.perf_counter() - t0,
    }


def curve_table(curves: list[dict]) -> pd.DataFrame:
    table = pd.DataFrame(curves)
    cols = ["gas", "no_sync", "cells", "median_abs_error", "spearman", "predicted_best_mb", "measured_best_mb"]
    cols += ["indistinguishable_mb", "predicted_best_in_set", "slowdown"]
    return table[cols]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--only", choices=sorted(WORKLOADS), default=None, help="one workload")
    args = ap.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="predict-check-"))
    out.mkdir(parents=True, exist_ok=True)
    pd.set_option("display.width", 220)
    for name, base in WORKLOADS.items():
        if args.only not in (None, name):
            continue
        got = check(name, base, out, args.rounds)
        cells = pd.DataFrame(got["after"]["cells"])
        print(f"\n== {name}: calibrate + predict {got['calibrate_and_predict_s']:.0f} s, all {got['wall_s']:.0f} s")
        print("per cell (slowdown 1): predicted / measured, ms")
        shown = cells[["gas", "no_sync", "bucket_cap_mb", "predicted_ms", "step_ms", "prediction_error"]]
        print(shown.sort_values(["gas", "no_sync", "bucket_cap_mb"]).to_string(index=False, float_format="%.3g"))
        for key, title in (("curves", "compute as profiled"), ("curves_fitted", "one slowdown fitted per placement")):
            print(f"curves, {title}:")
            print(curve_table(got["after"][key]).to_string(index=False, float_format=lambda v: f"{v:.3g}"))
    print(f"\nstore: {out / 'store'}")


if __name__ == "__main__":
    main()
