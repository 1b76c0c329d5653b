"""DESIGN.md's layer rule: service -> sweeps -> {trainers, results}; results imports only the torch-free modules
of trainers; results, the service's HTTP API and the spec never load torch or Ray."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FORBIDDEN = {
    "trainers": {"service", "sweeps", "results"},
    "results": {"service", "sweeps", "trainers", "torch", "ray"},
    "sweeps": {"service"},
    "service": {"trainers"},  # through sweeps and results; of trainers only its torch-free leaves (below)
}
TORCH_FREE = {"trainers.config", "trainers.errors", "trainers.knobs", "trainers.presets"}
"""The modules of trainers that load neither torch nor Ray, and of the project only each other: results and the
service may import them (the knob table is the one declaration of a configuration)."""
ALLOWED_MODULES = {"service": TORCH_FREE, "results": TORCH_FREE}


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
    """What results and service may import of trainers imports nothing of the project but each other, nor torch
    or ray."""
    for module in TORCH_FREE:
        path = ROOT / (module.replace(".", "/") + ".py")
        assert imported_roots(path, TORCH_FREE) & {"trainers", "results", "sweeps", "service", "torch", "ray"} == set()


def module_level_imports(path: Path) -> set[str]:
    """The modules a file imports when it is imported (its top-level statements; not those inside functions)."""
    out = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Import):
            out |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
    return out


SWEEPS_FOLDERS = {  # what each folder of sweeps may load when imported, beyond the project's own torch-free modules
    "worker": {"torch", "ray", "trainers"},  # the only folder whose modules load torch: they run on the ranks
    "fit": {"ray"},
    "trial": {"ray"},
    "driver": {"ray"},
    "predict": {"ray"},
    "plan": set(),  # the service's dry run and POST /sweeps plan a sweep without Ray
    "spec": set(),
}


@pytest.mark.parametrize("folder", sorted(SWEEPS_FOLDERS))
def test_each_folder_of_sweeps_loads_only_what_its_process_has(folder):
    allowed = SWEEPS_FOLDERS[folder]
    breaches = {}
    for path in (ROOT / "sweeps" / folder).rglob("*.py"):
        loaded = {m for m in module_level_imports(path) if m not in TORCH_FREE}
        bad = {m for m in loaded if m.split(".")[0] in {"torch", "ray", "trainers"} - allowed}
        if bad:
            breaches[path.name] = sorted(bad)
    assert breaches == {}
    assert {p.name for p in (ROOT / "sweeps").iterdir() if p.suffix == ".py"} == {"__init__.py"}  # no loose module


def test_results_the_http_api_and_the_spec_load_neither_torch_nor_ray():
    """Imported in a fresh interpreter: what they load, whatever path it takes (lazy names, re-exports)."""
    code = (
        "import sys, results, results.storage.store, results.analysis.recommend, results.render.report, service.api\n"
        "import sweeps.spec.files\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'ray'}))"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]"


RESULTS_FOLDERS = {  # what each folder of results may import of results (lazily too), beyond errors, knobs, values
    "analysis": {"analysis"},  # pure functions over rows: no store, no SQL, no model, no figures
    "model": {"analysis", "model"},
    "render": {"analysis", "model", "render"},
    "sql": {"storage", "analysis", "model", "sql"},
    "storage": {"storage", "analysis.paste", "model.overlap", "sql.isolation"},  # the leaves a stored row needs
}


@pytest.mark.parametrize("folder", sorted(RESULTS_FOLDERS))
def test_each_folder_of_results_imports_only_the_folders_below_it(folder):
    allowed = {f"results.{a}" for a in RESULTS_FOLDERS[folder]} | {"results.errors", "results.knobs", "results.values"}
    breaches = {}
    for path in (ROOT / "results" / folder).rglob("*.py"):
        used = package_imports(ast.parse(path.read_text()), "results")
        bad = {m for m in used if not any(m == a or m.startswith(f"{a}.") for a in allowed)}
        if bad:
            breaches[path.name] = sorted(bad)
    assert breaches == {}


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
        if node.module == package or node.module.startswith(f"{package}."):
            folder = ROOT / node.module.replace(".", "/")
            modules = {f"{node.module}.{a.name}" for a in node.names if (folder / f"{a.name}.py").exists()}
            out |= modules or ({node.module} if node.module != package else set())
    return out


def test_the_cycle_guard_sees_package_imports(tmp_path):
    tree = ast.parse("from results.sql import query as q\nfrom results.storage.store import S\nfrom results import x\n")
    assert package_imports(tree, "results") == {"results.sql.query", "results.storage.store"}
    lazy = (
        "if TYPE_CHECKING:\n    from results.storage.cache import C\ndef f():\n    from results.render.plots import p\n"
    )
    assert package_imports(ast.parse(lazy), "results") == {"results.render.plots"}  # lazy counts, typing-only not


def test_no_import_cycles_inside_a_package():
    """sweeps.fit.task and sweeps.trial.actor imported each other (TrialOptions one way, fit_group the other, lazily):
    every import inside a package, lazy ones included, points one way."""
    graph: dict[str, set[str]] = {}
    for package in FORBIDDEN:
        for path in (ROOT / package).rglob("*.py"):
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
            graph[name] = package_imports(ast.parse(path.read_text()), package)

    def reaches(start: str, goal: str, seen: set[str]) -> bool:
        return any(n == goal or (n not in seen and reaches(n, goal, seen | {n})) for n in graph.get(start, ()))

    assert sorted(m for m in graph if reaches(m, m, {m})) == []
