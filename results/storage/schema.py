"""The Parquet row schema, declared once: every file is written with it, every read conforms to it."""

from __future__ import annotations

import math
import typing

import pyarrow as pa

from results.knobs import BY_NAME, KNOBS, STEP_KNOBS, UNSET, Knob, Measurement

_TS = pa.timestamp("us", tz="UTC")

IDENTITY = [
    pa.field("sweep_id", pa.string(), nullable=False),  # the sweep this measurement belongs to (its folder: sweep=<id>)
    pa.field("cell_id", pa.string(), nullable=False),  # stable hash of the cell's configuration
    pa.field("repeat", pa.int32(), nullable=False),  # which repeat of the cell (= its round)
    pa.field("cluster", pa.string(), nullable=False),  # the label the rows are filed under (cluster=<label>)
    pa.field("status", pa.string(), nullable=False),  # ok | error
    pa.field("error", pa.string()),  # message; empty when ok
    pa.field("spec_name", pa.string()),  # the spec's `name`
    pa.field("started_at", _TS),  # when the measurement started (UTC)
    pa.field("finished_at", _TS),  # when its row was written (UTC); of two, the latest wins
]

_TYPES = {"string": pa.string(), "int32": pa.int32(), "int64": pa.int64(), "float64": pa.float64(), "bool": pa.bool_()}


def _knob_column(knob: Knob) -> pa.Field:
    """A knob's column (the knob table: its name and Arrow type)."""
    return pa.field(knob.name, _TYPES[knob.column_type])


# The step's configuration: one column per knob of StepConfig (results.knobs.STEP_KNOBS), in its order.
CONFIGURATION = [_knob_column(k) for k in STEP_KNOBS]

# Where and how the cell ran: its placement, and how the sweep scheduled it.
PLACEMENT = [
    _knob_column(BY_NAME["world_size"]),
    _knob_column(BY_NAME["num_nodes"]),
    pa.field("workers_per_node", pa.int32()),  # ranks per node of the topology
    pa.field("tokens_per_step", pa.int64()),  # global: all ranks, all micro-steps
    pa.field("cpus_per_worker", pa.float64()),  # CPUs reserved per rank (on CPU also its torch threads, floored)
    pa.field("placement", pa.string()),  # the Ray placement strategy used
    pa.field("host_world_size", pa.int32()),  # ranks of the worker group that hosted the cell (isolation: sweep)
    pa.field("ranks", pa.list_(pa.int32())),  # the host group's ranks that measured the cell
    pa.field("rank_nodes", pa.list_(pa.string())),  # the Ray node IP of each of the cell's ranks, in rank order
    pa.field("rank_hosts", pa.list_(pa.string())),  # the hostname of each of the cell's ranks, in rank order
    pa.field("rank_local_ranks", pa.list_(pa.int32())),  # each rank's local rank on its node
    pa.field("rank_devices", pa.list_(pa.string())),  # each rank's device: PCI bus id on CUDA, core set on CPU
    pa.field("workers_per_node_observed", pa.int32()),  # the most ranks any node held (= workers_per_node if right)
    _knob_column(BY_NAME["env_grid"]),  # JSON: the cell's env_grid values (its worker group's variables); {}: none
    pa.field("grad_compression", pa.string()),  # none | fp16 | bf16 | powersgd-rank-N: lossy unless none
    pa.field("isolation", pa.string()),  # group | cell
    pa.field("group_id", pa.string()),  # the worker group (one TorchTrainer) that measured it
    pa.field("round", pa.int32()),  # = repeat; every pending cell of the group once per round
    pa.field("order_in_round", pa.int32()),  # its place in its round's shuffled order
    pa.field("order_seed", pa.int64()),  # round r is shuffled with Random(order_seed + r)
    pa.field("group_started_at", _TS),  # when the group's TorchTrainer was launched
    pa.field("group_setup_s", pa.float64()),  # launch -> workers ready for the first cell (worker-group start)
    pa.field("control_step_ms", pa.float64()),  # this round's control probe (the group's first cell, short): median
    pa.field("control_rel_ci", pa.float64()),  # its own noise: half-width of its median's 95% interval, relative
    pa.field("search", pa.string()),  # grid | race (results.analysis.racing)
    pa.field("eliminated_at_round", pa.int32()),  # race: the round after which this cell was measured no more
    pa.field("target_rel", pa.float64()),  # repeats: auto — the difference its rounds aimed to resolve
    pa.field("injected_slowdown", pa.float64()),  # benchmarks only (DDPSWEEP_SLOWDOWN): planted fraction
    pa.field("injected_corruption", pa.float64()),  # benchmarks only (DDPSWEEP_CORRUPT): buckets scaled by 1 + it
    pa.field("grad_check_when", pa.string()),  # first (a configuration's first measurement) | every
    pa.field("injected_jitter", pa.float64()),  # benchmarks only (DDPSWEEP_JITTER): relative noise in backward
    pa.field("injected_slowdown_rank", pa.int32()),  # benchmarks only (DDPSWEEP_SLOWDOWN=<cell>@<rank>): its rank
]

_ARROW = {str: pa.string(), int: pa.int64(), float: pa.float64(), bool: pa.bool_()}


def _arrow(hint: object) -> pa.DataType:
    """The Arrow type of a Measurement field's annotation: str, int, float, bool, lists of them, optional."""
    if typing.get_origin(hint) is list:
        return pa.list_(_arrow(typing.get_args(hint)[0]))
    inner = [a for a in typing.get_args(hint) if a is not type(None)]  # X | None
    return _arrow(inner[0]) if inner else _ARROW[hint]


# What the worker measured: one column per field of trainers.knobs.Measurement (its comments document
# them), plus the trial's wall time.
MEASUREMENT = [pa.field(k, _arrow(t)) for k, t in typing.get_type_hints(Measurement).items()]
MEASUREMENT.append(pa.field("trial_wall_s", pa.float64()))  # this measurement on its worker group: setup to row

FINGERPRINT = [
    pa.field("hosts", pa.list_(pa.string())),  # the hostnames of the ranks
    pa.field("accelerator", pa.string()),  # GPU name or CPU model
    pa.field("accelerators", pa.int32()),  # GPUs (or CPU sockets) per node
    pa.field("driver_version", pa.string()),  # NVIDIA driver
    pa.field("cuda_version", pa.string()),  # torch's CUDA
    pa.field("nccl_version", pa.string()),  # torch's NCCL
    pa.field("torch_version", pa.string()),  # torch
    pa.field("ray_version", pa.string()),  # Ray
    pa.field("python_version", pa.string()),  # Python
    pa.field("ddpsweep_version", pa.string()),  # ddpsweep
    pa.field("topology", pa.string()),  # nvidia-smi topo -m, where present
    pa.field("env", pa.string()),  # JSON object of the NCCL_*/GLOO_* variables the spec or cluster set
    pa.field("network", pa.string()),  # JSON list, one object per node: interfaces, speeds, IB ports, GPUs, topo
]

SCHEMA = pa.schema(IDENTITY + CONFIGURATION + PLACEMENT + MEASUREMENT + FINGERPRINT)
COLUMNS = SCHEMA.names


# Columns added after rows were first stored, with the value every older row had: filled in on read, so
# an old row and a new one of the same configuration compare and group as one (the knobs' from trainers.knobs).
OLDER_ROWS = {k.name: k.older_rows for k in KNOBS if k.older_rows is not UNSET} | {
    "grad_compression": "none",
    "search": "grid",
    "timing_used": "sync",
}


def conform(table: pa.Table) -> pa.Table:
    """Cast a table read from any version of the store to SCHEMA: missing columns become null, or the value
    older rows had (OLDER_ROWS)."""
    return conform_to(table, SCHEMA)


def impossible(row: dict) -> str | None:
    """Why an ok row's measurement cannot be real (a step time that is not a positive finite number)."""
    ms = row.get("step_ms")
    if row.get("status") == "ok" and not (isinstance(ms, int | float) and math.isfinite(ms) and ms > 0):
        return f"step_ms {ms!r} is not a positive finite number of milliseconds"
    return None


def row_table(row: dict) -> pa.Table:
    """One row dict → a one-row table in SCHEMA. Unknown keys are a bug: refuse them, and impossible
    measurements too."""
    unknown = set(row) - set(COLUMNS)
    if unknown:
        raise KeyError(f"row has columns not in the schema: {sorted(unknown)}")
    missing = [f.name for f in SCHEMA if not f.nullable and row.get(f.name) is None]
    if missing:
        raise KeyError(f"row lacks required columns: {missing}")
    why = impossible(row)
    if why:
        raise ValueError(f"refusing to write row {row.get('cell_id')}-r{row.get('repeat')}: {why}")
    values = {name: row.get(name) for name in COLUMNS}
    values |= {name: value for name, value in OLDER_ROWS.items() if values[name] is None}
    return pa.Table.from_pylist([values], schema=SCHEMA)


# The calibration table: all-reduce time by message size on a group's own ranks (and the parameter
# broadcast), filed beside the cells under the same cluster and sweep.
CALIBRATION = pa.schema(
    [
        pa.field(
            "sweep_id", pa.string(), nullable=False
        ),  # the sweep this measurement belongs to (its folder: sweep=<id>)
        pa.field("cluster", pa.string(), nullable=False),  # the label the rows are filed under (cluster=<label>)
        pa.field("group_id", pa.string()),  # the worker group (one TorchTrainer) that measured it
        pa.field("world_size", pa.int32()),
        pa.field("num_nodes", pa.int32()),
        pa.field("workers_per_node", pa.int32()),  # ranks per node of the topology
        pa.field("backend", pa.string()),
        pa.field("accelerator", pa.string()),
        pa.field("hosts", pa.list_(pa.string())),  # the hostnames of the ranks
        pa.field("measured_at", _TS),
        pa.field("kind", pa.string()),  # all_reduce | broadcast_params | one of trainers.terms' five arms
        pa.field("size_bytes", pa.int64()),  # message bytes (fp32); terms: the gradient's (contended: the all-reduce's)
        pa.field("buckets", pa.int32()),  # ddp_backward: DDP buckets per backward (trainers.terms)
        pa.field("time_ms", pa.float64()),  # median over iters of the slowest rank's time per op (or backward)
        pa.field("times_ms", pa.list_(pa.float64())),
        pa.field("iters", pa.int32()),
        pa.field("algbw_gbps", pa.float64()),  # size / time
        pa.field("busbw_gbps", pa.float64()),  # algbw * 2(N-1)/N, as nccl-tests
    ]
)


def conform_to(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """Cast a table to `schema`: missing columns become null (or, for rows, what older rows had: OLDER_ROWS)."""
    columns = [
        table[f.name].cast(f.type) if f.name in table.column_names else _missing(f, table.num_rows) for f in schema
    ]
    return pa.Table.from_arrays(columns, schema=schema)


def _missing(f: pa.Field, rows: int) -> pa.Array:
    if f.name in OLDER_ROWS:
        return pa.array([OLDER_ROWS[f.name]] * rows, f.type)
    return pa.nulls(rows, f.type)
