"""The `ddpsweep` command line. Errors become messages and exit code 2 here, at the edge."""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from trainers.errors import ConfigError, DDPSweepError

if TYPE_CHECKING:
    from sweeps.spec import SweepSpec

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="Sweep PyTorch DDP communication settings on Ray; query the Parquet results.",
)


@app.callback()
def root() -> None:
    """ddpsweep: sweeps of DDP communication settings on Ray, results as Parquet."""


def fail(message: str, code: int = 2) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(code)


@app.command()
def run(
    spec: Annotated[str, typer.Argument(help="YAML sweep spec, e.g. sweeps/specs/smoke.yaml")],
    address: Annotated[
        str | None, typer.Option(help="Ray cluster (HEAD:6379 or auto); default: embedded local Ray")
    ] = None,
    results: Annotated[str | None, typer.Option(help="results root (folder or URI); default: the spec's")] = None,
    cluster: Annotated[str | None, typer.Option(help="cluster label for the rows; default: the spec's")] = None,
    resume: Annotated[str | None, typer.Option(help="sweep id to resume: measure only pairs without an ok row")] = None,
    sweep_id: Annotated[str | None, typer.Option(help="use this id for a new sweep (default: generated)")] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="print the grid and start nothing")] = False,
    verbose: Annotated[bool, typer.Option("--verbose", help="show Ray's own logs")] = False,
) -> None:
    """Run a sweep: one Ray Tune trial (one warm TorchTrainer) per worker group, one Parquet row per measurement."""
    from results.errors import StoreFull
    from sweeps import runner, session
    from sweeps.specfile import load_spec
    from sweeps.summary import cells_table, summary_text

    plan = None
    stop_on_signals(session)
    try:
        plan = runner.plan_sweep(load_spec(spec), results=results, cluster=cluster, resume=resume, sweep_id=sweep_id)
        if dry_run:
            typer.echo(cells_table(plan.cells, plan.spec.rounds, plan.spec.isolation))  # the grid first, always
            if plan.spec.decides:
                typer.echo(f"at most: {_decided(plan.spec)}")
            if not address and not os.environ.get("RAY_ADDRESS"):
                _dry_run_here(runner, plan)  # then: could this machine's embedded Ray run it?
            return
        typer.echo(
            f"sweep {plan.sweep_id}: {len(plan.todo)} of {plan.planned} measurements to run "
            f"in {len(plan.groups())} worker group(s) -> {plan.store.uri}"
            + (f" (at most: {_decided(plan.spec)})" if plan.spec.decides else "")
        )
        with progress_printer(len(plan.todo)) as progress:
            outcome = runner.execute(
                plan,
                address=address,
                verbose=verbose,
                progress=progress,
                notice=lambda message: typer.echo(f"warning: {message}", err=True),
            )
    except StoreFull as e:
        raise store_full(plan, spec, e) from None
    except DDPSweepError as e:
        raise fail(str(e)) from None
    except KeyboardInterrupt:  # Ctrl-C, or SIGTERM (session.Terminated, perhaps re-raised by Tune as a plain one)
        raise interrupted(plan, spec, 143 if session.terminated() else 130) from None
    _print_summary(outcome, summary_text)


def stop_on_signals(session) -> None:
    """Ctrl-C and SIGTERM (kill, systemd, Kubernetes, Ray Jobs' stop) interrupt a measuring command: the
    command says so and exits 130 or 143. Tune's own SIGINT handler would end the run quietly instead."""
    session.raise_on_sigterm()
    os.environ["TUNE_DISABLE_SIGINT_HANDLER"] = "1"


def _decided(spec: SweepSpec) -> str:
    """How the trial decides the rounds of a race or of `repeats: auto`."""
    parts = [f"search: race drops cells shown {spec.tolerance:.0%} slower from round {spec.min_rounds}"]
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
        typer.echo(f"error: {e}", err=True)
        typer.echo(
            "this machine's embedded Ray cannot run it; to check against the cluster it is meant for: "
            "ddpsweep run SPEC --dry-run --address HEAD:6379 (or RAY_ADDRESS)",
            err=True,
        )
        raise typer.Exit(2) from None


def progress_printer(total: int):
    """Live progress on a terminal, one line per row elsewhere (service.progress); a closed stdout
    (`| head -1`) silences it but never stops the sweep."""
    from service.progress import SweepProgress
    from sweeps.summary import progress_line

    return SweepProgress(total, progress_line)


def interrupted(plan, spec: str, code: int = 130) -> typer.Exit:
    """Ctrl-C (exit 130) or SIGTERM (exit 143): say so, print the exact command that continues the sweep."""
    if plan is None or _no_manifest(plan):
        typer.echo("\ninterrupted before the sweep started measuring; nothing was written", err=True)
        return typer.Exit(code)
    typer.echo(f"\ninterrupted: sweep {plan.sweep_id} stopped; rows already written are kept.", err=True)
    typer.echo(f"continue it with: {resume_command(plan, spec)}", err=True)
    return typer.Exit(code)


def resume_command(plan, spec: str) -> str:
    args = ["ddpsweep", "run", spec, "--resume", plan.sweep_id, "--results", plan.store.uri, "--cluster", plan.cluster]
    return shlex.join(args)


def store_full(plan, spec: str, e: Exception) -> typer.Exit:
    """The results device is full: one line, then (if the sweep had started) how to continue it, exit 2."""
    typer.echo(f"error: {e}; rows already written are kept", err=True)
    if plan is not None and not _no_manifest(plan):
        typer.echo(f"free space, then continue it with: {resume_command(plan, spec)}", err=True)
    return typer.Exit(2)


def _no_manifest(plan) -> bool:
    try:
        return plan.store.read_manifest(plan.cluster, plan.sweep_id) is None
    except Exception:  # noqa: BLE001 — an unreadable store: say nothing was written rather than fail here
        return True


def _print_summary(outcome, summary_text) -> None:
    from results.store import load

    rows = load(outcome.results, cluster=outcome.cluster, sweep=outcome.sweep_id)
    errors = int((rows["status"] == "error").sum())
    typer.echo("\n" + summary_text(rows))
    typer.echo(
        f"\n{len(rows)} rows ({errors} errors) in {outcome.results} cluster={outcome.cluster} sweep={outcome.sweep_id}"
    )


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
    from results import costmodel
    from results.store import load_calibration
    from sweeps import runner, session
    from sweeps.specfile import load_spec

    stop_on_signals(session)
    try:
        plan = runner.plan_sweep(load_spec(spec), results=results, cluster=cluster)
        plan.calibrate_only = True
        if not plan.groups():
            raise ConfigError("workers", plan.spec.workers, "a spec with at least one multi-rank worker group")
        typer.echo(f"calibration {plan.sweep_id}: {len(plan.groups())} worker group(s) -> {plan.store.uri}")
        runner.execute(plan, address=address, verbose=verbose)
        fits = costmodel.fits(load_calibration(plan.store.uri, plan.cluster, plan.sweep_id))
    except DDPSweepError as e:
        raise fail(str(e)) from None
    except KeyboardInterrupt:
        typer.echo("\ninterrupted: calibration stopped; groups already calibrated are kept (run it again)", err=True)
        raise typer.Exit(143 if session.terminated() else 130) from None
    for f in fits.itertuples():
        fit = f"alpha {f.alpha_ms * 1e3:.0f} us, beta {f.beta_gbps:.2f} GB/s algbw"
        typer.echo(
            f"{f.world_size} ranks on {f.num_nodes} node(s), {f.backend}: {fit}, "
            f"max residual {f.max_rel_residual:.0%} (uses the {f.uses})"
        )
    typer.echo(f"\nrows: ddpsweep query \"select * from calibration where sweep_id = '{plan.sweep_id}'\"")


ResultsOpt = Annotated[str, typer.Option("--results", help="results root (folder or URI)")]
DEFAULT_RESULTS = "./ddpsweep-results"


@app.command()
def query(
    sql: Annotated[
        str, typer.Argument(help="one SELECT over the views cells, cells_vs_baseline, u_curve, no_sync_gain")
    ],
    results: ResultsOpt = DEFAULT_RESULTS,
    fmt: Annotated[str, typer.Option("--format", help="table | csv | json")] = "table",
    timeout: Annotated[float, typer.Option(help="wall-clock limit in seconds", min=0.1, max=3600)] = 30.0,
) -> None:
    """SQL (DuckDB, read-only, sandboxed) over the results store (at most 100000 result rows)."""
    from results import isolation
    from results.query import query as run_query
    from results.query import render

    def expired() -> None:  # an interrupt DuckDB did not honour, or views that ran past the limit
        typer.echo(f"error: query exceeded the time limit of {timeout:g} s", err=True)
        os._exit(2)

    try:
        with isolation.memory_limited(), isolation.hard_deadline(timeout + isolation.GRACE_S, expired):
            typer.echo(render(run_query(results, sql, timeout_s=timeout), fmt))
    except DDPSweepError as e:
        raise fail(str(e)) from None


@app.command()
def compact(
    results: ResultsOpt = DEFAULT_RESULTS,
    cluster: Annotated[str | None, typer.Option(help="only this cluster")] = None,
    sweep: Annotated[str | None, typer.Option(help="only this sweep id")] = None,
) -> None:
    """Merge each sweep's one-file-per-row folder into one Parquet file (done after every sweep too), then each
    cluster's compacted sweeps into one pack (not with --sweep)."""
    from results.compaction import compact as run_compact
    from results.store import Store, require_label

    try:
        for field, label in (("--cluster", cluster), ("--sweep", sweep)):
            if label is not None:
                require_label(field, label)
        done = run_compact(Store.open(results), cluster, sweep)
    except DDPSweepError as e:
        raise fail(str(e)) from None
    for c in (c for c in done if c.files_read or c.skipped):
        where = f"cluster={c.cluster}" + (" pack" if c.sweep_id == "*" else f" sweep={c.sweep_id}")
        if c.skipped:
            typer.echo(f"{where}: skipped: {c.skipped}", err=True)
        else:
            typer.echo(f"{where}: {c.files_read} file(s) -> 1, {c.rows} rows, {c.files_removed} file(s) removed")
    idle = sum(not c.files_read and not c.skipped for c in done)
    skipped = sum(bool(c.skipped) for c in done)
    counts = f"{len(done) - idle - skipped} compacted, {idle} already compact" + (
        f", {skipped} skipped" * bool(skipped)
    )
    typer.echo(counts if done else "nothing to compact")


@app.command()
def compare(
    cluster: Annotated[list[str], typer.Option("--cluster", help="exactly two cluster labels")],
    results: ResultsOpt = DEFAULT_RESULTS,
    sweep: Annotated[list[str] | None, typer.Option("--sweep", help="restrict to these sweep ids")] = None,
    fmt: Annotated[str, typer.Option("--format", help="table | csv | json")] = "table",
    scaling_figure: Annotated[
        str | None, typer.Option(help="also write both clusters' scaling curves on one figure (PNG)")
    ] = None,
) -> None:
    """Two clusters side by side: matched grid positions, ratio, comparability and significance flags."""
    import pandas as pd

    from results.compare import compare as compare_clusters
    from results.query import render
    from results.store import load

    try:
        if len(cluster) != 2 or cluster[0] == cluster[1]:
            raise ConfigError("--cluster", cluster, "exactly two different labels: --cluster A --cluster B")
        rows = [load(results, cluster=c) for c in cluster]
        both = pd.concat(rows, ignore_index=True)
        if sweep:
            unknown = sorted(set(sweep) - set(both["sweep_id"]))
            if unknown:
                known = ", ".join(sorted(set(both["sweep_id"])))
                raise ConfigError("--sweep", unknown[0], f"a sweep of these clusters: {known}")
            both = both[both["sweep_id"].isin(sweep)]
        typer.echo(render(compare_clusters(both, cluster[0], cluster[1]), fmt))
        if scaling_figure:
            _write_scaling_figure(both, scaling_figure)
    except DDPSweepError as e:
        raise fail(str(e)) from None


def _write_scaling_figure(rows, path: str) -> None:
    from results import plots
    from results.scaling import scaling

    table = scaling(rows)
    if table.empty:
        raise ConfigError("--scaling-figure", path, "clusters with DDP rows at more than one topology")
    try:
        plots.scaling_figure(table).savefig(path, format="png", dpi=110)
    except OSError as e:
        raise ConfigError("--scaling-figure", path, f"a writable .png path ({e.strerror or e})") from None
    typer.echo(f"scaling curves: {path}", err=True)


@app.command()
def scaling(
    results: ResultsOpt = DEFAULT_RESULTS,
    cluster: Annotated[list[str] | None, typer.Option("--cluster", help="clusters to include (default all)")] = None,
    sweep: Annotated[str | None, typer.Option("--sweep", help="one sweep id")] = None,
    fmt: Annotated[str, typer.Option("--format", help="table | csv | json")] = "table",
) -> None:
    """Throughput and strong-scaling efficiency by topology (nodes x workers per node), with intervals,
    the busbw each topology reached where the sweep calibrated, and the knee."""
    import pandas as pd

    from results.query import render
    from results.scaling import scaling as scaling_table
    from results.store import load, load_calibration

    try:
        rows = pd.concat([load(results, cluster=c, sweep=sweep) for c in (cluster or [None])], ignore_index=True)
        calibration = pd.concat([load_calibration(results, c, sweep) for c in (cluster or [None])])
        table = scaling_table(rows, calibration)
        render(table.head(0), fmt)  # an unknown --format is refused before anything is printed
    except DDPSweepError as e:
        raise fail(str(e)) from None
    if table.empty:
        raise fail("no ok DDP rows to scale: run a sweep with a topology axis (e.g. topology: [1x1, 1x2, 2x1])")
    shown = [
        "cluster",
        "gas",
        "no_sync",
        "bucket_cap_mb",
        "topology",
        "step_ms",
        "tokens_per_s",
        "tokens_per_s_ci_lo",
        "tokens_per_s_ci_hi",
        "efficiency",
        "efficiency_ci_lo",
        "efficiency_ci_hi",
        "vs_previous",
        "vs_previous_ci_lo",
        "vs_previous_ci_hi",
        "comm_share",
        "busbw_gbps",
        "knee",
    ]
    typer.echo(render(table[shown], fmt))
    for k in table[table["knee_why"] != ""].itertuples():
        what = "knee" if k.knee else "drop"  # every significant drop is named; the knee is the steepest
        typer.echo(
            f"{what}: {k.cluster} gas={k.gas} bucket={k.bucket_cap_mb:g} MB at {k.topology}: {k.knee_why}",
            err=fmt != "table",
        )


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
    from results.store import load, load_calibration

    try:
        if fmt not in ("html", "png"):
            raise ConfigError("--format", fmt, "html or png")
        rows = pd.concat([load(results, cluster=c, sweep=sweep) for c in (cluster or [None])], ignore_index=True)
        algbw = algbw_gbps * 1e9 if algbw_gbps else None
        calibration = pd.concat([load_calibration(results, c, sweep) for c in (cluster or [None])])
        if fmt == "png":
            written = write_pngs(rows, out, algbw, calibration)
            if not written:
                raise ConfigError("--results", results, "a store with ok rows to draw (every row is an error)")
            for path in written:
                typer.echo(str(path))
            return
        title = f"ddpsweep report: {', '.join(cluster or ['all clusters'])}"
        Path(out).write_text(render_html(rows, title, algbw, calibration))
        typer.echo(out)
    except DDPSweepError as e:
        raise fail(str(e)) from None
    except OSError as e:
        what = "a folder for the PNGs" if fmt == "png" else "a writable .html file path"
        raise fail(f"--out: cannot write {out!r} ({e.strerror or e}); give {what}") from None


@app.command()
def recommend(
    results: ResultsOpt = DEFAULT_RESULTS,
    cluster: Annotated[str | None, typer.Option("--cluster", help="one cluster (default all)")] = None,
    sweep: Annotated[str | None, typer.Option("--sweep", help="one sweep id")] = None,
    fmt: Annotated[str, typer.Option("--format", help="text | json")] = "text",
) -> None:
    """Per curve (workload, topology, gas): the best measured DDP configuration, its gain over PyTorch's
    defaults with a 95% interval, what cannot be told apart from it, and the code to paste; or, when the
    intervals cannot separate it from the defaults, one sentence saying so."""
    from results.recommend import recommend as run_recommend
    from results.recommend import to_json, to_text
    from results.store import load

    try:
        if fmt not in ("text", "json"):
            raise ConfigError("--format", fmt, "text or json")
        recs = run_recommend(load(results, cluster=cluster, sweep=sweep))
    except DDPSweepError as e:
        raise fail(str(e)) from None
    typer.echo(to_json(recs) if fmt == "json" else to_text(recs))


AddressOpt = Annotated[str | None, typer.Option(help="Ray dashboard, e.g. http://HEAD:8265 (or RAY_ADDRESS)")]


@app.command()
def submit(
    spec: Annotated[str, typer.Argument(help="YAML sweep spec")],
    address: AddressOpt = None,
    cluster: Annotated[str | None, typer.Option(help="cluster label for the rows; default: the spec's")] = None,
    results: Annotated[str | None, typer.Option(help="results root every node can reach; default: the spec's")] = None,
    workdir: Annotated[
        str | None,
        typer.Option(help="folder holding your workload's code, shipped to the cluster (default: the current one)"),
    ] = None,
) -> None:
    """Submit a sweep to a Ray cluster as a Ray Job (validated here first; nothing submitted on error). A spec
    naming your own workload ships --workdir (default: the current directory) with the job."""
    from service import jobs
    from sweeps.specfile import load_spec_text

    try:
        parsed, text = load_spec_text(spec)  # the text submitted is the text validated (env:NAME included)
        sweep_id, job_id = jobs.submit(text, parsed, address=address, cluster=cluster, results=results, workdir=workdir)
    except DDPSweepError as e:
        raise fail(str(e)) from None
    typer.echo(f"sweep {sweep_id} submitted as job {job_id}")


@app.command()
def status(
    sweep_id: Annotated[str | None, typer.Argument(help="one sweep (default: all)")] = None,
    address: AddressOpt = None,
) -> None:
    """Job state and cells written / planned, one sweep or all."""
    from service import jobs

    try:
        found = jobs.status(address, sweep_id)
    except DDPSweepError as e:
        raise fail(str(e)) from None
    if not found:
        typer.echo("no sweeps on this cluster")
    for s in found:
        typer.echo(
            f"{s.sweep_id}  {s.state:<9}  cells {s.written}/{s.planned}  errors {s.errors}  "
            f"cluster={s.cluster}  {s.results}"
        )


@app.command()
def logs(
    sweep_id: Annotated[str, typer.Argument(help="the sweep id")],
    address: AddressOpt = None,
    follow: Annotated[bool, typer.Option("--follow", "-f", help="stream until the job ends")] = False,
) -> None:
    """The sweep job's driver output."""
    import asyncio

    from service import jobs

    try:
        if not follow:
            typer.echo(jobs.logs(address, sweep_id), nl=False)
            return

        from service.progress import LogProgress

        async def stream(out: LogProgress) -> None:
            async for chunk in jobs.follow_logs(address, sweep_id):
                out.feed(chunk)

        with LogProgress() as out:
            asyncio.run(stream(out))
    except DDPSweepError as e:
        raise fail(str(e)) from None


@app.command()
def stop(sweep_id: Annotated[str, typer.Argument(help="the sweep id")], address: AddressOpt = None) -> None:
    """Stop a running sweep (rows already written stay)."""
    from service import jobs

    try:
        stopped = jobs.stop(address, sweep_id)
    except DDPSweepError as e:
        raise fail(str(e)) from None
    typer.echo(f"sweep {sweep_id}: {'stop requested' if stopped else 'was not running'}")


@app.command()
def serve(
    host: Annotated[str, typer.Option(help="interface to bind")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="TCP port", min=1, max=65535)] = 8000,
    address: AddressOpt = None,
    results: ResultsOpt = DEFAULT_RESULTS,
    token: Annotated[str | None, typer.Option(help="bearer token for mutating endpoints (or DDPSWEEP_TOKEN)")] = None,
    allow_host: Annotated[
        list[str], typer.Option("--allow-host", help="another Host name to serve on loopback (e.g. behind a proxy)")
    ] = [],  # noqa: B006 — typer's list default
    allow_workload: Annotated[
        list[str],
        typer.Option("--allow-workload", help="module prefix whose workloads POST /sweeps may name (e.g. acme.models)"),
    ] = [],  # noqa: B006 — typer's list default
    max_rows: Annotated[
        int, typer.Option("--max-rows", min=1, help="rows kept in memory (about 0.5 KB each); more is a 413")
    ] = 5_000_000,
) -> None:
    """The HTTP API (OpenAPI at /openapi.json, docs at /docs). On loopback only requests for 127.0.0.1,
    localhost or ::1 (and --allow-host names) are served: a DNS-rebinding page cannot read the token-free
    endpoints."""
    import os

    import uvicorn

    from service.api import ServiceSettings, create_app
    from service.jobs import is_loopback

    token = token or os.environ.get("DDPSWEEP_TOKEN")
    if not token and not is_loopback(f"http://{host}"):
        raise fail(f"--host {host} is not loopback: set --token or DDPSWEEP_TOKEN before exposing the API")
    if not token:
        import secrets

        token = secrets.token_urlsafe(24)
        typer.echo(f"no token given: this server's bearer token is {token}", err=True)
    loopback = is_loopback(f"http://{host}")
    hosts = ("127.0.0.1", "localhost", "[::1]", "::1") if loopback else None  # beyond loopback: the token guards
    hosts = (*hosts, *allow_host) if hosts is not None else None
    settings = ServiceSettings(
        address=address,
        results=results,
        token=token,
        public_reads=loopback,
        allowed_hosts=hosts,
        allow_workload=tuple(allow_workload),
        max_rows=max_rows,
    )
    uvicorn.run(create_app(settings), host=host, port=port, log_level="warning")


def main() -> None:
    sys.exit(app())


if __name__ == "__main__":
    main()
