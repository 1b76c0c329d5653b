"""Decisions a sweep takes while it measures: which cells to stop measuring (`search: race`) and when a curve's
answer is known (`repeats: auto`). Pure functions over the rows a worker group has produced so far; the trial
calls them after every round (sweeps/trial/actor.py), benchmarks/race_check.py on simulated rounds.

The race (F-Race's idea, Birattari 2002, with a bootstrap test in place of Friedman's): at each planned look
(after min_rounds rounds, then about every 1.5x as many: Rule.looks_at), each curve's leader is its cell with
the lowest median step; a cell whose round-blocked ratio to the leader has its lower bound above
1 + tolerance is measured no more. The bound is one-sided at level alpha / (looks x m(m-1)) for a curve of m
cells: Bonferroni over the planned looks and over every ordered pair of cells (the leader is chosen after the
fact, so each test is one of those pairs), so the chance that a race ever drops a cell no slower than
1 + tolerance stays under alpha however many rounds it runs.

A curve is resolved when every remaining cell is decided against its leader: their 95% interval excludes 1
(told apart), or lies within 1 ± target_rel (equal for any purpose the target serves).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np
import pandas as pd

from results.analysis import identity
from results.analysis.uncertainty import cell_replicates, interval

ALPHA = 0.05  # the chance a race drops a cell that is not slower by more than its tolerance
RACE_BOOT = 2000  # replicates per look (the bound is normal on their log ratios)
# A curve inside one group: every knob but the bucket (results.analysis.identity.CURVE_KEYS, less cluster and sweep)
CURVE_IN_GROUP = [k for k in identity.CURVE_KEYS if k not in ("cluster", "sweep_id")]


@dataclass(frozen=True, kw_only=True)
class Rule:
    """How a group decides between rounds."""

    race: bool = False
    """Drop cells shown slower than their curve's leader (`search: race`)."""
    auto: bool = False
    """Stop once every curve is resolved (`repeats: auto`)."""
    min_rounds: int = 3
    """Rounds before the first look."""
    max_rounds: int = 10
    """Rounds planned: the race's looks are counted up to here, and no group measures more."""
    tolerance: float = 0.02
    """race: a cell is dropped only when shown slower than the leader by more than this fraction."""
    target_rel: float = 0.02
    """auto: differences smaller than this fraction count as equal."""
    deadline: float | None = None
    """auto: a wall-clock time (time.time()) after which no new round starts."""

    def __post_init__(self) -> None:
        if not 1 <= self.min_rounds <= self.max_rounds:
            raise ValueError(f"min_rounds: 1..max_rounds ({self.max_rounds}), got {self.min_rounds}")

    @property
    def looks_at(self) -> tuple[int, ...]:
        """The rounds after which the group looks (1-based counts): min_rounds, then each about 1.5x the
        last, and max_rounds. Planned before the first round, so the Bonferroni count is fixed; a geometric
        schedule keeps that count small (6 looks up to 24 rounds), so a long race does not lose its power."""
        rounds = [self.min_rounds]
        while rounds[-1] < self.max_rounds:
            rounds.append(min(self.max_rounds, max(rounds[-1] + 1, math.ceil(rounds[-1] * 1.5))))
        return tuple(rounds)

    @property
    def looks(self) -> int:
        return len(self.looks_at)

    def level(self, comparisons: int) -> float:
        """One-sided level of each of `comparisons` tests at each look."""
        return ALPHA / (self.looks * max(comparisons, 1))


def curves(rows: pd.DataFrame) -> list[pd.DataFrame]:
    """The group's ok rows, split by curve."""
    keys = [k for k in CURVE_IN_GROUP if k in rows]
    if not keys:
        return [rows]
    return [grp for _, grp in rows.groupby(keys, dropna=False, sort=True)]


def _cells(rows: pd.DataFrame, n_boot: int, seed: int) -> pd.DataFrame:
    """Median and round-blocked replicates per cell id (rows of one group)."""
    return cell_replicates(rows, ["cell_id"], seed=seed, n_boot=n_boot).set_index("cell_id")


def versus_leader(rows: pd.DataFrame, n_boot: int, seed: int) -> Iterator[tuple[str, int, np.ndarray]]:
    """Per curve of `rows` (ok rows of one group) with two cells or more: each non-leading cell, the curve's
    cell count and the round-blocked replicates of its step ratio to the leader (the lowest median)."""
    for curve in curves(rows):
        cells = _cells(curve, n_boot, seed)
        if len(cells) < 2:
            continue
        leader = cells["step_ms"].idxmin()
        for cell_id, line in cells.drop(index=leader).iterrows():
            yield str(cell_id), len(cells), line["step_ms_reps"] / cells.loc[leader, "step_ms_reps"]


def eliminated(rows: pd.DataFrame, rule: Rule, rivals: dict[str, int], seed: int = 0) -> set[str]:
    """Cells of `rows` (ok rows of one group, alive cells only) shown slower than their curve's leader by more
    than rule.tolerance. `rivals`: per cell, the cells its curve started with - 1. The leader is picked after
    the fact (the fastest by its own noise), so the test is counted as one of every ordered pair of the curve's
    cells: level alpha / (looks x m(m-1)) with m = rivals + 1. The bound is normal on the log ratio's
    replicates (mean - z sd): smooth where a percentile of a few thousand replicates would rest on two or three."""
    out: set[str] = set()
    for cell_id, n_cells, ratio in versus_leader(rows, RACE_BOOT, seed):
        logs = np.log(ratio[np.isfinite(ratio)])
        m = rivals.get(cell_id, n_cells - 1) + 1
        z = NormalDist().inv_cdf(1 - rule.level(m * (m - 1)))
        if len(logs) > 1 and logs.mean() - z * logs.std() > np.log1p(rule.tolerance):
            out.add(cell_id)
    return out


def resolved(rows: pd.DataFrame, rule: Rule, seed: int = 0) -> bool:
    """Every curve's remaining cells decided against its leader (see the module docstring)."""
    for _, _, ratio in versus_leader(rows, 2000, seed):
        lo, hi = interval(ratio)
        apart = lo > 1 or hi < 1
        equal = 1 / (1 + rule.target_rel) <= lo and hi <= 1 + rule.target_rel
        if not np.isfinite(lo) or not (apart or equal):
            return False
    return True
