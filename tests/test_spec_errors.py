"""Specs that are wrong say so before anything runs: one line naming the field and the fix."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from results.sql.query import query
from results.storage.store import Store
from service.api import ServiceSettings, create_app
from service.cli import app
from sweeps.driver import runner
from sweeps.plan.planner import plan_sweep
from sweeps.spec.files import load_spec, load_spec_text, parse_spec
from sweeps.spec.sweep import SpecError
from tests.seed_rows import seed_rows


def test_a_spec_from_the_environment_is_never_echoed(monkeypatch):
    monkeypatch.setenv("DDPS_X", "password: hunter2")
    with pytest.raises(SpecError) as err:
        load_spec("env:DDPS_X")
    assert "hunter2" not in str(err.value) and err.value.field == "password"
    result = CliRunner().invoke(app, ["run", "env:DDPS_X", "--dry-run"])
    assert result.exit_code == 2 and "hunter2" not in result.output


def test_errors_quote_at_most_a_short_prefix_of_a_value():
    with pytest.raises(SpecError) as err:
        parse_spec("name: big\ngas: " + "x" * 100_000)  # the whole value is what is wrong
    assert len(str(err.value)) < 400 and "truncated" in str(err.value)


@pytest.mark.parametrize(
    ("text", "field", "says"),
    [
        ("name: a\ntimed_steps: 1:30\n", "timed_steps", "'1:30'"),  # YAML 1.1 would read 90
        ("name: a\ngas: [1]\ngas: [2]\n", "gas", "given twice"),  # the last one no longer wins silently
        (
            "name: a\n"
            + "x0: &a0 [1, 1, 1, 1, 1, 1, 1, 1, 1]\n"
            + "".join(f"x{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]\n" for i in range(1, 9)),
            "x",
            "too large",
        ),
        ("name: a\nenv: " + "[" * 900 + "]" * 900 + "\n", "spec", "nested too deeply"),
    ],
)
def test_yaml_traps_are_clear_errors(text, field, says):
    with pytest.raises(SpecError) as err:
        parse_spec(text)
    assert err.value.field.startswith(field) and says in str(err.value)


def test_yaml_numbers_are_yaml_1_2():
    spec = parse_spec("name: a\nbucket_cap_mb: [1e-3, 25]\ncollective_timeout_s: 1.5e2")
    assert spec.bucket_cap_mb == [0.001, 25] and spec.collective_timeout_s == 150.0


def test_a_dry_run_checks_the_grid_against_this_machine(tmp_path):
    spec = tmp_path / "big.yaml"
    spec.write_text("name: big\nworkers: [64]\nuse_gpu: false\n")
    result = CliRunner().invoke(app, ["run", str(spec), "--dry-run", "--results", str(tmp_path / "s")])
    assert result.exit_code == 2 and "error: workers:" in result.output and "unschedulable" in result.output


def test_http_spec_bodies_use_the_strict_loader(tmp_path):

    client = TestClient(create_app(ServiceSettings(address=None, results=str(tmp_path), token="t0k")))
    bomb = "name: a\nx0: &a0 [1, 1, 1, 1, 1, 1, 1, 1, 1]\n" + "".join(
        f"x{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]\n" for i in range(1, 9)
    )
    for body, says in ((bomb, "too large"), ("name: a\nname: b\n", "given twice")):
        r = client.post("/sweeps", content=body, headers={"Authorization": "Bearer t0k"})
        assert r.status_code == 422 and says in r.json()["error"]["message"] and len(r.content) < 2000


def invoke(*args: str):
    return CliRunner().invoke(app, list(args))


def test_strict_spread_on_one_node_is_refused_by_the_preflight(tmp_path):
    """It passed the dry run before, then burned 2 x cell_timeout_s and blamed the timeout."""
    spec = tmp_path / "s.yaml"
    spec.write_text("name: s\ntopology: [1x2]\nplacement: STRICT_SPREAD\n")
    out = invoke("run", str(spec), "--dry-run", "--results", str(tmp_path / "r"))
    assert out.exit_code == 2 and "STRICT_SPREAD puts every worker on its own node" in out.output
    assert invoke("run", str(spec).replace("s.yaml", "p.yaml"), "--dry-run").exit_code == 2  # no such file


def test_strict_pack_across_nodes_is_refused():
    from sweeps.plan.grid import expand
    from sweeps.plan.preflight import placement_problem
    from sweeps.spec.files import parse_spec

    cell = next(c for c in expand(parse_spec("name: s\ntopology: [2x1]\n")) if c.num_nodes == 2)
    assert "STRICT_PACK" in placement_problem(cell, "STRICT_PACK", 2)
    assert placement_problem(cell, "auto", 2) is None


def test_a_gpu_specs_dry_run_on_a_laptop_prints_the_grid_then_the_verdict():
    out = invoke("run", "sweeps/specs/seed.yaml", "--dry-run")
    assert out.exit_code == 2
    grid_at, verdict_at = out.output.index("78 measurements"), out.output.index("embedded Ray cannot run it")
    assert grid_at < verdict_at and "--address HEAD:6379" in out.output


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ("name: a\nworkers: [1, 2\n", "line 3, column 1: expected ',' or ']'"),
        ('name: "a\n', "line 2, column 1: found unexpected end of stream"),
        ("name: a\n  b: c\n", "line 2, column 4: mapping values are not allowed here"),
        ("name: a\n\tgas: 1\n", "line 2, column 1: found character '\\t'"),
    ],
)
def test_a_yaml_syntax_error_is_one_line_with_its_line_and_column(tmp_path, text, where):
    spec = tmp_path / "broken.yaml"
    spec.write_text(text)
    result = invoke("run", str(spec), "--dry-run")
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {spec}: got 'unparseable YAML'"), result.output
    assert where in lines[0]


def test_the_measurement_cap_counts_the_cells_the_grid_expands_to():
    from sweeps.plan.grid import expand
    from sweeps.spec.rules import cells_planned

    hooks = "comm_hook: [none, fp16, powersgd]\npowersgd_rank: [1, 2, 3, 4, 5, 6, 8, 12, 16, 24]\n"
    spec = parse_spec(f"name: x\nworkers: [2]\ngas: [1, 4]\nno_sync: [false, true]\nrepeats: 100\n{hooks}")
    # 38 cells x 100 rounds = 3,800 measurements: refused before as 12,000 (a product of the axis lengths)
    assert cells_planned(spec) == len(expand(spec)) == 2 + 3 * 12
    for text in (
        "gas: [1, 2]\nmodes: [ddp, naive]\nno_sync: [false, true]\n",
        "topology: [1x2, 2x1]\ntiming: [sync, loop]\n",
    ):
        spec = parse_spec(f"name: x\n{text}")
        assert cells_planned(spec) == len(expand(spec)), text
    with pytest.raises(SpecError, match="measurements"):  # still bounded: 10,001 and more
        parse_spec(
            "name: x\nworkers: [2]\nbucket_cap_mb: [" + ", ".join(str(b) for b in range(1, 1001)) + "]\nrepeats: 11\n"
        )


def test_static_graph_with_no_sync_under_accumulation_is_refused_before_ray():
    with pytest.raises(SpecError) as e:
        parse_spec("name: x\nstatic_graph: [false, true]\nno_sync: [true]\ngas: [1, 4]\n")
    assert e.value.field == "static_graph" and "no_sync" in e.value.allowed
    parse_spec("name: x\nstatic_graph: [true]\nno_sync: [true]\ngas: [1]\n")  # at gas 1 no_sync is off


def test_a_race_needs_two_rounds_before_its_first_decision():
    with pytest.raises(SpecError) as e:
        parse_spec("name: x\nsearch: race\nrepeats: 5\nmin_rounds: 1\nbucket_cap_mb: [1, 25]\n")
    assert e.value.field == "min_rounds"


def test_max_timed_steps_caps_the_first_batch_too():
    from trainers.config import StepConfig
    from trainers.step import run_cell

    cfg = StepConfig(mode="single", micro_batch=2, seq_len=8, warmup_steps=0, timed_steps=10)
    m = run_cell(cfg.__class__(**{**cfg.__dict__, "target_rel_ci": 1e-9, "max_timed_steps": 3}), torch.device("cpu"), 1)
    assert m.timed_steps_run == 3 and len(m.step_times_ms) == 3 and m.converged is False


def test_a_list_longer_than_any_axis_is_refused_while_parsing():
    import yaml

    from sweeps.spec.files import StrictLoader, _check_shape

    with pytest.raises(SpecError) as e:
        _check_shape(yaml.compose("bucket_cap_mb: [" + "1, " * 1500 + "1]\n", Loader=StrictLoader))
    assert e.value.field == "bucket_cap_mb" and "1501 values" in str(e.value)
    with pytest.raises(SpecError, match="given twice"):
        parse_spec("name: x\ngas: [1]\ngas: [2]\n")


def test_settings_without_effect_are_named_and_contradictions_refused(tmp_path):
    spec = parse_spec("name: x\ntolerance: 0.05\nmax_rounds: 4\npowersgd_rank: [2]\nsearch: grid\n")
    assert sorted(x.split(":")[0] for x in spec.unused()) == ["max_rounds", "powersgd_rank", "tolerance"]
    naive = parse_spec("name: x\nmodes: [naive]\nbucket_cap_mb: [1, 25]\n")
    assert naive.unused() == ["bucket_cap_mb: no effect with modes [naive] (a DDP setting)"]
    assert parse_spec("name: x\nsearch: race\nrepeats: 4\n").unused()[0].startswith("search: race")
    with pytest.raises(SpecError) as e:
        parse_spec("name: x\nbucket_cap_mb: [1, 25]\nfirst_bucket_mb: [null, 5]\n")
    assert e.value.field == "first_bucket_mb[1]"
    for text in ("01x2", "1x2\n"):
        with pytest.raises(SpecError):
            parse_spec(f"name: x\ntopology: [1x2, {json.dumps(text)}]\n")
    spec_file = tmp_path / "s.yaml"
    spec_file.write_text("name: x\nworkers: [2]\ntolerance: 0.05\n")
    out = CliRunner().invoke(app, ["run", str(spec_file), "--dry-run", "--results", str(tmp_path / "r")])
    assert "warning: tolerance: no effect without search: race or repeats: auto" in out.output


def test_a_resume_with_a_spec_that_measures_differently_names_the_field(tmp_path):
    from dataclasses import asdict

    from sweeps.plan.planner import plan_sweep

    first = parse_spec("name: r\nworkers: [2]\nrepeats: 2\n")
    plan = plan_sweep(first, results=str(tmp_path), sweep_id="r-1")
    plan.store.write_manifest(plan.cluster, "r-1", {"spec": asdict(first), "cells": [c.cell_id for c in plan.cells]})
    longer = parse_spec("name: r\nworkers: [2]\nrepeats: 5\n")
    with pytest.raises(SpecError) as e:
        plan_sweep(longer, results=str(tmp_path), resume="r-1")
    assert e.value.field == "repeats" and "r-1" in e.value.allowed
    patient = parse_spec("name: r\nworkers: [2]\nrepeats: 2\ncell_timeout_s: 60\n")
    assert plan_sweep(patient, results=str(tmp_path), resume="r-1").resumed


def test_unclear_errors_say_what_to_do(tmp_path):
    with pytest.raises(SpecError) as e:
        parse_spec("name: x\nenv_grid: {TORCH_DISTRIBUTED_DEBUG: [OFF, INFO]}\n")
    assert "quote it" in e.value.allowed
    assert parse_spec("\ufeffname: x\n").name == "x"

    store = Store.open(str(tmp_path))
    for r in seed_rows():
        store.write_row(r | {"status": "error", "error": "boom"})
    assert len(query(str(tmp_path), "select best_bucket_cap_mb from u_curve")) == 0


def test_preflight_names_the_spec_field_and_values_at_fault():
    from sweeps.plan import preflight
    from sweeps.plan.grid import expand

    res = preflight.ClusterResources(nodes=[(2.0, 0.0)])
    with pytest.raises(SpecError) as e:
        preflight.check(expand(parse_spec("name: x\nworkers: [3]\n")), res, 1.0, False)
    assert e.value.field == "workers" and e.value.value == [3]
    with pytest.raises(SpecError) as e:
        preflight.check(expand(parse_spec("name: x\nworkers: [2]\nnodes: [2]\n")), res, 1.0, False)
    assert e.value.field == "nodes" and e.value.value == [2]


def test_a_powersgd_rank_that_compresses_no_gradient_is_refused_at_torchs_own_boundary():
    from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import _should_compress

    from sweeps.plan.grid import expand
    from trainers.config import StepConfig
    from trainers.workload import planned, useful_powersgd_rank

    shapes = planned(StepConfig(model="tiny"))[1]
    useful = useful_powersgd_rank(shapes)
    matrices = [(s[0], int(np.prod(s[1:]))) for s in shapes if len(s) > 1]
    assert any(_should_compress(n, m, useful, 2)[0] for n, m in matrices)
    assert not any(_should_compress(n, m, useful + 1, 2)[0] for n, m in matrices)
    with pytest.raises(SpecError) as e:
        expand(parse_spec(f"name: x\ncomm_hook: [powersgd]\npowersgd_rank: [1, {useful + 1}]\n"))
    assert e.value.field == "powersgd_rank[1]" and f"at most {useful}" in e.value.allowed
    assert len(expand(parse_spec(f"name: x\ncomm_hook: [powersgd]\npowersgd_rank: [1, {useful}]\n"))) == 3


ROOT = Path(__file__).resolve().parent.parent


SMOKE = (ROOT / "sweeps/specs/smoke.yaml").read_text()


def smoke_with(field: str, line: str) -> str:
    """The smoke spec with `field` replaced by `line`."""
    kept = [x for x in SMOKE.splitlines() if not x.startswith(f"{field}:")]
    return "\n".join(kept + [line]) + "\n"


@pytest.mark.parametrize(
    ("field", "line", "named"),
    [
        ("micro_batch", "micro_batch: 100000000000000000000000000000", "micro_batch"),
        ("repeats", "repeats: 100000000", "repeats"),
        (
            "bucket_cap_mb",
            f"bucket_cap_mb: [{', '.join(str(b) for b in range(1, 1001))}]\ntiming: [sync, loop]",
            "repeats",
        ),
        ("bucket_cap_mb", "bucket_cap_mb: [1e-300]", "bucket_cap_mb[0]"),
        ("cell_timeout_s", "cell_timeout_s: 1.0e+308", "cell_timeout_s"),
        ("collective_timeout_s", "collective_timeout_s: 0.5", "collective_timeout_s"),
        ("group_start_timeout_s", "group_start_timeout_s: 0", "group_start_timeout_s"),
        ("env", 'env: {"NCCL_A=B": "1"}', "env.NCCL_A=B"),
    ],
)
def test_out_of_range_spec_values_name_their_field(field, line, named):
    with pytest.raises(SpecError) as e:
        parse_spec(smoke_with(field, line))
    assert e.value.field == named


def test_a_grid_over_the_cap_says_the_cap():
    with pytest.raises(SpecError, match="at most 10000 measurements"):
        # 2 baselines + 1000 buckets x (gas 1, gas 2 with and without no_sync) = 3002 cells x 4 rounds
        buckets = f"bucket_cap_mb: [{', '.join(str(b) for b in range(1, 1001))}]"
        parse_spec(smoke_with("bucket_cap_mb", buckets).replace("repeats: 3", "repeats: 4"))


def test_a_non_utf8_spec_file_is_a_clear_error(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_bytes(b"name: x\n\xff\xfe: 1\n")
    with pytest.raises(SpecError, match="UTF-8"):
        load_spec(bad)


def test_submit_reads_the_spec_text_from_the_environment(monkeypatch):
    monkeypatch.setenv("MYSPEC", SMOKE)
    spec, text = load_spec_text("env:MYSPEC")
    assert text == SMOKE and spec.name == "smoke"


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="checks a CPU-only machine")
def test_nccl_on_a_cpu_only_machine_is_refused_before_ray_starts(tmp_path):
    spec = parse_spec(smoke_with("backend", "backend: nccl").replace("use_gpu: false", "use_gpu: auto"))
    plan = plan_sweep(spec, results=str(tmp_path))
    with pytest.raises(SpecError) as e:
        runner.check_local(plan)
    assert e.value.field == "backend" and "NCCL needs GPUs" in str(e.value)


def test_a_dry_run_of_the_scaling_spec_never_touches_its_store():
    # its results root is s3://my-bucket/…, unreachable here; --address skips this machine's pre-flight
    cmd = [
        sys.executable,
        "-m",
        "service.cli",
        "run",
        "sweeps/specs/scaling.yaml",
        "--dry-run",
        "--address",
        "http://127.0.0.1:9",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "measurements in" in proc.stdout and "error" not in proc.stderr.lower()
