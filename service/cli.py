"""The `ddpsweep` command line, and its measuring commands (run, calibrate). The commands that read a store are
in `service.cli_results`, those that talk to a cluster's job server in `service.cli_cluster`; all are
registered on this one app. Errors become messages and exit code 2 here, at the edge."""

from __future__ import annotations

import json
import os
import shlex
import sys
import traceback
from typing import TYPE_CHECKING, Annotated, Literal

import typer

from service import cli_cluster, cli_results
from service.cli_common import Edge, echo, fail
from trainers.errors import ConfigError, DDPSweepError

if TYPE_CHECKING:
    from sweeps.driver.runner import SweepOutcome
    from sweeps.spec.sweep import SweepSpec

app = typer.Typer(
    cls=Edge,
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    help="Sweep PyTorch DDP communication settings on Ray; query the Parquet results.",
)


@app.callback()
def root() -> None:
    """ddpsweep: sweeps of DDP communication settings on Ray, results as Parquet."""


def _warn_risky_env(spec) -> None:
    """One line per variable that loads code or touches files (the CLI runs them: the machine is the user's), and
    per setting that has no effect."""
    from sweeps.spec import envvars

    for path in envvars.names(spec.env, spec.env_grid):
        why = envvars.warning(path.partition(".")[2])
        if why:
            echo(f"warning: {path}: {why}", err=True)
    for line in spec.warnings():  # settings given that change nothing: said, not silently ignored
        echo(f"warning: {line}", err=True)


@app.command()
def run(
    spec: Annotated[str, typer.Argument(help="a YAML sweep spec, or a packaged one by name (smoke, seed, …)")],
    address: Annotated[
        str | None,
        typer.Option(metavar="HEAD:6379", help="the Ray cluster to run on (or auto); default: an embedded local Ray"),
    ] = None,
    results: Annotated[
        str | None, typer.Option(metavar="URI", help="results root (folder or URI); default: the spec's")
    ] = None,
    cluster: Annotated[
        str | None, typer.Option(metavar="LABEL", help="cluster label for the rows; default: the spec's")
    ] = None,
    resume: Annotated[
        str | None, typer.Option(metavar="SWEEP", help="a sweep to resume: measure only pairs without an ok row")
    ] = None,
    sweep: Annotated[
        str | None, typer.Option("--sweep", metavar="SWEEP", help="the id of the new sweep (default: generated)")
    ] = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="print the grid and start nothing (no workload code runs)")
    ] = False,
    allow_workload: Annotated[
        list[str] | None,
        typer.Option(metavar="MODULE", help="run a workload factory from this installed or standard module"),
    ] = None,
    verbose: Annotated[bool, typer.Option("--verbose", help="show Ray's own logs")] = False,
) -> None:
    """Measure a sweep: one Parquet row per measurement as it lands, then per curve the best bucket with its
    interval and the scaling efficiency. --dry-run prints the grid and whether this machine can run it."""
    from results.errors import StoreFull
    from sweeps.driver import runner, session
    from sweeps.driver.summary import cells_table, summary_text
    from sweeps.plan.planner import plan_sweep
    from sweeps.spec.files import load_spec

    plan = None
    stop_on_signals(session)
    allow(allow_workload or [])
    try:
        plan = plan_sweep(
            load_spec(spec),
            results=results,
            cluster=cluster,
            resume=resume,
            sweep_id=sweep,
            dry_run=dry_run,
        )
        _warn_risky_env(plan.spec)
        if dry_run:
            echo(cells_table(plan.cells, plan.spec.rounds, plan.spec.isolation))  # the grid, always
            if plan.spec.decides:
                echo(f"at most: {_decided(plan.spec)}")
            if plan.spec.workload:
                echo(
                    f"workload {plan.spec.workload}: not imported in a dry run (no workload code runs), so its "
                    "fingerprint is not in these cell ids"
                )
            if not address and not os.environ.get("RAY_ADDRESS"):
                _dry_run_here(runner, plan)  # then: could this machine's embedded Ray run it?
            return
        echo(
            f"sweep {plan.sweep_id}: {len(plan.todo)} of {plan.planned} measurements to run "
            f"in {len(plan.shapes())} worker group(s) -> {plan.store.uri}"
            + (f" (at most: {_decided(plan.spec)})" if plan.spec.decides else "")
        )
        with progress_printer(len(plan.todo)) as progress:
            outcome = runner.execute(
                plan,
                address=address,
                verbose=verbose,
                progress=progress,
                notice=lambda message: echo(f"warning: {message}", err=True),
            )
    except StoreFull as e:
        raise store_full(plan, spec, e) from None
    except DDPSweepError as e:
        if verbose and e.__cause__ is not None:  # the user code's own traceback (a workload that failed)
            echo("".join(traceback.format_exception(e.__cause__)).rstrip(), err=True)
        raise fail(str(e)) from None
    except KeyboardInterrupt:  # Ctrl-C, or SIGTERM (session.Terminated, perhaps re-raised by Tune as a plain one)
        raise interrupted(plan, spec, 143 if session.terminated() else 130) from None
    _print_summary(outcome, summary_text, plan)


def allow(modules: list[str]) -> None:
    """--allow-workload: installed or standard modules whose factories may run, here and on the workers
    (trainers.workload.refused; sweeps.driver.runner passes the variable on)."""
    from trainers.errors import ALLOW_WORKLOAD_ENV

    if modules:
        os.environ[ALLOW_WORKLOAD_ENV] = ",".join(modules)


def stop_on_signals(session) -> None:
    """Ctrl-C and SIGTERM (kill, systemd, Kubernetes, Ray Jobs' stop) interrupt a measuring command: the
    command says so and exits 130 or 143. Tune's own SIGINT handler would end the run quietly instead."""
    session.raise_on_sigterm()
    os.environ["TUNE_DISABLE_SIGINT_HANDLER"] = "1"


def _decided(spec: SweepSpec) -> str:
    """How the trial decides the rounds of a race or of `repeats: auto`."""
    parts = [f"search: {spec.search} drops cells shown {spec.tolerance:.0%} slower from round {spec.min_rounds}"]
    parts = parts if spec.search == "race" else []
    if spec.repeats == "auto":
        parts.append(f"rounds stop once each curve is resolved to ±{spec.target_rel:.0%}")
    return "; ".join(parts)


def _dry_run_here(runner, plan) -> None:
    """The pre-flight against this machine's embedded Ray; when it cannot hold the grid, say so and how to
    check against the cluster the spec is meant for, then exit 2 (the grid is already printed)."""
    try:
        runner.check_local(plan)
    except ConfigError as e:
        echo(f"error: {e}", err=True)
        echo(
            "this machine's embedded Ray cannot run it; to check against the cluster it is meant for: "
            "ddpsweep run SPEC --dry-run --address HEAD:6379 (or RAY_ADDRESS)",
            err=True,
        )
        raise typer.Exit(2) from None


def progress_printer(total: int):
    """Live progress on a terminal, one line per row elsewhere (service.progress); a closed stdout
    (`| head -1`) silences it but never stops the sweep."""
    from service.progress import SweepProgress
    from sweeps.driver.summary import progress_line

    return SweepProgress(total, progress_line)


def interrupted(plan, spec: str, code: int = 130) -> typer.Exit:
    """Ctrl-C (exit 130) or SIGTERM (exit 143): say so, print the exact command that continues the sweep."""
    if plan is None or _no_manifest(plan):
        echo("\ninterrupted before the sweep started measuring; nothing was written", err=True)
        return typer.Exit(code)
    echo(f"\ninterrupted: sweep {plan.sweep_id} stopped; rows already written are kept.", err=True)
    echo(f"continue it with: {resume_command(plan, spec)}", err=True)
    return typer.Exit(code)


def resume_command(plan, spec: str) -> str:
    args = ["ddpsweep", "run", spec, "--resume", plan.sweep_id, "--results", plan.store.uri, "--cluster", plan.cluster]
    return shlex.join(args)


def store_full(plan, spec: str, e: Exception) -> typer.Exit:
    """The results device is full: one line, then (if the sweep had started) how to continue it, exit 2."""
    echo(f"error: {e}; rows already written are kept", err=True)
    if plan is not None and not _no_manifest(plan):
        echo(f"free space, then continue it with: {resume_command(plan, spec)}", err=True)
    return typer.Exit(2)


def _no_manifest(plan) -> bool:
    try:
        return plan.store.read_manifest(plan.cluster, plan.sweep_id) is None
    except Exception:  # noqa: BLE001 — an unreadable store: say nothing was written rather than fail here
        return True


def _print_summary(outcome, summary_text, plan) -> None:
    from results.storage.store import load

    rows = load(outcome.results, cluster=outcome.cluster, sweep=outcome.sweep_id)
    errors = int((rows["status"] == "error").sum())
    echo("\n" + summary_text(rows))
    echo(
        f"\n{len(rows)} rows ({errors} errors) in {outcome.results} cluster={outcome.cluster} sweep={outcome.sweep_id}"
    )
    if errors and errors == len(rows):  # one bad cell never fails the command; a sweep that measured nothing does
        first = str(rows["error"].iloc[0]).strip().splitlines()[0]
        raise fail(f"no measurement succeeded: {errors} error rows, kept in the store; the first: {first}", code=1)


@app.command()
def calibrate(
    spec: Annotated[str, typer.Argument(help="YAML sweep spec: its multi-rank worker-group shapes are calibrated")],
    address: Annotated[str | None, typer.Option(help="Ray cluster; default: embedded local Ray")] = None,
    results: Annotated[str | None, typer.Option(help="results root (folder or URI); default: the spec's")] = None,
    cluster: Annotated[str | None, typer.Option(help="cluster label for the rows; default: the spec's")] = None,
    verbose: Annotated[bool, typer.Option("--verbose", help="show Ray's own logs")] = False,
) -> None:
    """All-reduce bandwidth by message size on the ranks, placement and backend the spec's cells would use;
    prints the α–β fit (rows: the `calibration` table)."""
    from results.model import costmodel
    from results.storage.store import load_calibration
    from sweeps.driver import runner, session
    from sweeps.plan.planner import plan_sweep
    from sweeps.spec.files import load_spec

    stop_on_signals(session)
    try:
        plan = plan_sweep(load_spec(spec), results=results, cluster=cluster, calibrate_only=True)
        if not plan.shapes():
            raise ConfigError("workers", plan.spec.workers, "a spec with at least one multi-rank worker group")
        echo(f"calibration {plan.sweep_id}: {len(plan.shapes())} worker group(s) -> {plan.store.uri}")
        outcome = runner.execute(plan, address=address, verbose=verbose)
        missing = _not_calibrated(len(plan.shapes()), outcome)
        if missing and not outcome.calibrations:
            raise fail(missing, code=1)
        fits = costmodel.summary(load_calibration(plan.store.uri, plan.cluster, plan.sweep_id))
    except KeyboardInterrupt:
        echo("\ninterrupted: calibration stopped; groups already calibrated are kept (run it again)", err=True)
        raise typer.Exit(143 if session.terminated() else 130) from None
    for f in fits.itertuples():
        fit = f"alpha {f.alpha_ms * 1e3:.0f} us, beta {f.beta_gbps:.2f} GB/s algbw"
        echo(
            f"{f.world_size} ranks on {f.num_nodes} node(s), {f.backend}: {fit}, "
            f"max residual {f.max_rel_residual:.0%} (uses the {f.uses}); {costmodel.describe_terms(f)}"
        )
    echo(f"\nrows: ddpsweep query \"select * from calibration where sweep_id = '{plan.sweep_id}'\"")
    if missing:
        raise fail(missing, code=1)


def _not_calibrated(groups: int, outcome: SweepOutcome) -> str | None:
    """What `calibrate` says of the groups that wrote no calibration (their trial died), or None."""
    missing = groups - outcome.calibrations
    if missing <= 0:
        return None
    why = outcome.failures[0].splitlines()[0] if outcome.failures else "trial ended without a calibration"
    return f"{missing} of {groups} worker group(s) not calibrated: {why}"


@app.command()
def predict(
    spec: Annotated[str, typer.Argument(help="a YAML sweep spec, or a packaged one by name")],
    results: Annotated[str | None, typer.Option(metavar="URI", help="results root; default: the spec's")] = None,
    cluster: Annotated[str | None, typer.Option(metavar="LABEL", help="whose calibration; default: the spec's")] = None,
    sweep: Annotated[str | None, typer.Option(metavar="ID", help="a measured sweep of this spec: beside it")] = None,
    fmt: Annotated[Literal["text", "json"], typer.Option("--format", help="lines or JSON")] = "text",
    address: Annotated[
        str | None,
        typer.Option(metavar="HEAD:PORT", help="profile on this Ray cluster (default: RAY_ADDRESS, else here)"),
    ] = None,
) -> None:
    """Each cell's step from the overlap model before anything is measured, and the predicted best bucket of
    every curve: from the cluster's calibration (`ddpsweep calibrate`) and a profile of the workload (run on the
    cluster with --address, else here, and stored, when the store has none). With --sweep: predicted beside
    measured, each cell's prediction_error and each curve's accuracy."""
    from results.model import predicted
    from results.storage.store import Store, load, load_calibration
    from sweeps.predict import steps as model
    from sweeps.spec.files import load_spec

    parsed = load_spec(spec)
    root, label = results or parsed.results, cluster or parsed.cluster
    store = Store.open(root)
    given = model.inputs(parsed, store, label, address)
    if sweep is not None:
        rows, calibration = load(root, cluster=label, sweep=sweep), load_calibration(root, label)
        out = predicted.compare(rows, predicted.profiles_of(store.read_profiles().to_pandas()), calibration)
    if sweep is not None:
        as_json = json.dumps({k: json.loads(v.to_json(orient="records")) for k, v in out.items()})
        echo(as_json if fmt == "json" else predicted.to_text(out))
        return
    table = model.predictions(given)
    echo(table.to_json(orient="records") if fmt == "json" else model.to_text(table, given))


for command in (*cli_results.COMMANDS, *cli_cluster.COMMANDS):
    app.command()(command)  # in this order in --help: measure, read the store, the cluster and the API


@app.command()
def init(
    folder: Annotated[str, typer.Argument(help="where to write them (default: the current folder)")] = ".",
) -> None:
    """Start a sweep of your own model: writes spec.yaml and my_workload.py (a workload skeleton with the
    contract's three members) to edit, then `ddpsweep run spec.yaml --dry-run`. Never overwrites a file."""
    from service.scaffold import next_step, write_starter

    for path in write_starter(folder):
        echo(f"wrote {path}")
    echo(f"next: {next_step(folder)}   (the grid and whether this machine can run it; nothing starts)")


INTERRUPTED_CODES = (130, 143)  # Ctrl-C, SIGTERM


def main() -> None:
    """The console script. After an interrupt, Ray is already shut down and the message printed: the process
    ends at once, since a thread Ray or Tune left behind can hold the interpreter's exit (seen once in CI: the
    message printed, then no exit for 120 s)."""
    try:
        sys.exit(app())
    except SystemExit as e:
        if e.code not in INTERRUPTED_CODES:
            raise
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(e.code)


if __name__ == "__main__":
    main()
