"""What the `ddpsweep` commands share: the error exit and the options every command spells the same way."""

from __future__ import annotations

import sys
from typing import Annotated

import typer
from typer.core import TyperGroup

from trainers.errors import DDPSweepError

ResultsOpt = Annotated[str, typer.Option("--results", metavar="URI", help="results root (folder or URI)")]
DEFAULT_RESULTS = "./ddpsweep-results"
DashboardOpt = Annotated[
    str | None,
    typer.Option(
        "--dashboard", metavar="URL", help="the Ray dashboard (job server), e.g. http://HEAD:8265; or RAY_ADDRESS"
    ),
]


def fail(message: str, code: int = 2) -> typer.Exit:
    """`error: MESSAGE` on stderr; the command exits with `code` (2: the input was wrong)."""
    echo(f"error: {message}", err=True)
    return typer.Exit(code)


class Edge(TyperGroup):
    """The CLI's one error handler: any error ddpsweep raises on purpose (trainers.errors.DDPSweepError) is one
    line `error: …` on stderr and exit code 2, whichever command raised it."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except DDPSweepError as e:
            raise fail(str(e)) from None


# Bidirectional overrides and isolates: text that reorders itself on screen (Trojan Source)
_BIDI = {chr(c) for c in (*range(0x202A, 0x202F), *range(0x2066, 0x206A))}


def printable(text: str) -> str:
    """`text` with every control character but newline and tab written as an escape (`\x1b`, `\u202e`): a
    stored label, error or value never reaches a terminal as an escape sequence (an OSC 52 clipboard write, a
    bell, a cursor move) or as text that reorders itself."""
    return "".join(
        c if c in "\n\t" or (c.isprintable() and c not in _BIDI) else c.encode("unicode_escape").decode("ascii")
        for c in text
    )


def echo(text: str, *, err: bool = False, data: bool = False, nl: bool = True) -> None:
    """Print a command's output with its control characters escaped (printable). `data`: a machine format (CSV,
    JSON) kept exact where it goes to a file or a pipe, escaped where it goes to a terminal."""
    stream = sys.stderr if err else sys.stdout
    typer.echo(text if data and not stream.isatty() else printable(text), err=err, nl=nl)
