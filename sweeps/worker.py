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
from datetime import UTC, datetime

import psutil
import ray
import ray.train
import ray.train.torch
import torch
import torch.distributed as dist

from sweeps import fingerprint
from sweeps.grid import Group, Slot
from sweeps.options import CORRUPT_ENV, JITTER_ENV, SLOWDOWN_ENV
from sweeps.ranks import Layout, announce, wait_for
from trainers.collectives import allreduce_sweep, broadcast_time, sizes_up_to
from trainers.gradcheck import EVERY, FIRST, world_check_group
from trainers.model import grad_bytes
from trainers.replica import build_model
from trainers.stats import median_rel_half_width
from trainers.step import Extras, release, run_cell


def _placement() -> list[dict]:
    """Every rank's place, in rank order: hostname, Ray node id and IP, and that node's network
    fingerprint (each rank reads its own node's: a few files under /sys)."""
    ip = ray.util.get_node_ip_address()
    mine = {
        "host": socket.gethostname(),
        "node": ray.get_runtime_context().get_node_id(),
        "ip": ip,
        "network": fingerprint.network(ip),
        "process_started": psutil.Process().create_time(),  # s since the epoch (sweeps.startmarks)
    }
    every: list = [None] * dist.get_world_size()
    dist.all_gather_object(every, mine)
    return every


def placement_info(placement: list[dict]) -> dict:
    """What rank 0 reports of the placement: hosts, node count, ranks per node, every rank's node IP,
    and one network fingerprint per node."""
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
        "network": json.dumps(list(networks.values())),
    }


# Fault-injection hook for tests of the error paths: a file whose lines are "<cell_id> raise|hang".
FAULT_FILE_ENV = "DDPSWEEP_FAULT_FILE"


def _injected_fault(cell_id: str) -> None:
    path = os.environ.get(FAULT_FILE_ENV)
    if not path or not os.path.exists(path):
        return
    with open(path) as f:
        faults = dict(line.split() for line in f if line.strip())
    if faults.get(cell_id) == "raise":
        raise RuntimeError(f"fault injected into cell {cell_id}")
    if faults.get(cell_id) == "hang":
        time.sleep(10**6)


def _agreed_error(mine: str | None, group: dist.ProcessGroup | None = None) -> str | None:
    """Every rank's outcome of the cell (a collective over `group`): the first rank's error, or None."""
    every: list = [None] * dist.get_world_size(group)
    dist.all_gather_object(every, mine, group=group)
    return next((f"rank {r}: {e}" for r, e in enumerate(every) if e), None)


def injected(name: str, cell_id: str) -> float:
    """This cell's planted fraction from the variable `name` (one of PLANTED_ENVS, passed on by the driver:
    sweeps.runner.planted); an entry `*=<fraction>` plants it in every cell (a cell's own entry wins)."""
    entries = dict(e.split("=", 1) for e in os.environ.get(name, "").split(",") if "=" in e)
    entries = {c.strip(): f for c, f in entries.items()}
    return float(entries.get(cell_id, entries.get("*", 0.0)))


def _measure(
    w: Worker, slot: Slot, group: dist.ProcessGroup | None, check_group: dist.ProcessGroup | None
) -> tuple[dict | None, str | None]:
    """One cell on this rank, one of `group`'s (`check_group`: the gradient check's gloo group over the same
    ranks). An exception becomes this rank's error; the group's ranks then agree on the outcome."""
    cell_id, device = slot.cell.cell_id, w.device
    slowdown, corruption = injected(SLOWDOWN_ENV, cell_id), injected(CORRUPT_ENV, cell_id)
    jitter = injected(JITTER_ENV, cell_id)
    extras = Extras(_checks_now(w, cell_id), check_group, slowdown, corruption, jitter)
    try:
        _injected_fault(cell_id)
        measurement = run_cell(slot.cell.step, device, w.threads, w.template, group, extras)
        error = None
    except Exception as e:  # noqa: BLE001 — reported as the cell's error row; the group goes on
        measurement, error = None, f"{type(e).__name__}: {e}"
    release(device)
    if slot.cell.step.mode != "single":
        error = _agreed_error(error, group)
    planted = {"injected_slowdown": slowdown} if slowdown else {}
    planted |= {"injected_corruption": corruption} if corruption else {}
    planted |= {"injected_jitter": jitter} if jitter else {}
    planted |= {"grad_check_when": w.grad_check} if w.grad_check else {}
    return (measurement.to_dict() | planted if measurement else None), error


def _checks_now(w: Worker, cell_id: str) -> bool | None:
    """Whether this measurement checks its gradient: every one (`every`), or the configuration's first in this
    group (`first`: None afterwards, the row then carries no verdict of its own); False where checks are off."""
    if not w.grad_check:
        return False
    if w.grad_check == EVERY or cell_id not in w.checked:
        w.checked.add(cell_id)
        return True
    return None


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
    """An all-reduce sweep from 4 KB up to the model's gradient bytes (at least), and the parameter
    broadcast, on this group's ranks; rank 0 gets {"kind": "calibration", "rows": [...]}."""
    grad = grad_bytes(template.model)
    top = grad if device.type == "cuda" else min(max(grad, 1 << 20), CPU_CALIBRATION_MAX_BYTES)
    rows = allreduce_sweep(sizes_up_to(top), device, iters=20 if device.type == "cuda" else 10)
    bcast = broadcast_time(template.model, device)
    return {"kind": "calibration", "rows": [*rows, bcast]} if rows else {}


@dataclass
class Worker:
    """What one rank holds for the whole group."""

    group: Group
    device: torch.device
    threads: int
    template: object  # trainers.workload.Built: every cell starts from a copy of its model
    placement: list[dict]  # every rank's place, in rank order
    layout: Layout | None  # isolation: sweep — each cell's ranks and process group
    outbox: object | None  # rank 0 only: the trial's queue
    info: dict  # rank 0: the fingerprint and the host's placement
    grad_check: str | bool = FIRST  # when a distributed cell checks its gradient: first | every; False: never
    world_check: dist.ProcessGroup | None = None  # the check's gloo group over every rank (no layout)
    checked: set[str] = field(default_factory=set)  # cell ids whose gradient this group has checked


def train_fn_per_worker(config: dict) -> None:
    """Measure every slot of the group, round by round; rank 0 posts start/done messages to the outbox."""
    marks = {"workers_running": time.time()}  # the group's start, part by part (wall clock, for the trial)
    group, threads = Group.from_dict(config["group"]), config["threads"]
    device = ray.train.torch.get_device()
    rank0 = ray.train.get_context().get_world_rank() == 0
    placement = _placement()
    grad_check = config.get("grad_check", FIRST)
    layout = Layout.build(group, placement, grad_check) if group.isolation == "sweep" else None
    world_check = world_check_group() if grad_check and layout is None and len(placement) > 1 else None
    marks["process_groups"] = time.time()
    marks["placement_group"] = min(p["process_started"] for p in placement)  # the first worker process
    given = config.get("env", {})  # the variables the spec gave this group, as it gave them
    info = {"fingerprint": fingerprint.collect(device, given)} | placement_info(placement) if rank0 else {}
    template = build_model(group.first.step, device)  # built once; every cell starts from a copy of it
    marks["model"] = time.time()
    outbox = config["outbox"] if rank0 else None
    w = Worker(group, device, threads, template, placement, layout, outbox, info, grad_check, world_check)
    _warm_up_group(group, device, threads, template)
    marks["warm_up"] = time.time()
    if group.calibrate:
        calibration = _calibrate(group, device, template)  # a wrong reduced value raises on every rank
        marks["calibration"] = time.time()
        if rank0:
            w.outbox.put(calibration | info)
    if rank0:
        w.outbox.put({"kind": "setup", "marks": marks})
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
    """The ranks that measure the slot's cell (every rank outside `isolation: sweep`; none where the host's
    placement cannot give them: `Layout.unplaced` says why)."""
    if w.layout is None:
        return tuple(range(len(w.placement)))
    return w.layout.ranks.get(slot.cell.cell_id, ())


def _measure_slot(w: Worker, slot: Slot, extra: dict) -> None:
    """One (cell, repeat): its ranks measure it while the others wait for rank 0's word; rank 0 (the one with
    an outbox) posts start, then done with the measurement, `extra` (the round's control), the fingerprint
    and the placement of the cell's own ranks."""
    cell_id, repeat = slot.cell.cell_id, slot.repeat
    ranks = _cell_ranks(w, slot)
    why_not = w.layout.unplaced.get(cell_id) if w.layout else None
    if why_not is None and dist.get_rank() not in ranks:
        wait_for(cell_id, repeat)
        return
    started, t0 = datetime.now(UTC).isoformat(), time.perf_counter()
    if w.outbox is not None:
        w.outbox.put({"kind": "start", "key": [cell_id, repeat]})
    if why_not is not None:
        measurement, error = None, f"not measured: {why_not}"
    else:
        group = w.layout.process_group(ranks) if w.layout else None
        check_group = w.layout.check_group(ranks) if w.layout else w.world_check
        measurement, error = _measure(w, slot, group, check_group)
    if w.outbox is not None:
        done = {"key": [cell_id, repeat], "started_at": started, "wall_s": time.perf_counter() - t0}
        own = _own_placement(w, ranks)
        w.outbox.put({"kind": "done", **done, "measurement": measurement, "error": error, **extra, **w.info, **own})
    if w.layout is not None and ranks and len(ranks) < len(w.placement):
        announce(cell_id, repeat)  # rank 0 (always one of the cell's ranks): the waiting ranks go on


def _own_placement(w: Worker, ranks: tuple[int, ...]) -> dict:
    """The placement of the ranks that measured the cell, and the host group's size."""
    own = {"host_world_size": len(w.placement)}
    if ranks:
        own |= placement_info([w.placement[r] for r in ranks]) | {"ranks": list(ranks)}
    return own
