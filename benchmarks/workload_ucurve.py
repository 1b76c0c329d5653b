"""The U-curve of a workload that is not GPT-shaped beside the tiny GPT preset's, measured in one run on
this machine: the same buckets, workers, rounds and timing for both (sweeps/specs/recsys.yaml, and the
same grid with `model: tiny`), then per workload the best bucket with its 95% interval, the buckets
indistinguishable from it, the bucket count DDP built at each size, and the worst/best ratio.

    python benchmarks/workload_ucurve.py [--repeats 5] [--out DIR]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from results import analysis  # noqa: E402
from results.storage.store import load  # noqa: E402


def specs(repeats: int) -> dict[str, dict]:
    recsys = yaml.safe_load((ROOT / "sweeps/specs/recsys.yaml").read_text()) | {"repeats": repeats}
    gpt = {k: v for k, v in recsys.items() if k not in ("workload", "workload_args")}
    gpt |= {"name": "gpt-tiny", "model": "tiny", "micro_batch": 8, "seq_len": 64}
    return {"recsys": recsys, "gpt-tiny": gpt}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", default=None, help="results root (default: a temporary folder)")
    args = parser.parse_args()
    out = Path(args.out or tempfile.mkdtemp(prefix="ddpsweep-workloads-"))
    out.mkdir(parents=True, exist_ok=True)
    for name, spec in specs(args.repeats).items():  # one after the other, on the same idle machine
        path = out / f"{name}.yaml"
        path.write_text(yaml.safe_dump(spec))
        cmd = [sys.executable, "-m", "service.cli", "run", str(path), "--results", str(out)]
        subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True)
    rows = load(str(out))
    buckets = rows[rows["mode"] == "ddp"].groupby(["model", "bucket_cap_mb"])["num_buckets"].median()
    for (model,), curve in analysis.u_curve(rows).groupby(["model"]):
        line = curve.iloc[0]
        cells = analysis.ok_cells(rows[(rows["model"] == model) & (rows["mode"] == "ddp")])
        worst = cells["step_ms"].max() / cells["step_ms"].min()
        grad = rows[rows["model"] == model]["grad_bytes"].iloc[0] / 2**20
        print(f"{model}: {grad:.1f} MiB of gradients, {int(line['n_repeats'])} rounds")
        print(
            f"  best bucket {line['best_bucket_cap_mb']:g} MB: {line['best_step_ms']:.2f} ms "
            f"[{line['best_step_ms_ci_lo']:.2f}, {line['best_step_ms_ci_hi']:.2f}], "
            f"efficiency {line['best_efficiency']:.2f} [{line['best_efficiency_ci_lo']:.2f}, "
            f"{line['best_efficiency_ci_hi']:.2f}]"
        )
        print(f"  indistinguishable: {', '.join(f'{b:g}' for b in line['indistinguishable_buckets_mb'])} MB")
        for _, c in cells.sort_values("bucket_cap_mb").iterrows():
            n = buckets.get((model, c["bucket_cap_mb"]))
            print(
                f"    {c['bucket_cap_mb']:>7g} MB: {c['step_ms']:8.2f} ms [{c['step_ms_ci_lo']:.2f}, "
                f"{c['step_ms_ci_hi']:.2f}]  {n:.0f} buckets"
            )
        print(f"  slowest / fastest bucket: {worst:.2f}x")
    print(f"rows: {out}")


if __name__ == "__main__":
    main()
