"""The sweep spec's rules across its fields (a grid's size, the knobs against their table, rounds and racing,
hooks, nodes, the workload's form) and the count of the cells a grid expands to. `SweepSpec.__post_init__`
runs `validate`; the rules of single fields are in `sweeps.spec.fields`."""

from __future__ import annotations

import functools
import math
from typing import TYPE_CHECKING

from sweeps.spec.fields import (
    BF16_ON_CPU,
    ISOLATIONS,
    LISTS,
    MAX_MEASUREMENTS,
    PLACEMENTS,
    RANGES,
    SCALARS,
    check_choice,
    check_list,
    check_range,
    check_scalar,
    fail,
    is_int,
    is_num,
    validate_env,
    validate_env_grid,
    validate_results,
    validate_topology,
)
from trainers.config import StepConfig, canonical_args
from trainers.errors import ConfigError
from trainers.knobs import BACKENDS, GRID_AXES, SPEC_AXES, SPEC_SETTINGS, check

if TYPE_CHECKING:
    from sweeps.spec.sweep import SweepSpec


def cells_planned(spec: SweepSpec) -> int:
    """The cells the grid expands to (sweeps.plan.grid.expand), counted without expanding it: baselines (one per gas,
    timing and compile), then per placement, environment, timing and gas: no_sync only where gas > 1, naive once
    per compile value, and DDP once per combination of its axes, PowerSGD's rank crossed with `powersgd` only,
    optimize_ddp with compiled cells only."""
    hooks = [h for h in spec.comm_hook if h != "powersgd"]
    hook_combos = len(hooks) + (len(spec.powersgd_rank) if "powersgd" in spec.comm_hook else 0)
    own_rule = ("comm_hook", "powersgd_rank", "optimize_ddp")
    others = math.prod(len(getattr(spec, k.name)) for k in GRID_AXES if k.name not in own_rule)
    ddp_compiles = (False in spec.compile) + (True in spec.compile) * len(spec.optimize_ddp)  # optimize_ddp: compiled
    per_mode = sum(hook_combos * others * ddp_compiles if m == "ddp" else len(spec.compile) for m in spec.modes)
    syncs = sum(1 if g == 1 else len(spec.no_sync) for g in set(spec.gas))
    envs = math.prod(len(v) for v in spec.env_grid.values()) if isinstance(spec.env_grid, dict) else 1
    places = len(spec.placements())
    baselines = len(set(spec.gas)) * len(spec.timing) * len(spec.compile)
    return baselines + places * envs * len(spec.timing) * syncs * per_mode


def _check_grid_size(spec: SweepSpec) -> None:
    """Bound the measurements (the cells the grid expands to, times the rounds) before anything is expanded."""
    planned = cells_planned(spec) * spec.rounds
    if planned > MAX_MEASUREMENTS:
        raise fail(
            "repeats" if spec.rounds > 1 else "bucket_cap_mb",
            f"{planned} measurements",
            f"at most {MAX_MEASUREMENTS} measurements (cells x repeats) per sweep: fewer axis values or "
            "repeats, or split the study into several sweeps",
        )


def _check_first_bucket(spec: SweepSpec) -> None:
    """A first bucket larger than the cap is not a first bucket (DDP would make it one bucket of the cap)."""
    caps = min(spec.bucket_cap_mb)
    for i, first in enumerate(spec.first_bucket_mb):
        if first is not None and first > caps:
            raise fail(
                f"first_bucket_mb[{i}]", first, f"at most every bucket_cap_mb crossed with it (smallest {caps:g})"
            )


def _check_static_graph(spec: SweepSpec) -> None:
    """static_graph with no_sync at gas >= 2 fails on every cell in PyTorch 2.13 (DDP's reducer asserts
    `expect_autograd_hooks_` on the skipped syncs), so such a grid is refused before Ray."""
    if True in spec.static_graph and True in spec.no_sync and any(g >= 2 for g in spec.gas):
        raise fail(
            "static_graph",
            spec.static_graph,
            "false when no_sync is true at gas >= 2: PyTorch's reducer fails every such step (an internal "
            "assert on expect_autograd_hooks_); measure static_graph and no_sync in two sweeps",
        )


def _validate_knobs(spec: SweepSpec) -> None:
    """Every knob the spec declares, against its entry in trainers.knobs: a setting's one value, an axis's
    list (non-empty, bounded, without duplicates) value by value."""
    for knob in SPEC_SETTINGS:
        allowed = check(knob, getattr(spec, knob.name))
        if allowed is not None:
            raise fail(knob.name, getattr(spec, knob.name), allowed)
    for knob in SPEC_AXES:
        check_list(knob.name, getattr(spec, knob.name), functools.partial(check, knob))


def validate(spec: SweepSpec) -> None:
    """Every rule of the spec: each field's, then those across fields (run by `SweepSpec.__post_init__`)."""
    for name, kind in SCALARS.items():
        check_scalar(name, getattr(spec, name), kind)
    for name in RANGES:
        if name in SCALARS:
            check_range(name, [getattr(spec, name)])
    if spec.timed_steps != "auto" and not (is_int(spec.timed_steps) and spec.timed_steps >= 1):
        raise fail("timed_steps", spec.timed_steps, "an integer >= 1, or auto (adaptive timing)")
    for name in ("target_rel_ci", "target_rel", "tolerance"):
        if not (is_num(getattr(spec, name)) and 0 < getattr(spec, name) < 1):
            raise fail(name, getattr(spec, name), "a fraction in (0, 1), e.g. 0.02 for 2%")
    if is_int(spec.timed_steps) and spec.timed_steps > 1_000_000:
        raise fail("timed_steps", spec.timed_steps, "at most 1000000, or auto")
    _validate_rounds(spec)
    _validate_knobs(spec)
    for name, kind in LISTS.items():
        check_list(name, getattr(spec, name), kind)
        if name in RANGES:
            check_range(name, getattr(spec, name))
    if spec.topology is not None:
        validate_topology(spec.topology)
    if spec.workload is not None and not isinstance(spec.workload_args, dict):
        raise fail("workload_args", spec.workload_args, "a mapping of keyword arguments")
    check_choice("backend", spec.backend, BACKENDS)
    check_choice("placement", spec.placement, PLACEMENTS)
    check_choice("isolation", spec.isolation, ISOLATIONS)
    check_scalar("calibrate", spec.calibrate, "bool")
    if not (isinstance(spec.grad_check, bool) or spec.grad_check == "every"):
        raise fail("grad_check", spec.grad_check, "true (each configuration's first measurement), every or false")
    if spec.use_gpu != "auto" and not isinstance(spec.use_gpu, bool):
        raise fail("use_gpu", spec.use_gpu, "auto, true or false")
    _check_steps(spec)
    validate_env(spec.env)
    validate_env_grid(spec.env_grid, spec.env)
    _validate_hooks(spec)
    validate_results(spec.results)
    if spec.topology is None:
        _validate_nodes(spec)
    if spec.backend == "nccl" and spec.use_gpu is False:
        raise fail("backend", "nccl", "gloo or auto when use_gpu is false (NCCL needs GPUs)")
    _check_static_graph(spec)
    _check_first_bucket(spec)
    _check_grid_size(spec)


def _validate_rounds(spec: SweepSpec) -> None:
    """repeats (an integer or auto) and the decision settings: racing and automatic rounds."""
    if spec.repeats != "auto" and not (is_int(spec.repeats) and 1 <= spec.repeats <= 1_000):
        raise fail("repeats", spec.repeats, "an integer in [1, 1000], or auto (rounds until resolved)")
    check_choice("search", spec.search, ("grid", "race"))
    if spec.max_sweep_s is not None and not (is_num(spec.max_sweep_s) and 0 < spec.max_sweep_s <= 30 * 86_400):
        raise fail("max_sweep_s", spec.max_sweep_s, "seconds in (0, 2592000], or null (no limit)")
    if spec.decides and spec.min_rounds < 2:
        raise fail(
            "min_rounds",
            spec.min_rounds,
            "at least 2 with search: race or model, or repeats: auto (a decision after one round has no between-round "
            "variance to test against: equal cells get dropped)",
        )
    if spec.decides and spec.min_rounds > spec.rounds:
        raise fail("min_rounds", spec.min_rounds, f"at most the rounds planned ({spec.rounds})")
    if spec.decides and spec.isolation == "cell":
        raise fail(
            "isolation", spec.isolation, "sweep or group with search: race or model, or repeats: auto (a group decides)"
        )


def _check_steps(spec: SweepSpec) -> None:
    """StepConfig's own checks, made once on the spec rather than on its first cell: the preset or the workload's
    import path and arguments (importing it is the planner's job: sweeps.plan.grid), seq_len within the preset's block,
    PowerSGD's warm-up."""
    what = {"model": spec.model, "seq_len": spec.seq_len}
    if spec.workload is not None:
        what = {"workload": spec.workload, "workload_args": canonical_args(spec.workload_args)}
    warm = {"warmup_steps": spec.warmup_steps, "powersgd_start_iter": spec.powersgd_start_iter}
    for hook in dict.fromkeys(spec.comm_hook):
        try:
            StepConfig(**what, **warm, comm_hook=hook)
        except ConfigError as e:
            raise fail(e.field, e.value, e.allowed) from None


def _validate_hooks(spec: SweepSpec) -> None:
    """bf16 needs CUDA (refused here when the spec says CPU; runner.resolve_options checks `auto` against
    the cluster)."""
    if "bf16" in spec.comm_hook and spec.use_gpu is False:
        i = spec.comm_hook.index("bf16")
        raise fail(f"comm_hook[{i}]", "bf16", BF16_ON_CPU)


def _validate_nodes(spec: SweepSpec) -> None:
    if not any(w % n == 0 and w >= n for w in spec.workers for n in spec.nodes):
        raise fail("nodes", spec.nodes, f"node counts that divide some worker count in {spec.workers}")
