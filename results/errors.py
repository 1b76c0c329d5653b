"""Exceptions of the results layer.

ResultsError                     400  base of every results error (a user mistake, never a bug)
├── StoreNotFound                404  the results root is missing or holds no rows
├── UnknownSelection             404  a cluster or sweep label that is not in the store (lists what is)
├── LabelError                   422  a cluster / sweep / cell label that is not a safe path segment
├── StoreFull                    507  the results root's device is full (rows already written stay)
├── TooLarge                     413  more rows than a page analyses or a server holds (says how to narrow)
└── QueryError                   400  a SQL query failed, was refused by the sandbox, or hit a limit

ResultsError derives from trainers.errors.DDPSweepError, the one root of every error ddpsweep raises on purpose
(a torch-free leaf results may import): the CLI's exit code, the HTTP API's status and its one JSON error shape
come from one handler per edge.
"""

from __future__ import annotations

from trainers.errors import DDPSweepError


class ResultsError(DDPSweepError):
    """Base class of the results layer's errors."""

    http_status = 400


class StoreNotFound(ResultsError):
    """The results root does not exist or holds no Parquet rows."""

    http_status = 404


class UnknownSelection(ResultsError):
    """A requested cluster or sweep is not in the store."""

    http_status = 404


class StoreFull(ResultsError):
    """No space is left on the device of the results root: the write was abandoned (no temporary file
    stays), rows written before it are intact."""

    http_status = 507


class TooLarge(ResultsError):
    """A selection with more rows than a page or report analyses, or a store with more than a server holds
    in memory; the message says how to narrow it (SQL aggregates without this limit)."""

    http_status = 413


class LabelError(ResultsError, ValueError):
    """A label (cluster, sweep id, cell id) is not a safe path segment. `field` names which."""

    http_status = 422

    def __init__(self, field: str, value: str) -> None:
        self.field = field
        shown = repr(value) if len(repr(value)) <= 80 else repr(value)[:80] + "…"
        super().__init__(f"{field} {shown} is not a valid label: use letters, digits, '_', '.', '-' (max 64)")


class QueryError(ResultsError):
    """A SQL query failed (DuckDB's message) or was refused by the sandbox."""
