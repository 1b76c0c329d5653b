"""Runs in the trial: removes the placement group of a fit that was killed before Ray Train could clean it up.

A placement group lives as long as the job that made it, not as long as the actor that made it, and Ray Train
registers a worker group's placement group with its cleaner only once the workers run
(`PlacementGroupCleanerCallback.after_worker_group_start`). A fit cancelled between the two — at
group_start_timeout_s, while the group waits for resources or starts its actors — left its CPUs (and GPUs)
reserved for the rest of the sweep, and every later group timed out waiting for them (seen in this project's
tests: four sweeps in a row, each cell "worker group did not start within 60 s").

What is removed is told apart by when and what it is: made after the fit was launched, not yet removed, with
this group's bundles and strategy. That is only safe while no other trial makes worker groups at the same
time (max_concurrent_trials == 1, the default), so the trial asks only then.
"""

from __future__ import annotations

import time

import ray
from ray.util.placement_group import PlacementGroup, placement_group_table, remove_placement_group

SETTLE_S = 3.0  # how long after the fit ended a controller still dying may yet create its group
POLL_S = 0.5


def live_placement_groups() -> set[str]:
    """Ids (hex) of every placement group not yet removed."""
    return {pg_id for pg_id, pg in placement_group_table().items() if pg["state"] != "REMOVED"}


def _same_shape(entry: dict, bundles: list[dict[str, float]], strategy: str) -> bool:
    have = [{k: float(v) for k, v in b.items()} for _, b in sorted(entry["bundles"].items())]
    want = [{k: float(v) for k, v in b.items()} for b in bundles]
    return entry["strategy"] == strategy and have == want


def left_behind(before: set[str], bundles: list[dict[str, float]], strategy: str) -> list[str]:
    """Placement groups made since `before` (ids from live_placement_groups), still reserved, of this shape."""
    return [
        pg_id
        for pg_id, entry in placement_group_table().items()
        if pg_id not in before and entry["state"] != "REMOVED" and _same_shape(entry, bundles, strategy)
    ]


def remove_left_behind(
    before: set[str], bundles: list[dict[str, float]], strategy: str, *, settle_s: float = SETTLE_S
) -> list[str]:
    """Remove what left_behind finds, looking again for `settle_s` (a group made by a controller that had not
    yet died when the fit did); returns the ids removed. Call once the fit has ended."""
    removed: list[str] = []
    end = time.monotonic() + settle_s
    while True:
        for pg_id in left_behind(before | set(removed), bundles, strategy):
            remove_placement_group(handle(pg_id))
            removed.append(pg_id)
        if time.monotonic() >= end:
            return removed
        time.sleep(POLL_S)


def handle(hex_id: str) -> PlacementGroup:
    """The placement group of an id from placement_group_table."""
    return PlacementGroup(ray.PlacementGroupID.from_hex(hex_id))
