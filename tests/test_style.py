"""The formatter owns the layout: `ruff format --check` and `ruff check` pass, and no formatter marker
keeps hand formatting against it."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ["service", "sweeps", "trainers", "results", "tests", "benchmarks"]


def _ruff() -> list[str]:
    found = shutil.which("ruff") or str(Path(sys.executable).parent / "ruff")
    if not Path(found).exists():
        pytest.fail("ruff is not installed: pip install -e '.[test]'")
    return [found]


def test_formatter_owns_the_layout():
    run = subprocess.run([*_ruff(), "format", "--check", *PACKAGES], cwd=ROOT, capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr


def test_lint_passes():
    run = subprocess.run([*_ruff(), "check", *PACKAGES], cwd=ROOT, capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr


def test_no_formatter_markers():
    marker = "fmt: " + "skip"
    off = "fmt: " + "off"
    hits = [
        f"{p.relative_to(ROOT)}:{i}"
        for pkg in PACKAGES
        for p in (ROOT / pkg).rglob("*.py")
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if marker in line or off in line
    ]
    assert hits == []
