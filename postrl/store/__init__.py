"""Rollout store: Parquet shards per step (`rollouts`) and DuckDB queries over them (`query`)."""

from postrl.store.query import VIEWS, QueryResult, query, query_view
from postrl.store.rollouts import SCHEMA, RolloutRow, RolloutStore, read_rows, read_table, shard_steps

__all__ = [
    "SCHEMA",
    "VIEWS",
    "QueryResult",
    "RolloutRow",
    "RolloutStore",
    "query",
    "query_view",
    "read_rows",
    "read_table",
    "shard_steps",
]
