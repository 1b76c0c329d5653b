"""The `ddpsweep` command line. Errors become messages and exit code 2 here, at the edge."""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from results.errors import ResultsError
from trainers.errors import ConfigError

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Sweep PyTorch DDP communication settings on Ray; query the Parquet results.")  # fmt: skip


@app.callback()
def root() -> None:
    """ddpsweep: sweeps of DDP communication settings on Ray, results as Parquet."""


def fail(message: str, code: int = 2) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(code)


@app.command()
def run(
    spec: Annotated[str, typer.Argument(help="YAML sweep spec, e.g. sweeps/specs/smoke.yaml")],
    address: Annotated[str | None, typer.Option(help="Ray cluster to attach to (default: embedded local Ray)")] = None,
    results: Annotated[str | None, typer.Option(help="results root (folder or URI); default: the spec's")] = None,
    cluster: Annotated[str | None, typer.Option(help="cluster label for the rows; default: the spec's")] = None,
    resume: Annotated[str | None, typer.Option(help="sweep id to resume: measure only pairs without an ok row")] = None,
    sweep_id: Annotated[str | None, typer.Option(help="use this id for a new sweep (default: generated)")] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="print the grid and start nothing")] = False,
    verbose: Annotated[bool, typer.Option("--verbose", help="show Ray's own logs")] = False,
) -> None:
    """Run a sweep: one Ray Tune trial (one TorchTrainer) per cell, one Parquet row per cell."""
    from sweeps import runner
    from sweeps.grid import cells_table
    from sweeps.spec import load_spec
    from sweeps.summary import progress_line, summary_text

    try:
        plan = runner.plan_sweep(load_spec(spec), results=results, cluster=cluster, resume=resume, sweep_id=sweep_id)
        if dry_run:
            typer.echo(cells_table(plan.cells, plan.spec.repeats))
            return
        typer.echo(f"sweep {plan.sweep_id}: {len(plan.todo)} of {plan.planned} trials to run -> {plan.store.uri}")
        done = [0]

        def progress(row: dict) -> None:
            done[0] += 1
            typer.echo(progress_line(row, done[0], len(plan.todo)))

        outcome = runner.execute(plan, address=address, verbose=verbose, progress=progress)
    except (ConfigError, ResultsError) as e:
        raise fail(str(e)) from None
    _print_summary(outcome, summary_text)


def _print_summary(outcome, summary_text) -> None:
    from results.store import load

    rows = load(outcome.results, cluster=outcome.cluster, sweep=outcome.sweep_id)
    errors = int((rows["status"] == "error").sum())
    typer.echo("\n" + summary_text(rows))
    typer.echo(f"\n{len(rows)} rows ({errors} errors) in {outcome.results} "
               f"cluster={outcome.cluster} sweep={outcome.sweep_id}")  # fmt: skip


def main() -> None:
    sys.exit(app())


if __name__ == "__main__":
    main()
