"""Rollout store: Parquet shards per step (`postrl.store.rollouts`) and DuckDB queries over them
(`postrl.store.query`). This file imports nothing: a module that writes rollouts does not import
DuckDB."""
