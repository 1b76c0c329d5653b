"""Tier 1: spec validation, grid expansion, cell identity and pre-flight (no Ray)."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from results.errors import LabelError
from sweeps.driver.summary import cells_table
from sweeps.plan.grid import expand
from sweeps.plan.preflight import ClusterResources, cell_problem, check
from sweeps.spec.files import load_spec, parse_spec
from sweeps.spec.sweep import SpecError
from trainers import workload
from trainers.config import StepConfig

ROOT = Path(__file__).resolve().parent.parent

SPECS = ROOT / "sweeps" / "specs"


@pytest.mark.parametrize(
    ("text", "field", "allowed"),
    [
        ("name: x\nbucket_caps: [1]", "bucket_caps", "a known field (did you mean bucket_cap_mb?): backend, "),
        ("name: x\nbuckets: [1]", "buckets", "a known field (did you mean bucket_cap_mb?)"),
        ("name: x\ngradient_accumulation_steps: [4]", "gradient_accumulation_steps", "(did you mean gas?)"),
        ("name: x\nworld_size: [8]", "world_size", "(did you mean workers?)"),
        ("name: x\nblock_size: 1024", "block_size", "(did you mean seq_len?)"),
        ("name: x\nno-sync: [true]", "no-sync", "(did you mean no_sync?)"),
        ("name: x\nflavour: 2", "flavour", "allowed: a known field: backend, "),
        ("name: x\nbucket_cap_mb: [25, -1]", "bucket_cap_mb[1]", "a number in [0.001, 100000]"),
        ("name: x\ngas: []", "gas", "a non-empty list"),
        ("name: x\nworkers: 2", "workers", "a non-empty list; for one value write workers: [2]"),
        ("name: x\nbucket_cap_mb: 25", "bucket_cap_mb", "a non-empty list; for one value write bucket_cap_mb: [25]"),
        ("name: x\nno_sync: true", "no_sync", "for one value write no_sync: [true]"),
        ("name: x\nno_sync: [yes, 0]", "no_sync[1]", "true or false"),
        ("name: x\nmodes: [ddp, fsdp]", "modes[1]", "one of ddp, naive"),
        ("name: x\nplacement: CLOSE", "placement", "STRICT_SPREAD"),
        ("name: x\nenv: {PATH: /bin}", "env.PATH", "NCCL_"),
        ("name: ../etc\n", "name", "a label"),
        ("name: x\nseq_len: 4096", "seq_len", "1..128"),
        ("name: x\nworkers: [3]\nnodes: [2]", "nodes", "divide"),
        ("name: x\nrepeats: 0", "repeats", "[1, 1000], or auto"),
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
    assert scaling.topology == ["1x1", "1x2", "1x4", "1x8", "2x8", "4x8"]
    ddp = {c.topology: (c.world_size, c.num_nodes) for c in expand(scaling) if c.step.mode == "ddp"}
    assert ddp == {"1x1": (1, 1), "1x2": (2, 1), "1x4": (4, 1), "1x8": (8, 1), "2x8": (16, 2), "4x8": (32, 4)}


@pytest.mark.parametrize(
    ("text", "field", "allowed"),
    [
        ("name: t\ntopology: [2x8]\nworkers: [16]", "topology", "either topology or workers, not both"),
        ("name: t\ntopology: [2x8]\nnodes: [2]", "topology", "either topology or nodes, not both"),
        ("name: t\ntopology: [2*8]", "topology[0]", "<nodes>x<workers per node>"),
        ("name: t\ntopology: [0x8]", "topology[0]", "<nodes>x<workers per node>"),  # YAML 1.2: 0x8 is hex 8
        ("name: t\ntopology: [1x0]", "topology[0]", "at most 65536 workers"),
        ("name: t\ntopology: [1x2, 1x2]", "topology", "without duplicates"),
        ("name: t\ntopology: []", "topology", "a non-empty list"),
        ("name: t\ntopology: 1x2", "topology", "for one value write topology: [1x2]"),
    ],
)
def test_topology_errors_name_the_field(text, field, allowed):
    with pytest.raises(SpecError) as err:
        parse_spec(text)
    assert err.value.field == field and allowed in str(err.value)


def test_a_topology_grid_is_the_same_cells_as_workers_and_nodes():
    by_topology = expand(parse_spec("name: t\ntopology: [1x2, 2x1, 2x2]\nbucket_cap_mb: [1, 25]"))
    by_axes = expand(parse_spec("name: t\nworkers: [2, 4]\nnodes: [1, 2]\nbucket_cap_mb: [1, 25]"))
    assert {c.cell_id for c in by_topology} < {c.cell_id for c in by_axes}  # same ids: stored rows stay valid
    assert sorted(c.topology for c in by_topology if c.step.mode == "ddp") == ["1x2", "1x2", "2x1", "2x1", "2x2", "2x2"]
    assert "4x1" not in {c.topology for c in by_topology}  # crossing workers x nodes adds 1x4; topology does not
    text = cells_table(by_topology)
    assert text.splitlines()[0].split()[:4] == ["cell_id", "mode", "topology", "workers"]


def test_preflight_checks_topologies_node_by_node():
    cells = expand(parse_spec("name: t\ntopology: [1x2, 2x2, 1x4]"))
    two_nodes = ClusterResources(nodes=[(2.0, 0.0), (3.0, 0.0)])  # 5 CPUs in all, but 2 and 3 per node
    with pytest.raises(SpecError) as err:
        check(cells, two_nodes, 1.0, False, field="topology")
    message = str(err.value)
    assert err.value.field == "topology" and "2 node(s): 2 CPU/0 GPU, 3 CPU/0 GPU" in message
    assert "topology 1x4): needs 4 worker(s) of 1 CPU on each of 1 node(s); the best 1 node(s) fit [3]" in message
    assert "topology 2x2" not in message and "topology 1x2" not in message  # 2 + 2 fit on nodes of 3 and 2


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
    one = cells_table(cells, spec.repeats, spec.isolation)  # the default, isolation: sweep
    assert one.splitlines()[-1] == "5 cells x 2 repeat(s) = 10 measurements in 1 worker group(s)"
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
    from results.storage.store import Store
    from sweeps.plan.planner import plan_sweep

    spec = parse_spec("name: r\nbucket_cap_mb: [1, 25]")
    with pytest.raises(SpecError) as err:
        plan_sweep(spec, results=str(tmp_path), resume="nope")
    assert err.value.field == "--resume" and "a sweep id under cluster=local" in str(err.value)
    Store.open(str(tmp_path)).write_manifest("local", "r-1", {"cells": [c.cell_id for c in expand(spec)]})
    todo = plan_sweep(spec, results=str(tmp_path), resume="r-1").todo
    assert [c.step.mode for c, _ in todo] == ["single", "ddp", "ddp"]
    with pytest.raises(SpecError, match="grid differs"):
        plan_sweep(parse_spec("name: r\nbucket_cap_mb: [1, 5]"), results=str(tmp_path), resume="r-1")
    with pytest.raises(LabelError) as bad_label:
        plan_sweep(spec, results=str(tmp_path), cluster="../up")
    assert bad_label.value.field == "--cluster"


def test_groups_follow_the_worker_group_shape_in_interleaved_rounds():
    from sweeps.plan.grid import plan_groups

    spec = parse_spec("name: g\nworkers: [2]\nbucket_cap_mb: [1, 5, 25]\ngas: [1, 2]\nno_sync: [true]\nrepeats: 5")
    cells = expand(spec)
    pairs = [(c, r) for c in cells for r in range(5)]
    groups = plan_groups(pairs, sweep_id="s-1")
    assert [g.first.world_size for g in groups] == [1, 2]  # baselines form their own group
    single, ddp = groups
    assert len(single.slots) == 2 * 5 and len(ddp.slots) == 6 * 5
    for g in groups:
        assert sorted((s.cell.cell_id, s.repeat) for s in g.slots) == sorted(
            (c.cell_id, r) for c, r in pairs if c.group_key == g.first.group_key
        )
        assert [s.round for s in g.slots] == sorted(s.round for s in g.slots) and all(
            s.round == s.repeat for s in g.slots
        )
        ids = [s.cell.cell_id for s in g.slots]
        assert all(a != b for a, b in zip(ids, ids[1:], strict=False))  # no cell twice in a row
    orders = [[s.cell.cell_id for s in ddp.slots if s.round == r] for r in range(5)]
    assert len({tuple(o) for o in orders}) > 1  # rounds are shuffled, not repeated
    assert plan_groups(pairs, sweep_id="s-1") == groups  # the order is reproducible from the seed
    isolated = plan_groups(pairs, sweep_id="s-1", isolation="cell")  # a worker group per measurement
    assert [len(g.slots) for g in isolated] == [1] * 40 and len({g.group_id for g in isolated}) == 40


def test_group_key_is_what_shapes_a_worker_group():
    spec = parse_spec("name: k\nworkers: [2, 4]\nbucket_cap_mb: [1, 25]\ngas: [1, 4]\nno_sync: [true]")
    keys = {c.group_key for c in expand(spec)}
    fp = expand(spec)[0].step.workload_fingerprint  # the model's shapes: a workload of another shape never joins
    assert len(fp) == 12 and int(fp, 16) >= 0
    assert keys == {(w == 1, w, 1, "auto", "tiny", None, "{}", fp, 8, 64, 1337, "{}") for w in (1, 2, 4)}
    at_one = expand(parse_spec("name: k\nworkers: [1]\nbucket_cap_mb: [1, 25]"))
    assert len({c.group_key for c in at_one}) == 2  # ddp at world size 1 does not join the baselines


def test_schema_holds_the_step_configuration_and_the_measurement():
    from results.storage.schema import CONFIGURATION

    assert [f.name for f in CONFIGURATION] == [f.name for f in dataclasses.fields(StepConfig)]


def test_every_measured_field_is_stored_and_read_back_as_measured(tmp_path):
    """A measurement with every field set (nested lists too) written by the row writer and read by the reader."""
    from results.storage.store import Store, load
    from tests.seed_rows import seed_rows
    from trainers.knobs import Measurement

    measured = Measurement(
        **{"backend": "gloo", "device_type": "cpu", "n_params": 7, "grad_bytes": 28, "num_threads": 1},
        **{"setup_ms": 1.5, "warmup_ms": 2.5, "step_ms": 10.0, "step_ms_mean": 10.5, "step_ms_p10": 9.0},
        **{"step_ms_p90": 12.0, "step_ms_cv": 0.1, "tokens_per_s": None, "samples_per_s": 800.0},
        **{"peak_mem_bytes": 2**40, "num_buckets": 2, "bucket_sizes_bytes": [16, 12], "step_times_ms": [9.0, 12.0]},
        **{"comm_timeline_ms": [[0, 1.0, 2.0], [1, 2.5, 3.0]], "rank_compute_ms": [[4.0, 4.5], [5.0, 5.5]]},
        **{"rank_wait_ms": [1.0, 0.5], "converged": False, "grad_check": "exact", "compiled_graphs": 3},
    )
    row = next(r for r in seed_rows() if r["mode"] == "ddp")
    Store.open(str(tmp_path)).write_row(row | measured.to_dict())
    back = load(str(tmp_path)).iloc[0]
    for name, value in measured.to_dict().items():
        got = back[name]
        got = got.tolist() if hasattr(got, "tolist") else got
        got = [list(x) if hasattr(x, "__len__") else x for x in got] if isinstance(got, list) else got
        assert (got is None or got != got) if value is None else got == value, name


def test_a_baseline_row_keeps_its_configuration_from_spec_to_parquet(tmp_path):
    from datetime import UTC, datetime

    from results.storage.store import Store, load
    from sweeps.plan.grid import plan_groups
    from sweeps.trial.rows import RowContext, build_row

    cells = expand(parse_spec("name: b\nbucket_cap_mb: [25]"))
    single, ddp = plan_groups([(c, 0) for c in cells], sweep_id="b-1")
    now = datetime.now(UTC)
    ctx = RowContext(
        sweep_id="b-1",
        cluster="local",
        spec_name="b",
        cpus_per_worker=1.0,
        placement="STRICT_PACK",
        backend="gloo",
        isolation="group",
        group_id=ddp.group_id,
        order_seed=ddp.order_seed,
        group_started_at=now,
        group_setup_s=7.5,
    )
    store = Store.open(str(tmp_path))
    for group in (single, ddp):
        store.write_row(build_row(group.slots[0], ctx, started=now, wall_s=1.0, error="boom"))
    rows = load(str(tmp_path)).set_index("mode")
    assert rows["bucket_cap_mb"].isna()["single"] and rows["gradient_as_bucket_view"].isna()["single"]
    assert rows.loc["ddp", "bucket_cap_mb"] == 25.0 and rows.loc["ddp", "gradient_as_bucket_view"]
    assert rows.loc["ddp", "tokens_per_step"] == 8 * 64 * 2 and rows.loc["ddp", "group_setup_s"] == 7.5
    assert set(rows["status"]) == {"error"} and set(rows["error"]) == {"boom"}


def test_timed_steps_auto_becomes_adaptive_step_configs():
    auto = expand(parse_spec("name: a\ntimed_steps: auto\ntarget_rel_ci: 0.05\nmax_timed_steps: 80"))
    fixed = expand(parse_spec("name: a\ntimed_steps: 10"))
    assert {(c.step.target_rel_ci, c.step.max_timed_steps, c.step.timed_steps) for c in auto} == {(0.05, 80, 10)}
    assert {c.step.target_rel_ci for c in fixed} == {None}
    assert {c.cell_id for c in auto}.isdisjoint({c.cell_id for c in fixed})
    for text, field in [("timed_steps: often", "timed_steps"), ("target_rel_ci: 2", "target_rel_ci")]:
        with pytest.raises(SpecError) as err:
            parse_spec(f"name: a\n{text}")
        assert err.value.field == field


def test_preset_cell_ids_are_those_stored_sweeps_hold():
    """Workload fields joined StepConfig: preset cells keep the ids they had (computed before that change)."""
    spec = parse_spec("name: k\nworkers: [2]\nbucket_cap_mb: [1, 25]\ngas: [1, 2]\nno_sync: [true]")
    assert [c.cell_id for c in expand(spec)] == [
        "abc29d078f7f",
        "cd377c03e57d",
        "0546ddead76a",
        "628dd28eed30",
        "32c120a6ff9e",
        "5f58d115de5b",
    ]


def test_a_workload_spec_names_the_workload_and_its_fingerprint_joins_the_cell_id():
    text = 'name: w\nworkload: "sweeps.examples.recsys:build"\nworkload_args: {rows: 1000, dim: 4}\nworkers: [2]\n'
    cells = expand(parse_spec(text))
    assert {c.step.model for c in cells} == {"sweeps.examples.recsys:build"}
    assert {c.step.workload_args for c in cells} == {'{"dim":4,"rows":1000}'}
    other = expand(parse_spec(text.replace("dim: 4", "dim: 8")))  # another shape: other fingerprint, other ids
    assert cells[0].step.workload_fingerprint != other[0].step.workload_fingerprint
    assert {c.cell_id for c in cells}.isdisjoint(c.cell_id for c in other)


@pytest.mark.parametrize(
    "fields",
    [{"model": "tiny", "seq_len": 64}, {"model": "gpt2-124m", "seq_len": 1024}]
    + [{"workload": "sweeps.examples.recsys:build", "workload_args": '{"dim":4,"rows":1000}'}],
)
def test_the_planned_fingerprint_is_the_built_models_and_planning_imports_no_compiler(fields):
    """Planned on the meta device with its initialisers skipped: the same names, shapes and dtypes as the model
    built for real, and without torch._dynamo (a meta `normal_` imported it: 1-2 s of every `ddpsweep run`)."""
    cfg = StepConfig(**fields)
    assert workload.planned_fingerprint(cfg) == workload.fingerprint(workload.create(cfg).model)
    code = "import sys; from trainers import workload; from trainers.config import StepConfig\n"
    code += f"workload.planned_fingerprint(StepConfig(**{fields!r})); print('torch._dynamo' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "False"


def test_the_planning_mode_keeps_in_place_reshapes_on_meta_tensors():
    with torch.device("meta"), workload._NoInit():
        w = torch.empty(3, 4)
        torch.nn.init.normal_(w)  # skipped: no values on meta
        w.t_()  # a reshape still runs
    assert w.is_meta and w.shape == (4, 3)


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ('name: w\nworkload: "no_such_module_xyz:build"\n', "workload"),
        ('name: w\nworkload: "not a path"\n', "workload"),
        ('name: w\nworkload: "sweeps.examples.recsys:nothing"\n', "workload"),
        ('name: w\nworkload: "sweeps.examples.recsys:build"\nworkload_args: {nope: 1}\n', "workload_args"),
        ('name: w\nworkload: "sweeps.examples.recsys:build"\nworkload_args: [1]\n', "workload_args"),
        ('name: w\nworkload: "sweeps.examples.recsys:build"\nmodel: tiny\n', "model"),
    ],
)
def test_bad_workloads_are_one_clear_error_naming_the_field(text, field):
    with pytest.raises(SpecError) as err:
        expand(parse_spec(text))
    assert err.value.field == field


@pytest.mark.parametrize(
    ("line", "field"),
    [
        ("micro_batch: 09", "micro_batch"),  # a ValueError traceback (base 8) before
        ("repeats: 08", "repeats"),
        ("repeats: 010", "repeats"),  # silently 8 before
        ("timed_steps: 0010", "timed_steps"),
        ("workers: [010]", "workers[0]"),
        ('results: "s3://"', "results"),  # passed the dry run before
        ("env: {NCCL_DEBUG: .nan}", "env.NCCL_DEBUG"),  # became "nan" before
    ],
)
def test_spec_fuzz_finds_are_one_line_naming_the_field(line, field):
    with pytest.raises(SpecError) as err:
        parse_spec(f"name: f\n{line}\n")
    assert err.value.field == field


def test_a_huge_spec_file_is_refused_without_reading_it_whole(tmp_path, monkeypatch):
    big = tmp_path / "big.yaml"
    with big.open("wb") as f:
        f.truncate(1 << 30)  # 1 GiB, sparse: reading it whole would take a gigabyte of memory

    def whole(self):
        raise AssertionError("the whole file was read")

    monkeypatch.setattr(type(big), "read_bytes", whole)
    with pytest.raises(SpecError, match="at most 262144 bytes"):
        load_spec(big)


def test_the_slow_link_knobs_are_grid_axes_with_powersgd_ranks_only_on_powersgd():
    spec = parse_spec(
        "name: k\nbucket_cap_mb: [1, 25]\ncomm_hook: [none, fp16, powersgd]\npowersgd_rank: [1, 4]\n"
        "first_bucket_mb: [null, 0.5]\nstatic_graph: [false, true]\n"
    )
    ddp = [c.step for c in expand(spec) if c.step.mode == "ddp"]
    assert len(ddp) == 2 * (1 + 1 + 2) * 2 * 2  # buckets x (none, fp16, powersgd x 2 ranks) x first x static
    assert {(s.comm_hook, s.powersgd_rank) for s in ddp} == {("none", 1), ("fp16", 1), ("powersgd", 1), ("powersgd", 4)}
    assert {s.grad_compression for s in ddp} == {"none", "fp16", "powersgd-rank-1", "powersgd-rank-4"}
    assert len({c.group_key for c in expand(spec)}) == 2  # one DDP group: hooks need no new processes


def test_an_env_grid_makes_one_worker_group_per_combination_and_joins_the_cell_id():
    spec = parse_spec("name: e\nenv_grid: {NCCL_ALGO: [Ring, Tree], GLOO_DEVICE_TRANSPORT: [TCP]}\n")
    ddp = [c for c in expand(spec) if c.step.mode == "ddp"]
    assert [c.env_vars for c in ddp] == [
        {"GLOO_DEVICE_TRANSPORT": "TCP", "NCCL_ALGO": "Ring"},
        {"GLOO_DEVICE_TRANSPORT": "TCP", "NCCL_ALGO": "Tree"},
    ]
    assert len({c.group_key for c in ddp}) == 2 and len({c.cell_id for c in ddp}) == 2
    plain = [c for c in expand(parse_spec("name: e\n")) if c.step.mode == "ddp"]
    assert plain[0].env_grid == "{}" and plain[0].cell_id not in {c.cell_id for c in ddp}


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("name: b\ncomm_hook: [none, bf16]\nuse_gpu: false\n", "comm_hook[1]"),
        ("name: b\ncomm_hook: [int8]\n", "comm_hook[0]"),
        ("name: b\ncomm_hook: [powersgd]\npowersgd_start_iter: 5\n", "powersgd_start_iter"),
        ("name: b\npowersgd_rank: [0]\n", "powersgd_rank[0]"),
        ("name: b\nfirst_bucket_mb: [-1]\n", "first_bucket_mb[0]"),
        ("name: b\nstatic_graph: [1]\n", "static_graph[0]"),
        ("name: b\nenv_grid: {PATH: [a]}\n", "env_grid.PATH"),
        ("name: b\nenv_grid: {NCCL_ALGO: []}\n", "env_grid.NCCL_ALGO"),
        ("name: b\nenv_grid: {NCCL_ALGO: [Ring, Ring]}\n", "env_grid.NCCL_ALGO"),
        ('name: b\nenv_grid: {NCCL_ALGO: ["a\\0b"]}\n', "env_grid.NCCL_ALGO[0]"),
        ("name: b\nenv: {NCCL_ALGO: Ring}\nenv_grid: {NCCL_ALGO: [Tree]}\n", "env_grid.NCCL_ALGO"),
    ],
)
def test_bad_knob_values_name_their_field(text, field):
    with pytest.raises(SpecError) as e:
        parse_spec(text)
    assert e.value.field == field, str(e.value)


def test_bf16_on_a_machine_without_gpus_is_refused_before_ray_with_the_field():
    from sweeps.driver import runner
    from sweeps.plan.planner import plan_sweep

    plan = plan_sweep(parse_spec("name: b\ncomm_hook: [bf16]\n"), results="/tmp/unused-ddpsweep")
    with pytest.raises(SpecError) as e:
        runner.check_local(plan)  # use_gpu: auto on this CPU machine
    assert e.value.field == "comm_hook[0]" and "CUDA" in str(e.value)


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("name: x\n? [a, b]\n: 1\n", "?"),
        ("name: x\nbucket_cap_mb: [{? {a: 1}: 1}]\n", "bucket_cap_mb.[0].?"),
        ("name: x\nrepeats: " + "9" * 5000 + "\n", "repeats"),
        ('{"name": "x", "seed": -' + "1" * 5000 + "}", "seed"),
    ],
    ids=["complex-key", "nested-complex-key", "huge-int", "huge-json-int"],
)
def test_yaml_keys_that_are_not_names_and_huge_numbers_are_one_line_naming_the_field(tmp_path, text, field):
    from fastapi.testclient import TestClient
    from typer.testing import CliRunner

    from service.api import ServiceSettings, create_app
    from service.cli import app

    path = tmp_path / "spec.yaml"
    path.write_text(text)
    out = CliRunner().invoke(app, ["run", str(path), "--dry-run"])
    assert out.exit_code == 2 and out.output.startswith(f"error: {field}: got"), out.output
    assert len(out.output.strip().splitlines()) == 1 and "Traceback" not in out.output
    c = TestClient(create_app(ServiceSettings(address=None, results=str(tmp_path / "r"), token="t")))
    answer = c.post("/sweeps", content=text, headers={"Authorization": "Bearer t"})
    assert answer.status_code == 422 and answer.json()["error"]["field"] == field


def test_a_resume_compares_values_not_their_spelling(tmp_path):
    from dataclasses import asdict

    from sweeps.plan.planner import plan_sweep

    first = parse_spec("name: r\nworkers: [2]\nbucket_cap_mb: [0.05, 0.25, 1, 25]\n")
    plan = plan_sweep(first, results=str(tmp_path), sweep_id="r1")
    plan.store.write_manifest(plan.cluster, "r1", {"spec": asdict(first), "cells": [c.cell_id for c in plan.cells]})
    again = parse_spec("name: r\nworkers: [2]\nbucket_cap_mb: [0.05, 0.25, 1.0, 25.0]\n")
    assert [c.cell_id for c in expand(again)] == [c.cell_id for c in plan.cells]
    assert plan_sweep(again, results=str(tmp_path), resume="r1").resumed
    other = parse_spec("name: r\nworkers: [2]\nbucket_cap_mb: [0.05, 0.25, 1, 26]\n")
    with pytest.raises(SpecError, match="as sweep r1 was started|the same spec the sweep was started with"):
        plan_sweep(other, results=str(tmp_path), resume="r1")  # another grid is still refused
