"""Spec files: reading a YAML (or JSON) spec safely and strictly, then validating it into a `SweepSpec`
(sweeps/spec/sweep.py). Duplicate keys, YAML 1.1 number surprises, alias bombs and oversized files are refused with a
`SpecError` naming the field (or the file) and what is allowed.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import yaml

from sweeps.spec.sweep import SpecError, SweepSpec, spec_from_dict

MAX_SPEC_BYTES = 256 * 1024  # as the HTTP API's body limit


SPECS = Path(__file__).resolve().parent.parent / "specs"  # the specs that ship with ddpsweep (sweeps/specs)
PACKAGED = re.compile(r"[a-z][a-z0-9_]*")


def packaged_specs() -> list[str]:
    """The names of the specs that ship with ddpsweep (`ddpsweep run smoke`)."""
    return sorted(p.stem for p in SPECS.glob("*.yaml"))


def load_spec(path: str | Path) -> SweepSpec:
    """Read and validate a YAML (or JSON) spec file; `env:NAME` reads the text from that variable."""
    return load_spec_text(path)[0]


def load_spec_text(path: str | Path) -> tuple[SweepSpec, str]:
    """The validated spec and the exact text it was read from (what `submit` sends on)."""
    if str(path).startswith("env:"):
        text = os.environ.get(str(path)[4:])
        if text is None:
            raise SpecError("SPEC", str(path), "an environment variable holding the spec's YAML")
        try:
            return parse_spec(text, source=str(path)), text
        except SpecError as e:  # never echo an environment variable's content
            raise SpecError(e.field, "<value from the environment, not shown>", e.allowed) from None
    p = Path(path)
    if not p.is_file() and PACKAGED.fullmatch(str(path)) and (SPECS / f"{path}.yaml").is_file():
        p = SPECS / f"{path}.yaml"  # a packaged spec by name: `ddpsweep run smoke`
    if not p.is_file():
        names = ", ".join(packaged_specs())
        raise SpecError("SPEC", str(path), f"an existing YAML file, or a packaged spec by name: {names}")
    with p.open("rb") as f:
        raw = f.read(MAX_SPEC_BYTES + 1)  # never a whole 1 GB file in memory before the size check
    if len(raw) > MAX_SPEC_BYTES:
        raise SpecError("SPEC", str(path), f"a spec file of at most {MAX_SPEC_BYTES} bytes")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise SpecError("SPEC", str(path), f"UTF-8 text (byte {e.start} is not UTF-8)") from None
    return parse_spec(text, source=str(path)), text


MAX_SPEC_NODES = 100_000  # YAML nodes after aliases are expanded: an alias bomb stops here
MAX_SPEC_DEPTH = 20  # nesting levels (a spec needs 3)
MAX_DIGITS = 18  # of an integer: every count in a spec fits, and Python refuses to read 4,300 or more
MAX_LIST = 1_000  # values in one list (a grid axis has at most MAX_AXIS_VALUES), refused before anything expands


class StrictLoader(yaml.SafeLoader):
    """YAML for specs: duplicate keys refused, YAML 1.2 numbers (no `1:30` = 90, `1e-300` is a float),
    and a bounded size and depth."""


_NUMBER_TAGS = ("tag:yaml.org,2002:int", "tag:yaml.org,2002:float")
StrictLoader.yaml_implicit_resolvers = {
    k: [r for r in v if r[0] not in _NUMBER_TAGS] for k, v in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
# no leading zeros: YAML 1.1 reads 010 as 8 and 09 as an error; such a value stays text and is refused by name
StrictLoader.add_implicit_resolver("tag:yaml.org,2002:int", re.compile(r"^[-+]?(0|[1-9][0-9]*)$"), list("-+0123456789"))
StrictLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(
        r"^[-+]?(\.[0-9]+|(0|[1-9][0-9]*)(\.[0-9]*)?)([eE][-+]?[0-9]+)?$|^[-+]?\.(inf|Inf|INF)$|^\.(nan|NaN|NAN)$"
    ),
    list("-+.0123456789"),
)


def _check_shape(node: yaml.Node, path: str = "", depth: int = 0, seen: list | None = None) -> None:
    """Refuse duplicate keys, and specs too deep or too large once aliases are expanded."""
    seen = seen if seen is not None else [0]
    seen[0] += 1
    if seen[0] > MAX_SPEC_NODES or depth > MAX_SPEC_DEPTH:
        raise SpecError(
            path or "SPEC",
            "a structure too large or too deep",
            f"at most {MAX_SPEC_DEPTH} levels and {MAX_SPEC_NODES} values once aliases are expanded",
        )
    if isinstance(node, yaml.ScalarNode) and node.tag.endswith(":int") and len(node.value.lstrip("+-")) > MAX_DIGITS:
        raise SpecError(path.rstrip(".") or "SPEC", f"a number of {len(node.value)} digits", f"at most {MAX_DIGITS}")
    if isinstance(node, yaml.MappingNode):
        keys: set[str] = set()
        for key, value in node.value:
            if not isinstance(key, yaml.ScalarNode):
                raise SpecError(f"{path}?", f"a {key.id} as a key (line {key.start_mark.line + 1})", "field names")
            if key.value in keys:
                raise SpecError(f"{path}{key.value}", "given twice", "each field once")
            keys.add(key.value)
            _check_shape(value, f"{path}{key.value}.", depth + 1, seen)
    elif isinstance(node, yaml.SequenceNode):
        if len(node.value) > MAX_LIST:
            raise SpecError(path.rstrip(".") or "SPEC", f"{len(node.value)} values", f"at most {MAX_LIST} values")
        for i, item in enumerate(node.value):
            _check_shape(item, f"{path}[{i}].", depth + 1, seen)


def yaml_problem(e: yaml.YAMLError) -> str:
    """PyYAML's error on one line, where it was found first: `line 3, column 7: <problem> (<context>)`."""
    mark = getattr(e, "problem_mark", None)
    problem = getattr(e, "problem", None) or str(e)
    context = getattr(e, "context", None)
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
    text = f"{where}{problem}" + (f", {context}" if context else "")
    return " ".join(text.split())[:200]


def _check_depth(text: str, source: str) -> None:
    """Refuse nesting deeper than MAX_SPEC_DEPTH from the parser's events, before the composer recurses into it
    (near Python's recursion limit, other code fails too: a finalizer that ran there raised RecursionError)."""
    depth = 0
    for event in yaml.parse(text, Loader=StrictLoader):
        if isinstance(event, yaml.CollectionStartEvent):
            depth += 1
            if depth > MAX_SPEC_DEPTH:
                raise SpecError(source, "nested too deeply", f"at most {MAX_SPEC_DEPTH} levels")
        elif isinstance(event, yaml.CollectionEndEvent):
            depth -= 1


def parse_spec(text: str, source: str = "spec") -> SweepSpec:
    text = text.removeprefix("\ufeff")  # a byte-order mark some editors write is not part of the first key
    try:
        _check_depth(text, source)
        node = yaml.compose(text, Loader=StrictLoader)
        if node is not None:
            _check_shape(node)
        data = yaml.load(text, Loader=StrictLoader)  # noqa: S506 — a SafeLoader subclass
    except yaml.YAMLError as e:
        raise SpecError(source, "unparseable YAML", f"valid YAML ({yaml_problem(e)})") from None
    return spec_from_dict(data, source)
