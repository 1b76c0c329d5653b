"""DESIGN.md's layer rule: service -> sweeps -> {trainers, results}; trainers and results never meet."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FORBIDDEN = {
    "trainers": {"service", "sweeps", "results"},
    "results": {"service", "sweeps", "trainers", "torch", "ray"},
    "sweeps": {"service"},
    "service": {"trainers"},  # through sweeps and results; of trainers only its error types (below)
}
# The one exception: the service edge names the measuring core's error types (a leaf that imports nothing of the
# project, nor torch). results and trainers share the knob table as data (trainers/knobs.json), not as an import.
ALLOWED_MODULES = {"service": {"trainers.errors"}}


def imported_roots(path: Path, allowed: set[str] | frozenset[str] = frozenset()) -> set[str]:
    modules = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            modules |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            modules.add(node.module)
    return {m.split(".")[0] for m in modules - allowed}


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_imports_point_one_way(package):
    breaches = {
        str(path.relative_to(ROOT)): sorted(
            imported_roots(path, ALLOWED_MODULES.get(package, set())) & FORBIDDEN[package]
        )  # noqa: E501
        for path in (ROOT / package).rglob("*.py")
    }
    assert {k: v for k, v in breaches.items() if v} == {}


def test_the_guard_can_fail(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("import ray\nfrom trainers.step import run_cell\n")
    assert imported_roots(bad) & FORBIDDEN["results"] == {"ray", "trainers"}
    leaf = tmp_path / "leaf.py"
    leaf.write_text("from trainers.errors import DDPSweepError\nimport trainers.step\n")
    assert imported_roots(leaf, frozenset({"trainers.errors"})) == {"trainers"}  # trainers.step still counts


def test_the_allowed_modules_are_leaves():
    """What service may import of trainers imports nothing of the project, nor torch or ray."""
    for module in ALLOWED_MODULES["service"]:
        path = ROOT / (module.replace(".", "/") + ".py")
        assert imported_roots(path) & {"trainers", "results", "sweeps", "service", "torch", "ray"} == set(), module


DYNAMIC = ("import_module(", "__import__(", "find_spec(", "exec(", "run_module(")


def test_results_reaches_trainers_only_for_the_knob_table():
    """No import by another name: of results' modules only results/knobs.py looks for the trainers package, and
    only to read its data file (find_spec runs none of its code)."""
    uses = {
        str(path.relative_to(ROOT)): [d for d in DYNAMIC if d in path.read_text()]
        for path in (ROOT / "results").rglob("*.py")
    }
    assert {k: v for k, v in uses.items() if v} == {
        "results/__init__.py": ["import_module("],
        "results/knobs.py": ["find_spec("],
    }
    text = (ROOT / "results" / "knobs.py").read_text()
    assert 'find_spec("trainers")' in text and '"knobs.json"' in text
    import results  # its lazy names load its own modules only

    assert {m.split(".")[0] for m in results._LAZY.values()} == {"results"}


def package_imports(tree: ast.AST, package: str) -> set[str]:
    """The modules of `package` a module imports, lazy ones included: `from package.x import y` and
    `from package import x` (x a module) alike. Not those under `if TYPE_CHECKING:` (names for annotations: they
    never run, so they can make no cycle at import or at call time)."""
    out = set()
    typing_only = {
        id(n)
        for block in ast.walk(tree)
        if isinstance(block, ast.If) and ast.unparse(block.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING")
        for stmt in block.body
        for n in ast.walk(stmt)
    }
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if not isinstance(node, ast.ImportFrom) or not node.module or node.level:
            continue
        if node.module.startswith(f"{package}."):
            out.add(node.module)
        elif node.module == package:
            out |= {f"{package}.{alias.name}" for alias in node.names if (ROOT / package / f"{alias.name}.py").exists()}
    return out


def test_the_cycle_guard_sees_package_imports(tmp_path):
    tree = ast.parse("from results import query as q\nfrom results.store import Store\nfrom results import nothing\n")
    assert package_imports(tree, "results") == {"results.query", "results.store"}
    lazy = "if TYPE_CHECKING:\n    from results.cache import C\ndef f():\n    from results.plots import p\n"
    assert package_imports(ast.parse(lazy), "results") == {"results.plots"}  # a lazy import counts, a typing one not


def test_no_import_cycles_inside_a_package():
    """sweeps.fit and sweeps.trial imported each other (TrialOptions one way, fit_group the other, lazily):
    every import inside a package, lazy ones included, points one way."""
    graph: dict[str, set[str]] = {}
    for package in FORBIDDEN:
        for path in (ROOT / package).rglob("*.py"):
            name = f"{package}.{path.stem}"
            graph[name] = package_imports(ast.parse(path.read_text()), package)

    def reaches(start: str, goal: str, seen: set[str]) -> bool:
        return any(n == goal or (n not in seen and reaches(n, goal, seen | {n})) for n in graph.get(start, ()))

    assert sorted(m for m in graph if reaches(m, m, {m})) == []
