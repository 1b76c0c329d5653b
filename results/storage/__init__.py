"""The store: the row schema, Parquet files written and read, compaction and packs, leases, the cache."""
