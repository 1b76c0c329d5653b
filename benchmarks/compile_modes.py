"""Compiled steps against eager on this machine: one real sweep on the embedded Ray (gloo, 2 workers, one
thread each, the tiny preset, Inductor), `compile: [false, true]` x `optimize_ddp` {ddp_optimizer,
python_reducer, no_optimization} x `bucket_cap_mb` {0.25, 1, 25}, in interleaved rounds. It prints

1. every DDP cell: its status (ok, or the error PyTorch raised), the median step with its 95% interval, and the
   step ratio compiled / eager at the same bucket with its interval (per-round ratios, round-blocked);
2. what compiling cost: compile_s in the first round (a fresh Inductor cache: cold, though a cell may find
   graphs an earlier cell of the round compiled) and in the later rounds (each cell compiles its own wrapper
   again; the cache holds its graphs), compiled_graphs by mode and bucket, recompiles_timed;
3. the all-reduce calls per step of every mode (counted by the profiler in an untimed step).

    python benchmarks/compile_modes.py [--rounds 3] [--backend inductor] [--out DIR]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from results import analysis  # noqa: E402
from results.analysis.uncertainty import interval  # noqa: E402
from results.storage.store import load  # noqa: E402

BUCKETS = [0.25, 1.0, 25.0]
MODES = ["ddp_optimizer", "python_reducer", "no_optimization"]


def spec(rounds: int, backend: str) -> dict:
    return {
        "name": "compile-modes",
        "model": "tiny",
        "micro_batch": 8,
        "seq_len": 64,
        "warmup_steps": 3,
        "timed_steps": 20,
        "workers": [2],
        "backend": "gloo",
        "use_gpu": False,
        "bucket_cap_mb": BUCKETS,
        "compile": [False, True],
        "optimize_ddp": MODES,
        "compile_backend": backend,
        "repeats": rounds,
        "cell_timeout_s": 900,
    }


def run(out: Path, rounds: int, backend: str) -> tuple[pd.DataFrame, float]:
    path = out / "compile.yaml"
    path.write_text(yaml.safe_dump(spec(rounds, backend)))
    cmd = [sys.executable, "-m", "service.cli", "run", str(path), "--results", str(out), "--sweep", "compile"]
    t0 = time.perf_counter()
    cache = out / "inductor-cache"  # a fresh Inductor cache: round 0 compiles cold, later rounds find its graphs
    env = os.environ | {"TORCHINDUCTOR_CACHE_DIR": str(cache)}
    subprocess.run(cmd, cwd=ROOT, env=env, check=True, capture_output=True)
    return load(str(out)), time.perf_counter() - t0


def label(r: pd.Series) -> str:
    return "eager" if not r["compile"] else str(r["optimize_ddp"])


def cells_table(rows: pd.DataFrame) -> pd.DataFrame:
    """Per DDP cell: status, median step [95%], and compiled / eager at the same bucket [95%]."""
    ddp = rows[rows["mode"] == "ddp"].copy()
    ddp["config"] = ddp.apply(label, axis=1)
    ok = analysis.ok_cells(rows)
    ok = ok[ok["mode"] == "ddp"].copy()
    ok["config"] = ok.apply(label, axis=1)
    out = []
    for (config, bucket), grp in ddp.groupby(["config", "bucket_cap_mb"], sort=False):
        line = {"config": config, "bucket_cap_mb": bucket, "status": ", ".join(sorted(set(grp["status"])))}
        cell = ok[(ok["config"] == config) & (ok["bucket_cap_mb"] == bucket)]
        if cell.empty:
            line["error"] = grp["error"].dropna().iloc[0].split("\n")[0][:90]
        else:
            c = cell.iloc[0]
            line |= {"step_ms": c["step_ms"], "ci": f"[{c['step_ms_ci_lo']:.1f}, {c['step_ms_ci_hi']:.1f}]"}
            line |= ratio_to_eager(ddp, config, bucket)
        out.append(line)
    order = {c: i for i, c in enumerate(["eager", *MODES])}
    table = pd.DataFrame(out)
    return table.sort_values(["config", "bucket_cap_mb"], key=lambda c: c.map(order) if c.name == "config" else c)


def ratio_to_eager(ddp: pd.DataFrame, config: str, bucket: float) -> dict:
    """compiled / eager step at one bucket: the median of per-round ratios and its round-blocked 95% interval."""
    if config == "eager":
        return {}
    per_round = []
    for _, rnd in ddp[(ddp["bucket_cap_mb"] == bucket) & (ddp["status"] == "ok")].groupby("round"):
        mine, eager = rnd[rnd["config"] == config], rnd[rnd["config"] == "eager"]
        if len(mine) and len(eager):
            per_round.append(mine["step_ms"].iloc[0] / eager["step_ms"].iloc[0])
    if not per_round:
        return {}
    lo, hi = interval(np.asarray(per_round) - 1)
    return {"compiled/eager": float(np.median(per_round)), "ratio_ci": f"[{1 + lo:.2f}, {1 + hi:.2f}]"}


def compile_table(rows: pd.DataFrame) -> pd.DataFrame:
    done = rows[(rows["status"] == "ok") & rows["compile"].astype(bool)].copy()
    done["config"] = done.apply(lambda r: "single" if r["mode"] == "single" else f"{r['mode']}/{label(r)}", axis=1)
    first = done[done["round"] == 0].groupby(["config", "bucket_cap_mb"], dropna=False)["compile_s"].median()
    later = done[done["round"] > 0].groupby(["config", "bucket_cap_mb"], dropna=False)["compile_s"].median()
    graphs = done.groupby(["config", "bucket_cap_mb"], dropna=False)["compiled_graphs"].agg(lambda v: sorted(set(v)))
    recompiles = done.groupby(["config", "bucket_cap_mb"], dropna=False)["recompiles_timed"].max()
    return pd.DataFrame(
        {"compile_s_round0": first, "compile_s_later": later, "graphs": graphs, "recompiles_timed": recompiles}
    )


def collectives_table(rows: pd.DataFrame) -> pd.DataFrame:
    ddp = rows[(rows["mode"] == "ddp") & (rows["status"] == "ok")].copy()
    ddp["config"] = ddp.apply(label, axis=1)
    return ddp.pivot_table(index="config", columns="bucket_cap_mb", values="collectives_per_step", aggfunc="median")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--backend", default="inductor", choices=["inductor", "aot_eager"])
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="compile-modes-"))
    out.mkdir(parents=True, exist_ok=True)
    rows, wall = run(out, args.rounds, args.backend)
    pd.set_option("display.width", 200)
    pd.set_option("display.max_columns", 20)
    print(f"sweep: {len(rows)} measurements in {wall:.0f} s, backend {args.backend}, store {out}")
    threads = sorted(set(rows["num_threads"].dropna().astype(int)))
    print(f"threads per rank: {threads}, torch {rows['torch_version'].iloc[0]}")
    print("\n1. DDP cells (step ms, median over rounds [95%]; compiled / eager at the same bucket [95%])")
    print(cells_table(rows).to_string(index=False, float_format=lambda v: f"{v:.3g}"))
    print("\n2. compiling (s; graphs the backend compiled; frames compiled inside timed steps)")
    print(compile_table(rows).to_string(float_format=lambda v: f"{v:.2f}"))
    print("\n3. all-reduce calls per step (profiler, one untimed step)")
    print(collectives_table(rows).to_string(float_format=lambda v: f"{v:.0f}"))


if __name__ == "__main__":
    main()
