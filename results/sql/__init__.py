"""SQL over the store: the DuckDB sandbox, its views, the limits a query cannot escape, results as text."""
