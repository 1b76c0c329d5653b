"""Results: the Parquet schema, the store, SQL queries, analysis, plots and reports. Never imports torch or ray."""

from results.errors import QueryError, ResultsError, StoreNotFound, UnknownSelection
from results.schema import SCHEMA
from results.store import Store, load

__all__ = ["SCHEMA", "QueryError", "ResultsError", "Store", "StoreNotFound", "UnknownSelection", "load"]
