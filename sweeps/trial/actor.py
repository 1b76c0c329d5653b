"""Runs in the Ray Tune trial actor: one group of (cell, repeat) pairs on one TorchTrainer.

The fit runs in a task of its own, so that a timeout can force-cancel it (and with it the Train
controller and worker group it owns). Rank 0 streams `start`/`done` messages through a Ray queue;
this trial turns each `done` into a row and reports it to Tune at once, where the driver's
`RowWriter` writes it. Why a queue rather than `ray.train.report` + `TuneReportCallback`: the callback
must live in this trial's session while the fit runs in the cancellable task, and `ray.train.report`
is a barrier across ranks; a queue needs neither, and rows still reach the store as each cell ends.

Every slot of a group ends as exactly one row: measured, failed, or — when the group dies twice (a hang
past cell_timeout_s or a start past group_start_timeout_s, a lost worker) — an error row saying why it
was not measured.
"""

from __future__ import annotations

import json
import time
from collections.abc import Generator, Iterator
from dataclasses import replace
from datetime import datetime

import ray
import ray.tune
from ray.exceptions import RayError, RayTaskError
from ray.util.queue import Queue
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from results.analysis.racing import Rule
from sweeps.plan.grid import Cell, Group, Slot
from sweeps.trial import deaths, leftover
from sweeps.trial.options import TrialOptions, placement_for, worker_resources
from sweeps.trial.rounds import RoundPlanner
from sweeps.trial.rows import RowContext, build_row, now

POLL_S = 0.1  # how often the trial looks at the outbox and the fit (never inside a measurement)
FIT_END_WAIT_S = 30.0  # a force-cancelled fit is gone within a second or two


def row_context(group: Group, opts: TrialOptions, started: datetime) -> RowContext:
    cell = group.first
    return RowContext(
        sweep_id=opts.sweep_id,
        cluster=opts.cluster,
        spec_name=opts.spec_name,
        cpus_per_worker=opts.cpus_per_worker,
        placement=placement_for(cell, opts.placement),
        backend=opts.backend if cell.step.mode != "single" else "none",
        isolation=group.isolation,
        group_id=group.group_id,
        order_seed=group.order_seed,
        group_started_at=started,
        search="race" if group.rule and group.rule["race"] else "grid",
        target_rel=group.rule["target_rel"] if group.rule and group.rule["auto"] else None,
    )


@ray.remote(num_cpus=0, max_retries=0)
def fit_task(group: Group, opts: TrialOptions, outbox: Queue, inbox: Queue | None) -> None:
    """Fit the group's TorchTrainer in a task of its own, so a timeout can kill it with everything it owns."""
    from sweeps.fit.task import fit_group  # torch and Ray Train load here, in the fit's process, not in the trial's

    fit_group(group, opts, outbox, inbox)


class GroupRun:
    """One attempt at a group: launch the fit, follow the outbox, enforce cell_timeout_s; with a planner, send
    the group its rounds through the inbox."""

    def __init__(self, group: Group, opts: TrialOptions, planner: RoundPlanner | None = None) -> None:
        self.group, self.opts, self.planner = group, opts, planner
        self.slots = {(s.cell.cell_id, s.repeat): s for s in group.slots}
        self.ctx = row_context(group, opts, now())
        self.t0 = time.perf_counter()
        self.running: tuple[Slot, datetime, float] | None = None
        self.deadline = self.t0 + opts.group_start_timeout_s  # until the group says it is ready
        self.ready = False
        self.outbox = Queue(actor_options={"num_cpus": 0})
        self.inbox = None if planner is None else Queue(actor_options={"num_cpus": 0})
        for keys in planner.first_rounds() if planner else []:
            self.inbox.put(keys)
        self.pgs_before = leftover.live_placement_groups() if opts.sole_trial else None
        here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=True)
        self.ref = fit_task.options(scheduling_strategy=here).remote(group, opts, self.outbox, self.inbox)

    def _on_message(self, msg: dict) -> list[dict]:
        if msg["kind"] == "calibration":
            return [{"calibration": calibration_rows(msg, self.ctx, self.group.first)}]
        if msg["kind"] == "setup":
            self.ready, self.deadline = True, time.perf_counter() + self.opts.cell_timeout_s
            return []
        slot = self.slots[tuple(msg["key"])]
        t = time.perf_counter()
        if msg["kind"] == "start":
            if self.ctx.group_setup_s is None:
                self.ctx = replace(self.ctx, group_setup_s=t - self.t0)
            self.running, self.deadline = (slot, now(), t), t + self.opts.cell_timeout_s
            return []
        self.running = None
        started = datetime.fromisoformat(msg["started_at"])
        row = build_row(slot, self.ctx, started=started, wall_s=msg["wall_s"], done=msg)
        if self.planner is None:
            return [row]
        rows, messages = self.planner.on_row(row)
        for keys in messages:
            self.inbox.put(keys)
        if messages:  # the worker group is idle until its next round: that wait is not the next cell's
            self.deadline = time.perf_counter() + self.opts.cell_timeout_s
        return rows

    def _drain(self) -> Iterator[dict]:
        for msg in self.outbox.get_nowait_batch(self.outbox.qsize()):
            yield from self._on_message(msg)

    def follow(self) -> Generator[dict, None, str | None]:
        """Yield rows as cells end; return None when the fit ended cleanly, else why it failed."""
        try:
            while True:
                finished, _ = ray.wait([self.ref], timeout=POLL_S)
                yield from self._drain()
                if finished:
                    return self._release(_fit_error(self.ref))
                if time.perf_counter() > self.deadline:
                    ray.cancel(self.ref, force=True)
                    return self._release(self._timed_out())
        finally:
            ray.kill(self.outbox.actor)
            if self.inbox is not None:
                ray.kill(self.inbox.actor)

    def _release(self, why: str | None) -> str | None:
        """After a failed fit: once it has ended, remove a placement group it left reserved (sweeps.trial.leftover)."""
        if why is None or self.pgs_before is None:
            return why
        ray.wait([self.ref], timeout=FIT_END_WAIT_S)
        cell = self.group.first
        bundles = [worker_resources(self.opts)] * cell.world_size
        leftover.remove_left_behind(self.pgs_before, bundles, placement_for(cell, self.opts.placement))
        return why

    def _timed_out(self) -> str:
        if not self.ready:
            return f"worker group not ready after group_start_timeout_s={self.opts.group_start_timeout_s:g} s"
        return f"cell exceeded cell_timeout_s={self.opts.cell_timeout_s:g} s"

    def failed_row(self, message: str) -> dict | None:
        """The error row of the cell that was running when the group failed (if one was)."""
        if self.running is None:
            return None
        slot, started, t = self.running
        row = build_row(slot, self.ctx, started=started, wall_s=time.perf_counter() - t, error=message)
        return row | {"env": row.get("env") or started_with(self.group, self.opts)}


def _fit_error(ref: ray.ObjectRef) -> str | None:
    try:
        ray.get(ref)
        return None
    except RayTaskError as e:
        cause = e.cause if isinstance(e.cause, Exception) else e
        return f"worker group failed: {deaths.explain(f'{type(cause).__name__}: {cause}')}"
    except RayError as e:
        return f"worker group failed: {type(e).__name__}: {e}"


def _each(rows: Iterator[dict], written: set) -> Generator[dict, None, str | None]:
    """Pass `rows` through, noting each cell row's (cell_id, repeat) in `written`; return the generator's value."""
    while True:
        try:
            row = next(rows)
        except StopIteration as stop:
            return stop.value
        if "cell_id" in row:
            written.add((row["cell_id"], row["repeat"]))
        yield row


def calibration_rows(msg: dict, ctx: RowContext, cell: Cell) -> list[dict]:
    """The calibration table's rows (results/storage/schema.py CALIBRATION) from rank 0's message."""
    common = {
        "sweep_id": ctx.sweep_id,
        "cluster": ctx.cluster,
        "group_id": ctx.group_id,
        "world_size": cell.world_size,
        "num_nodes": cell.num_nodes,
        "workers_per_node": cell.workers_per_node,
        "backend": ctx.backend,
        "accelerator": msg.get("fingerprint", {}).get("accelerator", ""),
        "hosts": msg.get("hosts"),
        "measured_at": now(),
    }
    return [common | r for r in msg["rows"]]


def run_group(group: Group, opts: TrialOptions) -> Iterator[dict]:
    """Rows of every slot of the group, each exactly once. A group that fails is re-planned once."""
    written: set[tuple[str, int]] = set()
    current: Group | None = group
    why: str | None = None
    planner: RoundPlanner | None = None
    for _attempt in range(2):
        if group.rule is not None:
            planner = RoundPlanner(current, Rule(**group.rule), before=planner)
        run = GroupRun(current, opts, planner)
        why = yield from _each(run.follow(), written)
        yield from _each(iter(planner.flush() if planner else []), written)
        failed = run.failed_row(why) if why else None
        if failed is not None:
            written.add((failed["cell_id"], failed["repeat"]))
            yield failed
        current = _rest(group, written, planner)
        if current is None:
            if why and not group.slots:  # a calibration's group: no row says why it failed
                yield {"failure": why}
            return
        why = why or "the worker group ended before measuring it"
    ctx = row_context(current, opts, now())
    for slot in current.slots:
        row = build_row(slot, ctx, started=now(), wall_s=0.0, error=f"not measured: group failed twice ({why})")
        yield row | {"env": started_with(current, opts)}


def started_with(group: Group, opts: TrialOptions) -> str:
    """The variables a group's workers were started with, as the spec gave them (a group that never started
    has no fingerprint to say so)."""
    return json.dumps(dict(sorted((opts.env | group.first.env_vars).items())))


def _rest(group: Group, written: set[tuple[str, int]], planner: RoundPlanner | None) -> Group | None:
    """What is left of the group to measure: every slot without a row, less what the decisions removed."""
    if planner is None:
        return group.rest_after(written)
    return group.rest_after(written | planner.skipped((s.cell.cell_id, s.repeat) for s in group.slots))


def trial_fn(config: dict, groups: list[Group], options: TrialOptions) -> None:
    """The Tune trial: measure one group (`config["group"]`: its index in the plan's groups, which Tune passes to
    every trial as they are, through the object store) and report each row (JSON) to the driver as it lands."""
    group, opts = groups[config["group"]], options
    for row in run_group(group, opts):
        if "calibration" in row:
            ray.tune.report({"calibration": json.dumps(row["calibration"], default=str)})
        elif "failure" in row:
            ray.tune.report({"failure": row["failure"]})
        else:
            ray.tune.report({"row": json.dumps(row, default=str)})
