"""`ddpsweep recommend`: per curve, the best measured DDP configuration, its gain over PyTorch's defaults with
its interval, what cannot be told apart from it, and the code to paste.

A curve is one workload at one placement and one gradient-accumulation depth (cluster, sweep, workload,
micro-batch, world size, nodes, gas): there the knobs a user chooses are the DDP wrapper's (`bucket_cap_mb`,
`gradient_as_bucket_view`) and the `no_sync()` pattern. The verdict is only as strong as the intervals:
the best is recommended over the defaults only when the 95% interval of default/best excludes 1; otherwise
one plain sentence says the sweep cannot separate them, and the defaults stay.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from results.analysis import cells as analysis
from results.analysis import identity, stragglers
from results.analysis.paste import snippet
from results.analysis.uncertainty import interval
from results.values import json_safe, number, plain

DEFAULTS = identity.PYTORCH_DEFAULTS  # PyTorch's own value of every knob a user chooses (trainers.knobs)
TRIO = ("bucket_cap_mb", "gradient_as_bucket_view", "no_sync")  # the knobs the default cell is looked up by
# One curve: the configuration less the knobs a user chooses (those are what recommend chooses among)
CURVE = [k for k in identity.CONFIG_KEYS if k not in DEFAULTS]
MIN_ROUNDS = 3  # a round-blocked interval over 2 rounds is widened t(1)/z = 6.5x: too wide to decide anything


@dataclass(frozen=True)
class Verdict:
    """What recommend says of a curve: the sentence, and the configuration it recommends."""

    text: str
    recommended: dict


def recommend(rows: pd.DataFrame) -> list[dict]:
    """One recommendation per curve that has DDP cells with ok rows (see the module docstring)."""
    cells = analysis.ok_cells(rows)
    ddp = cells[(cells["mode"] == "ddp") & cells["bucket_cap_mb"].notna()]
    envs, failed, slow = _envs(rows), analysis.failed_configurations(rows), _stragglers(rows)
    out = []
    for key, grp in ddp.groupby(CURVE, dropna=False):
        curve = dict(zip(CURVE, key, strict=True))
        where = (curve["cluster"], curve["sweep_id"])
        rec = _curve(curve, grp, envs.get(where, {}))
        out.append(rec | {"excluded": _excluded(curve, failed), "stragglers": slow.get(where, [])})
    return out


def _stragglers(rows: pd.DataFrame) -> dict[tuple[str, str], list[dict]]:
    """(cluster, sweep) -> its straggler devices (results.analysis.stragglers), each with its words."""
    table = stragglers.stragglers(rows)
    out: dict[tuple[str, str], list[dict]] = {}
    for _, line in table[table["straggler"]].iterrows():
        found = {k: plain(line[k]) for k in ("host", "device", "local_rank", "ratio", "ratio_lo", "ratio_hi")}
        found |= {"cost_ms": plain(line["cost_ms"]), "text": stragglers.named(line)}
        out.setdefault((line["cluster"], line["sweep_id"]), []).append(found)
    return out


def _excluded(curve: dict, failed: pd.DataFrame) -> list[dict]:
    """The curve's configurations left out because their gradient check failed, each with why."""
    mine = failed
    for k, v in curve.items():
        mine = mine[mine[k].isna()] if pd.isna(v) else mine[mine[k] == v]
    return [
        _config(r)
        | {
            "reason": (
                f"failed the gradient check in {int(r['failed'])} of {int(r['measured'])} measurement(s): "
                f"error {r['grad_rel_error']:.2e} against a tolerance of {r['grad_tol']:.2e} for an exact "
                "configuration (its sum is wrong, whatever its speed)"
            )
        }
        for _, r in mine.iterrows()
    ]


def numerics(r: pd.Series) -> dict:
    """A configuration's gradient check over the sweep: verdict, median relative error and its range."""
    if pd.isna(r.get("grad_check")):
        return {"grad_check": None}
    return {
        "grad_check": str(r["grad_check"]),
        "grad_rel_error": number(r.get("grad_rel_error")),
        "grad_rel_error_range": [number(r.get("grad_rel_error_min")), number(r.get("grad_rel_error_max"))],
        "grad_checks": int(r.get("grad_checks", 0)),
    }


def _curve(curve: dict, grp: pd.DataFrame, env: dict[str, str]) -> dict:
    grp = grp.reset_index(drop=True)
    best = grp.loc[grp["step_ms"].idxmin()]
    default, default_note = _default_cell(_at_default_knobs(grp))
    out = {k: plain(v) for k, v in curve.items()} | {
        "topology": f"{int(curve['num_nodes'])}x{int(curve['world_size']) // int(curve['num_nodes'])}",
        "cells": len(grp),
        "n_repeats": int(grp["n_repeats"].min()),
        "best": _config(best) | _timing(best) | {"numerics": numerics(best)},
        "indistinguishable": [_config(r) for _, r in grp.iterrows() if analysis.same_as(r, best)],
        "default": None if default is None else _config(default) | _timing(default) | {"numerics": numerics(default)},
        "default_note": default_note,
    }
    out |= _gain(best, default) | _resolution(grp, best) | _compiled_defaults(grp, best)
    verdict = _exact_unless_separated(_verdict(out, best, default), out, grp, best)
    if default is not None and out["n_repeats"] < MIN_ROUNDS:
        verdict = _too_few_rounds(out, best, default)
    out["verdict"], out["recommended"] = verdict.text, verdict.recommended
    out["changes_numerics"] = out["recommended"]["comm_hook"] != "none"
    out["recommended_numerics"] = numerics(_row_of(grp, verdict.recommended))
    out["gradient_check"] = check_text(out)
    env = env | json.loads(out["recommended"]["env_grid"])
    out["snippet"] = snippet(out["recommended"], int(curve["gas"]), env, cuda=curve.get("device_type") == "cuda")
    return out


def _compiled_defaults(grp: pd.DataFrame, best: pd.Series) -> dict:
    """Where the curve has compiled cells: PyTorch's defaults compiled (ddp_optimizer) and the best's gain over
    them with its interval, beside the gain over the eager defaults."""
    if not grp["compile"].astype(bool).any():
        return {}
    cell, note = _default_cell(_at_default_knobs(grp, compile=True))
    gain = _gain(best, cell)
    return {
        "compiled_default": None if cell is None else _config(cell) | _timing(cell),
        "compiled_default_note": note.replace("PyTorch's defaults", "PyTorch's defaults compiled", 1),
        "gain_over_compiled": gain,
    }


def _too_few_rounds(out: dict, best: pd.Series, default: pd.Series) -> Verdict:
    """One or two rounds: the interval between rounds means nothing yet; say how many to run, print no interval."""
    out.update(gain_ci_lo=None, gain_ci_hi=None, min_resolvable_rel=None, rounds_for_target=None)
    rounds = "1 round is" if out["n_repeats"] == 1 else f"{out['n_repeats']} rounds are"
    text = (
        f"{rounds} too few to tell configurations apart (an interval between rounds needs "
        f"at least {MIN_ROUNDS}): run repeats: {MIN_ROUNDS} or more; the defaults stay until then "
        f"(best measured so far: {describe(_config(best))})"
    )
    return Verdict(text, _config(default))


def _at_default_knobs(grp: pd.DataFrame, **given: object) -> pd.DataFrame:
    """The cells whose chosen knobs other than bucket, bucket view and no_sync are PyTorch's defaults (or read
    null: they do not apply, e.g. optimize_ddp in an eager cell), those in `given` at the values given."""
    keep = pd.Series(True, index=grp.index)
    for k in identity.CHOSEN:
        if k.name in TRIO:
            continue
        v = given.get(k.name, k.pytorch)
        off = grp[k.name].isna() if k.applies is not None and k.value_off is None else False
        keep &= grp[k.name].isna() if v is None else (grp[k.name] == v) | off
    return grp[keep]


def _exact_unless_separated(verdict: Verdict, out: dict, grp: pd.DataFrame, best: pd.Series) -> Verdict:
    """A compressing hook changes the numerics: it is recommended only when its interval is clear of the best
    exact configuration's; otherwise the exact one is, and the verdict says why."""
    chosen = verdict.recommended
    if chosen["comm_hook"] == "none":
        return verdict
    exact = grp[grp["comm_hook"] == "none"]
    lossy = f"{describe(chosen)} compresses gradients ({_compression(chosen)}) and changes the numerics"
    lossy += _error_text(numerics(_row_of(grp, chosen)))
    if exact.empty:
        return Verdict(f"{verdict.text}; note: {lossy} (the sweep measured no exact configuration)", chosen)
    best_exact = exact.loc[exact["step_ms"].idxmin()]
    if analysis.same_as(best_exact, best):
        why = f"the best measured, {lossy}, and cannot be told apart from the best exact one"
        return Verdict(f"use {describe(_config(best_exact))}: {why}", _config(best_exact))
    return Verdict(f"{verdict.text}; note: {lossy}: check convergence before adopting it", chosen)


def _row_of(grp: pd.DataFrame, cfg: dict) -> pd.Series:
    """The curve's line of the configuration `cfg` (knobs as _config gives them)."""
    return next(r for _, r in grp.iterrows() if _config(r) == cfg)


def _error_text(n: dict) -> str:
    """` (gradient error 3.1e-04 [2.9e-04, 3.3e-04] over 3 checks)`: median and range over its checks (one check has no
    range), or that it was not measured."""
    if n.get("grad_rel_error") is None:
        return " (its gradient error was not measured)"
    if n["grad_checks"] == 1:
        return f" (gradient error {n['grad_rel_error']:.1e}, one check)"
    lo, hi = n["grad_rel_error_range"]
    return f" (gradient error {n['grad_rel_error']:.1e} [{lo:.1e}, {hi:.1e}] over {n['grad_checks']} checks)"


def _compression(cfg: dict) -> str:
    return f"powersgd rank {cfg['powersgd_rank']}" if cfg["comm_hook"] == "powersgd" else cfg["comm_hook"]


def _default_cell(grp: pd.DataFrame) -> tuple[pd.Series | None, str]:
    """PyTorch's defaults if the sweep measured them; else the closest cell (bucket 25 MB, no_sync off), and
    a note saying which default it differs in; else None."""
    match = grp[(grp["bucket_cap_mb"] == DEFAULTS["bucket_cap_mb"]) & ~grp["no_sync"].astype(bool)]
    exact = match[match["gradient_as_bucket_view"] == DEFAULTS["gradient_as_bucket_view"]]
    if not exact.empty:
        return exact.iloc[0], "PyTorch's defaults (bucket_cap_mb=25, gradient_as_bucket_view=False, no no_sync)"
    if not match.empty:
        return match.iloc[0], (
            "closest measured to PyTorch's defaults: bucket_cap_mb=25 and no no_sync, but "
            "gradient_as_bucket_view=True (the sweep did not measure False)"
        )
    return None, "the sweep did not measure PyTorch's defaults (bucket_cap_mb=25 without no_sync): no gain is given"


def _gain(best: pd.Series, default: pd.Series | None) -> dict:
    """Throughput gain of best over default (default step / best step - 1) with its 95% interval."""
    if default is None:
        return {"gain": None, "gain_ci_lo": None, "gain_ci_hi": None}
    ratio = np.asarray(default["step_ms_reps"], dtype=float) / np.asarray(best["step_ms_reps"], dtype=float)
    lo, hi = interval(ratio - 1)
    return {"gain": default["step_ms"] / best["step_ms"] - 1, "gain_ci_lo": number(lo), "gain_ci_hi": number(hi)}


def _verdict(out: dict, best: pd.Series, default: pd.Series | None) -> Verdict:
    cfg, g = _config(best), out
    if default is None:
        return Verdict(f"best measured: {describe(cfg)}; the sweep has no default cell to compare it with", cfg)
    closest, exact = _config(default), out["default_note"].startswith("PyTorch")  # else another grad view, say
    keep = "keep the defaults" if exact else f"keep the cell closest to them ({describe(closest)})"
    if closest == cfg and exact:
        return Verdict("PyTorch's defaults are the best measured configuration: keep the defaults", cfg)
    if closest == cfg:
        text = f"the cell closest to PyTorch's defaults ({describe(cfg)}) is the best measured configuration: keep it"
        return Verdict(text, cfg)
    if g["gain_ci_lo"] is None or not g["gain_ci_lo"] > 0:
        shown = (
            ""
            if g["gain_ci_lo"] is None
            else f" (gain {_pct(g['gain'])} [{_pct(g['gain_ci_lo'])}, {_pct(g['gain_ci_hi'])}])"
        )
        text = (
            f"The intervals cannot separate the best configuration ({describe(cfg)}) from the defaults{shown}: "
            f"{keep}, or measure more rounds{_more_rounds(out)}"
        )
        return Verdict(text, closest)
    return Verdict(f"use {describe(cfg)}: {_gain_text(g)} throughput over the defaults", cfg)


def _resolution(grp: pd.DataFrame, best: pd.Series) -> dict:
    res = analysis.resolution(grp, best)
    return {"min_resolvable_rel": number(res["min_resolvable_rel"]), "rounds_for_target": res["rounds_for_target"]}


def _more_rounds(out: dict) -> str:
    if out["min_resolvable_rel"] is None:
        return ""
    target = f"{analysis.TARGET_REL:.0%}"
    return (
        f" (this sweep resolves differences of {out['min_resolvable_rel']:.1%} and more; "
        f"about {out['rounds_for_target']} rounds would resolve {target})"
    )


def _gain_text(g: dict) -> str:
    return f"{_pct(g['gain'])} [{_pct(g['gain_ci_lo'])}, {_pct(g['gain_ci_hi'])}]"


ENV_PREFIXES = ("NCCL_", "GLOO_", "TORCH_NCCL_")


def _envs(rows: pd.DataFrame) -> dict[tuple[str, str], dict[str, str]]:
    """Per (cluster, sweep): the communication variables in force on the workers, as the rows recorded them."""
    out: dict[tuple[str, str], dict[str, str]] = {}
    if "env" not in rows:
        return out
    for (cluster, sweep), grp in rows[rows["status"] == "ok"].groupby(["cluster", "sweep_id"]):
        try:
            env = json.loads(grp["env"].dropna().iloc[0]) if grp["env"].notna().any() else {}
        except (ValueError, TypeError):
            env = {}
        out[(cluster, sweep)] = {k: str(v) for k, v in env.items() if isinstance(k, str) and k.startswith(ENV_PREFIXES)}
    return out


def _config(r: pd.Series) -> dict:
    """The knobs a user chooses (results.analysis.identity.CHOSEN), as plain values."""
    return {k.name: _value(k.kind, r.get(k.name, k.pytorch)) for k in identity.CHOSEN}


def _value(kind: str, v: object) -> object:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return None
    casts = {"bool": bool, "int": int, "float": float}
    return casts.get(kind, str)(v)


def _timing(r: pd.Series) -> dict:
    """Step time and throughput with their 95% intervals (throughput bounds come from the step's)."""
    samples = float(r["samples_per_s"] * r["step_ms"] / 1e3)  # samples per step
    out = {
        "step_ms": float(r["step_ms"]),
        "step_ms_ci_lo": number(r["step_ms_ci_lo"]),
        "step_ms_ci_hi": number(r["step_ms_ci_hi"]),
    }
    out["samples_per_s"] = float(r["samples_per_s"])
    out["samples_per_s_ci_lo"] = number(samples / (r["step_ms_ci_hi"] / 1e3))
    out["samples_per_s_ci_hi"] = number(samples / (r["step_ms_ci_lo"] / 1e3))
    if pd.notna(r.get("tokens_per_s")):
        tokens = float(r["tokens_per_s"] * r["step_ms"] / 1e3)
        out |= {
            "tokens_per_s": float(r["tokens_per_s"]),
            "tokens_per_s_ci_lo": number(tokens / (r["step_ms_ci_hi"] / 1e3)),
            "tokens_per_s_ci_hi": number(tokens / (r["step_ms_ci_lo"] / 1e3)),
        }
    return out


SPELLED = {"bucket_cap_mb", "gradient_as_bucket_view", "no_sync", "comm_hook", "powersgd_rank", "first_bucket_mb"}
SPELLED |= {"env_grid", "powersgd_start_iter", "compile", "optimize_ddp", "compile_backend", "compile_mode"}
# the knobs describe words itself; every other one reads k=v


def describe(cfg: dict) -> str:
    sync = ", no_sync() on all but the last micro-step" if cfg["no_sync"] else ""
    text = f"bucket_cap_mb={cfg['bucket_cap_mb']:g}, gradient_as_bucket_view={cfg['gradient_as_bucket_view']}"
    extra = [f"{k}={cfg[k]}" for k, default in DEFAULTS.items() if k not in SPELLED and cfg[k] != default]
    if cfg["first_bucket_mb"] is not None:
        extra.append(f"first bucket {cfg['first_bucket_mb']:g} MB")
    if cfg["comm_hook"] != "none":
        extra.append(f"comm hook {_compression(cfg)}")
    if cfg.get("compile"):
        extra.append(f"torch.compile ({_compiled_as(cfg)})")
    if cfg["env_grid"] != "{}":
        extra.append(" ".join(f"{k}={v}" for k, v in json.loads(cfg["env_grid"]).items()))
    return text + "".join(f", {e}" for e in extra) + sync


def _compiled_as(cfg: dict) -> str:
    """`optimize_ddp ddp_optimizer` and the backend and mode where they are not torch's defaults."""
    parts = [f"optimize_ddp {cfg['optimize_ddp']}"] if cfg.get("optimize_ddp") else []
    parts += [] if cfg.get("compile_backend") in (None, "inductor") else [f"backend {cfg['compile_backend']}"]
    parts += [] if cfg.get("compile_mode") in (None, "default") else [f"mode {cfg['compile_mode']}"]
    return ", ".join(parts) or "defaults"


def _pct(x: float | None) -> str:
    return "?" if x is None else f"{x * 100:+.1f}%"


def to_json(recs: list[dict]) -> str:
    """Valid JSON: a number that is not finite is null (JSON has no NaN or Infinity)."""
    return json.dumps(json_safe(recs), indent=1, allow_nan=False)


def _others_text(r: dict) -> str:
    """The configurations the intervals cannot tell from the best, the best itself left out."""
    best = {k: r["best"][k] for k in r["indistinguishable"][0]} if r["indistinguishable"] else {}
    others = [describe(c) for c in r["indistinguishable"] if c != best]
    if others:
        return "; ".join(others)
    return "none (the only configuration measured)" if r["cells"] == 1 else "none: every other one is slower"


def to_text(recs: list[dict]) -> str:
    """The recommendations as a person reads them: one block per curve."""
    if not recs:
        return "no DDP cells with ok rows: nothing to recommend"
    blocks = []
    for r in recs:
        b = r["best"]
        head = f"{r['model']} on {r['cluster']} ({r['sweep_id']}), {r['topology']}, gas {r['gas']}:"
        timing = f"  best {b['step_ms']:.2f} ms [{_f(b['step_ms_ci_lo'])}, {_f(b['step_ms_ci_hi'])}]"
        timing += f", {b['samples_per_s']:.1f} samples/s"
        same = _others_text(r)
        lines = [head, f"  {r['verdict']}", timing, f"  compared with: {r['default_note']}"]
        if r.get("gain_over_compiled"):
            lines.append(f"  compiled: {_compiled_gain_text(r)}")
        lines += [
            f"  indistinguishable from the best: {same}",
            f"  gradient check: {r.get('gradient_check') or check_text(r)}",
        ]
        lines += [f"  left out: {describe(c)}: {c['reason']}" for c in r.get("excluded", [])]
        lines += [f"  straggler: {s['text']} (every step here waits for it)" for s in r.get("stragglers", [])]
        blocks.append("\n".join(lines + ["  " + line for line in r["snippet"].splitlines()]))
    return "\n\n".join(blocks)


def _compiled_gain_text(r: dict) -> str:
    """The best against PyTorch's defaults compiled, as to_text prints it."""
    g = r["gain_over_compiled"]
    if g["gain"] is None:
        return r["compiled_default_note"]
    return f"{_gain_text(g)} throughput over {r['compiled_default_note']}"


def check_text(r: dict) -> str:
    """The recommended configuration's gradient check in words."""
    n = r.get("recommended_numerics") or {}
    if n.get("grad_check") is None:
        return "not run (grad_check: false, or rows from before the check)"
    if n["grad_check"] == "off":
        return "off (grad_check: false)"
    what = {"exact": "exact, within fp32 reduction order", "approximate": "approximate (a compressing hook)"}
    return f"{what.get(n['grad_check'], n['grad_check'])}{_error_text(n)}"


def _f(x: float | None) -> str:
    return "?" if x is None else f"{x:.2f}"
