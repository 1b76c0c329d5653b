"""The overlap model against measurement: per workload (the tiny preset; the shipped recsys example), through
the real CLI (gloo, 2 workers, one thread each), on the embedded Ray (1x2) or a cluster (--address, e.g. the
two-namespace cluster of two_node_cluster.sh with --topology 2x1):

1. `ddpsweep calibrate` (t(bytes) on the group's ranks), then `ddpsweep predict` before anything is measured
   (the profile runs here, one thread);
2. `ddpsweep run`: `bucket_cap_mb` {0.05, 0.25, 1, 5, 25, 100} x `gas` {1, 4} x `no_sync` {false, true}, 5 rounds;
3. `ddpsweep predict --sweep`: per curve, median |predicted / measured - 1|, Spearman's rank correlation and
   whether the predicted best lies in the measured indistinguishable set, with the profile's compute as measured
   alone and with one slowdown per placement fitted to the sweep's cells.

    python benchmarks/predict_check.py [--rounds 5] [--out DIR] [--only tiny|recsys]
    sudo benchmarks/two_node_cluster.sh up 100mbit
    sudo benchmarks/two_node_cluster.sh exec python benchmarks/predict_check.py --address 169.254.77.1:6379 \
        --topology 2x1 --recsys-rows 20000
    sudo benchmarks/two_node_cluster.sh up 400mbit     # then reshaped to where t(gradient) = the backward:
    sudo benchmarks/two_node_cluster.sh exec python benchmarks/predict_check.py --address 169.254.77.1:6379 \
        --topology 2x1 --only tiny --micro-batch 16 --seq-len 128 --caps 0.01,0.05,0.25,1,25 --gas 1 \
        --rounds 20 --match-link 400
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
    "small": {"model": "small", "micro_batch": 8, "seq_len": 128, "timed_steps": 10},
    "recsys": yaml.safe_load((ROOT / "sweeps/specs/recsys.yaml").read_text())
    | {"timed_steps": 10, "cell_timeout_s": 600},
}
# many gradient tensors: the recsys example's rows sharded into a table per field pair, a deeper MLP
WORKLOADS["recsys-tables"] = WORKLOADS["recsys"] | {
    "workload_args": {"rows": 16000, "dim": 32, "fields": 8, "tables": 8, "layers": 48, "width": 128},
    "micro_batch": 1024,
}
ASKED_ONLY = ("small", "recsys-tables")  # run only with --only


def cli(*args: str) -> str:
    done = subprocess.run([sys.executable, "-m", "service.cli", *args], cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"ddpsweep {' '.join(args)} failed:\n{done.stderr[-3000:]}")
    return done.stdout


def check(
    name: str,
    spec: dict,
    out: Path,
    where: list[str],
    grid: bool = True,
    link_mbit: float | None = None,
) -> dict:
    """Calibrate, predict, measure the grid (unless `grid` is False: the store has it), compare. With `link_mbit`
    (the two-namespace link's rate now), the link is first reshaped to the rate at which the whole gradient's
    all-reduce takes as long as the profiled backward, and calibrated again there."""
    path = out / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec))
    results = ["--results", str(out / "store"), "--cluster", spec["cluster"]]
    t0 = time.perf_counter()
    if grid:
        cli("calibrate", str(path), *results, *where)
    before = json.loads(cli("predict", str(path), *results, "--format", "json"))
    got: dict = {}
    if grid and link_mbit:
        got["link"] = match_link(out / "store", spec["cluster"], link_mbit)
        cli("calibrate", str(path), *results, *where)
        before = json.loads(cli("predict", str(path), *results, "--format", "json"))
    got |= {"before": before, "calibrate_and_predict_s": time.perf_counter() - t0}
    if grid:
        t1 = time.perf_counter()
        cli("run", str(path), *results, *where, "--sweep", f"m-{name}")
        got["grid_s"] = time.perf_counter() - t1
    got["after"] = json.loads(cli("predict", str(path), *results, "--sweep", f"m-{name}", "--format", "json"))
    return got | {"wall_s": time.perf_counter() - t0}


def match_link(store: Path, cluster: str, mbit: float) -> str:
    """Reshape the two-namespace link so that t(whole gradient) = the profiled backward: the rate scales the
    bandwidth part of t, (t − α) ∝ 1 / rate. Returns both figures and the rate chosen."""
    from results.model import costmodel, predicted
    from results.storage.store import Store, load_calibration

    cal = load_calibration(str(store), cluster)
    fit = costmodel.fits(cal).iloc[-1]
    (prof,) = predicted.profiles_of(Store.open(str(store)).read_profiles().to_pandas()).values()
    t_grad = predicted.newest_costs(cal)[(cluster, int(fit["world_size"]), int(fit["num_nodes"]))](prof.gradient_bytes)
    alpha = float(fit["alpha_ms"])
    rate = mbit * (t_grad - alpha) / max(prof.backward_ms - alpha, 1e-3)
    script = ROOT / "benchmarks" / "two_node_cluster.sh"
    subprocess.run(["bash", str(script), "rate", f"{rate:.0f}mbit"], check=True, capture_output=True)
    return (
        f"at {mbit:g} Mbit/s: t(gradient, {prof.gradient_bytes} B) {t_grad:.1f} ms against the profiled backward "
        f"{prof.backward_ms:.1f} ms (alpha {alpha * 1e3:.0f} us): the link reshaped to {rate:.0f} Mbit/s"
    )


def judge(store: Path, cluster: str, sweep: str) -> pd.DataFrame:
    """Per curve of the grid sweep: its depth (largest / best − 1) against what it resolves (min_resolvable_rel),
    whether it has a left arm (its smallest bucket outside the indistinguishable set), and the model's median
    |error|, Spearman and left arm with the measured terms and without them (g = 1, c = κ = λ = 0), at slowdown 1."""
    from results.analysis import cells as analysis
    from results.model import predicted
    from results.storage.store import Store, load, load_calibration

    rows, cal = load(str(store), cluster, sweep), load_calibration(str(store), cluster)
    profiles = predicted.profiles_of(Store.open(str(store)).read_profiles().to_pandas())
    costs = predicted.newest_costs(cal)
    plain = {k: predicted.Cost(v.t) for k, v in costs.items()}
    cells = predicted.measured_cells(rows)
    both = {"terms": predicted.with_predictions(cells, profiles, costs)}
    both["no_terms"] = predicted.with_predictions(cells, profiles, plain)
    curve = ["world_size", "gas", "no_sync"]
    resolves = {tuple(r[k] for k in curve): r["min_resolvable_rel"] for _, r in analysis.u_curve(rows).iterrows()}
    lines = []
    for key, grp in both["terms"].groupby(curve):
        grp = grp.sort_values("bucket_cap_mb")
        best = grp.loc[grp["step_ms"].idxmin()]
        same = [analysis.same_as(r, best) for _, r in grp.iterrows()]
        line = dict(zip(curve, key, strict=True)) | {"depth": grp["step_ms"].max() / grp["step_ms"].min() - 1}
        line |= {"resolves": resolves.get(key), "left_arm": not same[0]}
        for name, table in both.items():
            p = table.loc[grp.index, "predicted_ms"].to_numpy()
            acc = overlap_accuracy(p, grp["step_ms"].to_numpy(), {i for i, x in enumerate(same) if x})
            line |= {f"{k}_{name}": v for k, v in acc.items()}
            line[f"left_arm_{name}"] = bool(p[0] > p.min() * 1.005)
        lines.append(line)
    return pd.DataFrame(lines)


def overlap_accuracy(predicted_ms, measured_ms, same: set[int]) -> dict:
    from results.model import overlap

    acc = overlap.accuracy(predicted_ms, measured_ms, same)
    return {"error": acc["median_abs_error"], "rho": acc["spearman"], "best_in_set": acc["predicted_best_in_set"]}


def link_figures(store: Path, cluster: str) -> str:
    """What picks the link rate: t(the whole gradient) on the calibration against the profiled backward, and the
    overlap terms measured beside the all-reduces."""
    from results.model import costmodel, predicted
    from results.storage.store import Store, load_calibration

    cal = load_calibration(str(store), cluster)
    profiles = predicted.profiles_of(Store.open(str(store)).read_profiles().to_pandas())
    lines = []
    for (_, fit), line in zip(costmodel.fits(cal).iterrows(), costmodel.summary(cal).itertuples(), strict=True):
        cost = predicted.cost(fit)  # this calibration's t(bytes), not only the newest
        lines.append(
            f"{line.sweep_id}, {line.world_size} ranks / {line.num_nodes} node(s): alpha {line.alpha_ms * 1e3:.0f} "
            f"us, beta {line.beta_gbps:.3f} GB/s; {costmodel.describe_terms(line)}"
        )
        for (c, _), prof in profiles.items():
            if c == line.cluster:
                what = f"t(gradient, {prof.gradient_bytes} B) {cost(prof.gradient_bytes):.1f} ms"
                lines.append(f"  profile: backward {prof.backward_ms:.1f} ms; {what}")
    return "\n".join(lines)


def curve_table(curves: list[dict]) -> pd.DataFrame:
    table = pd.DataFrame(curves)
    cols = ["gas", "no_sync", "cells", "median_abs_error", "spearman", "predicted_best_mb", "measured_best_mb"]
    cols += ["indistinguishable_mb", "predicted_best_in_set", "slowdown"]
    return table[cols]


def grid_of(args: argparse.Namespace) -> dict:
    grid = dict(GRID)
    if args.caps:
        grid["bucket_cap_mb"] = [float(c) for c in args.caps.split(",")]
    if args.gas:
        grid |= {"gas": [int(g) for g in args.gas.split(",")], "no_sync": [False]}
    return grid


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--only", choices=sorted(WORKLOADS), default=None, help="one workload")
    ap.add_argument("--address", default=None, help="a Ray cluster (default: the embedded Ray)")
    ap.add_argument("--topology", default="1x2", help="nodes x workers per node (2x1: one rank per node)")
    ap.add_argument("--no-grid", action="store_true", help="the store under --out has the grid sweeps already")
    ap.add_argument("--recsys-rows", type=int, default=None, help="the recsys example's embedding rows")
    ap.add_argument("--caps", default=None, help="bucket_cap_mb values, comma-separated (default: the grid's)")
    ap.add_argument("--gas", default=None, help="gas values, comma-separated; with it no_sync is false only")
    ap.add_argument("--micro-batch", type=int, default=None, help="the workload's micro-batch")
    ap.add_argument("--seq-len", type=int, default=None, help="the GPT presets' sequence length")
    ap.add_argument(
        "--match-link", type=float, default=None, metavar="MBIT", help="the link's rate now: reshape it first"
    )
    args = ap.parse_args()
    where = [] if args.address is None else ["--address", args.address]
    cluster = "predict" if args.address is None else f"predict-{args.topology}"
    out = args.out or Path(tempfile.mkdtemp(prefix="predict-check-"))
    out.mkdir(parents=True, exist_ok=True)
    pd.set_option("display.width", 220)
    for name, base in WORKLOADS.items():
        if (args.only is None and name in ASKED_ONLY) or args.only not in (None, name):
            continue
        spec = base | COMMON | grid_of(args) | {"name": f"predict-{name}", "cluster": cluster, "repeats": args.rounds}
        spec |= {"micro_batch": args.micro_batch} if args.micro_batch else {}
        spec |= {"seq_len": args.seq_len} if args.seq_len and name in ("tiny", "small") else {}
        spec |= {"topology": [args.topology]} if args.topology != "1x2" else {}
        spec |= {"env": {"GLOO_SOCKET_IFNAME": "ddp0"}} if args.address else {}
        if args.recsys_rows and "workload_args" in spec:
            spec["workload_args"] = spec["workload_args"] | {"rows": args.recsys_rows}
        got = check(
            name,
            {k: v for k, v in spec.items() if not (k == "workers" and "topology" in spec)},
            out,
            where,
            grid=not args.no_grid,
            link_mbit=args.match_link,
        )
        cells = pd.DataFrame(got["after"]["cells"])
        print(f"\n== {name}: calibrate + predict {got['calibrate_and_predict_s']:.0f} s, all {got['wall_s']:.0f} s")
        if "link" in got:
            print(f"the link: {got['link']}")
        print("per cell (slowdown 1): predicted / measured, ms")
        shown = cells[["gas", "no_sync", "bucket_cap_mb", "predicted_ms", "step_ms", "prediction_error"]]
        print(shown.sort_values(["gas", "no_sync", "bucket_cap_mb"]).to_string(index=False, float_format="%.3g"))
        for key, title in (("curves", "compute as profiled"), ("curves_fitted", "one slowdown fitted per placement")):
            print(f"curves, {title}:")
            print(curve_table(got["after"][key]).to_string(index=False, float_format=lambda v: f"{v:.3g}"))
        print(f"the link and the terms:\n{link_figures(out / 'store', cluster)}")
        neutral = "without them (g = 1, c = κ = λ = 0)"
        print(f"judged ({args.rounds} rounds), with the measured terms and {neutral}, slowdown 1:")
        judged = judge(out / "store", cluster, f"m-{name}")
        print(judged.to_string(index=False, float_format=lambda v: f"{v:.3g}"))
    print(f"\nstore: {out / 'store'}")


if __name__ == "__main__":
    main()
