"""Runs on every Ray Train worker: the group's measurements one after another, on one process group.

Rank 0 posts two messages per measurement to the trial's outbox (a Ray queue): `start` before the
cell is set up, `done` with the measurement (or the error) once every rank has finished it. The
trial turns `done` into a row at once, so rows stream while the group runs.
"""

from __future__ import annotations

import contextlib
import gc
import itertools
import json
import os
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta

import ray
import ray.train
import ray.train.torch
import torch
import torch.distributed as dist

from sweeps.plan.grid import Group, Slot
from sweeps.trial.options import CORRUPT_ENV, JITTER_ENV, SLOWDOWN_ENV
from sweeps.worker import fingerprint
from sweeps.worker.ranks import FailureWatch, Layout, agree, announce, report_failure, wait_for
from trainers.collectives import allreduce_sweep, broadcast_time, sizes_up_to
from trainers.gradcheck import EVERY, FIRST
from trainers.model import grad_bytes
from trainers.perrank import device_id
from trainers.replica import build_model
from trainers.stats import median_rel_half_width
from trainers.step import Extras, release, run_cell
from trainers.terms import measure_terms
from trainers.workload import generator


def _placement(device: torch.device) -> list[dict]:
    """Every rank's place, in rank order: hostname, Ray node id and IP, local rank, device (PCI bus id or core
    set) and its node's network fingerprint (each rank reads its own node's: a few files under /sys)."""
    ip = ray.util.get_node_ip_address()
    mine = {
        "host": socket.gethostname(),
        "node": ray.get_runtime_context().get_node_id(),
        "ip": ip,
        "local_rank": ray.train.get_context().get_local_rank(),
        "device": device_id(device),
        "network": fingerprint.network(ip),
    }
    every: list = [None] * dist.get_world_size()
    dist.all_gather_object(every, mine)
    return every


def placement_info(placement: list[dict]) -> dict:
    """What rank 0 reports of the placement: hosts, node count, ranks per node, every rank's node IP, host,
    local rank and device, and one network fingerprint per node."""
    per_node: dict[str, int] = {}
    networks: dict[str, dict] = {}
    for p in placement:
        per_node[p["node"]] = per_node.get(p["node"], 0) + 1
        networks.setdefault(p["node"], p["network"])
    return {
        "hosts": sorted({p["host"] for p in placement}),
        "nodes": len(per_node),
        "ranks_per_node": sorted(per_node.values(), reverse=True),
        "rank_nodes": [p["ip"] for p in placement],
        "rank_hosts": [p["host"] for p in placement],
        "rank_local_ranks": [p["local_rank"] for p in placement],
        "rank_devices": [p["device"] for p in placement],
        "network": json.dumps(list(networks.values())),
    }


# Fault-injection hook for tests of the error paths: a file whose lines are "<cell_id> raise|hang|raise-backward@R"
# (the last: rank R raises in the middle of its first backward, its peers inside DDP's all-reduce).
FAULT_FILE_ENV = "DDPSWEEP_FAULT_FILE"


def _fault(cell_id: str) -> str | None:
    path = os.environ.get(FAULT_FILE_ENV)
    if not path or not os.path.exists(path):
        return None
    with open(path) as f:
        return dict(line.split() for line in f if line.strip()).get(cell_id)


def _injected_fault(cell_id: str) -> None:
    fault = _fault(cell_id)
    if fault == "raise":
        raise RuntimeError(f"fault injected into cell {cell_id}")
    if fault == "hang":
        time.sleep(10**6)


def _entries(name: str) -> dict[str, str]:
    entries = dict(e.split("=", 1) for e in os.environ.get(name, "").split(",") if "=" in e)
    return {c.strip(): f for c, f in entries.items()}


def injected(name: str, cell_id: str) -> float:
    """This cell's planted fraction from the variable `name` (one of PLANTED_ENVS, passed on by the driver:
    sweeps.driver.runner.planted); an entry `*=<fraction>` plants it in every cell (a cell's own entry wins)."""
    entries = _entries(name)
    return float(entries.get(cell_id, entries.get("*", 0.0)))


def injected_straggler(cell_id: str) -> tuple[int, float] | None:
    """(the cell's rank, fraction) of a straggler planted by DDPSWEEP_SLOWDOWN=<cell_id>@<rank>=<fraction>
    (`*@<rank>` for every cell; a cell's own entry wins), or None."""
    per_rank = [(c.partition("@"), f) for c, f in _entries(SLOWDOWN_ENV).items() if "@" in c]
    mine = [(int(r), float(f)) for (c, _, r), f in per_rank if c == cell_id]
    every = [(int(r), float(f)) for (c, _, r), f in per_rank if c == "*"]
    return (mine or every or [None])[0]


def _measure(w: Worker, slot: Slot, ranks: tuple[int, ...]) -> tuple[dict | None, str | None]:
    """One cell on this rank, one of `ranks`. An exception becomes this rank's error, reported through the store
    at once, and this rank's groups of the cell are destroyed (their sockets close, so a peer held in one of
    their collectives fails at once); the ranks then agree on the outcome through the store."""
    cell_id, repeat, step = slot.cell.cell_id, slot.repeat, slot.cell.step
    measurement, error = _run(w, slot, ranks)  # holds no reference to the cell's groups once it returns
    if error is not None:
        _release_quietly(w.device)
        if step.mode != "single":
            report_failure(cell_id, repeat, dist.get_rank(), error, ranks)
            w.layout.drop(ranks)
            gc.collect()  # the last references to the dropped groups: their sockets close
    if step.mode != "single":
        error = agree(cell_id, repeat, dist.get_rank(), ranks, w.collective_timeout)
    if error is None:
        w.checked.add(cell_id)  # a configuration that failed before its check is checked at its next measurement
    return (measurement if not error else None), error


def _run(w: Worker, slot: Slot, ranks: tuple[int, ...]) -> tuple[dict | None, str | None]:
    """The cell's measurement on this rank (rank 0's, with what its row records of the plants), or its error."""
    cell_id, step = slot.cell.cell_id, slot.cell.step
    extras = _extras(w, cell_id, ranks)
    group = w.layout.process_group(ranks)
    groups = [g for g in (group, extras.check_group) if g is not None]
    watch = FailureWatch(
        cell_id, slot.repeat, dist.get_rank(), groups, abort=w.backend != "gloo" and step.mode != "single"
    )
    try:
        _injected_fault(cell_id)
        measurement = run_cell(step, w.device, w.threads, w.template, group, extras)
        release(w.device)
    except Exception as e:  # noqa: BLE001 — reported as the cell's error row; the group goes on
        return None, f"{type(e).__name__}: {e}"
    finally:
        watch.close()
    planted = extras_record(w, cell_id, ranks, extras)
    return (measurement.to_dict() | planted if measurement else None), None


def _release_quietly(device: torch.device) -> None:
    """What the failed cell held, freed; a sticky device error here is already the cell's error."""
    with contextlib.suppress(Exception):
        release(device)


def _extras(w: Worker, cell_id: str, ranks: tuple[int, ...]) -> Extras:
    """The cell's extras on this rank: its check and group, and any plant (benchmarks and tests only)."""
    fail_here = _fault(cell_id) == f"raise-backward@{dist.get_rank()}"
    straggler = injected_straggler(cell_id)
    return Extras(
        grad_check=_checks_now(w, cell_id),
        check_group=w.layout.check_group(ranks),
        slowdown=injected(SLOWDOWN_ENV, cell_id),
        corruption=injected(CORRUPT_ENV, cell_id),
        jitter=injected(JITTER_ENV, cell_id),
        rank_slowdown=straggler[1] if straggler and straggler[0] == ranks.index(dist.get_rank()) else 0.0,
        fail_in_backward=fail_here,
    )


def extras_record(w: Worker, cell_id: str, ranks: tuple[int, ...], extras: Extras) -> dict:
    """What the row records of the extras: the plants (only those planted), and when the sweep checks gradients.
    Rank 0 writes the row: a straggler planted on another of the cell's ranks is read from the variable."""
    straggler = injected_straggler(cell_id)
    straggler = straggler if straggler and straggler[0] < len(ranks) else None
    record = {
        "injected_slowdown": straggler[1] if straggler else extras.slowdown,
        "injected_slowdown_rank": straggler[0] if straggler else None,
        "injected_corruption": extras.corruption,
        "injected_jitter": extras.jitter,
        "grad_check_when": w.grad_check or None,
    }
    return {k: v for k, v in record.items() if v is not None and (v != 0 or k == "injected_slowdown_rank")}


def _checks_now(w: Worker, cell_id: str) -> bool | None:
    """Whether this measurement checks its gradient: every one (`every`), or until the configuration's first
    measurement in this group succeeds (`first`: None afterwards, the row then carries no verdict of its own);
    False where checks are off."""
    if not w.grad_check:
        return False
    return True if w.grad_check == EVERY or cell_id not in w.checked else None


def _unrecorded(group: Group, timed_steps: int, device: torch.device, threads: int, template):
    """A short, fixed run of the group's first cell that makes no row (its measured run reports any error);
    eager: a compiled cell compiles in its own warm-up, where compile_s records it."""
    first = group.first.step
    warm = first.powersgd_start_iter if first.comm_hook == "powersgd" else 1  # compressed when timed
    step = replace(first, warmup_steps=warm, timed_steps=timed_steps, target_rel_ci=None, timing="sync", compile=False)
    m = None
    with contextlib.suppress(Exception):
        m = run_cell(step, device, threads, template, extras=Extras(grad_check=False))
    release(device)
    return m


def _warm_up_group(group: Group, device: torch.device, threads: int, template) -> None:
    """One short unrecorded run of the first cell, so that no measured cell pays the process's cold start
    (lazy imports, first allocations, first collectives); then the heap so far is frozen, which keeps the
    garbage collection between cells short (it only walks what the cells themselves allocated)."""
    _unrecorded(group, 1, device, threads, template)
    gc.freeze()


CONTROL_STEPS = 6  # timed steps of the per-round control probe


def _control(group: Group, device: torch.device, threads: int, template) -> dict:
    """The round's control: the group's first cell, short and fixed, measured at the start of every round,
    so drift and interference show up as the control moving (rank 0 gets its median and noise)."""
    m = _unrecorded(group, CONTROL_STEPS, device, threads, template)
    if m is None:
        return {}
    return {"control_step_ms": m.step_ms, "control_rel_ci": median_rel_half_width(m.step_times_ms)}


CPU_CALIBRATION_MAX_BYTES = 64 * 2**20  # fewer, smaller sizes on CPU


def _calibrate(group: Group, device: torch.device, template) -> dict:
    """An all-reduce sweep from 4 KB up to the model's gradient bytes (at least), the parameter broadcast, and
    the overlap model's terms with the group's workload (trainers.terms), on this group's ranks; rank 0 gets
    {"kind": "calibration", "rows": [...]}."""
    grad = grad_bytes(template.model)
    top = grad if device.type == "cuda" else min(max(grad, 1 << 20), CPU_CALIBRATION_MAX_BYTES)
    rows = allreduce_sweep(sizes_up_to(top), device, iters=20 if device.type == "cuda" else 10)
    bcast = broadcast_time(template.model, device)
    first = group.first.step
    batch = tuple(t.to(device) for t in template.workload.make_batch(first.micro_batch, generator(first.seed, 0, 0)))
    measured = measure_terms(template.model, lambda m: template.workload.loss(m, batch), device, grad)
    release(device)
    return {"kind": "calibration", "rows": [*rows, bcast, *measured]} if rows else {}


@dataclass
class Worker:
    """What one rank holds for the whole group."""

    group: Group
    device: torch.device
    threads: int
    template: object  # trainers.workload.Built: every cell starts from a copy of its model
    placement: list[dict]  # every rank's place, in rank order
    layout: Layout  # each cell's ranks and process groups (isolation: sweep — its own ranks; else every rank)
    outbox: object | None  # rank 0 only: the trial's queue
    info: dict  # rank 0: the fingerprint and the host's placement
    grad_check: str | bool = FIRST  # when a distributed cell checks its gradient: first | every; False: never
    backend: str = "gloo"  # the process groups' backend (nccl: a failed peer's groups are aborted)
    collective_timeout: timedelta = timedelta(minutes=30)  # how long the ranks of a cell wait for each other
    checked: set[str] = field(default_factory=set)  # cell ids whose gradient this group has checked


def train_fn_per_worker(config: dict) -> None:
    """Measure every slot of the group, round by round; rank 0 posts start/done messages to the outbox."""
    group, threads = config["group"], config["threads"]
    device = ray.train.torch.get_device()
    rank0 = ray.train.get_context().get_world_rank() == 0
    placement = _placement(device)
    grad_check = config.get("grad_check", FIRST)
    layout = Layout.build(group, placement, bool(grad_check), whole=group.isolation != "sweep")
    given = config.get("env", {})  # the variables the spec gave this group, as it gave them
    info = {"fingerprint": fingerprint.collect(device, given)} | placement_info(placement) if rank0 else {}
    template = build_model(group.first.step, device)  # built once; every cell starts from a copy of it
    outbox = config["outbox"] if rank0 else None
    w = Worker(group, device, threads, template, placement, layout, outbox, info, grad_check)
    w.backend = dist.get_backend()
    w.collective_timeout = timedelta(seconds=config.get("collective_timeout_s", 1800))
    _warm_up_group(group, device, threads, template)
    if group.calibrate:
        calibration = _calibrate(group, device, template)  # a wrong reduced value raises on every rank
        if rank0:
            w.outbox.put(calibration | info)
    if rank0:
        w.outbox.put({"kind": "setup"})
    for slots in rounds_of(group, config.get("inbox"), rank0):
        control = _control(group, device, threads, template)
        for slot in slots:
            _measure_slot(w, slot, {"control": control})


def rounds_of(group: Group, inbox, rank0: bool) -> Iterator[list[Slot]]:
    """The group's rounds in order: as planned, or (with an inbox) as the trial sends them: rank 0 takes each
    round's keys from the inbox (a blocking get: no core spins meanwhile) and broadcasts them; [] ends."""
    if inbox is None:
        for _, slots in itertools.groupby(group.slots, key=lambda s: s.round):
            yield list(slots)
        return
    by_key = {(s.cell.cell_id, s.repeat): s for s in group.slots}
    while True:
        message = [inbox.get() if rank0 else None]
        dist.broadcast_object_list(message, src=0)
        if not message[0]:
            return
        yield [by_key[tuple(k)] for k in message[0]]


def _cell_ranks(w: Worker, slot: Slot) -> tuple[int, ...]:
    """The ranks that measure the slot's cell (none where the host's placement cannot give them:
    `Layout.unplaced` says why)."""
    return w.layout.ranks.get(slot.cell.cell_id, ())


def _measure_slot(w: Worker, slot: Slot, extra: dict) -> None:
    """One (cell, repeat): its ranks measure it while the others wait for rank 0's word; rank 0 (the one with
    an outbox) posts start, then done with the measurement, `extra` (the round's control), the fingerprint
    and the placement of the cell's own ranks. After a failure every rank makes the cell's groups anew."""
    cell_id, repeat = slot.cell.cell_id, slot.repeat
    ranks = _cell_ranks(w, slot)
    why_not = w.layout.unplaced.get(cell_id)
    if why_not is None and dist.get_rank() not in ranks:
        if wait_for(cell_id, repeat):
            w.layout.renew(ranks)
        return
    started, t0 = datetime.now(UTC).isoformat(), time.perf_counter()
    if w.outbox is not None:
        w.outbox.put({"kind": "start", "key": [cell_id, repeat]})
    measurement, error = (None, f"not measured: {why_not}") if why_not else _measure(w, slot, ranks)
    if w.outbox is not None:
        done = {"key": [cell_id, repeat], "started_at": started, "wall_s": time.perf_counter() - t0}
        own = _own_placement(w, ranks)
        w.outbox.put({"kind": "done", **done, "measurement": measurement, "error": error, **extra, **w.info, **own})
    failed = why_not is None and error is not None and slot.cell.step.mode != "single"
    if ranks and len(ranks) < len(w.placement):
        announce(cell_id, repeat, failed)  # rank 0 (always one of the cell's ranks): the waiting ranks go on
    if failed:
        w.layout.renew(ranks)


def _own_placement(w: Worker, ranks: tuple[int, ...]) -> dict:
    """The placement of the ranks that measured the cell, and the host group's size."""
    own = {"host_world_size": len(w.placement)}
    if ranks:
        own |= placement_info([w.placement[r] for r in ranks]) | {"ranks": list(ranks)}
    return own
