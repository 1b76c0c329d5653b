"""A results store is shared (a bucket between teams): its rows are data, never code. What `recommend` prints to
paste is checked here as a user would paste it: every export line through `bash -n`, the rest through Python's
parser, and no call in it that the template did not write."""

from __future__ import annotations

import ast
import json
import logging
import subprocess

import pytest

from results.analysis.paste import snippet
from results.analysis.recommend import recommend
from results.storage.store import Store, load
from tests.test_identity import base

TEMPLATE_CALLS = {
    "DistributedDataParallel",
    "compile",
    "register_comm_hook",
    "PowerSGDState",
    "enumerate",
    "len",
    "nullcontext",
    "no_sync",
    "loss_fn",
    "backward",
    "step",
}
HOSTILE = [
    {"env": json.dumps({"NCCL_ALGO=Ring; touch /tmp/x; #": "Ring"})},
    {"env": json.dumps({"NCCL_ALGO\ntouch /tmp/x": "Ring"})},
    {"env_grid": json.dumps({"NCCL_PROTO; id #": "LL"})},
    {"env_grid": json.dumps(["NCCL_ALGO", "Ring"])},
    {"env_grid": "{not json"},
    {"compile": True, "optimize_ddp": 'ddp_optimizer"; import os; os.system("id"); x = "'},
    {"compile": True, "compile_backend": "inductor'); import os; os.system('id'); ('"},
    {"compile": True, "compile_mode": "default\nimport os"},
    {"comm_hook": "none\nimport os"},
]


def calls(code: str) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Call):
            f = node.func
            names.add(f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "?"))
    return names


def assert_pastes_safely(text: str) -> None:
    exports = [line for line in text.splitlines() if line.startswith("export ")]
    python = "\n".join(line for line in text.splitlines() if not line.startswith("export "))
    done = subprocess.run(["bash", "-n"], input="\n".join(exports), text=True, capture_output=True)
    assert done.returncode == 0, done.stderr
    assert all(line.count("=") >= 1 and line.split("=", 1)[0][7:].isidentifier() for line in exports), exports
    assert calls(python) <= TEMPLATE_CALLS, calls(python) - TEMPLATE_CALLS


def store_with_hostile_rows(root: str) -> None:
    store = Store.open(root)
    for rep in range(4):
        for cell, bucket, ms in (("a", 1.0, 90.0), ("b", 25.0, 100.0)):
            good = base("c", rep, ms) | {"cell_id": cell, "bucket_cap_mb": bucket, "sweep_id": "s"}
            store.write_row(good | {"env": json.dumps({"NCCL_ALGO": "Ring; touch /tmp/pwned", "NCCL_DEBUG": "WARN"})})
        for i, bad in enumerate(HOSTILE):
            store.write_row(base("c", rep, 50.0) | {"cell_id": f"bad{i}", "sweep_id": "s", "bucket_cap_mb": 5.0} | bad)


def test_rows_whose_names_or_choices_are_not_the_knob_tables_are_dropped_and_the_snippet_is_data(tmp_path, caplog):
    store_with_hostile_rows(str(tmp_path))
    with caplog.at_level(logging.WARNING):
        rows = load(str(tmp_path))
    assert set(rows["cell_id"]) == {"a", "b"}  # every hostile row left out
    assert "with an impossible measurement or configuration" in caplog.text
    (rec,) = recommend(rows)
    assert rec["best"]["bucket_cap_mb"] == 1.0
    assert "export NCCL_ALGO='Ring; touch /tmp/pwned'" in rec["snippet"]
    assert_pastes_safely(rec["snippet"])


@pytest.mark.parametrize("bad", HOSTILE[5:8], ids=["optimize_ddp", "compile_backend", "compile_mode"])
def test_the_snippet_writes_python_values_as_literals_whatever_they_hold(bad):
    """Behind the reader, the template itself: a value is a literal, a name that is not one is left out."""
    from tests.test_recommend import recommend_defaults

    cfg = recommend_defaults() | {"bucket_cap_mb": 5.0, "gradient_as_bucket_view": True, "first_bucket_mb": None}
    cfg |= {"compile": False, "optimize_ddp": "ddp_optimizer", "compile_backend": "inductor"}
    cfg |= {"compile_mode": "default", "comm_hook": "none", "no_sync": True} | bad
    text = snippet(cfg, 2, {"NCCL_ALGO=x; id #": "1", "NCCL_PROTO": "LL; id"}, cuda=True)
    assert_pastes_safely(text)
    assert "NCCL_ALGO" not in text and "export NCCL_PROTO='LL; id'" in text


SPEC_WITH = """
name: sent
workload: "{workload}"
workload_args: {args}
micro_batch: 4
workers: [2]
bucket_cap_mb: [25]
backend: gloo
use_gpu: false
"""


def test_a_dry_run_of_a_spec_someone_sent_runs_none_of_its_code(tmp_path, monkeypatch):
    """A factory that would leave a file behind, and `subprocess:run` with a command: the dry run prints the grid,
    says the workload was not imported, and nothing ran."""
    from typer.testing import CliRunner

    from service.cli import app

    monkeypatch.chdir(tmp_path)
    marker = tmp_path / "ran"
    (tmp_path / "sentmod.py").write_text(f"open({str(marker)!r}, 'w').close()\ndef build():\n    pass\n")
    for workload, args in (("sentmod:build", "{}"), ("subprocess:run", f"{{args: [touch, {marker}]}}")):
        spec = tmp_path / "spec.yaml"
        spec.write_text(SPEC_WITH.format(workload=workload, args=args))
        out = CliRunner().invoke(app, ["run", str(spec), "--dry-run", "--results", str(tmp_path / "r")])
        assert "not imported in a dry run" in out.output, out.output
        assert "1x2" in out.output or "ddp" in out.output
        assert not marker.exists(), workload


def test_a_library_module_is_refused_before_it_is_imported_unless_allowed(monkeypatch):
    from trainers import workload
    from trainers.config import StepConfig
    from trainers.errors import ALLOW_WORKLOAD_ENV, ConfigError

    for path in ("subprocess:run", "shutil:rmtree", "numpy:ones", "os.path:join"):
        with pytest.raises(ConfigError) as e:
            workload.create(StepConfig(workload=path, workload_args="{}"))
        assert e.value.field == "workload" and f"--allow-workload {path.split(':')[0]}" in str(e.value)
    assert workload.refused("sweeps.examples.recsys:build") is None  # ddpsweep's own examples
    assert workload.refused("tests.dropout_workload:build") is None  # a user's module
    monkeypatch.setenv(ALLOW_WORKLOAD_ENV, "shutil")
    assert workload.refused("shutil:rmtree") is None and workload.refused("subprocess:run") is not None
