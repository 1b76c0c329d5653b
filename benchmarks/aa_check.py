"""Does the significance rule hold up? The same spec run twice (A/A) must be flagged at no more than the
nominal false-positive rate; a real difference (A/B: the same spec with micro_batch doubled) must be found
with the right sign. Today's rule is printed beside the old one (|ratio - 1| > cv_a + cv_b).

    python benchmarks/aa_check.py [--spec sweeps/specs/smoke.yaml]
"""

from __future__ import annotations

import argparse
import dataclasses
import subprocess
import sys
import tempfile
from pathlib import Path

import pandas as pd
import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from results.analysis.compare import POSITION, compare  # noqa: E402
from results.storage.store import load  # noqa: E402
from sweeps.spec.files import load_spec  # noqa: E402
from sweeps.spec.sweep import SweepSpec  # noqa: E402


def run(spec: SweepSpec, cluster: str, results: str) -> None:
    path = Path(results) / f"{cluster}.yaml"
    fields = {k: v for k, v in dataclasses.asdict(spec).items() if v is not None}  # `workload: null` is a workload
    path.write_text(yaml.safe_dump(fields))
    subprocess.run(
        [sys.executable, "-m", "service.cli", "run", str(path), "--results", results, "--cluster", cluster],
        cwd=ROOT,
        check=True,
        capture_output=True,
    )


def old_rule(rows: pd.DataFrame, a: str, b: str) -> pd.Series:
    """The first version's rule: significant when |ratio - 1| > cv_a + cv_b (within-run CVs)."""
    agg = {"step_ms": "median", "step_ms_cv": "max"}
    left, right = (rows[rows["cluster"] == c].groupby(POSITION, dropna=False).agg(agg) for c in (a, b))
    both = left.merge(right, left_index=True, right_index=True, suffixes=("_a", "_b"))
    return (both["step_ms_b"] / both["step_ms_a"] - 1).abs() > both["step_ms_cv_a"] + both["step_ms_cv_b"]


def report(rows: pd.DataFrame, a: str, b: str, label: str) -> None:
    out = compare(rows, a, b)
    old = old_rule(rows, a, b)
    print(f"{label}: {len(out)} grid positions")
    print(
        f"  new rule (ratio interval excludes 1): {out['significant'].sum()} flagged = {out['significant'].mean():.1%}"
    )
    print(f"  old rule (|ratio-1| > cv_a + cv_b):    {old.sum()} flagged = {old.mean():.1%}")
    print(f"  verdicts: {out['verdict'].value_counts().to_dict()}")
    print(out[[*POSITION[:6], "ratio", "ratio_ci_lo", "ratio_ci_hi", "verdict"]].to_string(index=False))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--spec", default=str(ROOT / "sweeps/specs/smoke.yaml"))
    spec = load_spec(ap.parse_args().spec)
    with tempfile.TemporaryDirectory() as tmp:
        run(spec, "aa-1", tmp)
        run(spec, "aa-2", tmp)
        run(dataclasses.replace(spec, micro_batch=spec.micro_batch * 2), "ab-big", tmp)
        rows = pd.concat([load(tmp, cluster=c) for c in ("aa-1", "aa-2", "ab-big")], ignore_index=True)
    report(rows, "aa-1", "aa-2", "A/A (the same spec twice; target <= 5% flagged)")
    report(rows, "aa-1", "ab-big", "\nA/B (micro_batch doubled; every position should be 'slower')")


if __name__ == "__main__":
    main()
