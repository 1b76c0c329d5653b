"""The sweep spec's field rules beyond the knobs (whose rules are their entries in trainers.knobs): each field's
type, range and choices, and the checks of the mappings and lists inside it (env, env_grid, topology, results),
each failing with a `SpecError` that names the field's dotted path and what is allowed. `sweeps.spec.sweep` applies
them to a `SweepSpec` and adds the checks across its fields."""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any

from results.storage.store import LABEL_RULE, valid_label
from trainers.errors import ConfigError
from trainers.knobs import BY_NAME

PLACEMENTS = ("auto", "PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")
GRID_MODES = ("ddp", "naive")
ISOLATIONS = ("sweep", "group", "cell")
ENV_PREFIXES = ("NCCL_", "GLOO_", "TORCH_NCCL_", "TORCH_DISTRIBUTED_")


class SpecError(ConfigError):
    """A sweep spec field is invalid; `field` is its dotted path (e.g. `bucket_cap_mb[2]`)."""


TOPOLOGY_RE = re.compile(r"(0|[1-9][0-9]{0,3})x(0|[1-9][0-9]{0,4})")  # one spelling each: no 01x2, no trailing newline


def parse_topology(text: str) -> tuple[int, int]:
    """`"2x8"` -> (2 nodes, 8 workers per node)."""
    m = TOPOLOGY_RE.fullmatch(text)
    if not m:
        raise ValueError(text)
    return int(m[1]), int(m[2])


def fail(path: str, value: Any, allowed: str) -> SpecError:
    return SpecError(path, value, allowed)


def is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def is_num(v: Any) -> bool:
    return (is_int(v) or isinstance(v, float)) and math.isfinite(v)


def check_scalar(path: str, v: Any, kind: str) -> None:
    checks = {
        "int>=1": (lambda: is_int(v) and v >= 1, "an integer >= 1"),
        "int>=0": (lambda: is_int(v) and v >= 0, "an integer >= 0"),
        "num>0": (lambda: is_num(v) and v > 0, "a number > 0"),
        "bool": (lambda: isinstance(v, bool), "true or false"),
        "label": (lambda: isinstance(v, str) and valid_label(v), LABEL_RULE),
        "str": (lambda: isinstance(v, str) and bool(v), "a non-empty string"),
    }
    ok, allowed = checks[kind]
    if not ok():
        raise fail(path, v, allowed)


def check_choice(path: str, v: Any, choices: tuple) -> None:
    if v not in choices or isinstance(v, bool) != isinstance(choices[0], bool):
        raise fail(path, v, f"one of {', '.join(map(str, choices))}")


def not_a_list(path: str, values: Any) -> SpecError:
    """A list field given something else; one value alone gets the fix written out (`[25]`)."""
    shown = str(values).lower() if isinstance(values, bool) else str(values)
    if isinstance(values, str | int | float | bool) and len(shown) <= 40:
        return fail(path, values, f"a non-empty list; for one value write {path}: [{shown}]")
    return fail(path, values, "a non-empty list")


def check_list(path: str, values: Any, kind: str | tuple | Callable[[Any], str | None]) -> None:
    """A non-empty list without duplicates, of at most MAX_AXIS_VALUES values, each of `kind`: a scalar kind, a
    tuple of choices, or a check that returns what is allowed where a value is refused (None: it is)."""
    if not isinstance(values, list) or not values:
        raise not_a_list(path, values)
    if len(values) > MAX_AXIS_VALUES:
        raise fail(path, f"{len(values)} values", f"at most {MAX_AXIS_VALUES} values")
    for i, v in enumerate(values):
        if callable(kind):
            allowed = kind(v)
            if allowed is not None:
                raise fail(f"{path}[{i}]", v, allowed)
        elif isinstance(kind, tuple):
            check_choice(f"{path}[{i}]", v, kind)
        else:
            check_scalar(f"{path}[{i}]", v, kind)
    if len(set(values)) != len(values):
        raise fail(path, values, "a list without duplicates")


SCALARS = {
    "name": "label",
    "cluster": "label",
    "cpus_per_worker": "num>0",
    "max_timed_steps": "int>=1",
    "max_cell_s": "num>0",
    "collective_timeout_s": "num>0",
    "cell_timeout_s": "num>0",
    "group_start_timeout_s": "num>0",
    "max_concurrent_trials": "int>=1",
    "max_rounds": "int>=1",
    "min_rounds": "int>=1",
    "results": "str",
}
LISTS = {
    "workers": "int>=1",
    "nodes": "int>=1",
    "modes": GRID_MODES,
}
RANGES = {k: (BY_NAME[k].lo, BY_NAME[k].hi) for k in ("max_timed_steps", "max_cell_s")} | {
    "collective_timeout_s": (1, 86_400),
    "cell_timeout_s": (1, 7 * 86_400),
    "group_start_timeout_s": (1, 86_400),
    "max_concurrent_trials": (1, 1_024),
    "max_rounds": (1, 1_000),
    "min_rounds": (1, 1_000),
    "cpus_per_worker": (0.001, 1_024),
    "workers": (BY_NAME["world_size"].lo, BY_NAME["world_size"].hi),
    "nodes": (BY_NAME["num_nodes"].lo, BY_NAME["num_nodes"].hi),
}
MAX_AXIS_VALUES = 1_000  # values in one grid list
MAX_MEASUREMENTS = 10_000  # cells x repeats in one sweep (a week of minute-long GPU cells): split larger studies
ENV_KEY_RE = re.compile(r"^[A-Z][A-Z0-9_]{0,127}$")


def check_range(name: str, values: list) -> None:
    lo, hi = RANGES[name]
    for i, v in enumerate(values):
        if not lo <= v <= hi:
            raise fail(name if len(values) == 1 else f"{name}[{i}]", v, f"a value in [{lo}, {hi}]")


def validate_results(results: str) -> None:
    if "\0" in results:
        raise fail("results", results, "a folder or URI without NUL bytes")
    scheme, sep, rest = results.partition("://")
    if sep and not rest.strip("/").split("/", 1)[0].split("?", 1)[0]:
        raise fail("results", results, f"a {scheme}:// URI naming a bucket, e.g. {scheme}://bucket/ddpsweep")


def validate_env(env: Any) -> None:
    if not isinstance(env, dict):
        raise fail("env", env, "a mapping of variable name to string value")
    for k, v in env.items():
        check_env_name(f"env.{k}", k)
        if not env_value_ok(v):
            raise fail(f"env.{k}", v, _env_rule(v))


def check_env_name(path: str, k: Any) -> None:
    if not isinstance(k, str) or not k.startswith(ENV_PREFIXES) or not ENV_KEY_RE.match(k):
        raise fail(path, k, f"a variable name of A-Z, 0-9, '_' starting with {', '.join(ENV_PREFIXES)}")


ENV_VALUE_RULE = (
    "a literal string or number of printable characters, at most 4096, without `$` (Ray expands ${VAR} from the "
    "cluster's own environment when it starts the workers: a value is never a reference)"
)


def _env_rule(v: Any) -> str:
    if isinstance(v, bool):  # YAML 1.1: OFF, ON, YES, NO, TRUE, FALSE unquoted are booleans
        return f"{ENV_VALUE_RULE}; YAML read an unquoted OFF/ON/YES/NO as {v}: quote it, e.g. 'OFF'"
    return ENV_VALUE_RULE


def env_value_ok(v: Any) -> bool:
    """A literal value: printable (no control characters: a row's `env` and the recommended snippet print it)
    and without `$`, which Ray's runtime_env would expand from the cluster's environment into every row."""
    finite = not isinstance(v, float) or math.isfinite(v)
    text_ok = isinstance(v, (str, int, float)) and not isinstance(v, bool)
    text = str(v)
    return text_ok and finite and text.isprintable() and "$" not in text and len(text) <= 4096


def validate_env_grid(grid: Any, env: dict) -> None:
    if not isinstance(grid, dict):
        raise fail("env_grid", grid, "a mapping of variable name to a list of values")
    for k, values in grid.items():
        check_env_name(f"env_grid.{k}", k)
        if k in env:
            raise fail(f"env_grid.{k}", values, f"a variable not also fixed in env ({k} is)")
        if not isinstance(values, list) or not values or len(values) > MAX_AXIS_VALUES:
            raise fail(f"env_grid.{k}", values, f"a non-empty list of at most {MAX_AXIS_VALUES} values")
        for i, v in enumerate(values):
            if not env_value_ok(v):
                raise fail(f"env_grid.{k}[{i}]", v, _env_rule(v))
        if len({str(v) for v in values}) != len(values):
            raise fail(f"env_grid.{k}", values, "a list without duplicates")


BF16_ON_CPU = "none, fp16 or powersgd without GPUs: PyTorch's bf16_compress_hook needs CUDA 11+ and NCCL 2.10+"


def validate_topology(topology: Any) -> None:
    check_list("topology", topology, "str")
    for i, text in enumerate(topology):
        path, allowed = f"topology[{i}]", "<nodes>x<workers per node>, e.g. 1x8 or 2x8"
        try:
            nodes, per_node = parse_topology(text)
        except ValueError:
            raise fail(path, text, allowed) from None
        if not (1 <= nodes <= RANGES["nodes"][1] and per_node >= 1 and nodes * per_node <= RANGES["workers"][1]):
            raise fail(
                path,
                text,
                f"{allowed}, with 1..{RANGES['nodes'][1]} nodes and at most {RANGES['workers'][1]} workers in all",
            )
