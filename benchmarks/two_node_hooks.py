"""The slow-link knobs on a real rate-limited link, side by side in one run.

    sudo .venv/bin/python benchmarks/two_node_hooks.py [--rate 100mbit]

Brings up the two-namespace cluster (benchmarks/two_node_cluster.sh), runs benchmarks/two_node_hooks.yaml
on it (comm_hook none / fp16 / powersgd rank 1; topologies 1x2 and 2x1; 5 interleaved rounds; trace on),
brings it down, then prints per topology: bytes per step from the trace and their ratios to `none`,
exposed communication, step time with its 95% interval and the step-time ratio to `none` with its
interval (bootstrap over rounds and steps), and what `ddpsweep recommend` says.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from results import analysis, recommend  # noqa: E402
from results.analysis.uncertainty import interval  # noqa: E402
from results.storage.store import load  # noqa: E402

SCRIPT = ROOT / "benchmarks" / "two_node_cluster.sh"
SPEC = ROOT / "benchmarks" / "two_node_hooks.yaml"
HEAD = "169.254.77.1:6379"


def cluster(*args: str) -> None:
    env = {"PYTHON": sys.executable, "PATH": f"{Path(sys.executable).parent}:/usr/sbin:/usr/bin:/sbin:/bin"}
    subprocess.run(["bash", str(SCRIPT), *args], check=True, cwd=ROOT, env=env)


def measure(rate: str, results: str) -> None:
    cluster("up", rate)
    try:
        cluster("exec", sys.executable, "-m", "service.cli", "run", str(SPEC), "--address", HEAD, "--results", results)
    finally:
        cluster("down")


def table(results: str) -> None:
    rows = load(results)
    ddp = rows[(rows["mode"] == "ddp") & (rows["status"] == "ok")]
    cells = analysis.ok_cells(rows)
    cells = cells[cells["mode"] == "ddp"]
    for (nodes, world), grp in cells.groupby(["num_nodes", "world_size"]):
        topo = f"{nodes}x{world // nodes}"
        by = grp.set_index("comm_hook")
        raw = ddp[(ddp["num_nodes"] == nodes) & (ddp["world_size"] == world)].groupby("comm_hook")
        sent = raw["comm_bytes_per_step"].median()
        exposed = raw["comm_exposed_ms"].median()
        print(f"\n{topo} ({'across the link' if nodes > 1 else 'one node'}):")
        for hook in ("none", "fp16", "powersgd"):
            c = by.loc[hook]
            lo, hi = interval(c["step_ms_reps"] / by.loc["none", "step_ms_reps"]) if hook != "none" else (1, 1)
            print(
                f"  {hook:9s} step {c['step_ms']:7.1f} ms [{c['step_ms_ci_lo']:.1f}, {c['step_ms_ci_hi']:.1f}]"
                f"  ÷none {c['step_ms'] / by.loc['none', 'step_ms']:.3f} [{lo:.3f}, {hi:.3f}]"
                f"  bytes/step {int(sent[hook]):>9,d} (÷none {sent[hook] / sent['none']:.3f})"
                f"  exposed comm {exposed[hook]:6.1f} ms (÷none {exposed[hook] / exposed['none']:.2f})"
            )
    print()
    for rec in recommend.recommend(rows):
        print(f"recommend {rec['topology']}: {rec['verdict']}")
    print(f"\nrounds per cell: {statistics.median(ddp.groupby('cell_id').size())}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", default="100mbit")
    parser.add_argument("--results", default=None, help="keep the rows here (default: a temporary folder)")
    args = parser.parse_args()
    results = args.results or tempfile.mkdtemp(prefix="two-node-hooks-")
    measure(args.rate, results)
    print(f"rows: {results}")
    table(results)


if __name__ == "__main__":
    main()
