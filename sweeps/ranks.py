"""Runs on every Ray Train worker under `isolation: sweep`: which ranks of the host worker group measure each
cell, the process group each set of ranks uses, and how the other ranks wait.

A cell `nxk` runs on the first k ranks of each of the host's n nodes (ranks in rank order, nodes in the order
of their first rank, so the host's rank 0 is always in it and is the cell's rank 0); a baseline runs on rank 0
alone. Every set of ranks gets its process group once, before the first cell, on every rank, in one order
(`torch.distributed.new_group` is a collective over the whole world). The ranks a cell does not use block on a
key of the rendezvous store that rank 0 sets when the cell is done: a socket read, no collective, so no core
and no GPU spins while they wait.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta

import torch.distributed as dist

from sweeps.grid import Cell, Group

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
    """Each cell's ranks and process group within the host worker group (every rank holds the same)."""

    world: int
    ranks: dict[str, tuple[int, ...]] = field(default_factory=dict)  # cell id -> the ranks that measure it
    unplaced: dict[str, str] = field(default_factory=dict)  # cell id -> why no ranks can (an error row)
    groups: dict[tuple[int, ...], dist.ProcessGroup | None] = field(default_factory=dict)
    checks: dict[tuple[int, ...], dist.ProcessGroup] = field(default_factory=dict)  # the gradient check's (gloo)

    @classmethod
    def build(cls, group: Group, placement: list[dict], grad_check: bool = True) -> Layout:
        """Work out every cell's ranks and create the process groups, and with `grad_check` each set of ranks'
        gloo group for the gradient check (trainers.gradcheck) (a collective: call on every rank)."""
        layout = cls(world=len(placement))
        for slot in group.slots:
            try:
                layout.ranks.setdefault(slot.cell.cell_id, ranks_for(slot.cell, placement))
            except Unplaceable as e:
                layout.unplaced[slot.cell.cell_id] = str(e)
        everyone = tuple(range(layout.world))
        for cell_id in sorted(layout.ranks):  # one order on every rank
            ranks = layout.ranks[cell_id]
            if ranks not in layout.groups:
                layout.groups[ranks] = None if ranks == everyone else dist.new_group(list(ranks))
                if grad_check and len(ranks) > 1:
                    layout.checks[ranks] = dist.new_group(list(ranks), backend="gloo")
        return layout

    def process_group(self, ranks: tuple[int, ...]) -> dist.ProcessGroup | None:
        return self.groups.get(ranks)

    def check_group(self, ranks: tuple[int, ...]) -> dist.ProcessGroup | None:
        return self.checks.get(ranks)


def done_key(cell_id: str, repeat: int) -> str:
    return f"ddpsweep/done/{cell_id}/{repeat}"


def wait_for(cell_id: str, repeat: int) -> None:
    """Block (a store read, no spinning) until rank 0 says the cell is done."""
    dist.distributed_c10d._get_default_store().wait([done_key(cell_id, repeat)], WAIT)


def announce(cell_id: str, repeat: int) -> None:
    """Rank 0: the cell is done; the waiting ranks go on."""
    dist.distributed_c10d._get_default_store().set(done_key(cell_id, repeat), "1")
