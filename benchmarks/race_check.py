"""Racing, validated on this machine: real races with planted slowdowns, then races simulated from the per-step
data those runs measured.

Real: a smoke-shaped group (tiny GPT, 2 gloo workers, buckets 0.05/0.25/1/25 MB, gas 1) under `search: race`,
with DDPSWEEP_SLOWDOWN planting 0 / 0 / +30% / +60% on the four buckets (a different pair each race). Per race:
the round each cell was dropped after, the winner, and the measurements of the raced cells against a full grid
with the same max_rounds (two tied cells are measured to max_rounds, so the share falls toward 50% only as
max_rounds grows: the default here is 24, looked at after rounds 3, 5, 8, 12, 18, 24).

Simulated (200 races each, results.analysis.racing's rule, min_rounds 3, max_rounds as above): four equal cells with the
measured step noise and round-to-round noise (A/A: how often is any cell dropped?), then with a GPU-like 2% CV
per round, equal and with one cell 10% slower (how often is it dropped, and how soon?).

    python benchmarks/race_check.py [--races 3] [--sims 200] [--max-rounds 24] [--rows DIR]
    python benchmarks/race_check.py --noise 0.119,0.129     # simulations only, at a given noise
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from statistics import NormalDist

import numpy as np
import pandas as pd
import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from results.analysis.racing import ALPHA, Rule, eliminated  # noqa: E402
from results.storage.store import load  # noqa: E402

BUCKETS = [0.05, 0.25, 1.0, 25.0]
PLANTED = [0.0, 0.0, 0.30, 0.60]  # rotated over the buckets from race to race
SPEC = {
    "name": "race",
    "cluster": "race-check",
    "model": "tiny",
    "micro_batch": 8,
    "seq_len": 64,
    "warmup_steps": 3,
    "timed_steps": 10,
    "workers": [2],
    "bucket_cap_mb": BUCKETS,
    "backend": "gloo",
    "use_gpu": False,
    "search": "race",
    "min_rounds": 3,
}


def real_race(out: Path, i: int, max_rounds: int, timed_steps: int) -> pd.DataFrame:
    """One race on the embedded Ray, its slowdowns planted on a rotation of the buckets; its rows."""
    from sweeps.plan.grid import expand
    from sweeps.spec.sweep import spec_from_dict

    spec = SPEC | {"repeats": max_rounds, "timed_steps": timed_steps}
    cells = {c.step.bucket_cap_mb: c.cell_id for c in expand(spec_from_dict(spec, "race")) if c.step.mode == "ddp"}
    planted = {b: PLANTED[(k + i) % len(BUCKETS)] for k, b in enumerate(BUCKETS)}
    path = out / "race.yaml"
    path.write_text(yaml.safe_dump(spec))
    env = os.environ | {"DDPSWEEP_SLOWDOWN": ",".join(f"{cells[b]}={f}" for b, f in planted.items() if f)}
    cmd = [sys.executable, "-m", "service.cli", "run", str(path), "--results", str(out), "--sweep", f"race-{i}"]
    subprocess.run(cmd, cwd=ROOT, env=env, check=True, capture_output=True)
    rows = load(str(out))
    return rows[rows["sweep_id"] == f"race-{i}"]


def report_race(rows: pd.DataFrame, max_rounds: int) -> dict:
    ddp = rows[(rows["mode"] == "ddp") & (rows["status"] == "ok")]
    slowed = set(ddp.loc[ddp["injected_slowdown"].notna(), "cell_id"])
    last = ddp.groupby("cell_id")["eliminated_at_round"].max()
    dropped = {c: int(r) for c, r in last.items() if pd.notna(r)}
    survivors = ddp[~ddp["cell_id"].isin(dropped)]
    winner = survivors.groupby("cell_id")["step_ms"].median().idxmin()
    full = len(BUCKETS) * max_rounds  # every raced (DDP) cell in every round
    for _, cell in ddp.drop_duplicates("cell_id").sort_values("bucket_cap_mb").iterrows():
        f = cell["injected_slowdown"]
        fate = f"dropped after round {dropped[cell['cell_id']] + 1}" if cell["cell_id"] in dropped else "kept"
        print(f"    {cell['bucket_cap_mb']:g} MB, planted {0 if pd.isna(f) else f:+.0%}: {fate}")
    used, base = len(ddp), len(rows) - len(ddp)
    print(
        f"    winner: {ddp.loc[ddp['cell_id'] == winner, 'bucket_cap_mb'].iloc[0]:g} MB; {used} of {full} measurements "
        f"of the raced cells ({used / full:.0%}); with the baseline (never raced): {used + base} of {full + max_rounds}"
    )
    return {
        "slowed_dropped_by_5": all(dropped.get(c, 99) <= 4 for c in slowed),
        "winner_unslowed": winner not in slowed,
        "fraction": used / full,
    }


@dataclass(frozen=True)
class Noise:
    """A group's noise at its three levels (log SDs): what every cell of a round shares (`round_sd`: cancels in
    round-blocked comparisons), what each cell's measurement adds beyond its steps' sampling (`cell_sd`), and
    the per-step residuals around each measurement's median (`steps`, `steps_per` of them per measurement)."""

    steps: np.ndarray
    steps_per: int
    cell_sd: float
    round_sd: float = 0.0


def measured_noise(rows: pd.DataFrame) -> Noise:
    """From the unslowed DDP rows: a two-way split of the rows' log medians (cell + round + residual), less the
    part of the residual that the steps' own sampling explains (a bootstrap of each row's median)."""
    ok = rows[(rows["mode"] == "ddp") & (rows["status"] == "ok") & rows["injected_slowdown"].isna()]
    steps = [np.log(np.asarray(t) / np.median(t)) for t in ok["step_times_ms"]]
    logs = np.log(ok["step_ms"])
    cell = logs - logs.groupby(ok["cell_id"]).transform("mean")
    round_key = ok["group_id"].astype(str) + "/" + ok["round"].astype(str)
    common = cell.groupby(round_key).transform("mean")
    n_cells, n_rounds = ok["cell_id"].nunique(), round_key.nunique()
    resid_var = float(((cell - common) ** 2).sum() / max(len(ok) - n_cells - n_rounds + 1, 1))  # two-way df
    rng = np.random.default_rng(0)
    sampling = np.mean([np.var([np.median(rng.choice(s, len(s))) for _ in range(200)]) for s in steps])
    round_sd = float(np.sqrt(max(float(common.var(ddof=1)) - resid_var / n_cells, 0.0)))
    cell_sd = float(np.sqrt(max(resid_var - sampling, 0.0)))
    return Noise(np.concatenate(steps), int(np.median([len(s) for s in steps])), cell_sd, round_sd)


def simulate(args: tuple) -> dict[int, int]:
    """One simulated race: {cell: round dropped after}. Each measurement: the round's common level times the
    cell's own (both lognormal) times `steps_per` per-step factors resampled from the measured residuals."""
    seed, slow, noise, rule = args
    rng = np.random.default_rng(seed)
    alive, dropped, rows = set(range(len(slow))), {}, []
    for r in range(rule.max_rounds):
        common = rng.normal(0, noise.round_sd)
        for c in sorted(alive):
            level = 100.0 * (1 + slow[c]) * np.exp(common + rng.normal(0, noise.cell_sd))
            times = level * np.exp(rng.choice(noise.steps, noise.steps_per))
            rows.append(
                {"cell_id": str(c), "round": r, "cluster": "s", "sweep_id": "s", "group_id": "g", "status": "ok"}
                | {"step_times_ms": times, "step_ms": float(np.median(times)), "repeat": r}
            )
        if r + 1 in rule.looks_at:
            live = pd.DataFrame([x for x in rows if int(x["cell_id"]) in alive])
            for c in eliminated(live, rule, {str(k): len(slow) - 1 for k in range(len(slow))}, seed=seed + r):
                alive.discard(int(c))
                dropped[int(c)] = r
    return dropped


def gpu_like(steps_per: int) -> Noise:
    """2% CV per step and 2% per measurement, nothing shared by a round."""
    return Noise(np.random.default_rng(0).normal(0, 0.02, 100_000), steps_per, 0.02)


def simulations(noise: Noise, sims: int, max_rounds: int) -> None:
    rule = Rule(race=True, min_rounds=3, max_rounds=max_rounds, tolerance=0.02)
    cases = [
        ("A/A, this machine's noise", [0.0] * 4, noise),
        ("one cell +30%, this machine's noise", [0.0, 0.0, 0.30, 0.0], noise),
        ("A/A, GPU-like 2% CV", [0.0] * 4, gpu_like(noise.steps_per)),
        ("one cell +10%, GPU-like 2% CV", [0.0, 0.0, 0.10, 0.0], gpu_like(noise.steps_per)),
    ]
    with multiprocessing.Pool(os.cpu_count()) as pool:
        for name, slow, case_noise in cases:
            outs = pool.map(simulate, [(s, slow, case_noise, rule) for s in range(sims)])
            any_dropped = sum(bool(o) for o in outs) / sims
            line = f"  {name}: a cell dropped in {any_dropped:.1%} of {sims} races"
            if any(slow):
                hit = [o[2] for o in outs if 2 in o]
                wrong = sum(any(k != 2 for k in o) for o in outs) / sims
                by5 = sum(r < 5 for r in hit) / sims
                line += (
                    f"; the slower one in {len(hit) / sims:.1%} (median after round {np.median(hit) + 1:.0f}; "
                    f"by round 5 in {by5:.1%}), an equal one in {wrong:.1%}"
                )
            print(line)


def joint_boundary(rule: Rule, cells: int = 4, paths: int = 400_000) -> tuple[float, float]:
    """(exact, Bonferroni) z of the race's bound: the 95% point of the largest standardized difference of any
    ordered pair of `cells` equal cells at any of the rule's looks (normal, known variance, looks correlated as
    nested means are), against the Bonferroni z the rule uses (results.analysis.racing.Rule.level)."""
    rng = np.random.default_rng(0)
    looks = np.array(rule.looks_at)
    steps = np.diff(np.concatenate([[0], looks]))
    sums = np.cumsum(rng.normal(size=(paths, len(looks), cells)) * np.sqrt(steps)[None, :, None], axis=1)
    means = sums / np.sqrt(looks)[None, :, None]  # each cell's mean after each look, in units of its SD
    widest = ((means.max(axis=2) - means.min(axis=2)) / np.sqrt(2)).max(axis=1)
    bonferroni = NormalDist().inv_cdf(1 - rule.level(cells * (cells - 1)))
    return float(np.quantile(widest, 1 - ALPHA)), bonferroni


def describe(noise: Noise) -> str:
    return (
        f"per-step SD {noise.steps.std():.1%}, {noise.steps_per} steps a measurement; per cell and round "
        f"{noise.cell_sd:.1%} beyond the steps; shared by a round's cells {noise.round_sd:.1%} (log)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--races", type=int, default=3)
    parser.add_argument("--sims", type=int, default=200)
    parser.add_argument("--max-rounds", type=int, default=24)
    parser.add_argument("--timed-steps", type=int, default=SPEC["timed_steps"], help="timed steps per measurement")
    parser.add_argument(
        "--boundary", action="store_true", help="only the exact joint bound over looks and pairs vs Bonferroni"
    )
    parser.add_argument("--rows", default=None, help="a results root holding race-* sweeps (skips the real runs)")
    parser.add_argument(
        "--noise",
        default=None,
        help="STEP_SD,CELL_SD[,ROUND_SD] (log): simulate only; normal per-step noise, each measurement's own "
        "level, the level a round's cells share",
    )
    args = parser.parse_args()
    if args.boundary:
        rule = Rule(race=True, min_rounds=3, max_rounds=args.max_rounds)
        exact, bonferroni = joint_boundary(rule)
        print(f"4 equal cells, looks {rule.looks_at}: exact joint z {exact:.3f}")
        print(f"Bonferroni over looks x ordered pairs (the rule's): z {bonferroni:.3f}")
        return
    if args.noise:
        step_sd, cell_sd, *shared = (float(v) for v in args.noise.split(","))
        steps = np.random.default_rng(0).normal(0, step_sd, 100_000)
        noise = Noise(steps, args.timed_steps, cell_sd, shared[0] if shared else 0.0)
        print(f"simulated races ({args.sims} each, {describe(noise)}):")
        simulations(noise, args.sims, args.max_rounds)
        return
    out = Path(args.rows or tempfile.mkdtemp(prefix="ddpsweep-race-"))
    frames = []
    for i in range(args.races):
        print(f"race {i + 1}/{args.races}:")
        rows = (
            real_race(out, i, args.max_rounds, args.timed_steps)
            if args.rows is None
            else load(str(out)).query(f"sweep_id == 'race-{i}'")
        )
        frames.append(rows)
        verdict = report_race(rows, args.max_rounds)
        print(
            f"    both slowed dropped by round 5: {verdict['slowed_dropped_by_5']}; winner unslowed: "
            f"{verdict['winner_unslowed']}; measurements {verdict['fraction']:.0%} of a full grid"
        )
    noise = measured_noise(pd.concat(frames))
    print(f"measured here: {describe(noise)}")
    print(f"simulated races ({args.sims} each, min_rounds 3, max_rounds {args.max_rounds}, tolerance 2%):")
    simulations(noise, args.sims, args.max_rounds)
    print(f"rows: {out}")


if __name__ == "__main__":
    main()
