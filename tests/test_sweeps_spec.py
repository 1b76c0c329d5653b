"""Tier 1: spec validation, grid expansion, cell identity and pre-flight (no Ray)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from sweeps.grid import cells_table, expand
from sweeps.preflight import ClusterResources, cell_problem, check
from sweeps.spec import SpecError, load_spec, parse_spec

SPECS = Path(__file__).resolve().parent.parent / "sweeps" / "specs"


@pytest.mark.parametrize(
    ("text", "field", "allowed"),
    [
        ("name: x\nbucket_caps: [1]", "bucket_caps", "a known field"),
        ("name: x\nbucket_cap_mb: [25, -1]", "bucket_cap_mb[1]", "a number > 0"),
        ("name: x\ngas: []", "gas", "a non-empty list"),
        ("name: x\nworkers: 2", "workers", "a non-empty list"),
        ("name: x\nno_sync: [yes, 0]", "no_sync[1]", "true or false"),
        ("name: x\nmodes: [ddp, fsdp]", "modes[1]", "one of ddp, naive"),
        ("name: x\nplacement: CLOSE", "placement", "STRICT_SPREAD"),
        ("name: x\nenv: {PATH: /bin}", "env.PATH", "NCCL_"),
        ("name: ../etc\n", "name", "a label"),
        ("name: x\nseq_len: 4096", "seq_len", "1..128"),
        ("name: x\nworkers: [3]\nnodes: [2]", "nodes", "divide"),
        ("name: x\nrepeats: 0", "repeats", ">= 1"),
        ("bucket_cap_mb: [1]", "name", "required"),
        ("- 1\n- 2", "spec", "a mapping"),
        ("name: x\ncell_timeout_s: .nan", "cell_timeout_s", "> 0"),
    ],
)
def test_bad_spec_names_the_dotted_field(text, field, allowed):
    with pytest.raises(SpecError) as err:
        parse_spec(text)
    assert err.value.field == field
    assert allowed in str(err.value)


def test_example_specs_are_valid_and_the_seed_spec_is_the_seed_experiment():
    smoke, seed, scaling = (load_spec(SPECS / f"{n}.yaml") for n in ("smoke", "seed", "scaling"))
    assert smoke.model == "tiny" and smoke.workers == [2] and set(smoke.no_sync) == {True, False}
    assert (seed.model, seed.micro_batch, seed.seq_len) == ("gpt2-124m", 12, 1024)
    assert (seed.warmup_steps, seed.timed_steps, seed.workers) == (10, 30, [8])
    assert min(seed.bucket_cap_mb) == 1 and max(seed.bucket_cap_mb) == 500 and 25 in seed.bucket_cap_mb
    assert max(scaling.nodes) > 1 and 1 in scaling.workers


def test_expansion_dedupes_no_sync_at_gas_1_and_adds_baselines():
    spec = parse_spec("name: g\nbucket_cap_mb: [1, 25]\ngas: [1, 4]\nno_sync: [false, true]")
    cells = expand(spec)
    singles = [c for c in cells if c.step.mode == "single"]
    assert [c.step.gas for c in singles] == [1, 4]
    assert all(c.world_size == 1 and c.step.bucket_cap_mb is None and not c.step.no_sync for c in singles)
    ddp = [c for c in cells if c.step.mode == "ddp"]
    assert len(ddp) == 2 * (1 + 2)  # buckets x (gas 1: one cell, gas 4: no_sync both)
    assert not any(c.step.no_sync for c in ddp if c.step.gas == 1)
    assert len({c.cell_id for c in cells}) == len(cells)


def test_cell_ids_are_stable_and_depend_on_configuration():
    a = expand(parse_spec("name: a\nbucket_cap_mb: [25]"))
    b = expand(parse_spec("name: b\ncluster: other\nbucket_cap_mb: [25]\nrepeats: 3"))
    assert [c.cell_id for c in a] == [c.cell_id for c in b]  # the name, cluster and repeats are not the cell
    c = expand(parse_spec("name: a\nbucket_cap_mb: [25]\nmicro_batch: 4"))
    assert {x.cell_id for x in a}.isdisjoint({x.cell_id for x in c})
    assert a[1].cell_id == "628dd28eed30"  # pinned: a silent change of the hash would orphan stored rows


def test_naive_mode_ignores_buckets_and_dry_run_table_counts_trials():
    spec = parse_spec("name: n\nmodes: [ddp, naive]\nbucket_cap_mb: [1, 5, 25]\nrepeats: 2")
    cells = expand(spec)
    assert sum(c.step.mode == "naive" for c in cells) == 1
    text = cells_table(cells, spec.repeats)
    assert text.splitlines()[-1] == "5 cells x 2 repeat(s) = 10 measurements in 2 worker group(s)"
    assert text.count("naive") == 1


def test_preflight_names_what_is_missing():
    spec = parse_spec("name: p\nworkers: [2, 4]\nnodes: [1, 2]")
    cells = expand(spec)
    two_small_nodes = ClusterResources(nodes=[(2.0, 0.0), (2.0, 0.0)])
    by_shape = {(c.world_size, c.num_nodes): cell_problem(c, two_small_nodes, 1.0, False) for c in cells}
    assert by_shape[(2, 1)] is None and by_shape[(2, 2)] is None and by_shape[(4, 2)] is None
    assert "2 worker(s) of 1 CPU on each of 1 node" not in (by_shape[(4, 1)] or "")
    assert "needs 4 worker(s) of 1 CPU on each of 1 node(s)" in by_shape[(4, 1)]
    with pytest.raises(SpecError) as err:
        check(cells, two_small_nodes, 1.0, False)
    assert err.value.field == "workers" and "unschedulable" in str(err.value)
    gpu_cell = dataclasses.replace(cells[0])
    assert "GPU" in cell_problem(gpu_cell, ClusterResources(nodes=[(8.0, 0.0)]), 1.0, True)
    assert "needs 2 nodes" in cell_problem(
        next(c for c in cells if c.num_nodes == 2), ClusterResources(nodes=[(64.0, 0.0)]), 1.0, False
    )


def test_resume_refuses_an_unknown_sweep_and_a_changed_grid(tmp_path):
    from results.store import Store
    from sweeps.runner import plan_sweep

    spec = parse_spec("name: r\nbucket_cap_mb: [1, 25]")
    with pytest.raises(SpecError) as err:
        plan_sweep(spec, results=str(tmp_path), resume="nope")
    assert err.value.field == "--resume" and "a sweep id under cluster=local" in str(err.value)
    Store.open(str(tmp_path)).write_manifest("local", "r-1", {"cells": [c.cell_id for c in expand(spec)]})
    todo = plan_sweep(spec, results=str(tmp_path), resume="r-1").todo
    assert [c.step.mode for c, _ in todo] == ["single", "ddp", "ddp"]
    with pytest.raises(SpecError, match="grid differs"):
        plan_sweep(parse_spec("name: r\nbucket_cap_mb: [1, 5]"), results=str(tmp_path), resume="r-1")
    with pytest.raises(SpecError) as bad_label:
        plan_sweep(spec, results=str(tmp_path), cluster="../up")
    assert bad_label.value.field == "--cluster"
