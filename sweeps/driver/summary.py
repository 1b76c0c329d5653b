"""Human-readable text: the dry-run grid, progress lines and the end-of-sweep summary (every figure with its
95% interval)."""

from __future__ import annotations

import dataclasses

import pandas as pd

from results.analysis import cells as analysis
from results.analysis import identity, racing, stragglers
from results.analysis.uncertainty import rel_width
from results.knobs import KNOBS, at_default, show
from sweeps.plan.grid import Cell

WIDE_REL = 0.04  # an interval wider than ±2% of its median is listed as noisy


# One line per curve: everything but the bucket fixed (results.analysis.identity.CURVE_KEYS within one sweep)
LINE_KEYS = [k for k in identity.CURVE_KEYS if k not in ("cluster", "sweep_id")]
# What a progress line and the dry-run table show in columns of their own; any other knob set away from its
# default is named after them (`comm_hook=fp16 timing=loop …`)
OWN_COLUMNS = {"model", "workload", "workload_args", "workload_fingerprint", "mode", "micro_batch", "seq_len"}
OWN_COLUMNS |= {"gas", "no_sync", "bucket_cap_mb", "gradient_as_bucket_view", "world_size", "num_nodes", "backend"}
OWN_COLUMNS |= {"timed_steps", "target_rel_ci", "max_timed_steps", "max_cell_s", "warmup_steps", "seed"}


def set_knobs(values: dict, skip: set[str] = OWN_COLUMNS) -> str:
    """`k=v` for every knob (beyond `skip`) whose value is not its default (or off) (trainers.knobs), or ""."""
    return " ".join(
        f"{k.name}={show(values[k.name])}"
        for k in KNOBS
        if k.name not in skip and k.name in values and not at_default(k, values[k.name])
    )


def progress_line(row: dict, done: int, total: int) -> str:
    bucket = "-" if row.get("bucket_cap_mb") is None else f"{row['bucket_cap_mb']:g}"
    what = (
        f"{row['mode']:<6} w={row['world_size']} bucket={bucket:<5} gas={row['gas']} "
        f"no_sync={str(row['no_sync']).lower():<5} r={row.get('round', 0)}"
    )
    knobs = set_knobs(row)
    what += f" {knobs}" if knobs else ""
    if row["status"] == "ok":
        tokens = row.get("tokens_per_s")  # None for a workload without tokens_per_sample: samples/s then
        rate = f"{tokens / 1e3:8.1f} ktok/s" if tokens is not None else f"{row['samples_per_s']:8.1f} samples/s"
        result = f"{row['step_ms']:8.2f} ms  {rate}  ok"
        if row.get("grad_check") == "failed":
            result += f"  gradient check FAILED: error {row['grad_rel_error']:.1e} > {row['grad_tol']:.1e}"
    else:
        result = f"ERROR {row['error'].splitlines()[0][:160] if row['error'] else ''}"
    return f"[{done}/{total}] {row['cell_id']} {what} {result}"


def _ms(v: float, lo: float, hi: float) -> str:
    return f"{v:.1f}" if pd.isna(lo) else f"{v:.1f} [{lo:.1f}, {hi:.1f}]"


def _curve_line(grp: pd.DataFrame, best: pd.Series, same: list[float]) -> str:
    curve = "  ".join(
        f"{b:g}MB:{_ms(s, lo, hi)}" if pd.notna(b) else _ms(s, lo, hi)
        for b, s, lo, hi in zip(
            grp["bucket_cap_mb"], grp["step_ms"], grp["step_ms_ci_lo"], grp["step_ms_ci_hi"], strict=True
        )
    )
    if pd.isna(best["bucket_cap_mb"]):
        bucket = "no buckets"
    elif len(grp) == 1:
        bucket = f"best bucket {best['bucket_cap_mb']:g} MB (the only one measured)"
    elif len(same) > 1:
        bucket = f"best bucket {best['bucket_cap_mb']:g} MB, indistinguishable: {', '.join(f'{b:g}' for b in same)} MB"
    else:
        bucket = f"best bucket {best['bucket_cap_mb']:g} MB (distinguishable from every other)"
    eff = "n/a (no baseline)"
    if pd.notna(best["efficiency"]):
        lo, hi = best["efficiency_ci_lo"], best["efficiency_ci_hi"]
        eff = f"{best['efficiency']:.1%}" + ("" if pd.isna(lo) else f" [{lo:.1%}, {hi:.1%}]")
    return f"step ms {curve} | {bucket}; efficiency {eff} (baseline {best['baseline_step_ms']:.1f} ms)" + _resolves(
        grp, best
    )


def _resolves(grp: pd.DataFrame, best: pd.Series) -> str:
    """What the curve's measurements can tell apart, and what 2% would take."""
    res = analysis.resolution(grp, best)
    if pd.isna(res["min_resolvable_rel"]):
        return ""
    need = res["rounds_for_target"]
    more = "more than " if need >= analysis.MAX_ROUNDS_SHOWN else ""
    return (
        f"; min_resolvable_rel {res['min_resolvable_rel']:.1%} (smaller differences cannot be told apart; "
        f"{analysis.TARGET_REL:.0%} would take {more}{need} rounds)"
    )


def _where(curve: dict, table: pd.DataFrame) -> str:
    """`ddp workers=2 gas=1 no_sync=false`, plus the topology, timing and DDP knobs where they vary or are set."""
    w, n = curve["world_size"], curve["num_nodes"]
    out = f"{curve['mode']} workers={w}"
    out += f" topology={n}x{w // n}" if n > 1 or table["num_nodes"].nunique() > 1 else ""
    out += f" timing={curve['timing']}" if set(table["timing"]) != {"sync"} else ""
    out += f" gas={curve['gas']} no_sync={str(bool(curve['no_sync'])).lower()}"
    shown = {"mode", "world_size", "num_nodes", "timing", "gas", "no_sync"}
    varies = set(identity.varying(table))
    extra = [
        k.name
        for k in KNOBS
        if k.name in curve and k.name not in shown
        if k.name in varies or (k.name not in OWN_COLUMNS and not at_default(k, curve[k.name]))
    ]
    return out + "".join(f" {k}={show(curve[k])}" for k in extra)


def summary_text(rows: pd.DataFrame) -> str:
    """Per (workers, nodes, gas, no_sync): step_ms by bucket with intervals, the best bucket and the ones
    indistinguishable from it, efficiency vs the baseline; then any straggler rank and the cells whose interval
    is wide."""
    table = analysis.with_baseline(rows, keep_reps=True)
    if table.empty:
        return "\n".join(["no distributed cell measured ok", *stragglers.summary_lines(rows)])
    lines = ["step times: median ms [95% interval over repeats and steps]"]
    for key, grp in table.groupby(LINE_KEYS, dropna=False):
        grp = grp.sort_values("bucket_cap_mb")
        best = grp.loc[grp["step_ms"].idxmin()]
        same = analysis.indistinguishable(grp, best) if pd.notna(best["bucket_cap_mb"]) else []
        lines.append(_where(dict(zip(LINE_KEYS, key, strict=True)), table) + ": " + _curve_line(grp, best, same))
    cells = analysis.ok_cells(rows)  # once: the check and noise lines read the same configurations
    lines += _decision_lines(rows) + stragglers.summary_lines(rows)
    return "\n".join(lines + _flag_lines(rows, cells) + _noise_lines(cells))


def _decision_lines(rows: pd.DataFrame) -> list[str]:
    """What the race dropped, and whether each automatic-rounds curve was resolved or ran out of budget."""
    ok = rows[rows["status"] == "ok"]
    out = []
    if "search" in ok and (ok["search"] == "race").any():
        race = ok[ok["search"] == "race"]
        dropped = race[~analysis.failed_check(race)].dropna(subset=["eliminated_at_round"]).drop_duplicates("cell_id")
        names = ", ".join(f"{_cell(r)} after round {int(r.eliminated_at_round) + 1}" for r in dropped.itertuples())
        out.append(
            f"race: {len(dropped)} of {race['cell_id'].nunique()} cell(s) dropped as slower than their curve's "
            f"leader{': ' + names if names else ''}; {len(race)} measurements"
        )
    if "target_rel" not in ok or ok["target_rel"].isna().all():
        return out
    auto = ok[ok["target_rel"].notna()]
    alive = auto[~auto["cell_id"].isin(auto.dropna(subset=["eliminated_at_round"])["cell_id"])]
    groups = alive[alive["mode"] != "single"].groupby("group_id")
    for curve in (c for _, grp in groups for c in racing.curves(grp)):
        rule = racing.Rule(auto=True, target_rel=float(curve["target_rel"].iloc[0]))
        first = curve.iloc[0]
        what = f"workers={first['world_size']} gas={first['gas']} no_sync={str(bool(first['no_sync'])).lower()}"
        rounds = int(curve["round"].max()) + 1
        if racing.resolved(curve, rule):
            out.append(f"rounds auto, {what}: resolved after {rounds} rounds (target ±{rule.target_rel:.0%})")
        else:
            out.append(f"rounds auto, {what}: not resolved after {rounds} rounds (max_rounds or max_sweep_s ended it)")
    return out


def _cell(r) -> str:
    bucket = f" bucket={r.bucket_cap_mb:g}" if pd.notna(r.bucket_cap_mb) else ""
    out = f"{r.mode} {r.num_nodes}x{r.world_size // r.num_nodes}{bucket} gas={r.gas}"
    out += " no_sync=true" if r.no_sync else ""
    knobs = set_knobs(r._asdict())
    return out + (f" {knobs}" if knobs else "")


def _flag_lines(rows: pd.DataFrame, cells: pd.DataFrame) -> list[str]:
    out = []
    drifted, noisy = analysis.drifted_rounds(rows), analysis.noisy_rows(rows)
    if drifted.any():
        rounds = sorted(
            {(g, r) for g, r in zip(rows.loc[drifted, "group_id"], rows.loc[drifted, "round"], strict=True)}
        )
        out.append(
            f"drift: {int(drifted.sum())} measurement(s) in {len(rounds)} round(s) whose control moved "
            f"beyond its noise (kept: comparisons within a group are round-blocked): {rounds}"
        )
    out += _check_lines(rows, cells)
    slowed = analysis.planted(rows)
    if slowed.any():
        names = ", ".join(analysis.PLANTS.values())
        out.append(f"planted: {int(slowed.sum())} measurement(s) under a benchmark's plant ({names}) left out")
    insync = rows["replicas_in_sync"] == False  # noqa: E712
    if insync.any():
        out.append(f"replicas out of sync: {int(insync.sum())} measurement(s) left out of the figures above")
    if noisy.any():
        names = ", ".join(f"{r.cell_id} r{r.repeat}" for r in rows[noisy].itertuples())
        out.append(f"warning: {int(noisy.sum())} measurement(s) with a CV far above their group's: {names}")
    return out


def _check_lines(rows: pd.DataFrame, cells: pd.DataFrame) -> list[str]:
    """The gradient check: each configuration that failed it (left out of every figure above, with its error),
    and the error of each compressing configuration."""
    out = []
    for r in analysis.failed_configurations(rows).itertuples():
        out.append(
            f"gradient check FAILED: {_cell(r)} in {r.failed} of {r.measured} measurement(s), error "
            f"{r.grad_rel_error:.2e} > tolerance {r.grad_tol:.2e}: its sum is wrong (left out above)"
        )
    for r in cells[cells["grad_check"] == "approximate"].itertuples():
        out.append(
            f"gradient check approximate: {_cell(r)}: error {r.grad_rel_error:.1e} "
            f"[{r.grad_rel_error_min:.1e}, {r.grad_rel_error_max:.1e}] over {r.grad_checks} check(s)"
        )
    return out


def _noise_lines(cells: pd.DataFrame) -> list[str]:
    width = [
        rel_width(lo, hi, m)
        for lo, hi, m in zip(cells["step_ms_ci_lo"], cells["step_ms_ci_hi"], cells["step_ms"], strict=True)
    ]
    wide = cells[[w > WIDE_REL for w in width]]
    out = []
    if (cells["n_repeats"] < 2).any():
        out.append(
            "note: cells measured in one round have intervals over one run's steps, which leave out how runs "
            "differ: one round tells no configuration apart (repeats: 3 or more can)"
        )
    if wide.empty:
        return out
    names = ", ".join(_cell(r) for r in wide.itertuples())
    return [*out, f"noisy: {len(wide)} cell(s) with an interval wider than ±{WIDE_REL / 2:.0%}: {names}"]


def cells_table(cells: list[Cell], repeats: int = 1, isolation: str = "group") -> str:
    """The grid as a plain-text table (for --dry-run); a `knobs` column where any cell sets a knob beyond
    bucket, gas and no_sync (hook, first bucket, DDP flags, timing, environment)."""
    head = ["cell_id", "mode", "topology", "workers", "bucket_mb", "gas", "no_sync", "grad_view", "model", "batch"]
    rows = []
    for c in cells:
        s = c.step
        rows.append(
            [
                c.cell_id,
                s.mode,
                c.topology,
                str(c.world_size),
                "-" if s.bucket_cap_mb is None else f"{s.bucket_cap_mb:g}",
                str(s.gas),
                str(s.no_sync).lower(),
                "-" if s.gradient_as_bucket_view is None else str(s.gradient_as_bucket_view).lower(),
                s.model,
                f"{s.micro_batch}" if s.workload else f"{s.micro_batch}x{s.seq_len}",
                _knobs(c),
            ]
        )
    rows = [head + ["knobs"], *rows] if any(r[-1] for r in rows) else [head, *(r[:-1] for r in rows)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    keys = {"group": {c.group_key for c in cells}, "sweep": {c.sweep_key for c in cells}}
    groups = len(keys[isolation]) if isolation in keys else len(cells) * repeats
    lines.append(
        f"{len(cells)} cells x {repeats} repeat(s) = {len(cells) * repeats} measurements in {groups} worker group(s)"
    )
    return "\n".join(lines)


def _knobs(cell: Cell) -> str:
    """The cell's knobs that differ from their defaults, beyond the table's own columns: `comm_hook=fp16 …`."""
    return set_knobs(dataclasses.asdict(cell.step) | {"env_grid": cell.env_grid})
