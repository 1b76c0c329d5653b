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

LINE_COUNT = re.compile(r"^\[(\d+)/(\d+)\] ")  # the "[done/total] " that starts every progress line


class SweepProgress:
    """A progress callback (`progress(row)`) that is also a context manager around the sweep."""

    def __init__(self, total: int, line: Callable[[dict, int, int], str], stream: TextIO | None = None,
                 live: bool | None = None) -> None:  # fmt: skip
        self.total, self.line, self.done, self.errors, self.open = total, line, 0, 0, True
        self.stream = stream or sys.stdout
        self.live = self.stream.isatty() if live is None else live
        self._bar: Progress | None = None
        self._task = None

    def __enter__(self) -> SweepProgress:
        if self.live:
            self._bar = _bar(Console(file=self.stream, force_terminal=True))
            self._task = self._bar.add_task("starting worker groups…", total=self.total, errors=0)
            self._bar.start()
        return self

    def __exit__(self, *exc) -> None:
        if self._bar is not None:
            self._bar.stop()

    def __call__(self, row: dict) -> None:
        self.done += 1
        self.errors += row.get("status") != "ok"
        text = self.line(row, self.done, self.total)
        if self._bar is not None:
            where = f"group {row.get('group_id') or '-'} · last cell {row.get('cell_id')}"
            self._bar.update(self._task, advance=1, description=where, errors=self.errors)
            self._bar.console.print(text, markup=False, highlight=False)
        else:
            self._echo(text)

    def _echo(self, text: str) -> None:
        if not self.open:
            return
        try:
            print(text, file=self.stream, flush=True)
        except (BrokenPipeError, OSError):
            self.open = False


def _bar(console: Console) -> Progress:
    return Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TextColumn("errors {task.fields[errors]}"), TimeElapsedColumn(), TextColumn("left"),
                    TimeRemainingColumn(), console=console, refresh_per_second=4, transient=False)  # fmt: skip


class LogProgress:
    """A remote sweep's log as it arrives (`feed(chunk)`); on a TTY also a bar fed by its `[done/total]`
    lines (the remote `ddpsweep run` is not on a TTY, so it prints exactly those)."""

    def __init__(self, stream: TextIO | None = None, live: bool | None = None) -> None:
        self.stream = stream or sys.stdout
        self.live = self.stream.isatty() if live is None else live
        self._bar = _bar(Console(file=self.stream, force_terminal=True)) if self.live else None
        self._task = (
            self._bar.add_task("waiting for the first measurement…", total=None, errors=0) if self._bar else None
        )
        self.errors = 0

    def __enter__(self) -> LogProgress:
        if self._bar is not None:
            self._bar.start()
        return self

    def __exit__(self, *exc) -> None:
        if self._bar is not None:
            self._bar.stop()

    def feed(self, chunk: str) -> None:
        if self._bar is None:
            print(chunk, end="", file=self.stream, flush=True)
            return
        for text in chunk.splitlines():
            self._bar.console.print(text, markup=False, highlight=False)
            m = LINE_COUNT.match(text)
            if m:
                self.errors += " ERROR " in text
                self._bar.update(self._task, completed=int(m[1]), total=int(m[2]), errors=self.errors,
                                 description="measuring")  # fmt: skip
