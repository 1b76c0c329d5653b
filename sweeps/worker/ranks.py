"""Runs on every Ray Train worker under `isolation: sweep`: which ranks of the host worker group measure each
cell, the process group each set of ranks uses, and how the other ranks wait.

A cell `nxk` runs on the first k ranks of each of the host's n nodes (ranks in rank order, nodes in the order
of their first rank, so the host's rank 0 is always in it and is the cell's rank 0); a baseline runs on rank 0
alone. Every set of ranks gets its process group once, before the first cell, on every rank, in one order
(`torch.distributed.new_group` is a collective over the whole world). The ranks a cell does not use block on a
key of the rendezvous store that rank 0 sets when the cell is done: a socket read, no collective, so no core
and no GPU spins while they wait. A cell's ranks agree on its outcome through the same store (`agree`), never a
collective on the cell's own groups, which a failed rank may have left stuck; after a failure those groups are
destroyed and made anew (`Layout.renew`).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from datetime import timedelta

import torch.distributed as dist

from sweeps.plan.grid import Cell, Group

WAIT = timedelta(days=7)  # the trial's cell_timeout_s ends a hung group long before


class Unplaceable(ValueError):
    """The host worker group's placement cannot give a cell its topology (the message says why)."""


def ranks_for(cell: Cell, placement: list[dict]) -> tuple[int, ...]:
    """The host ranks that measure `cell`; Unplaceable says why the host's placement cannot give them."""
    if cell.step.mode == "single":
        return (0,)
    by_node: dict[str, list[int]] = {}
    for rank, place in enumerate(placement):
        by_node.setdefault(place["node"], []).append(rank)
    nodes = list(by_node)[: cell.num_nodes]
    if len(nodes) < cell.num_nodes:
        raise Unplaceable(
            f"the worker group spans {len(by_node)} node(s); topology {cell.topology} needs {cell.num_nodes}"
        )
    short = [n for n in nodes if len(by_node[n]) < cell.workers_per_node]
    if short:
        have, need = len(by_node[short[0]]), cell.workers_per_node
        raise Unplaceable(f"a node of the worker group holds {have} rank(s); topology {cell.topology} needs {need}")
    return tuple(sorted(r for n in nodes for r in by_node[n][: cell.workers_per_node]))


@dataclass
class Layout:
    """Each cell's ranks and process groups within the host worker group (every rank holds the same). Cells never
    run on the default group: a cell's groups can be destroyed and made anew after a failure (`renew`), while
    the default group and its store carry the worker's own messages."""

    world: int
    ranks: dict[str, tuple[int, ...]] = field(default_factory=dict)  # cell id -> the ranks that measure it
    unplaced: dict[str, str] = field(default_factory=dict)  # cell id -> why no ranks can (an error row)
    groups: dict[tuple[int, ...], dist.ProcessGroup | None] = field(default_factory=dict)
    checks: dict[tuple[int, ...], dist.ProcessGroup] = field(default_factory=dict)  # the gradient check's (gloo)
    grad_check: bool = True

    @classmethod
    def build(cls, group: Group, placement: list[dict], grad_check: bool = True, whole: bool = False) -> Layout:
        """Work out every cell's ranks (`whole`: every rank measures every cell) and create the process groups,
        and with `grad_check` each set of ranks' gloo group for the gradient check (a collective: every rank)."""
        layout = cls(world=len(placement), grad_check=grad_check)
        everyone = tuple(range(layout.world))
        for slot in group.slots:
            try:
                ranks = everyone if whole else ranks_for(slot.cell, placement)
                layout.ranks.setdefault(slot.cell.cell_id, ranks)
            except Unplaceable as e:
                layout.unplaced[slot.cell.cell_id] = str(e)
        for ranks in sorted(set(layout.ranks.values())):  # one order on every rank
            layout._make(ranks)
        return layout

    def _make(self, ranks: tuple[int, ...]) -> None:
        """The groups of one set of ranks (a collective over the whole world: every rank calls it)."""
        self.groups[ranks] = dist.new_group(list(ranks))
        if self.grad_check and len(ranks) > 1:
            self.checks[ranks] = dist.new_group(list(ranks), backend="gloo")

    def renew(self, ranks: tuple[int, ...]) -> None:
        """After a failed cell: its ranks' groups destroyed (their sockets close, so a peer still inside one of
        their collectives fails at once) and made anew (a collective over the whole world: every rank calls it)."""
        self.drop(ranks)
        self._make(ranks)

    def drop(self, ranks: tuple[int, ...]) -> None:
        """Destroy this rank's handles on the groups of `ranks` (no collective)."""
        for table in (self.groups, self.checks):
            pg = table.pop(ranks, None)
            if pg is not None and pg != dist.GroupMember.NON_GROUP_MEMBER:
                dist.destroy_process_group(pg)

    def process_group(self, ranks: tuple[int, ...]) -> dist.ProcessGroup | None:
        return self.groups.get(ranks)

    def check_group(self, ranks: tuple[int, ...]) -> dist.ProcessGroup | None:
        return self.checks.get(ranks)


def _store() -> dist.Store:
    return dist.distributed_c10d._get_default_store()


def _outcome(cell_id: str, repeat: int) -> str:
    return f"ddpsweep/outcome/{cell_id}/{repeat}"


def report_failure(cell_id: str, repeat: int, rank: int, error: str, ranks: tuple[int, ...]) -> None:
    """This rank failed the cell: its error, numbered in the order failures arrive (the first is the cause; the
    peers' own errors follow from it), and a word to every rank's watch (`FailureWatch`)."""
    key, store = _outcome(cell_id, repeat), _store()
    n = store.add(f"{key}/failures", 1)
    store.set(f"{key}/error/{n}", f"rank {rank}: {error}")
    for r in ranks:
        store.set(f"{key}/wake/{r}", "failed")


def agree(cell_id: str, repeat: int, rank: int, ranks: tuple[int, ...], timeout: timedelta) -> str | None:
    """The cell's outcome, the same on each of its ranks: the first failure's error, or None. Through the store,
    never a collective on the cell's groups (one may be stuck); a rank that does not arrive within `timeout` is
    an error of its own."""
    key, store = _outcome(cell_id, repeat), _store()
    store.set(f"{key}/arrived/{rank}", "1")
    try:
        store.wait([f"{key}/arrived/{r}" for r in ranks], timeout)
    except (RuntimeError, dist.DistError):  # the store's timeout
        missing = [r for r in ranks if not store.check([f"{key}/arrived/{r}"])]
        late = f"rank(s) {missing} did not finish the cell within {timeout.total_seconds():g} s"
        return _first_error(store, key) or late
    return _first_error(store, key)


def _first_error(store: dist.Store, key: str) -> str | None:
    if store.add(f"{key}/failures", 0) == 0:
        return None
    store.wait([f"{key}/error/1"], WAIT)  # set right after the count
    return store.get(f"{key}/error/1").decode()


class FailureWatch:
    """While this rank runs a cell: a thread blocked on a store key (no spinning) that, when a peer reports a
    failure, aborts this rank's communicators of the cell, so that a rank held inside an NCCL collective by the
    failed peer is released at once (gloo needs none: the failed rank's destroyed group closes its sockets)."""

    def __init__(self, cell_id: str, repeat: int, rank: int, groups: list[dist.ProcessGroup], abort: bool) -> None:
        self.key = f"{_outcome(cell_id, repeat)}/wake/{rank}"
        self.groups, self.thread = groups, None
        if abort and groups:
            self.thread = threading.Thread(target=self._watch, daemon=True)
            self.thread.start()

    def _watch(self) -> None:
        store = _store()
        store.wait([self.key], WAIT)
        if store.get(self.key) == b"failed":
            for pg in self.groups:
                dist.distributed_c10d._abort_process_group(pg)

    def close(self) -> None:
        """This rank's part of the cell is over: the thread ends (a later failure of a peer needs no abort here)."""
        if self.thread is not None:
            store = _store()
            if not store.check([self.key]):
                store.set(self.key, "over")
            self.thread.join()
        self.groups = []


def done_key(cell_id: str, repeat: int) -> str:
    return f"ddpsweep/done/{cell_id}/{repeat}"


def wait_for(cell_id: str, repeat: int) -> bool:
    """Block (a store read, no spinning) until rank 0 says the cell is done; True when it failed (its groups are
    then made anew, with every rank)."""
    store = dist.distributed_c10d._get_default_store()
    store.wait([done_key(cell_id, repeat)], WAIT)
    return store.get(done_key(cell_id, repeat)) == b"failed"


def announce(cell_id: str, repeat: int, failed: bool = False) -> None:
    """Rank 0: the cell is done; the waiting ranks go on."""
    dist.distributed_c10d._get_default_store().set(done_key(cell_id, repeat), "failed" if failed else "ok")
