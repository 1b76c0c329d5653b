"""The gradient check (trainers.gradcheck), measured on this machine in four parts; parts 1-3 are real sweeps on the
embedded Ray (gloo, 2 workers, one thread each):

1. GPU nondeterminism emulated: the smoke spec with `comm_hook: [none, fp16]` and DDPSWEEP_JITTER=*=1e-3 (every
   backward of every cell adds independent relative noise of 1e-3 to each attention block's input gradient, a
   new draw per call and rank): the verdict of every DDP measurement by hook, with its error and bound.
2. The same with a planted corruption of 1e-4 on one exact cell as well (DDPSWEEP_CORRUPT), `--runs` times: its
   verdict, whether its replicas stayed in sync, and whether `recommend` left it out with the reason.
3. The check's cost: the smoke spec with `grad_check: true` and `false`, interleaved (on, off, off, on, ...):
   the `ddpsweep run` command's wall time (Ray's start included), each pair's ratio and their median.
4. The check's host memory on gpt2-124m at one micro-step (1 x 64 tokens, one process, gloo world of one): the
   peak resident memory of the check step beyond a plain step of the same model and the fp64 accumulator.

    python benchmarks/grad_check.py [--runs 3] [--pairs 2] [--out DIR]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
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

from results.analysis.recommend import recommend  # noqa: E402
from results.storage.store import load  # noqa: E402
from sweeps.plan.grid import expand  # noqa: E402
from sweeps.spec.sweep import spec_from_dict  # noqa: E402

HOOKS = ["none", "fp16"]
JITTER, CORRUPTION = 1e-3, 1e-4


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
    ddp = rows[(rows["mode"] == "ddp") & (rows["status"] == "ok") & rows["grad_check"].notna()]
    return ddp.groupby("comm_hook").agg(
        checks=("grad_check", "size"),
        verdicts=("grad_check", lambda v: ", ".join(f"{k} {n}" for k, n in v.value_counts().items())),
        error_median=("grad_rel_error", "median"),
        error_max=("grad_rel_error", "max"),
        tol_min=("grad_tol", "min"),
        in_sync=("replicas_in_sync", "all"),
    )


def smoke(**extra) -> dict:
    return yaml.safe_load((ROOT / "sweeps/specs/smoke.yaml").read_text()) | {"cluster": "gc"} | extra


def part1(out: Path) -> None:
    rows, wall = sweep(out, smoke(comm_hook=HOOKS), "jitter", {"DDPSWEEP_JITTER": f"*={JITTER}"})
    print(f"1. smoke spec x comm_hook {HOOKS}, DDPSWEEP_JITTER=*={JITTER:g}: {len(rows)} measurements, {wall:.0f} s")
    print(by_hook(rows).to_string(float_format=lambda x: f"{x:.2e}"))


def part2(out: Path, runs: int) -> None:
    spec = smoke(gas=[1])
    target = next(c for c in expand(spec_from_dict(spec, "gc")) if c.step.mode == "ddp" and c.step.bucket_cap_mb == 25)
    env = {"DDPSWEEP_JITTER": f"*={JITTER}", "DDPSWEEP_CORRUPT": f"{target.cell_id}={CORRUPTION}"}
    print(f"\n2. jitter {JITTER:g} everywhere, corruption x{1 + CORRUPTION:g} on the 25 MB cell, {runs} runs:")
    caught = 0
    for i in range(runs):
        rows, _ = sweep(out, spec, f"corrupt-{i}", env)
        mine, others = rows[rows["cell_id"] == target.cell_id], rows[(rows["cell_id"] != target.cell_id)]
        (rec,) = recommend(rows)
        left = [c for c in rec["excluded"] if c["bucket_cap_mb"] == 25]
        exact = set(others.loc[others["mode"] == "ddp", "grad_check"].dropna())
        ok = set(mine["grad_check"].dropna()) == {"failed"} and bool(mine["replicas_in_sync"].all()) and bool(left)
        caught += ok and exact == {"exact"}
        print(
            f"   run {i + 1}: corrupted cell {sorted(set(mine['grad_check'].dropna()))} (error "
            f"{mine['grad_rel_error'].max():.2e} vs {mine['grad_tol'].max():.2e}), in sync "
            f"{bool(mine['replicas_in_sync'].all())}; the other DDP cells {sorted(exact)}; recommend left out: "
            f"{left[0]['reason'] if left else 'nothing'}"
        )
    print(f"   caught, left out, the rest exact: {caught} of {runs} runs")


def part3(out: Path, pairs: int) -> None:
    order = [flag for i in range(pairs) for flag in ((True, False) if i % 2 == 0 else (False, True))]
    walls: dict[bool, list[float]] = {True: [], False: []}
    spent = []
    for i, flag in enumerate(order):
        rows, wall = sweep(out, smoke(grad_check=flag), f"cost-{i}-{'on' if flag else 'off'}")
        walls[flag].append(wall)
        if flag:
            spent.append(rows["grad_check_ms"].dropna().sum() / 1e3 / wall)
    ratios = [on / off for on, off in zip(walls[True], walls[False], strict=True)]
    print(
        f"\n3. the check's cost on the smoke spec, {pairs} interleaved pairs "
        f"(order {['on' if f else 'off' for f in order]}):"
    )
    print(
        f"   wall with the check: {[f'{w:.1f}' for w in walls[True]]} s; "
        f"without: {[f'{w:.1f}' for w in walls[False]]} s"
    )
    print(f"   with / without per pair: {[f'{r:.3f}' for r in ratios]}; median {statistics.median(ratios):.3f}")
    print(f"   the checks' own time as a share of the wall: {[f'{s:.2%}' for s in spent]}")


def _kib(field: str) -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field))


def _peak_of(fn) -> int:
    """Peak resident memory above the resident memory at the start of fn(), bytes (VmHWM reset first)."""
    import gc

    gc.collect()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    start = _kib("VmRSS:")
    fn()
    return (_kib("VmHWM:") - start) * 1024


def part4(out: Path) -> None:
    import torch
    import torch.distributed as dist

    from trainers import gradcheck
    from trainers.config import StepConfig
    from trainers.replica import forward_backward, setup_replica
    from trainers.step import check_batches, check_gradient

    torch.set_num_threads(2)
    dist.init_process_group("gloo", init_method=f"file://{out}/pg", rank=0, world_size=1)
    cfg = StepConfig(model="gpt2-124m", micro_batch=1, seq_len=64, warmup_steps=0, timed_steps=1)
    rep = setup_replica(cfg, torch.device("cpu"))
    same = dataclasses.replace(rep, batches=check_batches(rep))  # the check step's batches, without the check
    forward_backward(same)  # first allocations done
    rep.opt.zero_grad(set_to_none=True)
    plains, checks, checked = [], [], []
    for _ in range(3):  # interleaved; glibc's reuse of freed pages moves a single figure by ~100 MiB
        plains.append(_peak_of(lambda: (forward_backward(same), rep.opt.zero_grad(set_to_none=True))))
        checks.append(_peak_of(lambda: checked.append(check_gradient(rep, None, lambda: None))))
    plain, check = statistics.median(plains), statistics.median(checks)
    n = sum(p.numel() for p in rep.model.parameters())
    accumulators = n * 8  # bytes: one fp64 sum per element (gas 1 needs no sum of |g|)
    extra = check - plain - accumulators
    print(f"\n4. host memory on gpt2-124m ({n / 1e6:.1f} M parameters), 1 x 64 tokens, one micro-step:")
    print(
        f"   peak above start, median of 3 interleaved: the same step without the check {plain / 2**20:.0f} MiB, check "
        f"{check / 2**20:.0f} MiB; fp64 accumulator {accumulators / 2**20:.0f} MiB"
    )
    print(
        f"   the check beyond a plain step and its accumulator: "
        f"{extra / 2**20:.0f} MiB (bound: 2 x {gradcheck.CHUNK_BYTES // 2**20} MiB)"
    )
    print(
        f"   verdict {checked[0].grad_check}, error {checked[0].grad_rel_error:.1e}, "
        f"check {checked[0].grad_check_ms:.0f} ms"
    )
    dist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=3, help="planted-corruption runs")
    ap.add_argument("--pairs", type=int, default=2, help="interleaved on/off pairs for the cost")
    ap.add_argument("--parts", default="1234", help="which parts to run")
    ap.add_argument("--out", type=Path, default=None, help="keep the store here (default: a temporary folder)")
    args = ap.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="grad-check-"))
    out.mkdir(parents=True, exist_ok=True)
    for part, run in (
        ("1", lambda: part1(out)),
        ("2", lambda: part2(out, args.runs)),
        ("3", lambda: part3(out, args.pairs)),
        ("4", lambda: part4(out)),
    ):
        if part in args.parts:
            run()


if __name__ == "__main__":
    main()
