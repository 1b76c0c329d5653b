"""Exceptions of the results layer.

ResultsError             base of every results error (a user mistake, never a bug)
├── StoreNotFound        the results root is missing or holds no rows
├── UnknownSelection     a cluster or sweep label that is not in the store (lists what is)
└── QueryError           a SQL query failed or was refused by the sandbox
"""

from __future__ import annotations


class ResultsError(Exception):
    """Base class of the results layer's errors."""


class StoreNotFound(ResultsError):
    """The results root does not exist or holds no Parquet rows."""


class UnknownSelection(ResultsError):
    """A requested cluster or sweep is not in the store."""


class QueryError(ResultsError):
    """A SQL query failed (DuckDB's message) or was refused by the sandbox."""
