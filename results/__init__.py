"""Results: the Parquet schema, the store, SQL queries, analysis, plots and reports. Never imports torch or ray.

The names below load on first use, so importing one light module (`results.sql.views`, `results.errors`) does not
load pandas or pyarrow: the CLI answers `--help` and a query without them."""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "SCHEMA": "results.storage.schema",
    "QueryError": "results.errors",
    "ResultsError": "results.errors",
    "StoreNotFound": "results.errors",
    "UnknownSelection": "results.errors",
    "Store": "results.storage.store",
    "load": "results.storage.store",
}
__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'results' has no attribute {name!r}")
