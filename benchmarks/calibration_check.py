"""Does the sweep's own calibration explain its U-curve? The smoke spec with `calibrate: true` and
`trace_comm: true`: the all-reduce curve (busbw by size) and its α–β fit on the group's own ranks, then per
curve the measured single-bucket overhead (largest bucket − baseline, with its interval) beside the
prediction t(gradient bytes), and the measured overlap per bucket size.

    python benchmarks/calibration_check.py [--spec sweeps/specs/smoke.yaml]
"""

from __future__ import annotations

import argparse
import dataclasses
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from results import analysis, costmodel  # noqa: E402
from results.storage.store import load, load_calibration  # noqa: E402
from sweeps.spec.files import load_spec  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--spec", default=str(ROOT / "sweeps/specs/smoke.yaml"))
    spec = dataclasses.replace(load_spec(ap.parse_args().spec), calibrate=True, trace_comm=True)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "spec.yaml"
        path.write_text(yaml.safe_dump(dataclasses.asdict(spec)))
        subprocess.run(
            [sys.executable, "-m", "service.cli", "run", str(path), "--results", tmp],
            cwd=ROOT,
            check=True,
            capture_output=True,
        )
        rows, calibration = load(tmp), load_calibration(tmp)
    ar = calibration[calibration["kind"] == "all_reduce"].sort_values("size_bytes")
    print("all-reduce on the group's own ranks:")
    for r in ar.itertuples():
        print(f"  {r.size_bytes:>10} B  {r.time_ms:8.3f} ms  busbw {r.busbw_gbps:6.3f} GB/s")
    for f in costmodel.fits(calibration).itertuples():
        print(
            f"alpha-beta: alpha {f.alpha_ms * 1e3:.0f} us, beta {f.beta_gbps:.3f} GB/s, max residual "
            f"{f.max_rel_residual:.0%} -> predictions use the {f.uses}"
        )
    curve = analysis.u_curve(rows)
    fit = costmodel.fits(calibration).iloc[0]
    predicted = float(costmodel.predict_ms(fit, [int(rows["grad_bytes"].dropna().iloc[0])])[0])
    print("\nsingle-bucket overhead, measured (largest bucket - baseline) vs predicted t(gradient bytes):")
    for c in curve.itertuples():
        m, lo, hi = c.single_bucket_overhead_ms, c.single_bucket_overhead_ms_ci_lo, c.single_bucket_overhead_ms_ci_hi
        print(
            f"  gas={c.gas} no_sync={c.no_sync}: measured {m:.2f} ms [{lo:.2f}, {hi:.2f}], predicted "
            f"{predicted:.2f} ms, predicted / measured {predicted / m:.2f}"
        )
    traced = rows[rows["comm_ms"].notna()].groupby(["gas", "no_sync", "bucket_cap_mb"])
    print("\nmeasured communication per step (trace_comm, medians): comm / exposed / overlapped fraction")
    for key, g in traced:
        print(
            f"  gas={key[0]} no_sync={key[1]} bucket={key[2]:g} MB: {g['comm_ms'].median():.2f} ms / "
            f"{g['comm_exposed_ms'].median():.2f} ms / {g['comm_overlap_frac'].median():.0%}"
        )


if __name__ == "__main__":
    main()
