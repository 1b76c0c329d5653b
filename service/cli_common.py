"""What the `ddpsweep` commands share: the error exit and the options every command spells the same way."""

from __future__ import annotations

from typing import Annotated

import typer

ResultsOpt = Annotated[str, typer.Option("--results", help="results root (folder or URI)")]
DEFAULT_RESULTS = "./ddpsweep-results"
AddressOpt = Annotated[str | None, typer.Option(help="Ray dashboard, e.g. http://HEAD:8265 (or RAY_ADDRESS)")]


def fail(message: str, code: int = 2) -> typer.Exit:
    """`error: MESSAGE` on stderr; the command exits with `code` (2: the input was wrong)."""
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(code)
