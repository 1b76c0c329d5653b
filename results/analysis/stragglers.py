"""Which rank is the straggler: each device's compute against the other ranks of the same measurements.

Every distributed row carries each rank's compute (forward + backward of a micro-batch under `no_sync`,
`trainers.perrank.PROBES` probes, taken by every rank at once) and wait, with its host, local rank and device.
Per row and rank, each probe's compute over the other ranks' median at the same probe, and the mean log of those
ratios; a device's figures over every row of a sweep that it measured (every cell, every repeat) give its ratio:
their geometric mean with a t interval on the log scale.

A device is a straggler when that interval lies wholly above 1 + MIN_REL: slower than its peers beyond the noise
of its own measurements, and by at least what a user would act on. It takes MIN_ROWS measurements of the device:
one measurement's probes share its moment, so a transient (another process on that rank's core for a second)
reads as a steady excess (A/A, one measurement of a 2-rank tiny cell: 1.47x [1.15, 1.88] over its probes).
Ranks that share a node's cores measure apart without any fault, and steadily through a sweep
(benchmarks/straggler_check.py, A/A: one rank of one sweep at 1.087x [1.03, 1.15] with no plant); MIN_REL keeps
that from being named. What a straggler costs the step is the others' wait beyond its own: they wait out its
slower backward at every step.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from results.analysis.uncertainty import _Z975, t_factor

MIN_REL = 0.10
"""The least excess compute (10%) named a straggler, whatever the interval: GPUs of one model differ by about 8% on
average (Sinha et al., SC22), the outliers worth naming by far more; two ranks sharing a CPU node's cores differed
by up to 9% through one sweep with no fault."""
DEVICE = ["sweep_id", "cluster", "host", "device", "local_rank"]
RESULT = ["rows", "compute_ms", "others_ms", "ratio", "ratio_lo", "ratio_hi", "cost_ms", "cost_rel", "planted"]
RESULT += ["straggler"]
MIN_ROWS = 3
"""The fewest measurements of a device that can name it: below, its interval is over the probes, shown, never a
verdict."""


LINE = [*DEVICE, "step_ms", "compute_ms", "others_ms", "log_ratio", "probe_logs", "cost_ms", "plant"]


def rank_lines(rows: pd.DataFrame) -> pd.DataFrame:
    """One line per (ok distributed row, rank): its device, median compute, the other ranks' median compute, the
    log ratio of the two (the mean over the probes, each probe paired with the others' at the same time), and
    the others' median wait beyond its own (ms per step)."""
    need = {"rank_compute_ms", "rank_wait_ms", "rank_hosts", "rank_devices", "rank_local_ranks"}
    if not need <= set(rows.columns):
        return pd.DataFrame(columns=LINE)
    ok = rows[(rows["status"] == "ok") & rows["rank_compute_ms"].notna() & rows["rank_hosts"].notna()]
    return pd.DataFrame([line for _, row in ok.iterrows() for line in _row_lines(row)], columns=LINE)


def _row_lines(row: pd.Series) -> list[list]:
    compute = np.array([list(s) for s in row["rank_compute_ms"]], dtype=float)  # (ranks, probes) ms
    given = row["rank_wait_ms"]  # none on compiled cells (trainers.perrank)
    wait = np.full(len(compute), np.nan) if given is None else np.asarray(given, dtype=float)  # (ranks,) ms
    if compute.ndim != 2 or len(compute) < 2 or len(row["rank_hosts"]) != len(compute) or compute.min() <= 0:
        return []
    planted = row.get("injected_slowdown_rank")
    lines = []
    for r in range(len(compute)):
        others = np.delete(compute, r, axis=0)
        logs = np.log(compute[r] / np.median(others, axis=0))  # (probes,) paired in time
        where = [row["sweep_id"], row["cluster"], row["rank_hosts"][r], row["rank_devices"][r]]
        where.append(int(row["rank_local_ranks"][r]))
        figures = [row["step_ms"], float(np.median(compute[r])), float(np.median(others)), float(logs.mean())]
        cost = float(np.median(np.delete(wait, r))) - float(wait[r])
        lines.append([*where, *figures, logs.tolist(), cost, _planted_here(planted, r)])
    return lines


def _planted_here(planted: object, rank: int) -> bool:
    return planted is not None and not pd.isna(planted) and int(planted) == rank


def stragglers(rows: pd.DataFrame) -> pd.DataFrame:
    """One line per device and sweep: its compute against its peers' (ratio with its 95% interval), what it costs
    the others per step, and `straggler` where the interval lies wholly above 1 + MIN_REL; stragglers first."""
    lines = rank_lines(rows)
    if lines.empty:
        return pd.DataFrame(columns=[*DEVICE, *RESULT])
    out = lines.groupby(DEVICE, sort=True, dropna=False).apply(_device, include_groups=False).reset_index()
    return out.sort_values(["straggler", "ratio"], ascending=[False, False], ignore_index=True)[[*DEVICE, *RESULT]]


def _interval(logs: np.ndarray) -> tuple[float, float, float]:
    """(mean, lo, hi) of the log ratios: a t interval (95%)."""
    n, mean = len(logs), float(logs.mean())
    half = _Z975 * t_factor(n) * float(logs.std(ddof=1)) / math.sqrt(n) if n > 1 else math.inf
    return mean, mean - half, mean + half


def _device(lines: pd.DataFrame) -> pd.Series:
    """A device's figures. The interval is over its measurements (rows: a cell's probes share its state); with
    fewer than MIN_ROWS rows, over the probes themselves, each paired with its peers' at the same moment, and
    then it names no straggler."""
    logs, enough = lines["log_ratio"].to_numpy(float), len(lines) >= MIN_ROWS
    if not enough:
        logs = np.concatenate([np.asarray(p, dtype=float) for p in lines["probe_logs"]])
    mean, lo, hi = _interval(logs)
    step, cost = float(lines["step_ms"].median()), float(lines["cost_ms"].median())
    figures = {"rows": len(lines), "compute_ms": float(lines["compute_ms"].median())}
    figures |= {"others_ms": float(lines["others_ms"].median())}
    figures |= {"ratio": math.exp(mean), "ratio_lo": math.exp(lo), "ratio_hi": math.exp(hi), "cost_ms": cost}
    figures |= {"cost_rel": cost / step if step > 0 else math.nan, "planted": bool(lines["plant"].any())}
    return pd.Series(figures | {"straggler": enough and bool(math.exp(lo) > 1 + MIN_REL)})


def named(line: pd.Series) -> str:
    """A straggler in words: where it is, how much slower, what it costs."""
    where = f"{line['host']} local rank {int(line['local_rank'])} ({line['device']})"
    slower = f"compute {line['ratio']:.2f}x its peers' [{line['ratio_lo']:.2f}, {line['ratio_hi']:.2f}]"
    cost = f"the others wait {line['cost_ms']:.1f} ms per step for it ({line['cost_rel']:.0%} of the step)"
    cost = cost if math.isfinite(line["cost_ms"]) else "its cost unmeasured (compiled cells)"
    plant = " [planted: DDPSWEEP_SLOWDOWN]" if line["planted"] else ""
    return f"{where}: {slower}; {cost}{plant}"


def summary_lines(rows: pd.DataFrame) -> list[str]:
    """What a summary says of stragglers: each one named, or that none is beyond the noise (with how many
    devices and measurements, and how many were measured too few times to judge), or that none could be named
    (every device measured fewer than MIN_ROWS times); nothing where the rows carry no per-rank figures."""
    table = stragglers(rows)
    if table.empty:
        return []
    found = table[table["straggler"]]
    if found.empty:
        most, few = table.iloc[0], int((table["rows"] < MIN_ROWS).sum())
        counted = f"{len(table)} device(s), {int(table['rows'].sum())} rank measurements"
        slowest = f"the slowest {most['ratio']:.2f}x its peers [{most['ratio_lo']:.2f}, {most['ratio_hi']:.2f}]"
        if few == len(table):
            return [
                f"stragglers: none named: every device was measured fewer than {MIN_ROWS} times ({counted}; "
                f"{slowest} over its probes; repeats: {MIN_ROWS} or more can name one)"
            ]
        unjudged = f"; {few} device(s) measured fewer than {MIN_ROWS} times not judged" if few else ""
        return [f"stragglers: none beyond the noise ({counted}; {slowest}, named from {1 + MIN_REL:.2f}x{unjudged})"]
    return [f"straggler: {named(line)}" for _, line in found.iterrows()]
