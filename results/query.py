"""SQL over the store with DuckDB, sandboxed: read-only SELECTs over in-memory views, no file access.

Views: `cells` (every row), `cells_vs_baseline` (distributed cells beside their single baseline,
with efficiency and exposed communication), `u_curve` (best bucket per curve), `no_sync_gain`.
"""

from __future__ import annotations

import json

import duckdb
import pandas as pd

from results import analysis
from results.errors import QueryError, StoreNotFound
from results.store import Store

ALLOWED_STATEMENTS = {duckdb.StatementType.SELECT, duckdb.StatementType.EXPLAIN}
FORMATS = ("table", "csv", "json")


def views(root: str) -> dict[str, pd.DataFrame | object]:
    """The query views of a store (arrow table for `cells`, DataFrames for the analyses)."""
    store = Store.open(root)
    table = store.read_table()
    if table.num_rows == 0:
        raise StoreNotFound(f"no results under {root!r}: run a sweep first (ddpsweep run SPEC --results {root})")
    rows = table.to_pandas()
    return {
        "cells": table,
        "cells_vs_baseline": analysis.with_baseline(rows),
        "u_curve": analysis.u_curve(rows),
        "no_sync_gain": analysis.no_sync_gain(rows),
    }


def sandboxed(frames: dict[str, object]) -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB holding `frames` as views, then locked: no file, network or extension access."""
    con = duckdb.connect(":memory:", config={"threads": 2, "memory_limit": "2GB"})
    for name, frame in frames.items():
        con.register(f"_{name}", frame)
        con.execute(f'CREATE VIEW "{name}" AS SELECT * FROM "_{name}"')
    con.execute("SET enable_external_access = false")
    con.execute("SET autoinstall_known_extensions = false")
    con.execute("SET autoload_known_extensions = false")
    con.execute("SET lock_configuration = true")
    return con


def check_read_only(sql: str) -> None:
    """Only SELECT (and EXPLAIN) statements: no COPY, ATTACH, INSTALL, LOAD, SET, CREATE…"""
    try:
        statements = duckdb.extract_statements(sql)
    except duckdb.Error as e:
        raise QueryError(str(e)) from None
    if not statements:
        raise QueryError("empty query: give one SELECT statement")
    for st in statements:
        if st.type not in ALLOWED_STATEMENTS:
            kind = st.type.name
            raise QueryError(f"refused: {kind} statements are not allowed; queries are read-only SELECTs")


def query(root: str, sql: str) -> pd.DataFrame:
    """Run one read-only SQL query over the store's views. Raises QueryError with DuckDB's message."""
    check_read_only(sql)
    con = sandboxed(views(root))
    try:
        return con.execute(sql).df()
    except duckdb.Error as e:
        raise QueryError(str(e)) from None
    finally:
        con.close()


def to_csv(df: pd.DataFrame) -> str:
    """CSV with list columns (step times, bucket sizes, hosts) as JSON arrays, one row per line."""
    out = df.copy()
    for col in out.columns:
        if out[col].dtype == object and out[col].map(lambda v: hasattr(v, "__len__") and not isinstance(v, str)).any():
            out[col] = out[col].map(lambda v: json.dumps(list(v), default=float) if v is not None else "")
    return out.to_csv(index=False)


def render(df: pd.DataFrame, fmt: str) -> str:
    """A result as text: an aligned table, CSV, or JSON records."""
    if fmt not in FORMATS:
        raise QueryError(f"format {fmt!r}: allowed: {', '.join(FORMATS)}")
    if fmt == "csv":
        return to_csv(df)
    if fmt == "json":
        return df.to_json(orient="records", date_format="iso")
    return df.to_string(index=False) if not df.empty else "(no rows)"
