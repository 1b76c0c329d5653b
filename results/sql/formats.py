"""A query's result as text: an aligned table, CSV or JSON records, from an Arrow table (the CLI, without pandas)
or a DataFrame (the server). CSV keeps list cells as JSON arrays and prefixes text a spreadsheet would run as a
formula; JSON has no NaN. Imports neither DuckDB nor pandas at load."""

from __future__ import annotations

import csv
import datetime
import decimal
import io
import json
import math
from typing import TYPE_CHECKING

import pyarrow as pa

from results.errors import QueryError

if TYPE_CHECKING:
    import pandas as pd

FORMATS = ("table", "csv", "json")


def render_table(table: pa.Table, fmt: str) -> str:
    """A result as text without pandas: CSV as `to_csv` writes it, JSON records, or an aligned table."""
    if fmt not in FORMATS:
        raise QueryError(f"format {fmt!r}: allowed: {', '.join(FORMATS)}")
    names, rows = table.column_names, _python_rows(table)
    if fmt == "json":
        return json.dumps([dict(zip(names, map(_json_value, r), strict=True)) for r in rows], separators=(",", ":"))
    if fmt == "csv":
        buffer = io.StringIO()
        writer = csv.writer(buffer, lineterminator="\n")
        writer.writerow([_cell_text(n) for n in names])
        writer.writerows([[_csv_value(v) for v in r] for r in rows])
        return buffer.getvalue()
    if not rows:
        return "(no rows)"
    cells = [names, *([_shown(v) for v in r] for r in rows)]
    widths = [max(len(line[i]) for line in cells) for i in range(len(names))]
    return "\n".join(" ".join(c.rjust(w) for c, w in zip(line, widths, strict=True)) for line in cells)


def _python_rows(table: pa.Table) -> list[tuple]:
    """The rows as Python values; a column that has none (a date past year 9999, …) is a QueryError naming it."""
    columns = []
    for name in table.column_names:
        try:
            columns.append(table[name].to_pylist())
        except (pa.ArrowException, ValueError, OverflowError, TypeError) as e:
            raise QueryError(
                f"column {name!r}: its type cannot be returned ({str(e)[:120]}); cast it to text"
            ) from None
    return list(zip(*columns, strict=True)) if columns else []


def _json_value(v: object) -> object:
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, datetime.date | datetime.time):
        return v.isoformat()
    if isinstance(v, decimal.Decimal):
        return float(v)
    if isinstance(v, datetime.timedelta):
        return v.total_seconds()
    if isinstance(v, list):
        return [_json_value(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _json_value(x) for k, x in v.items()}
    return v


def _csv_value(v: object) -> object:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return ""
    if isinstance(v, list | dict):
        return _json_cell(v)
    return _cell_text(v)


def _shown(v: object) -> str:
    if v is None:
        return "None"
    if isinstance(v, float):
        return f"{v:.6g}"
    return str(v)


FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def _cell_text(v: object) -> object:
    """A text cell a spreadsheet would run as a formula gets a leading apostrophe (OWASP's advice)."""
    return "'" + v if isinstance(v, str) and v.startswith(FORMULA_START) else v


def _json_cell(v: object) -> str:
    """A list, array or struct cell as JSON (a struct keeps its values, not only its keys)."""
    if v is None:
        return ""
    if isinstance(v, dict):
        return json.dumps({str(k): _plain(x) for k, x in v.items()}, default=str)
    return json.dumps([_plain(x) for x in v], default=str)


def _plain(v: object) -> object:
    if isinstance(v, dict):
        return {str(k): _plain(x) for k, x in v.items()}
    if hasattr(v, "tolist"):
        return v.tolist()
    return v


def to_csv(df: pd.DataFrame) -> str:
    """CSV with list columns (step times, bucket sizes, hosts) as JSON arrays, one row per line; text that
    starts with = + - @ (a spreadsheet formula) is prefixed with ' so it stays text."""
    import pandas as pd

    out = df.copy()
    out.columns = [_cell_text(str(c)) for c in out.columns]  # SQL aliases are text a spreadsheet would run too
    for col in out.columns:
        if out[col].dtype == object and out[col].map(lambda v: hasattr(v, "__len__") and not isinstance(v, str)).any():
            out[col] = out[col].map(_json_cell)
        if out[col].dtype == object or pd.api.types.is_string_dtype(out[col]):
            out[col] = out[col].map(_cell_text)
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
