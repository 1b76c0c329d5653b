"""The docs: every spec key, row column, SQL view, CLI command and HTTP path is in the reference generated from
the code's declarations, with words beside it; the site builds with `mkdocs build --strict` (a broken link or
a page missing from the nav fails); the README's first screen is a user's, not the project's notebook."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "docs"))  # the reference generator lives with the docs it writes
import docgen  # noqa: E402


def test_every_spec_key_is_documented():
    from sweeps.spec.sweep import SweepSpec

    docs = docgen.spec_docs()
    keys = {f.name for f in SweepSpec.__dataclass_fields__.values()}
    assert set(docs) == keys
    undocumented = [k for k, (_, _, doc) in docs.items() if len(doc) < 10]
    assert not undocumented, f"spec keys without documentation: {undocumented}"
    page = docgen.spec_reference()
    assert all(f"| `{k}` |" in page for k in keys)
    assert "| `grad_check` | bool \\| str | `true` |" in page  # kind and default (as YAML) from the declaration


def test_every_row_column_is_documented():
    from results.storage.schema import SCHEMA

    docs = docgen.column_docs()
    undocumented = [name for name in SCHEMA.names if len(docs[name]) < 3]
    assert not undocumented, f"columns without a comment in results/storage/schema.py or a knob doc: {undocumented}"
    page = docgen.schema_reference()
    assert all(f"| `{name}` |" in page for name in SCHEMA.names)


def test_every_sql_view_is_documented_and_every_documented_view_exists(seed_store):
    from results.sql.query import views
    from results.sql.views import VIEWS

    built = set(views(seed_store))
    assert built == set(VIEWS), (built, set(VIEWS))
    page = docgen.sql_reference()
    assert all(f"| `{v}` |" in page for v in VIEWS)


def test_every_cli_command_and_option_is_documented():
    page = docgen.cli_reference()
    commands = docgen.cli_commands()
    assert {"run", "recommend", "query", "init", "submit", "serve", "compare", "report"} <= set(commands)
    assert len(docgen.options(commands["run"])) >= 6  # the options are found (typer vendors its own click)
    for name, cmd in commands.items():
        assert f"## `ddpsweep {name}`" in page
        assert cmd.help and len(cmd.help) > 20, name
        for p in docgen.options(cmd):
            assert p.help, f"{name} {p.opts}: no help"
            assert f"`{p.opts[0]}`" in page
    assert "| `--format` | table \\| csv \\| json |" in page and "| `--dry-run` | flag |" in page


def test_every_http_path_is_in_the_reference():
    from service.api import ServiceSettings, create_app

    paths = create_app(ServiceSettings(address=None, results=str(ROOT), token=None)).openapi()["paths"]
    page = docgen.http_reference()
    assert all(f" {p}`" in page for p in paths)
    assert "## `POST /query`" in page and "## `GET /cells`" in page


@pytest.mark.skipif(
    shutil.which("mkdocs") is None and not (Path(sys.executable).parent / "mkdocs").exists(),
    reason="mkdocs is not installed (pip install -e '.[test]')",
)
def test_the_site_builds_strict(tmp_path):
    """The generated references are written, then MkDocs builds the whole site with --strict."""
    docs = tmp_path / "docs"
    shutil.copytree(ROOT / "docs", docs, ignore=shutil.ignore_patterns("reference", "benchmarks.md"))
    docgen.write_all(docs / "reference")
    config = (ROOT / "mkdocs.yml").read_text().replace("docs_dir: docs", f"docs_dir: {docs}")
    (tmp_path / "mkdocs.yml").write_text(config.replace("site_dir: build/site", f"site_dir: {tmp_path / 'site'}"))
    mkdocs = Path(sys.executable).parent / "mkdocs"
    run = subprocess.run(
        [str(mkdocs), "build", "--strict", "-f", str(tmp_path / "mkdocs.yml")], capture_output=True, text=True
    )
    assert run.returncode == 0, run.stdout + run.stderr
    home = (tmp_path / "site" / "reference" / "spec" / "index.html").read_text()
    assert "bucket_cap_mb" in home and "grad_check" in home


def ddpsweep_here(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    """The installed console script, run from `cwd` (outside the checkout)."""
    exe = Path(sys.executable).parent / "ddpsweep"
    return subprocess.run([str(exe), *args], cwd=cwd, capture_output=True, text=True, timeout=300)


def test_init_then_a_dry_run_works_in_an_empty_folder_outside_the_checkout(tmp_path):
    made = ddpsweep_here(tmp_path, "init")
    assert made.returncode == 0, made.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["my_workload.py", "spec.yaml"]
    dry = ddpsweep_here(tmp_path, "run", "spec.yaml", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert "my_workload:build" in dry.stdout  # 2 baselines + 4 buckets x (gas 1, gas 4 x no_sync both), 3 rounds
    assert "14 cells x 3 repeat(s) = 42 measurements" in dry.stdout
    again = ddpsweep_here(tmp_path, "init")
    assert again.returncode == 2 and "already there" in again.stderr  # never overwrites
    assert (tmp_path / "spec.yaml").read_text().startswith("# A sweep of your own model")


def test_a_packaged_spec_runs_by_name(tmp_path):
    dry = ddpsweep_here(tmp_path, "run", "smoke", "--dry-run", "--sweep", "by-name")
    assert dry.returncode == 0, dry.stderr
    assert "11 cells x 3 repeat(s) = 33 measurements" in dry.stdout
    unknown = ddpsweep_here(tmp_path, "run", "nosuchspec", "--dry-run")
    assert unknown.returncode == 2 and "smoke" in unknown.stderr and "seed" in unknown.stderr  # names what ships
    bad = ddpsweep_here(tmp_path, "recommend", "--format", "yaml", "--results", str(tmp_path))
    assert bad.returncode == 2 and "'text'" in bad.stderr and "'json'" in bad.stderr  # a closed set, listed


def test_html_in_a_docstring_is_shown_as_text_on_the_reference_pages(monkeypatch):
    doc = "runs <script>alert(1)</script> & more; the path `cluster=<c>/x` stays as written"
    monkeypatch.setattr(docgen, "spec_docs", lambda: {"evil": ("str", "-", doc)})
    page = docgen.spec_reference()
    assert "<script>" not in page and "&lt;script&gt;alert(1)&lt;/script&gt; &amp; more" in page
    assert "`cluster=<c>/x`" in page  # a code span shows its text as written already


def test_reduce_overhead_on_cpu_is_warned_about():
    from sweeps.spec.files import parse_spec

    cpu = parse_spec("name: x\ncompile: [true]\ncompile_mode: reduce-overhead\nuse_gpu: false\n")
    assert any("CUDA graphs, which do nothing on CPU" in w for w in cpu.warnings())
    gpu = parse_spec("name: x\ncompile: [true]\ncompile_mode: reduce-overhead\nuse_gpu: true\n")
    assert not any("CUDA graphs" in w for w in gpu.warnings())
