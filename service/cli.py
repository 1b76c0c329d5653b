"""The `ddpsweep` command line. Errors become messages and exit code 2 here, at the edge."""

from __future__ import annotations

import sys
from pathlib import Path
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


ResultsOpt = Annotated[str, typer.Option("--results", help="results root (folder or URI)")]
DEFAULT_RESULTS = "./ddpsweep-results"


@app.command()
def query(
    sql: Annotated[
        str, typer.Argument(help="one SELECT over the views cells, cells_vs_baseline, u_curve, no_sync_gain")
    ],
    results: ResultsOpt = DEFAULT_RESULTS,
    fmt: Annotated[str, typer.Option("--format", help="table | csv | json")] = "table",
) -> None:
    """SQL (DuckDB, read-only, sandboxed) over the results store."""
    from results.query import query as run_query
    from results.query import render

    try:
        typer.echo(render(run_query(results, sql), fmt))
    except ResultsError as e:
        raise fail(str(e)) from None


@app.command()
def compare(
    cluster: Annotated[list[str], typer.Option("--cluster", help="exactly two cluster labels")],
    results: ResultsOpt = DEFAULT_RESULTS,
    sweep: Annotated[list[str] | None, typer.Option("--sweep", help="restrict to these sweep ids")] = None,
    fmt: Annotated[str, typer.Option("--format", help="table | csv | json")] = "table",
) -> None:
    """Two clusters side by side: matched grid positions, ratio, comparability and significance flags."""
    import pandas as pd

    from results.compare import compare as compare_clusters
    from results.query import render
    from results.store import load

    try:
        if len(cluster) != 2:
            raise ConfigError("--cluster", cluster, "exactly two labels: --cluster A --cluster B")
        rows = [load(results, cluster=c) for c in cluster]
        both = pd.concat(rows, ignore_index=True)
        if sweep:
            both = both[both["sweep_id"].isin(sweep)]
        typer.echo(render(compare_clusters(both, cluster[0], cluster[1]), fmt))
    except (ConfigError, ResultsError) as e:
        raise fail(str(e)) from None


@app.command()
def report(
    out: Annotated[str, typer.Option("--out", help="report.html, or a folder with --format png")],
    results: ResultsOpt = DEFAULT_RESULTS,
    cluster: Annotated[list[str] | None, typer.Option("--cluster", help="clusters to include (default all)")] = None,
    sweep: Annotated[str | None, typer.Option("--sweep", help="one sweep id")] = None,
    fmt: Annotated[str, typer.Option("--format", help="html | png")] = "html",
    algbw_gbps: Annotated[float | None, typer.Option(help="all-reduce algbw (GB/s) for the cost model")] = None,
) -> None:
    """A self-contained HTML report (figures embedded), or the figures as PNGs."""
    import pandas as pd

    from results.report import render_html, write_pngs
    from results.store import load

    try:
        if fmt not in ("html", "png"):
            raise ConfigError("--format", fmt, "html or png")
        rows = pd.concat([load(results, cluster=c, sweep=sweep) for c in (cluster or [None])], ignore_index=True)
        algbw = algbw_gbps * 1e9 if algbw_gbps else None
        if fmt == "png":
            for path in write_pngs(rows, out, algbw):
                typer.echo(str(path))
            return
        Path(out).write_text(render_html(rows, f"ddpsweep report: {', '.join(cluster or ['all clusters'])}", algbw))
        typer.echo(out)
    except (ConfigError, ResultsError) as e:
        raise fail(str(e)) from None


def main() -> None:
    sys.exit(app())


if __name__ == "__main__":
    main()
