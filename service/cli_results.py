"""The `ddpsweep` commands that read a results store: query, compact, compare, scaling, report, recommend.
Registered on the one app by `service.cli`."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Literal

import typer

from results.sql.views import VIEWS
from service.cli_common import DEFAULT_RESULTS, ResultsOpt, echo, fail
from trainers.errors import ConfigError

TableFormat = Literal["table", "csv", "json"]  # = results.sql.formats.FORMATS (a Literal needs the values written out)


def query(
    sql: Annotated[str, typer.Argument(help=f"one SELECT over the views {', '.join(VIEWS)}")],
    results: ResultsOpt = DEFAULT_RESULTS,
    fmt: Annotated[TableFormat, typer.Option("--format", help="how to print it")] = "table",
    timeout: Annotated[float, typer.Option(help="wall-clock limit in seconds", min=0.1, max=3600)] = 30.0,
) -> None:
    """The answer to one SQL SELECT over the results (DuckDB, read-only, sandboxed; at most 100000 rows)."""
    from results.sql import isolation
    from results.sql.formats import render_table
    from results.sql.query import query_table

    def expired() -> None:  # an interrupt DuckDB did not honour, or views that ran past the limit
        echo(f"error: query exceeded the time limit of {timeout:g} s", err=True)
        os._exit(2)

    with isolation.memory_limited(), isolation.hard_deadline(timeout + isolation.GRACE_S, expired):
        echo(render_table(query_table(results, sql, timeout_s=timeout), fmt), data=fmt != "table")


def compact(
    results: ResultsOpt = DEFAULT_RESULTS,
    cluster: Annotated[str | None, typer.Option(help="only this cluster")] = None,
    sweep: Annotated[str | None, typer.Option(help="only this sweep id")] = None,
) -> None:
    """Fewer files to read: merge each sweep's one-file-per-row folder into one Parquet file (done after every
    sweep too), then each cluster's compacted sweeps into one pack (not with --sweep)."""
    from results.storage.compaction import compact as run_compact
    from results.storage.store import Store, require_label

    for field, label in (("--cluster", cluster), ("--sweep", sweep)):
        if label is not None:
            require_label(field, label)
    done = run_compact(Store.open(results), cluster, sweep)
    for c in (c for c in done if c.files_read or c.skipped):
        where = f"cluster={c.cluster}" + (" pack" if c.sweep_id == "*" else f" sweep={c.sweep_id}")
        if c.skipped:
            echo(f"{where}: skipped: {c.skipped}", err=True)
        else:
            echo(f"{where}: {c.files_read} file(s) -> 1, {c.rows} rows, {c.files_removed} file(s) removed")
    idle = sum(not c.files_read and not c.skipped for c in done)
    skipped = sum(bool(c.skipped) for c in done)
    counts = f"{len(done) - idle - skipped} compacted, {idle} already compact" + (
        f", {skipped} skipped" * bool(skipped)
    )
    echo(counts if done else "nothing to compact")


def compare(
    cluster: Annotated[list[str], typer.Option("--cluster", help="two cluster labels (one with --history)")],
    results: ResultsOpt = DEFAULT_RESULTS,
    sweep: Annotated[list[str] | None, typer.Option("--sweep", help="restrict to these sweep ids")] = None,
    fmt: Annotated[TableFormat, typer.Option("--format", help="how to print it")] = "table",
    scaling_figure: Annotated[
        str | None, typer.Option(help="also write both clusters' scaling curves on one figure (PNG)")
    ] = None,
    history: Annotated[
        bool,
        typer.Option("--history", help="one cluster over time: each configuration before and after a version change"),
    ] = False,
) -> None:
    """Two clusters side by side: each configuration measured on both, their step ratio with its interval, and
    whether the difference is significant and the rows comparable. With --history, one cluster's sweeps in time
    order: each configuration before and after every change of torch, CUDA, NCCL, driver or Ray version, flagged
    where it changed beyond the noise."""
    import pandas as pd

    from results.analysis.compare import compare as compare_clusters
    from results.sql.formats import render
    from results.storage.store import load

    if history:
        echo(render(_history(results, cluster), fmt), data=fmt != "table")
        return
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
    echo(render(compare_clusters(both, cluster[0], cluster[1]), fmt), data=fmt != "table")
    if scaling_figure:
        _write_scaling_figure(both, scaling_figure)


def _history(results: str, cluster: list[str]):
    from results.analysis.history import history
    from results.storage.store import load

    if len(cluster) != 1:
        raise ConfigError("--cluster", cluster, "exactly one label with --history: --history --cluster C")
    return history(load(results, cluster=cluster[0]), cluster[0])


def _write_scaling_figure(rows, path: str) -> None:
    from results.analysis.scaling import scaling
    from results.render import plots

    table = scaling(rows)
    if table.empty:
        raise ConfigError("--scaling-figure", path, "clusters with DDP rows at more than one topology")
    try:
        plots.scaling_figure(table).savefig(path, format="png", dpi=110)
    except OSError as e:
        raise ConfigError("--scaling-figure", path, f"a writable .png path ({e.strerror or e})") from None
    echo(f"scaling curves: {path}", err=True)


def scaling(
    results: ResultsOpt = DEFAULT_RESULTS,
    cluster: Annotated[list[str] | None, typer.Option("--cluster", help="clusters to include (default all)")] = None,
    sweep: Annotated[str | None, typer.Option("--sweep", help="one sweep id")] = None,
    fmt: Annotated[TableFormat, typer.Option("--format", help="how to print it")] = "table",
) -> None:
    """Throughput and strong-scaling efficiency by topology (nodes x workers per node), with intervals,
    the busbw each topology reached where the sweep calibrated, and the knee."""
    import pandas as pd

    from results.analysis import identity
    from results.analysis.scaling import COLUMNS as scaling_columns
    from results.analysis.scaling import INTERVALS
    from results.analysis.scaling import SERIES as scaling_series
    from results.analysis.scaling import scaling as scaling_table
    from results.sql.formats import render
    from results.storage.store import load, load_calibration
    from results.values import text, with_intervals

    rows = pd.concat([load(results, cluster=c, sweep=sweep) for c in (cluster or [None])], ignore_index=True)
    calibration = pd.concat([load_calibration(results, c, sweep) for c in (cluster or [None])])
    table = scaling_table(rows, calibration)
    render(table.head(0), fmt)  # an unknown --format is refused before anything is printed
    if table.empty:
        raise fail("no ok DDP rows to scale: run a sweep with a topology axis (e.g. topology: [1x1, 1x2, 2x1])")
    if fmt == "table":  # as the report shows it: each figure with its interval, numbers short
        shown = [c for c in identity.with_varying(scaling_columns, table) if c in table.columns]
        echo(render(with_intervals(table, INTERVALS)[shown].map(text), fmt))
    else:  # data: the intervals' bounds in columns of their own
        bounds = [f"{name}_ci_{end}" for name in INTERVALS for end in ("lo", "hi")]
        shown = [c for c in identity.with_varying([*scaling_columns, *bounds], table) if c in table.columns]
        echo(render(table[shown], fmt), data=True)
    varies = identity.varying(table, [k for k in scaling_series if k not in shown])  # a series: all but placement
    series = ["cluster", "gas", "no_sync", "bucket_cap_mb", *varies]
    for _, k in table[table["knee_why"] != ""].iterrows():
        what = "knee" if k["knee"] else "drop"  # every significant drop is named; the knee is the steepest
        echo(f"{what}: {identity.labels(k, series)} at {k['topology']}: {k['knee_why']}", err=fmt != "table")


def report(
    out: Annotated[str, typer.Option("--out", help="report.html, or a folder with --format png")],
    results: ResultsOpt = DEFAULT_RESULTS,
    cluster: Annotated[list[str] | None, typer.Option("--cluster", help="clusters to include (default all)")] = None,
    sweep: Annotated[str | None, typer.Option("--sweep", help="one sweep id")] = None,
    fmt: Annotated[Literal["html", "png"], typer.Option("--format", help="one HTML page or PNG files")] = "html",
) -> None:
    """A self-contained HTML report (figures embedded, every table with its intervals), or the figures as PNGs."""
    import pandas as pd

    from results.analysis.cells import computed_once
    from results.model import predicted
    from results.render.report import render_html, write_pngs
    from results.storage.store import Store, load, load_calibration

    try:
        if fmt not in ("html", "png"):
            raise ConfigError("--format", fmt, "html or png")
        rows = pd.concat([load(results, cluster=c, sweep=sweep) for c in (cluster or [None])], ignore_index=True)
        calibration = pd.concat([load_calibration(results, c, sweep) for c in (cluster or [None])])
        newest = pd.concat([load_calibration(results, c) for c in (cluster or [None])])  # the model's t(bytes)
        with computed_once():  # the prediction and every section read one computation of the cells
            model = predicted.for_rows(rows, Store.open(results).read_profiles().to_pandas(), newest)
            title = f"ddpsweep report: {', '.join(cluster or ['all clusters'])}"
            written = write_pngs(rows, out, calibration, model) if fmt == "png" else None
            if written is None:
                Path(out).write_text(render_html(rows, title, calibration, model))
        if written == []:
            raise ConfigError("--results", results, "a store with ok rows to draw (every row is an error)")
        for path in written or [out]:
            echo(str(path))
    except OSError as e:
        what = "a folder for the PNGs" if fmt == "png" else "a writable .html file path"
        raise fail(f"--out: cannot write {out!r} ({e.strerror or e}); give {what}") from None


def recommend(
    results: ResultsOpt = DEFAULT_RESULTS,
    cluster: Annotated[str | None, typer.Option("--cluster", help="one cluster (default all)")] = None,
    sweep: Annotated[str | None, typer.Option("--sweep", help="one sweep id")] = None,
    fmt: Annotated[Literal["text", "json"], typer.Option("--format", help="sentences or JSON")] = "text",
) -> None:
    """The configuration to paste, per curve (workload, topology, gas): the best measured DDP configuration,
    its gain over PyTorch's defaults with a 95% interval, what cannot be told apart from it, its gradient
    check, and the code; or, when the intervals cannot separate it from the defaults, one sentence saying so."""
    from results.analysis.recommend import recommend as run_recommend
    from results.analysis.recommend import to_json, to_text
    from results.storage.store import load

    if fmt not in ("text", "json"):
        raise ConfigError("--format", fmt, "text or json")
    recs = run_recommend(load(results, cluster=cluster, sweep=sweep))
    echo(to_json(recs) if fmt == "json" else to_text(recs))


COMMANDS = (query, compact, compare, scaling, report, recommend)
