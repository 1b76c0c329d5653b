"""Live progress of a sweep on a terminal (rich), one line per measurement everywhere else.

On a TTY: a bar that keeps ticking during a long cell — measurements done / planned, errors so far,
the group and cell last finished, elapsed time and the estimated time left — with each finished
measurement's line printed above it. Not a TTY (CI logs, `| tee`, a Ray Job's output): exactly the
line per measurement of before. A closed stdout (`| head -1`) silences output, never the sweep.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from typing import TextIO

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from service.cli_common import printable

LINE_COUNT = re.compile(r"^\[(\d+)/(\d+)\] ")  # the "[done/total] " that starts every progress line


class _LiveOutput:
    """Where output goes: plain text, or (on a TTY, or `live=True`) a rich bar with lines printed above it.
    A closed stream silences the output, never the caller."""

    def __init__(self, stream: TextIO | None, live: bool | None, description: str, total: int | None) -> None:
        self.stream = stream or sys.stdout
        self.live = self.stream.isatty() if live is None else live
        self.errors, self.open = 0, True
        self._bar = _bar(Console(file=self.stream, force_terminal=True)) if self.live else None
        self._task = self._bar.add_task(description, total=total, errors=0) if self._bar else None

    def __enter__(self):
        if self._bar is not None:
            self._bar.start()
        return self

    def __exit__(self, *exc) -> None:
        if self._bar is not None:
            self._bar.stop()

    def _line(self, text: str, **update) -> None:
        """Print `text` (above the bar when live) and, when live, update the bar's task with `update`; its control
        characters escaped (a row's error text is the workload's)."""
        text = printable(text)
        if self._bar is not None:
            self._bar.update(self._task, errors=self.errors, **update)
            self._bar.console.print(text, markup=False, highlight=False)
            return
        if self.open:
            try:
                print(text, file=self.stream, flush=True)
            except (BrokenPipeError, OSError):
                self.open = False


class SweepProgress(_LiveOutput):
    """A progress callback (`progress(row)`) that is also a context manager around the sweep."""

    def __init__(
        self, total: int, line: Callable[[dict, int, int], str], stream: TextIO | None = None, live: bool | None = None
    ) -> None:
        super().__init__(stream, live, "starting worker groups…", total)
        self.total, self.line, self.done = total, line, 0

    def __call__(self, row: dict) -> None:
        self.done += 1
        self.errors += row.get("status") != "ok"
        where = f"group {row.get('group_id') or '-'} · last cell {row.get('cell_id')}"
        self._line(self.line(row, self.done, self.total), advance=1, description=where)


def _bar(console: Console) -> Progress:
    return Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("errors {task.fields[errors]}"),
        TimeElapsedColumn(),
        TextColumn("left"),
        TimeRemainingColumn(),
        console=console,
        refresh_per_second=4,
        transient=False,
    )


class LogProgress(_LiveOutput):
    """A remote sweep's log as it arrives (`feed(chunk)`); on a TTY also a bar fed by its `[done/total]`
    lines (the remote `ddpsweep run` is not on a TTY, so it prints exactly those)."""

    def __init__(self, stream: TextIO | None = None, live: bool | None = None) -> None:
        super().__init__(stream, live, "waiting for the first measurement…", None)

    def feed(self, chunk: str) -> None:
        if self._bar is None:
            if self.open:
                try:
                    print(printable(chunk), end="", file=self.stream, flush=True)
                except (BrokenPipeError, OSError):
                    self.open = False
            return
        for text in chunk.splitlines():
            m = LINE_COUNT.match(text)
            if m:
                self.errors += " ERROR " in text
                self._line(text, completed=int(m[1]), total=int(m[2]), description="measuring")
            else:
                self._line(text)
