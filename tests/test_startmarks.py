"""The group's start in parts (sweeps.startmarks): marks from three kinds of process become ordered durations."""

from __future__ import annotations

import json

from sweeps.startmarks import ORDER, setup_parts


def test_parts_follow_the_stage_order_whatever_order_the_marks_arrived_in():
    marks = {"warm_up": 109.0, "controller": 103.5, "fit_task": 101.0, "workers_running": 108.0, "model": 108.5}
    parts = json.loads(setup_parts(100.0, marks))
    assert list(parts) == ["fit_task", "controller", "workers_running", "model", "warm_up"]
    assert parts == {"fit_task": 1.0, "controller": 2.5, "workers_running": 4.5, "model": 0.5, "warm_up": 0.5}
    assert sum(parts.values()) == 9.0  # launched -> the last mark


def test_a_worker_process_started_before_the_group_asked_counts_as_reached_at_once():
    # a pooled process Ray started earlier: its creation time is before the controller's mark
    marks = {"fit_task": 101.0, "controller": 104.0, "placement_group": 90.0, "worker_actors": 106.0}
    parts = json.loads(setup_parts(100.0, marks))
    assert parts["placement_group"] == 0.0 and parts["worker_actors"] == 2.0
    assert min(parts.values()) >= 0 and sum(parts.values()) == 6.0


def test_every_stage_has_a_place_in_the_order():
    assert len(set(ORDER)) == len(ORDER) and ORDER[0] == "fit_task" and ORDER[-1] == "calibration"
    assert setup_parts(5.0, {}) == "{}"
