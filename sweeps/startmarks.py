"""The group's start in parts: when each stage of a worker group's start was reached (wall clock, s).

Stages, in order, each marked when it is reached (and by whom):

- `fit_task`: the fit task has imported Ray Train (not torch: `sweeps.backend`) and calls `fit()` (the fit task)
- `controller`: Ray Train's controller actor is up and asks for its worker group (the controller)
- `placement_group`: the placement group is ready and the first worker process is created (the workers' start)
- `worker_actors`: every worker actor is up: processes started, Ray Train's worker imported (the controller)
- `train_context`: Ray Train's context is on every worker and torch's process group is made (the controller)
- `workers_running`: our worker function runs on every rank (the workers)
- ours, on the workers: `process_groups` (placement gathered, subgroups made), `model` (fingerprint and template
  model), `warm_up` (the unrecorded first cell), `calibration` (where asked)

The controller's marks come from `sweeps.controller.StartMarks`, a Ray Train callback; where Ray lacks that
interface they are absent, and the next part present counts from the fit task's mark. This module imports no
Ray: the trial uses it.
"""

from __future__ import annotations

import json

ORDER = (
    "fit_task",
    "controller",
    "placement_group",
    "worker_actors",
    "train_context",
    "workers_running",
    "process_groups",
    "model",
    "warm_up",
    "calibration",
)


def setup_parts(launched: float, marks: dict[str, float]) -> str:
    """The stages' durations (s, JSON, in ORDER): each from the previous mark present (the first from
    `launched`, when the trial launched the fit). A mark earlier than the one before it (a worker process that
    Ray started before the group asked for it) counts as reached at once (0 s)."""
    parts, previous = {}, launched
    for name in ORDER:
        if name not in marks:
            continue
        t = max(marks[name], previous)
        parts[name] = round(t - previous, 3)
        previous = t
    return json.dumps(parts)
