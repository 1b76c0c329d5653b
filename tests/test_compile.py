"""Compiled steps (`compile`, `optimize_ddp`): DDP's invariants under every mode on a gloo world (aot_eager: the
traced graphs run eagerly, so the tier stays quick), the known failure as an error, a skipped all-reduce as a
failed cell, and the axes in the grid, the ids and recommend."""

from __future__ import annotations

import dataclasses

import pandas as pd
import pytest

from results.analysis import recommend
from sweeps.plan.grid import expand
from sweeps.spec.files import parse_spec
from sweeps.spec.rules import cells_planned
from tests.dist_helpers import run_world
from tests.test_identity import base
from tests.test_trainer_dist import BASE, CPU
from trainers import replica, step
from trainers.config import StepConfig
from trainers.errors import StepError

COMPILED = dataclasses.replace(
    BASE, compile=True, compile_backend="aot_eager", warmup_steps=2, timed_steps=2, bucket_cap_mb=1.0
)
MODES = {
    "ddp_optimizer": dict(optimize_ddp="ddp_optimizer"),
    "ddp_optimizer-no_sync": dict(optimize_ddp="ddp_optimizer", gas=3, no_sync=True),
    "python_reducer": dict(optimize_ddp="python_reducer", bucket_cap_mb=0.25),
    "python_reducer-sync-every-micro-step": dict(optimize_ddp="python_reducer", gas=2),
    "no_optimization": dict(optimize_ddp="no_optimization", bucket_cap_mb=0.25),
    "first-bucket-too-big": dict(optimize_ddp="ddp_optimizer", bucket_cap_mb=0.25),  # PyTorch refuses it
    "naive": dict(mode="naive", gas=2),
    "eager": dict(compile=False),
}


def measured_or_error(rank: int, cfgs: list[StepConfig]) -> list:
    out = []
    for cfg in cfgs:
        try:
            out.append(step.run_cell(cfg, CPU, 1))
        except Exception as e:  # noqa: BLE001 — the worker turns it into an error row the same way
            out.append(f"{type(e).__name__}: {e}")
        step.release(CPU)
    params = len(list(replica.build_model(cfgs[0], CPU).model.parameters()))
    return out, params


@pytest.mark.slow
def test_every_compile_mode_keeps_ddp_exact_in_sync_and_communicating(tmp_path):
    """Per mode: the gradient equals the full-batch gradient within fp32's bound (no_sync and syncing every
    micro-step alike), replicas stay bit-identical, the all-reduces really ran (the Python reducer one per
    parameter, the reducer's modes one per bucket), the timed steps compiled nothing, and the split graphs
    of ddp_optimizer outnumber no_optimization's one. PyTorch's first-bucket refusal is an error and the cells
    after it run."""
    cfgs = [dataclasses.replace(COMPILED, **knobs) for knobs in MODES.values()]
    (out, params), (rest, _) = run_world(measured_or_error, 2, tmp_path, cfgs)
    got = dict(zip(MODES, out, strict=True))
    assert "First bucket should be smaller/equal" in got.pop("first-bucket-too-big")
    for name, m in got.items():
        assert not isinstance(m, str), (name, m)
        assert m.grad_check == "exact" and m.grad_rel_error <= m.grad_tol < 1e-5, (name, m.grad_rel_error)
        assert m.replicas_in_sync, name
        assert m.collectives_per_step > 0, name
        if name != "eager":
            assert m.recompiles_timed == 0 and m.compile_s > 0 and m.compiled_graphs >= 1, name
    assert got["eager"].compile_s is None and got["eager"].compiled_graphs is None
    assert got["python_reducer"].collectives_per_step == params  # one all-reduce per parameter, every step
    assert got["python_reducer-sync-every-micro-step"].collectives_per_step == 2 * params
    assert got["ddp_optimizer"].collectives_per_step == got["ddp_optimizer"].num_buckets >= 2
    assert got["ddp_optimizer-no_sync"].collectives_per_step == got["ddp_optimizer-no_sync"].num_buckets  # last only
    assert got["no_optimization"].collectives_per_step == got["no_optimization"].num_buckets
    assert got["naive"].collectives_per_step == 2 * params  # one per .grad per synced micro-step
    assert got["ddp_optimizer"].compiled_graphs > got["no_optimization"].compiled_graphs == 1
    assert rest == [o if isinstance(o, str) else None for o in out]  # rank 1: the same refusal, no measurement


def skipping_sync(rank: int, cfg: StepConfig) -> str:
    """A compiled DDP step whose gradients are never all-reduced (as the silent skips reported upstream do)."""

    def never_synced(rep):
        return rep.module.no_sync()

    real, replica.micro_step_context = replica.micro_step_context, never_synced
    try:
        step.run_cell(cfg, CPU, 1)
    except StepError as e:
        return str(e)
    finally:
        replica.micro_step_context = real  # the world's processes serve later tests
    return "measured"


def test_a_step_that_runs_no_all_reduce_fails_instead_of_reporting_a_fast_step(tmp_path):
    cfg = dataclasses.replace(COMPILED, optimize_ddp="no_optimization")
    out = run_world(skipping_sync, 2, tmp_path, cfg)
    assert out[0] == out[1] and "ran no all-reduce" in out[0] and "optimize_ddp no_optimization" in out[0], out


def test_compile_is_an_axis_crossing_baselines_and_optimize_ddp_only_compiled_ddp_cells():
    base = "name: c\nworkers: [2]\nbucket_cap_mb: [0.25, 25]\nmodes: [ddp, naive]\n"
    eager = parse_spec(base)
    spec = parse_spec(base + "compile: [false, true]\noptimize_ddp: [ddp_optimizer, python_reducer]\n")
    cells = expand(spec)
    assert cells_planned(spec) == len(cells) == 2 + 2 * (1 + 2) + 2  # baselines, ddp eager + compiled x modes, naive
    singles = [c.step for c in cells if c.step.mode == "single"]
    assert sorted(s.compile for s in singles) == [False, True]
    assert all(s.optimize_ddp is None for s in singles)  # DDP's mode reads null where there is no DDP
    compiled = [c.step for c in cells if c.step.compile and c.step.mode == "ddp"]
    assert {(s.optimize_ddp, s.compile_backend, s.compile_mode) for s in compiled} == {
        ("ddp_optimizer", "inductor", "default"),
        ("python_reducer", "inductor", "default"),
    }
    eager_ids = {c.cell_id for c in expand(eager)}
    assert eager_ids <= {c.cell_id for c in cells}  # an eager cell keeps the id it had before compile existed
    assert len({c.cell_id for c in cells}) == len(cells)
    fast = parse_spec(base + "compile: [true]\ncompile_backend: aot_eager\n")
    assert not {c.cell_id for c in expand(fast)} & {c.cell_id for c in cells}  # a non-default backend is another id


def test_known_failures_and_settings_without_compile_are_warned_not_refused():
    text = "name: c\ncompile: [true]\noptimize_ddp: [ddp_optimizer, python_reducer]\nbucket_cap_mb: [0.25, 25]\n"
    spec = parse_spec(text + "comm_hook: [none, fp16]\n")
    lines = spec.warnings()
    assert any(line.startswith("optimize_ddp ddp_optimizer with bucket_cap_mb 0.25: known to fail") for line in lines)
    assert any(line.startswith("optimize_ddp python_reducer with fp16: known to fail") for line in lines)
    eager = parse_spec("name: c\ncompile_backend: aot_eager\n")
    assert eager.warnings() == ["compile_backend: no effect without compile: [true]"]
    with pytest.raises(Exception, match=r"optimize_ddp\[0\].*ddp_optimizer, python_reducer, no_optimization"):
        parse_spec("name: c\ncompile: [true]\noptimize_ddp: [fast]\n")


def curve_rows(times: dict[tuple, float]) -> pd.DataFrame:
    """Ok rows of one curve over four rounds: (compile, optimize_ddp, bucket) -> step ms."""
    rows = []
    for rep in range(4):
        for (comp, mode, bucket), ms in times.items():
            cfg = StepConfig(bucket_cap_mb=bucket, compile=comp, optimize_ddp=mode, gradient_as_bucket_view=False)
            knobs = {k: getattr(cfg, k) for k in ("compile", "optimize_ddp", "compile_backend", "compile_mode")}
            rows.append(
                base("a", rep, ms)
                | knobs
                | {"cell_id": f"{comp}-{mode}-{bucket}", "bucket_cap_mb": bucket, "gradient_as_bucket_view": False}
            )
    return pd.DataFrame(rows)


def test_recommend_picks_a_compiled_configuration_with_both_gains_and_the_code_to_paste():
    times = {
        (False, None, 25.0): 100.0,
        (False, None, 1.0): 99.0,
        (True, "ddp_optimizer", 25.0): 80.0,
        (True, "python_reducer", 25.0): 60.0,
    }
    (rec,) = recommend.recommend(curve_rows(times))
    assert rec["recommended"]["compile"] is True and rec["recommended"]["optimize_ddp"] == "python_reducer"
    assert rec["default"]["compile"] is False and rec["default"]["bucket_cap_mb"] == 25.0  # the eager defaults
    assert rec["gain"] == pytest.approx(100 / 60 - 1)
    assert rec["compiled_default"]["optimize_ddp"] == "ddp_optimizer"
    assert (
        rec["gain_over_compiled"]["gain"] == pytest.approx(80 / 60 - 1) and rec["gain_over_compiled"]["gain_ci_lo"] > 0
    )
    lines = rec["snippet"].splitlines()
    wrap = next(i for i, line in enumerate(lines) if line.startswith("model = DistributedDataParallel(model, "))
    assert lines.index("torch._dynamo.config.optimize_ddp = 'python_reducer'") < wrap  # DDP reads it when built
    assert lines[wrap + 1].startswith("model = torch.compile(model)")  # compiled after wrapping
    assert any(line.startswith("model = torch.compile(model)") for line in lines)
    text = recommend.to_text([rec])
    assert "torch.compile (optimize_ddp python_reducer)" in text and "compiled: +33.3%" in text
    eager_only = {k: v for k, v in times.items() if not k[0]}
    (rec,) = recommend.recommend(curve_rows(eager_only))
    assert "gain_over_compiled" not in rec and "torch.compile" not in rec["snippet"]


def test_a_compiled_cell_restores_the_process_wide_settings_it_changed():
    import torch._dynamo
    import torch._inductor.config as inductor

    from trainers import compiled

    before = (torch._dynamo.config.optimize_ddp, inductor._fuse_ddp_communication, inductor._fuse_ddp_bucket_size)
    with compiled.use(dataclasses.replace(COMPILED, optimize_ddp="python_reducer")):
        assert torch._dynamo.config.optimize_ddp == "python_reducer"
        inductor._fuse_ddp_communication = True  # as DDP's Python reducer does when it is built
    after = (torch._dynamo.config.optimize_ddp, inductor._fuse_ddp_communication, inductor._fuse_ddp_bucket_size)
    assert after == before
    counter = compiled.GraphCounter("aot_eager", "default")
    fn = torch.compile(lambda x: torch.sin(x) + 1, backend=counter)
    fn(torch.ones(3))
    fn(torch.ones(3))
    assert counter.graphs == 1


def test_the_cli_warns_of_a_known_failure_and_still_plans_its_cells(tmp_path):
    from typer.testing import CliRunner

    from service.cli import app

    spec = tmp_path / "c.yaml"
    spec.write_text("name: c\nworkers: [2]\ncompile: [true]\nbucket_cap_mb: [0.25, 25]\n")
    result = CliRunner().invoke(app, ["run", str(spec), "--dry-run", "--results", str(tmp_path / "r")])
    assert result.exit_code == 0, result.output
    assert "warning: optimize_ddp ddp_optimizer with bucket_cap_mb 0.25: known to fail" in result.output
    assert "3 cells x 1 repeat(s) = 3 measurements" in result.output  # the refused cell is measured all the same
