"""Runs in the Tune trial: hands a worker group its rounds one at a time and decides between them (racing,
`repeats: auto`). See results/analysis/racing.py for the rules, DESIGN.md for why this lives in the trial.

The trial sees every row as it streams, so it knows when a round is complete; it then drops the cells the
race shows slower, or ends the group once every curve is resolved, and puts the next round's (cell, repeat)
keys on the group's inbox, where rank 0 takes them and broadcasts them to the other ranks: the group stays
warm between rounds. A round's rows are held until its look (at most one round), so that the rows of a cell
dropped at round r say so (`eliminated_at_round`).
"""

from __future__ import annotations

import time
from collections.abc import Iterable

import pandas as pd

from results.analysis import racing
from sweeps.plan.grid import Group

Key = tuple[str, int]


class RoundPlanner:
    """The rounds of one group under a rule: what to send, what to hold, what was decided."""

    def __init__(self, group: Group, rule: racing.Rule, before: RoundPlanner | None = None) -> None:
        """`before`: the planner of an earlier attempt at this group (its rows and drops carry over)."""
        self.rule = rule
        self.rounds: dict[int, list[Key]] = {}
        for slot in sorted(group.slots, key=lambda s: (s.round, s.order_in_round)):
            self.rounds.setdefault(slot.round, []).append((slot.cell.cell_id, slot.repeat))
        self.order = sorted(self.rounds)
        self.alive = {s.cell.cell_id for s in group.slots}
        self.rivals = _rivals(group) if before is None else before.rivals
        self.eliminated_at: dict[str, int] = {} if before is None else dict(before.eliminated_at)
        self.alive -= set(self.eliminated_at)
        self.ok_rows: list[dict] = list(group.prior) if before is None else list(before.ok_rows)
        for row in [r for r in self.ok_rows if r.get("grad_check") == "failed"]:
            self._fail(row["cell_id"], row["round"])
        self.offset = len({r["round"] for r in group.prior})  # rounds a resumed sweep already measured
        self.held: list[dict] = []
        self.waiting: dict[int, set[Key]] = {}
        self.next_index = 0
        self.finished = False
        self.reason = ""

    def first_rounds(self) -> list[list[Key]]:
        """The rounds sent before any look: the first min_rounds (or all there are), counting those a resumed
        sweep already measured (one at least)."""
        first = max(1, self.rule.min_rounds - self.offset)
        return [self._send() for _ in range(min(first, len(self.order)))]

    def _send(self) -> list[Key]:
        r = self.order[self.next_index]
        self.next_index += 1
        keys = [k for k in self.rounds[r] if k[0] in self.alive]
        self.waiting[r] = set(keys)
        return keys

    def on_row(self, row: dict) -> tuple[list[dict], list[list[Key]]]:
        """A row arrived: (rows to report now, messages for the inbox)."""
        r = row["round"]
        self.waiting.get(r, set()).discard((row["cell_id"], row["repeat"]))
        if row["status"] == "ok" and row.get("grad_check") == "failed":
            self._fail(row["cell_id"], r)
        elif row["status"] == "ok" and row["cell_id"] in self.alive:
            self.ok_rows.append(row)
        self.held.append(row)
        done = self.offset + self.order.index(r) + 1  # rounds complete once this one is, a resume's included
        look = done in self.rule.looks_at
        if self.waiting.get(r):
            return ([] if look else self._release()), []  # a look's rows wait for it
        if look:
            return self._after_round(r)
        presend = done < self.rule.min_rounds and self.next_index < len(self.order)  # already sent
        return self._release(), [] if presend else [self._next(look=False)]

    def _fail(self, cell_id: str, r: int) -> None:
        """A cell whose gradient check failed: never a leader or a rival, measured no more after round r."""
        self.alive.discard(cell_id)
        self.eliminated_at.setdefault(cell_id, r)
        self.ok_rows = [x for x in self.ok_rows if x["cell_id"] != cell_id]

    def _release(self) -> list[dict]:
        out, self.held = self.held, []
        return out

    def _after_round(self, r: int) -> tuple[list[dict], list[list[Key]]]:
        """Round r is complete: look, stamp what was dropped, then the next round or the end."""
        if self.rule.race:
            ok = pd.DataFrame([x for x in self.ok_rows if x["cell_id"] in self.alive])
            for cell_id in racing.eliminated(ok, self.rule, self.rivals) if not ok.empty else set():
                self.alive.discard(cell_id)
                self.eliminated_at[cell_id] = r
        for row in self.held:
            row["eliminated_at_round"] = self.eliminated_at.get(row["cell_id"])
        return self._release(), [self._next(look=True)]

    def _next(self, look: bool) -> list[Key]:
        """The next round's keys, or [] to end the group (and why); `auto` ends it only after a look."""
        if self.next_index >= len(self.order):
            self.reason = f"max_rounds ({len(self.order)}) reached"
        elif look and self.rule.auto and self._resolved():
            self.reason = f"resolved after {self.next_index} rounds"
        elif self.rule.deadline is not None and time.time() > self.rule.deadline:
            self.reason = f"max_sweep_s reached after {self.next_index} rounds"
        elif len(self.alive) < 1:
            self.reason = "no cell left"
        else:
            return self._send()
        self.finished = True
        return []

    def _resolved(self) -> bool:
        ok = pd.DataFrame([x for x in self.ok_rows if x["cell_id"] in self.alive])
        return not ok.empty and racing.resolved(ok, self.rule)

    def flush(self) -> list[dict]:
        """Rows still held when the group ends early (a failure): reported as they are."""
        return self._release()

    def skipped(self, keys: Iterable[Key]) -> set[Key]:
        """Of `keys`, those the decisions removed (dropped cells, rounds after the end): never measured."""
        if self.finished:
            return set(keys)
        return {k for k in keys if k[0] not in self.alive}


def _rivals(group: Group) -> dict[str, int]:
    """Per cell: the cells its curve started with, less itself (the race's Bonferroni count)."""
    keys = racing.CURVE_IN_GROUP
    curve_of = {s.cell.cell_id: tuple(_field(s.cell, k) for k in keys) for s in group.slots}
    sizes: dict[tuple, int] = {}
    for curve in curve_of.values():
        sizes[curve] = sizes.get(curve, 0) + 1
    return {c: sizes[curve] - 1 for c, curve in curve_of.items()}


def _field(cell, name: str):
    """A knob's value for a planned cell (the placement's and the environment's from the cell, as JSON)."""
    placed = ("world_size", "num_nodes", "backend", "env_grid")
    return getattr(cell, name) if name in placed else getattr(cell.step, name, None)
