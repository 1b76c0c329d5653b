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
    "service": set(),
}


def imported_roots(path: Path) -> set[str]:
    roots = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            roots |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            roots.add(node.module.split(".")[0])
    return roots


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_imports_point_one_way(package):
    breaches = {
        str(path.relative_to(ROOT)): sorted(imported_roots(path) & FORBIDDEN[package])
        for path in (ROOT / package).rglob("*.py")
    }
    assert {k: v for k, v in breaches.items() if v} == {}


def test_the_guard_can_fail(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("import ray\nfrom trainers.step import run_cell\n")
    assert imported_roots(bad) & FORBIDDEN["results"] == {"ray", "trainers"}
