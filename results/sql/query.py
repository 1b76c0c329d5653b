"""SQL over the store with DuckDB, sandboxed: read-only SELECTs over in-memory views, no file access.

The sandbox has several independent walls, so that one hole is not an escape:
  1. only plain SELECT statements are accepted (no EXPLAIN: `EXPLAIN ANALYZE` executes its inner
     statement, COPY and CREATE included);
  2. the connection is in-memory with external access, extensions and persistent secrets off,
     no spill directory (DuckDB's default `<cwd>/.tmp/` is an allowed directory), and its
     configuration locked;
  3. a wall-clock limit (the connection is interrupted) and a result-size limit;
  4. error messages are scrubbed of the server's paths (working directory, home, store root).

Views: `results.sql.views.VIEWS` names each and says what it holds.
"""

from __future__ import annotations

import importlib
import os
import re
import threading
from typing import TYPE_CHECKING

import duckdb
import pyarrow as pa

from results.errors import QueryError, StoreNotFound
from results.sql import isolation
from results.sql.views import VIEWS
from results.storage import reader
from results.storage.schema import SCHEMA
from results.storage.store import Store

if TYPE_CHECKING:
    import pandas as pd

QUERY_TIMEOUT_S = 30.0  # wall clock per query
MAX_RESULT_ROWS = 100_000
NOWHERE = "/nonexistent/ddpsweep"  # where DuckDB would look for secrets and extensions: never the server's home


def views(root: str, sql: str | None = None) -> dict[str, pd.DataFrame | object]:
    """The query views of a store (arrow table for `cells`, DataFrames for the analyses); with `sql`, only
    those it can use (see views_of)."""
    store = Store.open(root)
    profiles = store.read_profiles() if _uses(sql, *PREDICTED) else None
    return views_of(store.read_table(columns=_columns(sql)), store.read_calibration(), sql, root, profiles)


INTERVAL_COLUMNS = ["step_ms_ci_lo", "step_ms_ci_hi", "n_repeats", "n_steps"]
CELL_FLAGS = ["round_drifted", "noisy"]
ANALYSES = {  # view -> the results function that builds it from rows (imported only when a query needs one)
    "cells_vs_baseline": "analysis.cells.with_baseline",
    "u_curve": "analysis.cells.u_curve",
    "no_sync_gain": "analysis.cells.no_sync_gain",
    "gradient_checks": "analysis.cells.gradient_checks",
    "stragglers": "analysis.stragglers.stragglers",
}


PREDICTED = ("predicted", "u_curve")  # the views that set the overlap model's predictions beside the measurements
ROW_VIEWS = (*INTERVAL_COLUMNS, *CELL_FLAGS, "cell_intervals", *ANALYSES, *PREDICTED)  # views built from whole rows


def _uses(sql: str | None, *names: str) -> bool:
    """Whether `sql` can reach any of `names` (a name, `*` or DuckDB's COLUMNS(...) selects by pattern).
    A view or column can only be reached through its name or one of those: a view the query cannot
    reach is not computed (the analyses bootstrap every cell; `select count(*) from cells` needs none)."""
    if sql is None:
        return True
    text = sql.lower()
    return "*" in text.replace("count(*)", "") or "columns(" in text or any(n in text for n in names)


def _columns(sql: str | None) -> list[str] | None:
    """The row columns `sql` can reach (None: all): only those are decoded from the files. Every analysis
    view needs whole rows; otherwise a column is reached only through its name (or `*`, COLUMNS(...))."""
    if _uses(sql, *ROW_VIEWS):
        return None
    text = sql.lower() if sql else ""
    return [f.name for f in SCHEMA if f.name in text]


def views_of(
    table: pa.Table,
    calibration: pd.DataFrame | pa.Table,
    sql: str | None = None,
    root: str = "the store",
    profiles: pa.Table | None = None,
) -> dict[str, pd.DataFrame | object]:
    """The views over rows already read (the server keeps them in memory); `profiles`: Store.read_profiles(),
    for the predictions. pandas and the analyses are imported only for a query that reaches an analysis view:
    `select count(*) from cells` needs neither."""
    if table.num_rows == 0 and len(calibration) == 0:
        raise StoreNotFound(f"no results under {root!r}: run a sweep first (ddpsweep run SPEC --results {root})")
    out: dict[str, pd.DataFrame | object] = {"calibration": calibration}
    columns = _columns(sql)
    if columns is not None:  # the CLI reads only these; the server narrows its cached rows the same way
        keep = set(reader.projection(columns).names)
        table = table.select([c for c in table.column_names if c in keep])
    rows = table.to_pandas() if _uses(sql, *ROW_VIEWS) else None
    if rows is not None:
        from results.analysis import cells as analysis
    if rows is not None and _uses(sql, *INTERVAL_COLUMNS, "cell_intervals"):
        out["cell_intervals"] = analysis.ok_cells(rows)[[*analysis.CONFIG_KEYS, *INTERVAL_COLUMNS]]
    if rows is not None and _uses(sql, *CELL_FLAGS):
        table = table.append_column("round_drifted", pa.array(analysis.drifted_rounds(rows).to_numpy()))
        table = table.append_column("noisy", pa.array(analysis.noisy_rows(rows).to_numpy()))
    out["cells"] = table
    if _uses(sql, "alpha_beta"):
        from results.model import costmodel

        frame = calibration.to_pandas() if isinstance(calibration, pa.Table) else calibration
        out["alpha_beta"] = costmodel.summary(frame)
    for name, where in ANALYSES.items():
        if rows is not None and _uses(sql, name):
            module, function = where.rsplit(".", 1)
            out[name] = getattr(importlib.import_module(f"results.{module}"), function)(rows)
    if rows is not None and _uses(sql, *PREDICTED):
        out |= _predicted_views(rows, calibration, profiles, out.get("u_curve"))
    return out


def _predicted_views(rows: pd.DataFrame, calibration, profiles: pa.Table | None, u_curve) -> dict[str, pd.DataFrame]:
    """`predicted` (each measured DDP cell beside its prediction) and u_curve with each curve's accuracy."""
    from results.model import predicted

    frame = calibration.to_pandas() if isinstance(calibration, pa.Table) else calibration
    given = predicted.profiles_of(None if profiles is None else profiles.to_pandas())
    out = predicted.compare(rows, given, frame) if given else None
    cells = predicted.cell_view(out) if out else predicted.empty_view()
    return {"predicted": cells} | ({} if u_curve is None else {"u_curve": predicted.with_accuracy(u_curve, out)})


def _cells_view() -> str:
    """`cells`: every row, with its configuration's interval (the same on every repeat of it)."""
    from results.analysis.identity import CONFIG_KEYS

    on = " AND ".join(f'c."{k}" IS NOT DISTINCT FROM i."{k}"' for k in CONFIG_KEYS)
    extra = ", ".join(f'i."{c}"' for c in INTERVAL_COLUMNS)
    return f'CREATE VIEW "cells" AS SELECT c.*, {extra} FROM "_cells" c LEFT JOIN "_cell_intervals" i ON {on}'


# Connection settings fixed before anything runs; the paths must be set before external access is off.
_CONFIG = {
    "threads": 2,
    "memory_limit": "2GB",
    "temp_directory": "",
    "secret_directory": NOWHERE,
    "extension_directory": NOWHERE,
    "allow_persistent_secrets": False,
}
_LOCKDOWN = [
    "SET enable_external_access = false",
    "SET autoinstall_known_extensions = false",
    "SET autoload_known_extensions = false",
    "SET allow_community_extensions = false",
    "SET lock_configuration = true",
]


def sandboxed(frames: dict[str, object]) -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB holding `frames` as views, then locked: no file, network or extension access."""
    con = duckdb.connect(":memory:", config=dict(_CONFIG))
    for name, frame in frames.items():
        if len(getattr(frame, "columns", [None])) == 0:  # an analysis of no cells (calibration only)
            frame = pa.table({"no_rows": pa.array([], pa.bool_())})
        con.register(f"_{name}", frame)
        if name != "cells":
            con.execute(f'CREATE VIEW "{name}" AS SELECT * FROM "_{name}"')
    con.execute(_cells_view() if "cell_intervals" in frames else 'CREATE VIEW "cells" AS SELECT * FROM "_cells"')
    for statement in _LOCKDOWN:
        con.execute(statement)
    return con


def check_read_only(sql: str) -> None:
    """Only plain SELECT statements: no EXPLAIN, COPY, ATTACH, INSTALL, LOAD, SET, CREATE, PRAGMA…"""
    try:
        statements = duckdb.extract_statements(sql)
    except duckdb.Error as e:
        raise QueryError(scrub(str(e))) from None
    if not statements:
        raise QueryError("empty query: give one SELECT statement")
    for st in statements:
        if st.type != duckdb.StatementType.SELECT:
            raise QueryError(f"refused: {st.type.name} statements are not allowed; queries are read-only SELECTs")


def _no_such_view(message: str) -> str | None:
    """DuckDB's "Table with name X does not exist! Did you mean "pg_enum"?" as the views there are, or None."""
    found = re.search(r"Table with name (\S+) does not exist", message)
    if found is None:
        return None
    return f"no view named {found.group(1)!r}; the views: {', '.join(VIEWS)}"


def scrub(message: str, *extra: str) -> str:
    """An error message without the server's paths (working directory, home, and any `extra`)."""
    paths = [p for p in (*extra, os.getcwd(), os.path.expanduser("~")) if p and p != "/"]
    for path in sorted(paths, key=len, reverse=True):
        message = message.replace(path, "<path>")
    return message


def run_limited(
    con: duckdb.DuckDBPyConnection, sql: str, timeout_s: float, max_rows: int, max_bytes: int | None = None
) -> pa.Table:
    """Run `sql` on `con`; interrupt it after timeout_s, refuse results over max_rows rows or
    isolation.MAX_RESULT_BYTES bytes."""
    timer = threading.Timer(timeout_s, con.interrupt)
    timer.start()
    try:
        rel = con.sql(sql)
        check_result_columns(rel.columns, [str(t) for t in rel.types])
        reader = rel.to_arrow_reader(10_000)
        batches, rows, size = [], 0, 0
        for batch in reader:
            rows, size = rows + batch.num_rows, size + batch.nbytes
            if rows > max_rows:
                raise QueryError(f"result too large: over {max_rows} rows; add a LIMIT or aggregate")
            if size > (max_bytes or isolation.MAX_RESULT_BYTES):
                raise QueryError(f"result too large: over {(max_bytes or isolation.MAX_RESULT_BYTES) / 2**20:g} MiB")
            batches.append(batch)
        return pa.Table.from_batches(batches, schema=reader.schema)
    except duckdb.InterruptException:
        raise QueryError(f"query exceeded the time limit of {timeout_s:g} s") from None
    except OSError as e:  # the interrupt landing mid-stream surfaces from the Arrow reader
        if "interrupt" in str(e).lower():
            raise QueryError(f"query exceeded the time limit of {timeout_s:g} s") from None
        raise QueryError(scrub(str(e)[:300])) from None
    finally:
        timer.cancel()


# DuckDB types no result format carries faithfully (UHUGEINT max came back as -1, BIT and VARINT as raw bytes,
# a non-UTF-8 BLOB broke JSON): refused with the column's name and the cast that works.
UNRETURNABLE = ("UHUGEINT", "BIT", "VARINT", "BIGNUM", "UNION", "INTERVAL", "BLOB")


def check_result_columns(names: list[str], types: list[str]) -> None:
    """QueryError for a result with two columns of one name, or a column of a type in UNRETURNABLE."""
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise QueryError(f"column {name!r} appears twice in the result; give each column its own name (AS …)")
        seen.add(name)
    for name, typ in zip(names, types, strict=True):
        base = typ.split("(", 1)[0].split("<", 1)[0].strip().upper()
        if base in UNRETURNABLE or "UNION(" in typ.upper():
            raise QueryError(f"column {name!r} is of type {typ}, which results cannot carry; CAST({name} AS VARCHAR)")


def query_arrow(
    sql: str,
    frames: dict[str, object],
    *,
    timeout_s: float,
    max_rows: int,
    max_bytes: int | None = None,
    root: str = "",
) -> pa.Table:
    """The one query path (CLI, server's child process): `sql` over views already built, as an Arrow table."""
    check_read_only(sql)
    con = sandboxed(frames)
    try:
        return run_limited(con, sql, timeout_s, max_rows, max_bytes)
    except duckdb.CatalogException as e:
        raise QueryError(_no_such_view(str(e)) or scrub(str(e), root)) from None
    except duckdb.Error as e:
        raise QueryError(scrub(str(e), root)) from None
    except MemoryError:
        raise QueryError("query ran out of memory; aggregate or add a LIMIT") from None
    finally:
        con.close()


def query(
    root: str,
    sql: str,
    *,
    timeout_s: float | None = None,
    max_rows: int | None = None,
    frames: dict[str, object] | None = None,
) -> pd.DataFrame:
    """Run one read-only SQL query over the store's views in this process (limits default to QUERY_TIMEOUT_S
    and MAX_RESULT_ROWS; `frames`: views already built). Raises QueryError with DuckDB's message, scrubbed of
    server paths. Its memory is bounded by the caller (the CLI: results.sql.isolation.limit_address_space)."""
    check_read_only(sql)
    frames = frames if frames is not None else views(root, sql)
    table = query_arrow(
        sql, frames, timeout_s=timeout_s or QUERY_TIMEOUT_S, max_rows=max_rows or MAX_RESULT_ROWS, root=root
    )
    return isolation.to_frame(table)


def query_table(root: str, sql: str, *, timeout_s: float | None = None, max_rows: int | None = None) -> pa.Table:
    """`query`, as an Arrow table (the CLI: no pandas unless the query reaches an analysis view)."""
    check_read_only(sql)
    timeout, limit = timeout_s or QUERY_TIMEOUT_S, max_rows or MAX_RESULT_ROWS
    return query_arrow(sql, views(root, sql), timeout_s=timeout, max_rows=limit, root=root)


def query_in_child(
    rows_ipc: str, calibration_ipc: str, profiles_ipc: str, sql: str, *, timeout_s: float, max_rows: int
) -> pd.DataFrame:
    """Run `sql` over the rows, calibration and profiles in the Arrow IPC files in a child process under
    results.sql.isolation's limits (the child maps the server's cached rows and builds the views it needs, so the
    analysis views' bootstraps are inside the deadline too); the result as a DataFrame, or QueryError."""
    args = (rows_ipc, calibration_ipc, profiles_ipc, sql, timeout_s, max_rows, isolation.MAX_RESULT_BYTES)
    kind, payload = isolation.run_in_child(_query_in_child, args, timeout_s=timeout_s, preload=("results.sql.query",))
    if kind == "error":
        raise QueryError(payload)
    return isolation.to_frame(pa.ipc.open_stream(payload).read_all())


def _query_in_child(
    rows_ipc: str, calibration_ipc: str, profiles_ipc: str, sql: str, timeout_s: float, max_rows: int, max_bytes: int
) -> tuple[str, object]:
    """The child's part: ("ok", Arrow IPC bytes) or ("error", one line)."""
    try:
        rows = pa.ipc.open_file(pa.memory_map(rows_ipc)).read_all()
        calibration = pa.ipc.open_file(pa.memory_map(calibration_ipc)).read_all().to_pandas()
        profiles = pa.ipc.open_file(pa.memory_map(profiles_ipc)).read_all()
        frames = views_of(rows, calibration, sql, profiles=profiles)
        table = query_arrow(sql, frames, timeout_s=timeout_s, max_rows=max_rows, max_bytes=max_bytes)
        return "ok", isolation.to_ipc(table, max_bytes)
    except QueryError as e:
        return "error", str(e)
    except MemoryError:
        return "error", "query ran out of memory; aggregate or add a LIMIT"
    except Exception as e:  # noqa: BLE001 — the server answers with one line, never a traceback
        return "error", scrub(f"{type(e).__name__}: {str(e)[:300]}")
