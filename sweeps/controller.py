"""Runs in Ray Train's controller actor: the callback that marks the group's start (sweeps.startmarks).

`StartMarks` uses Ray Train V2's callback interface (`RunConfig(callbacks=…)`, a developer API whose base
classes live in `ray.train.v2._internal.execution.callback` in Ray 2.60). It posts its marks to the trial's
outbox once the worker group has started, before the worker function runs. Where that interface is missing (another
Ray), no callback is added and the rows' start parts lack the controller's marks.
"""

from __future__ import annotations

import contextlib
import time

try:
    from ray.train.v2._internal.execution.callback import ControllerCallback, WorkerGroupCallback
except ImportError:  # pragma: no cover - another Ray
    ControllerCallback = WorkerGroupCallback = None  # type: ignore[assignment,misc]


if ControllerCallback is not None:

    class StartMarks(ControllerCallback, WorkerGroupCallback):
        """Runs in Ray Train's controller: marks the controller's start, the worker actors and Ray Train's context,
        and posts them to the outbox as {"kind": "start_marks", "marks": {...}} before the worker function runs."""

        def __init__(self, outbox) -> None:
            self.outbox = outbox
            self.marks: dict[str, float] = {}

        def after_controller_start(self, train_run_context) -> None:
            self.marks["controller"] = time.time()

        def before_init_train_context(self, workers) -> dict:
            self.marks["worker_actors"] = time.time()
            return {}

        def after_worker_group_start(self, worker_group) -> None:
            self.marks["train_context"] = time.time()  # after Ray's own callbacks: the process group is made
            with contextlib.suppress(Exception):  # the marks are a record: losing them never fails the group
                self.outbox.put({"kind": "start_marks", "marks": dict(self.marks)})


def start_callbacks(outbox) -> list:
    """The callbacks a group's TorchTrainer runs in its controller (none where Ray lacks the interface)."""
    return [StartMarks(outbox)] if ControllerCallback is not None else []
